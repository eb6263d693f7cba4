//! The disk cache of compiled kernel libraries.
//!
//! A library is named by the SHA-256 of everything that decides its code:
//! the generated source (which holds the dtypes, the user's text and the
//! plugin header), the compiler's identity (resolved path, `--version`) and
//! flags, the CPU's features (`-march=native`) and the dtypes once more. It
//! lives under `$DLBRIDGE_CACHE_DIR/cpu`, else `$XDG_CACHE_HOME/dlbridge/cpu`,
//! else `~/.cache/dlbridge/cpu`, else `dlbridge-cache-<uid>/cpu` under the
//! system's temporary directory: never a directory shared between users.
//!
//! What the cache trusts: a directory that may hold code this process runs
//! must be a real directory (not a symbolic link), owned by this process's
//! user and writable by nobody else, as pip and ccache require of theirs. One
//! that is not is not used (a warning says why, once): kernels are then
//! compiled in a private directory of their own and nothing is kept. Files in
//! it that are symbolic links are never read or loaded.
//!
//! Several processes may build the same kernel at once: each compiles in a
//! private directory with an unpredictable name (created 0700, so nothing can
//! be planted in it) and renames the result into place (atomic on one file
//! system), so a library is either absent or whole. A second process finds it
//! and pays no compilation. Each library has its seal beside it
//! (`<key>.seal`, written before the library is renamed into place): an
//! HMAC-SHA256 of its bytes under a secret of this user's kept outside the
//! cache ([`dlbridge_registry::trust::seal`]), so nobody without the secret can
//! make a library that passes. A library whose bytes do not match its seal is
//! rebuilt without being opened (its constructors never run); one that does not
//! load, or that declares another kernel than expected, is rebuilt too.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use dlbridge_core::{Error, Result};
use sha2::{Digest, Sha256};

pub use crate::builder::dirs::cpu_cache_dir;
use crate::builder::elf::{self, Policy};
use crate::builder::fragments;
use crate::builder::toolchain::{Compiler, cpu_fingerprint};
pub use dlbridge_registry::trust::{HeldLibrary, TrustedDir};
use dlbridge_registry::trust::{seal, sealed};

/// Bumped when the code generation changes in a way the source text does not show.
const FORMAT: &str = "dlbridge-compile cpu v3";

/// The checks a build passes before its library is cached (the fragments'
/// and the ELF file's): part of every key, so a library cached under other
/// checks is never loaded without passing these.
const CHECKS: [&str; 3] = [include_str!("fragments.rs"), include_str!("elf.rs"), include_str!("imports.rs")];

/// What a library's seal is bound to: its file and its kind.
fn seal_name(key: &str) -> String {
    format!("cpu library {key}.so")
}

/// Counters of what the cache did in this process.
#[derive(Debug, Default)]
pub struct Stats {
    /// Libraries compiled.
    pub compiled: AtomicU64,
    /// Libraries found on disk.
    pub disk_hits: AtomicU64,
}

/// The CPU library cache.
#[derive(Debug)]
pub struct LibraryCache {
    dir: PathBuf,
    /// The directory, held open, when it may be used ([`TrustedDir::open`]),
    /// asked on first use; else why not.
    trust: OnceLock<std::result::Result<TrustedDir, String>>,
    /// What it did.
    pub stats: Stats,
}

impl LibraryCache {
    /// A cache in `dir`.
    pub fn new(dir: PathBuf) -> LibraryCache {
        LibraryCache { dir, trust: OnceLock::new(), stats: Stats::default() }
    }

    /// The directory, held open, when it may hold code this process runs;
    /// `Err` says why not (the first time it is asked, a warning says so on
    /// stderr).
    pub fn trusted(&self) -> std::result::Result<&TrustedDir, &str> {
        self.trust
            .get_or_init(|| {
                let t = TrustedDir::open(&self.dir);
                if let Err(why) = &t {
                    eprintln!(
                        "dlbridge: not using the kernel cache {}: {why}; kernels are compiled in a private directory and not kept",
                        self.dir.display()
                    );
                }
                t
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// The process-wide cache (its directory is read from the environment once).
    pub fn global() -> &'static LibraryCache {
        static CACHE: OnceLock<LibraryCache> = OnceLock::new();
        CACHE.get_or_init(|| LibraryCache::new(cpu_cache_dir()))
    }

    /// Where the libraries go.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of one library.
    pub fn key(compiler: &Compiler, source: &str, dtypes: &str) -> String {
        LibraryCache::key_with(compiler, source, dtypes, &[])
    }

    /// The key of one library compiled with `extra` flags as well (each one
    /// part of the key; none: the same key as [`LibraryCache::key`]).
    pub fn key_with(compiler: &Compiler, source: &str, dtypes: &str, extra: &[String]) -> String {
        let mut h = Sha256::new();
        // The nonce of a marked source is new each time: not part of the key.
        let source = fragments::unmarked(source);
        for part in [FORMAT, CHECKS[0], CHECKS[1], &compiler.identity, &compiler.flags().join(" "), &cpu_fingerprint(), dtypes, &source] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        if !extra.is_empty() {
            h.update(b"extra flags");
            for part in extra {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part.as_bytes());
            }
        }
        hex(&h.finalize())
    }

    /// The library for `source`: found on disk, else compiled into place.
    /// `load` opens it and checks it is the expected kernel; a cached file it
    /// refuses is rebuilt once. `what` names the kernel in errors; `user`
    /// maps the generated source's `#line` file names to the user's texts.
    pub fn get_or_build<T>(
        &self,
        source: &str,
        dtypes: &str,
        what: &str,
        user: &[(&str, &str)],
        load: impl Fn(&HeldLibrary) -> Result<T>,
    ) -> Result<T> {
        self.get_or_build_with(source, dtypes, &[], what, user, Policy::Generated { exports: &[GENERATED_ENTRY] }, load)
    }

    /// [`LibraryCache::get_or_build`] for a library compiled with `extra`
    /// flags after the usual ones (part of the key) and checked under
    /// `policy` before it is first opened.
    ///
    /// The library `load` is given is the very bytes that were checked (the
    /// seal of a cached one, the ELF check of a new one): a file of this
    /// process's own made from them, never a path in the cache directory that
    /// could be changed between the check and the load.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn get_or_build_with<T>(
        &self,
        source: &str,
        dtypes: &str,
        extra: &[String],
        what: &str,
        user: &[(&str, &str)],
        policy: Policy<'_>,
        load: impl Fn(&HeldLibrary) -> Result<T>,
    ) -> Result<T> {
        let compiler = Compiler::get()?;
        let mut job = BuildJob { compiler, source, extra, what, user, policy, preprocessed: None, expanded: None };
        // A text that includes a file: keyed on what the preprocessor makes of it
        // now (a changed header is another library).
        // Arguments `$CXX` carries (`-include`, `-D`) act on every build like flags given with it.
        let reads_files = includes_files(user, extra) || compiler.command.len() > 1;
        let key = match fragments::nonce_of(source) {
            Some(nonce) if reads_files => {
                let (ii, reference) = preprocess(&job, nonce)?;
                let key = LibraryCache::key_with(compiler, &ii.replace(nonce, "NONCE"), dtypes, extra);
                job.preprocessed = Some((ii, reference));
                key
            }
            // The user's own C++ (`load_inline`): compiled from the same text.
            None if reads_files => {
                let ii = compiler.preprocess_text(source, what, user, extra)?;
                let key = LibraryCache::key_with(compiler, &ii, dtypes, extra);
                job.expanded = Some(ii);
                key
            }
            _ => LibraryCache::key_with(compiler, source, dtypes, extra),
        };
        let Ok(dir) = self.trusted() else {
            // Compiled in a private directory, removed once loaded: nothing is
            // read from or left in the cache.
            let tmp = private_temp(what)?;
            let bytes = build_in(&tmp, &job)?;
            self.stats.compiled.fetch_add(1, Ordering::Relaxed);
            return load_bytes(&bytes, what, &load);
        };
        // A damaged or foreign file fails `load`: it is built again below (the
        // new one replaces it atomically; an old mapping, if any, stays valid).
        if let Some(bytes) = intact(dir, &key)
            && let Ok(t) = load_bytes(&bytes, what, &load)
        {
            self.stats.disk_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(t);
        }
        let bytes = build(dir, &key, &job)?;
        self.stats.compiled.fetch_add(1, Ordering::Relaxed);
        load_bytes(&bytes, what, &load)
    }
}

/// The bytes of `<key>.so` when they are sealed by `<key>.seal` (both regular
/// files, read through the directory's handle).
fn intact(dir: &TrustedDir, key: &str) -> Option<Vec<u8>> {
    let lib = dir.read(&format!("{key}.so"))?;
    let tag = dir.read(&format!("{key}.seal"))?;
    sealed(&seal_name(key), &lib, std::str::from_utf8(&tag).ok()?).then_some(lib)
}

/// What one build is: the compiler, the source, the flags beyond the usual,
/// what errors call the kernel, the user's texts by `#line` name, and what
/// the library may have ([`elf::check`]).
struct BuildJob<'a> {
    compiler: &'a Compiler,
    source: &'a str,
    extra: &'a [String],
    what: &'a str,
    user: &'a [(&'a str, &'a str)],
    policy: Policy<'a>,
    /// The marked source preprocessed, and its blanked reference, when they
    /// were made before the build (to key a source that includes files).
    preprocessed: Option<(String, String)>,
    /// An unmarked source preprocessed, when its key was taken from that.
    expanded: Option<String>,
}

/// What the files `user`'s texts include say, as a digest, when they may
/// include any ([`includes_files`]): the SHA-256 of the bytes of every file
/// the preprocessor enters that is not in the compiler's system include
/// directories (those differ between machines, not between kernels), in the
/// order it enters them. `None` for texts that include nothing. Part of a
/// kernel's identity, so that a program built for a kernel is refused where
/// its headers say something else.
pub(crate) fn included_digest(user: &[(&str, &str)], extra: &[String]) -> Option<String> {
    let compiler = match Compiler::get() {
        Ok(c) => c,
        Err(e) => return includes_files(user, extra).then(|| format!("included files: not preprocessed: {e}")),
    };
    if !includes_files(user, extra) && compiler.command.len() == 1 {
        return None;
    }
    let unit: String = user.iter().map(|(label, text)| format!("#line 1 \"{label}\"\n{text}\n")).collect();
    let text = match compiler.preprocess_text(&unit, "the kernel's included files", user, extra) {
        Ok(ii) => {
            let mut h = Sha256::new();
            for file in entered_files(&ii).into_iter().filter(|f| !fragments::in_system_dir(f, &compiler.system_dirs)) {
                let bytes = std::fs::read(&file).unwrap_or_else(|e| format!("unreadable: {e}").into_bytes());
                h.update((bytes.len() as u64).to_le_bytes());
                h.update(&bytes);
            }
            format!("the files' bytes, SHA-256 {}", hex(&h.finalize()))
        }
        Err(e) => format!("not preprocessed: {e}"),
    };
    Some(format!("included files: {text}"))
}

/// The files preprocessed text enters (line markers with flag 1), in order,
/// each once.
fn entered_files(ii: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in ii.lines() {
        let Some(rest) = l.strip_prefix("# ") else { continue };
        if !rest.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        let Some((file, flags)) = rest.split_once('"').and_then(|(_, tail)| tail.rsplit_once('"')) else { continue };
        if flags.split_whitespace().any(|f| f == "1") && !out.iter().any(|o| o == file) {
            out.push(file.to_owned());
        }
    }
    out
}

/// The label of a text that is a whole C++ source (`load_inline`'s), not a
/// fragment placed in generated code: the key of its build is always taken
/// from the preprocessor's reading of it, whatever its text looks like.
pub const C_SOURCE: &str = "c_source";

/// Flags dlbridge adds to every `load_inline` build, which name no file.
const OWN_FLAGS: &[&str] = &["-Wl,--no-undefined", "-Wmissing-declarations"];

/// Whether any of the user's texts, or a flag given with them, may include a file (it has a directive,
/// `##` pasting or `_Pragma`: `#include`, `__has_include`, `#embed`, or a
/// macro that builds them): what a file says is then part of the library, so
/// the key is taken from the preprocessed text.
fn includes_files(user: &[(&str, &str)], extra: &[String]) -> bool {
    // Any flag but dlbridge's own may name a file the preprocessor reads
    // (`-include`, `-imacros`, `-Wp,...`): its line markers say which.
    extra.iter().any(|f| !OWN_FLAGS.contains(&f.as_str()))
    || user.iter().any(|(label, _)| *label == C_SOURCE)
    // Any directive or pasting: a macro may build `__has_include` or the name
    // of a file, so only the preprocessor can say what is read.
    || user.iter().any(|(_, t)| {
        let code = crate::params::scan(t).code;
        code.contains("##") || code.contains("_Pragma") || code.lines().any(|l| l.trim_start().starts_with('#'))
    })
}

/// The marked source preprocessed and its blanked reference
/// ([`fragments::blanked`]), the two preprocessors run at once (each mostly
/// reads the same headers).
fn preprocess(job: &BuildJob<'_>, nonce: &str) -> Result<(String, String)> {
    let BuildJob { compiler, source, extra, what, user, .. } = *job;
    let blank = fragments::blanked(source, nonce);
    let (ii, reference) = std::thread::scope(|scope| {
        let reference = scope.spawn(|| compiler.preprocess_text(&blank, what, &[], extra));
        let ii = compiler.preprocess_text(source, what, user, extra);
        (ii, reference.join().unwrap_or_else(|_| Err(Error::Runtime(format!("{what}: the preprocessor thread panicked")))))
    });
    Ok((ii?, reference?))
}

/// Builds the library in a private directory of `dir`, seals it and puts both
/// in place; returns the bytes that were checked and sealed.
fn build(dir: &TrustedDir, key: &str, job: &BuildJob<'_>) -> Result<Vec<u8>> {
    let what = job.what;
    let work = dir.private_subdir(".dlbridge-build-").map_err(|e| io_error(what, "create a build directory in", dir.path(), &e))?;
    let bytes = build_in(&work, job)?;
    // The seal first, then the library: a library whose bytes do not match its
    // seal is never loaded (damaged or replaced files would otherwise run).
    dlbridge_registry::trust::swap_point("built", dir.path());
    let tag = seal(&seal_name(key), &bytes);
    let placed = dir.write(&format!("{key}.seal"), tag.as_bytes()).and_then(|()| dir.write(&format!("{key}.so"), &bytes));
    if let Err(e) = placed {
        // A full disk is the user's to know; anything else in the way (a
        // directory where the library goes) only costs the cache entry: the
        // checked bytes are loaded from memory all the same.
        if e.raw_os_error() == Some(28) || e.kind() == std::io::ErrorKind::StorageFull {
            return Err(io_error(what, "write the library into", dir.path(), &e));
        }
        return Ok(bytes);
    }
    // The source beside it, for whoever wants to read what ran.
    let _ = dir.write(&format!("{key}.cpp"), job.source.as_bytes());
    dlbridge_registry::trust::swap_point("sealed", dir.path());
    Ok(bytes)
}

/// Opens `bytes` with `load` as a library: from a sealed file of this
/// process's own (Linux: an anonymous memory file), so `dlopen` maps exactly
/// what was checked.
fn load_bytes<T>(bytes: &[u8], what: &str, load: &impl Fn(&HeldLibrary) -> Result<T>) -> Result<T> {
    #[cfg(target_os = "linux")]
    {
        let held = dlbridge_registry::trust::sealed_memory_file("dlbridge-kernel", bytes)
            .map_err(|e| Error::Runtime(format!("{what}: cannot hold the compiled library in memory: {e}")))?;
        load(&held)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (bytes, what, load);
        Err(Error::Runtime("kernels from source are loaded on Linux only".into()))
    }
}

/// A private directory of this process's under the system's temporary
/// directory, held open; removed when dropped.
fn private_temp(what: &str) -> Result<TempTrusted> {
    let tmp = tempfile::Builder::new()
        .prefix(".dlbridge-build-")
        .tempdir()
        .map_err(|e| io_error(what, "create a build directory in", &std::env::temp_dir(), &e))?;
    let dir = TrustedDir::open(tmp.path())
        .map_err(|why| Error::Runtime(format!("{what}: the build directory {} cannot be used: {why}", tmp.path().display())))?;
    Ok(TempTrusted { dir, _tmp: tmp })
}

/// A [`TrustedDir`] over a temporary directory that goes when it is dropped.
struct TempTrusted {
    dir: TrustedDir,
    _tmp: tempfile::TempDir,
}

impl std::ops::Deref for TempTrusted {
    type Target = TrustedDir;
    fn deref(&self) -> &TrustedDir {
        &self.dir
    }
}

/// An I/O error of the cache as an error naming the directory; a full disk
/// says so.
fn io_error(what: &str, doing: &str, dir: &Path, e: &std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::StorageFull || e.raw_os_error() == Some(28) {
        return Error::Coded {
            kind: dlbridge_core::ErrorKind::Runtime,
            message: format!(
                "{what}: cannot {doing} {}: no space left on its file system (free some, or set DLBRIDGE_CACHE_DIR to a directory with room)",
                dir.display()
            ),
        };
    }
    Error::Runtime(format!("{what}: cannot {doing} {}: {e}", dir.display()))
}

/// The one entry point of a generated library (the plugin table).
const GENERATED_ENTRY: &str = "dlbridge_plugin";

/// Compiles `source` in `dir` and returns the library's bytes, read back
/// through the directory's handle and checked under `policy`
/// ([`elf::check`]). The compiler reads its input from a pipe, never from a
/// path; a marked source (a kernel's generated code around the user's texts)
/// is preprocessed first, its fragments checked in the preprocessed text
/// ([`fragments::check`]) and the library compiled from that very text.
fn build_in(dir: &TrustedDir, job: &BuildJob<'_>) -> Result<Vec<u8>> {
    let BuildJob { compiler, source, extra, what, user, policy, .. } = *job;
    dir.write("kernel.cpp", source.as_bytes()).map_err(|e| io_error(what, "write kernel.cpp into", dir.path(), &e))?;
    let mut flags = extra.to_vec();
    // The linker reads its version script by path: from a private directory
    // of this process's under the system's temporary directory, not from one
    // under the cache's root.
    let script_dir = tempfile::Builder::new()
        .prefix("dlbridge-exports-")
        .tempdir()
        .map_err(|e| io_error(what, "create a directory in", &std::env::temp_dir(), &e))?;
    if let Policy::Generated { exports } = policy {
        let script = script_dir.path().join("exports.map");
        std::fs::write(&script, elf::version_script(exports))
            .map_err(|e| io_error(what, "write the export list into", script_dir.path(), &e))?;
        flags.extend(elf::link_flags(&script));
    }
    let (input, kind) = match fragments::nonce_of(source) {
        Some(nonce) if fragments::has_fragments(source, nonce) => {
            let (ii, reference) = match &job.preprocessed {
                Some(pair) => pair.clone(),
                None => preprocess(job, nonce)?,
            };
            fragments::check(what, source, nonce, &ii, &reference, &compiler.system_dirs)?;
            (std::borrow::Cow::Owned(ii), Input::Preprocessed)
        }
        _ => match &job.expanded {
            Some(ii) => (std::borrow::Cow::Borrowed(ii.as_str()), Input::Preprocessed),
            None => (std::borrow::Cow::Borrowed(source), Input::Source),
        },
    };
    dlbridge_registry::trust::swap_point("checked", dir.path());
    let so = dir.path().join("kernel.so");
    compiler.compile_text(&input, kind, &so, what, user, &flags).map_err(|e| no_space(e, what, dir.path())).map_err(|e| {
        // The linker writes the library by path: a directory swapped under it is not ours.
        if e.to_string().contains("cannot open output file") && dir.read("kernel.cpp").is_some() {
            return Error::Runtime(format!(
                "{what}: the compiled library could not be written to the build directory {}: the directory was moved or replaced during the build",
                dir.path().display()
            ));
        }
        e
    })?;
    let bytes = dir.read("kernel.so").ok_or_else(|| {
        Error::Runtime(format!(
            "{what}: the compiled library is not in the build directory {}: the directory was moved or replaced during the build",
            dir.path().display()
        ))
    })?;
    elf::check(compiler, &bytes, what, policy)?;
    Ok(bytes)
}

/// A compiler failure that was the disk's: an error naming the directory.
fn no_space(e: Error, what: &str, dir: &Path) -> Error {
    if e.to_string().contains("No space left on device") {
        return io_error(what, "build in", dir, &std::io::Error::from_raw_os_error(28));
    }
    e
}

pub(crate) use crate::builder::toolchain::Input;

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempfile::TempDir, TrustedDir) {
        let root = tempfile::tempdir().unwrap();
        let d = TrustedDir::open(root.path()).unwrap();
        (root, d)
    }

    #[test]
    fn a_symlinked_library_is_never_intact() {
        let (root, d) = dir();
        let elsewhere = root.path().join("elsewhere.so");
        std::fs::write(&elsewhere, b"not a library").unwrap();
        std::fs::write(root.path().join("k.seal"), seal(&seal_name("k"), b"not a library")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.path().join("k.so")).unwrap();
        assert!(intact(&d, "k").is_none(), "a symbolic link is not loaded, even with the right seal");
        std::fs::remove_file(root.path().join("k.so")).unwrap();
        std::fs::copy(&elsewhere, root.path().join("k.so")).unwrap();
        assert_eq!(intact(&d, "k").as_deref(), Some(&b"not a library"[..]));
    }

    #[test]
    fn a_library_with_its_sha256_but_not_its_seal_is_not_intact() {
        let (root, d) = dir();
        std::fs::write(root.path().join("k.so"), b"planted").unwrap();
        // What anyone can compute: the digest of the bytes, or a seal of another file's.
        std::fs::write(root.path().join("k.seal"), hex(&Sha256::digest(b"planted"))).unwrap();
        assert!(intact(&d, "k").is_none());
        std::fs::write(root.path().join("k.seal"), seal(&seal_name("j"), b"planted")).unwrap();
        assert!(intact(&d, "k").is_none());
        std::fs::write(root.path().join("k.seal"), seal(&seal_name("k"), b"planted")).unwrap();
        assert!(intact(&d, "k").is_some());
    }

    #[test]
    fn a_full_disk_is_named_with_its_directory() {
        let e = io_error("k", "write the library into", Path::new("/cache"), &std::io::Error::from_raw_os_error(28));
        assert_eq!(
            e.to_string(),
            "k: cannot write the library into /cache: no space left on its file system (free some, or set DLBRIDGE_CACHE_DIR to a directory with room)"
        );
        let compiler_said = Error::Coded {
            kind: dlbridge_core::ErrorKind::Value,
            message: "k: the C++ compiler rejected the kernel\n  fatal error: error writing to /tmp/x.s: No space left on device".into(),
        };
        assert!(no_space(compiler_said, "k", Path::new("/cache")).to_string().contains("cannot build in /cache: no space left"));
    }
}

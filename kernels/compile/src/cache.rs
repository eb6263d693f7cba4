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

pub use crate::dirs::cpu_cache_dir;
use crate::elf::{self, Policy};
use crate::fragments;
use crate::toolchain::{Compiler, cpu_fingerprint};
pub use dlbridge_registry::trust::{is_plain_file, trusted_dir};
use dlbridge_registry::trust::{seal, sealed};

/// Bumped when the code generation changes in a way the source text does not show.
const FORMAT: &str = "dlbridge-compile cpu v2";

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
    /// Whether `dir` may be used ([`trusted_dir`]), asked on first use.
    trust: OnceLock<std::result::Result<(), String>>,
    /// What it did.
    pub stats: Stats,
}

impl LibraryCache {
    /// A cache in `dir`.
    pub fn new(dir: PathBuf) -> LibraryCache {
        LibraryCache { dir, trust: OnceLock::new(), stats: Stats::default() }
    }

    /// Whether the directory may hold code this process runs; `Err` says why
    /// not (the first time it is asked, a warning says so on stderr).
    pub fn trusted(&self) -> std::result::Result<(), &str> {
        self.trust
            .get_or_init(|| {
                let t = trusted_dir(&self.dir);
                if let Err(why) = &t {
                    eprintln!(
                        "dlbridge: not using the kernel cache {}: {why}; kernels are compiled in a private directory and not kept",
                        self.dir.display()
                    );
                }
                t
            })
            .as_ref()
            .map(|_| ())
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
        for part in [FORMAT, &compiler.identity, &compiler.flags().join(" "), &cpu_fingerprint(), dtypes, &source] {
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
        load: impl Fn(&Path) -> Result<T>,
    ) -> Result<T> {
        self.get_or_build_with(source, dtypes, &[], what, user, Policy::Generated { exports: &[GENERATED_ENTRY] }, load)
    }

    /// [`LibraryCache::get_or_build`] for a library compiled with `extra`
    /// flags after the usual ones (part of the key) and checked under
    /// `policy` before it is first opened.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn get_or_build_with<T>(
        &self,
        source: &str,
        dtypes: &str,
        extra: &[String],
        what: &str,
        user: &[(&str, &str)],
        policy: Policy<'_>,
        load: impl Fn(&Path) -> Result<T>,
    ) -> Result<T> {
        let compiler = Compiler::get()?;
        let key = LibraryCache::key_with(compiler, source, dtypes, extra);
        if self.trusted().is_err() {
            // Compiled and loaded in a private directory, removed once loaded (the
            // mapping stays valid): nothing is read from or left in the cache.
            let work = private_dir(&std::env::temp_dir(), what)?;
            let so = build_in(compiler, work.path(), source, extra, what, user, policy)?;
            self.stats.compiled.fetch_add(1, Ordering::Relaxed);
            return load(&so);
        }
        let so = self.dir.join(format!("{key}.so"));
        // A damaged or foreign file fails `load`: it is built again below (the
        // new one replaces it atomically; an old mapping, if any, stays valid).
        if self.intact(&key)
            && let Ok(t) = load(&so)
        {
            self.stats.disk_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(t);
        }
        self.build(compiler, &key, source, extra, what, user, policy)?;
        self.stats.compiled.fetch_add(1, Ordering::Relaxed);
        load(&so)
    }

    /// Whether `<key>.so` is a regular file (not a symbolic link) sealed by
    /// `<key>.seal` (one too).
    fn intact(&self, key: &str) -> bool {
        let (so, seal) = (self.dir.join(format!("{key}.so")), self.dir.join(format!("{key}.seal")));
        if !is_plain_file(&so) || !is_plain_file(&seal) {
            return false;
        }
        let (Ok(lib), Ok(tag)) = (std::fs::read(so), std::fs::read_to_string(seal)) else {
            return false;
        };
        sealed(&seal_name(key), &lib, &tag)
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        &self,
        compiler: &Compiler,
        key: &str,
        source: &str,
        extra: &[String],
        what: &str,
        user: &[(&str, &str)],
        policy: Policy<'_>,
    ) -> Result<()> {
        let work = private_dir(&self.dir, what)?;
        let tmp_so = build_in(compiler, work.path(), source, extra, what, user, policy)?;
        // The library's seal beside it, in place before the library: a library
        // whose bytes do not match it is never loaded (damaged or replaced
        // files would otherwise run as code). Renames replace whatever had the
        // name, a symbolic link included, and never follow it.
        let tag = std::fs::read(&tmp_so).map(|b| seal(&seal_name(key), &b));
        let sealed_at = self.dir.join(format!("{key}.seal"));
        let tmp_seal = work.path().join("kernel.seal");
        let written = tag.and_then(|t| std::fs::write(&tmp_seal, t)).and_then(|()| std::fs::rename(&tmp_seal, &sealed_at));
        if let Err(e) = written {
            return Err(Error::Runtime(format!("{what}: cannot write the seal {}: {e}", sealed_at.display())));
        }
        let so = self.dir.join(format!("{key}.so"));
        if let Err(e) = std::fs::rename(&tmp_so, &so) {
            return Err(Error::Runtime(format!("{what}: cannot move the compiled kernel to {}: {e}", so.display())));
        }
        // The source beside it, for whoever wants to read what ran.
        let _ = std::fs::rename(work.path().join("kernel.cpp"), self.dir.join(format!("{key}.cpp")));
        Ok(())
    }
}

/// A fresh directory in `parent` with an unpredictable name, created 0700 and
/// exclusively (it cannot have existed, so nothing was planted in it); removed
/// when dropped.
fn private_dir(parent: &Path, what: &str) -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(".dlbridge-build-")
        .tempdir_in(parent)
        .map_err(|e| Error::Runtime(format!("{what}: cannot create a build directory in {}: {e}", parent.display())))
}

/// The one entry point of a generated library (the plugin table).
const GENERATED_ENTRY: &str = "dlbridge_plugin";

/// Writes `source` into `dir` and compiles it there; returns the library's
/// path. A marked source (a kernel's generated code around the user's texts)
/// is preprocessed first, its fragments checked in the preprocessed text
/// ([`fragments::check`]) and the library compiled from that very text. The
/// library is checked under `policy` ([`elf::check`]) before anything opens it.
fn build_in(
    compiler: &Compiler,
    dir: &Path,
    source: &str,
    extra: &[String],
    what: &str,
    user: &[(&str, &str)],
    policy: Policy<'_>,
) -> Result<PathBuf> {
    let (cpp, so) = (dir.join("kernel.cpp"), dir.join("kernel.so"));
    let write = |path: &Path, text: &str| {
        std::fs::write(path, text).map_err(|e| Error::Runtime(format!("{what}: cannot write {}: {e}", path.display())))
    };
    write(&cpp, source)?;
    let mut flags = extra.to_vec();
    if let Policy::Generated { exports } = policy {
        let script = dir.join("exports.map");
        write(&script, &elf::version_script(exports))?;
        flags.extend(elf::link_flags(&script));
    }
    let input = match fragments::nonce_of(source) {
        Some(nonce) if fragments::has_fragments(source, nonce) => {
            let ii = compiler.preprocess(&cpp, what, user, extra)?;
            let reference = dir.join("reference.cpp");
            write(&reference, &fragments::blanked(source, nonce))?;
            let reference = compiler.preprocess(&reference, what, &[], extra)?;
            fragments::check(what, source, nonce, &ii, &reference)?;
            let path = dir.join("kernel.ii");
            write(&path, &ii)?;
            path
        }
        _ => cpp,
    };
    compiler.compile_with(&input, &so, what, user, &flags)?;
    elf::check(compiler, &so, what, policy)?;
    Ok(so)
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlinked_library_is_never_intact() {
        let root = tempfile::tempdir().unwrap();
        let cache = LibraryCache::new(root.path().to_path_buf());
        let elsewhere = root.path().join("elsewhere.so");
        std::fs::write(&elsewhere, b"not a library").unwrap();
        std::fs::write(root.path().join("k.seal"), seal(&seal_name("k"), b"not a library")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.path().join("k.so")).unwrap();
        assert!(!cache.intact("k"), "a symbolic link is not loaded, even with the right seal");
        std::fs::remove_file(root.path().join("k.so")).unwrap();
        std::fs::copy(&elsewhere, root.path().join("k.so")).unwrap();
        assert!(cache.intact("k"));
    }

    #[test]
    fn a_library_with_its_sha256_but_not_its_seal_is_not_intact() {
        let root = tempfile::tempdir().unwrap();
        let cache = LibraryCache::new(root.path().to_path_buf());
        std::fs::write(root.path().join("k.so"), b"planted").unwrap();
        // What anyone can compute: the digest of the bytes, or a seal of another file's.
        std::fs::write(root.path().join("k.seal"), hex(&Sha256::digest(b"planted"))).unwrap();
        assert!(!cache.intact("k"));
        std::fs::write(root.path().join("k.seal"), seal(&seal_name("j"), b"planted")).unwrap();
        assert!(!cache.intact("k"));
        std::fs::write(root.path().join("k.seal"), seal(&seal_name("k"), b"planted")).unwrap();
        assert!(cache.intact("k"));
    }
}

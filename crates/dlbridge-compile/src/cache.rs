//! The disk cache of compiled kernel libraries.
//!
//! A library is named by the SHA-256 of everything that decides its code:
//! the generated source (which holds the dtypes, the user's text and the
//! plugin header), the compiler's identity (resolved path, `--version`) and
//! flags, the CPU's features (`-march=native`) and the dtypes once more. It
//! lives under `$DLBRIDGE_CACHE_DIR/cpu`, else `$XDG_CACHE_HOME/dlbridge/cpu`,
//! else `~/.cache/dlbridge/cpu` (a directory under the system's temporary
//! directory when none is set).
//!
//! Several processes may build the same kernel at once: each compiles under a
//! name of its own and renames the result into place (atomic on one file
//! system), so a library is either absent or whole. A second process finds it
//! and pays no compilation. Each library has its SHA-256 beside it
//! (`<key>.sha256`, written before the library is renamed into place): a
//! library whose bytes do not match it, that does not load, or that declares
//! another kernel than expected (a damaged or foreign file) is rebuilt, never run.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use dlbridge_core::{Error, Result};
use sha2::{Digest, Sha256};

use crate::toolchain::{Compiler, cpu_fingerprint};

/// Bumped when the code generation changes in a way the source text does not show.
const FORMAT: &str = "dlbridge-compile cpu v1";

/// The root of dlbridge's caches: `$DLBRIDGE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/dlbridge`, else `~/.cache/dlbridge`.
pub fn cache_root() -> Option<PathBuf> {
    let var = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty()).map(PathBuf::from);
    var("DLBRIDGE_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("dlbridge")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/dlbridge")))
}

/// Where CPU libraries are cached: [`cache_root`]`/cpu`, else a directory
/// under the system's temporary directory.
pub fn cpu_cache_dir() -> PathBuf {
    cache_root().unwrap_or_else(|| std::env::temp_dir().join("dlbridge-cache")).join("cpu")
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
    /// What it did.
    pub stats: Stats,
}

impl LibraryCache {
    /// A cache in `dir`.
    pub fn new(dir: PathBuf) -> LibraryCache {
        LibraryCache { dir, stats: Stats::default() }
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
        for part in [FORMAT, &compiler.identity, &compiler.flags().join(" "), &cpu_fingerprint(), dtypes, source] {
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
        self.get_or_build_with(source, dtypes, &[], what, user, load)
    }

    /// [`LibraryCache::get_or_build`] for a library compiled with `extra`
    /// flags after the usual ones (part of the key).
    pub fn get_or_build_with<T>(
        &self,
        source: &str,
        dtypes: &str,
        extra: &[String],
        what: &str,
        user: &[(&str, &str)],
        load: impl Fn(&Path) -> Result<T>,
    ) -> Result<T> {
        let compiler = Compiler::get()?;
        let key = LibraryCache::key_with(compiler, source, dtypes, extra);
        let so = self.dir.join(format!("{key}.so"));
        // A damaged or foreign file fails `load`: it is built again below (the
        // new one replaces it atomically; an old mapping, if any, stays valid).
        if so.is_file()
            && self.intact(&key)
            && let Ok(t) = load(&so)
        {
            self.stats.disk_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(t);
        }
        self.build(compiler, &key, source, extra, what, user)?;
        self.stats.compiled.fetch_add(1, Ordering::Relaxed);
        load(&so)
    }

    /// Whether `<key>.so` has the SHA-256 recorded in `<key>.sha256`.
    fn intact(&self, key: &str) -> bool {
        let (Ok(lib), Ok(sum)) =
            (std::fs::read(self.dir.join(format!("{key}.so"))), std::fs::read_to_string(self.dir.join(format!("{key}.sha256"))))
        else {
            return false;
        };
        hex(&Sha256::digest(&lib)) == sum.trim()
    }

    fn build(&self, compiler: &Compiler, key: &str, source: &str, extra: &[String], what: &str, user: &[(&str, &str)]) -> Result<()> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| Error::Runtime(format!("{what}: cannot create the kernel cache directory {}: {e}", self.dir.display())))?;
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let unique = format!("{key}.tmp{}_{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let cpp = self.dir.join(format!("{unique}.cpp"));
        let tmp_so = self.dir.join(format!("{unique}.so"));
        let cleanup = || {
            let _ = std::fs::remove_file(&cpp);
            let _ = std::fs::remove_file(&tmp_so);
        };
        std::fs::write(&cpp, source).map_err(|e| Error::Runtime(format!("{what}: cannot write {}: {e}", cpp.display())))?;
        if let Err(e) = compiler.compile_with(&cpp, &tmp_so, what, user, extra) {
            cleanup();
            return Err(e);
        }
        // The library's SHA-256 beside it, in place before the library: a
        // library whose bytes do not match it is never loaded (damaged files
        // would otherwise run as code).
        let digest = std::fs::read(&tmp_so).map(|b| hex(&Sha256::digest(&b)));
        let sum = self.dir.join(format!("{key}.sha256"));
        let tmp_sum = self.dir.join(format!("{unique}.sha256"));
        let written = digest.and_then(|d| std::fs::write(&tmp_sum, d)).and_then(|()| std::fs::rename(&tmp_sum, &sum));
        if let Err(e) = written {
            cleanup();
            let _ = std::fs::remove_file(&tmp_sum);
            return Err(Error::Runtime(format!("{what}: cannot write the checksum {}: {e}", sum.display())));
        }
        let so = self.dir.join(format!("{key}.so"));
        if let Err(e) = std::fs::rename(&tmp_so, &so) {
            cleanup();
            return Err(Error::Runtime(format!("{what}: cannot move the compiled kernel to {}: {e}", so.display())));
        }
        // The source beside it, for whoever wants to read what ran.
        let _ = std::fs::rename(&cpp, self.dir.join(format!("{key}.cpp")));
        Ok(())
    }
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

//! NVRTC: finding the library, compiling CUDA C to PTX (no GPU needed), and a
//! cache of the results in memory and on disk.
//!
//! Where libnvrtc is looked for, in order (the first that loads wins):
//! 1. `DLBRIDGE_NVRTC`: the path of a `libnvrtc.so.*` file;
//! 2. the NVIDIA wheels of the Python environment that imported dlbridge
//!    ([`add_site_packages`]): torch's own NVRTC, which matches torch's CUDA;
//! 3. the loader's own search (`LD_LIBRARY_PATH`, the system's CUDA);
//! 4. the `lib` folders of `$CUDA_PATH`, `$CUDA_HOME` and `/usr/local/cuda`;
//! 5. the NVIDIA wheels of `$VIRTUAL_ENV` and of this checkout's `.venv`
//!    (torch's wheels carry NVRTC under `nvidia/cu13/lib`, CUDA 12 wheels under
//!    `nvidia/cuda_nvrtc/lib`).
//!
//! NVRTC opens `libnvrtc-builtins` by name when it compiles: found next to the
//! library, it is loaded first.
//!
//! The cache key is a SHA-256 of the source, the program name, every option
//! (the target architecture among them), NVRTC's version and this crate's
//! version; on disk a PTX file starts with a line naming its key and the
//! SHA-256 of the PTX, and a file whose key or contents do not check out is
//! compiled again and replaced (files are written under a unique temporary name
//! and renamed into place, so processes and threads compiling at once are safe).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use dlbridge_core::{Error, Result};
use dlbridge_registry::trust::{TrustedDir, seal, sealed};
use sha2::{Digest, Sha256};

use crate::probe::{Unavailable, guarded};
use crate::raw;

/// The NVRTC this process uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nvrtc {
    /// Where it was loaded from (`None`: found by the loader, by name).
    pub path: Option<PathBuf>,
    /// Its version, (major, minor).
    pub version: (i32, i32),
}

/// The library majors the bindings accept, newest first.
const MAJORS: &[u32] = if cfg!(feature = "cuda-12080") { &[12] } else { &[13, 12] };

static EXTRA_DIRS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Adds a Python environment's `site-packages` to the places NVRTC is looked
/// for (its NVIDIA wheels' `lib` folders), before the first use of NVRTC. The
/// Python extension registers its interpreter's site-packages when imported.
pub fn add_site_packages(dir: impl Into<PathBuf>) {
    EXTRA_DIRS.lock().unwrap_or_else(|p| p.into_inner()).push(dir.into());
}

/// The NVIDIA wheels' `lib` folders of the Python environment that imported dlbridge.
fn site_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for site in EXTRA_DIRS.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        dirs.push(site.join("nvidia/cu13/lib"));
        dirs.push(site.join("nvidia/cuda_nvrtc/lib"));
        dirs.push(site.join("nvidia/cu12/lib"));
    }
    dirs
}

fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = site_dirs();
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(Path::new(&v).join("lib64"));
            dirs.push(Path::new(&v).join("lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    let mut envs: Vec<PathBuf> = std::env::var_os("VIRTUAL_ENV").map(PathBuf::from).into_iter().collect();
    envs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv"));
    for env in envs {
        let Ok(entries) = std::fs::read_dir(env.join("lib")) else { continue };
        for e in entries.flatten() {
            let site = e.path().join("site-packages/nvidia");
            dirs.push(site.join("cu13/lib"));
            dirs.push(site.join("cuda_nvrtc/lib"));
        }
    }
    dirs
}

/// Loads `libnvrtc-builtins*` found next to `lib`, then `lib` itself.
fn preload_with_builtins(lib: &Path) -> std::result::Result<(), String> {
    if let Some(dir) = lib.parent()
        && let Ok(entries) = std::fs::read_dir(dir)
    {
        let mut builtins: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                n.starts_with("libnvrtc-builtins.so") && !n.contains(".alt.")
            })
            .collect();
        builtins.sort();
        for b in builtins {
            raw::preload(&b)?;
        }
    }
    raw::preload(lib)
}

fn find() -> std::result::Result<Nvrtc, Unavailable> {
    let mut tried = Vec::new();
    let mut path = None;
    if let Some(p) = std::env::var_os("DLBRIDGE_NVRTC") {
        let p = PathBuf::from(p);
        preload_with_builtins(&p).map_err(|e| Unavailable(format!("DLBRIDGE_NVRTC names a library that does not load: {e}")))?;
        path = Some(p);
    } else if let Some(lib) =
        site_dirs().iter().flat_map(|d| MAJORS.iter().map(move |m| d.join(format!("libnvrtc.so.{m}")))).find(|l| l.is_file())
        && preload_with_builtins(&lib).is_ok()
    {
        // The NVRTC of the wheels torch brings matches torch's CUDA, which works
        // with this machine's driver: preferred over whatever the loader finds.
        path = Some(lib);
    } else if !raw::nvrtc_present() {
        'dirs: for dir in candidate_dirs() {
            for major in MAJORS {
                let lib = dir.join(format!("libnvrtc.so.{major}"));
                if lib.is_file() {
                    match preload_with_builtins(&lib) {
                        Ok(()) => {
                            path = Some(lib);
                            break 'dirs;
                        }
                        Err(e) => tried.push(e),
                    }
                } else {
                    tried.push(format!("{}: not there", lib.display()));
                }
            }
        }
        if path.is_none() {
            return Err(Unavailable(format!(
                "libnvrtc (CUDA {MAJORS:?}) not found: not on the loader's path, not in CUDA_PATH, CUDA_HOME, /usr/local/cuda or a Python environment's NVIDIA wheels (set DLBRIDGE_NVRTC to its path); tried {}",
                tried.join("; ")
            )));
        }
    }
    if !raw::nvrtc_present() {
        return Err(Unavailable(
            "libnvrtc was loaded but cudarc cannot open it by name (its soname does not match the bindings' CUDA version)".into(),
        ));
    }
    let version = guarded("nvrtcVersion", raw::nvrtc_version).map_err(Unavailable)?.map_err(Unavailable)?;
    Ok(Nvrtc { path, version })
}

/// Loads another CUDA library (`cublas`) from the places NVRTC is looked for
/// when the loader cannot find it by name: first its dependencies in the same
/// folder (`deps`, e.g. `cublasLt`), then the library. `present` says whether
/// cudarc can now open it by name.
pub(crate) fn find_library(stem: &str, deps: &[&str], present: fn() -> bool) -> std::result::Result<Option<PathBuf>, Unavailable> {
    if present() {
        return Ok(None);
    }
    for dir in candidate_dirs() {
        for major in MAJORS {
            let lib = dir.join(format!("lib{stem}.so.{major}"));
            if !lib.is_file() {
                continue;
            }
            for d in deps {
                let dep = dir.join(format!("lib{d}.so.{major}"));
                if dep.is_file() {
                    raw::preload(&dep).map_err(Unavailable)?;
                }
            }
            raw::preload(&lib).map_err(Unavailable)?;
            if present() {
                return Ok(Some(lib));
            }
        }
    }
    Err(Unavailable(format!(
        "lib{stem} (CUDA {MAJORS:?}) not found: not on the loader's path, not in a Python environment's NVIDIA wheels, CUDA_PATH, CUDA_HOME or /usr/local/cuda"
    )))
}

/// NVRTC, found and loaded once per process.
pub fn nvrtc() -> std::result::Result<&'static Nvrtc, Unavailable> {
    static FOUND: OnceLock<std::result::Result<Nvrtc, Unavailable>> = OnceLock::new();
    FOUND.get_or_init(find).as_ref().map_err(Clone::clone)
}

/// Lines of NVRTC's log an error carries.
const MAX_LOG_LINES: usize = 60;

/// What NVRTC produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Output {
    /// PTX text (any architecture from `compute_XY` up; the driver compiles it
    /// when loading, and must be at least as new as NVRTC).
    Ptx,
    /// A CUBIN for exactly one GPU architecture (`--gpu-architecture=sm_XY`):
    /// no compilation at load time, and loadable by older drivers of NVRTC's
    /// CUDA major version.
    Cubin,
}

/// Compiles CUDA C with NVRTC to `output`. `name` is the program's name in
/// NVRTC's messages; `options` are NVRTC options (the target architecture among
/// them). A source that does not compile is an error carrying NVRTC's log.
pub fn compile(source: &str, name: &str, options: &[String], output: Output) -> Result<Vec<u8>> {
    compile_with_log(source, name, options, output).map(|(image, _)| image)
}

/// [`compile`], with NVRTC's log of a successful compilation (warnings; with
/// `--ptxas-options=-v` and a CUBIN, each kernel's registers and spills).
pub fn compile_with_log(source: &str, name: &str, options: &[String], output: Output) -> Result<(Vec<u8>, String)> {
    let nul = || Error::InvalidArgument(format!("{name}: CUDA source, name and options cannot contain a NUL byte"));
    let src = std::ffi::CString::new(source).map_err(|_| nul())?;
    let cname = std::ffi::CString::new(name).map_err(|_| nul())?;
    let opts: Vec<std::ffi::CString> =
        options.iter().map(|o| std::ffi::CString::new(o.as_str())).collect::<std::result::Result<_, _>>().map_err(|_| nul())?;
    nvrtc()?;
    match guarded("NVRTC", || raw::nvrtc_compile(&src, &cname, &opts, output == Output::Cubin)).map_err(Error::Runtime)? {
        raw::Compiled::Image(image, log) => Ok((image, log)),
        raw::Compiled::Failed(rc, log) => {
            // NVRTC stops at 100 errors, but one bad line can cascade into thousands of
            // lines of log: the first MAX_LOG_LINES are the useful ones.
            let lines: Vec<&str> = log.trim_end().lines().collect();
            let mut shown = lines[..lines.len().min(MAX_LOG_LINES)].join("\n");
            if lines.len() > MAX_LOG_LINES {
                shown += &format!("\n... ({} more lines of NVRTC's log)", lines.len() - MAX_LOG_LINES);
            }
            Err(Error::Runtime(format!("NVRTC could not compile {name} ({rc}, options {options:?}):\n{shown}")))
        }
        raw::Compiled::Error(e) => Err(Error::Runtime(format!("NVRTC failed on {name}: {e}"))),
    }
}

/// Compiles CUDA C to PTX (see [`compile`]).
pub fn compile_ptx(source: &str, name: &str, options: &[String]) -> Result<String> {
    let image = compile(source, name, options, Output::Ptx)?;
    String::from_utf8(image).map_err(|_| Error::Runtime(format!("NVRTC's PTX for {name} is not text")))
}

/// Whether NVRTC is here; when it is not, prints `skipped: <why>` on stderr
/// (the line the test suites report skipped tests by) and returns false. For
/// tests that need NVRTC but no GPU.
pub fn available_or_skip() -> bool {
    match nvrtc() {
        Ok(n) => {
            eprintln!("NVRTC {}.{} from {:?}", n.version.0, n.version.1, n.path);
            true
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            false
        }
    }
}

/// How often a [`PtxCache`] compiled, and found what it was asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Programs compiled by NVRTC.
    pub compiled: u64,
    /// Found in memory.
    pub memory_hits: u64,
    /// Found on disk.
    pub disk_hits: u64,
}

/// Finds and loads libcublas (and libcublasLt) like NVRTC: where it was loaded
/// from (`None`: by name), or why it cannot be. No GPU is needed to load it.
pub fn find_cublas() -> std::result::Result<Option<std::path::PathBuf>, Unavailable> {
    find_library("cublas", &["cublasLt"], raw::cublas_present)
}

/// Compiled PTX by key: in memory for the process, on disk across processes.
#[derive(Debug)]
pub struct PtxCache {
    dir: Option<PathBuf>,
    /// The directory, held open, when it may hold code this process loads
    /// ([`TrustedDir::open`]: its whole path checked), asked on first use.
    trusted: OnceLock<Option<TrustedDir>>,
    memory: Mutex<HashMap<[u8; 32], Arc<[u8]>>>,
    compiled: AtomicU64,
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
}

const HEADER: &str = "// dlbridge-ptx ";

fn hex(key: &[u8; 32]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a cached image's seal is bound to: its key and its kind.
fn seal_name(key: &[u8; 32], output: Output) -> String {
    format!("nvrtc {} {}", hex(key), if output == Output::Ptx { "ptx" } else { "cubin" })
}

impl PtxCache {
    /// A cache writing under `dir` (`None`: memory only).
    pub fn new(dir: Option<PathBuf>) -> PtxCache {
        PtxCache {
            dir,
            trusted: OnceLock::new(),
            memory: Mutex::new(HashMap::new()),
            compiled: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
        }
    }

    /// The process-wide cache: `DLBRIDGE_CACHE_DIR`, else `$XDG_CACHE_HOME/dlbridge/nvrtc`,
    /// else `~/.cache/dlbridge/nvrtc` (memory only when none of them is set).
    pub fn global() -> &'static PtxCache {
        static CACHE: OnceLock<PtxCache> = OnceLock::new();
        CACHE.get_or_init(|| {
            let var = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty()).map(PathBuf::from);
            let dir = var("DLBRIDGE_CACHE_DIR")
                .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("dlbridge")))
                .or_else(|| var("HOME").map(|h| h.join(".cache/dlbridge")))
                .map(|d| d.join("nvrtc"));
            PtxCache::new(dir)
        })
    }

    /// Where PTX files go.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The cache key of one compilation to PTX.
    pub fn key(source: &str, name: &str, options: &[String], nvrtc_version: (i32, i32)) -> [u8; 32] {
        Self::key_for(source, name, options, nvrtc_version, Output::Ptx)
    }

    /// The cache key of one compilation.
    pub fn key_for(source: &str, name: &str, options: &[String], nvrtc_version: (i32, i32), output: Output) -> [u8; 32] {
        let mut h = Sha256::new();
        let mut field = |b: &[u8]| {
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        };
        field(b"dlbridge-cuda");
        field(env!("CARGO_PKG_VERSION").as_bytes());
        field(format!("nvrtc {}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes());
        field(name.as_bytes());
        field(match output {
            Output::Ptx => b"ptx",
            Output::Cubin => b"cubin",
        });
        field(source.as_bytes());
        for o in options {
            field(o.as_bytes());
        }
        h.finalize().into()
    }

    /// The PTX of `source`, compiled at most once per key.
    pub fn get_or_compile(&self, source: &str, name: &str, options: &[String]) -> Result<Arc<str>> {
        let image = self.get_or_compile_to(source, name, options, Output::Ptx)?;
        std::str::from_utf8(&image).map(Arc::from).map_err(|_| Error::Runtime(format!("cached PTX of {name} is not text")))
    }

    /// The image of `source` (PTX or CUBIN), compiled at most once per key.
    pub fn get_or_compile_to(&self, source: &str, name: &str, options: &[String], output: Output) -> Result<Arc<[u8]>> {
        let version = nvrtc()?.version;
        let key = Self::key_for(source, name, options, version, output);
        if let Some(p) = self.memory.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(p.clone());
        }
        let dir = self.disk_dir();
        let file = format!("{}.{}", hex(&key), if output == Output::Ptx { "ptx" } else { "cubin" });
        // A file is used only when it is a regular file (never through a symbolic
        // link, read through the directory's handle) whose header names this key
        // and seals the image that follows under this user's secret ([`seal`]: a
        // torn, edited or planted file is compiled again and replaced, never
        // loaded). The image loaded is the one whose seal was checked: in memory.
        let from_disk = dir.and_then(|d| d.read(&file)).and_then(|bytes| {
            let nl = bytes.iter().position(|&b| b == b'\n')?;
            let line = std::str::from_utf8(&bytes[..nl]).ok()?.strip_prefix(HEADER)?;
            let image = &bytes[nl + 1..];
            let (k, tag) = line.split_once(' ')?;
            let ok = k == hex(&key) && sealed(&seal_name(&key, output), image, tag) && (output == Output::Cubin || !image.contains(&0));
            ok.then(|| image.to_vec())
        });
        let image: Arc<[u8]> = match from_disk {
            Some(image) => {
                self.disk_hits.fetch_add(1, Ordering::Relaxed);
                image.into()
            }
            None => {
                let image = compile(source, name, options, output)?;
                self.compiled.fetch_add(1, Ordering::Relaxed);
                if let Some(d) = dir {
                    let mut text = format!("{HEADER}{} {}\n", hex(&key), seal(&seal_name(&key, output), &image)).into_bytes();
                    text.extend_from_slice(&image);
                    // A cache that cannot be written is only slower: the error is not the caller's.
                    let _ = d.write(&file, &text);
                }
                image.into()
            }
        };
        self.memory.lock().unwrap_or_else(|p| p.into_inner()).insert(key, image.clone());
        Ok(image)
    }

    /// The directory to read and write, when it is one this process may load
    /// code from (else the cache is in memory only, and a warning says why, once).
    fn disk_dir(&self) -> Option<&TrustedDir> {
        let dir = self.dir.as_deref()?;
        self.trusted
            .get_or_init(|| match TrustedDir::open(dir) {
                Ok(d) => Some(d),
                Err(why) => {
                    eprintln!("dlbridge: not using the NVRTC cache {}: {why}; compiled code is kept in memory only", dir.display());
                    None
                }
            })
            .as_ref()
    }

    /// Counts so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            compiled: self.compiled.load(Ordering::Relaxed),
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_change_with_every_input() {
        let o = |s: &str| vec![s.to_string()];
        let base = PtxCache::key("src", "k", &o("--gpu-architecture=compute_80"), (13, 0));
        assert_eq!(base, PtxCache::key("src", "k", &o("--gpu-architecture=compute_80"), (13, 0)));
        assert_ne!(base, PtxCache::key("src2", "k", &o("--gpu-architecture=compute_80"), (13, 0)));
        assert_ne!(base, PtxCache::key("src", "k2", &o("--gpu-architecture=compute_80"), (13, 0)));
        assert_ne!(base, PtxCache::key("src", "k", &o("--gpu-architecture=compute_90"), (13, 0)));
        assert_ne!(base, PtxCache::key("src", "k", &o("--gpu-architecture=compute_80"), (12, 8)));
        // Field boundaries count: moving a byte from the name to the source is another key.
        assert_ne!(PtxCache::key("ab", "c", &[], (13, 0)), PtxCache::key("b", "ac", &[], (13, 0)));
    }

    #[test]
    fn a_nul_byte_in_the_source_is_an_error_not_a_panic() {
        let e = compile("__global__ void k() {}", "n\0ul", &[], Output::Cubin).unwrap_err();
        assert!(e.to_string().contains("NUL"), "{e}");
        let e = compile_ptx("__global__ void k() {}\0", "nul", &[]).unwrap_err();
        assert!(e.to_string().contains("NUL"), "{e}");
    }
}

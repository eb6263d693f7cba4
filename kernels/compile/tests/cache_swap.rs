//! The cache is checked where it is used: a directory swapped between each
//! check and each use (a test hook runs at each such moment) changes nothing
//! this process reads or loads. Another user's directory is made by `chown`
//! (these machines run the tests as root; elsewhere that part is skipped).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use dlbridge_compile::LibraryCache;
use dlbridge_compile::inline::{InlineLibrary, InlineOptions};
use dlbridge_registry::trust::{SwapHook, set_swap_hook};

const C: &str = "void swap_twice(const float* x, float* y, long long n) { for (long long i = 0; i < n; ++i) y[i] = 2 * x[i]; }\n";
const SIG: &str = "swap_twice(x: f32[N]) -> (y: f32[N])";

/// What code run at load would set.
const FLAG: &str = "DLBRIDGE_SWAPPED_LIBRARY_RAN";

/// A library whose constructor sets [`FLAG`]: what a swap would plant.
fn planted_library(at: &Path) {
    let src = at.with_extension("c");
    std::fs::write(
        &src,
        format!("#include <stdlib.h>\n__attribute__((constructor)) static void f(void) {{ setenv(\"{FLAG}\", \"1\", 1); }}\n"),
    )
    .unwrap();
    let ok = std::process::Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(at).arg(&src).status().unwrap().success();
    assert!(ok, "the planted library builds");
}

/// Makes the library and builds it (`check` compiles it for its first dtypes).
fn build(cache: &Arc<LibraryCache>, name: &str) -> dlbridge_core::Result<InlineLibrary> {
    let lib = InlineLibrary::new(name, Some(C), &[SIG], None, InlineOptions { cache: Some(cache.clone()), ..Default::default() })?;
    lib.check()?;
    Ok(lib)
}

fn hook(f: impl Fn(&str, &Path) + Send + Sync + 'static) {
    set_swap_hook(Some(Box::new(f) as SwapHook));
}

/// Replaces `dir` by a new directory (the old one moved beside it), as
/// whoever can write its parent could; returns where the old one went.
fn swap(dir: &Path) -> PathBuf {
    let moved = dir.with_extension("moved");
    std::fs::rename(dir, &moved).unwrap();
    std::fs::create_dir(dir).unwrap();
    moved
}

#[test]
fn swapping_the_cache_between_check_and_use_never_loads_the_swapped_in_library() {
    let root = tempfile::tempdir().unwrap();

    // 1. During a build: the build directory's path is swapped after the
    //    checks, the files copied over (the compiler then writes there). The
    //    library is read back through the directory's handle: it is not there,
    //    and that is an error; nothing planted is loaded.
    let dir = root.path().join("during-build");
    let cache = Arc::new(LibraryCache::new(dir.clone()));
    let fired = Arc::new(AtomicBool::new(false));
    let f = fired.clone();
    hook(move |moment, path| {
        let is_build_dir = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with(".dlbridge-build-"));
        if moment == "checked" && is_build_dir && !f.swap(true, Ordering::SeqCst) {
            let cache_dir = path.parent().unwrap().to_path_buf();
            let moved = swap(&cache_dir);
            let copy = cache_dir.join(path.file_name().unwrap());
            std::fs::create_dir(&copy).unwrap();
            for e in std::fs::read_dir(moved.join(path.file_name().unwrap())).unwrap() {
                let e = e.unwrap();
                std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
            }
            planted_library(&copy.join("kernel.so"));
        }
    });
    let Err(e) = build(&cache, "swap_during_build") else { panic!("the build whose directory moved succeeded") };
    set_swap_hook(None);
    assert!(fired.load(Ordering::SeqCst), "the hook ran");
    assert!(e.to_string().contains("the directory was moved or replaced during the build"), "{e}");
    assert!(std::env::var_os(FLAG).is_none(), "the planted library ran");

    // 2. A cached library, and the cache swapped for another user's directory
    //    holding a library under its key between the path check and the open:
    //    the handle is checked itself, refused, and the kernel is compiled in
    //    a private directory.
    let dir = root.path().join("cached");
    let first = Arc::new(LibraryCache::new(dir.clone()));
    let lib = build(&first, "swap_cached").unwrap();
    assert_eq!(first.stats.compiled.load(Ordering::Relaxed), 1);
    drop(lib);
    if dlbridge_registry::trust::euid() == 0 {
        let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        let so = names.iter().find(|n| n.ends_with(".so")).expect("the library is cached").clone();
        let fired = Arc::new(AtomicBool::new(false));
        let f = fired.clone();
        let target = dir.clone();
        hook(move |moment, path| {
            if moment == "checked" && path == target && !f.swap(true, Ordering::SeqCst) {
                swap(path);
                planted_library(&path.join(&so));
                std::fs::write(path.join(so.replace(".so", ".seal")), "0".repeat(64)).unwrap();
                std::process::Command::new("chown").args(["-R", "65534"]).arg(path).status().unwrap();
            }
        });
        let second = Arc::new(LibraryCache::new(dir.clone()));
        let lib = build(&second, "swap_cached");
        set_swap_hook(None);
        assert!(fired.load(Ordering::SeqCst));
        let lib = lib.expect("compiled in a private directory instead");
        assert!(second.trusted().unwrap_err().contains("belongs to user 65534"), "the swapped-in directory is refused");
        assert_eq!(second.stats.compiled.load(Ordering::Relaxed), 1, "nothing was taken from it");
        drop(lib);
    } else {
        eprintln!("skipped: the second part needs another user's directory, which only root can make");
    }
    assert!(std::env::var_os(FLAG).is_none(), "the planted library ran");
}

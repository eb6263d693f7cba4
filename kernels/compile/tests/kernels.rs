//! The Rust API end to end: ElementwiseKernel / ReductionKernel registered in a
//! registry and called like any kernel; the disk cache; concurrent first use.

mod common;

use dlbridge_array::Array;
use dlbridge_compile::LibraryCache;
use dlbridge_compile::{ElementwiseKernel, Reduction, ReductionKernel};
use dlbridge_core::{DType, ErrorKind};
use dlbridge_registry::{Arg, Call, KernelDef, KernelOpts, Registry};

fn f32s(v: &[f32], shape: &[i64]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

#[test]
fn an_elementwise_kernel_broadcasts_through_the_registry() {
    let reg = Registry::new();
    let k = ElementwiseKernel::new("T x, T y", "T z", "z = (x - y) * (x - y)", "sqdiff_rs", Default::default()).unwrap();
    assert!(k.signature().starts_with("sqdiff_rs<T: bool|i8|"), "{}", k.signature());
    let kernel = k.register(&reg).unwrap();
    let x = f32s(&(0..10).map(|i| i as f32).collect::<Vec<_>>(), &[2, 5]);
    let y = f32s(&[0.0, 1.0, 2.0, 3.0, 4.0], &[5]);
    let specs = kernel.prepare_outputs(&[Arg::Tensor(x.view()), Arg::Tensor(y.view())]).unwrap();
    assert_eq!(&specs[0].shape[..], &[2, 5]);
    let mut z = Array::zeros(DType::F32, &[2, 5]).unwrap();
    kernel.call(&mut [Arg::Tensor(x.view()), Arg::Tensor(y.view())], &mut [z.view_mut().unwrap()]).unwrap();
    let want: Vec<f32> = (0..10).map(|i| ((i as f32) - (i % 5) as f32).powi(2)).collect();
    assert_eq!(z.to_vec::<f32>().unwrap(), want);
    // f64 is another specialisation of the same kernel.
    let x = Array::from_slice(&[1.5f64, 2.5], &[2]).unwrap();
    let mut z = Array::zeros(DType::F64, &[2]).unwrap();
    kernel.call(&mut [Arg::Tensor(x.view()), Arg::Tensor(x.view())], &mut [z.view_mut().unwrap()]).unwrap();
    assert_eq!(z.to_vec::<f64>().unwrap(), vec![0.0, 0.0]);
    assert_eq!(k.specialisations(), 2);
}

#[test]
fn concurrent_first_calls_build_one_specialisation_and_all_get_the_right_answer() {
    let reg = Registry::new();
    let k = ElementwiseKernel::new("T x", "T y", "y = x * x + 3", "concurrent_rs", Default::default()).unwrap();
    let kernel = k.register(&reg).unwrap();
    for y in common::call_from_threads(&kernel, 1000, 8) {
        assert!(y.iter().enumerate().all(|(i, &v)| v == (i * i + 3) as i32));
    }
    assert_eq!(k.specialisations(), 1);
}

#[test]
fn a_kernel_compiled_from_source_replaces_its_own_name_but_never_another_kernel() {
    let reg = Registry::new();
    let noop = KernelDef::cpu("add<T: f32|f64>(a: T[...S], b: T[...S]) -> (out: T[...S])", |_: &mut Call<'_, '_>| Ok(()));
    reg.register(KernelDef { opts: KernelOpts::ELEMENTWISE, origin: "built-in (test)".into(), ..noop }).unwrap();
    let e = ElementwiseKernel::new("T a, T b", "T out", "out = a + b", "add", Default::default()).unwrap().register(&reg).unwrap_err();
    assert!(e.to_string().contains("kernel add is already registered"), "{e}");
    assert!(reg.get("add").unwrap().origins().all(|(_, o)| o == "built-in (test)"), "the built-in stays");
    let first = ElementwiseKernel::new("T x", "T y", "y = x + 1", "relabel", Default::default()).unwrap().register(&reg).unwrap();
    let second = ElementwiseKernel::new("T x", "T y", "y = x + 2", "relabel", Default::default()).unwrap().register(&reg).unwrap();
    let x = f32s(&[1.0], &[1]);
    let run = |k: &dlbridge_registry::Kernel| {
        let mut y = Array::zeros(DType::F32, &[1]).unwrap();
        k.call(&mut [Arg::Tensor(x.view())], &mut [y.view_mut().unwrap()]).unwrap();
        y.to_vec::<f32>().unwrap()[0]
    };
    assert_eq!(run(&reg.get("relabel").unwrap()), 3.0, "the newest kernel of the name is registered");
    assert_eq!(run(&first), 2.0, "holders of the old kernel keep it");
    assert_eq!(run(&second), 3.0);
}

#[test]
fn a_reduction_runs_over_any_axes_with_keepdims() {
    let reg = Registry::new();
    let k = ReductionKernel::new(Reduction::new("T x", "T y", "x * x", "a + b", "y = sqrt(a)", Some("0"), "l2norm_rs")).unwrap();
    assert!(k.signature().contains("(x: T[...S], y: mut T[...O])"), "{}", k.signature());
    let kernel = k.register(&reg).unwrap();
    let data: Vec<f64> = (0..24).map(|i| i as f64 * 0.5 - 3.0).collect();
    let x = Array::from_slice(&data, &[2, 3, 4]).unwrap();
    let norm = |f: &dyn Fn(usize, usize, usize) -> bool| {
        data.iter().enumerate().filter(|(i, _)| f(i / 12, i / 4 % 3, i % 4)).map(|(_, v)| v * v).sum::<f64>().sqrt()
    };
    let y = k.reduce(&kernel, &[&x], Some(&[1]), false).unwrap().remove(0);
    assert_eq!(y.shape(), &[2, 4]);
    let got = y.to_vec::<f64>().unwrap();
    for a in 0..2 {
        for c in 0..4 {
            assert!((got[a * 4 + c] - norm(&|i, _, k| i == a && k == c)).abs() < 1e-12);
        }
    }
    let y = k.reduce(&kernel, &[&x], Some(&[0, -1]), true).unwrap().remove(0);
    assert_eq!(y.shape(), &[1, 3, 1]);
    let got = y.to_vec::<f64>().unwrap();
    for (b, g) in got.iter().enumerate() {
        assert!((g - norm(&|_, j, _| j == b)).abs() < 1e-12);
    }
    let all = k.reduce(&kernel, &[&x], None, false).unwrap().remove(0);
    assert_eq!(all.shape(), &[] as &[i64]);
    assert!((all.to_vec::<f64>().unwrap()[0] - norm(&|_, _, _| true)).abs() < 1e-12);
    let e = k.reduce(&kernel, &[&x], Some(&[3]), false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value);
    assert!(e.to_string().contains("axis 3 is out of bounds for an array of 3 dims"), "{e}");
}

#[test]
fn the_disk_cache_builds_once_and_a_second_cache_finds_it() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dlbridge_compile::ElementwiseSpec::new("T x", "T y", "y = -x", "neg_cache", "", "", "").unwrap();
    let bind = [('T', DType::F32)];
    let source = dlbridge_compile::internals::elementwise_cpp(&spec, &bind).unwrap();
    let first = LibraryCache::new(dir.path().to_path_buf());
    // What was loaded: the bytes the loader was given (held by this process, never the cache's path).
    let load = |held: &dlbridge_compile::HeldLibrary| -> dlbridge_core::Result<Vec<u8>> {
        dlbridge_registry::Plugin::open_held(held)?;
        Ok(std::fs::read(held.path()).unwrap())
    };
    let loaded = first.get_or_build(&source, "T=f32", "neg_cache", &[("operation", "y = -x")], load).unwrap();
    assert_eq!(first.stats.compiled.load(std::sync::atomic::Ordering::Relaxed), 1);
    let path =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == "so")).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), loaded, "the cached library is the one loaded");
    let second = LibraryCache::new(dir.path().to_path_buf());
    assert_eq!(second.get_or_build(&source, "T=f32", "neg_cache", &[], load).unwrap(), loaded);
    assert_eq!(second.stats.compiled.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(second.stats.disk_hits.load(std::sync::atomic::Ordering::Relaxed), 1);
    // A damaged file is rebuilt, not trusted: one that does not load, and one
    // that still loads but whose code bytes changed (it would run).
    std::fs::write(&path, b"not a library").unwrap();
    let third = LibraryCache::new(dir.path().to_path_buf());
    third.get_or_build(&source, "T=f32", "neg_cache", &[], load).unwrap();
    assert_eq!(third.stats.compiled.load(std::sync::atomic::Ordering::Relaxed), 1);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 8] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let fourth = LibraryCache::new(dir.path().to_path_buf());
    fourth.get_or_build(&source, "T=f32", "neg_cache", &[], load).unwrap();
    assert_eq!(fourth.stats.compiled.load(std::sync::atomic::Ordering::Relaxed), 1, "a library with changed bytes is rebuilt");
    assert_eq!(fourth.stats.disk_hits.load(std::sync::atomic::Ordering::Relaxed), 0);
    let names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.contains(".tmp")), "no temporary files left: {names:?}");
    assert_eq!(names.iter().filter(|n| n.ends_with(".so")).count(), 1, "{names:?}");
    assert_eq!(names.iter().filter(|n| n.ends_with(".seal")).count(), 1, "{names:?}");
    // A directory where the library goes costs the cache entry, not the kernel.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let fifth = LibraryCache::new(dir.path().to_path_buf());
    assert_eq!(fifth.get_or_build(&source, "T=f32", "neg_cache", &[], load).unwrap().len(), loaded.len(), "built and loaded from memory");
    assert_eq!(fifth.stats.compiled.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert!(path.is_dir(), "the directory is left alone");
}

#[test]
fn a_compile_error_points_into_the_operation() {
    let reg = Registry::new();
    let k = ElementwiseKernel::new("T x", "T z", "z = x +* 2", "bad_rs", Default::default()).unwrap();
    let kernel = k.register(&reg).unwrap();
    let x = f32s(&[1.0], &[1]);
    let mut z = Array::zeros(DType::F32, &[1]).unwrap();
    let e = kernel.call(&mut [Arg::Tensor(x.view())], &mut [z.view_mut().unwrap()]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value);
    let m = e.to_string();
    assert!(m.contains("ElementwiseKernel bad_rs (T=f32): the C++ compiler"), "{m}");
    assert!(m.contains("operation line 1, column"), "{m}");
}

/// Integer division or modulo by zero in a body is an error naming the kernel
/// (with g++/clang++ that take `-fsanitize=integer-divide-by-zero`), not a
/// SIGFPE that kills the process; on one thread and on many, and the kernel
/// keeps working afterwards.
#[test]
fn integer_division_by_zero_in_a_body_is_an_error_not_a_crash() {
    let compiler = dlbridge_compile::internals::Compiler::get().unwrap();
    if compiler.divguard.is_empty() {
        println!("skipped: {} does not take -fsanitize=integer-divide-by-zero without its runtime", compiler.version);
        return;
    }
    let reg = Registry::new();
    let k =
        ElementwiseKernel::new("int32 x, int32 y", "int32 q, int32 r", "q = x / y; r = x % y", "divmod_rs", Default::default()).unwrap();
    let kernel = k.register(&reg).unwrap();
    // 2^20 elements run on several threads (above the parallel threshold); a few.
    for n in [8usize, 1 << 20] {
        let xs: Vec<i32> = (0..n as i32).map(|i| i + 7).collect();
        let mut ys: Vec<i32> = (0..n as i32).map(|i| i % 5 + 1).collect();
        let (x, y_ok) = (Array::from_slice(&xs, &[n as i64]).unwrap(), Array::from_slice(&ys, &[n as i64]).unwrap());
        ys[n - 3] = 0; // in the last chunk
        let y_bad = Array::from_slice(&ys, &[n as i64]).unwrap();
        let (mut q, mut r) = (Array::zeros(DType::I32, &[n as i64]).unwrap(), Array::zeros(DType::I32, &[n as i64]).unwrap());
        let e = kernel
            .call(&mut [Arg::Tensor(x.view()), Arg::Tensor(y_bad.view())], &mut [q.view_mut().unwrap(), r.view_mut().unwrap()])
            .unwrap_err();
        assert_eq!(e.to_string(), "divmod_rs: integer division or modulo by zero (plugin dlbridge-compile:divmod_rs)", "{e}");
        assert_eq!(e.kind(), ErrorKind::Runtime);
        kernel.call(&mut [Arg::Tensor(x.view()), Arg::Tensor(y_ok.view())], &mut [q.view_mut().unwrap(), r.view_mut().unwrap()]).unwrap();
        let (q, r) = (q.to_vec::<i32>().unwrap(), r.to_vec::<i32>().unwrap());
        for i in 0..n {
            let (a, b) = (xs[i], i as i32 % 5 + 1);
            assert_eq!((q[i], r[i]), (a / b, a % b), "element {i}");
        }
    }
}

#[test]
fn a_kernel_from_source_includes_system_headers_only() {
    let dir = tempfile::tempdir().unwrap();
    let header = dir.path().join("factor.h");
    std::fs::write(&header, "#define FACTOR 2\n").unwrap();
    let reg = Registry::new();
    let opts = dlbridge_compile::ElementwiseOptions {
        preamble: format!("#include \"{}\"\n#include <cmath>\n", header.display()),
        ..Default::default()
    };
    let kernel = ElementwiseKernel::new("T x", "T y", "y = x * FACTOR", "own_header", opts).unwrap().register(&reg).unwrap();
    let x = f32s(&[1.0], &[1]);
    let mut y = Array::zeros(DType::F32, &[1]).unwrap();
    let e = kernel.call(&mut [Arg::Tensor(x.view())], &mut [y.view_mut().unwrap()]).unwrap_err().to_string();
    assert!(e.contains("`preamble` includes") && e.contains("factor.h") && e.contains("system headers only"), "{e}");
    // A system header is fine.
    let opts = dlbridge_compile::ElementwiseOptions { preamble: "#include <cmath>\n".into(), ..Default::default() };
    let kernel = ElementwiseKernel::new("T x", "T y", "y = std::fabs(x)", "system_header", opts).unwrap().register(&reg).unwrap();
    let x = f32s(&[-3.0], &[1]);
    kernel.call(&mut [Arg::Tensor(x.view())], &mut [y.view_mut().unwrap()]).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0]);
}

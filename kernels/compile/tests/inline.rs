//! `InlineLibrary` (dlbridge.load_inline) end to end: the user's C functions
//! registered under their signatures and called through the registry; sizes,
//! scalars, generic dtypes; compile errors pointing into `c_source`; the disk
//! cache; concurrent first use; `cuda_source` compiled to PTX without a GPU;
//! and (with a GPU only) a CUDA launch.

mod common;

use std::sync::Arc;

use dlbridge_array::Array;
use dlbridge_compile::LibraryCache;
use dlbridge_compile::inline::{InlineLibrary, InlineOptions};
use dlbridge_core::{DType, DeviceType, ErrorKind};
use dlbridge_registry::{Arg, Call, KernelDef, Registry};

const AXPY: &str =
    "void axpy(const float* x, float* y, double a, long long n) {\n  for (long long i = 0; i < n; ++i) y[i] += (float)a * x[i];\n}\n";

const MATMUL: &str = r#"
#include <math.h>
void matmul(const T* a, const T* b, T* c, long long M, long long K, long long N) {
  for (long long i = 0; i < M; ++i)
    for (long long j = 0; j < N; ++j) {
      T acc = 0;
      for (long long k = 0; k < K; ++k) acc += a[i * K + k] * b[k * N + j];
      c[i * N + j] = acc;
    }
}
"#;

fn private_cache() -> (tempfile::TempDir, Arc<LibraryCache>) {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(LibraryCache::new(dir.path().to_path_buf()));
    (dir, cache)
}

/// A C library of `functions` defined in `src`, built in `cache`.
fn c_library_in(cache: &Arc<LibraryCache>, name: &str, src: &str, functions: &[&str]) -> InlineLibrary {
    InlineLibrary::new(name, Some(src), functions, None, InlineOptions { cache: Some(cache.clone()), ..Default::default() }).unwrap()
}

#[test]
fn axpy_writes_its_mut_argument_in_place() {
    let reg = Registry::new();
    let lib = InlineLibrary::new("rs_axpy", Some(AXPY), &["axpy(x: f32[N], y: mut f32[N], a: f64)"], None, Default::default()).unwrap();
    let kernels = lib.register(&reg).unwrap();
    assert_eq!(kernels.len(), 1);
    let k = reg.get("axpy").unwrap();
    assert!(k.origins().all(|(d, o)| d == DeviceType::CPU && o == "dlbridge.load_inline (rs_axpy)"));
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let mut y = Array::from_slice(&[10.0f32, 20.0, 30.0], &[3]).unwrap();
    k.call(&mut [Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap()), Arg::f64(2.0)], &mut []).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![12.0, 24.0, 36.0]);
    assert_eq!(lib.prototype("axpy").unwrap(), "void axpy(const float* x, float* y, double a, long long N)");
    // A strided tensor is refused by the registry (the C code assumes C order).
    let x2 = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[6]).unwrap();
    let strided = x2.slice(0, 0, 6, 2).unwrap();
    let e = k.call(&mut [Arg::Tensor(strided.view()), Arg::TensorMut(y.view_mut().unwrap()), Arg::f64(1.0)], &mut []).unwrap_err();
    assert!(e.to_string().contains("contiguous"), "{e}");
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![12.0, 24.0, 36.0], "nothing written");
}

#[test]
fn a_generic_matmul_with_outputs_and_sizes_matches_a_reference_for_f32_and_f64() {
    let reg = Registry::new();
    let lib = InlineLibrary::new(
        "rs_matmul",
        Some(MATMUL),
        &["matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])"],
        None,
        Default::default(),
    )
    .unwrap();
    let k = lib.register(&reg).unwrap().remove(0);
    let (m, kk, n) = (3usize, 4usize, 5usize);
    let a: Vec<f64> = (0..m * kk).map(|i| i as f64 * 0.5 - 2.0).collect();
    let b: Vec<f64> = (0..kk * n).map(|i| 1.0 - i as f64 * 0.25).collect();
    let want: Vec<f64> = (0..m * n).map(|ij| (0..kk).map(|p| a[(ij / n) * kk + p] * b[p * n + ij % n]).sum::<f64>()).collect();
    // f64
    let (xa, xb) = (Array::from_slice(&a, &[m as i64, kk as i64]).unwrap(), Array::from_slice(&b, &[kk as i64, n as i64]).unwrap());
    let specs = k.prepare_outputs(&[Arg::Tensor(xa.view()), Arg::Tensor(xb.view())]).unwrap();
    assert_eq!(&specs[0].shape[..], &[m as i64, n as i64]);
    let mut c = Array::zeros(DType::F64, &[m as i64, n as i64]).unwrap();
    k.call(&mut [Arg::Tensor(xa.view()), Arg::Tensor(xb.view())], &mut [c.view_mut().unwrap()]).unwrap();
    assert_eq!(c.to_vec::<f64>().unwrap(), want);
    // f32: another build
    let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
    let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
    let (xa, xb) = (Array::from_slice(&a32, &[m as i64, kk as i64]).unwrap(), Array::from_slice(&b32, &[kk as i64, n as i64]).unwrap());
    let mut c = Array::zeros(DType::F32, &[m as i64, n as i64]).unwrap();
    k.call(&mut [Arg::Tensor(xa.view()), Arg::Tensor(xb.view())], &mut [c.view_mut().unwrap()]).unwrap();
    for (g, w) in c.to_vec::<f32>().unwrap().iter().zip(&want) {
        assert!((f64::from(*g) - w).abs() < 1e-4, "{g} {w}");
    }
    assert_eq!(lib.cpu_specialisations(), 2);
    // A shape mismatch is the registry's error, before any C runs.
    let bad = Array::zeros(DType::F32, &[3, 3]).unwrap();
    let e = k.call(&mut [Arg::Tensor(xa.view()), Arg::Tensor(bad.view())], &mut [c.view_mut().unwrap()]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value, "{e}");
}

#[test]
fn scalars_of_each_kind_and_groups_reach_the_c_function() {
    let reg = Registry::new();
    let src = r#"
void affine(const double* x, double a, long long b, int neg, double* y, long long B, long long N) {
  for (long long i = 0; i < B * N; ++i) { double v = a * x[i] + (double)b; y[i] = neg ? -v : v; }
}
void count(const unsigned char* m, long long* out, long long S) {
  long long c = 0;
  for (long long i = 0; i < S; ++i) c += m[i] != 0;
  out[0] = c;
}
"#;
    let lib = InlineLibrary::new(
        "rs_scalars",
        Some(src),
        &["affine(x: f64[...B, N], a: f64, b: i64, neg: bool) -> (y: f64[...B, N])", "count(m: bool[...S]) -> (out: i64[1])"],
        None,
        Default::default(),
    )
    .unwrap();
    lib.register(&reg).unwrap();
    let x = Array::from_slice(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 1, 3]).unwrap();
    let mut y = Array::zeros(DType::F64, &[2, 1, 3]).unwrap();
    let k = reg.get("affine").unwrap();
    k.call(&mut [Arg::Tensor(x.view()), Arg::f64(2.0), Arg::i64(-1), Arg::bool(true)], &mut [y.view_mut().unwrap()]).unwrap();
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![-1.0, -3.0, -5.0, -7.0, -9.0, -11.0]);
    k.call(&mut [Arg::Tensor(x.view()), Arg::f64(0.5), Arg::i64(10), Arg::bool(false)], &mut [y.view_mut().unwrap()]).unwrap();
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![10.5, 11.0, 11.5, 12.0, 12.5, 13.0]);
    let m = Array::from_bytes(DType::BOOL, &[2, 3], &[1, 0, 1, 1, 0, 0]).unwrap();
    let mut out = Array::zeros(DType::I64, &[1]).unwrap();
    reg.get("count").unwrap().call(&mut [Arg::Tensor(m.view())], &mut [out.view_mut().unwrap()]).unwrap();
    assert_eq!(out.to_vec::<i64>().unwrap(), vec![3]);
    // Both functions are one plugin (one build).
    assert_eq!(lib.cpu_specialisations(), 1);
}

#[test]
fn a_definition_that_does_not_match_its_signature_is_a_compile_error_at_its_c_source_line() {
    let (_dir, cache) = private_cache();
    let src = "// a comment\n\nvoid axpy(const float* x, float* y, float a, long long n) {\n  for (long long i = 0; i < n; ++i) y[i] += a * x[i];\n}\n";
    let lib = c_library_in(&cache, "rs_mismatch", src, &["axpy(x: f32[N], y: mut f32[N], a: f64)"]);
    let e = lib.register(&Registry::new()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value);
    let m = e.to_string();
    assert!(m.contains("load_inline rs_mismatch: the C++ compiler"), "{m}");
    assert!(m.contains("c_source line 3, column") && m.contains("`axpy` is defined as"), "{m}");
    assert!(m.contains("void axpy(const float* x, float* y, double a, long long N);"), "the expected prototype: {m}");
    // A syntax error, and a function the source does not define.
    let lib = InlineLibrary::new(
        "rs_syntax",
        Some("void f(float* y, long long n) { y[0] = ; }\n"),
        &["f(y: mut f32[N])"],
        None,
        Default::default(),
    )
    .unwrap();
    let m = lib.register(&Registry::new()).unwrap_err().to_string();
    assert!(m.contains("c_source line 1, column"), "{m}");
    if cfg!(target_os = "linux") {
        let lib = InlineLibrary::new("rs_undefined", Some("void g(float*, long long);\n"), &["g(y: mut f32[N])"], None, Default::default())
            .unwrap();
        let m = lib.register(&Registry::new()).unwrap_err().to_string();
        assert!(m.contains("does not define: g"), "{m}");
    }
}

#[test]
fn names_signatures_and_sources_are_checked_before_anything_compiles() {
    let e =
        InlineLibrary::with_names("rs_names", Some(AXPY), &[("saxpy", "axpy(x: f32[N], y: mut f32[N], a: f64)")], None, Default::default())
            .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value);
    assert!(e.to_string().contains("functions[\"saxpy\"] has the signature of `axpy`"), "{e}");
    // The library's name is a C identifier (it reaches generated code and file names).
    for (bad, why) in [
        ("lib\nint evil;", "is not a C identifier"),
        ("a-b", "is not a C identifier"),
        ("", "is not a C identifier"),
        ("x".repeat(300).as_str(), "is longer than"),
    ] {
        let e = InlineLibrary::new(bad, Some(AXPY), &["axpy(x: f32[N], y: mut f32[N], a: f64)"], None, Default::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Value);
        assert!(e.to_string().starts_with("load_inline: the library name `") && e.to_string().contains(why), "{e}");
    }
    // A sanitizer runtime would end the process when the library is loaded: refused.
    for flag in ["-fsanitize=address", "-fsanitize=undefined", "-lasan", "-static-libasan"] {
        let opts = InlineOptions { extra_cflags: vec!["-O2".into(), flag.into()], ..Default::default() };
        let e = InlineLibrary::new("rs_san", Some(AXPY), &["axpy(x: f32[N], y: mut f32[N], a: f64)"], None, opts).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Value);
        assert!(e.to_string().contains(&format!("extra_cflags `{flag}` would link a sanitizer runtime")), "{e}");
    }
    let e = InlineLibrary::new("rs_none", None, &["axpy(x: f32[N])"], None, Default::default()).unwrap_err();
    assert!(e.to_string().contains("give c_source, cuda_source, sources, or several"), "{e}");
    let e = InlineLibrary::new("rs_missing", Some(AXPY), &["nope(x: f32[N])"], None, Default::default()).unwrap_err();
    assert!(e.to_string().contains("function `nope` is listed in `functions`, but c_source does not mention it"), "{e}");
    let e = InlineLibrary::new("rs_bcast", Some("f"), &["f(x: f32[*S]) -> (y: f32[*S])"], None, Default::default()).unwrap_err();
    assert!(e.to_string().contains("broadcast group"), "{e}");
    let e = InlineLibrary::new("rs_vars", Some("f g"), &["f<T: f32|f64>(x: T[N])", "g<T: i32>(x: T[N])"], None, Default::default())
        .unwrap_err();
    assert!(e.to_string().contains("type variable T is f32|f64 in `f` but i32 in `g`"), "{e}");
    let e = InlineLibrary::new("rs_c64", Some("f"), &["f(x: c64[N])"], None, Default::default()).unwrap_err();
    assert!(e.to_string().contains("c64"), "{e}");
}

#[test]
fn a_name_taken_by_a_built_in_is_an_error_and_a_reload_replaces_its_own_functions() {
    let reg = Registry::new();
    let noop = KernelDef::cpu("axpy(x: f32[N], y: mut f32[N], a: f64)", |_: &mut Call<'_, '_>| Ok(()));
    reg.register(KernelDef { origin: "built-in (test)".into(), ..noop }).unwrap();
    let lib = InlineLibrary::new("rs_clash", Some(AXPY), &["axpy(x: f32[N], y: mut f32[N], a: f64)"], None, Default::default()).unwrap();
    let e = lib.register(&reg).unwrap_err();
    assert!(e.to_string().contains("function `axpy` clashes with the kernel `axpy` already registered (cpu: built-in (test))"), "{e}");
    assert!(reg.get("axpy").unwrap().origins().all(|(_, o)| o == "built-in (test)"));

    let reg = Registry::new();
    let v1 = "void addone(float* y, long long n) { for (long long i = 0; i < n; ++i) y[i] += 1; }\nvoid gone(float* y, long long n) {}\n";
    let v2 = "void addone(float* y, long long n) { for (long long i = 0; i < n; ++i) y[i] += 2; }\n";
    InlineLibrary::new("rs_reload", Some(v1), &["addone(y: mut f32[N])", "gone(y: mut f32[N])"], None, Default::default())
        .unwrap()
        .register(&reg)
        .unwrap();
    InlineLibrary::new("rs_reload", Some(v2), &["addone(y: mut f32[N])"], None, Default::default()).unwrap().register(&reg).unwrap();
    let mut y = Array::from_slice(&[1.0f32], &[1]).unwrap();
    reg.get("addone").unwrap().call(&mut [Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0]);
    assert!(reg.get("gone").is_err(), "a function the new library does not have is unregistered");
}

#[test]
fn a_second_cache_over_the_same_directory_finds_the_build_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let sig = ["axpy(x: f32[N], y: mut f32[N], a: f64)"];
    let run = |cache: Arc<LibraryCache>, flags: Vec<String>| {
        let lib = InlineLibrary::new(
            "rs_cache",
            Some(AXPY),
            &sig,
            None,
            InlineOptions { cache: Some(cache), extra_cflags: flags, ..Default::default() },
        )
        .unwrap();
        let reg = Registry::new();
        let k = lib.register(&reg).unwrap().remove(0);
        let x = Array::from_slice(&[1.0f32], &[1]).unwrap();
        let mut y = Array::from_slice(&[1.0f32], &[1]).unwrap();
        k.call(&mut [Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap()), Arg::f64(3.0)], &mut []).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![4.0]);
    };
    let stats = |c: &LibraryCache| {
        (c.stats.compiled.load(std::sync::atomic::Ordering::Relaxed), c.stats.disk_hits.load(std::sync::atomic::Ordering::Relaxed))
    };
    let first = Arc::new(LibraryCache::new(dir.path().to_path_buf()));
    run(first.clone(), vec![]);
    assert_eq!(stats(&first), (1, 0));
    let second = Arc::new(LibraryCache::new(dir.path().to_path_buf()));
    run(second.clone(), vec![]);
    assert_eq!(stats(&second), (0, 1), "found on disk, not compiled");
    // extra_cflags are part of the key.
    let third = Arc::new(LibraryCache::new(dir.path().to_path_buf()));
    run(third.clone(), vec!["-DDLBRIDGE_TEST_FLAG=1".into()]);
    assert_eq!(stats(&third), (1, 0));
}

/// A header `factor.h` in `dir`, and C source that includes it: `scale` multiplies by its `FACTOR`.
fn scale_by_header(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    let header = dir.join("factor.h");
    let c = format!(
        "#include \"{}\"\nvoid scale(const float* x, float* y, long long n) {{ for (long long j = 0; j < n; ++j) y[j] = x[j] * FACTOR; }}\n",
        header.display()
    );
    (header, c)
}

#[test]
fn a_header_the_c_source_includes_is_part_of_the_cache_key() {
    let dir = tempfile::tempdir().unwrap();
    let (header, c) = scale_by_header(dir.path());
    let run = |cache: Arc<LibraryCache>| {
        let lib = c_library_in(&cache, "rs_header_key", &c, &["scale(x: f32[N]) -> (y: f32[N])"]);
        let reg = Registry::new();
        let k = lib.register(&reg).unwrap().remove(0);
        let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let mut y = Array::zeros(DType::F32, &[2]).unwrap();
        k.call(&mut [Arg::Tensor(x.view())], &mut [y.view_mut().unwrap()]).unwrap();
        y.to_vec::<f32>().unwrap()
    };
    let (_d, cache) = private_cache();
    std::fs::write(&header, "#define FACTOR 2\n").unwrap();
    assert_eq!(run(cache.clone()), vec![2.0, 4.0]);
    // Another process (a new library over the same cache) after the header changed.
    std::fs::write(&header, "#define FACTOR 3\n").unwrap();
    assert_eq!(run(Arc::new(LibraryCache::new(cache.dir().to_path_buf()))), vec![3.0, 6.0], "the changed header is compiled");
}

#[test]
fn a_functions_digest_covers_what_the_files_its_c_source_includes_say() {
    let dir = tempfile::tempdir().unwrap();
    let (header, c) = scale_by_header(dir.path());
    let digest = |factor: &str| {
        std::fs::write(&header, format!("#define FACTOR {factor}\n")).unwrap();
        let lib = InlineLibrary::new("rs_header_digest", Some(&c), &["scale(x: f32[N]) -> (y: f32[N])"], None, Default::default()).unwrap();
        lib.register(&Registry::new()).unwrap().remove(0).digest()
    };
    let two = digest("2");
    assert_eq!(digest("2"), two, "the same text and header: the same function");
    assert_ne!(digest("3"), two, "the header says another factor: another function");
    // A header that calls itself a system header is still the source's.
    let hidden = |factor: &str| {
        std::fs::write(&header, format!("#pragma GCC system_header\n#define FACTOR {factor}\n")).unwrap();
        let lib = InlineLibrary::new("rs_header_digest", Some(&c), &["scale(x: f32[N]) -> (y: f32[N])"], None, Default::default()).unwrap();
        lib.register(&Registry::new()).unwrap().remove(0).digest()
    };
    assert_ne!(hidden("2"), hidden("3"));
}

#[test]
fn concurrent_first_calls_with_new_dtypes_build_once() {
    let (_dir, cache) = private_cache();
    let reg = Registry::new();
    let src = "void square(const T* x, T* y, long long n) { for (long long i = 0; i < n; ++i) y[i] = x[i] * x[i]; }\n";
    let lib = c_library_in(&cache, "rs_threads", src, &["square<T: f32|i32>(x: T[N]) -> (y: T[N])"]);
    let k = lib.register(&reg).unwrap().remove(0);
    assert_eq!(lib.cpu_specialisations(), 1, "register builds the first dtypes (f32)");
    for y in common::call_from_threads(&k, 100, 6) {
        assert!(y.iter().enumerate().all(|(i, &v)| v == (i * i) as i32));
    }
    assert_eq!(lib.cpu_specialisations(), 2);
    assert_eq!(cache.stats.compiled.load(std::sync::atomic::Ordering::Relaxed), 2, "f32 at register, i32 once for six threads");
}

const CUDA_AXPY: &str = r#"
extern "C" __global__ void axpy(const float* x, float* y, double a, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] += (float)a * x[i];
}
"#;

const CUDA_SCALE: &str = r#"
extern "C" __global__ void scale(const T* x, double s, T* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = (T)(s * x[i]);
}
"#;

use dlbridge_cuda::nvrtc::available_or_skip as nvrtc_or_skip;

#[test]
fn cuda_source_compiles_to_ptx_and_a_broken_one_fails_at_load_with_nvrtcs_line() {
    if !nvrtc_or_skip() {
        return;
    }
    let lib = InlineLibrary::new(
        "rs_cuda",
        Some(AXPY),
        &["axpy(x: f32[N], y: mut f32[N], a: f64)", "scale<T: f32|f64>(x: T[N], s: f64) -> (y: T[N])"],
        Some(&format!("{CUDA_AXPY}{CUDA_SCALE}")),
        Default::default(),
    )
    .unwrap();
    for lib_dtypes in [vec![DType::F32], vec![DType::F64]] {
        let ptx = lib.cuda_ptx(&lib_dtypes, "--gpu-architecture=compute_75").unwrap();
        assert!(ptx.contains(".entry axpy(") && ptx.contains(".entry scale("), "{ptx}");
    }
    let reg = Registry::new();
    lib.register(&reg).unwrap();
    let axpy = reg.get("axpy").unwrap();
    let mut devices: Vec<DeviceType> = axpy.origins().map(|(d, _)| d).collect();
    devices.sort_by_key(|d| d.to_string());
    assert_eq!(devices, vec![DeviceType::CPU, DeviceType::CUDA], "in both sources: both devices");
    assert!(reg.get("scale").unwrap().origins().all(|(d, _)| d == DeviceType::CUDA), "only in cuda_source: CUDA only");

    let broken = "extern \"C\" __global__ void axpy(const float* x, float* y, double a, long long n) {\n  y[0] = q;\n}\n";
    let lib =
        InlineLibrary::new("rs_cuda_bad", None, &["axpy(x: f32[N], y: mut f32[N], a: f64)"], Some(broken), Default::default()).unwrap();
    let m = lib.register(&Registry::new()).unwrap_err().to_string();
    assert!(m.contains("cuda_source line 2: error"), "{m}");
    let mismatch = "extern \"C\" __global__ void axpy(const float* x, float* y, float a, long long n) {}\n";
    let lib =
        InlineLibrary::new("rs_cuda_proto", None, &["axpy(x: f32[N], y: mut f32[N], a: f64)"], Some(mismatch), Default::default()).unwrap();
    let m = lib.register(&Registry::new()).unwrap_err().to_string();
    assert!(m.contains("cuda_source line 1"), "{m}");
    assert!(m.contains("extern \"C\" __global__ void axpy(const float* x, float* y, double a, long long N);"), "{m}");
}

#[test]
fn a_cuda_function_runs_on_the_gpu_and_matches_the_cpu() {
    if let Some(reason) = dlbridge_cuda::skip_reason() {
        eprintln!("skipped: {reason}");
        return;
    }
    use dlbridge_cuda::{CudaArray, CudaDevice};
    let dev = CudaDevice::get(0).expect("a device the driver reports");
    let reg = Registry::new();
    let cpu_scale = "void scale(const T* x, double s, T* y, long long n) { for (long long i = 0; i < n; ++i) y[i] = (T)(s * x[i]); }\n";
    InlineLibrary::new(
        "rs_gpu",
        Some(cpu_scale),
        &["scale<T: f32|f64>(x: T[N], s: f64) -> (y: T[N])"],
        Some(CUDA_SCALE),
        Default::default(),
    )
    .unwrap()
    .register(&reg)
    .unwrap();
    let k = reg.get("scale").unwrap();
    for n in [0usize, 1, 1000, 70_000] {
        let x = Array::from_slice(&(0..n).map(|i| i as f64 * 0.5).collect::<Vec<_>>(), &[n as i64]).unwrap();
        let mut cpu = Array::zeros(DType::F64, &[n as i64]).unwrap();
        k.call(&mut [Arg::Tensor(x.view()), Arg::f64(3.0)], &mut [cpu.view_mut().unwrap()]).unwrap();
        let dx = CudaArray::from_host(&dev, &x).unwrap();
        let mut dy = CudaArray::empty(&dev, DType::F64, &[n as i64]).unwrap();
        k.call(&mut [Arg::Tensor(dx.view().unwrap()), Arg::f64(3.0)], &mut [dy.view_mut().unwrap()]).unwrap();
        assert_eq!(dy.to_host().unwrap().to_vec::<f64>().unwrap(), cpu.to_vec::<f64>().unwrap(), "n = {n}");
    }
}

//! Generated C++ compiled with the system compiler, loaded as a plugin and
//! called through the registry: CuPy's documented examples (the squared
//! difference, `add_reverse`, the L2 norm) and the cases around them
//! (strides, broadcasting, threads, raw and `mut` arguments, compile errors,
//! exceptions), checked element for element against Rust.
//!
//! Every test needs a C++ compiler (`$CXX`, else `c++`); without one each
//! test prints that it is skipped and why.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use dlbridge_array::Array;
use dlbridge_compile::internals::{elementwise_cpp, reduction_cpp};
use dlbridge_compile::{ElementwiseSpec, Reduction, ReductionSpec};
use dlbridge_core::{DType, Element, ErrorKind};
use dlbridge_registry::{Arg, Kernel, Plugin, Registry};
use tempfile::TempDir;

/// A compiled, loaded, registered kernel (the directory holds the library).
struct Built {
    kernel: Arc<Kernel>,
    _registry: Registry,
    _dir: TempDir,
}

fn compiler() -> String {
    std::env::var("CXX").ok().filter(|c| !c.trim().is_empty()).unwrap_or_else(|| "c++".to_owned())
}

/// Whether a C++ compiler runs; prints why the calling test is skipped if not.
fn have_compiler(test: &str) -> bool {
    let ok = Command::new(compiler()).arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        println!("skipped {test}: no C++ compiler (`{}` does not run); install g++ or clang++, or set CXX", compiler());
    }
    ok
}

/// Compiles `src` into a plugin; `Err` holds the compiler's stderr.
fn compile(src: &str, dir: &Path) -> Result<std::path::PathBuf, String> {
    let cpp = dir.join("kernel.cpp");
    let lib = dir.join("libkernel.so");
    std::fs::write(&cpp, src).map_err(|e| e.to_string())?;
    let out = Command::new(compiler())
        .args(["-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", "-o"])
        .arg(&lib)
        .arg(&cpp)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() { Ok(lib) } else { Err(String::from_utf8_lossy(&out.stderr).into_owned()) }
}

/// Compiles, loads and registers `src`, which must compile.
fn build(src: &str) -> Built {
    let dir = tempfile::tempdir().unwrap();
    let lib = compile(src, dir.path()).unwrap_or_else(|stderr| panic!("the generated source does not compile:\n{stderr}"));
    let plugin = Plugin::open(&lib).unwrap();
    let (info, defs) = plugin.into_defs();
    assert!(info.name.starts_with("dlbridge-compile:"), "{}", info.name);
    assert_eq!(defs.len(), 1);
    let registry = Registry::new();
    let kernel = registry.register(defs.into_iter().next().unwrap()).unwrap();
    Built { kernel, _registry: registry, _dir: dir }
}

fn elementwise(i: &str, o: &str, op: &str, name: &str, bind: &[(char, DType)]) -> Built {
    let spec = ElementwiseSpec::new(i, o, op, name, "", "", "").unwrap();
    build(&elementwise_cpp(&spec, bind).unwrap())
}

/// Deterministic test values in [-4, 4) with a fractional part.
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % 64) as f64 / 8.0 - 4.0
        })
        .collect()
}

fn array<T: Element>(v: &[T], shape: &[i64]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

/// `z = f(x, y)` through a two-input, one-output kernel.
fn call2(k: &Kernel, x: &Array, y: &Array, z: &mut Array) -> dlbridge_core::Result<()> {
    k.call(&mut [Arg::Tensor(x.view()), Arg::Tensor(y.view())], &mut [z.view_mut().unwrap()])
}

#[test]
fn cupy_squared_difference_with_concrete_float32() {
    if !have_compiler("cupy_squared_difference_with_concrete_float32") {
        return;
    }
    let b = elementwise("float32 x, float32 y", "float32 z", "z = (x - y) * (x - y)", "squared_diff", &[]);
    assert_eq!(b.kernel.signature_text(), "squared_diff(x: f32[*S], y: f32[*S]) -> (z: f32[*S])");
    let (xs, ys): (Vec<f32>, Vec<f32>) =
        (values(30, 1).iter().map(|&v| v as f32).collect(), values(30, 2).iter().map(|&v| v as f32).collect());
    let (x, y) = (array(&xs, &[5, 6]), array(&ys, &[5, 6]));
    let mut z = Array::zeros(DType::F32, &[5, 6]).unwrap();
    call2(&b.kernel, &x, &y, &mut z).unwrap();
    let want: Vec<f32> = xs.iter().zip(&ys).map(|(a, b)| (a - b) * (a - b)).collect();
    assert_eq!(z.to_vec::<f32>().unwrap(), want);
}

macro_rules! generic_squared_diff {
    ($test:ident, $t:ty, $d:expr) => {
        #[test]
        fn $test() {
            if !have_compiler(stringify!($test)) {
                return;
            }
            let b = elementwise("T x, T y", "T z", "z = (x - y) * (x - y)", "squared_diff", &[('T', $d)]);
            let xs: Vec<$t> = values(257, 3).iter().map(|&v| v as $t).collect();
            let ys: Vec<$t> = values(257, 4).iter().map(|&v| v as $t).collect();
            let (x, y) = (array(&xs, &[257]), array(&ys, &[257]));
            let mut z = Array::zeros($d, &[257]).unwrap();
            call2(&b.kernel, &x, &y, &mut z).unwrap();
            let want: Vec<$t> = xs.iter().zip(&ys).map(|(&a, &b)| (a - b) * (a - b)).collect();
            assert_eq!(z.to_vec::<$t>().unwrap(), want);
            // The specialisation is exactly one dtype: another is refused by the registry.
            let other = Array::zeros(if $d == DType::F64 { DType::F32 } else { DType::F64 }, &[257]).unwrap();
            let e = call2(&b.kernel, &other, &y, &mut z).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Type, "{e}");
        }
    };
}

generic_squared_diff!(generic_squared_difference_for_f32, f32, DType::F32);
generic_squared_diff!(generic_squared_difference_for_f64, f64, DType::F64);
generic_squared_diff!(generic_squared_difference_for_i32, i32, DType::I32);

#[test]
fn squared_difference_broadcasts_like_numpy() {
    if !have_compiler("squared_difference_broadcasts_like_numpy") {
        return;
    }
    let b = elementwise("T x, T y", "T z", "z = (x - y) * (x - y)", "squared_diff", &[('T', DType::F32)]);
    // CuPy's documented example: x = arange(10).reshape(2, 5), y = arange(5).
    let xs: Vec<f32> = (0..10).map(|v| v as f32).collect();
    let ys: Vec<f32> = (0..5).map(|v| v as f32).collect();
    let (x, y) = (array(&xs, &[2, 5]), array(&ys, &[5]));
    let specs = b.kernel.prepare_outputs(&[Arg::Tensor(x.view()), Arg::Tensor(y.view())]).unwrap();
    assert_eq!(&specs[0].shape[..], &[2, 5]);
    let mut z = Array::zeros(DType::F32, &[2, 5]).unwrap();
    call2(&b.kernel, &x, &y, &mut z).unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 0.0, 0.0, 0.0, 25.0, 25.0, 25.0, 25.0, 25.0]);
    // squared_diff(x, 5): the scalar comes as a 0-d array.
    let five = array(&[5.0f32], &[]);
    let mut z = Array::zeros(DType::F32, &[2, 5]).unwrap();
    call2(&b.kernel, &x, &five, &mut z).unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![25.0, 16.0, 9.0, 4.0, 1.0, 0.0, 1.0, 4.0, 9.0, 16.0]);
    let b = elementwise("T x, T y", "T z", "z = (x - y) * (x - y)", "squared_diff", &[('T', DType::F64)]);
    // (3, 1) against (4,): both sides repeat.
    let (xs, ys) = (values(3, 5), values(4, 6));
    let (x, y) = (array(&xs, &[3, 1]), array(&ys, &[4]));
    let mut z = Array::zeros(DType::F64, &[3, 4]).unwrap();
    call2(&b.kernel, &x, &y, &mut z).unwrap();
    let want: Vec<f64> = (0..12).map(|k| (xs[k / 4] - ys[k % 4]).powi(2)).collect();
    assert_eq!(z.to_vec::<f64>().unwrap(), want);
    // A 0-d operand (how a scalar comes in) against a 3-d one.
    let (xs, s) = (values(24, 7), 1.5f64);
    let (x, y) = (array(&xs, &[2, 3, 4]), array(&[s], &[]));
    let mut z = Array::zeros(DType::F64, &[2, 3, 4]).unwrap();
    call2(&b.kernel, &x, &y, &mut z).unwrap();
    assert_eq!(z.to_vec::<f64>().unwrap(), xs.iter().map(|a| (a - s).powi(2)).collect::<Vec<_>>());
    // A middle dim of size 1 against a full shape.
    let (xs, ys) = (values(2 * 4, 8), values(2 * 3 * 4, 9));
    let (x, y) = (array(&xs, &[2, 1, 4]), array(&ys, &[2, 3, 4]));
    let mut z = Array::zeros(DType::F64, &[2, 3, 4]).unwrap();
    call2(&b.kernel, &x, &y, &mut z).unwrap();
    let want: Vec<f64> = (0..24).map(|k| (xs[(k / 12) * 4 + k % 4] - ys[k]).powi(2)).collect();
    assert_eq!(z.to_vec::<f64>().unwrap(), want);
}

#[test]
fn strided_inputs_and_outputs_any_layout() {
    if !have_compiler("strided_inputs_and_outputs_any_layout") {
        return;
    }
    let b = elementwise("T x, T y", "T z", "z = x * 10 + y", "fma10", &[('T', DType::F32)]);
    let xs: Vec<f32> = (0..12).map(|v| v as f32).collect();
    // A transposed input: x.t() is [4, 3] with strides [1, 4].
    let xt = array(&xs, &[3, 4]).t().unwrap();
    assert!(!xt.is_contiguous());
    let ys: Vec<f32> = (0..12).map(|v| v as f32 * 0.5).collect();
    let y = array(&ys, &[4, 3]);
    let mut z = Array::zeros(DType::F32, &[4, 3]).unwrap();
    call2(&b.kernel, &xt, &y, &mut z).unwrap();
    let want: Vec<f32> = (0..12).map(|k| xs[(k % 3) * 4 + k / 3] * 10.0 + ys[k]).collect();
    assert_eq!(z.to_vec::<f32>().unwrap(), want);
    // Negative strides (reversed rows, every other column) into a transposed output.
    let big: Vec<f32> = (0..40).map(|v| v as f32).collect();
    let x = array(&big, &[5, 8]).slice(0, -1, -6, -1).unwrap().slice(1, 0, 8, 2).unwrap(); // [5, 4]
    let y = Array::zeros(DType::F32, &[5, 4]).unwrap();
    // The output transposed too: [5, 4] with strides [1, 5] (its own memory).
    let mut z = Array::zeros(DType::F32, &[4, 5]).unwrap().t().unwrap();
    call2(&b.kernel, &x, &y, &mut z).unwrap();
    let want: Vec<f32> = (0..20).map(|k| big[(4 - k / 4) * 8 + (k % 4) * 2] * 10.0).collect();
    assert_eq!(z.to_vec::<f32>().unwrap(), want);
    // Zero-size: nothing to do, no error.
    let (x, y) = (Array::zeros(DType::F32, &[0, 3]).unwrap(), Array::zeros(DType::F32, &[0, 3]).unwrap());
    let mut z = Array::zeros(DType::F32, &[0, 3]).unwrap();
    call2(&b.kernel, &x, &y, &mut z).unwrap();
}

/// A kernel over 2^20 elements (above the threshold), compiled and called
/// as `ElementwiseKernel` is (through the registry, which gives the generated
/// entry point the call's thread budget), recording which thread computed
/// each element; returns the distinct threads and whether the calling thread
/// was one of them.
fn threads_used(budget: Option<usize>) -> (usize, bool) {
    let k = dlbridge_compile::ElementwiseKernel::new(
        "float32 x",
        "float32 z, int64 tag",
        "z = x * 2; tag = thread_tag()",
        "tagged",
        dlbridge_compile::ElementwiseOptions {
            preamble: "#include <unistd.h>\nstatic int64_t thread_tag() { return (int64_t)gettid(); }".into(),
            ..Default::default()
        },
    )
    .unwrap();
    let reg = Registry::new();
    let kernel = k.register(&reg).unwrap();
    let n = 1usize << 20;
    let xs: Vec<f32> = (0..n).map(|k| (k % 1000) as f32).collect();
    let x = array(&xs, &[1024, 1024]);
    let mut z = Array::zeros(DType::F32, &[1024, 1024]).unwrap();
    let mut tag = Array::zeros(DType::I64, &[1024, 1024]).unwrap();
    let mut run = || kernel.call(&mut [Arg::Tensor(x.view())], &mut [z.view_mut().unwrap(), tag.view_mut().unwrap()]).unwrap();
    match budget {
        Some(b) => dlbridge_registry::threads::with_num_threads(b, run),
        None => run(),
    }
    assert_eq!(z.to_vec::<f32>().unwrap(), xs.iter().map(|v| v * 2.0).collect::<Vec<_>>());
    let tags = tag.to_vec::<i64>().unwrap();
    // Chunks are contiguous: the tag changes only at chunk boundaries.
    let changes = tags.windows(2).filter(|w| w[0] != w[1]).count();
    let distinct: std::collections::BTreeSet<i64> = tags.into_iter().collect();
    assert_eq!(changes + 1, distinct.len(), "each thread runs one contiguous chunk");
    // This thread's id, as the kernel's gettid gives it.
    let me = std::fs::read_link("/proc/thread-self").ok().and_then(|p| p.file_name()?.to_str()?.parse::<i64>().ok());
    (distinct.len(), me.is_some_and(|t| distinct.contains(&t)))
}

#[test]
fn large_inputs_run_on_the_budgets_threads() {
    if !have_compiler("large_inputs_run_on_the_budgets_threads") {
        return;
    }
    let budget = dlbridge_registry::threads::global_num_threads();
    let (used, caller) = threads_used(None);
    println!("{used} threads for a budget of {budget}");
    // One chunk per thread of the budget, at most 32 (2^20 elements allow 32
    // chunks of 2^15), the calling thread running the first.
    assert_eq!(used, budget.min(32), "{used} thread(s) for a budget of {budget}");
    assert!(caller, "the calling thread runs a chunk");
    if budget > 1 {
        let (two, _) = threads_used(Some(2));
        assert_eq!(two, 2, "a budget of 2 uses 2 threads");
    }
}

#[test]
fn under_a_budget_of_one_a_generated_kernel_starts_no_thread() {
    if !have_compiler("under_a_budget_of_one_a_generated_kernel_starts_no_thread") {
        return;
    }
    assert_eq!(threads_used(Some(1)), (1, true), "every element on the calling thread");
}

#[test]
fn large_strided_and_broadcast_inputs_split_over_threads_correctly() {
    if !have_compiler("large_strided_and_broadcast_inputs_split_over_threads_correctly") {
        return;
    }
    let b = elementwise("T x, T y", "T z", "z = x - y", "sub", &[('T', DType::F64)]);
    let (r, c) = (700usize, 300usize); // 210000 elements: several chunks, rows cut mid-way
    let xs: Vec<f64> = (0..r * c).map(|k| k as f64).collect();
    let x = array(&xs, &[c as i64, r as i64]).t().unwrap(); // [r, c] transposed
    let ys: Vec<f64> = (0..c).map(|k| k as f64 * 0.25).collect();
    let y = array(&ys, &[c as i64]);
    let mut z = Array::zeros(DType::F64, &[r as i64, c as i64]).unwrap();
    call2(&b.kernel, &x, &y, &mut z).unwrap();
    let z = z.to_vec::<f64>().unwrap();
    for (k, &v) in z.iter().enumerate() {
        let (i, j) = (k / c, k % c);
        assert_eq!(v, xs[j * r + i] - ys[j], "element {k}");
    }
}

#[test]
fn cupy_add_reverse_with_a_raw_argument() {
    if !have_compiler("cupy_add_reverse_with_a_raw_argument") {
        return;
    }
    let b = elementwise("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse", &[('T', DType::F32)]);
    assert!(!b.kernel.opts().alias_outputs, "raw inputs: an output must not alias an input");
    let xs: Vec<f32> = (0..10).map(|v| v as f32).collect();
    let ys: Vec<f32> = (0..10).map(|v| v as f32 * 100.0).collect();
    let (x, y) = (array(&xs, &[10]), array(&ys, &[10]));
    let mut z = Array::zeros(DType::F32, &[10]).unwrap();
    call2(&b.kernel, &x, &y, &mut z).unwrap();
    let want: Vec<f32> = (0..10).map(|i| xs[i] + ys[9 - i]).collect();
    assert_eq!(z.to_vec::<f32>().unwrap(), want);
    // The raw argument keeps its own (here strided, 2-d) shape: flat C-order index.
    let y2 = array(&(0..20).map(|v| v as f32).collect::<Vec<_>>(), &[2, 10]).t().unwrap(); // [10, 2], strides [1, 10]
    let b2 =
        elementwise("T x, raw T y", "T z", "z = x + y[2 * i + 1] + y.ndim() * 1000 + y.shape()[1] * 100", "pick", &[('T', DType::F32)]);
    let mut z = Array::zeros(DType::F32, &[10]).unwrap();
    call2(&b2.kernel, &x, &y2, &mut z).unwrap();
    let want: Vec<f32> = (0..10).map(|i| xs[i] + (10 + i) as f32 + 2200.0).collect();
    assert_eq!(z.to_vec::<f32>().unwrap(), want);
    // An index outside the raw argument is an error, not a wild read.
    let b3 = elementwise("T x, raw T y", "T z", "z = y[i + 1]", "off_by_one", &[('T', DType::F32)]);
    let mut z = Array::zeros(DType::F32, &[10]).unwrap();
    let e = call2(&b3.kernel, &x, &y, &mut z).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Runtime);
    assert!(e.to_string().contains("off_by_one: raw argument `y`: index 10 is out of range for its 10 elements"), "{e}");
}

#[test]
fn a_mut_input_is_written_by_the_body() {
    if !have_compiler("a_mut_input_is_written_by_the_body") {
        return;
    }
    let b = elementwise("T x, mut T acc", "T z", "acc += x; z = acc * 2", "accumulate", &[('T', DType::I64)]);
    assert!(b.kernel.signature_text().contains("acc: mut i64[*S]"), "{}", b.kernel.signature_text());
    let x = array(&[1i64, 2, 3, 4], &[4]);
    let mut acc = array(&[10i64, 20, 30, 40], &[4]);
    let mut z = Array::zeros(DType::I64, &[4]).unwrap();
    b.kernel.call(&mut [Arg::Tensor(x.view()), Arg::TensorMut(acc.view_mut().unwrap())], &mut [z.view_mut().unwrap()]).unwrap();
    assert_eq!(acc.to_vec::<i64>().unwrap(), vec![11, 22, 33, 44]);
    assert_eq!(z.to_vec::<i64>().unwrap(), vec![22, 44, 66, 88]);
    // No outputs at all: an in-place kernel.
    let b = elementwise("mut T x, T y", "", "x = x * y", "imul", &[('T', DType::F32)]);
    let mut x = array(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let y = array(&[2.0f32, 3.0, 4.0], &[3]);
    b.kernel.call(&mut [Arg::TensorMut(x.view_mut().unwrap()), Arg::Tensor(y.view())], &mut []).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![2.0, 6.0, 12.0, 8.0, 15.0, 24.0]);
    // A mut raw argument: a scatter the body does itself.
    let b = elementwise("int64 idx, raw mut float32 hist", "", "hist[idx] += 1", "scatter", &[]);
    let idx = array(&[0i64, 2, 2, 1, 2], &[5]);
    let mut hist = Array::zeros(DType::F32, &[3]).unwrap();
    b.kernel.call(&mut [Arg::Tensor(idx.view()), Arg::TensorMut(hist.view_mut().unwrap())], &mut []).unwrap();
    assert_eq!(hist.to_vec::<f32>().unwrap(), vec![1.0, 1.0, 3.0]);
}

#[test]
fn loop_prep_and_after_loop_run_around_each_threads_loop() {
    if !have_compiler("loop_prep_and_after_loop_run_around_each_threads_loop") {
        return;
    }
    // loop_prep declares what the operation uses; after_loop publishes each
    // thread's count through a `mut` raw argument.
    let spec = ElementwiseSpec::new(
        "T x, raw mut int64 stats",
        "T z",
        "z = x * scale; ++count",
        "scaled",
        "",
        "const T scale = static_cast<T>(3); long long count = 0;",
        "__atomic_fetch_add(&stats[0], count, __ATOMIC_RELAXED);\n__atomic_fetch_add(&stats[1], 1, __ATOMIC_RELAXED);",
    )
    .unwrap();
    let b = build(&elementwise_cpp(&spec, &[('T', DType::F64)]).unwrap());
    for n in [2usize, 1 << 17] {
        let xs: Vec<f64> = (0..n).map(|k| k as f64).collect();
        let x = array(&xs, &[n as i64]);
        let mut stats = Array::zeros(DType::I64, &[2]).unwrap();
        let mut z = Array::zeros(DType::F64, &[n as i64]).unwrap();
        b.kernel.call(&mut [Arg::Tensor(x.view()), Arg::TensorMut(stats.view_mut().unwrap())], &mut [z.view_mut().unwrap()]).unwrap();
        assert_eq!(z.to_vec::<f64>().unwrap(), xs.iter().map(|v| v * 3.0).collect::<Vec<_>>());
        let stats = stats.to_vec::<i64>().unwrap();
        assert_eq!(stats[0], n as i64, "every element counted once");
        let chunks = if n < 1 << 16 { 1 } else { 4 }; // at most 4 chunks of 2^15 elements
        assert!((1..=chunks).contains(&stats[1]), "{} loops for {n} elements", stats[1]);
    }
}

#[test]
fn a_compile_error_points_at_the_users_operation() {
    if !have_compiler("a_compile_error_points_at_the_users_operation") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = ElementwiseSpec::new("T x", "T z", "z = x + not_declared", "broken", "", "", "").unwrap();
    let stderr = compile(&elementwise_cpp(&spec, &[('T', DType::F32)]).unwrap(), dir.path()).unwrap_err();
    assert!(stderr.contains("operation:1:"), "{stderr}");
    assert!(stderr.contains("not_declared"), "{stderr}");
    // Line 2 of a multi-line operation is line 2.
    let spec = ElementwiseSpec::new("T x", "T z", "T t = x;\nz = t +* 2;", "broken2", "", "", "").unwrap();
    let stderr = compile(&elementwise_cpp(&spec, &[('T', DType::F32)]).unwrap(), dir.path()).unwrap_err();
    assert!(stderr.contains("operation:2:"), "{stderr}");
    // A mistake in the preamble is reported in the preamble.
    let spec = ElementwiseSpec::new("T x", "T z", "z = x", "broken3", "int f() { return }", "", "").unwrap();
    let stderr = compile(&elementwise_cpp(&spec, &[('T', DType::F32)]).unwrap(), dir.path()).unwrap_err();
    assert!(stderr.contains("preamble:1:"), "{stderr}");
    // Writing an input that is not `mut` does not compile.
    let spec = ElementwiseSpec::new("T x", "T z", "x = 1; z = x", "writes_input", "", "", "").unwrap();
    let stderr = compile(&elementwise_cpp(&spec, &[('T', DType::F32)]).unwrap(), dir.path()).unwrap_err();
    assert!(stderr.contains("operation:1:") && stderr.contains("read-only"), "{stderr}");
    let spec = ElementwiseSpec::new("T x, raw T r", "T z", "r[i] = x; z = x", "writes_raw", "", "", "").unwrap();
    let stderr = compile(&elementwise_cpp(&spec, &[('T', DType::F32)]).unwrap(), dir.path()).unwrap_err();
    assert!(stderr.contains("operation:1:") && stderr.contains("read-only"), "{stderr}");
    // Reductions map their texts too.
    let spec = ReductionSpec::new(&Reduction::new("T x", "T y", "x * x", "a + b +", "y = a", Some("0"), "rbroken")).unwrap();
    let stderr = compile(&reduction_cpp(&spec, &[('T', DType::F32)]).unwrap(), dir.path()).unwrap_err();
    assert!(stderr.contains("reduce_expr:"), "{stderr}");
    assert!(!stderr.contains("dlbridge_generated.cpp"), "only the user's text is at fault:\n{stderr}");
}

#[test]
fn a_body_that_throws_is_an_error_not_an_abort() {
    if !have_compiler("a_body_that_throws_is_an_error_not_an_abort") {
        return;
    }
    let spec = ElementwiseSpec::new(
        "T x",
        "T z",
        "z = check(x)",
        "thrower",
        "static float check(float v) {\n  if (v > 5) throw 1;\n  if (v < -5) throw std::domain_error(\"negative input\");\n  return v;\n}",
        "",
        "",
    )
    .unwrap();
    let b = build(&elementwise_cpp(&spec, &[('T', DType::F32)]).unwrap());
    let mut z = Array::zeros(DType::F32, &[3]).unwrap();
    let e = b.kernel.call(&mut [Arg::Tensor(array(&[1.0f32, 9.0, 2.0], &[3]).view())], &mut [z.view_mut().unwrap()]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Runtime);
    assert!(e.to_string().contains("thrower: the kernel threw an exception that is not a std::exception"), "{e}");
    let mut z = Array::zeros(DType::F32, &[2]).unwrap();
    let e = b.kernel.call(&mut [Arg::Tensor(array(&[1.0f32, -9.0], &[2]).view())], &mut [z.view_mut().unwrap()]).unwrap_err();
    assert!(e.to_string().contains("thrower: negative input"), "{e}");
    // Thrown on a worker thread: still an error (2^17 elements, one bad one at the end).
    let mut xs = vec![1.0f32; 1 << 17];
    xs[(1 << 17) - 1] = 10.0;
    let mut z = Array::zeros(DType::F32, &[1 << 17]).unwrap();
    let e = b.kernel.call(&mut [Arg::Tensor(array(&xs, &[1 << 17]).view())], &mut [z.view_mut().unwrap()]).unwrap_err();
    assert!(e.to_string().contains("not a std::exception"), "{e}");
    // The kernel still works afterwards.
    let mut z = Array::zeros(DType::F32, &[2]).unwrap();
    b.kernel.call(&mut [Arg::Tensor(array(&[1.0f32, 2.0], &[2]).view())], &mut [z.view_mut().unwrap()]).unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
}

fn l2norm() -> ReductionSpec {
    ReductionSpec::new(&Reduction::new("T x", "T y", "x * x", "a + b", "y = sqrt(a)", Some("0"), "l2norm")).unwrap()
}

#[test]
fn cupy_l2_norm_along_the_last_axis() {
    if !have_compiler("cupy_l2_norm_along_the_last_axis") {
        return;
    }
    let b = build(&reduction_cpp(&l2norm(), &[('T', DType::F32)]).unwrap());
    assert_eq!(b.kernel.signature_text(), "l2norm(x: f32[...S], y: mut f32[...O])");
    let xs: Vec<f32> = values(7 * 1000, 11).iter().map(|&v| v as f32).collect();
    let x = array(&xs, &[7, 1000]);
    let mut y = Array::zeros(DType::F32, &[7]).unwrap();
    b.kernel.call(&mut [Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap();
    let got = y.to_vec::<f32>().unwrap();
    for (r, &g) in got.iter().enumerate() {
        let want = xs[r * 1000..(r + 1) * 1000].iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
        assert!((f64::from(g) - want).abs() <= 1e-5 * want, "row {r}: {g} vs {want}");
    }
    // Along the first axis: the caller permutes the reduced axis last (a strided view).
    let x2 = array(&xs, &[1000, 7]).t().unwrap(); // [7, 1000], strides [1, 7]: reduce the original axis 0
    let mut y = Array::zeros(DType::F32, &[7]).unwrap();
    b.kernel.call(&mut [Arg::Tensor(x2.view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap();
    for (c, &g) in y.to_vec::<f32>().unwrap().iter().enumerate() {
        let want = (0..1000).map(|r| f64::from(xs[r * 7 + c]).powi(2)).sum::<f64>().sqrt();
        assert!((f64::from(g) - want).abs() <= 1e-5 * want, "column {c}: {g} vs {want}");
    }
    // A shape mismatch between the input's kept dims and the output is refused.
    let mut y = Array::zeros(DType::F32, &[6]).unwrap();
    let e = b.kernel.call(&mut [Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap_err();
    assert!(e.to_string().contains("output `y` has shape [6]; it must be the kept (leading) dims of the input shape [7, 1000]"), "{e}");
}

#[test]
fn cupy_l2_norm_over_all_elements_in_parallel_partials() {
    if !have_compiler("cupy_l2_norm_over_all_elements_in_parallel_partials") {
        return;
    }
    for d in [DType::F32, DType::F64] {
        let b = build(&reduction_cpp(&l2norm(), &[('T', d)]).unwrap());
        let n = 1usize << 20;
        let vs = values(n, 12);
        let x =
            if d == DType::F32 { array(&vs.iter().map(|&v| v as f32).collect::<Vec<_>>(), &[n as i64]) } else { array(&vs, &[n as i64]) };
        let mut y = Array::zeros(d, &[]).unwrap();
        b.kernel.call(&mut [Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap();
        let got = if d == DType::F32 { f64::from(y.to_vec::<f32>().unwrap()[0]) } else { y.to_vec::<f64>().unwrap()[0] };
        let want = vs.iter().map(|v| v * v).sum::<f64>().sqrt();
        let tol = if d == DType::F32 { 1e-4 } else { 1e-12 };
        assert!((got - want).abs() <= tol * want, "{d}: {got} vs {want}");
        // As a 2-d input reduced over both dims (a [1024, 1024] block).
        let x2 = if d == DType::F32 {
            array(&vs.iter().map(|&v| v as f32).collect::<Vec<_>>(), &[1024, 1024])
        } else {
            array(&vs, &[1024, 1024])
        };
        let mut y = Array::zeros(d, &[]).unwrap();
        b.kernel.call(&mut [Arg::Tensor(x2.t().unwrap().view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap();
        let got = if d == DType::F32 { f64::from(y.to_vec::<f32>().unwrap()[0]) } else { y.to_vec::<f64>().unwrap()[0] };
        assert!((got - want).abs() <= tol * want, "{d}, transposed: {got} vs {want}");
    }
}

#[test]
fn reductions_without_identity_and_with_a_reduce_type() {
    if !have_compiler("reductions_without_identity_and_with_a_reduce_type") {
        return;
    }
    // max without an identity: starts from the first element.
    let spec = ReductionSpec::new(&Reduction::new("T x", "T y", "x", "max(a, b)", "y = a", None, "amax")).unwrap();
    let b = build(&reduction_cpp(&spec, &[('T', DType::I32)]).unwrap());
    let xs: Vec<i32> = values(4 * 50, 13).iter().map(|&v| (v * 8.0) as i32 - 100).collect();
    let x = array(&xs, &[4, 50]);
    let mut y = Array::zeros(DType::I32, &[4]).unwrap();
    b.kernel.call(&mut [Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap();
    let want: Vec<i32> = (0..4).map(|r| *xs[r * 50..(r + 1) * 50].iter().max().unwrap()).collect();
    assert_eq!(y.to_vec::<i32>().unwrap(), want);
    // Zero reduced elements and no identity: an error.
    let x = Array::zeros(DType::I32, &[4, 0]).unwrap();
    let e = b.kernel.call(&mut [Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap_err();
    assert!(e.to_string().contains("amax: the reduction is over zero elements and the kernel has no identity"), "{e}");
    // With an identity, zero elements give post_map(identity).
    let b = build(&reduction_cpp(&l2norm(), &[('T', DType::F32)]).unwrap());
    let x = Array::zeros(DType::F32, &[3, 0]).unwrap();
    let mut y = array(&[5.0f32, 5.0, 5.0], &[3]);
    b.kernel.call(&mut [Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 0.0]);
    // A float32 mean of int8 input reduced in float64, with two inputs and two outputs.
    let spec = ReductionSpec::new(&Reduction {
        reduce_type: Some("float64"),
        ..Reduction::new("int8 x, int8 w", "float32 mean, int64 count", "x * w", "a + b", "mean = a / _J; count = _J", Some("0"), "wmean")
    })
    .unwrap();
    let b = build(&reduction_cpp(&spec, &[]).unwrap());
    let xs: Vec<i8> = (0..60).map(|k| (k % 7) as i8 - 3).collect();
    let ws: Vec<i8> = (0..60).map(|k| (k % 3) as i8).collect();
    let (x, w) = (array(&xs, &[3, 4, 5]), array(&ws, &[3, 4, 5]));
    let (mut mean, mut count) = (Array::zeros(DType::F32, &[3]).unwrap(), Array::zeros(DType::I64, &[3]).unwrap());
    b.kernel
        .call(
            &mut [
                Arg::Tensor(x.view()),
                Arg::Tensor(w.view()),
                Arg::TensorMut(mean.view_mut().unwrap()),
                Arg::TensorMut(count.view_mut().unwrap()),
            ],
            &mut [],
        )
        .unwrap();
    let want: Vec<f32> =
        (0..3).map(|r| ((r * 20..(r + 1) * 20).map(|k| f64::from(xs[k]) * f64::from(ws[k])).sum::<f64>() / 20.0) as f32).collect();
    assert_eq!(mean.to_vec::<f32>().unwrap(), want);
    assert_eq!(count.to_vec::<i64>().unwrap(), vec![20, 20, 20]);
}

#[test]
fn many_outputs_reduce_in_parallel_over_outputs() {
    if !have_compiler("many_outputs_reduce_in_parallel_over_outputs") {
        return;
    }
    let spec = ReductionSpec::new(&Reduction::new("T x", "T y", "x", "a + b", "y = a", Some("0"), "rowsum")).unwrap();
    let b = build(&reduction_cpp(&spec, &[('T', DType::I64)]).unwrap());
    let (r, c) = (3000usize, 100usize);
    let xs: Vec<i64> = (0..(r * c) as i64).collect();
    // Reduce over axis 0 of a [c, r] array: the caller permutes it to [r, c] (strided).
    let x = array(&xs, &[c as i64, r as i64]).t().unwrap();
    let mut y = Array::zeros(DType::I64, &[r as i64]).unwrap();
    b.kernel.call(&mut [Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap();
    let want: Vec<i64> = (0..r).map(|i| (0..c).map(|j| xs[j * r + i]).sum()).collect();
    assert_eq!(y.to_vec::<i64>().unwrap(), want);
}

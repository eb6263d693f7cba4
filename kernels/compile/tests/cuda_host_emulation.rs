//! Generated CUDA reductions run on the CPU: the source `reduction_source`
//! makes is compiled by the host C++ compiler against the CUDA emulation the
//! built-in kernels are tested with (kernels/cuda/cu/host_shim.h: a fiber per
//! CUDA thread, barriers for `__syncthreads` and the warp shuffles), and run
//! in every layout (a warp, a block, or the lanes per output), split into
//! pieces with the finishing pass or not, on row- and column-major inputs,
//! against double-precision references. Needs a C++20 compiler (`c++`);
//! without one it prints `skipped: <reason>`.

use std::path::Path;
use std::process::Command;

mod common;

use dlbridge_compile::internals::reduction_source;
use dlbridge_compile::{Reduction, ReductionSpec};
use dlbridge_core::DType;

/// Runs a reduction `dlbridge_<name>(x) -> y` of one input and one output
/// (element type `t`) through random layouts and launches, against `reference`
/// (a C++ expression over `std::vector<double> v`, the reduced elements in
/// order), within `tol` (relative).
fn harness(name: &str, t: &str, reference: &str, tol: f64) -> String {
    format!(
        r#"
#include <random>
#include <vector>
static std::mt19937_64 rng(7);
static long long rnd(long long lo, long long hi) {{ return std::uniform_int_distribution<long long>(lo, hi)(rng); }}
static DlbIndexer ix1(long long n, long long s) {{
    DlbIndexer ix; memset(&ix, 0x5a, sizeof ix);
    ix.ndim = 1; ix.shape[0] = n; ix.strides[0] = s; return ix;
}}
int main() {{
    int fails = 0, cases = 0, split_cases = 0;
    // Every layout, memory order and split choice four times over (48 cases),
    // with random sizes on both sides of a warp and of a block's reach.
    for (int c = 0; c < 48; ++c) {{
        long long M = std::vector<long long>{{1, 2, 5, 31, 33, 70}}[rnd(0, 5)];
        long long J = std::vector<long long>{{1, 3, 16, 17, 100, 1000, 2500}}[rnd(0, 6)];
        bool m_inner = (c / 3) % 2;  // x stored [J][M] (a column reduction) or [M][J]
        std::vector<{t}> x(M * J);
        std::normal_distribution<double> nd(0, 2);
        for (auto& v : x) v = ({t})nd(rng);
        long long sm = m_inner ? 1 : J, sj = m_inner ? M : 1;
        int layout = c % 3;
        long long splits = (c / 6) % 2 ? 1 : rnd(2, 6);
        long long chunk = (J + splits - 1) / splits; splits = (J + chunk - 1) / chunk;
        unsigned block = layout == 0 ? 32u * (unsigned)rnd(1, 4) : layout == 1 ? 32u << rnd(0, 4) : 32u << rnd(0, 4);
        unsigned grid = (unsigned)rnd(1, 4);
        std::vector<{t}> y(M, ({t})-777);
        std::vector<dlbridge_Acc> partial(M * splits);
        DlbIndexer k0 = ix1(M, sm), r0 = ix1(J, sj), k1 = ix1(M, 1);
        launch(grid, block, [&] {{
            dlbridge_{name}(x.data(), k0, r0, y.data(), k1, partial.data(), M, J, sj == 1 ? 1 : 0, layout, splits, chunk);
        }});
        if (splits > 1) {{
            ++split_cases;
            launch((unsigned)rnd(1, 3), 32u * (unsigned)rnd(1, 4), [&] {{
                dlbridge_{name}_finish(partial.data(), y.data(), k1, M, J, splits);
            }});
        }}
        ++cases;
        for (long long m = 0; m < M; ++m) {{
            std::vector<double> v(J);
            for (long long j = 0; j < J; ++j) v[j] = (double)x[m * sm + j * sj];
            double want = ({reference}), got = (double)y[m];
            if (!(fabs(got - want) <= {tol} * (fabs(want) + 1e-30))) {{
                if (fails++ < 10) printf("FAIL M=%lld J=%lld m=%lld layout=%d splits=%lld block=%u m_inner=%d got %.17g want %.17g\n",
                                         M, J, m, layout, splits, block, (int)m_inner, got, want);
            }}
        }}
    }}
    printf("%d cases, %d split, %d failures\n", cases, split_cases, fails);
    if (split_cases < 12) return 2;  // half the cases ask for pieces; J = 1 makes one
    return fails != 0;
}}
"#
    )
}

/// Compiles a generated source (`generated`) followed by its `harness` with the host
/// C++ compiler against the CUDA emulation, runs it, and checks it reports no
/// failures; `None` (after printing why) without a compiler.
fn build_and_run(name: &str, generated: &str, harness: &str) -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&cxx).arg("--version").output().is_err() {
        eprintln!("skipped: no C++ compiler ({cxx})");
        return None;
    }
    // The emulation's own types stand in for NVRTC's.
    let prelude = "#include \"host_shim.h\"\n#include <cstdint>\n#include <cstddef>\n#include <algorithm>\n\
                   #define DLBRIDGE_COMPILE_NVRTC_STDINT_CUH_\n#define __align__(n) __attribute__((aligned(n)))\n\
                   using std::min; using std::max; using std::sqrt;\n";
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (cpp, exe) = (dir.join(format!("{name}.cpp")), dir.join(name));
    std::fs::write(&cpp, format!("{prelude}{generated}\n{harness}")).unwrap();
    let shim = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cuda/cu");
    let built =
        Command::new(&cxx).args(["-std=c++20", "-O1", "-pthread", "-w", "-I"]).arg(&shim).arg("-o").arg(&exe).arg(&cpp).output().unwrap();
    assert!(built.status.success(), "{cxx} failed on {}:\n{}", cpp.display(), String::from_utf8_lossy(&built.stderr));
    let out = Command::new(&exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && stdout.contains(" 0 failures"), "{name}:\n{stdout}");
    Some(stdout)
}

fn run_on_host(spec: &ReductionSpec, bind: &[(char, DType)], t: &str, reference: &str, tol: f64) {
    let src = reduction_source(spec, bind).unwrap();
    let name = src.entry.strip_prefix("dlbridge_").unwrap();
    if let Some(report) = build_and_run(&format!("reduce_{name}"), &src.text, &harness(name, t, reference, tol)) {
        eprintln!("{}: {}", src.entry, report.trim());
    }
}

#[test]
fn an_l2_norm_with_an_identity_and_a_wider_reduce_type_in_every_layout() {
    let spec = ReductionSpec::new(&Reduction {
        reduce_type: Some("float64"),
        ..Reduction::new("T x", "T y", "x * x", "a + b", "y = sqrt(a)", Some("0"), "l2_host")
    })
    .unwrap();
    let reference = "[&] { double s = 0; for (double e : v) s += e * e; return sqrt(s); }()";
    run_on_host(&spec, &[('T', DType::F32)], "float", reference, 1e-6);
}

#[test]
fn a_maximum_without_an_identity_in_every_layout() {
    // No identity: pieces and lanes without elements must not take part.
    let spec = ReductionSpec::new(&Reduction::new("T x", "T y", "x", "max(a, b)", "y = a", None, "max_host")).unwrap();
    let reference = "[&] { double s = v[0]; for (double e : v) s = e > s ? e : s; return s; }()";
    run_on_host(&spec, &[('T', DType::F64)], "double", reference, 0.0);
}

#[test]
fn a_contiguous_elementwise_kernel_takes_four_elements_a_thread_where_its_inputs_are_aligned() {
    use dlbridge_compile::ElementwiseSpec;
    use dlbridge_compile::internals::elementwise_source;
    // `i` and a `continue` must mean the same in the vector loop as in the element loop.
    let spec = ElementwiseSpec::new(
        "T x, T y, T b",
        "T z",
        "if (i % 7 == 3) { z = -1; continue; } z = x * y + b + (T)(i % 3)",
        "fma_host",
        "",
        "",
        "",
    )
    .unwrap();
    let src = elementwise_source(&spec, &[('T', DType::F32)]).unwrap();
    let harness = r#"
#include <random>
#include <vector>
static std::mt19937_64 rng(9);
static long long rnd(long long lo, long long hi) { return std::uniform_int_distribution<long long>(lo, hi)(rng); }
static DlbIndexer ix1(long long n) { DlbIndexer ix; memset(&ix, 0, sizeof ix); ix.ndim = n > 1; ix.shape[0] = n; ix.strides[0] = 1; return ix; }
int main() {
    int fails = 0, vec_cases = 0;
    for (int c = 0; c < 200; ++c) {
        long long n = rnd(0, 3) ? rnd(0, 40) : rnd(100, 3000);
        // Inputs at 0..3 elements past a 16-byte boundary: only all-aligned inputs take the vector loop.
        long long off[3]; for (auto& o : off) o = rnd(0, 1) ? 0 : rnd(0, 3);
        std::vector<float> buf[3];
        const float* in[3];
        for (int k = 0; k < 3; ++k) {
            buf[k].resize(n + 8);
            for (auto& v : buf[k]) v = (float)rnd(-50, 50) / 4;
            float* base = (float*)(((unsigned long long)buf[k].data() + 15) & ~15ull);
            in[k] = base + off[k];
        }
        std::vector<float> z(n + 1, -777);
        bool aligned = true; for (auto* p : in) aligned &= ((unsigned long long)p % 16) == 0;
        int vec = aligned && n >= 4;
        vec_cases += vec;
        unsigned grid = (unsigned)rnd(1, 3), block = 32u * (unsigned)rnd(1, 4);
        DlbIndexer ix = ix1(n), shape; memset(&shape, 0, sizeof shape); shape.ndim = 1; shape.shape[0] = n;
        launch(grid, block, [&] { dlbridge_fma_host(in[0], ix, in[1], ix, in[2], ix, z.data(), ix, shape, n, 1, vec); });
        for (long long i = 0; i < n; ++i) {
            float want = i % 7 == 3 ? -1.0f : in[0][i] * in[1][i] + in[2][i] + (float)(i % 3);
            if (z[i] != want && fails++ < 10) printf("FAIL n=%lld i=%lld vec=%d got %g want %g\n", n, i, vec, z[i], want);
        }
        if (z[n] != -777 && fails++ < 10) printf("FAIL n=%lld: wrote past the end\n", n);
    }
    printf("%d vector cases, %d failures\n", vec_cases, fails);
    return fails != 0 || vec_cases < 20;
}
"#;
    build_and_run("fma_host", &src.text, harness);
}

#[test]
fn a_gradients_atomic_adds_of_16_bit_floats_lose_no_update() {
    use dlbridge_compile::internals::tc_cuda_source;
    use dlbridge_compile::tc;
    // Threads adding into the two halves of the same 32-bit words at once: every add must land.
    let conv = "def convolution(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) {\n  O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * W1(m, c, kh, kw)\n}";
    let back = tc::backward(&tc::define(conv).unwrap()[0]).unwrap();
    let src = tc_cuda_source(back.spec(), &[('T', DType::F16)]).unwrap();
    assert!(src.text.contains("dlbridge_tc_atomic_add(&"), "the scatter adds atomically");
    let harness = r#"
#include <thread>
#include <vector>
int main() {
    alignas(8) float16 cells[4];
    for (auto& c : cells) c = static_cast<float16>(0.0f);
    std::vector<std::thread> ts;
    for (int t = 0; t < 64; ++t)
        ts.emplace_back([&, t] { for (int k = 0; k < 100; ++k) dlbridge_tc_atomic_add(&cells[(t + k) % 4], 1.0f); });
    for (auto& t : ts) t.join();
    float f = 0.0f; double d = 0.0; int fails = 0;
    std::vector<std::thread> more;
    for (int t = 0; t < 8; ++t) more.emplace_back([&] { for (int k = 0; k < 1000; ++k) { dlbridge_tc_atomic_add(&f, 1.0f); dlbridge_tc_atomic_add(&d, 0.5); } });
    for (auto& t : more) t.join();
    for (auto& c : cells) if (static_cast<float>(c) != 1600.0f) { ++fails; printf("FAIL cell %g\n", static_cast<float>(c)); }
    if (f != 8000.0f || d != 4000.0) { ++fails; printf("FAIL f32 %g f64 %g\n", f, d); }
    printf("atomic adds: %d failures\n", fails);
    return fails != 0;
}
"#;
    build_and_run("tc_atomics_host", &src.text, harness);
}

/// Runs definition `k` (its CUDA source, in the emulation, with the launches a
/// CUDA call makes) and on the CPU (its C++ source through the registry) on
/// `inputs` (f64), and compares every output.
fn tc_on_host_and_cpu(k: &dlbridge_compile::tc::TcKernel, inputs: &[dlbridge_array::Array]) {
    use dlbridge_compile::internals::{tc_cuda_plan, tc_cuda_source};
    let reg = dlbridge_registry::Registry::new();
    let kernel = k.register(&reg).unwrap();
    let refs: Vec<&dlbridge_array::Array> = inputs.iter().collect();
    let want = common::run(&kernel, &refs).unwrap();
    let shapes: Vec<Vec<i64>> = inputs.iter().chain(&want).map(|a| a.shape().to_vec()).collect();
    let shape_refs: Vec<&[i64]> = shapes.iter().map(|s| s.as_slice()).collect();
    let (symbols, launches) = tc_cuda_plan(k.spec(), &shape_refs).unwrap();
    let src = tc_cuda_source(k.spec(), &[('T', DType::F64)]).unwrap();
    // The harness: every tensor row-major, outputs first filled with a value no kernel writes.
    let mut h = String::from("#include <vector>\nint main() {\n");
    let mut args = vec!["stmt".to_string()];
    for (t, shape) in shapes.iter().enumerate() {
        let values: Vec<String> = if t < inputs.len() {
            inputs[t].to_vec::<f64>().unwrap().iter().map(|v| format!("{v:e}")).collect()
        } else {
            vec!["-12345.0".into(); shape.iter().product::<i64>() as usize]
        };
        h += &format!("  std::vector<double> t{t} = {{{}}};\n", values.join(", "));
        h += &format!("  DlbIndexer x{t}; memset(&x{t}, 0, sizeof x{t}); x{t}.ndim = {};\n", shape.len());
        let mut stride = 1i64;
        for d in (0..shape.len()).rev() {
            h += &format!("  x{t}.shape[{d}] = {}; x{t}.strides[{d}] = {stride};\n", shape[d]);
            stride *= shape[d];
        }
        args.push(format!("t{t}.data()"));
        args.push(format!("x{t}"));
    }
    args.extend(symbols.iter().map(|v| format!("{v}LL")));
    for (stmt, count) in &launches {
        let grid = count.div_ceil(64).clamp(1, 3);
        h += &format!("  {{ const int stmt = {stmt}; launch({grid}, 64, [&] {{ {}({}); }}); }}\n", src.entry, args.join(", "));
    }
    for t in inputs.len()..shapes.len() {
        h += &format!("  for (double v : t{t}) printf(\"%.17g\\n\", v);\n");
    }
    h += "  printf(\"emulated: 0 failures\\n\");\n  return 0;\n}\n";
    let Some(out) = build_and_run(&format!("tc_{}", k.name()), &src.text, &h) else { return };
    let mut got = out.lines().filter(|l| !l.contains("failures")).map(|l| l.parse::<f64>().unwrap());
    let compared: usize = want.iter().map(|w| w.shape().iter().product::<i64>() as usize).sum();
    eprintln!("{}: {} launches, {compared} output values compared", k.name(), launches.len());
    for (o, w) in want.iter().enumerate() {
        let w = w.to_vec::<f64>().unwrap();
        let g: Vec<f64> = got.by_ref().take(w.len()).collect();
        assert_eq!(g.len(), w.len(), "{}: output {o}", k.name());
        assert!(w.iter().any(|v| *v != 0.0), "{}: output {o} is all zeros on the CPU", k.name());
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!((a - b).abs() <= 1e-12 * (1.0 + b.abs()), "{} output {o}[{i}]: emulated CUDA {a}, CPU {b}", k.name());
        }
    }
}

#[test]
fn definitions_and_their_gradients_run_the_same_in_the_cuda_emulation_as_on_the_cpu() {
    use dlbridge_array::Array;
    use dlbridge_compile::tc;
    if let Err(e) = dlbridge_compile::internals::Compiler::get() {
        eprintln!("skipped: {e}");
        return;
    }
    let lang = "
def convolution(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) {
  O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * W1(m, c, kh, kw)
}
def softmax(float(N, D) I) -> (O, maxVal, expDistance, expSum) {
  maxVal(n) max=! I(n, d)
  expDistance(n, d) = exp(I(n, d) - maxVal(n))
  expSum(n) +=! expDistance(n, d)
  O(n, d) = expDistance(n, d) / expSum(n)
}";
    let defs = tc::define(lang).unwrap();
    let arr = |shape: &[i64], scale: f64| {
        let n = shape.iter().product::<i64>() as usize;
        Array::from_vec(common::seq(n, scale), shape).unwrap()
    };
    let (conv, softmax) = (&defs[0], &defs[1]);
    let (i, w) = (arr(&[2, 3, 6, 5], 0.02), arr(&[4, 3, 2, 3], 0.03));
    tc_on_host_and_cpu(conv, &[i.clone(), w.clone()]);
    // The gradient: a gather for W1, an atomic scatter for I.
    let back = tc::backward(conv).unwrap();
    tc_on_host_and_cpu(&back, &[i, w, arr(&[2, 4, 5, 3], 0.01)]);
    // Several statements, intermediate outputs, a max= reduction.
    tc_on_host_and_cpu(softmax, &[arr(&[3, 7], 0.05)]);
    // Backwards of a product with zeros (counts of zeros, products of the
    // rest) and of a maximum with ties (counts of ties).
    let more =
        tc::define("def rowprod(float(M, N) A) -> (O) { O(i) *=! A(i, k) }\ndef rowmax(float(M, N) A) -> (O) { O(i) max=! A(i, k) }")
            .unwrap();
    let a = Array::from_vec(vec![0.0, 2.0, 3.0, 0.0, 0.0, 5.0, 1.5, -2.0, 3.0, 4.0, 4.0, 1.0], &[4, 3]).unwrap();
    let g = Array::from_vec(vec![1.0, -0.5, 2.0, 0.25], &[4]).unwrap();
    for k in &more {
        tc_on_host_and_cpu(&tc::backward(k).unwrap(), &[a.clone(), g.clone()]);
    }
    // A size divided in an index: a centred window, forward and backward
    // (the first K/2 outputs are zero, written by the zero fill).
    let same = &tc::define("def same_conv(float(N) A, float(K) W) -> (O) {\n  O(i) +=! A(i + k - K/2) * W(k)\n}").unwrap()[0];
    let (x, w) = (arr(&[11], 0.1), arr(&[5], 0.2));
    tc_on_host_and_cpu(same, &[x.clone(), w.clone()]);
    tc_on_host_and_cpu(&tc::backward(same).unwrap(), &[x, w, arr(&[9], 0.3)]);
}

/// `/` and `%` on CUDA: integers truncate as in C, MIN / -1 wraps to MIN
/// (MIN % -1 is 0) instead of trapping, a zero divisor gives 0 (a kernel
/// cannot raise), and `%` of floats is fmod.
#[test]
fn division_and_remainder_in_a_definition_on_cuda() {
    use dlbridge_compile::internals::{tc_cuda_plan, tc_cuda_source};
    use dlbridge_compile::tc;
    let k = &tc::define(
        "def divmod(int64(N) A, int64(N) B, float(N) X, float(N) Y) -> (Q, R, F) {
  Q(i) = A(i) / B(i)
  R(i) = A(i) % B(i)
  F(i) = X(i) % Y(i)
}",
    )
    .unwrap()[0];
    let a = [i64::MIN, 7, -7, 7, -7, i64::MIN, 5, 9];
    let b = [-1i64, 2, 2, -2, -2, 1, 0, -1];
    let (x, y) = ([5.5f64, -5.5, 5.5, 1.0, 0.0, -0.0, 7.25, 3.0], [2.0f64, 2.0, -2.0, 0.0, 1.0, 1.0, 0.5, -7.0]);
    let n = a.len() as i64;
    let (symbols, launches) = tc_cuda_plan(k.spec(), &[&[n], &[n], &[n], &[n], &[n], &[n], &[n]]).unwrap();
    let src = tc_cuda_source(k.spec(), &[('T', DType::F64)]).unwrap();
    let list = |v: &[String]| v.join(", ");
    let ints = |v: &[i64]| list(&v.iter().map(|v| format!("{}LL", v)).collect::<Vec<_>>()).replace("-9223372036854775808LL", "INT64_MIN");
    let floats = |v: &[f64]| list(&v.iter().map(|v| format!("{v:e}")).collect::<Vec<_>>());
    let mut h = format!(
        "#include <vector>\n#include <climits>\nint main() {{\n  std::vector<int64_t> t0 = {{{}}}, t1 = {{{}}}, t4({n}, 99), t5({n}, 99);\n  \
         std::vector<double> t2 = {{{}}}, t3 = {{{}}}, t6({n}, 99.0);\n",
        ints(&a),
        ints(&b),
        floats(&x),
        floats(&y)
    );
    let mut args = vec!["stmt".to_string()];
    for t in 0..7 {
        h += &format!("  DlbIndexer x{t}; memset(&x{t}, 0, sizeof x{t}); x{t}.ndim = 1; x{t}.shape[0] = {n}; x{t}.strides[0] = 1;\n");
        args.push(format!("t{t}.data()"));
        args.push(format!("x{t}"));
    }
    args.extend(symbols.iter().map(|v| format!("{v}LL")));
    for (stmt, count) in &launches {
        h += &format!(
            "  {{ const int stmt = {stmt}; launch({}, 64, [&] {{ {}({}); }}); }}\n",
            count.div_ceil(64),
            src.entry,
            args.join(", ")
        );
    }
    h += "  for (int64_t v : t4) printf(\"%lld\\n\", (long long)v);\n  for (int64_t v : t5) printf(\"%lld\\n\", (long long)v);\n";
    h += "  for (double v : t6) printf(\"%.17g\\n\", v);\n  printf(\"emulated: 0 failures\\n\");\n  return 0;\n}\n";
    let Some(out) = build_and_run("tc_divmod", &src.text, &h) else { return };
    let lines: Vec<&str> = out.lines().filter(|l| !l.contains("failures")).collect();
    let q: Vec<i64> = lines[..8].iter().map(|l| l.parse().unwrap()).collect();
    let r: Vec<i64> = lines[8..16].iter().map(|l| l.parse().unwrap()).collect();
    let f: Vec<f64> = lines[16..].iter().map(|l| l.parse().unwrap()).collect();
    assert_eq!(q, [i64::MIN, 3, -3, -3, 3, i64::MIN, 0, -9]);
    assert_eq!(r, [0, 1, -1, 1, -1, 0, 0, 0]);
    let want: Vec<f64> = x.iter().zip(&y).map(|(x, y)| x % y).collect();
    assert_eq!(f.len(), want.len());
    for (g, w) in f.iter().zip(&want) {
        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "fmod: {f:?} != {want:?}");
    }
}

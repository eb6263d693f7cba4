//! Definitions on CUDA without a GPU: the CUDA C generated for TC's documented
//! examples and their derived backwards compiles with NVRTC (PTX for
//! compute_75 for every floating dtype, and sm_90 for f32). Without NVRTC the test
//! prints `skipped: <reason>` and returns.

use dlbridge_compile::internals::tc_cuda_source;
use dlbridge_compile::tc;
use dlbridge_core::DType;
use dlbridge_cuda::nvrtc::available_or_skip as nvrtc_or_skip;

const EXAMPLES: &str = "
def matmul(float(M,N) A, float(N,K) B) -> (output) {
  output(i, j) +=! A(i, kk) * B(kk, j)
}
def fcrelu(float(B,M) I, float(N,M) W1, float(N) B1) -> (O1) {
  O1(b, n) +=! I(b, m) * W1(n, m)
  O1(b, n) = O1(b, n) + B1(n)
  O1(b, n) = fmax(O1(b, n), 0)
}
def convolution(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) {
  O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * W1(m, c, kh, kw)
}
def avgpool(float(B, C, H, W) input) -> (output) {
  output(b, c, h, w) +=! input(b, c, h * 2 + r_kh, w * 2 + r_kw) / 4.0 where r_kh in 0:2, r_kw in 0:2
}
def softmax(float(N, D) I) -> (O, maxVal, expDistance, expSum) {
  maxVal(n) max=! I(n, d)
  expDistance(n, d) = exp(I(n, d) - maxVal(n))
  expSum(n) +=! expDistance(n, d)
  O(n, d) = expDistance(n, d) / expSum(n)
}
def layernorm(float(T, B, C) I) -> (O, mean, centered, var) {
  mean(t, b) +=! I(t, b, c) / C
  centered(t, b, c) = I(t, b, c) - mean(t, b)
  var(t, b) +=! centered(t, b, c) * centered(t, b, c)
  var(t, b) = (var(t, b)) / C
  O(t, b, c) = centered(t, b, c) / rsqrt(var(t, b))
}
def rowmin(int32(R, C) X) -> (Y) { Y(r) min=! X(r, c) }
def rowprod(float(M, N) A) -> (O) { O(i) *=! A(i, k) }
def same_conv(float(N) A, float(K) W) -> (O) {
  O(i) +=! A(i + k - K/2) * W(k)
}
def halfwin(float(N) A) -> (O) { O(i) +=! A(i + k) where k in 0:N/2 }
def signmix(int32(N) A, uint32(N) B, uint8(N) C) -> (Q, L, M) {
  Q(i) = A(i) / B(i) + C(i) * 2
  L(i) = A(i) < B(i) ? max(A(i), C(i)) : -1
  M(i) = (A(i) > 0) - (C(i) > 3)
}
def divmod(int32(N) A, int64(N) B, float(N) X) -> (Q, R, F) {
  Q(i) = A(i) / B(i)
  R(i) = A(i) % 3
  F(i) = X(i) % 1.5 + X(i) / 3
}
";

#[test]
fn tcs_examples_and_their_backwards_compile_to_ptx() {
    if !nvrtc_or_skip() {
        return;
    }
    let mut kernels = tc::define(EXAMPLES).unwrap();
    let backwards: Vec<_> = kernels.iter().filter_map(|k| tc::backward(k).ok()).collect();
    assert_eq!(backwards.len(), 10, "every floating definition has a backward");
    kernels.extend(backwards);
    for k in &kernels {
        let floating = k.signature().contains("<T:");
        let dtypes: &[DType] = if floating { &[DType::F32, DType::F64, DType::F16, DType::BF16] } else { &[DType::F32] };
        for &d in dtypes {
            let bind: Vec<(char, DType)> = if floating { vec![('T', d)] } else { Vec::new() };
            let src = tc_cuda_source(k.spec(), &bind).unwrap();
            // Every dtype for the oldest architecture; sm_90 (Hopper) for f32.
            let archs: &[&str] = if d == DType::F32 {
                &["--gpu-architecture=compute_75", "--gpu-architecture=sm_90"]
            } else {
                &["--gpu-architecture=compute_75"]
            };
            for arch in archs {
                let ptx = src.ptx(arch).unwrap_or_else(|e| panic!("{} ({d}) for {arch}: {e}\n{}", k.name(), src.text));
                assert!(ptx.contains(&format!(".entry {}(", src.entry)), "{} for {arch}", k.name());
            }
        }
    }
}

#[test]
fn a_gradients_scatter_runs_a_thread_per_iteration_with_atomic_adds() {
    let kernels = tc::define(EXAMPLES).unwrap();
    let conv = kernels.iter().find(|k| k.name() == "convolution").unwrap();
    let back = tc::backward(conv).unwrap();
    for (d, atomic) in [(DType::F32, "atom.global.add.f32"), (DType::F64, "atom.global.add.f64"), (DType::BF16, "cas.b32")] {
        let src = tc_cuda_source(back.spec(), &[('T', d)]).unwrap();
        assert!(src.text.contains("dlbridge_tc_atomic_add(&"), "{}", src.text);
        if nvrtc_or_skip() {
            let ptx = src.ptx("--gpu-architecture=compute_75").unwrap();
            assert!(ptx.contains(atomic), "{d}: no {atomic} in the scatter");
        }
    }
}

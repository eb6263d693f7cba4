//! Definitions on CUDA without a GPU: the CUDA C generated for TC's documented
//! examples and their derived backwards compiles with NVRTC (PTX for
//! compute_75 for every floating dtype, and sm_90 for f32). Without NVRTC the test
//! prints `skipped: <reason>` and returns.

use dlbridge_compile::internals::tc_cuda_source;
use dlbridge_compile::tc;
use dlbridge_core::DType;
use dlbridge_cuda::nvrtc::available_or_skip as nvrtc_or_skip;

/// TC's documented examples, then definitions that reach the rest of the
/// generated code: integer and mixed dtypes, other reductions, shifted windows.
const EXAMPLES: &str = concat!(
    include_str!("tc_examples.tc"),
    "
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
",
);

#[test]
fn tcs_examples_and_their_backwards_compile_to_ptx() {
    if !nvrtc_or_skip() {
        return;
    }
    let mut kernels = tc::define(EXAMPLES).unwrap();
    let backwards: Vec<_> = kernels.iter().filter_map(|k| tc::backward(k).ok()).collect();
    assert_eq!(backwards.len(), 14, "every floating definition has a backward");
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

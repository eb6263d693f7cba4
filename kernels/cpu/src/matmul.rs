//! matmul through the `gemm` crate (packed, SIMD, multi-threaded), on any strides.
//!
//! Invariants: the registry has checked the signature (`a: T[M, K]`,
//! `b: T[K, N]`, `c: T[M, N]`, same dtype T, host memory), that `c` is a
//! writable, non-overlapping view that does not overlap `a` or `b` (matmul
//! allows no aliasing), and every view's layout was validated, so every
//! element address gemm forms from the pointers and strides below lies in
//! memory the views cover.
//!
//! Allocation: this module allocates nothing sized by its inputs; gemm's
//! packing buffers are bounded by its cache-blocking parameters, not by M, N, K.

use dlbridge_core::{Element, Result};
use dlbridge_registry::{Call, register_kernel};

/// Above this many multiply-adds gemm may use every thread of the call's budget.
const PAR_FLOPS: usize = 1 << 18;

fn matmul<T: Element + GemmScalar>(call: &mut Call<'_, '_>) -> Result<()> {
    let (ins, mut outs) = call.io();
    let (a, b, c) = (ins.tensor("a")?, ins.tensor("b")?, outs.take("c")?);
    let (m, k, n) = (a.shape()[0] as usize, a.shape()[1] as usize, b.shape()[1] as usize);
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        c.iter_mut::<T>()?.for_each(|v| *v = T::ZERO);
        return Ok(());
    }
    // Typed checks (dtype, host memory, alignment) before any raw pointer use.
    a.check_typed::<T>("matmul")?;
    b.check_typed::<T>("matmul")?;
    c.check_typed::<T>("matmul")?;
    let (a_rs, a_cs) = (a.strides()[0] as isize, a.strides()[1] as isize);
    let (b_rs, b_cs) = (b.strides()[0] as isize, b.strides()[1] as isize);
    let (c_rs, c_cs) = (c.strides()[0] as isize, c.strides()[1] as isize);
    let mut run = |parallelism| {
        // SAFETY: see the module invariants: shapes match the signature, every address
        // base + i*rs + j*cs for in-range i, j lies in validated host memory of the
        // right dtype, c is writable, exclusive and disjoint from a and b. T is f32 or
        // f64 (GemmScalar is only implemented for those), which gemm supports.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.data_ptr_mut().cast::<T>(),
                c_cs,
                c_rs,
                false,
                a.data_ptr().cast::<T>(),
                a_cs,
                a_rs,
                b.data_ptr().cast::<T>(),
                b_cs,
                b_rs,
                T::ZERO,
                T::ONE,
                false,
                false,
                false,
                parallelism,
            )
        }
    };
    // Saturating: broadcast (zero-stride) inputs can make m * n * k exceed usize.
    // Parallel: on the pool of the call's thread budget (crate::threads).
    match crate::threads::pool_for_call() {
        Some(pool) if m.saturating_mul(n).saturating_mul(k) >= PAR_FLOPS => {
            pool.install(|| run(gemm::Parallelism::Rayon(pool.current_num_threads())))
        }
        _ => run(gemm::Parallelism::None),
    }
    Ok(())
}

/// The dtypes gemm multiplies here.
pub trait GemmScalar: Copy + 'static {
    /// 0
    const ZERO: Self;
    /// 1
    const ONE: Self;
}
impl GemmScalar for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
}
impl GemmScalar for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
}

register_kernel!("matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])",
    each gemm_types!(matmul),
    doc = "c = a @ b (gemm crate: packed SIMD micro-kernels, multi-threaded above 2^18 multiply-adds; any strides)");

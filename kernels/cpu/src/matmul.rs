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

use dlbridge_core::{Element, Error, Result, TensorView, TensorViewMut};
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
    let layout = |v: &TensorView<'_>| Layout { batch: &[], rows: v.strides()[0], cols: v.strides()[1] };
    let (la, lb, lc) = (layout(a), layout(b), layout(c.as_view()));
    strided_gemm::<T>(&[], (m, n, k), a, la, b, lb, c, lc)
}

/// How [`strided_gemm`] addresses one operand.
pub use dlbridge_core::layout::MatrixLayout as Layout;

/// `c[β, i, j] = Σ_l a[β, i, l] · b[β, l, j]` for every batch multi-index `β`
/// over `batch`: one GEMM (gemm crate, multi-threaded within the call's
/// thread budget) per batch element, each operand addressed through its
/// [`Layout`] (a permutation or merge of a view's dims, a broadcast over
/// the batch). Every address the layouts can form is checked to lie within
/// its view before anything runs; `c` must be a writable view that does not
/// overlap `a` or `b` (as the registry ensures for outputs).
#[allow(clippy::too_many_arguments)]
pub fn strided_gemm<T: Element + GemmScalar>(
    batch: &[i64],
    (m, n, k): (usize, usize, usize),
    a: &TensorView<'_>,
    la: Layout<'_>,
    b: &TensorView<'_>,
    lb: Layout<'_>,
    c: &mut TensorViewMut<'_>,
    lc: Layout<'_>,
) -> Result<()> {
    a.check_typed::<T>("strided_gemm")?;
    b.check_typed::<T>("strided_gemm")?;
    c.check_typed::<T>("strided_gemm")?;
    let (mi, ni, ki) = (m as i64, n as i64, k as i64);
    lc.check_within(c.as_view(), batch, mi, ni, "strided_gemm: c")?;
    la.check_within(a, batch, mi, ki, "strided_gemm: a")?;
    lb.check_within(b, batch, ki, ni, "strided_gemm: b")?;
    if m == 0 || n == 0 || batch.contains(&0) {
        return Ok(());
    }
    if k == 0 {
        return Err(Error::InvalidArgument("strided_gemm: an empty contraction (k = 0)".into()));
    }
    let total: i64 = batch.iter().product();
    let par = m.saturating_mul(n).saturating_mul(k) >= PAR_FLOPS;
    let pool = crate::threads::pool_for_call();
    // Addresses as integers: the closure below runs on the pool's threads.
    let (pa, pb, pc) = (a.data_ptr() as usize, b.data_ptr() as usize, c.data_ptr_mut() as usize);
    let mut index = vec![0i64; batch.len()];
    for _ in 0..total {
        let off = |l: &Layout<'_>| l.batch_offset(&index) as isize;
        let (oa, ob, oc) = (off(&la), off(&lb), off(&lc));
        let run = |parallelism| {
            // SAFETY: `covers` checked that every element address base + batch
            // offset + i*rows + j*cols, for in-range indices, lies within each
            // view's validated memory; the views have dtype T (check_typed), T is
            // f32 or f64 (GemmScalar), c is writable and disjoint from a and b.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    (pc as *mut T).offset(oc),
                    lc.cols as isize,
                    lc.rows as isize,
                    false,
                    (pa as *const T).offset(oa),
                    la.cols as isize,
                    la.rows as isize,
                    (pb as *const T).offset(ob),
                    lb.cols as isize,
                    lb.rows as isize,
                    T::ZERO,
                    T::ONE,
                    false,
                    false,
                    false,
                    parallelism,
                )
            }
        };
        match &pool {
            Some(pool) if par => pool.install(|| run(gemm::Parallelism::Rayon(pool.current_num_threads()))),
            _ => run(gemm::Parallelism::None),
        }
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < batch[d] {
                break;
            }
            index[d] = 0;
        }
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

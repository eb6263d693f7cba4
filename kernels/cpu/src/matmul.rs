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

/// How [`strided_gemm`] addresses one operand: element strides from the
/// view's first element, per batch dim and for the matrix's rows and columns.
#[derive(Debug, Clone, Copy)]
pub struct Layout<'a> {
    /// One stride per batch dim (0 where the operand is broadcast over it).
    pub batch: &'a [i64],
    /// Between rows.
    pub rows: i64,
    /// Between columns.
    pub cols: i64,
}

/// Whether every element `layout` addresses, for the batch extents `batch`
/// and a `rows x cols` matrix, lies in `view`'s memory.
fn covers(view: &TensorView<'_>, batch: &[i64], layout: &Layout<'_>, rows: usize, cols: usize, what: &str) -> Result<()> {
    let (mut lo, mut hi) = (0i128, 0i128);
    let dims = batch.iter().zip(layout.batch).map(|(e, s)| (*e as i128, *s as i128));
    for (extent, stride) in dims.chain([(rows as i128, layout.rows as i128), (cols as i128, layout.cols as i128)]) {
        let reach = (extent - 1) * stride;
        if reach < 0 { lo += reach } else { hi += reach }
    }
    let size = view.dtype().itemsize().unwrap_or(1) as i128;
    let e = view.extent();
    if lo * size < e.byte_lo as i128 || (hi + 1) * size > e.byte_hi as i128 {
        return Err(Error::Runtime(format!("{what}: the strides given reach past the tensor's memory")));
    }
    Ok(())
}

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
    if [la.batch.len(), lb.batch.len(), lc.batch.len()] != [batch.len(); 3] || batch.iter().any(|e| *e < 0) {
        return Err(Error::InvalidArgument("strided_gemm: a batch layout does not match the batch extents".into()));
    }
    if m == 0 || n == 0 || batch.contains(&0) {
        return Ok(());
    }
    covers(c.as_view(), batch, &lc, m, n, "strided_gemm: c")?;
    if k == 0 {
        return Err(Error::InvalidArgument("strided_gemm: an empty contraction (k = 0)".into()));
    }
    covers(a, batch, &la, m, k, "strided_gemm: a")?;
    covers(b, batch, &lb, k, n, "strided_gemm: b")?;
    let total: i64 = batch.iter().product();
    let par = m.saturating_mul(n).saturating_mul(k) >= PAR_FLOPS;
    let pool = crate::threads::pool_for_call();
    // Addresses as integers: the closure below runs on the pool's threads.
    let (pa, pb, pc) = (a.data_ptr() as usize, b.data_ptr() as usize, c.data_ptr_mut() as usize);
    let mut index = vec![0i64; batch.len()];
    for _ in 0..total {
        let off = |l: &Layout<'_>| index.iter().zip(l.batch).map(|(i, s)| i * s).sum::<i64>() as isize;
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

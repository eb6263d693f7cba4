//! `matmul` on CUDA through cuBLAS (`cublasSgemm` / `cublasDgemm`), on the
//! call's stream.
//!
//! cuBLAS is column-major; dlbridge's tensors are strided. A matrix whose
//! column stride is 1 is a row-major matrix with leading dimension = its row
//! stride, which cuBLAS reads as its transpose; one whose row stride is 1 is
//! column-major as it is. So `C = A B` with a row-major C is computed as
//! `C^T = B^T A^T` (column-major, `m' = N`, `n' = M`), each operand passed with
//! `N` or `T` according to its own layout, and a column-major C as `C = A B`
//! directly. A matrix with no unit stride is refused (cuBLAS cannot read it),
//! as is one whose leading dimension does not fit cuBLAS's `int`. `K == 0`
//! writes zeros (cuBLAS scales C by beta = 0).

use dlbridge_core::{DType, DeviceType, Error, Result};
use dlbridge_registry::{Arg, Call, register_kernel};

use crate::array::CudaDevice;
pub use crate::gemm::{Gemm, Op, plan};
pub use crate::nvrtc::find_cublas;

fn strides2(s: &[i64]) -> [i64; 2] {
    [s[0], s[1]]
}

fn matmul(call: &mut Call<'_, '_>) -> Result<()> {
    let double = call.dtype(0) == Some(DType::F64);
    let stream = call.stream();
    let bug = call.layout_bug();
    let (args, outs) = call.split();
    let (Some(Arg::Tensor(a)), Some(Arg::Tensor(b)), Some(c)) = (args.first(), args.get(1), outs.first_mut()) else { return Err(bug) };
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    if m == 0 || n == 0 {
        return Ok(());
    }
    let g = plan(m, n, k, strides2(a.strides()), strides2(b.strides()), strides2(c.strides()))?;
    let ordinal = usize::try_from(c.device().id).map_err(|_| Error::InvalidArgument(format!("cuda device id {}", c.device().id)))?;
    let dev = CudaDevice::get(ordinal)?;
    let ptrs = [a.data_ptr() as usize as u64, b.data_ptr() as usize as u64];
    let cp = c.data_ptr_mut() as usize as u64;
    dev.with_cublas(|h| h.gemm(double, &g, ptrs, cp, stream))
}

/// How [`strided_gemm`] addresses one operand.
pub use dlbridge_core::layout::MatrixLayout as Layout;

/// `c[β] = a[β] · b[β]` through cuBLAS (f32 or f64, every operand on the same
/// CUDA device), one GEMM per batch multi-index β over `batch`, on `stream`,
/// each operand addressed through its [`Layout`]. Every address the layouts
/// can form is checked to lie within its view first; `c` must not overlap
/// `a` or `b`. `Ok(false)`, nothing launched, when cuBLAS cannot read a
/// layout (no unit stride; see [`plan`]).
#[allow(clippy::too_many_arguments)]
pub fn strided_gemm(
    batch: &[i64],
    (m, n, k): (i64, i64, i64),
    a: &dlbridge_core::TensorView<'_>,
    la: Layout<'_>,
    b: &dlbridge_core::TensorView<'_>,
    lb: Layout<'_>,
    c: &mut dlbridge_core::TensorViewMut<'_>,
    lc: Layout<'_>,
    stream: *mut std::ffi::c_void,
) -> Result<bool> {
    let double = match (a.dtype(), b.dtype(), c.dtype()) {
        (DType::F32, DType::F32, DType::F32) => false,
        (DType::F64, DType::F64, DType::F64) => true,
        _ => return Err(Error::InvalidArgument("strided_gemm on CUDA: the operands must all be f32 or all f64".into())),
    };
    let device = c.device();
    if device.kind != DeviceType::CUDA || a.device() != device || b.device() != device {
        return Err(Error::InvalidArgument("strided_gemm on CUDA: the operands must be on one CUDA device".into()));
    }
    if k < 1 {
        return Err(Error::InvalidArgument("strided_gemm on CUDA: an empty contraction (k = 0)".into()));
    }
    la.check_within(a, batch, m, k, "strided_gemm: a")?;
    lb.check_within(b, batch, k, n, "strided_gemm: b")?;
    lc.check_within(c.as_view(), batch, m, n, "strided_gemm: c")?;
    if m == 0 || n == 0 || batch.contains(&0) {
        return Ok(true);
    }
    let Ok(g) = plan(m, n, k, [la.rows, la.cols], [lb.rows, lb.cols], [lc.rows, lc.cols]) else { return Ok(false) };
    let ordinal = usize::try_from(device.id).map_err(|_| Error::InvalidArgument(format!("cuda device id {}", device.id)))?;
    let dev = CudaDevice::get(ordinal)?;
    let size: i64 = if double { 8 } else { 4 };
    let (pa, pb, pc) = (a.data_ptr() as usize as u64, b.data_ptr() as usize as u64, c.data_ptr_mut() as usize as u64);
    let total: i64 = batch.iter().product();
    let mut index = vec![0i64; batch.len()];
    for _ in 0..total {
        let off = |l: &Layout<'_>| l.batch_offset(&index) * size;
        let ptrs = [pa.wrapping_add_signed(off(&la)), pb.wrapping_add_signed(off(&lb))];
        dev.with_cublas(|h| h.gemm(double, &g, ptrs, pc.wrapping_add_signed(off(&lc)), stream))?;
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < batch[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Ok(true)
}

// The CUDA implementation of the CPU kernel `matmul` (kernels/cpu declares it).
register_kernel!("matmul", dispatch { F32 => matmul, F64 => matmul }, device = DeviceType::CUDA, doc = "c = a @ b (cuBLAS)");

#[cfg(test)]
mod tests {
    use super::*;

    /// cuBLAS's column-major GEMM, on host slices (what the plan asks the GPU for).
    fn gemm_ref(g: &Gemm, ops: [&[f64]; 2], c: &mut [f64]) {
        let read = |which: (usize, Op, i32), i: usize, j: usize| -> f64 {
            let (x, op, ld) = (ops[which.0], which.1, which.2 as usize);
            match op {
                Op::N => x[i + j * ld],
                Op::T => x[j + i * ld],
            }
        };
        for i in 0..g.m as usize {
            for j in 0..g.n as usize {
                let mut acc = 0.0;
                for l in 0..g.k as usize {
                    acc += read(g.a, i, l) * read(g.b, l, j);
                }
                c[i + j * g.ldc as usize] = acc;
            }
        }
    }

    /// A matrix stored with the given strides (and a little slack so a too-far read shows).
    fn store(rows: i64, cols: i64, s: [i64; 2], f: impl Fn(i64, i64) -> f64) -> Vec<f64> {
        let len = ((rows - 1) * s[0] + (cols - 1) * s[1] + 1).max(1) as usize + 3;
        let mut v = vec![f64::NAN; len];
        for i in 0..rows {
            for j in 0..cols {
                v[(i * s[0] + j * s[1]) as usize] = f(i, j);
            }
        }
        v
    }

    #[test]
    fn every_row_and_column_major_layout_gives_the_row_major_product() {
        let (m, n, k) = (3i64, 4i64, 5i64);
        let fa = |i: i64, j: i64| (i * 7 + j * 3) as f64 - 8.0;
        let fb = |i: i64, j: i64| (i * 2 - j * 5) as f64 + 1.0;
        let layouts = |r: i64, c: i64| [[c, 1], [c + 2, 1], [1, r], [1, r + 3]];
        for sa in layouts(m, k) {
            for sb in layouts(k, n) {
                for sc in layouts(m, n) {
                    let g = plan(m, n, k, sa, sb, sc).unwrap();
                    let (a, b) = (store(m, k, sa, fa), store(k, n, sb, fb));
                    let mut c = store(m, n, sc, |_, _| f64::NAN);
                    gemm_ref(&g, [&a, &b], &mut c);
                    for i in 0..m {
                        for j in 0..n {
                            let want: f64 = (0..k).map(|l| fa(i, l) * fb(l, j)).sum();
                            assert_eq!(c[(i * sc[0] + j * sc[1]) as usize], want, "a {sa:?} b {sb:?} c {sc:?}: {g:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn vectors_and_size_one_dims_take_any_stride() {
        // A 1xK row times a Kx1 column: strides of size-1 dims are meaningless.
        let g = plan(1, 1, 4, [999, 1], [1, 12345], [77, 1]).unwrap();
        assert_eq!((g.m, g.n, g.k), (1, 1, 4));
        assert!(plan(4, 1, 3, [3, 1], [1, 0], [1, 4]).is_ok());
    }

    #[test]
    fn layouts_cublas_cannot_read_are_refused_by_name() {
        let e = plan(3, 4, 5, [10, 2], [4, 1], [4, 1]).unwrap_err().to_string();
        assert!(e.contains("a (3x5, strides [10, 2])") && e.contains("neither row- nor column-major"), "{e}");
        // Overlapping rows (a broadcast row) are not a leading dimension cuBLAS accepts.
        let e = plan(3, 4, 5, [5, 1], [0, 1], [4, 1]).unwrap_err().to_string();
        assert!(e.contains("b (5x4"), "{e}");
        let e = plan(1 << 31, 1, 1, [1, 1 << 31], [1, 1], [1, 1]).unwrap_err().to_string();
        assert!(e.contains("32-bit"), "{e}");
    }
}

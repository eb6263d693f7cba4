// softmax.cu -- dlbridge built-in softmax over the last dimension.
//
// Entry points: dlbridge_softmax_{f32,f64,f16,bf16}
//   (const T* x, DlbIndexer xrows, long long xcol_stride,
//    T* y, DlbIndexer yrows, long long ycol_stride,
//    long long rows, long long cols, int warp_rows)
// rows = product of all dims but the last, cols = the last dim.
// Row r of x starts at x + dlb_offset(xrows, r), its elements are xcol_stride
// elements apart (likewise for y). xrows / yrows describe the batch dims only
// (ndim 0 -> a single row at offset 0).
// Launch: any grid size, grid-stride over rows: warp_rows = 0, one block per
// row at a time; warp_rows = 1, one warp per row (short rows: several rows a
// block, warp shuffles only). blockDim.x a multiple of 32, at most 1024.
// Contiguous, 16-byte aligned rows are read (and written) 16 bytes a thread.
// NO dynamic shared memory (static 32-slot scratch, <= 256 bytes).
// Numerically stable three passes: max, sum of exp(x - max), write
// exp(x - max) / sum. Accumulates in float (f32/f16/bf16) or double (f64).
// A row of all -inf (or containing NaN) gives NaN, as torch does.
// In-place (y == x with identical layout) is safe.
#include "dlbridge_common.cuh"

template <typename E>
__device__ __forceinline__ void dlb_softmax(const typename E::storage* x, const DlbIndexer& xrows,
                                            long long xcs, typename E::storage* y,
                                            const DlbIndexer& yrows, long long ycs, long long rows,
                                            long long cols, int warp_rows) {
    typedef typename E::acc A;
    __shared__ A scratch[32];
    const A ninf = dlb_neg_inf<A>();
    const DlbRowGroup g = dlb_row_group(warp_rows);
    // A block's threads run the same number of iterations (rows from
    // blockIdx.x); a warp's likewise (rows from its warp index).
    for (long long r = g.first; r < rows; r += g.step) {
        const typename E::storage* xr = x + dlb_offset(xrows, r);
        typename E::storage* yr = y + dlb_offset(yrows, r);

        A m = ninf;
        dlb_row_each<E>(g, xr, xcs, cols, [&](long long, A v) { m = dlb_max(m, v); });
        m = dlb_group_reduce(g, m, DlbMaxOp(), ninf, scratch);

        A s = A(0);
        dlb_row_each<E>(g, xr, xcs, cols, [&](long long, A v) { s += dlb_exp(v - m); });
        s = dlb_group_reduce(g, s, DlbSumOp(), A(0), scratch);

        dlb_row_map<E>(g, xr, xcs, yr, ycs, cols, [&](A v) { return dlb_exp(v - m) / s; });
    }
}

#define DLB_SOFTMAX(NAME, E)                                                                      \
    extern "C" __global__ void NAME(const E::storage* x, DlbIndexer xrows, long long xcol_stride, \
                                    E::storage* y, DlbIndexer yrows, long long ycol_stride,       \
                                    long long rows, long long cols, int warp_rows) {              \
        dlb_softmax<E>(x, xrows, xcol_stride, y, yrows, ycol_stride, rows, cols, warp_rows);      \
    }

DLB_SOFTMAX(dlbridge_softmax_f32, DlbF32)
DLB_SOFTMAX(dlbridge_softmax_f64, DlbF64)
DLB_SOFTMAX(dlbridge_softmax_f16, DlbF16)
DLB_SOFTMAX(dlbridge_softmax_bf16, DlbBF16)

// sum.cu -- dlbridge built-in sum over the last dimension.
//
// Entry points: dlbridge_sum_{f32,f64,f16,bf16}
//   (const T* x, DlbIndexer xrows, long long xcol_stride,
//    T* y, DlbIndexer yrows, long long rows, long long cols, int warp_rows)
// rows = product of all dims but the last, cols = the last dim.
// Row r of x starts at x + dlb_offset(xrows, r), its elements are xcol_stride
// elements apart; its sum is written to y[dlb_offset(yrows, r)]. xrows / yrows
// describe the batch dims only (ndim 0 -> a single row at offset 0).
// Launch: any grid size, grid-stride over rows: warp_rows = 0, one block per
// row at a time; warp_rows = 1, one warp per row. blockDim.x a multiple of 32,
// at most 1024. Contiguous, 16-byte aligned rows are read 16 bytes a thread.
// NO dynamic shared memory (static 32-slot scratch, <= 256 bytes).
// Accumulates in float (f32/f16/bf16) or double (f64): a per-thread strided
// partial sum, then a warp-shuffle tree. cols == 0 writes 0.
#include "dlbridge_common.cuh"

template <typename E>
__device__ __forceinline__ void dlb_sum(const typename E::storage* x, const DlbIndexer& xrows,
                                        long long xcs, typename E::storage* y,
                                        const DlbIndexer& yrows, long long rows, long long cols,
                                        int warp_rows) {
    typedef typename E::acc A;
    __shared__ A scratch[32];
    const DlbRowGroup g = dlb_row_group(warp_rows);
    for (long long r = g.first; r < rows; r += g.step) {
        const typename E::storage* xr = x + dlb_offset(xrows, r);
        A s = A(0);
        dlb_row_each<E>(g, xr, xcs, cols, [&](long long, A v) { s += v; });
        s = dlb_group_reduce(g, s, DlbSumOp(), A(0), scratch);
        if (g.tid == 0) y[dlb_offset(yrows, r)] = E::store(s);
    }
}

#define DLB_SUM(NAME, E)                                                                          \
    extern "C" __global__ void NAME(const E::storage* x, DlbIndexer xrows, long long xcol_stride, \
                                    E::storage* y, DlbIndexer yrows, long long rows,              \
                                    long long cols, int warp_rows) {                              \
        dlb_sum<E>(x, xrows, xcol_stride, y, yrows, rows, cols, warp_rows);                       \
    }

DLB_SUM(dlbridge_sum_f32, DlbF32)
DLB_SUM(dlbridge_sum_f64, DlbF64)
DLB_SUM(dlbridge_sum_f16, DlbF16)
DLB_SUM(dlbridge_sum_bf16, DlbBF16)

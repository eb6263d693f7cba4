// sum.cu -- dlbridge built-in sum (and mean) over the last dimension.
//
// Entry points, for T in {f32, f64, f16, bf16} (A: float, or double for f64):
//   dlbridge_sum_T(const T* x, DlbIndexer xrows, long long xcol_stride,
//                  T* y, DlbIndexer yrows, long long rows, long long cols,
//                  int warp_rows, double scale)
//     y[row r] = scale * (the sum of row r). Rows = product of all dims but
//     the last, cols = the last dim. Row r of x starts at
//     x + dlb_offset(xrows, r), its elements xcol_stride apart; its result
//     goes to y[dlb_offset(yrows, r)]. xrows / yrows describe the batch dims
//     only (ndim 0 -> a single row at offset 0). scale = 1 for a sum,
//     1 / cols for a mean.
//   dlbridge_sum_partial_T(const T* x, DlbIndexer xrows, long long xcol_stride,
//                          A* partial, long long rows, long long cols,
//                          long long splits, long long chunk, int warp_rows)
//     First pass of a split row (see DlbPiece): partial[u] = the sum of unit
//     u's piece, u < rows * splits.
//   dlbridge_sum_finish_T(const A* partial, T* y, DlbIndexer yrows,
//                         long long rows, long long splits, int warp_rows,
//                         double scale)
//     Second pass: y[row r] = scale * sum(partial[r * splits .. + splits])
//     (each thread a strided share, then the group's tree).
// Launch: any grid size, grid-stride over rows (units); warp_rows = 0, one
// block per row (unit) at a time; warp_rows = 1, one warp each. blockDim.x a
// multiple of 32, at most 1024. Contiguous, 16-byte aligned rows are read 16
// bytes a thread. NO dynamic shared memory (static 32-slot scratch).
// Accumulates in A: a per-thread strided partial sum, then a warp-shuffle
// tree; the order depends only on the launch, so a launch is deterministic.
// cols == 0 gives 0 * scale.
#include "dlbridge_common.cuh"

// The sum of `n` elements of a row from xr, `cs` apart, in every thread of the group.
template <typename E>
__device__ __forceinline__ typename E::acc dlb_sum_piece(const DlbRowGroup& g, const typename E::storage* xr,
                                                         long long cs, long long n, typename E::acc* scratch) {
    typedef typename E::acc A;
    A s = A(0);
    dlb_row_each<E>(g, xr, cs, n, [&](long long, A v) { s += v; });
    return dlb_group_reduce(g, s, DlbSumOp(), A(0), scratch);
}

template <typename E>
__device__ __forceinline__ void dlb_sum(const typename E::storage* x, const DlbIndexer& xrows, long long xcs,
                                        typename E::storage* y, const DlbIndexer& yrows, long long rows,
                                        long long cols, int warp_rows, double scale) {
    typedef typename E::acc A;
    __shared__ A scratch[32];
    const DlbRowGroup g = dlb_row_group(warp_rows);
    for (long long r = g.first; r < rows; r += g.step) {
        const A s = dlb_sum_piece<E>(g, x + dlb_offset(xrows, r), xcs, cols, scratch);
        if (g.tid == 0) y[dlb_offset(yrows, r)] = E::store(s * A(scale));
    }
}

template <typename E>
__device__ __forceinline__ void dlb_sum_partial(const typename E::storage* x, const DlbIndexer& xrows,
                                                long long xcs, typename E::acc* partial, long long rows,
                                                long long cols, long long splits, long long chunk,
                                                int warp_rows) {
    typedef typename E::acc A;
    __shared__ A scratch[32];
    const DlbRowGroup g = dlb_row_group(warp_rows);
    dlb_each_piece(g, rows, splits, chunk, cols, [&](long long u, const DlbPiece& p) {
        const A s = dlb_sum_piece<E>(g, x + dlb_offset(xrows, p.row) + p.first * xcs, xcs, p.cols, scratch);
        if (g.tid == 0) partial[u] = s;
    });
}

template <typename E>
__device__ __forceinline__ void dlb_sum_finish(const typename E::acc* partial, typename E::storage* y,
                                               const DlbIndexer& yrows, long long rows, long long splits,
                                               int warp_rows, double scale) {
    typedef typename E::acc A;
    typedef typename DlbAccOf<A>::traits P;
    __shared__ A scratch[32];
    const DlbRowGroup g = dlb_row_group(warp_rows);
    for (long long r = g.first; r < rows; r += g.step) {
        const A s = dlb_sum_piece<P>(g, partial + r * splits, 1, splits, scratch);
        if (g.tid == 0) y[dlb_offset(yrows, r)] = E::store(s * A(scale));
    }
}

#define DLB_SUM(T, E)                                                                                       \
    extern "C" __global__ void __launch_bounds__(1024) dlbridge_sum_##T(const E::storage* x, DlbIndexer xrows, long long xcol_stride, \
                                                E::storage* y, DlbIndexer yrows, long long rows,             \
                                                long long cols, int warp_rows, double scale) {               \
        dlb_sum<E>(x, xrows, xcol_stride, y, yrows, rows, cols, warp_rows, scale);                          \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(1024) dlbridge_sum_partial_##T(const E::storage* x, DlbIndexer xrows,               \
                                                        long long xcol_stride, E::acc* partial,              \
                                                        long long rows, long long cols, long long splits,    \
                                                        long long chunk, int warp_rows) {                    \
        dlb_sum_partial<E>(x, xrows, xcol_stride, partial, rows, cols, splits, chunk, warp_rows);          \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(1024) dlbridge_sum_finish_##T(const E::acc* partial, E::storage* y, DlbIndexer yrows, \
                                                       long long rows, long long splits, int warp_rows,       \
                                                       double scale) {                                        \
        dlb_sum_finish<E>(partial, y, yrows, rows, splits, warp_rows, scale);                                \
    }

DLB_SUM(f32, DlbF32)
DLB_SUM(f64, DlbF64)
DLB_SUM(f16, DlbF16)
DLB_SUM(bf16, DlbBF16)

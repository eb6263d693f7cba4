// softmax.cu -- dlbridge built-in softmax over the last dimension.
//
// Entry points, for T in {f32, f64, f16, bf16} (A: float, or double for f64):
//   dlbridge_softmax_T(const T* x, DlbIndexer xrows, long long xcol_stride,
//                      T* y, DlbIndexer yrows, long long ycol_stride,
//                      long long rows, long long cols, int warp_rows)
//     Rows = product of all dims but the last, cols = the last dim. Row r of
//     x starts at x + dlb_offset(xrows, r), its elements xcol_stride apart
//     (likewise for y). xrows / yrows describe the batch dims only (ndim 0 ->
//     a single row at offset 0).
//   dlbridge_softmax_partial_T(const T* x, DlbIndexer xrows, long long xcol_stride,
//                              A* partial, long long rows, long long cols,
//                              long long splits, long long chunk, int warp_rows)
//     First pass of a split row (see DlbPiece): partial[2u], partial[2u + 1]
//     = the (max, sum of exp(x - max)) of unit u's piece, u < rows * splits.
//   dlbridge_softmax_finish_T(const T* x, DlbIndexer xrows, long long xcol_stride,
//                             T* y, DlbIndexer yrows, long long ycol_stride,
//                             const A* partial, long long rows, long long cols,
//                             long long splits, long long chunk, int warp_rows)
//     Second pass: each unit merges its row's pieces (in the same order in
//     every unit of a row, so they agree) and writes its piece of y.
// Launch: any grid size, grid-stride over rows (units); warp_rows = 0, one
// block per row (unit) at a time; warp_rows = 1, one warp each (short rows:
// several rows a block, warp shuffles only). blockDim.x a multiple of 32, at
// most 512. Contiguous, 16-byte aligned rows are read (and written) 16 bytes
// a thread. NO dynamic shared memory (static scratch, <= 512 bytes).
// Numerically stable, two reads of x: the online (max, sum of exp(x - max))
// in one pass (DlbMaxSum), then y = exp(x - max) * (1 / sum). Accumulates in A.
// A row of all -inf, or containing NaN, gives NaN, as torch does.
// In-place (y == x with identical layout) is safe.
#include "dlbridge_common.cuh"

// Threads a block, at most: the unrolled 16-byte loads and the statistics take
// more than the 64 registers a thread of a 1024-thread block may have.
#define DLB_SOFTMAX_MAX_BLOCK 512

// The (max, sum) of `n` elements from xr, `cs` apart, in every thread of the group.
template <typename E>
__device__ __forceinline__ DlbMaxSum<typename E::acc> dlb_softmax_stats(const DlbRowGroup& g,
                                                                        const typename E::storage* xr, long long cs,
                                                                        long long n, typename E::acc* sm,
                                                                        typename E::acc* ss) {
    typedef typename E::acc A;
    DlbMaxSum<A> t = dlb_ms_init<A>();
    dlb_row_each<E>(g, xr, cs, n, [&](long long, A v) { dlb_ms_add(t, v); });
    return dlb_ms_group_reduce(g, t, sm, ss);
}

template <typename E>
__device__ __forceinline__ void dlb_softmax(const typename E::storage* x, const DlbIndexer& xrows,
                                            long long xcs, typename E::storage* y,
                                            const DlbIndexer& yrows, long long ycs, long long rows,
                                            long long cols, int warp_rows) {
    typedef typename E::acc A;
    __shared__ A sm[32], ss[32];
    const DlbRowGroup g = dlb_row_group(warp_rows);
    // A block's threads run the same number of iterations (rows from
    // blockIdx.x); a warp's likewise (rows from its warp index).
    for (long long r = g.first; r < rows; r += g.step) {
        const typename E::storage* xr = x + dlb_offset(xrows, r);
        typename E::storage* yr = y + dlb_offset(yrows, r);
        const DlbMaxSum<A> t = dlb_softmax_stats<E>(g, xr, xcs, cols, sm, ss);
        const A inv = dlb_rcp(t.s);  // one reciprocal a row, not a division an element
        dlb_row_map<E>(g, xr, xcs, yr, ycs, cols, [&](A v) { return dlb_exp(v - t.m) * inv; });
    }
}

template <typename E>
__device__ __forceinline__ void dlb_softmax_partial(const typename E::storage* x, const DlbIndexer& xrows,
                                                    long long xcs, typename E::acc* partial, long long rows,
                                                    long long cols, long long splits, long long chunk,
                                                    int warp_rows) {
    typedef typename E::acc A;
    __shared__ A sm[32], ss[32];
    const DlbRowGroup g = dlb_row_group(warp_rows);
    dlb_each_piece(g, rows, splits, chunk, cols, [&](long long u, const DlbPiece& p) {
        const DlbMaxSum<A> t =
            dlb_softmax_stats<E>(g, x + dlb_offset(xrows, p.row) + p.first * xcs, xcs, p.cols, sm, ss);
        if (g.tid == 0) {
            partial[2 * u] = t.m;
            partial[2 * u + 1] = t.s;
        }
    });
}

template <typename E>
__device__ __forceinline__ void dlb_softmax_finish(const typename E::storage* x, const DlbIndexer& xrows,
                                                   long long xcs, typename E::storage* y,
                                                   const DlbIndexer& yrows, long long ycs,
                                                   const typename E::acc* partial, long long rows, long long cols,
                                                   long long splits, long long chunk, int warp_rows) {
    typedef typename E::acc A;
    __shared__ A sm[32], ss[32];
    const DlbRowGroup g = dlb_row_group(warp_rows);
    dlb_each_piece(g, rows, splits, chunk, cols, [&](long long, const DlbPiece& p) {
        // The row's pieces merged by the group (a thread's share, then the
        // group's tree: the same order in every unit of the row).
        DlbMaxSum<A> t = dlb_ms_init<A>();
        const A* q = partial + 2 * p.row * splits;
        for (long long k = g.tid; k < splits; k += g.n) t = dlb_ms_merge(t, DlbMaxSum<A>{q[2 * k], q[2 * k + 1]});
        t = dlb_ms_group_reduce(g, t, sm, ss);
        const typename E::storage* xr = x + dlb_offset(xrows, p.row) + p.first * xcs;
        typename E::storage* yr = y + dlb_offset(yrows, p.row) + p.first * ycs;
        const A inv = dlb_rcp(t.s);
        dlb_row_map<E>(g, xr, xcs, yr, ycs, p.cols, [&](A v) { return dlb_exp(v - t.m) * inv; });
    });
}

#define DLB_SOFTMAX(T, E)                                                                                    \
    extern "C" __global__ void __launch_bounds__(DLB_SOFTMAX_MAX_BLOCK, 1) dlbridge_softmax_##T(const E::storage* x, DlbIndexer xrows, long long xcol_stride, \
                                                    E::storage* y, DlbIndexer yrows, long long ycol_stride,   \
                                                    long long rows, long long cols, int warp_rows) {          \
        dlb_softmax<E>(x, xrows, xcol_stride, y, yrows, ycol_stride, rows, cols, warp_rows);                  \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(DLB_SOFTMAX_MAX_BLOCK, 1) dlbridge_softmax_partial_##T(const E::storage* x, DlbIndexer xrows,            \
                                                            long long xcol_stride, E::acc* partial,           \
                                                            long long rows, long long cols, long long splits, \
                                                            long long chunk, int warp_rows) {                 \
        dlb_softmax_partial<E>(x, xrows, xcol_stride, partial, rows, cols, splits, chunk, warp_rows);       \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(DLB_SOFTMAX_MAX_BLOCK, 1) dlbridge_softmax_finish_##T(                                                  \
        const E::storage* x, DlbIndexer xrows, long long xcol_stride, E::storage* y, DlbIndexer yrows,         \
        long long ycol_stride, const E::acc* partial, long long rows, long long cols, long long splits,       \
        long long chunk, int warp_rows) {                                                                    \
        dlb_softmax_finish<E>(x, xrows, xcol_stride, y, yrows, ycol_stride, partial, rows, cols, splits, chunk, \
                              warp_rows);                                                                    \
    }

DLB_SOFTMAX(f32, DlbF32)
DLB_SOFTMAX(f64, DlbF64)
DLB_SOFTMAX(f16, DlbF16)
DLB_SOFTMAX(bf16, DlbBF16)

// softmax.cu -- dlbridge built-in softmax over the last dimension.
//
// Entry points: dlbridge_softmax_{f32,f64,f16,bf16}
//   (const T* x, DlbIndexer xrows, long long xcol_stride,
//    T* y, DlbIndexer yrows, long long ycol_stride,
//    long long rows, long long cols)
// rows = product of all dims but the last, cols = the last dim.
// Row r of x starts at x + dlb_offset(xrows, r), its elements are xcol_stride
// elements apart (likewise for y). xrows / yrows describe the batch dims only
// (ndim 0 -> a single row at offset 0).
// Launch: any grid size (grid-stride over rows, one block per row at a time);
// blockDim.x a power of two in [32, 1024] (any multiple of 32 <= 1024 works);
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
                                            long long cols) {
    typedef typename E::acc A;
    __shared__ A scratch[32];
    const A ninf = dlb_neg_inf<A>();
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const typename E::storage* xr = x + dlb_offset(xrows, r);
        typename E::storage* yr = y + dlb_offset(yrows, r);

        A m = ninf;
        for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = dlb_max(m, E::load(xr[c * xcs]));
        m = dlb_block_reduce(m, DlbMaxOp(), ninf, scratch);

        A s = A(0);
        for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += dlb_exp(E::load(xr[c * xcs]) - m);
        s = dlb_block_reduce(s, DlbSumOp(), A(0), scratch);

        for (long long c = threadIdx.x; c < cols; c += blockDim.x)
            yr[c * ycs] = E::store(dlb_exp(E::load(xr[c * xcs]) - m) / s);
    }
}

#define DLB_SOFTMAX(NAME, E)                                                                      \
    extern "C" __global__ void NAME(const E::storage* x, DlbIndexer xrows, long long xcol_stride, \
                                    E::storage* y, DlbIndexer yrows, long long ycol_stride,       \
                                    long long rows, long long cols) {                             \
        dlb_softmax<E>(x, xrows, xcol_stride, y, yrows, ycol_stride, rows, cols);                 \
    }

DLB_SOFTMAX(dlbridge_softmax_f32, DlbF32)
DLB_SOFTMAX(dlbridge_softmax_f64, DlbF64)
DLB_SOFTMAX(dlbridge_softmax_f16, DlbF16)
DLB_SOFTMAX(dlbridge_softmax_bf16, DlbBF16)

// elementwise.cu -- dlbridge built-in elementwise kernels.
//
// Entry points: dlbridge_{add,mul,relu,gelu}_{f32,f64,f16,bf16}
//   binary: (const T* a, DlbIndexer ia, const T* b, DlbIndexer ib,
//            T* out, DlbIndexer io, long long n, int contiguous)
//   unary:  (const T* x, DlbIndexer ix, T* out, DlbIndexer io,
//            long long n, int contiguous)
// T = float / double / unsigned short (f16 bits) / unsigned short (bf16 bits).
// All indexers carry the OUTPUT's logical shape and the operand's own element
// strides (broadcast dims have stride 0). contiguous == 1: every operand is
// dense row-major with the same layout, offset(i) == i; then, when every
// pointer is 16-byte aligned, each thread reads and writes 16 bytes at a time.
// Any grid / block size works (grid-stride loop), no shared memory.
// In-place use (out aliasing an input with the same layout) is allowed, so no
// __restrict__.
#include "dlbridge_common.cuh"

struct DlbAdd {
    template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
};
struct DlbMul {
    template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a * b; }
};
struct DlbRelu {
    // x > 0 ? x : 0, but NaN propagates (x != x only for NaN).
    template <typename A> __device__ __forceinline__ A operator()(A x) const {
        return (x > A(0) || x != x) ? x : A(0);
    }
};
struct DlbGelu {
    // exact form: 0.5 * x * (1 + erf(x / sqrt(2)))
    __device__ __forceinline__ float operator()(float x) const {
        return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
    }
    __device__ __forceinline__ double operator()(double x) const {
        return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
    }
};

// Runs `f(i)` for every i < n this thread owns (a grid-stride loop).
template <typename F>
__device__ __forceinline__ void dlb_grid_stride(long long n, F f) {
    const long long start = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = start; i < n; i += step) {
        f(i);
    }
}

// Runs `f(q)` for every 16-byte chunk q < chunks this thread owns, then
// `g(i)` for the elements from chunks * V on (the tail): contiguous operands
// whose pointers are all 16-byte aligned are read and written 16 bytes a
// thread (ld.global.v4 / st.global.v4).
template <typename F, typename G>
__device__ __forceinline__ void dlb_chunked(long long n, int V, F f, G g) {
    const long long chunks = n / V;
    dlb_grid_stride(chunks, f);
    const long long tail = chunks * V;
    dlb_grid_stride(n - tail, [&](long long i) { g(tail + i); });
}

template <typename E, typename Op>
__device__ __forceinline__ void dlb_binary(const typename E::storage* a, const DlbIndexer& ia,
                                           const typename E::storage* b, const DlbIndexer& ib,
                                           typename E::storage* out, const DlbIndexer& io,
                                           long long n, int contiguous) {
    Op op;
    typedef typename E::storage S;
    constexpr int V = 16 / (int)sizeof(S);
    if (contiguous && dlb_aligned16(a) && dlb_aligned16(b) && dlb_aligned16(out)) {
        dlb_chunked(
            n, V,
            [&](long long q) {
                S ea[V], eb[V], eo[V];
                dlb_load16(a, q, ea);
                dlb_load16(b, q, eb);
#pragma unroll
                for (int j = 0; j < V; ++j) eo[j] = E::store(op(E::load(ea[j]), E::load(eb[j])));
                dlb_store16(out, q, eo);
            },
            [&](long long i) { out[i] = E::store(op(E::load(a[i]), E::load(b[i]))); });
    } else if (contiguous) {
        dlb_grid_stride(n, [&](long long i) { out[i] = E::store(op(E::load(a[i]), E::load(b[i]))); });
    } else {
        dlb_grid_stride(n, [&](long long i) {
            out[dlb_offset(io, i)] = E::store(op(E::load(a[dlb_offset(ia, i)]), E::load(b[dlb_offset(ib, i)])));
        });
    }
}

template <typename E, typename Op>
__device__ __forceinline__ void dlb_unary(const typename E::storage* x, const DlbIndexer& ix,
                                          typename E::storage* out, const DlbIndexer& io,
                                          long long n, int contiguous) {
    Op op;
    typedef typename E::storage S;
    constexpr int V = 16 / (int)sizeof(S);
    if (contiguous && dlb_aligned16(x) && dlb_aligned16(out)) {
        dlb_chunked(
            n, V,
            [&](long long q) {
                S ex[V], eo[V];
                dlb_load16(x, q, ex);
#pragma unroll
                for (int j = 0; j < V; ++j) eo[j] = E::store(op(E::load(ex[j])));
                dlb_store16(out, q, eo);
            },
            [&](long long i) { out[i] = E::store(op(E::load(x[i]))); });
    } else if (contiguous) {
        dlb_grid_stride(n, [&](long long i) { out[i] = E::store(op(E::load(x[i]))); });
    } else {
        dlb_grid_stride(n, [&](long long i) { out[dlb_offset(io, i)] = E::store(op(E::load(x[dlb_offset(ix, i)]))); });
    }
}

#define DLB_BINARY(NAME, OP, E)                                                                  \
    extern "C" __global__ void NAME(const E::storage* a, DlbIndexer ia, const E::storage* b,     \
                                    DlbIndexer ib, E::storage* out, DlbIndexer io, long long n,  \
                                    int contiguous) {                                            \
        dlb_binary<E, OP>(a, ia, b, ib, out, io, n, contiguous);                                 \
    }

#define DLB_UNARY(NAME, OP, E)                                                                   \
    extern "C" __global__ void NAME(const E::storage* x, DlbIndexer ix, E::storage* out,         \
                                    DlbIndexer io, long long n, int contiguous) {                \
        dlb_unary<E, OP>(x, ix, out, io, n, contiguous);                                         \
    }

DLB_BINARY(dlbridge_add_f32, DlbAdd, DlbF32)
DLB_BINARY(dlbridge_add_f64, DlbAdd, DlbF64)
DLB_BINARY(dlbridge_add_f16, DlbAdd, DlbF16)
DLB_BINARY(dlbridge_add_bf16, DlbAdd, DlbBF16)

DLB_BINARY(dlbridge_mul_f32, DlbMul, DlbF32)
DLB_BINARY(dlbridge_mul_f64, DlbMul, DlbF64)
DLB_BINARY(dlbridge_mul_f16, DlbMul, DlbF16)
DLB_BINARY(dlbridge_mul_bf16, DlbMul, DlbBF16)

DLB_UNARY(dlbridge_relu_f32, DlbRelu, DlbF32)
DLB_UNARY(dlbridge_relu_f64, DlbRelu, DlbF64)
DLB_UNARY(dlbridge_relu_f16, DlbRelu, DlbF16)
DLB_UNARY(dlbridge_relu_bf16, DlbRelu, DlbBF16)

DLB_UNARY(dlbridge_gelu_f32, DlbGelu, DlbF32)
DLB_UNARY(dlbridge_gelu_f64, DlbGelu, DlbF64)
DLB_UNARY(dlbridge_gelu_f16, DlbGelu, DlbF16)
DLB_UNARY(dlbridge_gelu_bf16, DlbGelu, DlbBF16)

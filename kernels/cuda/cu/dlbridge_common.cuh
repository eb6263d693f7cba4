// dlbridge_common.cuh -- shared definitions for the built-in dlbridge CUDA kernels.
//
// Self-contained: compiles with NVRTC alone (no CUDA toolkit headers, no
// --include-path). The launcher passes this file to nvrtcCreateProgram as a
// header named "dlbridge_common.cuh".
//
// See README.md in this directory for the full calling convention.
#pragma once

#define DLB_MAX_DIMS 8

// Strided view description, passed BY VALUE as a kernel parameter.
//   shape:   the OUTPUT's (logical) shape, innermost dim last (entries >= ndim unused)
//   strides: the operand's strides in ELEMENTS (may be 0 or negative)
//   ndim:    0..DLB_MAX_DIMS; 0 means a scalar view (every offset is 0)
// Layout (must match the Rust #[repr(C)] mirror): 8 x i64, 8 x i64, i32,
// 4 bytes tail padding -> 136 bytes, alignment 8.
struct DlbIndexer {
    long long shape[DLB_MAX_DIMS];
    long long strides[DLB_MAX_DIMS];
    int ndim;
};

static_assert(sizeof(DlbIndexer) == 136, "DlbIndexer must be 136 bytes");
static_assert(alignof(DlbIndexer) == 8, "DlbIndexer must be 8-byte aligned");

// Element offset of flat (row-major) logical index i, 0 <= i < prod(shape).
// Innermost dim first; the outermost dim takes the remaining quotient
// without a division. ndim <= 0 -> 0. The loop is fully unrolled over
// constant indices so the struct stays in parameter space / registers.
__device__ __forceinline__ long long dlb_offset(const DlbIndexer& ix, long long i) {
    const int nd = ix.ndim;
    long long off = 0;
#pragma unroll
    for (int d = DLB_MAX_DIMS - 1; d >= 1; --d) {
        if (d < nd) {
            const long long s = ix.shape[d];
            const long long q = i / s;
            off += (i - q * s) * ix.strides[d];
            i = q;
        }
    }
    if (nd >= 1) off += i * ix.strides[0];
    return off;
}

// ---------------------------------------------------------------------------
// Element types. `storage` is what lives in memory, `acc` is the compute /
// accumulation type. f16 and bf16 are stored as raw 16-bit patterns
// (unsigned short) so no cuda_fp16.h / cuda_bf16.h is needed.
// ---------------------------------------------------------------------------

// IEEE binary16 <-> float via PTX cvt (valid on every architecture NVRTC
// targets; the same instructions cuda_fp16.hpp uses). cvt.rn = round to
// nearest even; NaN stays NaN (canonical 0x7fff), +-inf / overflow -> +-inf.
// (DLB_HOST_TEST: CPU emulation used only by the optional host-side test.)
#ifndef DLB_HOST_TEST
__device__ __forceinline__ float dlb_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short dlb_f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
__device__ __forceinline__ float dlb_f16_to_f32(unsigned short h) { return (float)dlb_host_bits_to_half(h); }
__device__ __forceinline__ unsigned short dlb_f32_to_f16(float f) { return dlb_host_half_to_bits((_Float16)f); }
#endif

// bfloat16 <-> float in software (cvt.rn.bf16.f32 needs sm_80; this works on
// all targets). bf16 is the top half of a float.
__device__ __forceinline__ float dlb_bf16_to_f32(unsigned short h) {
    return __uint_as_float(((unsigned int)h) << 16);
}
__device__ __forceinline__ unsigned short dlb_f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        // NaN: keep sign and (truncated) payload, force the quiet bit so the
        // result can never collapse into an infinity.
        return (unsigned short)((u >> 16) | 0x0040u);
    }
    // Round to nearest, ties to even. Finite values that round past the
    // largest bf16 correctly carry into the exponent and become +-inf.
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

struct DlbF32 {
    typedef float storage;
    typedef float acc;
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
};
struct DlbF64 {
    typedef double storage;
    typedef double acc;
    static __device__ __forceinline__ double load(double v) { return v; }
    static __device__ __forceinline__ double store(double v) { return v; }
};
struct DlbF16 {
    typedef unsigned short storage;
    typedef float acc;
    static __device__ __forceinline__ float load(unsigned short v) { return dlb_f16_to_f32(v); }
    static __device__ __forceinline__ unsigned short store(float v) { return dlb_f32_to_f16(v); }
};
struct DlbBF16 {
    typedef unsigned short storage;
    typedef float acc;
    static __device__ __forceinline__ float load(unsigned short v) { return dlb_bf16_to_f32(v); }
    static __device__ __forceinline__ unsigned short store(float v) { return dlb_f32_to_bf16(v); }
};

// ---------------------------------------------------------------------------
// Scalar math helpers overloaded on the accumulator type.
// ---------------------------------------------------------------------------
__device__ __forceinline__ float dlb_exp(float x) { return expf(x); }
__device__ __forceinline__ double dlb_exp(double x) { return exp(x); }
__device__ __forceinline__ float dlb_erf(float x) { return erff(x); }
__device__ __forceinline__ double dlb_erf(double x) { return erf(x); }
// 1 / x, rounded to nearest (IEEE), without the division's subroutine call.
__device__ __forceinline__ float dlb_rcp(float x) { return __frcp_rn(x); }
__device__ __forceinline__ double dlb_rcp(double x) { return __drcp_rn(x); }
__device__ __forceinline__ float dlb_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double dlb_max(double a, double b) { return fmax(a, b); }

template <typename A> __device__ __forceinline__ A dlb_neg_inf();
template <> __device__ __forceinline__ float dlb_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double dlb_neg_inf<double>() {
    return __longlong_as_double((long long)0xfff0000000000000ULL);
}

// ---------------------------------------------------------------------------
// Block-wide reduction: warp shuffles + a static 32-slot shared array.
// Requirements: blockDim.x is a multiple of 32 and <= 1024 (the launcher uses
// a power of two in [32, 1024]); every thread of the block must call it
// (it contains __syncthreads). Every thread receives the full result, and all
// threads compute it in the same order, so the value is identical block-wide.
// The leading __syncthreads makes back-to-back calls sharing `scratch` safe.
// ---------------------------------------------------------------------------
struct DlbSumOp {
    template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
};
struct DlbMaxOp {
    template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return dlb_max(a, b); }
};

template <typename A, typename Op>
__device__ __forceinline__ A dlb_warp_reduce(A v, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename A, typename Op>
__device__ __forceinline__ A dlb_block_reduce(A v, Op op, A identity, A* scratch /* [32] shared */) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned nwarps = (blockDim.x + 31u) >> 5;
    v = dlb_warp_reduce(v, op);
    __syncthreads();  // previous users of scratch are done reading
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = (lane < nwarps) ? scratch[lane] : identity;
    return dlb_warp_reduce(v, op);
}

// ---------------------------------------------------------------------------
// Row traversal for the last-dim kernels: which threads share a row (a warp,
// or the whole block), and the row's elements read 16 bytes at a time where
// the row is contiguous and 16-byte aligned (ld.global.v4), element by
// element otherwise.
// ---------------------------------------------------------------------------
struct DlbRowGroup {
    unsigned tid;       // this thread's index among the row's threads
    unsigned n;         // threads per row: 32 (a warp) or blockDim.x
    long long first;    // the first row of this group
    long long step;     // rows between this group's rows
    bool warp;          // a warp per row: reductions are warp shuffles only
};

__device__ __forceinline__ DlbRowGroup dlb_row_group(int warp_rows) {
    DlbRowGroup g;
    if (warp_rows) {
        g.tid = threadIdx.x & 31u;
        g.n = 32u;
        g.first = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
        g.step = ((long long)gridDim.x * blockDim.x) >> 5;
        g.warp = true;
    } else {
        g.tid = threadIdx.x;
        g.n = blockDim.x;
        g.first = blockIdx.x;
        g.step = gridDim.x;
        g.warp = false;
    }
    return g;
}

// The group's reduction: every thread of the group gets the result. A block
// reduction synchronises the block (every thread must call it); a warp
// reduction only the warp.
template <typename A, typename Op>
__device__ __forceinline__ A dlb_group_reduce(const DlbRowGroup& g, A v, Op op, A identity, A* scratch) {
    return g.warp ? dlb_warp_reduce(v, op) : dlb_block_reduce(v, op, identity, scratch);
}

template <typename T>
__device__ __forceinline__ bool dlb_aligned16(const T* p) {
    return (((unsigned long long)p) & 15ull) == 0;
}

// The elements of the q-th 16-byte chunk of p (16-byte aligned): one 16-byte
// load, unpacked through memcpy (no type punning: registers either way once
// compiled).
template <typename S, int V>
__device__ __forceinline__ void dlb_load16(const S* p, long long q, S (&e)[V]) {
    static_assert(sizeof(S) * V == 16, "a chunk is 16 bytes");
    const uint4 raw = reinterpret_cast<const uint4*>(p)[q];
    memcpy(e, &raw, sizeof raw);
}

// Writes e as the q-th 16-byte chunk of p (16-byte aligned): one 16-byte store.
template <typename S, int V>
__device__ __forceinline__ void dlb_store16(S* p, long long q, const S (&e)[V]) {
    static_assert(sizeof(S) * V == 16, "a chunk is 16 bytes");
    uint4 raw;
    memcpy(&raw, e, sizeof raw);
    reinterpret_cast<uint4*>(p)[q] = raw;
}

// f(c, value) for every element c of a row of `cols` elements `cs` apart,
// each thread of the group its share: 16-byte chunks (threads take chunks
// round robin, so a warp reads consecutive 16-byte pieces) when contiguous
// and aligned, then the tail one by one.
template <typename E, typename F>
__device__ __forceinline__ void dlb_row_each(const DlbRowGroup& g, const typename E::storage* xr, long long cs,
                                             long long cols, F f) {
    typedef typename E::storage S;
    constexpr int V = 16 / (int)sizeof(S);
    if (cs == 1 && dlb_aligned16(xr)) {
        const long long chunks = cols / V;
        for (long long q = g.tid; q < chunks; q += g.n) {
            S e[V];
            dlb_load16(xr, q, e);
#pragma unroll
            for (int j = 0; j < V; ++j) f(q * V + j, E::load(e[j]));
        }
        for (long long c = chunks * V + g.tid; c < cols; c += g.n) f(c, E::load(xr[c]));
    } else {
        for (long long c = g.tid; c < cols; c += g.n) f(c, E::load(xr[c * cs]));
    }
}

// y[c] = h(x[c]) over a row, 16 bytes at a time when both rows are
// contiguous and aligned.
template <typename E, typename H>
__device__ __forceinline__ void dlb_row_map(const DlbRowGroup& g, const typename E::storage* xr, long long xcs,
                                            typename E::storage* yr, long long ycs, long long cols, H h) {
    typedef typename E::storage S;
    constexpr int V = 16 / (int)sizeof(S);
    if (xcs == 1 && ycs == 1 && dlb_aligned16(xr) && dlb_aligned16(yr)) {
        const long long chunks = cols / V;
        for (long long q = g.tid; q < chunks; q += g.n) {
            S e[V], o[V];
            dlb_load16(xr, q, e);
#pragma unroll
            for (int j = 0; j < V; ++j) o[j] = E::store(h(E::load(e[j])));
            dlb_store16(yr, q, o);
        }
        for (long long c = chunks * V + g.tid; c < cols; c += g.n) yr[c] = E::store(h(E::load(xr[c])));
    } else {
        for (long long c = g.tid; c < cols; c += g.n) yr[c * ycs] = E::store(h(E::load(xr[c * xcs])));
    }
}

// ---------------------------------------------------------------------------
// Online softmax statistics: (m, s) stands for sum_i exp(x_i - m) over the
// elements seen, m their maximum. One pass gives both, and partial results
// (per thread, per warp, per piece of a split row) merge in any grouping.
// -inf elements add nothing (an all -inf row keeps m = -inf, and its
// exp(x - m) is NaN, as torch gives); a NaN element makes m NaN, which every
// merge keeps, so the whole row becomes NaN, as torch gives.
// ---------------------------------------------------------------------------
template <typename A>
struct DlbMaxSum {
    A m, s;
};

template <typename A>
__device__ __forceinline__ DlbMaxSum<A> dlb_ms_init() {
    return DlbMaxSum<A>{dlb_neg_inf<A>(), A(0)};
}

// Adds one element.
template <typename A>
__device__ __forceinline__ void dlb_ms_add(DlbMaxSum<A>& t, A v) {
    if (v > t.m) {
        // exp(v - v): 1, or NaN for v = +inf (as exp(inf - inf) is in torch's sum).
        t.s = t.s * dlb_exp(t.m - v) + ((v - v) + A(1));  // m = -inf: exp(-inf) = 0
        t.m = v;
    } else if (v != v) {
        t.m = v;  // NaN poisons the row
    } else if (t.m != dlb_neg_inf<A>()) {
        t.s += dlb_exp(v - t.m);  // NaN m stays NaN through s
    }
}

// Merges two partial statistics.
template <typename A>
__device__ __forceinline__ DlbMaxSum<A> dlb_ms_merge(DlbMaxSum<A> a, DlbMaxSum<A> b) {
    if (a.m != a.m) return a;
    if (b.m != b.m) return b;
    const A m = dlb_max(a.m, b.m);
    if (m == dlb_neg_inf<A>()) return DlbMaxSum<A>{m, a.s + b.s};
    return DlbMaxSum<A>{m, a.s * dlb_exp(a.m - m) + b.s * dlb_exp(b.m - m)};
}

template <typename A>
__device__ __forceinline__ DlbMaxSum<A> dlb_ms_warp_reduce(DlbMaxSum<A> t) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        DlbMaxSum<A> u;
        u.m = __shfl_xor_sync(0xffffffffu, t.m, o);
        u.s = __shfl_xor_sync(0xffffffffu, t.s, o);
        // Both lanes of a pair merge in the same order, so every lane ends with the same value.
        t = (threadIdx.x & o) ? dlb_ms_merge(u, t) : dlb_ms_merge(t, u);
    }
    return t;
}

// The group's merged statistics, in every thread of the group (a block
// reduction synchronises the block: every thread must call it).
template <typename A>
__device__ __forceinline__ DlbMaxSum<A> dlb_ms_group_reduce(const DlbRowGroup& g, DlbMaxSum<A> t, A* scratch_m,
                                                           A* scratch_s) {
    t = dlb_ms_warp_reduce(t);
    if (g.warp) return t;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned nwarps = (blockDim.x + 31u) >> 5;
    __syncthreads();
    if (lane == 0) {
        scratch_m[warp] = t.m;
        scratch_s[warp] = t.s;
    }
    __syncthreads();
    t = lane < nwarps ? DlbMaxSum<A>{scratch_m[lane], scratch_s[lane]} : dlb_ms_init<A>();
    return dlb_ms_warp_reduce(t);
}

// ---------------------------------------------------------------------------
// Split rows: a long row in few rows is cut into `splits` pieces of `chunk`
// columns (a multiple of 8, so a piece of a 16-byte aligned contiguous row
// starts 16-byte aligned), one group each; a first pass writes each piece's
// partial result to a workspace, a second pass combines a row's pieces.
// Unit u is piece u % splits of row u / splits.
// ---------------------------------------------------------------------------
struct DlbPiece {
    long long row;    // the row
    long long first;  // its first column
    long long cols;   // its columns (0 past the row's end)
};

__device__ __forceinline__ DlbPiece dlb_piece(long long u, long long splits, long long chunk, long long cols) {
    DlbPiece p;
    p.row = u / splits;
    p.first = (u - p.row * splits) * chunk;
    const long long left = cols - p.first;
    p.cols = left < 0 ? 0 : (left < chunk ? left : chunk);
    return p;
}

// f(u, piece) for each unit u of the `rows * splits` (a piece each) this group
// takes.
template <typename F>
__device__ __forceinline__ void dlb_each_piece(const DlbRowGroup& g, long long rows, long long splits, long long chunk,
                                               long long cols, F f) {
    const long long units = rows * splits;
    for (long long u = g.first; u < units; u += g.step) f(u, dlb_piece(u, splits, chunk, cols));
}

// The acc-typed traits (what a workspace of partial results holds).
template <typename A> struct DlbAccOf;
template <> struct DlbAccOf<float> { typedef DlbF32 traits; };
template <> struct DlbAccOf<double> { typedef DlbF64 traits; };

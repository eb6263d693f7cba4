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

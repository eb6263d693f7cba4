#ifndef DLBRIDGE_COMPILE_HALFS_H_
#define DLBRIDGE_COMPILE_HALFS_H_
// float16 and bfloat16 for both backends. The CUDA spellings (`__host__`,
// `__device__`, `__forceinline__`) and `uint16_t`/`uint32_t` come from the
// including runtime (NVRTC defines the former itself); alone, from here.
#if !defined(__CUDACC_RTC__) && !defined(__CUDACC__)
#include <cstdint>
#ifndef __host__
#define __host__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __forceinline__
#define __forceinline__ inline
#endif
#endif

// ---- float16 (f16) and bfloat16 (bf16): storage types computed in float ----
#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
__device__ __forceinline__ uint32_t dlbridge_f2u(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float dlbridge_u2f(uint32_t u) { return __uint_as_float(u); }
#else
inline uint32_t dlbridge_f2u(float f) { uint32_t u; __builtin_memcpy(&u, &f, 4); return u; }
inline float dlbridge_u2f(uint32_t u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
#if defined(__FLT16_MAX__) && !defined(DLBRIDGE_SOFT_HALF)
#define DLBRIDGE_NATIVE_F16 1
#endif
#endif

// float -> f16 bits, round to nearest even (NaN -> quiet NaN, sign kept).
__host__ __device__ __forceinline__ uint16_t dlbridge_f32_to_f16(float f) {
#if defined(DLBRIDGE_NATIVE_F16)
  _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  __builtin_memcpy(&b, &h, 2);
  return b;
#else
  uint32_t u = dlbridge_f2u(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  uint32_t o;
  if (u >= 0x47800000u) {  // >= 65536 (rounds to inf), inf or NaN
    o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {  // below 2^-14: an f16 subnormal or zero; the FPU rounds
    o = dlbridge_f2u(dlbridge_u2f(u) + 0.5f) - 0x3f000000u;
  } else {
    o = (u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13;  // rebias, round to nearest even
  }
  return static_cast<uint16_t>(o | sign);
#endif
}

// f16 bits -> float (exact).
__host__ __device__ __forceinline__ float dlbridge_f16_to_f32(uint16_t h) {
#if defined(DLBRIDGE_NATIVE_F16)
  _Float16 v;
  __builtin_memcpy(&v, &h, 2);
  return static_cast<float>(v);
#else
  uint32_t o = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exp = o & 0x0f800000u;
  o += 0x38000000u;  // rebias 15 -> 127
  if (exp == 0x0f800000u) {
    o += 0x38000000u;  // inf / NaN: exponent all ones
  } else if (exp == 0) {
    o = dlbridge_f2u(dlbridge_u2f(o + 0x00800000u) - dlbridge_u2f(0x38800000u));  // subnormal: renormalise
  }
  return dlbridge_u2f(o | (static_cast<uint32_t>(h & 0x8000u) << 16));
#endif
}

// float -> bf16 bits, round to nearest even (NaN -> quiet NaN, sign kept).
__host__ __device__ __forceinline__ uint16_t dlbridge_f32_to_bf16(float f) {
  const uint32_t u = dlbridge_f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// bf16 bits -> float (exact).
__host__ __device__ __forceinline__ float dlbridge_bf16_to_f32(uint16_t h) { return dlbridge_u2f(static_cast<uint32_t>(h) << 16); }

// A double rounded to float "to odd" (the float nearest below in magnitude,
// its last bit set when inexact): rounding that to f16 or bf16 (at least 13
// bits narrower) to nearest even gives the correctly rounded result, where
// double -> float -> half would round twice (65519.99999999 would be inf).
__host__ __device__ __forceinline__ float dlbridge_f64_to_f32_odd(double d) {
  float f = static_cast<float>(d);
  if (static_cast<double>(f) == d || d != d) return f;
  uint32_t u = dlbridge_f2u(f);
  if ((static_cast<double>(f) < 0 ? -static_cast<double>(f) : static_cast<double>(f)) > (d < 0 ? -d : d)) u -= 1;
  return dlbridge_u2f(u | 1u);
}
#if defined(DLBRIDGE_NATIVE_F16)
__host__ __device__ __forceinline__ uint16_t dlbridge_f64_to_f16(double d) {
  _Float16 h = static_cast<_Float16>(d);
  uint16_t b;
  __builtin_memcpy(&b, &h, 2);
  return b;
}
#else
__host__ __device__ __forceinline__ uint16_t dlbridge_f64_to_f16(double d) { return dlbridge_f32_to_f16(dlbridge_f64_to_f32_odd(d)); }
#endif
__host__ __device__ __forceinline__ uint16_t dlbridge_f64_to_bf16(double d) { return dlbridge_f32_to_bf16(dlbridge_f64_to_f32_odd(d)); }

// Built from a float or a double (each rounded once), and from anything else
// that converts to float (an integer, the other 2-byte type).
#define DLBRIDGE_HALF_TYPE(NAME, TO, TO_D, FROM)                                                    \
  struct NAME {                                                                                      \
    uint16_t bits;                                                                                   \
    NAME() = default;                                                                                \
    __host__ __device__ __forceinline__ NAME(float f) : bits(TO(f)) {}                               \
    __host__ __device__ __forceinline__ NAME(double d) : bits(TO_D(d)) {}                            \
    template <typename U>                                                                            \
    __host__ __device__ __forceinline__ NAME(const U& v, decltype(static_cast<float>(v))* = nullptr) \
        : bits(TO(static_cast<float>(v))) {}                                                         \
    __host__ __device__ __forceinline__ operator float() const { return FROM(bits); }               \
    __host__ __device__ __forceinline__ NAME& operator+=(float v) { return *this = float(*this) + v; } \
    __host__ __device__ __forceinline__ NAME& operator-=(float v) { return *this = float(*this) - v; } \
    __host__ __device__ __forceinline__ NAME& operator*=(float v) { return *this = float(*this) * v; } \
    __host__ __device__ __forceinline__ NAME& operator/=(float v) { return *this = float(*this) / v; } \
    __host__ __device__ __forceinline__ NAME& operator++() { return *this += 1.0f; }                 \
    __host__ __device__ __forceinline__ NAME& operator--() { return *this -= 1.0f; }                 \
    __host__ __device__ __forceinline__ NAME operator++(int) { NAME old = *this; *this += 1.0f; return old; } \
    __host__ __device__ __forceinline__ NAME operator--(int) { NAME old = *this; *this -= 1.0f; return old; } \
  };                                                                                                 \
  static_assert(sizeof(NAME) == 2, #NAME " is not 2 bytes");
DLBRIDGE_HALF_TYPE(float16, dlbridge_f32_to_f16, dlbridge_f64_to_f16, dlbridge_f16_to_f32)
DLBRIDGE_HALF_TYPE(bfloat16, dlbridge_f32_to_bf16, dlbridge_f64_to_bf16, dlbridge_bf16_to_f32)
#undef DLBRIDGE_HALF_TYPE
#endif  // DLBRIDGE_COMPILE_HALFS_H_

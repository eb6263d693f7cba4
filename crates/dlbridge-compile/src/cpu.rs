//! The CPU backend: C++17 generated from a kernel specification.
//!
//! One specialisation (one binding of the type placeholders) is one complete
//! translation unit that, compiled with `c++ -O3 -std=c++17 -shared -fPIC
//! -pthread`, is a dlbridge plugin through the existing C ABI: the plugin
//! header is pasted in (no `-I` needed), and `dlbridge_plugin()` returns a
//! table with one CPU kernel whose signature is the specialised signature.
//!
//! # What a kernel body sees (CuPy's semantics)
//! * `typedef <ctype> T;` for every bound placeholder (f16/bf16 are the
//!   `float16`/`bfloat16` of `crate::halfs`, computed in float; c64/c128 are
//!   `std::complex`, mixing with real values as CuPy's `thrust::complex`
//!   does); CUDA spellings compile
//!   (`__device__`, `__host__`, `__global__`, `__forceinline__`); `<cmath>`,
//!   `<cstdint>`, `<algorithm>`, `<complex>` are included and
//!   using-declarations make `<cmath>`'s functions, `min`, `max`, `swap`,
//!   `complex` and its functions and `numeric_limits` work unqualified (not
//!   `using namespace std`: a preamble's `clamp` or `gcd` is not ambiguous);
//!   CUDA's `rsqrt`/`rsqrtf`, `max`/`min` (fmax/fmin on floats, also of two
//!   different arithmetic types), and `atomicAdd`/`atomicMax`/`atomicMin`/`atomicExch`/
//!   `atomicCAS` (for raw outputs written from many threads) are defined; the
//!   user's `preamble` follows at file scope.
//! * Elementwise: `i` (the flat C-order index over the broadcast shape),
//!   `const T& x` per non-raw input (`T&` when `mut`), `T& z` per output, a
//!   `dlbridge::Raw<T>` per raw input (`r[k]` with a flat C-order index into
//!   `r`'s own shape, bounds-checked, any strides; `r.size()`, `r.ndim()`,
//!   `r.shape()[d]`), `_ind.size()` and `n` (the broadcast size; a parameter
//!   named `n` takes that name over). `loop_prep`
//!   runs once per thread before its part of the loop, `after_loop` once after.
//! * Reduction: `map_expr` sees the inputs' elements (`const T& x`), `_i` (the
//!   flat index of the output element), `_j` and `_J` (the reduced element's
//!   flat index and the reduced count); `reduce_expr` sees `a` and `b`;
//!   `post_map_expr` sees `a`, the outputs (`T& y`), `_i` and `_J` (so a mean
//!   is `y = a / _J`); both see CuPy's `_in_ind` and `_out_ind` (`.size()`:
//!   the input's and the output's element counts); `_type_reduce` is the
//!   reduce type.
//!
//! # How it runs
//! Elementwise: non-raw operands are broadcast (right-aligned; a missing dim
//! or a dim of size 1 gets stride 0), dims of size 1 are dropped and
//! adjacent dims merged where every operand allows it. When that leaves one
//! dim with unit strides everywhere the loop is a plain `p[j]` loop the
//! compiler vectorises; otherwise an inner loop over the last dim with each
//! operand's stride and a multi-index counter for the outer dims (no division
//! per element). Reductions: the caller has permuted the reduced axes of
//! every input to its last dims; the outputs hold the kept dims, so the
//! number of reduced dims is `x.ndim - y.ndim`.
//!
//! Above 2^16 elements (of work) the range is split into contiguous chunks
//! run on `std::thread`s — `DLBRIDGE_NUM_THREADS` (a positive integer, read
//! once) or as many as the CPUs the process may run on (its affinity mask,
//! else `std::thread::hardware_concurrency()`), the calling thread running the
//! first chunk; 1 means the calling thread does everything. A
//! reduction with few outputs and many reduced elements splits each output's
//! reduction into per-thread partials combined with `reduce_expr`.
//!
//! Every exception (the body's, a thread that cannot start, a raw index out of
//! range) becomes `DLBRIDGE_ERR_RUNTIME` with its `what()` in the error buffer
//! (`DLBRIDGE_ERR_MEMORY` for `std::bad_alloc`): none escapes the entry point.
//!
//! # Diagnostics
//! Each piece of user text is preceded by `#line 1 "operation"` (or
//! `"preamble"`, `"loop_prep"`, `"after_loop"`, `"map_expr"`,
//! `"reduce_expr"`, `"post_map_expr"`, `"identity"`, `"reduce_type"`) and
//! followed by `#line N "dlbridge_generated.cpp"` (N the true next line), so
//! the compiler reports `operation:1:5: error: ...` for the user's mistakes
//! and `dlbridge_generated.cpp:N` for the rest.

use std::fmt::Write as _;

use dlbridge_core::{DType, Error, ErrorKind, Result};

use crate::params::{ElementwiseSpec, Param, ParamType, ReductionSpec, bound_dtype, cpu_ctype, numpy_dtype};

/// The plugin header, pasted at the top of every generated source.
pub(crate) const PLUGIN_H: &str = include_str!("../../dlbridge-registry/include/dlbridge/plugin.h");

/// CuPy's `_in_ind` and `_out_ind` in a reduction's map and post-map
/// (`_in_ind.size() / _out_ind.size()` is the reduced count, CuPy's mean
/// idiom), from the reduced count `_J` and the number of outputs `_M`.
pub(crate) const IN_OUT_IND: [&str; 3] =
    ["  const dlbridge::Size _in_ind(_M * _J), _out_ind(_M);", "  (void)_in_ind;", "  (void)_out_ind;"];

/// The file name diagnostics use for generated (non-user) lines.
pub const GENERATED_FILE: &str = "dlbridge_generated.cpp";

/// Elements (units of work) below which a kernel never starts a thread; each
/// thread gets at least half as many.
pub const PARALLEL_THRESHOLD: usize = 1 << 16;

/// libm functions glibc's libmvec has vector variants of (one argument, then two).
const LIBMVEC_1: &[&str] = &[
    "sin", "cos", "tan", "exp", "log", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "expm1",
    "log1p", "log2", "log10", "exp2", "exp10", "cbrt",
];
const LIBMVEC_2: &[&str] = &["pow", "atan2", "hypot"];

/// `#pragma omp declare simd` declarations of the libmvec functions, for the
/// double and float versions, each pragma on its own line before its own
/// declaration (GCC misattributes several `_Pragma`s expanded onto one line),
/// inside `#if defined(DLBRIDGE_LIBMVEC)`.
fn libmvec_declarations() -> String {
    let mut s = String::from("#if defined(DLBRIDGE_LIBMVEC)\nextern \"C\" {\n");
    for (names, args_d, args_f) in [(LIBMVEC_1, "double", "float"), (LIBMVEC_2, "double, double", "float, float")] {
        for f in names {
            s.push_str(&format!("#pragma omp declare simd notinbranch\ndouble {f}({args_d});\n"));
            s.push_str(&format!("#pragma omp declare simd notinbranch\nfloat {f}f({args_f});\n"));
        }
    }
    s.push_str("}\n#endif");
    s
}

/// The runtime every generated source carries: CUDA spellings, includes,
/// `dlbridge::Raw`, `dlbridge::Indexer`, the iteration plan and the thread
/// driver. Identifiers are `dlbridge`-prefixed or in `namespace dlbridge`.
const RUNTIME: &str = r##"
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <complex>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <new>
#include <optional>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
#if defined(__linux__)
#include <sched.h>
#endif

// CUDA spellings, so that bodies written for CuPy compile as they are.
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#if !defined(__GNUC__) && !defined(__restrict__)
#define __restrict__ __restrict
#endif
#ifndef CUDART_INF_F
#define CUDART_INF_F (std::numeric_limits<float>::infinity())
#define CUDART_INF (std::numeric_limits<double>::infinity())
#define CUDART_NAN_F (std::numeric_limits<float>::quiet_NaN())
#define CUDART_NAN (std::numeric_limits<double>::quiet_NaN())
#endif

// Vector variants of libm functions (glibc's libmvec: at most 4 ulp, glibc's
// documented bound for them): with these declarations the compiler vectorises
// loops that call tanh, exp, erf, ... instead of calling the scalar function
// per element. Only when the toolchain found libmvec (it then defines
// DLBRIDGE_LIBMVEC and links -lmvec).
@LIBMVEC@

// The names CUDA (and CuPy's headers) give a kernel body unqualified: <cmath>'s
// functions with their float overloads, min/max/swap, <complex>'s complex and
// its functions, numeric_limits. Not `using namespace std`: a preamble helper
// named like another std function (clamp, gcd, lcm, ...) would be ambiguous.
using std::abs; using std::fabs; using std::fmod; using std::remainder; using std::remquo; using std::fma;
using std::fmax; using std::fmin; using std::fdim; using std::nan; using std::exp; using std::exp2;
using std::expm1; using std::log; using std::log10; using std::log2; using std::log1p; using std::pow;
using std::sqrt; using std::cbrt; using std::hypot; using std::sin; using std::cos; using std::tan;
using std::asin; using std::acos; using std::atan; using std::atan2; using std::sinh; using std::cosh;
using std::tanh; using std::asinh; using std::acosh; using std::atanh; using std::erf; using std::erfc;
using std::tgamma; using std::lgamma; using std::ceil; using std::floor; using std::trunc; using std::round;
using std::lround; using std::llround; using std::nearbyint; using std::rint; using std::lrint;
using std::llrint; using std::frexp; using std::ldexp; using std::modf; using std::scalbn;
using std::scalbln; using std::ilogb; using std::logb; using std::nextafter; using std::nexttoward;
using std::copysign; using std::fpclassify; using std::isfinite; using std::isinf; using std::isnan;
using std::isnormal; using std::signbit; using std::isgreater; using std::isgreaterequal; using std::isless;
using std::islessequal; using std::islessgreater; using std::isunordered; using std::min; using std::max;
using std::swap; using std::complex; using std::real; using std::imag; using std::conj; using std::arg;
using std::norm; using std::polar; using std::proj; using std::numeric_limits;

// CUDA device functions CuPy bodies use, with CUDA's meaning. rsqrt under
// names of our own (a newer C library may declare C23's rsqrt itself).
inline float dlbridge_rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float dlbridge_rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline double dlbridge_rsqrt(double x) { return 1.0 / std::sqrt(x); }
#define rsqrtf dlbridge_rsqrtf
#define rsqrt dlbridge_rsqrt
@HALF_TYPES@
// Arithmetic for max/min: the built-in arithmetic types and float16/bfloat16
// (which compute in float).
template <typename A>
struct dlbridge_arith : std::is_arithmetic<A> {};
template <>
struct dlbridge_arith<float16> : std::true_type {};
template <>
struct dlbridge_arith<bfloat16> : std::true_type {};
template <typename A, typename B>
using dlbridge_common = decltype(+std::declval<A>() + +std::declval<B>());
// max/min of two different arithmetic types (CUDA has such overloads: max(x, 0.0)
// with a float x); two integers of one type keep std::max/std::min.
template <typename A, typename B,
          std::enable_if_t<!std::is_same<A, B>::value && dlbridge_arith<A>::value && dlbridge_arith<B>::value, int> = 0>
inline dlbridge_common<A, B> max(A a, B b) {
  using C = dlbridge_common<A, B>;
  if constexpr (std::is_floating_point<C>::value) return std::fmax(static_cast<C>(a), static_cast<C>(b));  // CUDA's: NaN loses
  else return std::max<C>(static_cast<C>(a), static_cast<C>(b));
}
template <typename A, typename B,
          std::enable_if_t<!std::is_same<A, B>::value && dlbridge_arith<A>::value && dlbridge_arith<B>::value, int> = 0>
inline dlbridge_common<A, B> min(A a, B b) {
  using C = dlbridge_common<A, B>;
  if constexpr (std::is_floating_point<C>::value) return std::fmin(static_cast<C>(a), static_cast<C>(b));  // CUDA's: NaN loses
  else return std::min<C>(static_cast<C>(a), static_cast<C>(b));
}
// max/min of two values of one floating type are CUDA's fmax/fmin too (a NaN
// loses, whatever the order): std::max's answer would depend on the order
// (and a reduction's max(a, b) would drop a block after a NaN).
inline float max(float a, float b) { return std::fmax(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline float min(float a, float b) { return std::fmin(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline float16 max(float16 a, float16 b) { return float16(std::fmax(float(a), float(b))); }
inline float16 min(float16 a, float16 b) { return float16(std::fmin(float(a), float(b))); }
inline bfloat16 max(bfloat16 a, bfloat16 b) { return bfloat16(std::fmax(float(a), float(b))); }
inline bfloat16 min(bfloat16 a, bfloat16 b) { return bfloat16(std::fmin(float(a), float(b))); }
// complex64/complex128 are std::complex<float>/<double> (`complex<float>`, as
// CuPy spells them). std::complex only mixes with its own value type; CuPy's
// (thrust::complex) mixes with any arithmetic type and with the other complex,
// promoting (complex<float> * 2.0 is a complex<double>): so here too.
template <typename T, typename U>
using dlbridge_cx = std::complex<decltype(std::declval<T>() + std::declval<U>())>;
#define DLBRIDGE_COMPLEX_MIX(OP)                                                                                \
  template <typename T, typename U, std::enable_if_t<!std::is_same<T, U>::value && dlbridge_arith<U>::value, int> = 0> \
  inline dlbridge_cx<T, U> operator OP(const std::complex<T>& a, U b) {                                        \
    using C = dlbridge_cx<T, U>;                                                                                \
    return C(a) OP typename C::value_type(b);                                                                   \
  }                                                                                                             \
  template <typename T, typename U, std::enable_if_t<!std::is_same<T, U>::value && dlbridge_arith<U>::value, int> = 0> \
  inline dlbridge_cx<T, U> operator OP(U a, const std::complex<T>& b) {                                        \
    using C = dlbridge_cx<T, U>;                                                                                \
    return typename C::value_type(a) OP C(b);                                                                   \
  }                                                                                                             \
  template <typename T, typename U, std::enable_if_t<!std::is_same<T, U>::value, int> = 0>                      \
  inline dlbridge_cx<T, U> operator OP(const std::complex<T>& a, const std::complex<U>& b) {                   \
    using C = dlbridge_cx<T, U>;                                                                                \
    return C(a) OP C(b);                                                                                        \
  }
DLBRIDGE_COMPLEX_MIX(+)
DLBRIDGE_COMPLEX_MIX(-)
DLBRIDGE_COMPLEX_MIX(*)
DLBRIDGE_COMPLEX_MIX(/)
#undef DLBRIDGE_COMPLEX_MIX
// CuPy's isnan/isinf/isfinite of a complex: of either part (isfinite: of both).
template <typename T>
inline bool isnan(const std::complex<T>& z) { return std::isnan(z.real()) || std::isnan(z.imag()); }
template <typename T>
inline bool isinf(const std::complex<T>& z) { return std::isinf(z.real()) || std::isinf(z.imag()); }
template <typename T>
inline bool isfinite(const std::complex<T>& z) { return std::isfinite(z.real()) && std::isfinite(z.imag()); }
// atomicAdd/atomicMax/atomicMin/atomicExch/atomicCAS for the threads a CPU
// kernel runs on (a raw output written by many elements: a histogram). They
// return the old value, as CUDA's do; the value converts to the pointee's type
// (atomicAdd(&h[k], 1) on a float array), as in CUDA.
// (dlbridge_same keeps the value out of deduction; every atomic instantiates it.)
template <typename T>
struct dlbridge_same {
  static_assert(sizeof(T) <= 8, "atomics on a 16-byte type (complex128) are not supported on the CPU");
  using type = T;
};
template <typename T>
inline T atomicAdd(T* p, typename dlbridge_same<T>::type v) {
  if constexpr (std::is_integral<T>::value) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
  } else {
    T old, want;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do {
      want = old + v;
    } while (!__atomic_compare_exchange(p, &old, &want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
  }
}
template <typename T>
inline T atomicExch(T* p, typename dlbridge_same<T>::type v) {
  T old;
  __atomic_exchange(p, &v, &old, __ATOMIC_RELAXED);
  return old;
}
template <typename T>
inline T atomicCAS(T* p, typename dlbridge_same<T>::type expected, typename dlbridge_same<T>::type desired) {
  __atomic_compare_exchange(p, &expected, &desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;
}
// atomicMax/atomicMin: replace the value while `v` is better than it.
template <typename T, typename Better>
inline T dlbridge_atomic_keep(T* p, T v, Better better) {
  T old;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  while (better(v, old) && !__atomic_compare_exchange(p, &old, &v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <typename T>
inline T atomicMax(T* p, typename dlbridge_same<T>::type v) {
  return dlbridge_atomic_keep(p, v, [](const T& a, const T& b) { return b < a; });
}
template <typename T>
inline T atomicMin(T* p, typename dlbridge_same<T>::type v) {
  return dlbridge_atomic_keep(p, v, [](const T& a, const T& b) { return a < b; });
}

namespace dlbridge {

/// `_in_ind` / `_out_ind` of a reduction: only their size.
struct Size {
  explicit Size(ptrdiff_t n) : n_(n) {}
  ptrdiff_t size() const { return n_; }

 private:
  ptrdiff_t n_;
};

/// `_ind`: the iteration space of an elementwise kernel (CuPy's CIndexer).
class Indexer {
 public:
  Indexer(ptrdiff_t size, int ndim, const int64_t* shape) : size_(size), ndim_(ndim), shape_(shape) {}
  /// Number of elements the loop runs over (the broadcast size).
  ptrdiff_t size() const { return size_; }
  /// Number of dims of the broadcast shape.
  int ndim() const { return ndim_; }
  /// The broadcast shape.
  const int64_t* shape() const { return shape_; }

 private:
  ptrdiff_t size_;
  int ndim_;
  const int64_t* shape_;
};

/// A `raw` argument: indexed by the body with a flat C-order index into its
/// own shape (bounds-checked), honouring its strides. `E` is `const T` unless
/// the parameter is `mut`.
template <typename E>
class Raw {
 public:
  Raw(const DLTensor* t, const char* name)
      : data_(reinterpret_cast<E*>(static_cast<char*>(t->data) + t->byte_offset)),
        ndim_(t->ndim),
        shape_(t->shape),
        strides_(t->strides),
        name_(name) {
    ptrdiff_t expect = 1;
    for (int d = ndim_ - 1; d >= 0; --d) {
      if (shape_[d] != 1 && strides_[d] != expect) contiguous_ = false;
      expect *= static_cast<ptrdiff_t>(shape_[d]);
    }
    size_ = expect;
  }
  /// Number of elements.
  ptrdiff_t size() const { return size_; }
  /// Number of dims.
  int ndim() const { return ndim_; }
  /// The shape (`ndim()` entries).
  const int64_t* shape() const { return shape_; }
  /// The strides in elements (`ndim()` entries).
  const int64_t* strides() const { return strides_; }
  /// Address of element [0, .., 0].
  E* data() const { return data_; }
  /// Element `k` in C order.
  E& operator[](ptrdiff_t k) const {
    if (k < 0 || k >= size_) out_of_range(k);
    if (contiguous_) return data_[k];
    ptrdiff_t off = 0;
    for (int d = ndim_ - 1; d > 0; --d) {
      const ptrdiff_t s = static_cast<ptrdiff_t>(shape_[d]);
      off += (k % s) * static_cast<ptrdiff_t>(strides_[d]);
      k /= s;
    }
    if (ndim_ > 0) off += k * static_cast<ptrdiff_t>(strides_[0]);
    return data_[off];
  }

 private:
  [[noreturn]] void out_of_range(ptrdiff_t k) const {
    char msg[256];
    std::snprintf(msg, sizeof msg, "raw argument `%s`: index %td is out of range for its %td elements", name_, k, size_);
    throw std::out_of_range(msg);
  }
  E* data_;
  int ndim_;
  const int64_t* shape_;
  const int64_t* strides_;
  const char* name_;
  ptrdiff_t size_ = 0;
  bool contiguous_ = true;
};

namespace detail {

constexpr int kMaxDims = 64;
constexpr ptrdiff_t kParallelMin = DLBRIDGE_PARALLEL_MIN;  // less work than this: one thread
constexpr ptrdiff_t kGrain = ptrdiff_t(1) << 15;        // at least this much work per thread

inline int32_t fail(char* err, size_t err_len, int32_t code, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
inline int32_t fail(char* err, size_t err_len, int32_t code, const char* fmt, ...) {
  if (err != nullptr && err_len > 0) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return code;
}

/// `[2, 3]`
struct ShapeText {
  char text[192];
  ShapeText(int ndim, const int64_t* shape) {
    size_t at = 0;
    text[at++] = '[';
    int d = 0;
    for (; d < ndim && at + 32 < sizeof text; ++d) {
      at += static_cast<size_t>(std::snprintf(text + at, sizeof text - at, d ? ", %lld" : "%lld", static_cast<long long>(shape[d])));
    }
    std::snprintf(text + at, sizeof text - at, d < ndim ? ", ...]" : "]");
  }
};

/// Checks what the registry already checked against the signature (defence
/// in depth): count, non-NULL, CPU, dtype, rank, strides present.
inline int32_t check_tensors(const char* kernel, DLTensor* const* t, int32_t nt, int32_t want, const char* const* names,
                             const DLDataType* types, char* err, size_t err_len) {
  if (t == nullptr || nt != want) {
    return fail(err, err_len, DLBRIDGE_ERR_VALUE, "%s: called with %d tensors, expected %d", kernel, static_cast<int>(nt),
                static_cast<int>(want));
  }
  for (int32_t k = 0; k < nt; ++k) {
    const DLTensor* x = t[k];
    if (x == nullptr) return fail(err, err_len, DLBRIDGE_ERR_VALUE, "%s: `%s` is NULL", kernel, names[k]);
    if (x->device.device_type != 1) {
      return fail(err, err_len, DLBRIDGE_ERR_BUFFER, "%s: `%s` is on device type %d, this kernel runs on the CPU", kernel,
                  names[k], static_cast<int>(x->device.device_type));
    }
    if (x->dtype.code != types[k].code || x->dtype.bits != types[k].bits || x->dtype.lanes != types[k].lanes) {
      return fail(err, err_len, DLBRIDGE_ERR_TYPE, "%s: `%s` has dtype (code %d, bits %d, lanes %d), expected (code %d, bits %d, lanes %d)",
                  kernel, names[k], x->dtype.code, x->dtype.bits, x->dtype.lanes, types[k].code, types[k].bits, types[k].lanes);
    }
    if (x->ndim < 0 || x->ndim > kMaxDims) {
      return fail(err, err_len, DLBRIDGE_ERR_VALUE, "%s: `%s` has %d dims, at most %d are supported", kernel, names[k],
                  static_cast<int>(x->ndim), kMaxDims);
    }
    if (x->ndim > 0 && (x->shape == nullptr || x->strides == nullptr)) {
      return fail(err, err_len, DLBRIDGE_ERR_VALUE, "%s: `%s` has NULL shape or strides", kernel, names[k]);
    }
  }
  return DLBRIDGE_OK;
}

/// Address of element [0, .., 0].
inline void* base_of(const DLTensor* t) { return static_cast<char*>(t->data) + t->byte_offset; }

/// A collapsed iteration space over K operands: dims of size 1 dropped,
/// adjacent dims merged where every operand's strides allow it.
template <int K>
struct Walk {
  int nd = 1;
  int64_t shape[kMaxDims];
  int64_t stride[K][kMaxDims];
  ptrdiff_t size = 1;
  bool unit = false;  // one dim, unit stride for every operand

  /// From a full shape of `ndim` dims and each operand's strides over it.
  void init(int ndim, const int64_t* full, const int64_t (*st)[kMaxDims]) {
    size = 1;
    for (int d = 0; d < ndim; ++d) size *= static_cast<ptrdiff_t>(full[d]);
    nd = 0;
    for (int d = 0; d < ndim; ++d) {
      if (full[d] == 1) continue;
      if (nd > 0) {
        bool merge = true;
        for (int k = 0; k < K; ++k) merge = merge && stride[k][nd - 1] == st[k][d] * full[d];
        if (merge) {
          shape[nd - 1] *= full[d];
          for (int k = 0; k < K; ++k) stride[k][nd - 1] = st[k][d];
          continue;
        }
      }
      shape[nd] = full[d];
      for (int k = 0; k < K; ++k) stride[k][nd] = st[k][d];
      ++nd;
    }
    if (nd == 0) {
      nd = 1;
      shape[0] = 1;
      for (int k = 0; k < K; ++k) stride[k][0] = 1;
    }
    unit = nd == 1;
    for (int k = 0; k < K; ++k) unit = unit && stride[k][0] == 1;
  }

  /// Each operand's stride along the innermost dim.
  int64_t inner(int k) const { return stride[k][nd - 1]; }

  /// Each operand's element offset at flat position `pos` (C order).
  void offsets(ptrdiff_t pos, ptrdiff_t* off) const {
    for (int k = 0; k < K; ++k) off[k] = 0;
    for (int d = nd - 1; d >= 0; --d) {
      const ptrdiff_t i = pos % shape[d];
      pos /= shape[d];
      for (int k = 0; k < K; ++k) off[k] += i * stride[k][d];
    }
  }

  /// Calls f(first, len, off) for every run of positions in [begin, end)
  /// along the innermost dim; `off` holds each operand's offset at `first`.
  /// Divides only once, at `begin`.
  template <typename F>
  void for_runs(ptrdiff_t begin, ptrdiff_t end, F&& f) const {
    if (begin >= end) return;
    int64_t idx[kMaxDims];
    ptrdiff_t off[K];
    for (int k = 0; k < K; ++k) off[k] = 0;
    ptrdiff_t rem = begin;
    for (int d = nd - 1; d >= 0; --d) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
      for (int k = 0; k < K; ++k) off[k] += idx[d] * stride[k][d];
    }
    const int last = nd - 1;
    ptrdiff_t pos = begin;
    for (;;) {
      const ptrdiff_t len = std::min<ptrdiff_t>(shape[last] - idx[last], end - pos);
      f(pos, len, static_cast<const ptrdiff_t*>(off));
      pos += len;
      if (pos >= end) return;
      for (int k = 0; k < K; ++k) off[k] -= idx[last] * stride[k][last];
      idx[last] = 0;
      for (int d = last - 1; d >= 0; --d) {
        ++idx[d];
        for (int k = 0; k < K; ++k) off[k] += stride[k][d];
        if (idx[d] < shape[d]) break;
        for (int k = 0; k < K; ++k) off[k] -= shape[d] * stride[k][d];
        idx[d] = 0;
      }
    }
  }
};

/// How many threads: DLBRIDGE_NUM_THREADS (a positive integer, read once),
/// else the CPUs this process may run on (its affinity mask, as Rust's
/// available_parallelism counts them), else the hardware's.
inline int num_threads() {
  static const int n = [] {
    if (const char* s = std::getenv("DLBRIDGE_NUM_THREADS")) {
      char* end = nullptr;
      errno = 0;
      const long v = std::strtol(s, &end, 10);
      while (end != nullptr && (*end == ' ' || *end == '\t' || *end == '\n')) ++end;
      if (errno == 0 && end != s && end != nullptr && *end == '\0' && v > 0) return static_cast<int>(std::min<long>(v, 1024));
    }
#if defined(__linux__) && defined(CPU_COUNT)
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) > 0) return std::min(CPU_COUNT(&cpus), 1024);
#endif
    const unsigned h = std::thread::hardware_concurrency();
    return h == 0 ? 1 : static_cast<int>(std::min<unsigned>(h, 1024));
  }();
  return n;
}

/// How many chunks `n` items costing `cost` each are split into.
inline int chunks_for(ptrdiff_t n, ptrdiff_t cost) {
  if (n < 2) return 1;
  const ptrdiff_t work = cost > 0 && n > std::numeric_limits<ptrdiff_t>::max() / cost ? std::numeric_limits<ptrdiff_t>::max()
                                                                                     : n * std::max<ptrdiff_t>(cost, 1);
  if (work < kParallelMin) return 1;
  ptrdiff_t w = num_threads();
  w = std::min(w, work / kGrain);
  w = std::min(w, n);
  return static_cast<int>(std::max<ptrdiff_t>(w, 1));
}

/// Joins its threads when it goes out of scope (also when unwinding).
struct Joiner {
  std::vector<std::thread> threads;
  ~Joiner() {
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }
};

/// Runs f(chunk, begin, end) over `chunks` contiguous pieces of [0, n): the
/// first on the calling thread, the others on threads of their own (or here,
/// when no thread can be started). Rethrows the first piece's exception.
template <typename F>
void parallel_chunks(ptrdiff_t n, int chunks, F&& f) {
  if (chunks <= 1) {
    dlbridge_divguard::guarded([&] { f(0, ptrdiff_t(0), n); });
    return;
  }
  const ptrdiff_t step = n / chunks, extra = n % chunks;
  auto begin_of = [&](int c) { return c * step + std::min<ptrdiff_t>(c, extra); };
  std::vector<std::exception_ptr> errors(static_cast<size_t>(chunks));
  auto run = [&](int c) noexcept {
    try {
      dlbridge_divguard::guarded([&] { f(c, begin_of(c), begin_of(c + 1)); });
    } catch (...) {
      errors[static_cast<size_t>(c)] = std::current_exception();
    }
  };
  {
    Joiner join;
    join.threads.reserve(static_cast<size_t>(chunks - 1));
    for (int c = 1; c < chunks; ++c) {
      try {
        join.threads.emplace_back(run, c);
      } catch (...) {
        run(c);  // no thread to be had: run the piece here
      }
    }
    run(0);
  }
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

/// Broadcasts the non-raw operands `ops` (tensor indices) to one shape;
/// operands with `exact[k]` (outputs, `mut` inputs) must have it already.
/// Fills each operand's strides over it (0 where it repeats).
inline int32_t broadcast(const char* kernel, DLTensor* const* t, const char* const* names, const int* ops, const bool* exact,
                         int count, int64_t* shape, int* ndim, int64_t (*st)[kMaxDims], char* err, size_t err_len) {
  int nd = 0;
  for (int k = 0; k < count; ++k) nd = std::max(nd, static_cast<int>(t[ops[k]]->ndim));
  for (int d = 0; d < nd; ++d) shape[d] = 1;
  for (int k = 0; k < count; ++k) {
    const DLTensor* x = t[ops[k]];
    const int lead = nd - x->ndim;
    for (int d = 0; d < x->ndim; ++d) {
      const int64_t s = x->shape[d];
      int64_t& b = shape[lead + d];
      if (s == b || s == 1) continue;
      if (b == 1) {
        b = s;
        continue;
      }
      const ShapeText have(x->ndim, x->shape), so_far(nd, shape);
      return fail(err, err_len, DLBRIDGE_ERR_VALUE, "%s: `%s` of shape %s does not broadcast with %s", kernel, names[ops[k]],
                  have.text, so_far.text);
    }
  }
  for (int k = 0; k < count; ++k) {
    const DLTensor* x = t[ops[k]];
    bool same = x->ndim == nd;
    for (int d = 0; same && d < nd; ++d) same = x->shape[d] == shape[d];
    if (exact[k] && !same) {
      const ShapeText have(x->ndim, x->shape), want(nd, shape);
      return fail(err, err_len, DLBRIDGE_ERR_VALUE, "%s: `%s` has shape %s, but it is written and must have the broadcast shape %s",
                  kernel, names[ops[k]], have.text, want.text);
    }
    const int lead = nd - x->ndim;
    for (int d = 0; d < nd; ++d) {
      const int e = d - lead;
      st[k][d] = (e < 0 || x->shape[e] == 1) ? 0 : x->strides[e];
    }
  }
  *ndim = nd;
  return DLBRIDGE_OK;
}

/// Maps an exception in flight to an error code and message.
inline int32_t from_exception(const char* kernel, char* err, size_t err_len) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return fail(err, err_len, DLBRIDGE_ERR_MEMORY, "%s: out of memory", kernel);
  } catch (const std::exception& e) {
    return fail(err, err_len, DLBRIDGE_ERR_RUNTIME, "%s: %s", kernel, e.what());
  } catch (...) {
    return fail(err, err_len, DLBRIDGE_ERR_RUNTIME, "%s: the kernel threw an exception that is not a std::exception", kernel);
  }
}

}  // namespace detail
}  // namespace dlbridge
"##;

/// Integer division or modulo by zero in user code: an error, not a SIGFPE that
/// kills the process. With `DIVGUARD_FLAGS` (when the compiler takes them) every
/// integer `/` and `%` whose divisor is not a known non-zero constant is checked
/// (`-fsanitize=integer-divide-by-zero`, no recovery, no sanitizer runtime
/// linked), and a zero divisor calls the handler defined here, which jumps back
/// to the innermost `guarded` call of its thread; that call throws, and the
/// entry point turns the exception into an error like any other. Locals with
/// destructors between the `guarded` call and the division are not destroyed
/// (their memory may leak; a kernel body rarely has any, a `load_inline` function
/// may: a skipped `std::lock_guard` leaves its mutex locked). `INT_MIN / -1` is
/// not checked (it still traps), nor is a division in threads the user's own
/// code starts (OpenMP, std::thread): there the check traps (SIGILL).
pub(crate) const DIVGUARD: &str = r##"
#include <csetjmp>
#include <stdexcept>
namespace dlbridge_divguard {
inline thread_local std::jmp_buf* t_jmp = nullptr;
struct Restore {
  std::jmp_buf* prev;
  ~Restore() { t_jmp = prev; }
};
/// Runs f(); an integer division or modulo by zero inside it throws std::domain_error.
template <typename F>
void guarded(F&& f) {
  std::jmp_buf buf;
  Restore restore{t_jmp};
  if (setjmp(buf) != 0) throw std::domain_error("integer division or modulo by zero");
  t_jmp = &buf;
  f();
}
}  // namespace dlbridge_divguard
extern "C" __attribute__((visibility("hidden"), noreturn, used)) void __ubsan_handle_divrem_overflow_abort(void*, void*, void*) {
  if (dlbridge_divguard::t_jmp != nullptr) std::longjmp(*dlbridge_divguard::t_jmp, 1);
  __builtin_trap();
}
"##;

/// Generated source, counting lines so that `#line` directives can point
/// back at the true line.
pub(crate) struct Src {
    pub(crate) text: String,
    newlines: usize,
    file: &'static str,
}

impl Src {
    pub(crate) fn new() -> Src {
        Src::for_file(GENERATED_FILE)
    }
    /// Generated lines are numbered as `file`.
    pub(crate) fn for_file(file: &'static str) -> Src {
        Src { text: String::with_capacity(32 * 1024), newlines: 0, file }
    }
    pub(crate) fn push(&mut self, s: &str) {
        self.newlines += s.bytes().filter(|&b| b == b'\n').count();
        self.text.push_str(s);
    }
    pub(crate) fn line(&mut self, s: &str) {
        self.push(s);
        self.push("\n");
    }
    /// Returns to the generated file's own numbering.
    pub(crate) fn resync(&mut self) {
        // The directive sits on physical line `newlines + 1`, so the next
        // line is `newlines + 2`.
        let next = self.newlines + 2;
        let file = self.file;
        self.line(&format!("#line {next} \"{file}\""));
    }
    /// User text, numbered as its own file `label`, then `closer` (`;` after
    /// a statement, `)` after an expression) on a line of its own, still in
    /// the user's numbering: harmless when the text ends with one, safe
    /// after a trailing `//` comment, and an unfinished text is reported in
    /// the user's file, not in generated code.
    pub(crate) fn user(&mut self, label: &str, text: &str, closer: &str) {
        self.line(&format!("#line 1 \"{label}\""));
        self.push(text);
        if !text.ends_with('\n') {
            self.push("\n");
        }
        if !closer.is_empty() {
            self.line(closer);
        }
        self.resync();
    }
}

/// A C++ string literal holding `s` (escaped; non-ASCII as octal escapes).
pub(crate) fn c_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'?' => out.push_str("\\?"),
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
    out.push('"');
    out
}

/// One line of `text` for the kernel's description: whitespace collapsed, cut.
pub(crate) fn summary(text: &str) -> String {
    let one: Vec<&str> = text.split_whitespace().collect();
    let one = one.join(" ");
    if one.chars().count() > 120 { format!("{}...", one.chars().take(117).collect::<String>()) } else { one }
}

/// The C++ type of a parameter under the binding: the placeholder's name (a
/// typedef) or the concrete dtype's C++ type.
fn param_ctype(kind: &str, kernel: &str, p: &Param) -> Result<String> {
    match p.ty {
        ParamType::Var(c) => Ok(c.to_string()),
        ParamType::Concrete(d) => cpu_ctype(d)
            .map(str::to_owned)
            .map_err(|e| Error::Coded { kind: ErrorKind::Type, message: format!("{kind} `{kernel}`: parameter `{}`: {e}", p.name) }),
    }
}

/// `(code, bits, lanes)` of the DLDataType the tensor must have.
fn dl_type(d: DType) -> String {
    format!("{{{}, {}, {}}}", d.code() as u8, d.bits(), d.lanes())
}

/// The header comment, plugin header, runtime and typedefs of every source.
fn prologue(src: &mut Src, kind: &str, name: &str, signature: &str, vars: &[char], bind: &[(char, DType)]) -> Result<()> {
    src.resync();
    src.line(&format!("// Generated by dlbridge-compile {}: CuPy {kind} `{name}`.", env!("CARGO_PKG_VERSION")));
    let types: Vec<String> = vars
        .iter()
        .map(|c| {
            let d = bind.iter().find(|(v, _)| v == c).map(|&(_, d)| d).ok_or_else(|| unbound(kind, name, *c))?;
            Ok(format!("{c} = {d} ({})", cpu_ctype(d).map_err(|e| var_error(kind, name, *c, e))?))
        })
        .collect::<Result<_>>()?;
    if types.is_empty() {
        src.line("// No type placeholders.");
    } else {
        src.line(&format!("// Specialisation: {}.", types.join(", ")));
    }
    src.line(&format!("// Signature: {signature}"));
    src.push(PLUGIN_H);
    src.line(&format!("#define DLBRIDGE_PARALLEL_MIN {PARALLEL_THRESHOLD}"));
    src.push(DIVGUARD);
    src.push(&RUNTIME.replace("@LIBMVEC@", &libmvec_declarations()).replace("@HALF_TYPES@", crate::halfs::HALF_TYPES));
    src.line("");
    src.line("// ---- the kernel's types ----");
    for c in vars {
        let d = bind.iter().find(|(v, _)| v == c).map(|&(_, d)| d).ok_or_else(|| unbound(kind, name, *c))?;
        let ct = cpu_ctype(d).map_err(|e| var_error(kind, name, *c, e))?;
        src.line(&format!("typedef {ct} {c};"));
    }
    Ok(())
}

fn unbound(kind: &str, name: &str, c: char) -> Error {
    Error::InvalidArgument(format!("{kind} `{name}`: type placeholder `{c}` is not bound"))
}

fn var_error(kind: &str, name: &str, c: char, e: Error) -> Error {
    Error::Coded { kind: ErrorKind::Type, message: format!("{kind} `{name}`: {c}: {e}") }
}

/// The plugin table with one CPU kernel.
fn plugin_table(src: &mut Src, name: &str, signature: &str, flags: &str, doc: &str) {
    src.line("");
    src.line("// ---- the plugin table ----");
    src.line("static const DLBridgeKernel dlbridge_kernels[] = {");
    src.line(&format!("    {{{}, 1, {flags}, dlbridge_entry, {}}},", c_string(signature), c_string(doc)));
    src.line("};");
    src.line("static const DLBridgePlugin dlbridge_plugin_table = {");
    src.line("    DLBRIDGE_PLUGIN_ABI_VERSION, static_cast<uint32_t>(sizeof(DLBridgePlugin)),");
    src.line(&format!(
        "    {}, {}, static_cast<uint32_t>(sizeof(DLBridgeKernel)), 1, dlbridge_kernels,",
        c_string(&format!("dlbridge-compile:{name}")),
        c_string(env!("CARGO_PKG_VERSION"))
    ));
    src.line("};");
    src.line("extern \"C\" __attribute__((visibility(\"default\"))) const DLBridgePlugin* dlbridge_plugin(void) {");
    src.line("  return &dlbridge_plugin_table;");
    src.line("}");
}
/// The opening of `dlbridge_entry`, the same for every kind of kernel: its
/// signature, the kernel's name, and the checks of the scalars and tensors
/// the host passes (inside the `try` the caller closes).
fn entry_prologue(src: &mut Src, name: &str, all: &[&Param], bind: &[(char, DType)]) -> Result<()> {
    let kernel_lit = c_string(name);
    src.line("int32_t dlbridge_entry(DLTensor* const* _t, int32_t _nt, const DLBridgeScalar* _s, int32_t _ns, void* _stream,");
    src.line("                       char* _err, size_t _err_len) {");
    src.line(&format!("  static const char kKernel[] = {kernel_lit};"));
    src.line("  (void)_s;");
    src.line("  (void)_stream;");
    src.line("  try {");
    src.line("    using namespace dlbridge::detail;");
    tensor_tables(src, all, bind)?;
    src.line("    if (_ns != 0) return fail(_err, _err_len, DLBRIDGE_ERR_VALUE, \"%s: called with %d scalars, expected none\", kKernel, static_cast<int>(_ns));");
    src.line(&format!("    if (int32_t rc = check_tensors(kKernel, _t, _nt, {}, kNames, kTypes, _err, _err_len)) return rc;", all.len()));
    Ok(())
}

/// Names and DLDataTypes of every tensor, in call order, as C++ arrays.
fn tensor_tables(src: &mut Src, params: &[&Param], bind: &[(char, DType)]) -> Result<()> {
    let names: Vec<String> = params.iter().map(|p| c_string(&p.name)).collect();
    let types: Vec<String> = params.iter().map(|p| bound_dtype(p.ty, bind).map(dl_type)).collect::<Result<_>>()?;
    src.line(&format!("    static const char* const kNames[] = {{{}}};", names.join(", ")));
    src.line(&format!("    static const DLDataType kTypes[] = {{{}}};", types.join(", ")));
    Ok(())
}

/// The complete C++ source of one specialisation of an elementwise kernel:
/// a plugin with one CPU kernel whose signature is
/// [`ElementwiseSpec::specialised_signature`].
///
/// Errors: a binding that does not cover exactly the placeholders (Value), a
/// dtype the CPU backend has no C++ type for (Type).
pub fn elementwise_cpp(spec: &ElementwiseSpec, bind: &[(char, DType)]) -> Result<String> {
    const KIND: &str = "ElementwiseKernel";
    spec.check_bind(bind)?;
    let signature = spec.specialised_signature(bind)?;
    let name = &spec.name;
    let all: Vec<&Param> = spec.inputs.iter().chain(&spec.outputs).collect();
    let ctypes: Vec<String> = all.iter().map(|p| param_ctype(KIND, name, p)).collect::<Result<_>>()?;
    let n_in = spec.inputs.len();
    // Non-raw operands (inputs, then outputs): (tensor index, written?).
    let ops: Vec<(usize, bool)> = all.iter().enumerate().filter(|(_, p)| !p.raw).map(|(t, p)| (t, t >= n_in || p.mutable)).collect();
    let k = ops.len();

    let mut src = Src::new();
    prologue(&mut src, KIND, name, &signature, &spec.type_vars(), bind)?;
    if !spec.preamble.is_empty() {
        src.user("preamble", &spec.preamble, "");
    }
    src.line("");
    src.line("// ---- the loop ----");
    src.line("namespace {");
    src.line(&format!("constexpr int dlbridge_kOperands = {k};  // non-raw inputs, then outputs"));
    src.line("using dlbridge_Walk = dlbridge::detail::Walk<dlbridge_kOperands>;");
    src.line("");
    src.line("template <bool dlbridge_kUnit>");
    src.line("void dlbridge_chunk(const dlbridge_Walk& _w, void* const* _data, DLTensor* const* _t, const dlbridge::Indexer& _ind,");
    src.line("                    ptrdiff_t _begin, ptrdiff_t _end) {");
    src.line("  (void)_t;");
    if !all.iter().any(|p| p.name == "n") {
        // CuPy has no `n`; a parameter of that name takes it over.
        src.line("  const ptrdiff_t n = _ind.size();");
        src.line("  (void)n;");
    }
    for (t, p) in all.iter().enumerate().filter(|(_, p)| p.raw) {
        let ct = &ctypes[t];
        let elem = if p.mutable { ct.clone() } else { format!("const {ct}") };
        src.line(&format!("  const dlbridge::Raw<{elem}> {}(_t[{t}], {});", p.name, c_string(&p.name)));
    }
    if !spec.loop_prep.is_empty() {
        src.user("loop_prep", &spec.loop_prep, ";");
    }
    src.line("  _w.for_runs(_begin, _end, [&](ptrdiff_t _i0, ptrdiff_t _len, const ptrdiff_t* _off) {");
    for (o, &(t, _)) in ops.iter().enumerate() {
        let p = all[t];
        let ct = &ctypes[t];
        let qual = if t < n_in && !p.mutable { "const " } else { "" };
        // `__restrict__`: the registry refuses every overlap but an output
        // that is exactly an input (read, then written, element by element),
        // so the compiler may vectorise without runtime alias checks (which it
        // does not do around calls to vector math functions).
        src.line(&format!("    {qual}{ct}* __restrict__ const _q{o} = static_cast<{qual}{ct}*>(_data[{o}]) + _off[{o}];"));
        src.line(&format!("    const ptrdiff_t _s{o} = _w.inner({o});"));
        src.line(&format!("    (void)_s{o};"));
    }
    src.line("    for (ptrdiff_t _j = 0; _j < _len; ++_j) {");
    src.line("      const ptrdiff_t i = _i0 + _j;");
    src.line("      (void)i;");
    for (o, &(t, _)) in ops.iter().enumerate() {
        let p = all[t];
        let ct = &ctypes[t];
        let qual = if t < n_in && !p.mutable { "const " } else { "" };
        src.line(&format!("      {qual}{ct}& {} = _q{o}[dlbridge_kUnit ? _j : _j * _s{o}];", p.name));
    }
    // `do { } while (0)`: a `break` or `continue` at the top level of the
    // operation ends this element only, never the loop over the others.
    src.line("      do {");
    src.user("operation", &spec.operation, "; } while (0);");
    src.line("    }");
    src.line("  });");
    if !spec.after_loop.is_empty() {
        src.user("after_loop", &spec.after_loop, ";");
    }
    src.line("}");
    src.line("");

    entry_prologue(&mut src, name, &all, bind)?;
    let op_list: Vec<String> = ops.iter().map(|(t, _)| t.to_string()).collect();
    let exact: Vec<&str> = ops.iter().map(|&(_, w)| if w { "true" } else { "false" }).collect();
    src.line(&format!("    static const int kOps[] = {{{}}};", op_list.join(", ")));
    src.line(&format!("    static const bool kExact[] = {{{}}};", exact.join(", ")));
    src.line("    int64_t shape[kMaxDims];");
    src.line("    int nd = 0;");
    src.line("    int64_t strides[dlbridge_kOperands][kMaxDims];");
    src.line("    if (int32_t rc = broadcast(kKernel, _t, kNames, kOps, kExact, dlbridge_kOperands, shape, &nd, strides, _err, _err_len)) return rc;");
    src.line("    dlbridge_Walk w;");
    src.line("    w.init(nd, shape, strides);");
    src.line("    if (w.size == 0) return DLBRIDGE_OK;");
    src.line("    void* data[dlbridge_kOperands];");
    src.line("    for (int k = 0; k < dlbridge_kOperands; ++k) data[k] = base_of(_t[kOps[k]]);");
    src.line("    const dlbridge::Indexer ind(w.size, nd, shape);");
    src.line("    parallel_chunks(w.size, chunks_for(w.size, 1), [&](int, ptrdiff_t b, ptrdiff_t e) {");
    src.line("      if (w.unit) {");
    src.line("        dlbridge_chunk<true>(w, data, _t, ind, b, e);");
    src.line("      } else {");
    src.line("        dlbridge_chunk<false>(w, data, _t, ind, b, e);");
    src.line("      }");
    src.line("    });");
    src.line("    return DLBRIDGE_OK;");
    src.line("  } catch (...) {");
    src.line("    return dlbridge::detail::from_exception(kKernel, _err, _err_len);");
    src.line("  }");
    src.line("}");
    src.line("}  // namespace");
    // Aliasing an output with an input is only safe when every element reads
    // its own position: not with raw inputs.
    let flags = if spec.inputs.iter().any(|p| p.raw) { "0" } else { "DLBRIDGE_KERNEL_ALIAS_OUTPUTS" };
    let doc = format!("ElementwiseKernel: {}", summary(&spec.operation));
    plugin_table(&mut src, name, &signature, flags, &doc);
    Ok(src.text)
}

/// The complete C++ source of one specialisation of a reduction kernel: a
/// plugin with one CPU kernel whose signature is
/// [`ReductionSpec::specialised_signature`] (`name(x: f32[...S], y: mut
/// f32[...O])`).
///
/// The caller passes every input with its reduced axes last and the outputs
/// with the kept dims only (`y.shape == x.shape[..y.ndim]`); the kernel
/// checks that. Errors as for [`elementwise_cpp`].
pub fn reduction_cpp(spec: &ReductionSpec, bind: &[(char, DType)]) -> Result<String> {
    const KIND: &str = "ReductionKernel";
    spec.check_bind(bind)?;
    let signature = spec.specialised_signature(bind)?;
    let name = &spec.name;
    let all: Vec<&Param> = spec.inputs.iter().chain(&spec.outputs).collect();
    let ctypes: Vec<String> = all.iter().map(|p| param_ctype(KIND, name, p)).collect::<Result<_>>()?;
    let (n_in, n_out) = (spec.inputs.len(), spec.outputs.len());

    let mut src = Src::new();
    prologue(&mut src, KIND, name, &signature, &spec.type_vars(), bind)?;
    if !spec.preamble.is_empty() {
        src.user("preamble", &spec.preamble, "");
    }
    src.line("");
    src.line("// ---- the reduction ----");
    match &spec.reduce_type {
        None => src.line(&format!("typedef {} _type_reduce;", ctypes[n_in])),
        Some(t) => match numpy_dtype(t.trim()) {
            Some(d) => {
                let ct = cpu_ctype(d)
                    .map_err(|e| Error::Coded { kind: ErrorKind::Type, message: format!("{KIND} `{name}`: reduce_type: {e}") })?;
                src.line(&format!("typedef {ct} _type_reduce;"));
            }
            None => {
                src.line("typedef");
                src.user("reduce_type", t, "");
                src.line("_type_reduce;");
            }
        },
    }
    src.line("namespace {");
    if let Some(identity) = &spec.identity {
        src.line("inline _type_reduce dlbridge_identity() {");
        src.line("  return static_cast<_type_reduce>(");
        src.user("identity", identity, ");");
        src.line("}");
    }
    let in_params: Vec<String> = spec.inputs.iter().enumerate().map(|(t, p)| format!("const {}& {}", ctypes[t], p.name)).collect();
    src.line(&format!(
        "inline _type_reduce dlbridge_map({}, ptrdiff_t _i, ptrdiff_t _j, ptrdiff_t _J, ptrdiff_t _M) {{",
        in_params.join(", ")
    ));
    src.line("  (void)_i;");
    src.line("  (void)_j;");
    src.line("  (void)_J;");
    IN_OUT_IND.iter().for_each(|l| src.line(l));
    src.line("  return static_cast<_type_reduce>(");
    src.user("map_expr", &spec.map_expr, ");");
    src.line("}");
    src.line("inline _type_reduce dlbridge_reduce(const _type_reduce& a, const _type_reduce& b) {");
    src.line("  return static_cast<_type_reduce>(");
    src.user("reduce_expr", &spec.reduce_expr, ");");
    src.line("}");
    let out_params: Vec<String> = spec.outputs.iter().enumerate().map(|(m, p)| format!("{}& {}", ctypes[n_in + m], p.name)).collect();
    src.line(&format!(
        "inline void dlbridge_post_map(const _type_reduce& a, {}, ptrdiff_t _i, ptrdiff_t _J, ptrdiff_t _M) {{",
        out_params.join(", ")
    ));
    src.line("  (void)_i;");
    src.line("  (void)_J;");
    IN_OUT_IND.iter().for_each(|l| src.line(l));
    src.user("post_map_expr", &spec.post_map_expr, ";");
    src.line("}");
    src.line("");
    src.line(&format!("constexpr int dlbridge_kIn = {n_in};"));
    src.line(&format!("constexpr int dlbridge_kOut = {n_out};"));
    src.line("struct dlbridge_Ctx {");
    src.line("  dlbridge::detail::Walk<dlbridge_kIn + dlbridge_kOut> kept;  // over the outputs' elements");
    src.line("  dlbridge::detail::Walk<dlbridge_kIn> red;                   // over one output's reduced elements");
    src.line("  void* data[dlbridge_kIn + dlbridge_kOut];");
    src.line("};");
    src.line("");
    // The mapped value of reduced element `j0 + _t` of output `_i`, for
    // inputs at element offsets `_q<k>[...]`.
    let map_args = |index: &dyn Fn(usize) -> String| -> String { (0..n_in).map(index).collect::<Vec<_>>().join(", ") };
    src.line("/// The reduction of output element `_i` (input offsets `_base`) over the");
    src.line("/// reduced elements [_jb, _je), _jb < _je, starting from the first one.");
    src.line("template <bool dlbridge_kUnit>");
    src.line("_type_reduce dlbridge_fold(const dlbridge_Ctx& _c, const ptrdiff_t* _base, ptrdiff_t _i, ptrdiff_t _jb, ptrdiff_t _je) {");
    src.line("  const ptrdiff_t _J = _c.red.size;");
    src.line("  ptrdiff_t _first[dlbridge_kIn];");
    src.line("  _c.red.offsets(_jb, _first);");
    let args = map_args(&|t| format!("static_cast<const {}*>(_c.data[{t}])[_base[{t}] + _first[{t}]]", ctypes[t]));
    src.line(&format!("  _type_reduce _acc = dlbridge_map({args}, _i, _jb, _J, _c.kept.size);"));
    src.line("  _c.red.for_runs(_jb + 1, _je, [&](ptrdiff_t _j0, ptrdiff_t _len, const ptrdiff_t* _off) {");
    for (t, ct) in ctypes.iter().enumerate().take(n_in) {
        src.line(&format!("    const {ct}* const _q{t} = static_cast<const {ct}*>(_c.data[{t}]) + _base[{t}] + _off[{t}];"));
        src.line(&format!("    const ptrdiff_t _s{t} = _c.red.inner({t});"));
        src.line(&format!("    (void)_s{t};"));
    }
    let args = map_args(&|t| format!("_q{t}[dlbridge_kUnit ? _u : _u * _s{t}]"));
    src.line("    for (ptrdiff_t _u = 0; _u < _len; ++_u) {");
    src.line(&format!("      _acc = dlbridge_reduce(_acc, dlbridge_map({args}, _i, _j0 + _u, _J, _c.kept.size));"));
    src.line("    }");
    src.line("  });");
    src.line("  return _acc;");
    src.line("}");
    src.line("");
    src.line("/// The same over [_jb, _je) (empty only with an identity), in blocks of");
    src.line("/// dlbridge_kBlock whose partial results are combined in order: far less");
    src.line("/// rounding error than one long chain (reduce_expr is associative).");
    src.line("constexpr ptrdiff_t dlbridge_kBlock = 1024;");
    src.line(
        "_type_reduce dlbridge_fold_any(const dlbridge_Ctx& _c, const ptrdiff_t* _base, ptrdiff_t _i, ptrdiff_t _jb, ptrdiff_t _je) {",
    );
    src.line("  auto block = [&](ptrdiff_t b, ptrdiff_t e) {");
    src.line("    return _c.red.unit ? dlbridge_fold<true>(_c, _base, _i, b, e) : dlbridge_fold<false>(_c, _base, _i, b, e);");
    src.line("  };");
    if spec.identity.is_some() {
        src.line("  _type_reduce _acc = dlbridge_identity();");
    } else {
        src.line("  ptrdiff_t _mid = std::min(_je, _jb + dlbridge_kBlock);");
        src.line("  _type_reduce _acc = block(_jb, _mid);");
        src.line("  _jb = _mid;");
    }
    src.line("  for (ptrdiff_t b = _jb; b < _je; b += dlbridge_kBlock) {");
    src.line("    _acc = dlbridge_reduce(_acc, block(b, std::min(_je, b + dlbridge_kBlock)));");
    src.line("  }");
    src.line("  return _acc;");
    src.line("}");
    src.line("");
    src.line("/// Writes output element `_i` (operand offsets `_off`) from the reduced value.");
    src.line("void dlbridge_store(const dlbridge_Ctx& _c, const ptrdiff_t* _off, ptrdiff_t _i, const _type_reduce& _acc) {");
    let outs: Vec<String> = (0..n_out)
        .map(|m| {
            let k = n_in + m;
            format!("static_cast<{}*>(_c.data[{k}])[_off[{k}]]", ctypes[k])
        })
        .collect();
    src.line(&format!("  dlbridge_post_map(_acc, {}, _i, _c.red.size, _c.kept.size);", outs.join(", ")));
    src.line("}");
    src.line("");

    entry_prologue(&mut src, name, &all, bind)?;
    src.line("    const DLTensor* x = _t[0];");
    src.line("    const DLTensor* y = _t[dlbridge_kIn];");
    src.line("    const int nx = x->ndim, ny = y->ndim;");
    src.line("    for (int k = 1; k < dlbridge_kIn; ++k) {");
    src.line("      bool same = _t[k]->ndim == nx;");
    src.line("      for (int d = 0; same && d < nx; ++d) same = _t[k]->shape[d] == x->shape[d];");
    src.line("      if (!same) {");
    src.line("        const ShapeText a(_t[k]->ndim, _t[k]->shape), b(nx, x->shape);");
    src.line("        return fail(_err, _err_len, DLBRIDGE_ERR_VALUE, \"%s: input `%s` has shape %s, but `%s` has %s\", kKernel, kNames[k], a.text, kNames[0], b.text);");
    src.line("      }");
    src.line("    }");
    src.line("    for (int m = 0; m < dlbridge_kOut; ++m) {");
    src.line("      const DLTensor* o = _t[dlbridge_kIn + m];");
    src.line("      bool ok = o->ndim == ny && ny <= nx;");
    src.line("      for (int d = 0; ok && d < ny; ++d) ok = o->shape[d] == x->shape[d];");
    src.line("      if (!ok) {");
    src.line("        const ShapeText a(o->ndim, o->shape), b(nx, x->shape);");
    src.line("        return fail(_err, _err_len, DLBRIDGE_ERR_VALUE,");
    src.line("                    \"%s: output `%s` has shape %s; it must be the kept (leading) dims of the input shape %s, the reduced axes last\",");
    src.line("                    kKernel, kNames[dlbridge_kIn + m], a.text, b.text);");
    src.line("      }");
    src.line("    }");
    src.line("    dlbridge_Ctx c;");
    src.line("    {");
    src.line("      int64_t kept[dlbridge_kIn + dlbridge_kOut][kMaxDims];");
    src.line("      int64_t red[dlbridge_kIn][kMaxDims];");
    src.line("      for (int k = 0; k < dlbridge_kIn + dlbridge_kOut; ++k) {");
    src.line("        for (int d = 0; d < ny; ++d) kept[k][d] = _t[k]->strides[d];");
    src.line("      }");
    src.line("      for (int k = 0; k < dlbridge_kIn; ++k) {");
    src.line("        for (int d = ny; d < nx; ++d) red[k][d - ny] = _t[k]->strides[d];");
    src.line("      }");
    src.line("      c.kept.init(ny, x->shape, kept);");
    src.line("      c.red.init(nx - ny, x->shape + ny, red);");
    src.line("    }");
    src.line("    for (int k = 0; k < dlbridge_kIn + dlbridge_kOut; ++k) c.data[k] = base_of(_t[k]);");
    src.line("    const ptrdiff_t M = c.kept.size, J = c.red.size;");
    src.line("    if (M == 0) return DLBRIDGE_OK;");
    if spec.identity.is_none() {
        src.line("    if (J == 0) {");
        src.line("      return fail(_err, _err_len, DLBRIDGE_ERR_VALUE,");
        src.line("                  \"%s: the reduction is over zero elements and the kernel has no identity to start from\", kKernel);");
        src.line("    }");
    }
    src.line("    const int by_outputs = chunks_for(M, J), by_partials = chunks_for(J, 1);");
    src.line("    if (by_outputs >= num_threads() || by_partials <= by_outputs || M > 64) {");
    src.line("      parallel_chunks(M, by_outputs, [&](int, ptrdiff_t b, ptrdiff_t e) {");
    src.line("        c.kept.for_runs(b, e, [&](ptrdiff_t i0, ptrdiff_t len, const ptrdiff_t* off) {");
    src.line("          ptrdiff_t at[dlbridge_kIn + dlbridge_kOut];");
    src.line("          for (ptrdiff_t u = 0; u < len; ++u) {");
    src.line("            for (int k = 0; k < dlbridge_kIn + dlbridge_kOut; ++k) at[k] = off[k] + u * c.kept.inner(k);");
    src.line("            dlbridge_store(c, at, i0 + u, dlbridge_fold_any(c, at, i0 + u, 0, J));");
    src.line("          }");
    src.line("        });");
    src.line("      });");
    src.line("    } else {");
    src.line("      // Few outputs, long reductions: each one split into per-thread partials,");
    src.line("      // combined in order with reduce_expr (associative, as CuPy requires).");
    src.line("      std::vector<std::optional<_type_reduce>> parts(static_cast<size_t>(by_partials));");
    src.line("      ptrdiff_t at[dlbridge_kIn + dlbridge_kOut];");
    src.line("      for (ptrdiff_t o = 0; o < M; ++o) {");
    src.line("        c.kept.offsets(o, at);");
    src.line("        parallel_chunks(J, by_partials, [&](int part, ptrdiff_t b, ptrdiff_t e) {");
    src.line("          parts[static_cast<size_t>(part)] = dlbridge_fold_any(c, at, o, b, e);");
    src.line("        });");
    src.line("        // reduce_expr and post_map_expr run here, on the calling thread: guarded too.");
    src.line("        dlbridge_divguard::guarded([&] {");
    src.line("          _type_reduce acc = *parts[0];");
    src.line("          for (size_t p = 1; p < parts.size(); ++p) acc = dlbridge_reduce(acc, *parts[p]);");
    src.line("          dlbridge_store(c, at, o, acc);");
    src.line("        });");
    src.line("      }");
    src.line("    }");
    src.line("    return DLBRIDGE_OK;");
    src.line("  } catch (...) {");
    src.line("    return dlbridge::detail::from_exception(kKernel, _err, _err_len);");
    src.line("  }");
    src.line("}");
    src.line("}  // namespace");
    let doc = format!(
        "ReductionKernel: map {} | reduce {} | post {}",
        summary(&spec.map_expr),
        summary(&spec.reduce_expr),
        summary(&spec.post_map_expr)
    );
    plugin_table(&mut src, name, &signature, "0", &doc);
    Ok(src.text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_directives_point_at_the_true_next_line() {
        let spec = ElementwiseSpec::new("T x", "T z", "z = x;\n// two", "k", "int helper() { return 1; }", "", "").unwrap();
        let src = elementwise_cpp(&spec, &[('T', DType::F32)]).unwrap();
        let lines: Vec<&str> = src.lines().collect();
        let mut resyncs = 0;
        for (at, l) in lines.iter().enumerate() {
            if let Some(rest) = l.strip_prefix("#line ")
                && rest.ends_with(&format!("\"{GENERATED_FILE}\""))
            {
                let n: usize = rest.split(' ').next().unwrap().parse().unwrap();
                assert_eq!(n, at + 2, "line {}: {l}", at + 1);
                resyncs += 1;
            }
        }
        assert!(resyncs >= 3, "{resyncs}");
        assert!(src.contains("#line 1 \"operation\"\nz = x;\n// two\n; } while (0);\n"));
        assert!(src.contains("#line 1 \"preamble\"\nint helper() { return 1; }\n#line"));
    }

    #[test]
    fn string_literals_are_escaped() {
        assert_eq!(c_string("a\"b\\c??=\n\u{e9}"), "\"a\\\"b\\\\c\\?\\?=\\012\\303\\251\"");
    }

    #[test]
    fn unsupported_dtypes_are_type_errors_naming_the_placeholder_or_parameter() {
        let spec = ElementwiseSpec::new("T x", "T z", "z = x", "k", "", "", "").unwrap();
        let f32x4 = DType::new(dlbridge_core::DTypeCode::Float, 32, 4).unwrap();
        let e = elementwise_cpp(&spec, &[('T', f32x4)]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Type);
        assert!(
            e.to_string().starts_with(&format!("ElementwiseKernel `k`: T: dtype {f32x4} is not supported by the CPU backend (yet)")),
            "{e}"
        );
        for (d, ct) in
            [(DType::F16, "float16"), (DType::BF16, "bfloat16"), (DType::C64, "std::complex<float>"), (DType::C128, "std::complex<double>")]
        {
            let src = elementwise_cpp(&spec, &[('T', d)]).unwrap();
            assert!(src.contains(&format!("typedef {ct} T;")), "{d}");
        }
        let e = elementwise_cpp(&ElementwiseSpec::new("T x", "T z", "z = x", "k", "", "", "").unwrap(), &[]).unwrap_err();
        assert_eq!(e.to_string(), "ElementwiseKernel `k`: type placeholder `T` is not bound");
    }

    #[test]
    fn the_table_carries_the_specialised_signature_and_flags() {
        let spec = ElementwiseSpec::new("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse", "", "", "").unwrap();
        let src = elementwise_cpp(&spec, &[('T', DType::I32)]).unwrap();
        assert!(src.contains("{\"add_reverse(x: i32[*S], y: i32[...R0]) -> (z: i32[*S])\", 1, 0, dlbridge_entry,"), "raw: no aliasing");
        assert!(src.contains("\"dlbridge-compile:add_reverse\""));
        assert!(src.contains("typedef int32_t T;"));
        let spec = ElementwiseSpec::new("T x", "T z", "z = x", "copy", "", "", "").unwrap();
        let src = elementwise_cpp(&spec, &[('T', DType::F64)]).unwrap();
        assert!(src.contains("1, DLBRIDGE_KERNEL_ALIAS_OUTPUTS, dlbridge_entry,"));
    }
}

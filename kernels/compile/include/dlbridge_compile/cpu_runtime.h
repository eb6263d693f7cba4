#ifndef DLBRIDGE_COMPILE_CPU_RUNTIME_H_
#define DLBRIDGE_COMPILE_CPU_RUNTIME_H_
// The runtime of every CPU kernel generated from CuPy's ElementwiseKernel and
// ReductionKernel: CUDA spellings, includes, `dlbridge::Raw`,
// `dlbridge::Indexer`, the iteration plan and the thread driver. Identifiers
// are `dlbridge`-prefixed or in `namespace dlbridge`.
#include "dlbridge/plugin.h"
#include "dlbridge_compile/divguard.h"
#include "dlbridge_compile/errors.h"
#ifndef DLBRIDGE_PARALLEL_MIN
#define DLBRIDGE_PARALLEL_MIN 65536
#endif

#include <algorithm>
#include <cerrno>
#include <cfenv>
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
#include <type_traits>
#include <utility>
#include <vector>

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

#include "dlbridge_compile/libmvec.h"

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
#include "dlbridge_compile/halfs.h"
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
template <typename A, typename B>
using dlbridge_if_mixed = std::enable_if_t<!std::is_same<A, B>::value && dlbridge_arith<A>::value && dlbridge_arith<B>::value, int>;
template <bool kMax, typename A, typename B>
inline dlbridge_common<A, B> dlbridge_mixed_minmax(A a, B b) {
  using C = dlbridge_common<A, B>;
  const C x = static_cast<C>(a), y = static_cast<C>(b);
  if constexpr (std::is_floating_point<C>::value) return kMax ? std::fmax(x, y) : std::fmin(x, y);  // CUDA's: NaN loses
  else return kMax ? std::max<C>(x, y) : std::min<C>(x, y);
}
template <typename A, typename B, dlbridge_if_mixed<A, B> = 0>
inline dlbridge_common<A, B> max(A a, B b) { return dlbridge_mixed_minmax<true>(a, b); }
template <typename A, typename B, dlbridge_if_mixed<A, B> = 0>
inline dlbridge_common<A, B> min(A a, B b) { return dlbridge_mixed_minmax<false>(a, b); }
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

/// What dlbridge passes to a generated CPU kernel as its `stream` argument:
/// the thread budget of the call and a parallel loop on dlbridge's threads
/// (Rust: `dlbridge_cpu::ffi::CpuContext`, the same layout).
struct DLBridgeCpuContext {
  uint32_t struct_size;
  int32_t num_threads;
  void (*parallel_for)(int64_t parts, void (*body)(void* arg, int64_t part), void* arg);
};

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

using dlbridge_errors::fail;

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
  if (int32_t rc = dlbridge_errors::check_cpu_tensors(kernel, "kernel", t, nt, want, names, types, err, err_len)) return rc;
  for (int32_t k = 0; k < nt; ++k) {
    const DLTensor* x = t[k];
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

/// The context of the call in progress on this thread (set by the entry
/// point from its `stream` argument; NULL: one thread, the caller's).
inline thread_local const DLBridgeCpuContext* t_context = nullptr;

using FloatEnv = ::dlbridge_divguard::FloatEnv;

/// Makes `stream` the context of the entry point's call (when it is a context
/// this runtime knows: its size covers the fields read), restored on exit, as
/// is the thread's floating-point environment.
struct ContextScope {
  FloatEnv fenv;
  const DLBridgeCpuContext* previous;
  explicit ContextScope(void* stream) : previous(t_context) {
    const auto* c = static_cast<const DLBridgeCpuContext*>(stream);
    t_context = c != nullptr && c->struct_size >= sizeof(DLBridgeCpuContext) && c->parallel_for != nullptr ? c : nullptr;
  }
  ~ContextScope() { t_context = previous; }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
};

/// The threads the call may use: its context's budget, else 1.
inline int num_threads() {
  const DLBridgeCpuContext* c = t_context;
  return c != nullptr && c->num_threads > 0 ? std::min(c->num_threads, 1024) : 1;
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

/// One piece of a parallel loop, as the context's `parallel_for` calls it.
template <typename R>
void run_part(void* arg, int64_t part) {
  (*static_cast<R*>(arg))(static_cast<int>(part));
}

/// Runs f(chunk, begin, end) over `chunks` contiguous pieces of [0, n) on the
/// threads of the call's context (dlbridge's own; none are started here), or
/// one after the other on the calling thread without one. Rethrows the first
/// piece's exception.
template <typename F>
void parallel_chunks(ptrdiff_t n, int chunks, F&& f) {
  if (chunks <= 1) {
    if (std::exception_ptr e = dlbridge_divguard::captured([&] { f(0, ptrdiff_t(0), n); })) std::rethrow_exception(std::move(e));
    return;
  }
  const ptrdiff_t step = n / chunks, extra = n % chunks;
  auto begin_of = [&](int c) { return c * step + std::min<ptrdiff_t>(c, extra); };
  std::vector<std::exception_ptr> errors(static_cast<size_t>(chunks));
  auto run = [&](int c) noexcept {
    const FloatEnv fenv;
    errors[static_cast<size_t>(c)] = dlbridge_divguard::captured([&] { f(c, begin_of(c), begin_of(c + 1)); });
  };
  const DLBridgeCpuContext* ctx = t_context;
  if (ctx != nullptr) {
    ctx->parallel_for(chunks, &run_part<decltype(run)>, &run);
  } else {
    for (int c = 0; c < chunks; ++c) run(c);
  }
  // The first piece's exception is rethrown; every other one is released here, each under
  // the division check: its destructor may be the kernel text's code.
  std::exception_ptr first, failed;
  for (auto& e : errors) {
    if (!e) continue;
    if (!first) {
      first = std::move(e);
      continue;
    }
    std::exception_ptr released = dlbridge_divguard::captured([&] { e = nullptr; });
    if (released && !failed) failed = std::move(released);
  }
  if (failed) {
    (void)dlbridge_divguard::captured([&] { first = nullptr; });
    std::rethrow_exception(std::move(failed));
  }
  if (first) std::rethrow_exception(std::move(first));
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
inline int32_t from_exception(const char* kernel, std::exception_ptr p, char* err, size_t err_len) {
  return dlbridge_errors::from_exception_ptr(kernel, "kernel", std::move(p), err, err_len);
}

}  // namespace detail
}  // namespace dlbridge
#endif  // DLBRIDGE_COMPILE_CPU_RUNTIME_H_

#ifndef DLBRIDGE_COMPILE_CUDA_RUNTIME_CUH_
#define DLBRIDGE_COMPILE_CUDA_RUNTIME_CUH_
// The runtime of every CUDA kernel generated from CuPy's ElementwiseKernel and
// ReductionKernel, on the shared header of the built-in kernels
// (`dlbridge_common.cuh`) and the half types. Compiled by NVRTC.
#include "dlbridge_compile/nvrtc_stdint.cuh"
#include "dlbridge_common.cuh"
#include "dlbridge_compile/halfs.h"

// CUDA spellings the CPU backend defines too.
#ifndef CUDART_INF_F
#define CUDART_INF_F __int_as_float(0x7f800000)
#define CUDART_NAN_F __int_as_float(0x7fffffff)
#define CUDART_INF __longlong_as_double(0x7ff0000000000000LL)
#define CUDART_NAN __longlong_as_double(0xfff8000000000000LL)
#endif

namespace dlbridge {

/// Where a raw access out of range goes (never outside the array).
__device__ unsigned long long scratch[2];

/// `_in_ind` / `_out_ind` of a reduction: only their size.
struct Size {
  __device__ explicit Size(ptrdiff_t n) : n_(n) {}
  __device__ ptrdiff_t size() const { return n_; }

 private:
  ptrdiff_t n_;
};

/// `_ind`: the iteration space of an elementwise kernel.
class Indexer {
 public:
  __device__ Indexer(const DlbIndexer& shape, long long size) : shape_(shape), size_(size) {}
  /// Number of elements the loop runs over (the broadcast size).
  __device__ ptrdiff_t size() const { return size_; }
  /// Number of dims of the broadcast shape.
  __device__ int ndim() const { return shape_.ndim; }
  /// The broadcast shape.
  __device__ const long long* shape() const { return shape_.shape; }

 private:
  const DlbIndexer& shape_;
  long long size_;
};

/// A `raw` argument: indexed with a flat C-order index into its own shape.
template <typename E>
class Raw {
 public:
  __device__ Raw(E* data, const DlbIndexer& ix, long long size, int contiguous)
      : data_(data), ix_(ix), size_(size), contiguous_(contiguous != 0) {}
  __device__ ptrdiff_t size() const { return size_; }
  __device__ int ndim() const { return ix_.ndim; }
  __device__ const long long* shape() const { return ix_.shape; }
  __device__ const long long* strides() const { return ix_.strides; }
  __device__ E* data() const { return data_; }
  __device__ E& operator[](ptrdiff_t k) const {
    if (k < 0 || k >= size_) return *reinterpret_cast<E*>(&scratch[0]);
    return data_[contiguous_ ? k : dlb_offset(ix_, k)];
  }

 private:
  E* data_;
  const DlbIndexer& ix_;
  long long size_;
  bool contiguous_;
};

}  // namespace dlbridge

__device__ __forceinline__ long long dlbridge_offset(const DlbIndexer& ix, long long i) { return dlb_offset(ix, i); }
#endif  // DLBRIDGE_COMPILE_CUDA_RUNTIME_CUH_

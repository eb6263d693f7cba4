#ifndef DLBRIDGE_COMPILE_INLINE_RUNTIME_H_
#define DLBRIDGE_COMPILE_INLINE_RUNTIME_H_
// The glue of every `dlbridge.load_inline` CPU library: the C headers a source
// may include (so that its own `#include` inside `extern "C"` does nothing) and
// the entry points' helpers.
#include "dlbridge/plugin.h"
#include "dlbridge_compile/errors.h"

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace dlbridge_inline {

using dlbridge_errors::fail;

/// What the registry already checked (defence in depth): count, non-NULL,
/// CPU, dtype, and C-contiguous unless the function takes strides.
inline int32_t check(const char* kernel, DLTensor* const* t, int32_t nt, int32_t want, const char* const* names,
                     const DLDataType* types, char* err, size_t err_len, bool strided = false) {
  if (int32_t rc = dlbridge_errors::check_cpu_tensors(kernel, "function", t, nt, want, names, types, err, err_len)) return rc;
  for (int32_t k = 0; k < nt; ++k) {
    const DLTensor* x = t[k];
    if (x->ndim < 0 || (x->ndim > 0 && x->shape == nullptr)) {
      return fail(err, err_len, DLBRIDGE_ERR_VALUE, "%s: `%s` has no shape", kernel, names[k]);
    }
    if (strided) continue;
    // A zero-size tensor is contiguous whatever its strides (torch gives
    // torch.empty(3, 0) the strides (1, 1)): no element is addressed.
    bool empty = false;
    for (int d = 0; d < x->ndim; ++d) empty = empty || x->shape[d] == 0;
    if (x->strides != nullptr && !empty) {
      int64_t expect = 1;
      for (int d = x->ndim - 1; d >= 0; --d) {
        if (x->shape[d] != 1 && x->strides[d] != expect) {
          return fail(err, err_len, DLBRIDGE_ERR_BUFFER, "%s: `%s` is not C-contiguous", kernel, names[k]);
        }
        expect *= x->shape[d];
      }
    }
  }
  return DLBRIDGE_OK;
}

/// Address of element [0, .., 0].
inline void* data(const DLTensor* t) { return static_cast<char*>(t->data) + t->byte_offset; }

/// The element count of dims [from, ndim - after).
inline long long group(const DLTensor* t, int from, int after) {
  long long n = 1;
  for (int d = from; d < t->ndim - after; ++d) n *= static_cast<long long>(t->shape[d]);
  return n;
}

/// A tensor's strides in elements, one per dim (row-major ones where the
/// DLTensor has none), in `keep`, which must outlive the call.
inline const long long* strides(const DLTensor* t, long long* keep) {
  long long step = 1;
  for (int d = t->ndim - 1; d >= 0; --d) {
    keep[d] = t->strides != nullptr ? static_cast<long long>(t->strides[d]) : step;
    step *= static_cast<long long>(t->shape[d]);
  }
  return keep;
}

/// Maps an exception in flight to an error code and message.
inline int32_t from_exception(const char* kernel, char* err, size_t err_len) {
  return dlbridge_errors::from_exception(kernel, "function", err, err_len);
}

}  // namespace dlbridge_inline
#endif  // DLBRIDGE_COMPILE_INLINE_RUNTIME_H_

#ifndef DLBRIDGE_COMPILE_ERRORS_H_
#define DLBRIDGE_COMPILE_ERRORS_H_
// How a generated entry point reports an error: a code of the plugin ABI and a
// message in the caller's buffer.
#include "dlbridge/plugin.h"
#include "dlbridge_compile/divguard.h"

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <new>

namespace dlbridge_errors {

/// Writes the message (cut to the buffer) and returns `code`.
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

/// Maps the exception in flight (thrown by `thrower`: "kernel", "function") to
/// an error code and message.
inline int32_t from_exception(const char* kernel, const char* thrower, char* err, size_t err_len) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return fail(err, err_len, DLBRIDGE_ERR_MEMORY, "%s: out of memory", kernel);
  } catch (const std::exception& e) {
    return fail(err, err_len, DLBRIDGE_ERR_RUNTIME, "%s: %s", kernel, e.what());
  } catch (...) {
    return fail(err, err_len, DLBRIDGE_ERR_RUNTIME, "%s: the %s threw an exception that is not a std::exception", kernel, thrower);
  }
}

/// [`from_exception`] for the exception `p` holds, the entry point's handler
/// already left: the exception's own code (its `what()` and, as `p` drops
/// the last reference, its destructor; a kernel's text may define both) runs
/// under the integer-division guard, never after it, and outside any
/// handler: a division there leaves no handler unended (an exception left
/// caught on the thread would be another kernel's `std::current_exception()`).
inline int32_t from_exception_ptr(const char* kernel, const char* thrower, std::exception_ptr p, char* err, size_t err_len) {
  if (!p) {  // a foreign exception (not C++'s) has no exception_ptr
    return fail(err, err_len, DLBRIDGE_ERR_RUNTIME, "%s: the %s ended with a foreign (not C++) exception", kernel, thrower);
  }
  // Which kind it is, by reference: no code of the exception's runs here. `p` keeps the object alive.
  const std::exception* object = nullptr;
  bool out_of_memory = false;
  try {
    std::rethrow_exception(p);
  } catch (const std::bad_alloc&) {
    out_of_memory = true;
  } catch (const std::exception& e) {
    object = &e;
  } catch (...) {
  }
  int32_t rc = DLBRIDGE_ERR_RUNTIME;
  std::exception_ptr failed = dlbridge_divguard::captured([&] {
    if (out_of_memory) {
      rc = fail(err, err_len, DLBRIDGE_ERR_MEMORY, "%s: out of memory", kernel);
    } else if (object != nullptr) {
      rc = fail(err, err_len, DLBRIDGE_ERR_RUNTIME, "%s: %s", kernel, object->what());
    } else {
      rc = fail(err, err_len, DLBRIDGE_ERR_RUNTIME, "%s: the %s threw an exception that is not a std::exception", kernel, thrower);
    }
    object = nullptr;
    p = nullptr;
  });
  if (failed) {
    // The exception's own code failed (a division by zero in its `what()` or destructor).
    (void)dlbridge_divguard::captured([&] { p = nullptr; });
    const std::exception* why = nullptr;
    try {
      std::rethrow_exception(failed);
    } catch (const std::exception& e) {
      why = &e;
    } catch (...) {
    }
    rc = why != nullptr ? fail(err, err_len, DLBRIDGE_ERR_RUNTIME, "%s: the %s threw an exception whose own code failed: %s", kernel, thrower, why->what())
                        : fail(err, err_len, DLBRIDGE_ERR_RUNTIME, "%s: the %s threw an exception whose own code failed", kernel, thrower);
  }
  return rc;
}

/// The checks every CPU entry point makes of its tensors, though the registry
/// made them against the signature (defence in depth): the count, and each one
/// non-NULL, on the CPU and of its dtype. `runner` names what runs ("kernel",
/// "function").
inline int32_t check_cpu_tensors(const char* kernel, const char* runner, DLTensor* const* t, int32_t nt, int32_t want,
                                 const char* const* names, const DLDataType* types, char* err, size_t err_len) {
  if (t == nullptr || nt != want) {
    return fail(err, err_len, DLBRIDGE_ERR_VALUE, "%s: called with %d tensors, expected %d", kernel, static_cast<int>(nt),
                static_cast<int>(want));
  }
  for (int32_t k = 0; k < nt; ++k) {
    const DLTensor* x = t[k];
    if (x == nullptr) return fail(err, err_len, DLBRIDGE_ERR_VALUE, "%s: `%s` is NULL", kernel, names[k]);
    if (x->device.device_type != 1) {
      return fail(err, err_len, DLBRIDGE_ERR_BUFFER, "%s: `%s` is on device type %d, this %s runs on the CPU", kernel, names[k],
                  static_cast<int>(x->device.device_type), runner);
    }
    if (x->dtype.code != types[k].code || x->dtype.bits != types[k].bits || x->dtype.lanes != types[k].lanes) {
      return fail(err, err_len, DLBRIDGE_ERR_TYPE, "%s: `%s` has dtype (code %d, bits %d, lanes %d), expected (code %d, bits %d, lanes %d)",
                  kernel, names[k], x->dtype.code, x->dtype.bits, x->dtype.lanes, types[k].code, types[k].bits, types[k].lanes);
    }
  }
  return DLBRIDGE_OK;
}

}  // namespace dlbridge_errors
#endif  // DLBRIDGE_COMPILE_ERRORS_H_

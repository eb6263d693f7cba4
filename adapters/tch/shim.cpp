// dlbridge-tch's C++ shim: at::fromDLPackVersioned / at::toDLPackVersioned for
// tch tensors (tch's C_tensor is a heap-allocated at::Tensor*). Every entry
// point catches C++ exceptions and reports them through `err`; none escapes.
#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>

namespace {
void write_err(char* err, size_t len, const char* msg) {
  if (err != nullptr && len > 0) {
    std::snprintf(err, len, "%s", msg);
  }
}
// Why a tensor cannot be lent as a DLTensor view (0: it can). The Rust side
// (raw.rs) holds the messages.
// 1 = requires grad, 2 = not strided (sparse, mkldnn, ...), 3 = quantized.
int refusal(const at::Tensor& t) {
  if (t.requires_grad()) {
    return 1;
  }
  if (t.layout() != at::kStrided) {
    return 2;
  }
  if (t.is_quantized()) {
    return 3;
  }
  return 0;
}

// f()'s result; where it throws, `failed`, with the exception's message in
// `err` (`unknown` for what is no std::exception).
template <typename R, typename F>
R guarded(char* err, size_t err_len, const char* unknown, R failed, F f) {
  try {
    return f();
  } catch (const std::exception& e) {
    write_err(err, err_len, e.what());
  } catch (...) {
    write_err(err, err_len, unknown);
  }
  return failed;
}

}  // namespace

extern "C" {

// Takes ownership of `src` (its deleter runs when torch frees the storage; on
// failure torch leaks it, so the Rust side pre-checks what torch rejects).
// Returns a new at::Tensor* (tch's C_tensor) or NULL with a message in `err`.
void* dlbridge_tch_from_dlpack(DLManagedTensorVersioned* src, char* err, size_t err_len) {
  return guarded<void*>(err, err_len, "unknown C++ exception in at::fromDLPackVersioned", nullptr,
                        [&] { return new at::Tensor(at::fromDLPackVersioned(src)); });
}

// A new owning DLPack tensor sharing `tensor`'s storage (torch keeps the
// storage alive until the deleter runs). NULL with a message on failure.
DLManagedTensorVersioned* dlbridge_tch_to_dlpack(void* tensor, char* err, size_t err_len) {
  return guarded<DLManagedTensorVersioned*>(err, err_len, "unknown C++ exception in at::toDLPackVersioned", nullptr,
                                            [&] { return at::toDLPackVersioned(*static_cast<at::Tensor*>(tensor)); });
}

// Fills `out` with a view of `tensor` (no allocation: shape, strides and data
// point into the TensorImpl, valid while the tensor lives unmodified).
// Returns 0, a refusal code (above), or -1 with the C++ exception's message in `err`.
int dlbridge_tch_borrow(void* tensor, DLTensor* out, char* err, size_t err_len) {
  return guarded(err, err_len, "unknown C++ exception in at::toDLPackNonOwning", -1, [&] {
    const at::Tensor& t = *static_cast<at::Tensor*>(tensor);
    int code = refusal(t);
    if (code != 0) {
      return code;
    }
    at::toDLPackNonOwning(t, out);
    return 0;
  });
}

// dlbridge_tch_borrow for `n` tensors in one call (a kernel call lends all of
// its tensors at once): codes[i] is tensor i's result (0, a refusal code, or
// -1 for a C++ exception, whose message dlbridge_tch_borrow on that one
// tensor gives). Never throws.
void dlbridge_tch_borrow_n(void* const* tensors, size_t n, DLTensor* out, int32_t* codes) {
  for (size_t i = 0; i < n; ++i) {
    try {
      const at::Tensor& t = *static_cast<at::Tensor*>(tensors[i]);
      codes[i] = refusal(t);
      if (codes[i] == 0) {
        at::toDLPackNonOwning(t, &out[i]);
      }
    } catch (...) {
      codes[i] = -1;
    }
  }
}

// torch's current stream on CUDA device `device_id` (the cudaStream_t, which is
// NULL for the legacy default stream), through the device guard of the CUDA
// backend: no CUDA header is needed here. Returns 0, or -1 with a message (a
// torch without CUDA, no such device).
int dlbridge_tch_current_cuda_stream(int device_id, void** out, char* err, size_t err_len) {
  return guarded(err, err_len, "unknown C++ exception asking torch for its current CUDA stream", -1, [&] {
    c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_id));
    c10::Stream stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device);
    *out = stream.native_handle();
    return 0;
  });
}

}  // extern "C"

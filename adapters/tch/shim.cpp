// dlbridge-tch's C++ shim: at::fromDLPackVersioned / at::toDLPackVersioned for
// tch tensors (tch's C_tensor is a heap-allocated at::Tensor*). Every entry
// point catches C++ exceptions and reports them through `err`; none escapes.
#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>

#include <cstdio>
#include <cstring>
#include <exception>

namespace {
void write_err(char* err, size_t len, const char* msg) {
  if (err != nullptr && len > 0) {
    std::snprintf(err, len, "%s", msg);
  }
}
}  // namespace

extern "C" {

// Takes ownership of `src` (its deleter runs when torch frees the storage; on
// failure torch leaks it, so the Rust side pre-checks what torch rejects).
// Returns a new at::Tensor* (tch's C_tensor) or NULL with a message in `err`.
void* dlbridge_tch_from_dlpack(DLManagedTensorVersioned* src, char* err, size_t err_len) {
  try {
    return new at::Tensor(at::fromDLPackVersioned(src));
  } catch (const std::exception& e) {
    write_err(err, err_len, e.what());
  } catch (...) {
    write_err(err, err_len, "unknown C++ exception in at::fromDLPackVersioned");
  }
  return nullptr;
}

// A new owning DLPack tensor sharing `tensor`'s storage (torch keeps the
// storage alive until the deleter runs). NULL with a message on failure.
DLManagedTensorVersioned* dlbridge_tch_to_dlpack(void* tensor, char* err, size_t err_len) {
  try {
    return at::toDLPackVersioned(*static_cast<at::Tensor*>(tensor));
  } catch (const std::exception& e) {
    write_err(err, err_len, e.what());
  } catch (...) {
    write_err(err, err_len, "unknown C++ exception in at::toDLPackVersioned");
  }
  return nullptr;
}

// Fills `out` with a view of `tensor` (no allocation: shape, strides and data
// point into the TensorImpl, valid while the tensor lives unmodified).
// Refuses (in one call, no round trips) tensors dlbridge must not touch:
// 1 = requires grad, 2 = not strided (sparse, mkldnn, ...), 3 = quantized.
int dlbridge_tch_borrow(void* tensor, DLTensor* out, char* err, size_t err_len) {
  try {
    const at::Tensor& t = *static_cast<at::Tensor*>(tensor);
    if (t.requires_grad()) {
      write_err(err, err_len, "the tensor requires grad; call detach() first (dlbridge kernels do not record gradients)");
      return 1;
    }
    if (t.layout() != at::kStrided) {
      write_err(err, err_len, "sparse (non-strided) tensors have no DLPack form");
      return 2;
    }
    if (t.is_quantized()) {
      write_err(err, err_len, "quantized tensors have no DLPack form");
      return 3;
    }
    at::toDLPackNonOwning(t, out);
    return 0;
  } catch (const std::exception& e) {
    write_err(err, err_len, e.what());
  } catch (...) {
    write_err(err, err_len, "unknown C++ exception in at::toDLPackNonOwning");
  }
  return -1;
}

}  // extern "C"

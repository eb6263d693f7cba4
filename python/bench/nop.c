/*
 * The call-path benchmark's no-op kernel (python/bench/bench_calls.py): a C
 * plugin with `nop(a: f32[...A], b: f32[...B], c: f32[...C])`, which takes
 * three tensors and does nothing -- the same work as tvm-ffi's `testing.nop`,
 * plus dlbridge's checks of every argument against the signature.
 */
#include "dlbridge/plugin.h"

static int32_t nop(DLTensor* const* t, int32_t nt, const DLBridgeScalar* s, int32_t ns, void* stream, char* err, size_t err_len) {
  (void)t; (void)nt; (void)s; (void)ns; (void)stream; (void)err; (void)err_len;
  return 0;
}

static const DLBridgeKernel kernels[] = {
    {"nop(a: f32[...A], b: f32[...B], c: f32[...C])", 1, 0, nop, "does nothing (call-path benchmark)"},
};

static const DLBridgePlugin plugin = {
    DLBRIDGE_PLUGIN_ABI_VERSION, (uint32_t)sizeof(DLBridgePlugin), "bench-nop", "1.0.0", (uint32_t)sizeof(DLBridgeKernel),
    (uint32_t)(sizeof kernels / sizeof kernels[0]), kernels,
};

const DLBridgePlugin* dlbridge_plugin(void) { return &plugin; }

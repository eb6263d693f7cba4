/*
 * An example dlbridge plugin in plain C: everything it needs is plugin.h.
 *
 * The build script compiles this file several times: once as the real example
 * plugin, and with BROKEN_* macros into deliberately malformed plugins that the
 * loader's tests must refuse cleanly.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dlbridge/plugin.h"

/* Some variants below leave some entry points unused. */
#define MAYBE_UNUSED __attribute__((unused))

static int32_t fail(char* err, size_t err_len, int32_t code, const char* msg) {
  if (err && err_len) snprintf(err, err_len, "%s", msg);
  return code;
}

/* c_saxpy(alpha: f64, x: f32[N], y: mut f32[N]) -- any strides. */
MAYBE_UNUSED static int32_t c_saxpy(DLTensor* const* t, int32_t nt, const DLBridgeScalar* s, int32_t ns, void* stream, char* err,
                       size_t err_len) {
  (void)stream;
  if (nt != 2 || ns != 1) return fail(err, err_len, DLBRIDGE_ERR_VALUE, "c_saxpy: wrong arity");
  const DLTensor* x = t[0];
  DLTensor* y = t[1];
  float a = (float)s[0].f64;
  const float* xd = (const float*)x->data;
  float* yd = (float*)y->data;
  for (int64_t i = 0; i < x->shape[0]; i++) yd[i * y->strides[0]] += a * xd[i * x->strides[0]];
  return DLBRIDGE_OK;
}

/* c_dot(a: f64[N], b: f64[N]) -> (out: f64[]) */
MAYBE_UNUSED static int32_t c_dot(DLTensor* const* t, int32_t nt, const DLBridgeScalar* s, int32_t ns, void* stream, char* err,
                     size_t err_len) {
  (void)s; (void)ns; (void)stream;
  if (nt != 3) return fail(err, err_len, DLBRIDGE_ERR_VALUE, "c_dot: wrong arity");
  const double* a = (const double*)t[0]->data;
  const double* b = (const double*)t[1]->data;
  double acc = 0;
  for (int64_t i = 0; i < t[0]->shape[0]; i++) acc += a[i * t[0]->strides[0]] * b[i * t[1]->strides[0]];
  *(double*)t[2]->data = acc;
  return DLBRIDGE_OK;
}

/* c_sqrt(x: f32[N]) -> (y: f32[N]): refuses negative input with a message. */
MAYBE_UNUSED static int32_t c_sqrt(DLTensor* const* t, int32_t nt, const DLBridgeScalar* s, int32_t ns, void* stream, char* err,
                      size_t err_len) {
  (void)s; (void)ns; (void)stream; (void)nt;
  const float* x = (const float*)t[0]->data;
  float* y = (float*)t[1]->data;
  for (int64_t i = 0; i < t[0]->shape[0]; i++) {
    if (x[i] < 0) {
      char msg[128];
      snprintf(msg, sizeof msg, "negative input %g at index %lld", (double)x[i], (long long)i);
      return fail(err, err_len, DLBRIDGE_ERR_VALUE, msg);
    }
    y[i] = sqrtf(x[i]);
  }
  return DLBRIDGE_OK;
}

#if defined(BROKEN_HUGE_SIGNATURE) || defined(BROKEN_HUGE_NAME)
/* One mebibyte of text, built when the library is loaded: as a kernel signature
 * ("c_huge(x0: f32[N], x1: f32[N], ..." -- valid tokens all the way, so an
 * unbounded parser would do all the work) or as the plugin name. The host must
 * refuse it after reading a bounded prefix. */
#define HUGE_LEN (1u << 20)
static char huge_text[HUGE_LEN + 1];

__attribute__((constructor)) static void fill_huge_text(void) {
#ifdef BROKEN_HUGE_SIGNATURE
  size_t n = (size_t)snprintf(huge_text, sizeof huge_text, "c_huge(");
  for (unsigned i = 0; n + 32 < HUGE_LEN; i++) n += (size_t)snprintf(huge_text + n, sizeof huge_text - n, "x%u: f32[N], ", i);
  while (n + 11 < HUGE_LEN) huge_text[n++] = ' ';
  snprintf(huge_text + n, sizeof huge_text - n, "y: f32[N])");
#else
  memset(huge_text, 'n', HUGE_LEN);
  huge_text[HUGE_LEN] = 0;
#endif
}
#endif

#ifdef BROKEN_BAD_SIGNATURE
#define SAXPY_SIG "c_saxpy(alpha: f64, x: f32[N], y: mut f32[N"
#elif defined(BROKEN_HUGE_SIGNATURE)
#define SAXPY_SIG huge_text
#else
#define SAXPY_SIG "c_saxpy(alpha: f64, x: f32[N], y: mut f32[N])"
#endif

#ifndef KERNEL_PREFIX_DOT
#define KERNEL_PREFIX_DOT "c_dot"
#endif

#ifdef CUDA_STREAM_PROBE
/* A CUDA kernel's view of a call: reads nothing (the tensors are device
 * memory), writes nothing, and reports the stream and device it was given as
 * its error message, so a test sees what crossed the C ABI. */
static int32_t c_stream_probe(DLTensor* const* t, int32_t nt, const DLBridgeScalar* s, int32_t ns, void* stream, char* err,
                              size_t err_len) {
  (void)s; (void)ns;
  char msg[160];
  snprintf(msg, sizeof msg, "stream_probe: stream %p, %d tensors, device %d:%d", stream, (int)nt,
           nt > 0 ? (int)t[0]->device.device_type : -1, nt > 0 ? (int)t[0]->device.device_id : -1);
  return fail(err, err_len, DLBRIDGE_ERR_RUNTIME, msg);
}

static const DLBridgeKernel kernels[] = {
    {"stream_probe(x: f32[N]) -> (y: f32[N])", 2, 0, c_stream_probe, "reports the stream a CUDA kernel gets (test probe)"},
};
#elif defined(BROKEN_CUDA_ADD_THEN_CONFLICT)
/* Stands in for a CUDA kernel; the tests never call it. */
static int32_t c_not_called(DLTensor* const* t, int32_t nt, const DLBridgeScalar* s, int32_t ns, void* stream, char* err,
                            size_t err_len) {
  (void)t; (void)nt; (void)s; (void)ns; (void)stream;
  return fail(err, err_len, DLBRIDGE_ERR_RUNTIME, "not a real kernel");
}

/* A loader test: the first kernel is a CUDA implementation of the built-in
 * `add` (exactly its signature and options, so the registry would merge it
 * into the built-in kernel); the second redeclares the built-in `sub` with
 * another signature, so registering this plugin next to the built-ins fails
 * and must leave the built-in `add` exactly as it was. */
static const DLBridgeKernel kernels[] = {
    {"add<T: f32|f64|f16|bf16|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])", 2, DLBRIDGE_KERNEL_ALIAS_OUTPUTS,
     c_not_called, "add on CUDA (test stand-in)"},
    {"sub(a: f32[N], b: f32[N]) -> (out: f32[N])", 1, 0, c_not_called, "conflicts with the built-in sub"},
};
#else
static const DLBridgeKernel kernels[] = {
    {SAXPY_SIG, 1, 0, c_saxpy, "y += alpha * x (C, any strides)"},
    {KERNEL_PREFIX_DOT "(a: f64[N], b: f64[N]) -> (out: f64[])", 1, 0, c_dot, "dot product (C)"},
    {"c_sqrt(x: f32[N]) -> (y: f32[N])", 1, DLBRIDGE_KERNEL_CONTIGUOUS, c_sqrt,
     "elementwise sqrt; negative input is an error (C, contiguous only)"},
#ifdef BROKEN_DUPLICATE_KERNEL
    /* c_dot declared twice for the same device. */
    {"c_dot(a: f64[N], b: f64[N]) -> (out: f64[])", 1, 0, c_dot, "dot product, again"},
#endif
};
#endif

#ifdef BROKEN_FUTURE_ABI
#define ABI (DLBRIDGE_PLUGIN_ABI_VERSION + 6)
#else
#define ABI DLBRIDGE_PLUGIN_ABI_VERSION
#endif

#ifdef BROKEN_SMALL_STRUCT
#define SIZE 8u
#else
#define SIZE ((uint32_t)sizeof(DLBridgePlugin))
#endif

#ifdef BROKEN_HUGE_NAME
#define PLUGIN_NAME huge_text
#endif

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "example-c"
#endif

static const DLBridgePlugin plugin = {
    ABI, SIZE, PLUGIN_NAME, "1.0.0", (uint32_t)sizeof(DLBridgeKernel), (uint32_t)(sizeof kernels / sizeof kernels[0]),
    kernels,
};

#ifdef BROKEN_NO_SYMBOL
const DLBridgePlugin* not_the_plugin_symbol(void) { return &plugin; }
#else
const DLBridgePlugin* dlbridge_plugin(void) { return &plugin; }
#endif

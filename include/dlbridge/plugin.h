/*
 * dlbridge plugin ABI, version 1.
 *
 * A plugin is a shared library that exports one function:
 *
 *     const DLBridgePlugin* dlbridge_plugin(void);
 *
 * returning a pointer to a table that stays valid (static storage) for as long
 * as the library is loaded. The host checks `abi_version` and `struct_size`
 * before it reads anything else, parses and type-checks every kernel
 * signature, and keeps the library loaded while any of its kernels can still
 * be called.
 *
 * COMPATIBILITY RULE: these structs only ever grow at the end. A new field is
 * appended and `struct_size` / `kernel_size` tell the host how much of the
 * struct a plugin provides; existing fields never move or change meaning. A
 * change that cannot follow this rule bumps DLBRIDGE_PLUGIN_ABI_VERSION.
 *
 * Calling convention of a kernel entry point:
 *   tensors      every tensor of the signature in order: the inputs (including
 *                `mut` ones) as declared, then the outputs. The host has already
 *                checked dtypes, shapes, devices, read-only flags and aliasing
 *                against the signature; outputs are allocated by the caller.
 *                Strides are always filled in; byte_offset is 0.
 *   scalars      every scalar parameter of the signature in order (f64, i64 or
 *                bool, see DLBridgeScalar).
 *   stream       the caller's stream (cudaStream_t for CUDA kernels) or NULL on CPU.
 *   err, err_len a buffer for a NUL-terminated error message.
 *   return       0 on success, otherwise one of DLBRIDGE_ERR_* (the message in
 *                `err` reaches the caller, e.g. as a Python exception).
 * Entry points must not throw C++ exceptions or longjmp out.
 *
 * Signature language (see dlbridge's README):
 *   "matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])"
 *   "axpy(alpha: f64, x: f32[N], y: mut f32[N])"
 */
#ifndef DLBRIDGE_PLUGIN_H_
#define DLBRIDGE_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The DLPack types the ABI uses. If the real dlpack.h was included first, its
 * definitions are used (they are layout-identical). */
#ifndef DLPACK_DLPACK_H_
typedef struct {
  int32_t device_type; /* DLDeviceType: 1 CPU, 2 CUDA, ... */
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code; /* DLDataTypeCode: 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool, ... */
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides; /* in elements */
  uint64_t byte_offset;
} DLTensor;
#endif

#define DLBRIDGE_PLUGIN_ABI_VERSION 1u
#define DLBRIDGE_PLUGIN_SYMBOL "dlbridge_plugin"

/* Return codes (match dlbridge's ErrorKind). */
#define DLBRIDGE_OK 0
#define DLBRIDGE_ERR_TYPE 1
#define DLBRIDGE_ERR_VALUE 2
#define DLBRIDGE_ERR_BUFFER 3
#define DLBRIDGE_ERR_NOT_FOUND 4
#define DLBRIDGE_ERR_RUNTIME 5
#define DLBRIDGE_ERR_MEMORY 6 /* an allocation failed */
#define DLBRIDGE_ERR_FILE_NOT_FOUND 7

/* Kernel flags. */
#define DLBRIDGE_KERNEL_ALIAS_OUTPUTS 1u /* an output may be exactly an input (in-place elementwise) */
#define DLBRIDGE_KERNEL_CONTIGUOUS 2u    /* refuse non-contiguous tensors */
/* allocate outputs row-major; without it, an output whose dims are exactly an input's
   (`...S`, `...B, N`) follows the memory order of the inputs shaped like it (NumPy's order='K') */
#define DLBRIDGE_KERNEL_ROW_MAJOR_OUTPUTS 4u

/* One scalar argument; which member is valid follows the signature. */
typedef union {
  double f64;
  int64_t i64;
  int64_t boolean; /* 0 or 1 */
} DLBridgeScalar;

typedef int32_t (*DLBridgeKernelFn)(DLTensor* const* tensors, int32_t num_tensors,
                                    const DLBridgeScalar* scalars, int32_t num_scalars,
                                    void* stream, char* err, size_t err_len);

typedef struct {
  const char* signature; /* NUL-terminated, UTF-8 */
  int32_t device_type;   /* DLDeviceType the entry point runs on */
  uint32_t flags;        /* DLBRIDGE_KERNEL_* */
  DLBridgeKernelFn entry;
  const char* doc; /* one line, may be NULL */
} DLBridgeKernel;

typedef struct {
  uint32_t abi_version; /* DLBRIDGE_PLUGIN_ABI_VERSION */
  uint32_t struct_size; /* sizeof(DLBridgePlugin) */
  const char* name;
  const char* version;
  uint32_t kernel_size; /* sizeof(DLBridgeKernel) */
  uint32_t num_kernels;
  const DLBridgeKernel* kernels;
} DLBridgePlugin;

/* What a plugin exports. */
typedef const DLBridgePlugin* (*DLBridgePluginFn)(void);

#ifdef __cplusplus
}
#endif

#endif /* DLBRIDGE_PLUGIN_H_ */

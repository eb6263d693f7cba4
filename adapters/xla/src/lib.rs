//! # dlbridge-xla
//!
//! Registry kernels as one XLA FFI custom-call target: JAX (`jax.ffi.ffi_call`)
//! lowers a call to `custom_call @dlbridge` with the kernel's name as an
//! attribute, and XLA calls [`handler`] with its buffers; no Python runs in the
//! call. The handler implements XLA's stable C ABI (`xla/ffi/api/c_api.h`,
//! API version 0.1 and later) directly: it answers XLA's metadata query, reads
//! the `kernel` attribute and the scalar parameters' attributes, views XLA's
//! buffers (dense, row-major) as DLPack tensors and calls the kernel through
//! the registry's checks. A kernel's error is an XLA error naming it.
//!
//! Call layout (what `dlbridge.jax` emits and the handler expects):
//! - operands: the kernel's tensor parameters in signature order;
//! - results: the kernel's outputs in order, then one per `mut` parameter,
//!   aliasing that parameter's operand (`input_output_aliases`): the kernel
//!   writes the result buffer, which XLA filled with the operand's values;
//! - attributes: `dlbridge_kernel` (the registry name), optionally
//!   `dlbridge_kernel_handle` (an `i64` from `dlbridge_registry::handles`: that
//!   kernel runs, whatever the name holds now), and one per scalar parameter,
//!   by the parameter's name (`f64`, `i64` or `bool`).
//!
//! Unsafe code lives in `ffi` (the C structs XLA passes, read as the ABI
//! defines them).
#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod ffi;

pub use ffi::{Platform, handler};

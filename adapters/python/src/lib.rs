//! # dlbridge-python
//!
//! The pyo3 glue between Python objects and dlbridge, used by the `dlbridge`
//! extension module (`python/`).
//!
//! | path in | zero copy | notes |
//! |---------|-----------|-------|
//! | `dlbridge.Array` | yes | its storage directly |
//! | DLPack C exchange API (torch 2.13) | yes | looked up once per type; borrowed `DLTensor` when the GIL is kept, owning tensor when released |
//! | `__dlpack__` (versioned, legacy on `TypeError`), capsules | yes | through dlpark's consumer |
//! | exact `numpy.ndarray` (up to 4 dims, dtypes with a DLPack code) | yes | its fields read in place (layout checked once per process against NumPy's answers); re-checked when Python code may have run |
//! | buffer protocol (bytes, bytearray, memoryview, array.array, NumPy) | yes | native byte order only |
//!
//! | path out | zero copy |
//! |----------|-----------|
//! | `dlbridge.Array.__dlpack__` (stream, max_version, dl_device, copy) | yes unless `copy=True` |
//! | `dlbridge.Array` buffer protocol | yes |
//! | `dlbridge.Array.__dlpack_c_exchange_api__` (the DLPack C exchange API: one C call per import) | yes |
//! | kernel outputs: torch via the exchange allocator, NumPy via `numpy.empty`, else `dlbridge.Array` | allocated by the caller's framework |
//!
//! Devices: CPU and CUDA. The exchange API passes CUDA tensors and streams
//! through to kernels registered for CUDA; `dlbridge.Array` holds host or
//! CUDA memory (`cuda`: its stream rule, copies between devices, device
//! memory for outputs). Unsafe code lives in `exchange` (the C
//! exchange API, consumed), `array_exchange` (the C exchange API dlbridge.Array offers), `buffer` (the buffer protocol), `ndarray` (NumPy arrays read in place), `array` (buffer export),
//! `capsule`, `import` (views of imported tensors), `inspect` and `vectorcall` (the Kernel type's vectorcall entry), each with its invariants written down.

#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod array;
#[allow(unsafe_code)]
pub mod array_exchange;
#[allow(unsafe_code)]
pub mod buffer;
#[allow(unsafe_code)]
pub mod capsule;
pub mod cuda;
mod epoch;
pub mod errors;
#[allow(unsafe_code)]
pub mod exchange;
pub mod frameworks;
#[allow(unsafe_code)]
pub mod import;
#[allow(unsafe_code)]
pub mod inspect;
pub mod kernel;
mod meta;
#[allow(unsafe_code)]
pub(crate) mod ndarray;
#[allow(unsafe_code)]
pub mod vectorcall;

pub use array::PyArray;
pub use kernel::PyKernel;

/// Whether exact NumPy arrays are read in place (NumPy is installed and its
/// array layout is the one `ndarray` reads, checked once), rather than through
/// the buffer protocol.
pub fn numpy_read_in_place(py: pyo3::Python<'_>) -> bool {
    ndarray::in_place(py)
}

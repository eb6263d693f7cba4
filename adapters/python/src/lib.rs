//! # dlbridge-python
//!
//! The Python binding: the extension module `dlbridge._dlbridge` (maturin
//! builds this crate; `python/` holds the Python package around it) and the
//! pyo3 glue between Python objects and dlbridge.
//!
//! | module | what |
//! |--------|------|
//! | `module` | the module's functions and classes |
//! | `kernel` | `dlbridge.Kernel`: its Python-facing methods |
//! | `call` | a call from Python: binding the arguments, the views, the outputs |
//! | `alloc` | the allocators: outputs made by the caller's framework |
//! | `param` | `dlbridge.Param`: a signature's parameters, for introspection |
//! | `meta` | calls known by layout only (`abstract_call`, `abstract_outputs`) |
//! | `array`, `import`, `frameworks`, `cuda`, `errors`, `epoch` | `dlbridge.Array`; views of imported tensors; the frameworks' allocators; CUDA devices and streams; errors; when Python code may have run |
//! | `vectorcall`, `array_exchange` | the raw entry points of the binding's classes: `Kernel`'s vectorcall, the C exchange API `dlbridge.Array` offers |
//! | `raw/` | the raw CPython and DLPack-exchange code that reads foreign objects: the C exchange API consumed (`exchange`), the buffer protocol, NumPy arrays read in place, capsules |
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
//! memory for outputs). Unsafe code lives in `raw/` (each of its
//! modules opens with its invariants), `vectorcall`, `array_exchange`, `array`
//! (buffer export) and `import` (views of imported tensors). Every module is private: the crate's only
//! interface is the Python module.

#![deny(unsafe_code)]

mod alloc;
#[allow(unsafe_code)]
mod array;
#[allow(unsafe_code)]
mod array_exchange;
mod call;
mod cuda;
mod epoch;
mod errors;
mod frameworks;
#[allow(unsafe_code)]
mod import;
mod kernel;
mod meta;
mod module;
mod param;
#[allow(unsafe_code)]
mod raw;
#[allow(unsafe_code)]
mod vectorcall;

use array::PyArray;
use kernel::PyKernel;

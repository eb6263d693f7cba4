//! # dlbridge-compile
//!
//! Kernels from source at run time, registered in dlbridge's registry like
//! any other kernel (checked signatures, zero copies, outputs allocated by
//! the caller's framework):
//!
//! | piece | what it is |
//! |---|---|
//! | [`ElementwiseKernel`] | CuPy's `ElementwiseKernel`: parameter language, broadcasting, `raw` arguments, `i`, `_ind.size()` |
//! | [`ReductionKernel`] | CuPy's `ReductionKernel`: map / reduce / post-map with an identity, `axis`, `keepdims` |
//! | [`InlineLibrary`] | `dlbridge.load_inline`: the user's own C / CUDA C functions, typed by signatures, glue generated |
//! | [`params`] | the parameter language and the signature derived from it |
//! | [`cpu`] | C++ generated per dtype combination: a plugin through the existing ABI |
//! | [`cuda`] | CUDA C generated per dtype combination, compiled with NVRTC, run on the call's stream (`cuda` tensors) |
//! | [`toolchain`] | the system C++ compiler (`$CXX`, else `c++`), diagnostics mapped to the user's text |
//! | [`cache`] | the disk cache of compiled libraries (write, then rename; shared by processes) |
//!
//! Both kernels register a CPU and a CUDA implementation under one
//! signature: the registry picks by the tensors' device.
//!
//! One specialisation per combination of dtypes is built on first use
//! (thread-safe: concurrent first calls compile once) and loaded through the
//! plugin loader.
#![forbid(unsafe_code)]

pub mod cache;
pub mod cpu;
pub mod cuda;
mod dirs;
pub mod elementwise;
mod halfs;
mod headers;
pub mod inline;
pub mod params;
pub mod reduction;
pub mod source_kernel;
mod specialise;
pub mod toolchain;

pub use elementwise::{ElementwiseKernel, ElementwiseOptions};
pub use inline::{InlineLibrary, InlineOptions};
pub use reduction::{ReductionKernel, ReductionOptions};
pub use source_kernel::SourceKernel;

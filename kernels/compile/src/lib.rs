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
//! | [`LibraryCache`] | the disk cache of compiled libraries (write, then rename; shared by processes) |
//!
//! Inside (private modules): `params.rs` (the parameter language and the
//! signature derived from it), `codegen.rs` with `cpu.rs` and `cuda.rs` (C++
//! per dtype combination, loaded as a plugin through the plugin ABI; CUDA C
//! compiled with NVRTC and run on the call's stream), `toolchain.rs` (the
//! system C++ compiler, `$CXX` else `c++`, its diagnostics mapped to the
//! user's text) and `cache.rs`.
//!
//! Both kernels register a CPU and a CUDA implementation under one
//! signature: the registry picks by the tensors' device.
//!
//! One specialisation per combination of dtypes is built on first use
//! (thread-safe: concurrent first calls compile once) and loaded through the
//! plugin loader.
#![forbid(unsafe_code)]

mod cache;
mod codegen;
mod cpu;
mod cuda;
mod dirs;
mod elementwise;
mod elf;
mod fragments;
mod halfs;
mod headers;
pub mod inline;
mod params;
mod reduction;
mod source_kernel;
mod specialise;
pub mod tc;
mod toolchain;

/// The code generators one step at a time, for this crate's own tests: the
/// `internals` feature, which only they turn on, makes this module public.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    pub use crate::cpu::{elementwise_cpp, reduction_cpp};
    pub use crate::cuda::{CUDA_DTYPES, CudaSource, GENERATED_FILE as CUDA_GENERATED_FILE, elementwise_source, reduction_source};
    pub use crate::tc::cuda_source as tc_cuda_source;
    pub use crate::toolchain::Compiler;

    /// What a definition's CUDA call launches for tensors of these shapes
    /// (parameters, then outputs): the size symbols' values in order and each
    /// launch (statement number, threads), after the host's access checks.
    pub fn tc_cuda_plan(spec: &crate::tc::TcSpec, shapes: &[&[i64]]) -> dlbridge_core::Result<crate::tc::CudaPlan> {
        crate::tc::cuda_plan(spec, shapes)
    }
}

pub use cache::{HeldLibrary, LibraryCache};
pub use elementwise::ElementwiseKernel;
pub use inline::{InlineLibrary, InlineOptions};
pub use params::{ElementwiseOptions, ElementwiseSpec, Param, Reduction, ReductionSpec, Spec};
pub use reduction::ReductionKernel;
pub use source_kernel::{SourceKernel, derived_registry_name, registry_name};

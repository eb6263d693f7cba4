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
//! | [`tc`] | Tensor Comprehensions' language: `def`s of tensor comprehensions, and their derived backwards |
//!
//! # The crate's map
//! One axis per folder; arrows run down this list only.
//!
//! | where | what lives there | where a new ... goes |
//! |---|---|---|
//! | `elementwise.rs`, `reduction.rs`, `source_kernel.rs` | the kinds of kernel from source: the public types and their registration | a new kind of kernel |
//! | `spec.rs` | the specification every kind shares ([`Spec`]) and CuPy's two ([`ElementwiseSpec`], [`ReductionSpec`]) | a new rule about a whole kernel |
//! | `spec/` | what a kernel's text implies beyond its signature: whether its calls could see where an element lies (`batch.rs`) | a new rule read from a kernel's text |
//! | `params/` | CuPy's parameter language: parameters (`mod.rs`), reserved names (`names.rs`), scanning the C++ fragments (`scan.rs`) | a new parameter keyword; a newly reserved name |
//! | `codegen/` | code generation per backend: `cpu.rs` (C++), `cuda.rs` (CUDA C), the C++ both share (`headers.rs`, `halfs.rs`) | a new backend |
//! | `launch.rs` | CUDA at call time: operands, launch geometry, the registry implementation | a new launch layout |
//! | `builder/` | building: the compiler (`toolchain.rs`), the checks of what it made (`fragments.rs`, `elf.rs`, `imports.rs`), the cache (`cache.rs`, `dirs.rs`), specialisations (`specialise.rs`) | a new cache rule; a new check of a build |
//! | `inline/` | `load_inline`: the library, each function's C glue (`function.rs`), its CUDA side (`cuda.rs`) | a new calling convention |
//! | `tc/` | the TC language: its spec (`mod.rs`), `parse.rs`, `check.rs` with `size.rs`, `grad.rs`, the shared emission (`emit.rs`) and the two emitters `cpu.rs` (with `contraction.rs`, GEMM) and `cuda.rs` | a new TC builtin; a TC backend |
//!
//! Both kernels register a CPU and a CUDA implementation under one
//! signature: the registry picks by the tensors' device.
//!
//! One specialisation per combination of dtypes is built on first use
//! (thread-safe: concurrent first calls compile once) and loaded through the
//! plugin loader.
#![forbid(unsafe_code)]

mod builder;
mod codegen;
mod elementwise;
pub mod inline;
mod launch;
mod params;
mod reduction;
mod source_kernel;
mod spec;
pub mod tc;

/// The code generators one step at a time, for this crate's own tests (hidden
/// from the docs, and no part of the crate's promises). Always compiled: a
/// feature that only the tests turned on would give the workspace's test build
/// and a `cargo run -p ...` two builds of every crate above this one. Left out
/// of rustdoc's build, whose link checks are for the crate's public items.
#[cfg(not(doc))]
#[doc(hidden)]
pub mod internals {
    pub use crate::builder::toolchain::Compiler;
    pub use crate::codegen::cpu::{elementwise_cpp, reduction_cpp};
    pub use crate::codegen::cuda::{CUDA_DTYPES, CudaSource, GENERATED_FILE as CUDA_GENERATED_FILE, elementwise_source, reduction_source};
    pub use crate::tc::cuda_source as tc_cuda_source;

    /// What a definition's CUDA call launches for tensors of these shapes
    /// (parameters, then outputs): the size symbols' values in order and each
    /// launch (statement number, threads), after the host's access checks.
    pub fn tc_cuda_plan(spec: &crate::tc::TcSpec, shapes: &[&[i64]]) -> dlbridge_core::Result<crate::tc::CudaPlan> {
        crate::tc::cuda_plan(spec, shapes)
    }
}

pub use builder::cache::{HeldLibrary, LibraryCache};
pub use elementwise::ElementwiseKernel;
pub use inline::{InlineLibrary, InlineOptions};
pub use params::Param;
pub use reduction::ReductionKernel;
pub use source_kernel::{SourceKernel, derived_registry_name, registry_name};
pub use spec::{ElementwiseOptions, ElementwiseSpec, Reduction, ReductionSpec, Spec};

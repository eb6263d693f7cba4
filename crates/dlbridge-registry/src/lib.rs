//! # dlbridge-registry
//!
//! Typed kernels for DLPack tensors: the signature language
//! ([`signature`]), checked calls with output preparation ([`call`],
//! [`Kernel`]), and the [`Registry`] of kernels compiled in with
//! [`register_kernel!`] (collected by `inventory`) or registered at run time.
//!
//! A call is checked against its signature before the kernel runs — dtypes,
//! ranks, dims, devices, read-only tensors in `mut` slots, aliasing and (when
//! the kernel asks) contiguity — and nothing is written when a check fails.
//! The hot path (bind, check, dispatch) does no heap allocation.
//!
//! Threads: [`threads::num_threads`] is how many threads a kernel may use
//! (`DLBRIDGE_NUM_THREADS`, narrowed per call by the adapter that calls it).
//!
//! Plugins: shared libraries following the C ABI in the workspace's `include/dlbridge/plugin.h`
//! are loaded with [`Registry::load_plugin`]; Rust plugin crates export their
//! table with [`export_plugin!`]. Unsafe code lives in `plugin` (loading and
//! calling foreign entry points) and `export` (the plugin side of the ABI).
#![deny(unsafe_code)]

pub mod binding;
pub mod call;
#[allow(unsafe_code)]
pub mod export;
pub mod handles;
pub mod kernel;
pub mod meta;
#[allow(unsafe_code)]
pub mod plugin;
pub mod registry;
pub mod signature;
pub mod threads;
pub mod trust;

pub use binding::{Adapter, Allocator, ArrayAllocator, Binding, Given, Job, Operand, Value, ValueList};
pub use call::{Arg, OutputSpec, Solution};
pub use dlbridge_array;
pub use dlbridge_core;
pub use dlbridge_core::DType;
pub use kernel::{Call, DynKernelFn, Impl, Inputs, Kernel, KernelDef, KernelFn, KernelOpts, Outputs};
pub use meta::{MetaArg, MetaOutput, TensorMeta};
pub use plugin::{Plugin, PluginInfo, PluginKernel};
pub use registry::{KernelEntry, Registry, StaticImpl, signature_is_well_formed};
pub use signature::{DimOp, DimOrigin, Scalar, Signature};

#[doc(hidden)]
pub use inventory;

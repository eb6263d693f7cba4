//! # dlbridge-registry
//!
//! Typed kernels for DLPack tensors: the signature language
//! ([`signature`]), checked calls with output preparation ([`solution`],
//! [`Kernel`]), and the [`Registry`] of kernels compiled in with
//! [`register_kernel!`] (collected by `inventory`) or registered at run time.
//!
//! One word per concept, one module per type: a [`Signature`] declares a
//! kernel's parameters ([`signature::Param`]: a name and a type, nothing
//! else); an argument ([`Arg`]) is the value a call gives one parameter; a
//! [`Call`] is what an implementation receives when it runs; a [`Binding`]
//! is a framework's values bound to the parameters, before the run; the
//! [`Solution`] is what the signature's variables stand for in one call.
//!
//! The ways to call a kernel:
//!
//! | given | call |
//! |-------|------|
//! | checked views ([`Arg`], [`TensorViewMut`](dlbridge_core::TensorViewMut)) | [`Kernel::call`], or [`Kernel::call_on_stream`] for a device kernel's stream |
//! | the same, and a kernel's name | [`Registry::call`] (a lookup, then [`Kernel::call`]) |
//! | a framework's own values (an [`Adapter`]) | [`Kernel::bind`] with the values in one of the [`Args`] forms, then [`Binding::run`] allocates the outputs through the framework's [`Allocator`] and makes the checked call; [`Binding::run_with`] runs it through a runner of the caller's (one that releases Python's GIL, say); [`Kernel::binding`] and [`Kernel::bind_into`] fill a binding where it lies (the Python and tch adapters' hot paths) |
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

pub mod arg;
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
pub mod solution;
pub mod threads;
pub mod trust;

pub use arg::Arg;
pub use binding::{Adapter, Allocator, Args, ArrayAllocator, Binding, Given, Job, Operand, Value, ValueList};
pub use call::{Call, Inputs, Outputs};
pub use dlbridge_array;
pub use dlbridge_core;
pub use dlbridge_core::DType;
pub use kernel::{DynKernelFn, Impl, Kernel, KernelDef, KernelFn, KernelOpts, views_overlap};
pub use meta::{MetaArg, MetaOutput, TensorMeta};
pub use plugin::{Plugin, PluginInfo, PluginKernel};
pub use registry::{KernelEntry, Registry, StaticImpl, signature_is_well_formed};
pub use signature::{DimOp, DimOrigin, Scalar, Signature};
pub use solution::{OutputSpec, Solution};

#[doc(hidden)]
pub use inventory;

//! # dlbridge
//!
//! The facade: re-exports the public API of the dlbridge crates, and ships the
//! `dlbridge` command-line tool.
#![forbid(unsafe_code)]

pub use dlbridge_array::{self as array, Array};
pub use dlbridge_core::{
    self as core, DType, Device, DeviceType, Element, Error, ErrorKind, Flags, ManagedTensor, Result, Slot, TensorDesc, TensorView,
    TensorViewMut, half,
};

pub use dlbridge_registry::binding;
pub use dlbridge_registry::{
    self as registry_crate, Arg, Call, Kernel, KernelDef, KernelFn, KernelOpts, OutputSpec, Plugin, PluginInfo, Registry, Scalar,
    Signature, dtype_resolver, register_kernel,
};

/// PyTorch tensors in Rust: `tch::Tensor` <-> DLPack with zero copies, and
/// registry kernels as functions of tch tensors (`dlbridge::tch::kernel`;
/// feature `tch`, which needs torch==2.13.0: see the crate's docs).
#[cfg(feature = "tch")]
pub use dlbridge_tch as tch;

/// CUDA: device arrays, the caching pool, NVRTC, the `cuda` kernels (feature `cuda`, on by default).
#[cfg(feature = "cuda")]
pub use dlbridge_cuda as cuda;

/// Kernels from source at run time: CuPy's `ElementwiseKernel` and `ReductionKernel`,
/// `load_inline`, Tensor Comprehensions' `define` (`compile::tc`) (feature `compile`, on by default).
#[cfg(feature = "compile")]
pub use dlbridge_compile as compile;

pub mod arrays;
pub mod demo;

pub use arrays::{ArrayArg, call, call_into, try_kernel};

/// The process-wide kernel registry, with every built-in CPU kernel (and,
/// with the `cuda` feature, their CUDA implementations).
pub fn registry() -> &'static Registry {
    dlbridge_cpu::link();
    #[cfg(feature = "cuda")]
    dlbridge_cuda::link();
    Registry::global()
}

/// Loads a plugin library into the process-wide registry; see [`Registry::load_plugin`].
pub fn load_plugin(path: impl AsRef<std::path::Path>) -> Result<PluginInfo> {
    registry().load_plugin(path)
}

/// Looks up a kernel in the process-wide registry.
pub fn get_kernel(name: &str) -> Result<std::sync::Arc<Kernel>> {
    registry().get(name)
}

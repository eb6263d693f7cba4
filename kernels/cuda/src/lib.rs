//! # dlbridge-cuda
//!
//! CUDA for dlbridge through `cudarc`, loaded at run time: the crate builds,
//! and its tests run, on a machine with no CUDA toolkit, driver or GPU.
//!
//! | what | zero copy | how |
//! |------|-----------|-----|
//! | [`CudaArray`] -> DLPack ([`CudaArray::into_dlpack`]) | yes | kDLCUDA with the device's ordinal; the deleter gives the memory back to the pool |
//! | host [`Array`](dlbridge_array::Array) <-> [`CudaArray`] | no (explicit copies) | [`CudaArray::from_host`], [`CudaArray::to_host`] |
//! | device memory for outputs | | [`pool::Pool`]: a caching pool per device, as CuPy's |
//! | CUDA C -> PTX | | [`nvrtc`]: NVRTC (found in a CUDA install or a Python wheel), cached in memory and on disk |
//!
//! Dtypes: any DLPack dtype for memory and copies; the built-in kernel sources
//! ([`builtins`]) are f32, f64, f16 and bf16. Devices: `cuda:N`.
//!
//! Without a GPU: [`probe::driver`] says why CUDA cannot be used (asked
//! before cudarc's driver bindings are touched, since they panic when libcuda
//! does not load); the GPU tests print `skipped: <reason>` and return. NVRTC,
//! the stream rules of DLPack ([`stream`]), launch arithmetic ([`launch`]),
//! operand layouts ([`indexer`]) and the pool's bookkeeping run everywhere.
//!
//! Kernels ([`kernels`], [`matmul`]): `cuda` implementations of the registry's add, mul,
//! relu, gelu, softmax, sum and matmul (cuBLAS), registered with `inventory` when this crate is
//! linked ([`link`]).
//!
//! The facade, the Python package and tch use it; its GPU tests run on a GPU
//! machine through `scripts/gpu-check.sh` (docs/cuda.md).
//!
//! CUDA version: the feature `cuda-13000` (default) or `cuda-12080` picks the
//! bindings; 13.0 bindings accept libnvrtc.so.13 and .so.12. Unsafe code lives in `raw`.
#![deny(unsafe_code)]

pub mod array;
pub mod builtins;
pub mod gemm;
pub mod generated;
pub mod indexer;
pub mod kernels;
pub mod launch;
pub mod matmul;
pub mod nvrtc;
pub mod pool;
pub mod probe;
#[allow(unsafe_code)]
mod raw;
pub mod raw_kernel;
pub mod stream;

pub use array::{CudaArray, CudaDevice};
pub use probe::{Unavailable, skip_reason};

/// Forces the linker to keep this crate (and so its `inventory` registrations
/// of the `cuda` implementations of add, mul, relu, gelu, softmax, sum, matmul).
#[inline(never)]
pub fn link() {
    std::hint::black_box(());
}

//! # dlbridge-cpu
//!
//! dlbridge's built-in CPU kernels, registered with `inventory` at link time:
//!
//! | kernel | dtypes | notes |
//! |--------|--------|-------|
//! | add, sub, mul, div, maximum | f32 f64 f16 bf16 i32 i64 | any layouts (strided iterator: coalesced, memory order, register-transposed tiles for transposed inputs, prefetched sliced rows); `out` may be an input |
//! | relu, gelu | relu: all of the above; gelu: floats | gelu with erf as a rational approximation (f32 compute; abs. error 3.3e-7) |
//! | axpy | f32 f64 f16 bf16 | `y += alpha * x` in place (`mut y`) |
//! | sum, mean | sum: all; mean: floats | over the last dim; rows read in place when their stride is 1, a transposed input's rows summed vertically |
//! | sum_all, mean_all | as above | over everything, 0-d result |
//! | softmax | floats | last dim, max-subtracted |
//! | matmul | f32 f64 | `gemm` crate, any strides |
//! | copy | every byte-sized dtype | any layout in, any layout out |
//!
//! Multi-threaded above `PAR_MIN` elements (2^16), single-threaded below, on
//! threads of dlbridge's own sized by the registry's thread budget
//! (`DLBRIDGE_NUM_THREADS`; dlbridge-tch passes torch's thread count): see
//! [`threads`]. Hot loops are compiled for the best instruction set the CPU has
//! (SSE2 baseline, AVX2+FMA or AVX-512) through `pulp`'s runtime dispatch.
//! Unsafe code lives in `matmul` (the `gemm` call), `strided` (raw-pointer
//! runs over validated strided views; its invariants open the module) and
//! `team` (a parallel loop's borrowed closure handed to helper threads). Call [`link`] (the `dlbridge` facade does) so the linker keeps this
//! crate's registrations.
#![deny(unsafe_code)]

// The families of Rust element types the kernels' trait bounds cover: the only
// type lists kept here. A kernel's signature says which dtypes it offers; its
// registration (`each numbers!(add)`) derives the dispatch table from that, and
// a dtype outside the family fails the registration loudly (a test checks that
// every built-in registers).
dlbridge_registry::dtype_resolver!(numbers: f32, f64, dlbridge_registry::dlbridge_core::half::f16, dlbridge_registry::dlbridge_core::half::bf16, i32, i64);
dlbridge_registry::dtype_resolver!(reals: f32, f64, dlbridge_registry::dlbridge_core::half::f16, dlbridge_registry::dlbridge_core::half::bf16);
dlbridge_registry::dtype_resolver!(gemm_types: f32, f64);

mod convert;
mod copy;
pub mod elementwise;
#[allow(unsafe_code)]
pub mod ffi;
#[allow(unsafe_code)]
mod matmul;
pub use matmul::{GemmScalar, Layout, strided_gemm};
pub mod num;
pub mod reduce;
#[allow(unsafe_code)]
mod strided;
#[allow(unsafe_code)]
mod team;
pub mod threads;

/// Forces the linker to keep this crate (and so its `inventory` registrations).
#[inline(never)]
pub fn link() {
    std::hint::black_box(());
}

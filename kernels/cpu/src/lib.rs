//! # dlbridge-kernels-cpu
//!
//! dlbridge's built-in CPU kernels, registered with `inventory` at link time:
//!
//! | kernel | dtypes | notes |
//! |--------|--------|-------|
//! | add, sub, mul, div, maximum | f32 f64 f16 bf16 i32 i64 | any matching strides; contiguous fast path; `out` may be an input |
//! | relu, gelu | relu: all of the above; gelu: floats | exact erf gelu |
//! | axpy | f32 f64 f16 bf16 | `y += alpha * x` in place (`mut y`) |
//! | sum, mean | sum: all; mean: floats | over the last dim |
//! | sum_all, mean_all | as above | over everything, 0-d result |
//! | softmax | floats | last dim, max-subtracted |
//! | matmul | f32 f64 | `gemm` crate, any strides |
//! | copy | every byte-sized dtype | any layout in, any layout out |
//!
//! Multi-threaded with rayon above `PAR_MIN` elements (2^16), single-threaded
//! below. Call [`link`] (the `dlbridge` facade does) so the linker keeps this
//! crate's registrations.
#![deny(unsafe_code)]

mod copy;
pub mod elementwise;
#[allow(unsafe_code)]
mod matmul;
pub mod num;
pub mod reduce;

/// Forces the linker to keep this crate (and so its `inventory` registrations).
#[inline(never)]
pub fn link() {
    std::hint::black_box(());
}

//! Shared helpers for the cross-adapter integration tests.
//!
//! Under `cargo test --doc` the pages of README.md and docs/ are documentation
//! of this crate, so every ```rust block in them compiles and runs as a doctest
//! (see `docs.rs` for the conventions of the other blocks; it checks that every
//! page with a ```rust block is included here).
#![forbid(unsafe_code)]
#![cfg_attr(doctest, doc = include_str!("../README.md"))]

#[cfg(doctest)]
#[doc = include_str!("../docs/architecture.md")]
mod docs_architecture {}

#[cfg(doctest)]
#[doc = include_str!("../docs/kernels.md")]
mod docs_kernels {}

#[cfg(doctest)]
#[doc = include_str!("../docs/rust.md")]
mod docs_rust {}

use dlbridge::{Array, DType, Result};

/// A `rows x cols` f32 array holding `0, 1, 2, ..` in row-major order.
pub fn iota_matrix(rows: i64, cols: i64) -> Result<Array> {
    let flat = Array::arange(rows * cols, DType::F32)?.to_vec::<f32>()?;
    Array::from_vec(flat, &[rows, cols])
}

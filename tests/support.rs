//! Shared helpers for the cross-adapter integration tests.
//!
//! Under `cargo test --doc` this crate's documentation is also the README, so
//! every ```rust block of README.md compiles and runs as a doctest (see
//! `readme.rs` for the conventions of the other blocks).
#![forbid(unsafe_code)]
#![cfg_attr(doctest, doc = include_str!("../README.md"))]

use dlbridge::{Array, DType, Result};

/// A `rows x cols` f32 array holding `0, 1, 2, ..` in row-major order.
pub fn iota_matrix(rows: i64, cols: i64) -> Result<Array> {
    let flat = Array::arange(rows * cols, DType::F32)?.to_vec::<f32>()?;
    Array::from_vec(flat, &[rows, cols])
}

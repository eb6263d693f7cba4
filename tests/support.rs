//! Shared helpers for the cross-adapter integration tests.
#![forbid(unsafe_code)]

use dlbridge::{Array, DType, Result};

/// A `rows x cols` f32 array holding `0, 1, 2, ..` in row-major order.
pub fn iota_matrix(rows: i64, cols: i64) -> Result<Array> {
    let flat = Array::arange(rows * cols, DType::F32)?.to_vec::<f32>()?;
    Array::from_vec(flat, &[rows, cols])
}

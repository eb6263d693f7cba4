//! Planning one cuBLAS GEMM for strided operands (see [`crate::matmul`]):
//! which operand plays cuBLAS's A and B, with which op and leading dimension.

use dlbridge_core::{Error, Result};

/// `cublasOperation_t`: read the stored (column-major) matrix as is, or transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `CUBLAS_OP_N`.
    N,
    /// `CUBLAS_OP_T`.
    T,
}

/// One column-major GEMM: `C[m x n] = op(A)[m x k] op(B)[k x n]` where `a`,
/// `b` say which of the call's operands (0 = its `a`, 1 = its `b`) plays
/// cuBLAS's A and B.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    /// Rows of C (cuBLAS's m).
    pub m: i32,
    /// Columns of C.
    pub n: i32,
    /// The inner dimension.
    pub k: i32,
    /// cuBLAS's A: which operand, its op, its leading dimension.
    pub a: (usize, Op, i32),
    /// cuBLAS's B.
    pub b: (usize, Op, i32),
    /// C's leading dimension.
    pub ldc: i32,
}

fn int(v: i64, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::InvalidArgument(format!("matmul on CUDA: {what} = {v} does not fit cuBLAS's 32-bit int")))
}

/// A matrix `rows x cols` with these strides as cuBLAS sees it: `(row_major,
/// leading dimension)`. Size-1 dims may have any stride.
fn layout(rows: i64, cols: i64, s: [i64; 2], what: &str) -> Result<(bool, i64)> {
    let (s0, s1) = (if rows == 1 { cols.max(1) } else { s[0] }, if cols == 1 { 1 } else { s[1] });
    if s1 == 1 && s0 >= cols.max(1) {
        return Ok((true, s0));
    }
    // Column-major: rows contiguous.
    let (c0, c1) = (if rows == 1 { 1 } else { s[0] }, if cols == 1 { rows.max(1) } else { s[1] });
    if c0 == 1 && c1 >= rows.max(1) {
        return Ok((false, c1));
    }
    Err(Error::InvalidArgument(format!(
        "matmul on CUDA: {what} ({rows}x{cols}, strides {s:?}) is neither row- nor column-major; cuBLAS needs a unit stride and non-overlapping rows or columns (copy it to a contiguous tensor first)"
    )))
}

/// The GEMM computing `c[M, N] = a[M, K] @ b[K, N]` for these strides.
pub fn plan(m: i64, n: i64, k: i64, sa: [i64; 2], sb: [i64; 2], sc: [i64; 2]) -> Result<Gemm> {
    let (a_rm, lda) = layout(m, k, sa, "a")?;
    let (b_rm, ldb) = layout(k, n, sb, "b")?;
    let (c_rm, ldc) = layout(m, n, sc, "the output")?;
    let op = |row_major: bool, want_transposed: bool| if row_major == want_transposed { Op::N } else { Op::T };
    let (mi, ni, ki) = (int(m, "M")?, int(n, "N")?, int(k, "K")?);
    let (lda, ldb) = (int(lda, "a's leading dimension")?, int(ldb, "b's leading dimension")?);
    let (m, n, a, b) = if c_rm {
        // C^T (n x m, col-major) = B^T (n x k) A^T (k x m): a row-major operand is its own transpose as stored.
        (ni, mi, (1, op(b_rm, true), ldb), (0, op(a_rm, true), lda))
    } else {
        // C (m x n, col-major) = A (m x k) B (k x n): a column-major operand is read as is.
        (mi, ni, (0, op(a_rm, false), lda), (1, op(b_rm, false), ldb))
    };
    Ok(Gemm { m, n, k: ki, a, b, ldc: int(ldc, "the output's leading dimension")? })
}

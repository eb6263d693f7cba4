//! dlbridge errors as Python exceptions.
//!
//! | ErrorKind | exception |
//! |-----------|-----------|
//! | Type      | `TypeError` |
//! | Value     | `ValueError` |
//! | Buffer    | `BufferError` |
//! | NotFound  | `KeyError` for kernels, `FileNotFoundError`-like `LookupError` otherwise |
//! | Runtime   | `RuntimeError` |
//! | Memory    | `MemoryError` |
//! | FileNotFound | `FileNotFoundError` |

use dlbridge_core::{Error, ErrorKind};
use pyo3::PyErr;
use pyo3::exceptions::{PyBufferError, PyFileNotFoundError, PyKeyError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};

/// Converts a dlbridge error into the Python exception its kind maps to.
pub fn to_pyerr(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::Type => PyTypeError::new_err(msg),
        ErrorKind::Value => PyValueError::new_err(msg),
        ErrorKind::Buffer => PyBufferError::new_err(msg),
        ErrorKind::NotFound => PyKeyError::new_err(msg),
        ErrorKind::Runtime => PyRuntimeError::new_err(msg),
        ErrorKind::Memory => PyMemoryError::new_err(msg),
        ErrorKind::FileNotFound => PyFileNotFoundError::new_err(msg),
    }
}

/// `.map_err(to_pyerr)` as a method.
pub trait IntoPy<T> {
    /// Converts the error into a Python exception.
    fn py_err(self) -> pyo3::PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py_err(self) -> pyo3::PyResult<T> {
        self.map_err(to_pyerr)
    }
}

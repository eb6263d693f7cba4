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

//!
//! An error about one argument of a kernel call ([`Error::Argument`], or a
//! Python exception met while importing that argument) carries the kernel and
//! the argument as attributes: `e.kernel` (`"add"`), `e.argument` (the
//! parameter's or output's name) and `e.output` (whether it is an output).

use dlbridge_core::{Error, ErrorKind, Slot};
use pyo3::exceptions::{
    PyBufferError, PyFileNotFoundError, PyKeyError, PyMemoryError, PyOverflowError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyType;

fn new_err(kind: ErrorKind, msg: String) -> PyErr {
    match kind {
        ErrorKind::Type => PyTypeError::new_err(msg),
        ErrorKind::Value => PyValueError::new_err(msg),
        ErrorKind::Buffer => PyBufferError::new_err(msg),
        ErrorKind::NotFound => PyKeyError::new_err(msg),
        ErrorKind::Runtime => PyRuntimeError::new_err(msg),
        ErrorKind::Memory => PyMemoryError::new_err(msg),
        ErrorKind::FileNotFound => PyFileNotFoundError::new_err(msg),
    }
}

/// Converts a dlbridge error into the Python exception its kind maps to; an
/// [`Error::Argument`] also gets its kernel and argument as attributes.
pub fn to_pyerr(e: Error) -> PyErr {
    let err = new_err(e.kind(), e.to_string());
    match e.slot() {
        Some((kernel, slot)) => Python::attach(|py| {
            tag(py, &err, kernel, slot);
            err
        }),
        None => err,
    }
}

/// Sets `kernel`, `argument` and `output` on the exception (best effort: an
/// exception type with `__slots__` keeps its message only).
fn tag(py: Python<'_>, err: &PyErr, kernel: &str, slot: &Slot) {
    let v = err.value(py);
    let _ = v.setattr(pyo3::intern!(py, "kernel"), kernel);
    let _ = v.setattr(pyo3::intern!(py, "argument"), slot.name());
    let _ = v.setattr(pyo3::intern!(py, "output"), slot.is_output());
}

/// A Python exception as a dlbridge error (the kind its type maps to, and its message).
pub fn from_pyerr(e: PyErr) -> Error {
    Python::attach(|py| {
        let kind = [
            (py.get_type::<PyTypeError>(), ErrorKind::Type),
            (py.get_type::<PyBufferError>(), ErrorKind::Buffer),
            (py.get_type::<PyMemoryError>(), ErrorKind::Memory),
            (py.get_type::<PyFileNotFoundError>(), ErrorKind::FileNotFound),
            (py.get_type::<PyKeyError>(), ErrorKind::NotFound),
            (py.get_type::<PyValueError>(), ErrorKind::Value),
        ]
        .into_iter()
        .find(|(t, _)| e.get_type(py).is_subclass(t).unwrap_or(false))
        .map_or(ErrorKind::Runtime, |(_, k)| k);
        Error::Coded { kind, message: e.value(py).str().map(|s| s.to_string()).unwrap_or_default() }
    })
}

/// The exception for argument `slot` of `kernel`, from an exception raised
/// while importing or converting it. Exceptions of the built-in types
/// dlbridge raises become the same type with the place in the message
/// (`add: argument x: ...`); any other type (a
/// user's `__float__` raising its own exception, say) stays as it is, with
/// the place added as a note. Either way the attributes are set.
pub fn locate(py: Python<'_>, e: PyErr, kernel: &str, slot: &Slot) -> PyErr {
    let ty = e.get_type(py);
    let builtins: [Bound<'_, PyType>; 8] = [
        py.get_type::<PyTypeError>(),
        py.get_type::<PyValueError>(),
        py.get_type::<PyBufferError>(),
        py.get_type::<PyMemoryError>(),
        py.get_type::<PyRuntimeError>(),
        py.get_type::<PyKeyError>(),
        py.get_type::<PyOverflowError>(),
        py.get_type::<PyFileNotFoundError>(),
    ];
    let msg = e.value(py).str().map(|s| s.to_string()).unwrap_or_default();
    let located = if builtins.iter().any(|b| ty.is(b)) {
        match ty.call1((format!("{kernel}: {slot}: {msg}"),)) {
            Ok(v) => {
                // The error it came from was caused by another (a producer's own): kept.
                let located = PyErr::from_value(v);
                located.set_cause(py, e.cause(py));
                located
            }
            Err(_) => e,
        }
    } else {
        let _ = e.value(py).call_method1(pyo3::intern!(py, "add_note"), (format!("in dlbridge kernel {kernel}: {slot}"),));
        e
    };
    tag(py, &located, kernel, slot);
    located
}

/// A Python exception on its way through the registry's binding layer (which
/// needs an error type that dlbridge errors convert into).
#[derive(Debug)]
pub struct PyFail(pub PyErr);

impl From<Error> for PyFail {
    fn from(e: Error) -> PyFail {
        PyFail(to_pyerr(e))
    }
}

impl From<PyErr> for PyFail {
    fn from(e: PyErr) -> PyFail {
        PyFail(e)
    }
}

impl From<PyFail> for PyErr {
    fn from(e: PyFail) -> PyErr {
        e.0
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

/// An object's type name, for errors.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

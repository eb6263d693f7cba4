//! The `dlbridge._dlbridge` extension module.
#![forbid(unsafe_code)]

use dlbridge_python::errors::IntoPy;
use dlbridge_python::{PyArray, PyKernel, import};
use pyo3::prelude::*;

/// Every registered kernel, sorted by name.
#[pyfunction]
fn list_kernels() -> Vec<PyKernel> {
    dlbridge::registry().list().into_iter().map(PyKernel::new).collect()
}

/// The kernel registered under `name` (KeyError if there is none).
#[pyfunction]
fn get_kernel(name: &str) -> PyResult<PyKernel> {
    dlbridge::get_kernel(name).map(PyKernel::new).py_err()
}

/// Loads a plugin shared library; returns `(name, version, [signatures])`.
#[pyfunction]
fn load_plugin(path: std::path::PathBuf) -> PyResult<(String, String, Vec<String>)> {
    let info = dlbridge::load_plugin(&path).py_err()?;
    Ok((info.name, info.version, info.kernels.into_iter().map(|k| k.signature).collect()))
}

/// `from_dlpack(x, /, *, device=None, copy=None)`: any DLPack producer (or
/// capsule) as a `dlbridge.Array`, as the array API standard defines it:
/// zero copy unless `copy=True` (always a new, writable array); `copy=False`
/// never copies and raises ValueError where only a copy would work.
#[pyfunction]
#[pyo3(signature = (x, /, *, device=None, copy=None))]
fn from_dlpack(x: &Bound<'_, PyAny>, device: Option<&Bound<'_, PyAny>>, copy: Option<bool>) -> PyResult<PyArray> {
    import::from_dlpack(x, device, copy).map(PyArray::new)
}

/// Wraps a buffer-protocol object (bytes, bytearray, memoryview, array.array,
/// NumPy) as a `dlbridge.Array`, zero copy; read-only buffers stay read-only.
#[pyfunction]
fn asarray(obj: &Bound<'_, PyAny>) -> PyResult<PyArray> {
    import::buffer_to_array(obj).map(PyArray::new)
}

/// A shape argument: an int or a sequence of ints. More than `MAX_NDIM` dims
/// and dims that do not fit in 64 bits are ValueErrors, before any is converted
/// or anything allocated (negative dims are refused by `Array::zeros`).
fn shape_arg(shape: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
    use pyo3::types::{PyInt, PyString};
    const MAX_NDIM: usize = dlbridge::core::layout::MAX_NDIM;
    if shape.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err("shape must be an int or a sequence of ints, not str"));
    }
    let dims: Vec<Bound<'_, PyAny>> = if shape.is_instance_of::<PyInt>() { vec![shape.clone()] } else { shape.extract()? };
    if dims.len() > MAX_NDIM {
        return Err(PyValueError::new_err(format!("shape has {} dims; dlbridge's limit is {MAX_NDIM}", dims.len())));
    }
    dims.iter()
        .enumerate()
        .map(|(d, n)| {
            n.extract::<i64>().map_err(|e| {
                if e.is_instance_of::<PyOverflowError>(n.py()) {
                    PyValueError::new_err(format!("shape[{d}] = {n} does not fit in 64 bits"))
                } else {
                    e
                }
            })
        })
        .collect()
}

/// A zero-filled `dlbridge.Array`. `shape` is an int or a sequence of ints;
/// too many dims, negative dims or a size that overflows are ValueErrors,
/// memory that cannot be had is a MemoryError.
#[pyfunction]
#[pyo3(signature = (shape, dtype="f32"))]
fn zeros(shape: &Bound<'_, PyAny>, dtype: &str) -> PyResult<PyArray> {
    let shape = shape_arg(shape)?;
    let dtype: dlbridge::DType = dtype.parse().py_err()?;
    dlbridge::Array::zeros(dtype, &shape).map(PyArray::new).py_err()
}

/// `0, 1, .., n-1` as a 1-d `dlbridge.Array`.
#[pyfunction]
#[pyo3(signature = (n, dtype="f32"))]
fn arange(n: &Bound<'_, PyAny>, dtype: &str) -> PyResult<PyArray> {
    let n = n.extract::<i64>().map_err(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(n.py()) {
            pyo3::exceptions::PyValueError::new_err(format!("arange: n = {n} does not fit in 64 bits"))
        } else {
            e
        }
    })?;
    let dtype: dlbridge::DType = dtype.parse().py_err()?;
    dlbridge::Array::arange(n, dtype).map(PyArray::new).py_err()
}

/// Reads a DLPack capsule without consuming it: name, version, flags, dtype,
/// shape, strides, device and data address.
#[pyfunction]
fn inspect_capsule<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    dlbridge_python::inspect::inspect(obj)
}

/// The Python module.
#[pymodule]
fn _dlbridge(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyArray>()?;
    m.add_class::<PyKernel>()?;
    m.add_function(wrap_pyfunction!(list_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(get_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(load_plugin, m)?)?;
    m.add_function(wrap_pyfunction!(from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(asarray, m)?)?;
    m.add_function(wrap_pyfunction!(zeros, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(arange, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

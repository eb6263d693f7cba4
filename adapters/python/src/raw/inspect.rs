//! Reading a DLPack capsule without consuming it (for `dlbridge.testing`).
//!
//! Invariants: the capsule keeps its DLPack tensor alive and unconsumed while
//! we read it (we neither rename it nor call the deleter); the struct behind a
//! `dltensor_versioned` capsule is only read past `version` after the major
//! version matched; the DLTensor is validated like any foreign tensor.

use dlbridge_core::Flags;
use dlbridge_core::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use dlbridge_core::raw::view_from_dltensor;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};

use crate::errors::IntoPy;

/// `{"name", "version", "flags", "dtype", "shape", "strides", "device", "data", "byte_offset"}`
/// of a capsule, which stays unconsumed.
pub fn inspect<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let py = obj.py();
    let capsule = obj.cast::<PyCapsule>().map_err(|_| PyTypeError::new_err("expected a DLPack capsule"))?;
    // SAFETY: PyCapsule_GetName on a capsule object (checked above).
    let name_ptr = unsafe { pyo3::ffi::PyCapsule_GetName(capsule.as_ptr()) };
    let name = if name_ptr.is_null() {
        String::new()
    } else {
        // SAFETY: capsule names are NUL-terminated static strings.
        unsafe { std::ffi::CStr::from_ptr(name_ptr) }.to_string_lossy().into_owned()
    };
    let d = PyDict::new(py);
    d.set_item("name", &name)?;
    // SAFETY: the name is the capsule's own (GetPointer checks it matches).
    let ptr = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), name_ptr) };
    if ptr.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| PyValueError::new_err("capsule holds NULL")));
    }
    let (dl, flags) = match name.as_str() {
        "dltensor_versioned" => {
            let m = ptr.cast::<DLManagedTensorVersioned>();
            // SAFETY: a live, unconsumed versioned tensor; `version` is frozen.
            let v = unsafe { (*m).version };
            d.set_item("version", (v.major, v.minor))?;
            if v.major != dlbridge_core::DLPACK_MAJOR {
                return Ok(d);
            }
            // SAFETY: same major version: the layout is ours.
            let flags = unsafe { (*m).flags };
            // SAFETY: as above.
            (unsafe { &raw const (*m).dl_tensor }, flags)
        }
        "dltensor" => {
            d.set_item("version", py.None())?;
            // SAFETY: a live, unconsumed legacy tensor.
            (unsafe { &raw const (*ptr.cast::<DLManagedTensor>()).dl_tensor }, Flags::empty())
        }
        other => return Err(PyValueError::new_err(format!("capsule {other:?} is not an unconsumed DLPack tensor"))),
    };
    d.set_item("flags", flags.bits())?;
    // SAFETY: the capsule keeps the tensor alive while `view` is used below.
    let view = unsafe { view_from_dltensor(dl, flags) }.py_err()?;
    d.set_item("dtype", view.dtype().to_string())?;
    d.set_item("shape", view.shape().to_vec())?;
    d.set_item("strides", view.strides().to_vec())?;
    d.set_item("device", (view.device().kind.0, view.device().id))?;
    d.set_item("data", view.data_ptr() as usize)?;
    Ok(d)
}

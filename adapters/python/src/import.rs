//! Python objects in: the fastest path each object offers.
//!
//! 1. `dlbridge.Array`: its memory directly.
//! 2. the DLPack C exchange API (`type(x).__dlpack_c_exchange_api__`, looked up
//!    once per type): a borrowed `DLTensor` (no allocation) for calls that keep
//!    the GIL, an owning tensor for calls that release it;
//! 3. `__dlpack__(max_version=(1, 3))`, the legacy call on `TypeError`, or an
//!    existing capsule (dlpark's consumer does the negotiation and capsule
//!    renaming);
//! 4. the buffer protocol.
//!
//! A read-only source stays read-only: asked for a writable tensor, it is an
//! error, never a write.

use dlbridge_core::ffi::DLTensor;
use dlbridge_core::raw::view_from_dltensor;
use dlbridge_core::{Flags, ManagedTensor, TensorView};
use dlpark::python::ImportedDlpack;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;

use crate::array::PyArray;
use crate::errors::IntoPy;
use crate::exchange::{self, Api};

/// Where an imported tensor's memory is held while a call uses it.
#[derive(Debug)]
pub enum Held {
    /// A `dlbridge.Array` (a clone shares its storage).
    Array(dlbridge_array::Array),
    /// A DLTensor lent by the producer's exchange API, validated into a view:
    /// valid while the GIL is held and the object alive (the caller keeps both),
    /// so it is never handed out for longer than a borrow of this value.
    Borrowed(TensorView<'static>),
    /// An owning DLPack tensor.
    Managed(ManagedTensor),
}

/// One imported Python tensor.
#[derive(Debug)]
pub struct Imported {
    /// The memory.
    pub held: Held,
    /// The producer's exchange API, if its type has one.
    pub api: Option<Api>,
}

impl Imported {
    /// A read-only view of the tensor.
    pub fn view(&self) -> TensorView<'_> {
        match &self.held {
            Held::Array(a) => a.view(),
            Held::Borrowed(v) => v.clone(),
            Held::Managed(m) => m.view().clone(),
        }
    }

    /// Number of elements (for the GIL-release decision).
    pub fn numel(&self) -> usize {
        match &self.held {
            Held::Array(a) => a.numel(),
            Held::Borrowed(v) => v.numel(),
            Held::Managed(m) => m.view().numel(),
        }
    }

    /// Whether the memory is flagged read-only.
    pub fn read_only(&self) -> bool {
        match &self.held {
            Held::Array(a) => a.is_read_only(),
            Held::Borrowed(_) => false,
            Held::Managed(m) => m.is_read_only(),
        }
    }
}

/// How hard to try: borrowed exchange views are only valid while the GIL is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The call keeps the GIL: borrowing is fine.
    KeepGil,
    /// The call may release the GIL: take owning references.
    Own,
}

/// Imports `obj` as a tensor. `writable` refuses read-only sources, and
/// tensors that require grad (writing into them behind autograd's back would
/// corrupt gradients; read-only inputs that require grad are read, and the
/// results do not track gradients).
pub fn import(obj: &Bound<'_, PyAny>, writable: bool, mode: Mode) -> PyResult<Imported> {
    let imported = import_any(obj, writable, mode)?;
    if writable {
        if imported.read_only() {
            return Err(PyBufferError::new_err("the tensor is read-only (DLPack READ_ONLY) and this argument is written"));
        }
        if imported.api.is_some()
            && obj.getattr(pyo3::intern!(obj.py(), "requires_grad")).and_then(|r| r.is_truthy()).unwrap_or(false)
        {
            return Err(PyBufferError::new_err("the tensor requires grad and this argument is written in place; detach() it first"));
        }
    }
    Ok(imported)
}

fn import_any(obj: &Bound<'_, PyAny>, writable: bool, mode: Mode) -> PyResult<Imported> {
    if let Ok(a) = obj.cast::<PyArray>() {
        return Ok(Imported { held: Held::Array(a.get().array().clone()), api: None });
    }
    if let Some(api) = exchange::lookup(obj)? {
        if mode == Mode::KeepGil && api.can_borrow() {
            let t: DLTensor = api.borrow(obj)?;
            // SAFETY: the producer lent `t`; its shape/strides/data stay valid while the
            // GIL is held and `obj` is alive, which the caller guarantees for as long as
            // it holds this Imported (Held::Borrowed contract).
            let view = unsafe { view_from_dltensor::<'static>(&t, Flags::empty()) }.py_err()?;
            return Ok(Imported { held: Held::Borrowed(view), api: Some(api) });
        }
        return Ok(Imported { held: Held::Managed(api.managed(obj)?), api: Some(api) });
    }
    if has_dlpack(obj) {
        return Ok(Imported { held: Held::Managed(from_dlpack_protocol(obj)?), api: None });
    }
    match crate::buffer::import(obj, writable) {
        Ok(t) => Ok(Imported { held: Held::Managed(t), api: None }),
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => Err(PyTypeError::new_err(format!(
            "expected a tensor (an object with __dlpack__ or the buffer protocol), got {}",
            obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "an unknown type".into())
        ))),
        Err(e) => Err(e),
    }
}

fn has_dlpack(obj: &Bound<'_, PyAny>) -> bool {
    let py = obj.py();
    obj.hasattr(pyo3::intern!(py, "__dlpack__")).unwrap_or(false) || is_capsule(obj)
}

fn is_capsule(obj: &Bound<'_, PyAny>) -> bool {
    obj.cast::<pyo3::types::PyCapsule>().is_ok()
}

/// Imports through `__dlpack__` (versioned first, legacy on `TypeError`) or a capsule.
pub fn from_dlpack_protocol(obj: &Bound<'_, PyAny>) -> PyResult<ManagedTensor> {
    let imported = dlpark::python::from_dlpack(obj.as_borrowed(), None, None)?;
    match imported {
        // SAFETY: dlpark hands over an owned, version-checked pointer.
        ImportedDlpack::Versioned(m) => unsafe { ManagedTensor::from_raw_versioned(m.into_raw()) }.py_err(),
        // SAFETY: as above, legacy struct.
        ImportedDlpack::Legacy(m) => unsafe { ManagedTensor::from_raw_legacy(m.into_raw()) }.py_err(),
    }
}

/// `dlbridge.from_dlpack(obj)`: any DLPack producer or capsule, zero copy.
pub fn to_array(obj: &Bound<'_, PyAny>) -> PyResult<dlbridge_array::Array> {
    if let Ok(a) = obj.cast::<PyArray>() {
        return Ok(a.get().array().clone());
    }
    let t = match exchange::lookup(obj)? {
        Some(api) => api.managed(obj)?,
        None if has_dlpack(obj) => from_dlpack_protocol(obj)?,
        None => return Err(PyTypeError::new_err(format!("{} has no __dlpack__ (use dlbridge.asarray for buffers)", obj.get_type().name()?))),
    };
    dlbridge_array::Array::from_managed(t).py_err()
}

/// `dlbridge.asarray(obj)`: the buffer protocol (or DLPack), zero copy.
pub fn buffer_to_array(obj: &Bound<'_, PyAny>) -> PyResult<dlbridge_array::Array> {
    if let Ok(a) = obj.cast::<PyArray>() {
        return Ok(a.get().array().clone());
    }
    match crate::buffer::import(obj, false) {
        Ok(t) => dlbridge_array::Array::from_managed(t).py_err(),
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) && has_dlpack(obj) => to_array(obj),
        Err(e) => Err(e),
    }
}

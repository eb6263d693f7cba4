//! The Python DLPack consumer: `__dlpack__` negotiation and capsule consumption.
//!
//! dlbridge does its own consuming (rather than dlpark's consumer) so that
//! every foreign struct goes through [`ManagedTensor`]'s checks first (the
//! version, then `ndim` against the bound before `shape`/`strides` are read),
//! and so that the *origin* of a legacy struct is known: a producer asked for
//! `max_version=(1, 3)` that still answers with a legacy `dltensor` capsule
//! cannot express READ_ONLY (JAX arrays are immutable and do this), so its
//! tensor is read-only for writing; a bare legacy capsule the caller built and
//! passed in (TVM's `convert_func` style) stays writable.
//!
//! Invariants: a capsule's pointer is read only after `PyCapsule_IsValid`
//! confirmed its exact name; it is renamed to `used_*` before ownership passes
//! to a [`ManagedTensor`] (so the producer's capsule destructor no longer
//! calls the deleter, per the DLPack spec), and from then on exactly the
//! `ManagedTensor` calls the deleter — on success when dropped, on any
//! validation error before returning. Nothing here reads the struct itself.

use std::ffi::CStr;

use dlbridge_core::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use dlbridge_core::{DLPACK_MAJOR, DLPACK_MINOR, ManagedTensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};

use crate::errors::IntoPy;

const VERSIONED: &CStr = c"dltensor_versioned";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_LEGACY: &CStr = c"used_dltensor";

/// Where an imported DLPack tensor came from: decides whether a legacy struct is writable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A capsule the caller passed in directly.
    Capsule,
    /// `obj.__dlpack__(max_version=...)`: the producer could have said READ_ONLY.
    Versioned,
    /// `obj.__dlpack__()` after the versioned call raised `TypeError`.
    LegacyFallback,
}

/// A consumed DLPack tensor and how it came.
#[derive(Debug)]
pub struct Consumed {
    /// The owned, validated tensor.
    pub tensor: ManagedTensor,
    /// How it came.
    pub origin: Origin,
}

impl Consumed {
    /// Whether a consumer may write it: not flagged READ_ONLY, and not a legacy
    /// answer of a producer that was offered the versioned struct (it could not
    /// say READ_ONLY, so it must be taken as read-only; NumPy does the same).
    pub fn writable(&self) -> bool {
        !self.tensor.is_read_only() && (!self.tensor.is_legacy() || self.origin == Origin::Capsule)
    }
}

/// What `__dlpack__` is asked for beyond the version.
#[derive(Debug, Default, Clone, Copy)]
pub struct Request {
    /// `dl_device=(type, id)`, when the caller wants another device.
    pub dl_device: Option<(i32, i32)>,
    /// `copy=`.
    pub copy: Option<bool>,
}

/// The type name of `obj`, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| bounded(&n.to_string())).unwrap_or_else(|_| "<unknown type>".into())
}

/// Foreign text cut to at most about 200 characters.
pub fn bounded(s: &str) -> String {
    const MAX: usize = 200;
    match s.char_indices().nth(MAX) {
        None => s.to_owned(),
        Some((i, _)) => format!("{}...", &s[..i]),
    }
}

/// Imports any `__dlpack__` producer or DLPack capsule.
///
/// `__dlpack__(max_version=(1, 3))` first; on `TypeError` the legacy call
/// `__dlpack__()` (a producer written to the 2022 standard). What comes back
/// must be a capsule.
pub fn consume_object(obj: &Bound<'_, PyAny>, req: Request) -> PyResult<Consumed> {
    if obj.cast::<PyCapsule>().is_ok() {
        return Ok(Consumed { tensor: consume_capsule(obj)?, origin: Origin::Capsule });
    }
    let py = obj.py();
    let method = obj
        .getattr(pyo3::intern!(py, "__dlpack__"))
        .map_err(|_| PyTypeError::new_err(format!("{} has no __dlpack__ method (and is not a DLPack capsule)", type_name(obj))))?;
    let kwargs = PyDict::new(py);
    kwargs.set_item(pyo3::intern!(py, "max_version"), (DLPACK_MAJOR, DLPACK_MINOR))?;
    if let Some(d) = req.dl_device {
        kwargs.set_item(pyo3::intern!(py, "dl_device"), d)?;
    }
    if let Some(c) = req.copy {
        kwargs.set_item(pyo3::intern!(py, "copy"), c)?;
    }
    let (capsule, origin) = match method.call((), Some(&kwargs)) {
        Ok(c) => (c, Origin::Versioned),
        Err(e) if e.is_instance_of::<PyTypeError>(py) => {
            // A pre-2023 producer: no keywords it does not know. Its export is
            // zero copy (the 2022 standard has no copies), so `copy=False` holds.
            if req.dl_device.is_some() || req.copy == Some(true) {
                return Err(PyTypeError::new_err(format!(
                    "{}.__dlpack__ does not take max_version, dl_device or copy (it raised: {}); cannot honour the request",
                    type_name(obj),
                    bounded(&e.to_string())
                )));
            }
            (method.call0()?, Origin::LegacyFallback)
        }
        Err(e) => return Err(e),
    };
    if capsule.cast::<PyCapsule>().is_err() {
        return Err(PyTypeError::new_err(format!(
            "{}.__dlpack__() returned {}, not a DLPack capsule",
            type_name(obj),
            type_name(&capsule)
        )));
    }
    let tensor = consume_capsule(&capsule)?;
    Ok(Consumed { tensor, origin })
}

/// Consumes a `dltensor_versioned` or `dltensor` capsule (renaming it `used_*`).
pub fn consume_capsule(capsule: &Bound<'_, PyAny>) -> PyResult<ManagedTensor> {
    let cap = capsule.as_ptr();
    let valid = |name: &CStr| {
        // SAFETY: PyCapsule_IsValid accepts any object pointer and never sets an exception.
        unsafe { pyo3::ffi::PyCapsule_IsValid(cap, name.as_ptr()) == 1 }
    };
    let (name, used, versioned) = if valid(VERSIONED) {
        (VERSIONED, USED_VERSIONED, true)
    } else if valid(LEGACY) {
        (LEGACY, USED_LEGACY, false)
    } else if valid(USED_VERSIONED) || valid(USED_LEGACY) {
        return Err(PyValueError::new_err("this DLPack capsule was already consumed (its name starts with used_)"));
    } else {
        return Err(PyValueError::new_err(format!(
            "a DLPack capsule must be named \"dltensor_versioned\" or \"dltensor\", got {}",
            capsule_name(capsule)
        )));
    };
    // SAFETY: the capsule is valid with exactly this name (checked above).
    let ptr = unsafe { pyo3::ffi::PyCapsule_GetPointer(cap, name.as_ptr()) };
    if ptr.is_null() {
        // IsValid refuses NULL pointers, so this is unreachable in practice; no ownership was taken.
        return Err(PyErr::take(capsule.py()).unwrap_or_else(|| PyValueError::new_err("DLPack capsule holds a NULL pointer")));
    }
    // SAFETY: renaming a capsule we hold a reference to; the new name is a static string.
    if unsafe { pyo3::ffi::PyCapsule_SetName(cap, used.as_ptr()) } != 0 {
        return Err(PyErr::take(capsule.py()).unwrap_or_else(|| PyValueError::new_err("could not rename the DLPack capsule")));
    }
    if versioned {
        // SAFETY: a `dltensor_versioned` capsule holds an owned DLManagedTensorVersioned*;
        // renaming it used_ handed that ownership to us (the producer's destructor
        // leaves used_ capsules alone). from_raw_versioned checks the version first.
        unsafe { ManagedTensor::from_raw_versioned(ptr.cast::<DLManagedTensorVersioned>()) }.py_err()
    } else {
        // SAFETY: as above, for a legacy `dltensor` capsule and its DLManagedTensor*.
        unsafe { ManagedTensor::from_raw_legacy(ptr.cast::<DLManagedTensor>()) }.py_err()
    }
}

/// A capsule's name for a message, bounded.
fn capsule_name(capsule: &Bound<'_, PyAny>) -> String {
    // SAFETY: `capsule` is a capsule object (callers checked); GetName returns
    // a borrowed, NUL-terminated name or NULL.
    let p = unsafe { pyo3::ffi::PyCapsule_GetName(capsule.as_ptr()) };
    if p.is_null() {
        let _ = PyErr::take(capsule.py());
        return "a capsule with no name".into();
    }
    // SAFETY: capsule names are NUL-terminated; we read at most what CStr finds.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
    format!("{:?}", bounded(&s))
}

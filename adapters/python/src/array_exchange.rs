//! The DLPack C exchange API that `dlbridge.Array` offers
//! (`dlbridge.Array.__dlpack_c_exchange_api__`, a capsule named
//! `"dlpack_exchange_api"`, as torch 2.13 offers its own): consumers that look
//! for it (tvm-ffi, dlbridge itself, any C extension) import an Array with one
//! C call instead of a Python-level `__dlpack__` call and a capsule.
//!
//! Invariants: the table is a `static` (the spec requires it to live for the
//! process). Every entry point is `extern "C"`, catches panics (none crosses
//! the boundary: a panic becomes a `RuntimeError`/`SetError`), checks every
//! pointer it is given for NULL and the object's type before using it, and
//! reports failure as the spec says: -1 with a Python exception set (the
//! functions that take a Python object are called with the GIL held, per the
//! spec; a caller that does not hold it gets it taken for the call), or
//! `SetError` for the allocator, which needs no GIL. A read-only
//! Array is never lent writable: `managed_tensor_from_py_object_no_sync`
//! flags it READ_ONLY, and `dltensor_from_py_object_no_sync` — whose bare
//! `DLTensor` cannot carry the flag — refuses it with a `BufferError` (the
//! consumer can take the owning path). A lent `DLTensor` points into the
//! Array's own shape and strides, which never change (the Python object is
//! frozen) and live as long as the object.

use std::ffi::{CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use dlbridge_core::ffi::{DLDeviceType, DLManagedTensorVersioned, DLPackExchangeAPI, DLPackExchangeAPIHeader, DLPackVersion, DLTensor};
use dlbridge_core::{DLPACK_MAJOR, DLPACK_MINOR, DType, Device, ManagedTensor};
use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use pyo3::PyTypeInfo;

use crate::array::PyArray;
use crate::errors::IntoPy;

/// The table (one per process).
static API: Table = Table(DLPackExchangeAPI {
    header: DLPackExchangeAPIHeader { version: DLPackVersion { major: DLPACK_MAJOR, minor: DLPACK_MINOR }, prev_api: std::ptr::null_mut() },
    managed_tensor_allocator: Some(allocate),
    managed_tensor_from_py_object_no_sync: Some(from_py_object),
    managed_tensor_to_py_object_no_sync: Some(to_py_object),
    dltensor_from_py_object_no_sync: Some(borrow),
    current_work_stream: Some(current_work_stream),
});

/// The table, shareable between threads.
struct Table(DLPackExchangeAPI);

// SAFETY: the table is immutable; its only pointer (`prev_api`) is NULL.
unsafe impl Sync for Table {}

/// The capsule `dlbridge.Array.__dlpack_c_exchange_api__`.
pub fn capsule(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    let ptr = std::ptr::NonNull::new((&raw const API.0).cast_mut().cast::<c_void>()).ok_or_else(|| PyRuntimeError::new_err("no table"))?;
    // SAFETY: the table is a static that lives for the process; the capsule
    // has no destructor and the name is a 'static C string.
    unsafe { PyCapsule::new_with_pointer(py, ptr, c"dlpack_exchange_api") }
}

/// Gives `dlbridge.Array` the class attribute `__dlpack_c_exchange_api__`
/// ([`capsule`]), as torch 2.13 offers it: consumers import an Array with one
/// C call. Called once, when the extension module is initialised.
pub fn install(py: Python<'_>) -> PyResult<()> {
    PyArray::type_object(py).setattr(pyo3::intern!(py, "__dlpack_c_exchange_api__"), capsule(py)?)
}

/// Runs `f` with the GIL (the caller's), turning errors and panics into a
/// set Python exception and -1.
fn with_py(f: impl FnOnce(Python<'_>) -> PyResult<()>) -> i32 {
    // The spec has consumers call with the GIL held; attaching costs a
    // thread-local check then, and keeps a consumer that forgot it from
    // touching Python objects without the GIL.
    Python::attach(|py| match catch_unwind(AssertUnwindSafe(|| f(py))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            e.restore(py);
            -1
        }
        Err(_) => {
            PyRuntimeError::new_err("dlbridge.Array exchange API: internal error (panic)").restore(py);
            -1
        }
    })
}

/// The `dlbridge.Array` behind a `PyObject*` the consumer passed.
fn array_of<'py>(py: Python<'py>, obj: *mut c_void) -> PyResult<Bound<'py, PyArray>> {
    if obj.is_null() {
        return Err(PyTypeError::new_err("dlbridge.Array exchange API: NULL object"));
    }
    // SAFETY: a non-NULL `PyObject*` the consumer lends for the call, with the GIL held.
    let any = unsafe { Bound::from_borrowed_ptr(py, obj.cast()) };
    let name = any.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    any.cast_into::<PyArray>()
        .map_err(|_| PyTypeError::new_err(format!("dlbridge.Array exchange API: expected a dlbridge.Array, got {name}")))
}

unsafe extern "C" fn from_py_object(obj: *mut c_void, out: *mut *mut DLManagedTensorVersioned) -> i32 {
    with_py(|py| {
        if out.is_null() {
            return Err(PyTypeError::new_err("managed_tensor_from_py_object_no_sync: NULL out"));
        }
        let a = array_of(py, obj)?;
        let arr = a.get().array();
        if crate::cuda::is_cuda(arr.device()) {
            // Owned by the consumer now, whose streams dlbridge cannot see: pool
            // memory goes back to the driver, not the cache, when freed. (No stream
            // ordering: `_no_sync`; the consumer asks `current_work_stream`.)
            crate::cuda::device(arr.device()).py_err()?.mark_lent(arr.data_ptr() as usize as u64);
        }
        let m = arr.to_managed().py_err()?;
        // SAFETY: `out` is non-NULL and the consumer's slot; ownership passes to it.
        unsafe { *out = m.into_raw_versioned() };
        Ok(())
    })
}

unsafe extern "C" fn borrow(obj: *mut c_void, out: *mut DLTensor) -> i32 {
    with_py(|py| {
        if out.is_null() {
            return Err(PyTypeError::new_err("dltensor_from_py_object_no_sync: NULL out"));
        }
        let a = array_of(py, obj)?;
        let arr = a.get().array();
        if arr.is_read_only() {
            return Err(PyBufferError::new_err(
                "the dlbridge.Array is read-only and a bare DLTensor cannot say so: use managed_tensor_from_py_object_no_sync (flagged READ_ONLY)",
            ));
        }
        let t = DLTensor {
            data: arr.data_ptr().cast_mut().cast(),
            device: arr.device().to_dl(),
            ndim: arr.shape().len() as i32,
            dtype: arr.dtype().to_dl(),
            shape: arr.shape().as_ptr().cast_mut(),
            strides: arr.strides().as_ptr().cast_mut(),
            byte_offset: 0,
        };
        // SAFETY: `out` is non-NULL and points to the consumer's DLTensor slot. The
        // arrays it points into belong to the frozen Array, alive while `obj` is.
        unsafe { out.write(t) };
        Ok(())
    })
}

unsafe extern "C" fn to_py_object(tensor: *mut DLManagedTensorVersioned, out: *mut *mut c_void) -> i32 {
    with_py(|py| {
        // Ownership of `tensor` is ours whatever happens: importing it first
        // makes every error path below run its deleter.
        // SAFETY: the consumer hands over an owned DLManagedTensorVersioned (or
        // NULL, which `from_raw_versioned` refuses).
        let m = unsafe { ManagedTensor::from_raw_versioned(tensor) }.py_err()?;
        if out.is_null() {
            return Err(PyTypeError::new_err("managed_tensor_to_py_object_no_sync: NULL out"));
        }
        let read_only = m.is_read_only();
        let device = m.device();
        if !device.is_host_accessible() && !crate::cuda::is_cuda(device) {
            return Err(PyBufferError::new_err(format!("dlbridge.Array holds host or CUDA memory, not {device}")));
        }
        let mut array = dlbridge_array::Array::from_managed(m).py_err()?;
        if read_only {
            array.set_read_only();
        }
        let obj = Bound::new(py, PyArray::new(array))?;
        // SAFETY: `out` is non-NULL; the new reference passes to the consumer.
        unsafe { *out = obj.into_ptr().cast() };
        Ok(())
    })
}

type SetError = Option<unsafe extern "C" fn(ctx: *mut c_void, kind: *const c_char, message: *const c_char)>;

unsafe extern "C" fn allocate(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: SetError,
) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<*mut DLManagedTensorVersioned, String> {
        if prototype.is_null() || out.is_null() {
            return Err("NULL prototype or out".into());
        }
        // SAFETY: non-NULL; the consumer's prototype, readable for the call.
        let p = unsafe { prototype.read() };
        let dtype = DType::from_dl(p.dtype).map_err(|e| e.to_string())?;
        let device = Device::from_dl(p.device).map_err(|e| e.to_string())?;
        if !device.is_host_accessible() && !crate::cuda::is_cuda(device) {
            return Err(format!("dlbridge.Array allocates host or CUDA memory, not {device}"));
        }
        let ndim =
            usize::try_from(p.ndim).ok().filter(|&n| n <= dlbridge_core::layout::MAX_NDIM).ok_or_else(|| format!("ndim {}", p.ndim))?;
        let shape: &[i64] = if ndim == 0 {
            &[]
        } else if p.shape.is_null() {
            return Err("prototype shape is NULL".into());
        } else {
            // SAFETY: non-NULL, `ndim` (bounded) readable i64s, per the prototype's contract.
            unsafe { std::slice::from_raw_parts(p.shape, ndim) }
        };
        if crate::cuda::is_cuda(device) {
            // From the device's pool, ordered on the legacy default stream (see `cuda`).
            let t = crate::cuda::allocate_cuda_managed(device, dtype, shape).map_err(|e| e.to_string())?;
            return Ok(t.into_raw_versioned());
        }
        let a = dlbridge_array::Array::zeros(dtype, shape).map_err(|e| e.to_string())?;
        Ok(a.into_managed().map_err(|e| e.to_string())?.into_raw_versioned())
    }));
    let err = match result {
        Ok(Ok(ptr)) => {
            // SAFETY: `out` was checked non-NULL; ownership passes to the consumer.
            unsafe { *out = ptr };
            return 0;
        }
        Ok(Err(msg)) => msg,
        Err(_) => "internal error (panic)".into(),
    };
    if let Some(f) = set_error {
        let kind = c"BufferError";
        let msg = CString::new(format!("dlbridge.Array allocator: {err}").replace('\0', " ")).unwrap_or_default();
        // SAFETY: the consumer's callback, with its own context and two NUL-terminated strings.
        unsafe { f(error_ctx, kind.as_ptr(), msg.as_ptr()) };
    }
    if !out.is_null() {
        // SAFETY: non-NULL out slot.
        unsafe { *out = std::ptr::null_mut() };
    }
    -1
}

unsafe extern "C" fn current_work_stream(_device_type: DLDeviceType, _device_id: i32, out: *mut *mut c_void) -> i32 {
    // NULL: host memory has no streams, and dlbridge orders its CUDA arrays'
    // work on the legacy default stream, whose handle NULL is (see `cuda`).
    if !out.is_null() {
        // SAFETY: non-NULL out slot of the consumer.
        unsafe { *out = std::ptr::null_mut() };
    }
    0
}

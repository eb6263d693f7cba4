//! `dlbridge.Array` for Python: `__dlpack__`, `__dlpack_device__` and the
//! buffer protocol, all zero copy.
//!
//! Invariants (buffer export): every `Py_buffer` handed out points into the
//! Array's storage, which the buffer's `obj` reference (the Array itself)
//! keeps alive; shape and stride arrays live in one heap block stored in
//! `internal` and freed exactly once in `__releasebuffer__`. A read-only Array
//! never hands out a writable buffer.

use std::ffi::{c_int, c_void};

use dlbridge_array::Array;
use dlbridge_core::{DType, Flags, ManagedTensor};
use dlpark::python::{DlpackExporter, ExportRequest, export_dlpack};
use dlpark::{DlpackFlags, Managed};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{IntoPyObjectExt, ffi};

use crate::buffer::format_of;
use crate::errors::IntoPy;

/// dlbridge's own n-dimensional array (CPU memory, any DLPack dtype).
#[pyclass(name = "Array", module = "dlbridge", frozen)]
#[derive(Debug)]
pub struct PyArray {
    pub(crate) inner: Array,
}

impl PyArray {
    /// Wraps an Array.
    pub fn new(inner: Array) -> PyArray {
        PyArray { inner }
    }
    /// The wrapped Array.
    pub fn array(&self) -> &Array {
        &self.inner
    }
}

struct Exporter<'a>(&'a Array);

fn managed<M>(t: ManagedTensor, legacy: bool) -> PyResult<Managed<M>>
where
    M: dlpark::ManagedTensorBase,
{
    let raw: *mut M = if legacy { t.into_raw_legacy().py_err()?.cast() } else { t.into_raw_versioned().cast() };
    // SAFETY: `raw` is a freshly exported, owned DLPack tensor of the matching struct flavour.
    unsafe { Managed::from_raw(raw) }.map_err(|e| PyBufferError::new_err(e.to_string()))
}

impl DlpackExporter for Exporter<'_> {
    fn device(&self) -> dlbridge_core::ffi::DLDevice {
        self.0.device().to_dl()
    }
    fn flags(&self) -> DlpackFlags {
        if self.0.is_read_only() { DlpackFlags::READ_ONLY } else { DlpackFlags::empty() }
    }
    fn prepare_export(&self, _py: Python<'_>, request: &ExportRequest<'_>) -> PyResult<()> {
        if request.stream().is_some_and(|s| !s.is_none()) {
            return Err(PyValueError::new_err("stream must be None for a CPU array"));
        }
        Ok(())
    }
    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<dlbridge_core::ffi::DLManagedTensor>> {
        managed(self.0.to_managed().py_err()?, true)
    }
    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<dlbridge_core::ffi::DLManagedTensorVersioned>> {
        managed(self.0.to_managed().py_err()?, false)
    }
}

#[pymethods]
impl PyArray {
    /// The shape, as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }
    /// The strides in elements, as a tuple.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.strides())
    }
    /// The dtype name (`f32`, `bf16`, ...).
    #[getter]
    fn dtype(&self) -> String {
        self.inner.dtype().to_string()
    }
    /// Number of dims.
    #[getter]
    fn ndim(&self) -> usize {
        self.inner.ndim()
    }
    /// Number of elements.
    #[getter]
    fn size(&self) -> usize {
        self.inner.numel()
    }
    /// Whether writes are refused.
    #[getter]
    fn readonly(&self) -> bool {
        self.inner.is_read_only()
    }
    /// Address of element [0, ...].
    #[getter]
    fn data_ptr(&self) -> usize {
        self.inner.data_ptr() as usize
    }
    /// The device, e.g. `cpu`.
    #[getter]
    fn device(&self) -> String {
        self.inner.device().to_string()
    }

    fn __len__(&self) -> PyResult<usize> {
        self.inner.shape().first().map(|&n| n as usize).ok_or_else(|| pyo3::exceptions::PyTypeError::new_err("len() of a 0-d array"))
    }

    fn __repr__(&self) -> String {
        format!("dlbridge.Array(shape={:?}, dtype={}, strides={:?}{})", self.inner.shape(), self.inner.dtype(), self.inner.strides(), if self.inner.is_read_only() { ", readonly" } else { "" })
    }

    /// The transpose of a 2-d array (a view).
    #[getter(T)]
    fn t(&self) -> PyResult<PyArray> {
        Ok(PyArray::new(self.inner.t().py_err()?))
    }

    /// A contiguous copy.
    fn contiguous(&self) -> PyResult<PyArray> {
        Ok(PyArray::new(self.inner.contiguous().py_err()?))
    }

    /// `__dlpack__` as the array API standard specifies it (zero copy unless `copy=True`).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let stream = stream.filter(|s| !s.is_none());
        let request = ExportRequest::parse(stream.as_ref(), max_version, dl_device, copy)?;
        if copy != Some(true) {
            return export_dlpack(&Exporter(&self.inner), py, request);
        }
        // copy=True: always a fresh copy, flagged IS_COPIED (versioned only).
        Exporter(&self.inner).prepare_export(py, &request)?;
        if let Some(dev) = request.device()
            && dev != self.inner.device().to_dl()
        {
            return Err(PyBufferError::new_err(format!("cannot copy to device {:?}:{}", dev.device_type, dev.device_id)));
        }
        let copy = self.inner.contiguous().py_err()?;
        let t = copy.into_managed().py_err()?;
        let raw = t.into_raw_versioned();
        let legacy_requested = request.abi() == dlpark::python::ExportAbi::Legacy;
        // SAFETY: `raw` is owned and ours; IS_COPIED is true (a private copy).
        unsafe { (*raw).flags.insert(Flags::IS_COPIED) };
        // SAFETY: re-import of the same owned pointer.
        let t = unsafe { ManagedTensor::from_raw_versioned(raw) }.py_err()?;
        if legacy_requested {
            return managed::<dlbridge_core::ffi::DLManagedTensor>(t, true)?.into_py_any(py);
        }
        managed::<dlbridge_core::ffi::DLManagedTensorVersioned>(t, false)?.into_py_any(py)
    }

    /// `(device_type, device_id)`, device_type a `dlbridge.DLDeviceType`.
    fn __dlpack_device__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, i32)> {
        let d = self.inner.device();
        let enum_ty = py.import("dlbridge._device")?.getattr("DLDeviceType")?;
        Ok((enum_ty.call1((d.kind.0,))?, d.id))
    }

    /// The elements as nested Python lists.
    fn tolist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mv = py.import("builtins")?.getattr("memoryview")?.call1((Bound::new(py, PyArray::new(self.inner.clone()))?,))?;
        mv.call_method0("tolist")
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("NULL Py_buffer"));
        }
        let a = &slf.get().inner;
        if flags & ffi::PyBUF_WRITABLE != 0 && a.is_read_only() {
            return Err(PyBufferError::new_err("dlbridge.Array is read-only"));
        }
        let dtype = a.dtype();
        let format = format_of(dtype).ok_or_else(|| PyBufferError::new_err(format!("{dtype} has no buffer-protocol format code")))?;
        let item = dtype.itemsize().unwrap_or(1) as isize;
        let ndim = a.ndim();
        // shape then strides (bytes), freed in __releasebuffer__.
        let mut dims: Box<[isize]> = a.shape().iter().map(|&n| n as isize).chain(a.strides().iter().map(|&s| s as isize * item)).collect();
        let contiguous = a.is_contiguous();
        if flags & ffi::PyBUF_STRIDES != ffi::PyBUF_STRIDES && !contiguous {
            return Err(PyBufferError::new_err("dlbridge.Array is not contiguous; the consumer must accept strides"));
        }
        let len = a.numel() as isize * item;
        let dims_ptr = dims.as_mut_ptr();
        let internal = Box::into_raw(Box::new(dims)).cast::<c_void>();
        // SAFETY: `view` is the caller's Py_buffer to fill; pointers stay valid
        // until __releasebuffer__ (module invariants); `obj` takes a new reference.
        unsafe {
            (*view).buf = a.data_ptr().cast_mut().cast();
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).len = len;
            (*view).readonly = c_int::from(a.is_read_only());
            (*view).itemsize = item;
            (*view).format = if flags & ffi::PyBUF_FORMAT != 0 { format.as_ptr().cast_mut() } else { std::ptr::null_mut() };
            (*view).ndim = ndim as c_int;
            (*view).shape = if flags & ffi::PyBUF_ND != 0 { dims_ptr } else { std::ptr::null_mut() };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES { dims_ptr.add(ndim) } else { std::ptr::null_mut() };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = internal;
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: `internal` is the Box<Box<[isize]>> leaked in __getbuffer__, released once.
        unsafe {
            let internal = (*view).internal;
            if !internal.is_null() {
                drop(Box::from_raw(internal.cast::<Box<[isize]>>()));
                (*view).internal = std::ptr::null_mut();
            }
        }
    }
}

/// Keeps DType in scope for docs (dtype names are DType's Display).
pub fn dtype_name(d: DType) -> String {
    d.to_string()
}

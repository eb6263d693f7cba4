//! `dlbridge.Array` for Python: `__dlpack__`, `__dlpack_device__` and the
//! buffer protocol, all zero copy; `tolist` for every single-lane dtype.
//!
//! Invariants (buffer export): every `Py_buffer` handed out points into the
//! Array's storage, which the buffer's `obj` reference (the Array itself)
//! keeps alive; shape and stride arrays live in one heap block stored in
//! `internal` and freed exactly once in `__releasebuffer__`. A read-only Array
//! never hands out a writable buffer. The request flags are honoured as PEP
//! 3118 and the CPython buffer docs define them: a C-, F- or ANY-contiguous
//! request on a layout that is not so, and a request without PyBUF_STRIDES on
//! a layout that is not C-contiguous, are BufferErrors; every export carries
//! strides unless it is C-contiguous. `len` is `product(shape) * itemsize`
//! (checked, a BufferError if it overflows), as the CPython docs define it:
//! for a non-contiguous layout (negative, zero/broadcast or gapped strides) it
//! is the size a contiguous copy would have, and the docs allow reading
//! `buf[0..len)` only under a request that guarantees contiguity, which such
//! layouts refuse; so `len` never licenses a read outside the Array's memory.
//!
//! Invariants (objects made here): every raw `PyObject*` a CPython constructor
//! returns is taken over at once by `owned`, which turns NULL (an exception
//! set, e.g. MemoryError) into an error instead of a panic.

use std::ffi::{c_int, c_void};

use dlbridge_array::{Array, Item};
use dlbridge_core::layout::{is_contiguous, is_f_contiguous};
use dlbridge_core::view::try_vec_with_capacity;
use dlbridge_core::{Flags, ManagedTensor};
use dlpark::python::{DlpackExporter, ExportRequest, export_dlpack};
use dlpark::{DlpackFlags, Managed};
use pyo3::exceptions::{PyBufferError, PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList, PySlice, PyTuple};
use pyo3::{IntoPyObjectExt, ffi};

use crate::errors::IntoPy;
use crate::raw::buffer::format_of;

/// dlbridge's own n-dimensional array (host or CUDA memory, any DLPack dtype).
#[pyclass(name = "Array", module = "dlbridge", frozen)]
#[derive(Debug)]
pub struct PyArray {
    /// Dropped only in `Drop`, with any pending Python exception set aside.
    pub(crate) inner: std::mem::ManuallyDrop<Array>,
}

impl Drop for PyArray {
    fn drop(&mut self) {
        // The last Array handle may release a foreign tensor whose deleter runs
        // Python code (a ctypes or Python-level producer). Deallocation can happen
        // while an exception is being raised (`from_dlpack(x).tolist()` failing):
        // set it aside so the deleter runs with none pending, then restore it
        // (DLPack asks the same of capsule destructors).
        // SAFETY: PyErr_Occurred only reads the thread state; pyo3 drops
        // pyclass values with the GIL held.
        let pending = !unsafe { ffi::PyErr_Occurred() }.is_null();
        let saved = if pending { Python::attach(PyErr::take) } else { None };
        // SAFETY: `inner` is dropped exactly once, here, and never used after.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.inner) };
        if let Some(e) = saved {
            Python::attach(|py| e.restore(py));
        }
    }
}

impl PyArray {
    /// Wraps an Array.
    pub fn new(inner: Array) -> PyArray {
        PyArray { inner: std::mem::ManuallyDrop::new(inner) }
    }
    /// The wrapped Array.
    pub fn array(&self) -> &Array {
        &self.inner
    }
}

struct Exporter<'a>(&'a Array);

/// Takes over a new reference a CPython constructor returned; NULL (with the
/// exception it set) becomes that error.
fn owned(py: Python<'_>, ptr: *mut ffi::PyObject) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: every caller passes the direct result of a CPython function that
    // returns a new reference, or NULL with an exception set (module invariants).
    unsafe { Bound::from_owned_ptr_or_err(py, ptr) }
}

fn item_to_py(py: Python<'_>, s: Item) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: each arm calls a plain CPython constructor, with the GIL held (`py`).
    let ptr = unsafe {
        match s {
            Item::Bool(b) => ffi::PyBool_FromLong(std::ffi::c_long::from(b)),
            Item::Int(i) => ffi::PyLong_FromLongLong(i),
            Item::UInt(u) => ffi::PyLong_FromUnsignedLongLong(u),
            Item::Float(f) => ffi::PyFloat_FromDouble(f),
            Item::Complex(re, im) => ffi::PyComplex_FromDoubles(re, im),
        }
    };
    owned(py, ptr)
}

/// Nested lists of `shape`, filled from `leaves` in row-major order.
fn nest<'py>(py: Python<'py>, shape: &[i64], leaves: &mut impl Iterator<Item = Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
    let Some((&n, rest)) = shape.split_first() else {
        return leaves.next().ok_or_else(|| PyValueError::new_err("tolist: fewer elements than the shape holds"));
    };
    let n = ffi::Py_ssize_t::try_from(n).map_err(|_| PyValueError::new_err(format!("tolist: dim {n} is out of range")))?;
    // SAFETY: PyList_New returns a new reference or NULL with MemoryError set.
    let list = owned(py, unsafe { ffi::PyList_New(n) })?.cast_into::<PyList>()?;
    for i in 0..n as usize {
        list.set_item(i, nest(py, rest, leaves)?)?;
    }
    Ok(list.into_any())
}

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
        if crate::cuda::is_cuda(self.0.device()) {
            return crate::cuda::prepare_export(self.0, request);
        }
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
    /// The strides in bytes, as a tuple (NumPy's `strides`); a TypeError for
    /// dtypes whose elements are not whole bytes (`element_strides` has them).
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let item = self.itemsize()? as i64;
        let bytes: Option<Vec<i64>> = self.inner.strides().iter().map(|s| s.checked_mul(item)).collect();
        let bytes = bytes
            .ok_or_else(|| PyValueError::new_err(format!("strides {:?} (elements) in bytes overflow 64 bits", self.inner.strides())))?;
        PyTuple::new(py, bytes)
    }
    /// The strides in elements, as a tuple (DLPack's and torch's `stride()` convention).
    #[getter]
    fn element_strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.strides())
    }
    /// Bytes per element (NumPy's `itemsize`); a TypeError for sub-byte dtypes.
    #[getter]
    fn itemsize(&self) -> PyResult<usize> {
        let dtype = self.inner.dtype();
        dtype.itemsize().ok_or_else(|| {
            PyTypeError::new_err(format!("{dtype} elements are not whole bytes: no byte strides or itemsize (use element_strides)"))
        })
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
        self.inner.shape().first().map(|&n| n as usize).ok_or_else(|| PyTypeError::new_err("len() of unsized object (a 0-d array)"))
    }

    /// `dlbridge.Array(shape=(2, 3), dtype='f32')`, plus the element strides of
    /// a layout that is not C-contiguous and `readonly=True` where it applies.
    fn __repr__(&self) -> String {
        let a = &self.inner;
        let mut s = format!("dlbridge.Array(shape={}, dtype='{}'", py_tuple_text(a.shape()), a.dtype());
        if !a.is_contiguous() {
            s += &format!(", element_strides={}", py_tuple_text(a.strides()));
        }
        if a.device() != dlbridge_core::Device::CPU {
            s += &format!(", device='{}'", a.device());
        }
        if a.is_read_only() {
            s += ", readonly=True";
        }
        s + ")"
    }

    /// The array with its dims reversed (NumPy's `.T`), a view sharing memory.
    #[getter(T)]
    fn t(&self) -> PyResult<PyArray> {
        let perm: Vec<usize> = (0..self.inner.ndim()).rev().collect();
        Ok(PyArray::new(self.inner.permute(&perm).py_err()?))
    }

    /// NumPy's `broadcast_to(a, shape)`: a read-only view of the array with
    /// new leading dims and its size-1 dims repeated (stride 0). Shapes that
    /// do not broadcast are a ValueError.
    fn broadcast_to(&self, shape: Vec<i64>) -> PyResult<PyArray> {
        Ok(PyArray::new(self.inner.broadcast_to(&shape).map_err(|e| PyValueError::new_err(e.to_string()))?))
    }

    /// NumPy's `transpose`: `a.transpose()` / `a.transpose(None)` reverse the
    /// dims, `a.transpose((1, 0, 2))` and `a.transpose(1, 0, 2)` permute them
    /// (output dim `i` is input dim `axes[i]`; negative axes count from the
    /// end). A view sharing memory. Axes that are not a permutation of the
    /// dims are a ValueError.
    #[pyo3(signature = (*axes))]
    fn transpose(&self, axes: &Bound<'_, PyTuple>) -> PyResult<PyArray> {
        let n = self.inner.ndim();
        let items: Vec<Bound<'_, PyAny>> = match axes.len() {
            0 => Vec::new(),
            1 if axes.get_item(0)?.is_none() => Vec::new(),
            1 if axes.get_item(0)?.hasattr("__index__")? => axes.iter().collect(),
            1 => axes.get_item(0)?.try_iter()?.collect::<PyResult<_>>()?,
            _ => axes.iter().collect(),
        };
        if items.is_empty() {
            return self.t();
        }
        if items.len() != n {
            return Err(PyValueError::new_err(format!("axes don't match array: {} axes for a {n}-d array", items.len())));
        }
        let mut perm = Vec::with_capacity(n);
        for item in &items {
            let ax = index_value(item)?;
            let norm = if ax < 0 { ax.checked_add(n as i64) } else { Some(ax) }.filter(|&a| (0..n as i64).contains(&a));
            let Some(a) = norm else {
                return Err(PyValueError::new_err(format!("axis {ax} is out of bounds for array of dimension {n}")));
            };
            if perm.contains(&(a as usize)) {
                return Err(PyValueError::new_err("repeated axis in transpose"));
            }
            perm.push(a as usize);
        }
        Ok(PyArray::new(self.inner.permute(&perm).py_err()?))
    }

    /// Basic indexing as NumPy does it, always a view sharing memory: an int
    /// (negative counts from the end) picks one element and drops the dim, a
    /// slice keeps it (any step, negative too), `...` stands for every dim
    /// not indexed, and a tuple combines them; dims not indexed are kept
    /// whole. An int out of range or more indices than dims is an IndexError;
    /// a step of zero is a ValueError; other index types (None, arrays,
    /// bools) are an IndexError. Indexing every dim with ints gives a 0-d Array.
    fn __getitem__(&self, key: &Bound<'_, PyAny>) -> PyResult<PyArray> {
        let items: Vec<Bound<'_, PyAny>> = match key.cast::<PyTuple>() {
            Ok(t) => t.iter().collect(),
            Err(_) => vec![key.clone()],
        };
        let is_ellipsis = |o: &Bound<'_, PyAny>| o.is(o.py().Ellipsis());
        let ellipses = items.iter().filter(|o| is_ellipsis(o)).count();
        if ellipses > 1 {
            return Err(PyIndexError::new_err("an index can only have a single ellipsis ('...')"));
        }
        let ndim = self.inner.ndim();
        let indexed = items.len() - ellipses;
        if indexed > ndim {
            return Err(PyIndexError::new_err(format!(
                "too many indices for array: array is {ndim}-dimensional, but {indexed} were indexed"
            )));
        }
        let mut out = (*self.inner).clone();
        // `dim` is the dim of `out` the next index applies to (ints drop theirs),
        // `axis` the same dim of `self` (for error messages).
        let (mut dim, mut axis) = (0usize, 0usize);
        for item in &items {
            if is_ellipsis(item) {
                dim += ndim - indexed;
                axis += ndim - indexed;
                continue;
            }
            if let Ok(s) = item.cast::<PySlice>() {
                let n = out.shape()[dim];
                let len = isize::try_from(n).map_err(|_| PyIndexError::new_err(format!("dim {dim} of size {n} is too large to slice")))?;
                let ix = s.indices(len)?;
                let (start, step, count) = (ix.start as i64, ix.step as i64, ix.slicelength as i64);
                out = if count == 0 {
                    // As NumPy: an empty slice has step 1 (its stride is the dim's own).
                    out.slice(dim, 0, 0, 1)
                } else {
                    // The exact end: `slice` reads a negative end as counted from the end,
                    // so "before index 0" (step < 0) is passed as i64::MIN (clamped to -1).
                    let end = start + (count - 1) * step + step.signum();
                    out.slice(dim, start, if end < 0 { i64::MIN } else { end }, step)
                }
                .py_err()?;
                dim += 1;
            } else if item.is_instance_of::<PyBool>() || !item.hasattr("__index__")? {
                return Err(PyIndexError::new_err(format!(
                    "only integers, slices (`:`) and ellipsis (`...`) are valid dlbridge.Array indices, not {}",
                    item.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
                )));
            } else {
                let n = out.shape()[dim];
                let i = index_value(item)?;
                if !(-n..n).contains(&i) {
                    return Err(PyIndexError::new_err(format!("index {item} is out of bounds for axis {axis} with size {n}")));
                }
                out = out.select(dim, i).py_err()?;
            }
            axis += 1;
        }
        Ok(PyArray::new(out))
    }

    /// A contiguous copy, on the array's own device.
    fn contiguous(&self) -> PyResult<PyArray> {
        Ok(PyArray::new(crate::cuda::contiguous(&self.inner)?))
    }

    /// `__dlpack__` as the array API standard specifies it (zero copy unless `copy=True`).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let dl_device = dl_device.filter(|d| !d.is_none()).map(|d| parse_dl_device(&d)).transpose()?;
        let stream = stream.filter(|s| !s.is_none());
        let request = ExportRequest::parse(stream.as_ref(), max_version, dl_device, copy)?;
        let own = self.inner.device();
        let target = request.device().map(dlbridge_core::Device::from_dl).transpose().py_err()?;
        let elsewhere = target.is_some_and(|t| t != own);
        // Zero copy unless a copy is asked for (copy=True) or is the only way to
        // the requested device (copy=None; copy=False there is refused by name).
        if copy != Some(true) && !(elsewhere && copy.is_none()) {
            return export_dlpack(&Exporter(&self.inner), py, request);
        }
        let to = target.unwrap_or(own);
        // The consumer's stream: a CPU array takes none (unless copied to CUDA); a
        // device copy is queued on the legacy stream, which the consumer's then waits for.
        let consumer = if crate::cuda::is_cuda(to) { crate::cuda::consumer_stream(&request)? } else { None };
        if !crate::cuda::is_cuda(own) && !crate::cuda::is_cuda(to) {
            Exporter(&self.inner).prepare_export(py, &request)?;
        }
        let copied = crate::cuda::copy_to(&self.inner, to)?;
        if let Some(c) = consumer.filter(|_| crate::cuda::is_cuda(own)) {
            crate::cuda::device(to).py_err()?.stream_wait(dlbridge_cuda::stream::LEGACY, c).py_err()?;
        }
        if crate::cuda::is_cuda(to) {
            // The copy goes to the consumer for good: not cached when freed.
            crate::cuda::device(to).py_err()?.mark_lent(copied.data_ptr() as usize as u64);
        }
        // Always a fresh copy, flagged IS_COPIED (versioned only).
        let t = copied.into_managed().py_err()?;
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

    /// A copy on `device` (`"cpu"`, `"cuda"`, `"cuda:1"`, or a
    /// `(device_type, device_id)` pair), as the array API's `to_device`: the
    /// array itself when it is there already. Host <-> CUDA copies are
    /// synchronous; a strided host array arrives compact on the device, a CUDA
    /// array keeps its layout on the host. `stream` must be None (dlbridge
    /// orders its CUDA work on the legacy default stream; see `__dlpack__`).
    #[pyo3(signature = (device, /, *, stream=None))]
    fn to_device(slf: &Bound<'_, Self>, device: &Bound<'_, PyAny>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
        if stream.is_some_and(|s| !s.is_none()) {
            return Err(PyValueError::new_err(
                "to_device: stream must be None (dlbridge's CUDA arrays are ordered on the legacy default stream)",
            ));
        }
        let to = parse_device(device)?;
        let a = &slf.get().inner;
        if to == a.device() {
            return Ok(slf.clone().into_any().unbind());
        }
        Ok(Bound::new(slf.py(), PyArray::new(crate::cuda::copy_to(a, to)?))?.into_any().unbind())
    }

    /// `(device_type, device_id)`, device_type a `dlbridge.DLDeviceType`.
    fn __dlpack_device__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, i32)> {
        let d = self.inner.device();
        let enum_ty = py.import("dlbridge._device")?.getattr("DLDeviceType")?;
        Ok((enum_ty.call1((d.kind.0,))?, d.id))
    }

    /// The elements as nested Python lists (a Python scalar for a 0-d array):
    /// `bool` for bool, `int` for integers of any width, `float` for every real
    /// float dtype (f16, bf16, the float8/6/4 families decoded exactly),
    /// `complex` for complex dtypes. Vector and opaque-handle dtypes are a
    /// TypeError naming the dtype; memory for the result that cannot be had is
    /// a MemoryError.
    fn tolist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let host;
        let a = if crate::cuda::is_cuda(self.inner.device()) {
            // CuPy's tolist does the same: a host copy first.
            host = crate::cuda::copy_to(&self.inner, dlbridge_core::Device::CPU)?;
            &host
        } else {
            &*self.inner
        };
        let scalars = a.items().py_err()?;
        // One slot per element, reserved fallibly before any Python object is made
        // (a broadcast array of 2^46 elements is a MemoryError here, not an abort).
        let mut leaves: Vec<Bound<'py, PyAny>> = try_vec_with_capacity(a.numel(), "tolist").py_err()?;
        for s in scalars {
            leaves.push(item_to_py(py, s.py_err()?)?);
        }
        nest(py, a.shape(), &mut leaves.into_iter())
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("NULL Py_buffer"));
        }
        let a = &slf.get().inner;
        if !a.device().is_host_accessible() {
            return Err(PyBufferError::new_err(format!(
                "dlbridge.Array on {} has no buffer protocol (its memory is not host memory): use to_device('cpu') or __dlpack__",
                a.device()
            )));
        }
        let wants = |bits: c_int| flags & bits == bits;
        if wants(ffi::PyBUF_WRITABLE) && a.is_read_only() {
            return Err(PyBufferError::new_err("dlbridge.Array is read-only"));
        }
        let dtype = a.dtype();
        let format = format_of(dtype).ok_or_else(|| PyBufferError::new_err(format!("{dtype} has no buffer-protocol format code")))?;
        let item = dtype.itemsize().ok_or_else(|| PyBufferError::new_err(format!("{dtype} elements are not whole bytes")))?;
        let (shape, strides) = (a.shape(), a.strides());
        let c_contiguous = is_contiguous(shape, strides);
        let f_contiguous = is_f_contiguous(shape, strides);
        let layout = || format!("shape {shape:?}, strides {strides:?} (elements)");
        // PyBUF_{C,F,ANY}_CONTIGUOUS each include PyBUF_STRIDES: test the contiguity
        // bit itself, or every strided request would look like a contiguity request.
        let contiguity = |bits: c_int| flags & (bits & !ffi::PyBUF_STRIDES) != 0;
        if contiguity(ffi::PyBUF_C_CONTIGUOUS) && !c_contiguous {
            return Err(PyBufferError::new_err(format!("dlbridge.Array is not C-contiguous: {}", layout())));
        }
        if contiguity(ffi::PyBUF_F_CONTIGUOUS) && !f_contiguous {
            return Err(PyBufferError::new_err(format!("dlbridge.Array is not Fortran-contiguous: {}", layout())));
        }
        if contiguity(ffi::PyBUF_ANY_CONTIGUOUS) && !c_contiguous && !f_contiguous {
            return Err(PyBufferError::new_err(format!("dlbridge.Array is neither C- nor Fortran-contiguous: {}", layout())));
        }
        let with_strides = wants(ffi::PyBUF_STRIDES);
        if !with_strides && !c_contiguous {
            return Err(PyBufferError::new_err(format!(
                "dlbridge.Array is not C-contiguous ({}); the consumer must accept strides (PyBUF_STRIDES)",
                layout()
            )));
        }
        let too_large = || PyBufferError::new_err(format!("dlbridge.Array of {} {dtype} elements is too large for a Py_buffer", a.numel()));
        let item = isize::try_from(item).map_err(|_| too_large())?;
        // len = product(shape) * itemsize, as CPython defines it (see the module docs).
        let len = isize::try_from(a.numel()).ok().and_then(|n| n.checked_mul(item)).ok_or_else(too_large)?;
        // shape then strides (bytes), freed in __releasebuffer__.
        let mut dims: Box<[isize]> = shape
            .iter()
            .map(|&n| isize::try_from(n).ok())
            .chain(strides.iter().map(|&s| isize::try_from(s).ok().and_then(|s| s.checked_mul(item))))
            .collect::<Option<_>>()
            .ok_or_else(|| PyBufferError::new_err(format!("{} in bytes does not fit a Py_buffer", layout())))?;
        let ndim = c_int::try_from(shape.len()).map_err(|_| too_large())?;
        let dims_ptr = dims.as_mut_ptr();
        let strides_ptr = dims_ptr.wrapping_add(shape.len());
        let internal = Box::into_raw(Box::new(dims)).cast::<c_void>();
        // SAFETY: `view` is the caller's Py_buffer to fill; pointers stay valid
        // until __releasebuffer__ (module invariants); `obj` takes a new reference.
        unsafe {
            (*view).buf = a.data_ptr().cast_mut().cast();
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).len = len;
            (*view).readonly = c_int::from(a.is_read_only());
            (*view).itemsize = item;
            (*view).format = if wants(ffi::PyBUF_FORMAT) { format.as_ptr().cast_mut() } else { std::ptr::null_mut() };
            // Without PyBUF_ND there is no shape: the buffer is read as `len` bytes, a
            // 1-d run (CPython's reference exporter and NumPy do the same; ndim > 1 with
            // a NULL shape crashes memoryview).
            (*view).ndim = if wants(ffi::PyBUF_ND) { ndim } else { 1 };
            (*view).shape = if wants(ffi::PyBUF_ND) { dims_ptr } else { std::ptr::null_mut() };
            (*view).strides = if with_strides { strides_ptr } else { std::ptr::null_mut() };
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

/// `(2, 3)`, `(2,)` or `()`: a tuple of ints as Python writes it.
fn py_tuple_text(v: &[i64]) -> String {
    match v {
        [x] => format!("({x},)"),
        _ => format!("({})", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

/// An index or axis through `__index__` (ints, NumPy integers); one that does
/// not fit in 64 bits saturates (it is out of range anyway).
fn index_value(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    let i = obj.call_method0("__index__")?;
    match i.extract::<i64>() {
        Ok(v) => Ok(v),
        Err(_) if i.lt(0)? => Ok(i64::MIN),
        Err(_) => Ok(i64::MAX),
    }
}

/// A device as Python names it: `"cpu"`, `"cuda"` (device 0), `"cuda:N"`, or a
/// `(device_type, device_id)` pair (DLPack's codes, `dlbridge.DLDeviceType` too).
pub fn parse_device(d: &Bound<'_, PyAny>) -> PyResult<dlbridge_core::Device> {
    if let Ok(s) = d.extract::<String>() {
        let parsed = match s.split_once(':') {
            None if s == "cpu" => Some(dlbridge_core::Device::CPU),
            None if s == "cuda" => Some(dlbridge_core::Device::cuda(0)),
            Some(("cuda", id)) => id.parse::<i32>().ok().filter(|&i| i >= 0).map(dlbridge_core::Device::cuda),
            _ => None,
        };
        return parsed.ok_or_else(|| {
            PyValueError::new_err(format!("device {:?}: expected \"cpu\", \"cuda\" or \"cuda:N\"", crate::raw::capsule::bounded(&s)))
        });
    }
    if d.hasattr("__dlpack_device__")? && !d.is_instance_of::<PyTuple>() {
        return Err(PyTypeError::new_err("device: pass a device (\"cuda:0\" or a (device_type, device_id) pair), not an array"));
    }
    let (kind, id) = parse_dl_device(d)?;
    dlbridge_core::Device::from_dl(dlbridge_core::ffi::DLDevice { device_type: dlbridge_core::ffi::DLDeviceType(kind), device_id: id })
        .py_err()
}

/// `dl_device=(device_type, device_id)`: each field checked, and named when it is out of range.
fn parse_dl_device(d: &Bound<'_, PyAny>) -> PyResult<(u32, i32)> {
    let (kind, id): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
        d.extract().map_err(|_| pyo3::exceptions::PyTypeError::new_err("dl_device must be a (device_type, device_id) tuple"))?;
    let field = |v: &Bound<'_, PyAny>, name: &str, range: &str| {
        let shown = v.repr().map(|r| crate::raw::capsule::bounded(&r.to_string())).unwrap_or_default();
        pyo3::exceptions::PyValueError::new_err(format!("dl_device: {name} = {shown} is out of range ({range})"))
    };
    let kind_v: u32 = kind.extract().map_err(|_| field(&kind, "device_type", "a DLDeviceType code, 0..=2^32-1"))?;
    let id_v: i32 = id.extract().map_err(|_| field(&id, "device_id", "0..=2^31-1"))?;
    Ok((kind_v, id_v))
}

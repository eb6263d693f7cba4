//! The Python buffer protocol, both ways: importing any buffer (bytes,
//! bytearray, memoryview, array.array, NumPy) as a DLPack tensor with zero
//! copies, and the struct-format codes dlbridge dtypes export as.
//!
//! Invariants: a `BufferOwner` holds one successful `PyObject_GetBuffer`
//! and calls `PyBuffer_Release` exactly once, with the GIL attached, when it
//! drops (or leaks it if the interpreter is gone). `ndim` is checked against
//! [`MAX_NDIM`] (and for being negative) before `shape` or `strides` is read,
//! and those arrays are read for `ndim` entries only. The shape and strides are
//! copied out of the `Py_buffer` and validated like any foreign tensor; the
//! data pointer stays valid while the buffer is held. A buffer requested
//! read-only is exported with the READ_ONLY flag.

use std::ffi::{CStr, c_void};

use dlbridge_core::layout::{Extent, MAX_NDIM, contiguous_strides};
use dlbridge_core::{DType, Device, Error, Flags, ManagedTensor, Result, TensorDesc, TensorView};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use smallvec::SmallVec;

/// Owns one `Py_buffer`; releases it (with the GIL) on drop.
struct BufferOwner {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the Py_buffer is only touched again in Drop, which attaches to the
// interpreter (takes the GIL) before releasing it.
unsafe impl Send for BufferOwner {}

impl Drop for BufferOwner {
    fn drop(&mut self) {
        // SAFETY: reading whether the interpreter is alive needs no GIL.
        if unsafe { ffi::Py_IsInitialized() } == 0 {
            return; // interpreter gone: leak rather than crash
        }
        Python::attach(|_py| {
            // SAFETY: this view came from a successful PyObject_GetBuffer and is released once.
            unsafe { ffi::PyBuffer_Release(&mut *self.view) };
        });
    }
}

/// Parses a struct-module format string into a dtype; non-native byte order is an error.
pub fn parse_format(format: &str, itemsize: usize) -> Result<DType> {
    let (order, code) = match format.strip_prefix(['@', '=', '<', '>', '!']) {
        Some(rest) => (format.chars().next().unwrap_or('@'), rest),
        None => ('@', format),
    };
    let little = cfg!(target_endian = "little");
    let native = match order {
        '<' => little,
        '>' | '!' => !little,
        _ => true,
    };
    let dtype = match code {
        "?" => DType::BOOL,
        "b" => DType::I8,
        "B" | "c" => DType::U8,
        "h" => DType::I16,
        "H" => DType::U16,
        "i" => DType::I32,
        "I" => DType::U32,
        "l" | "q" | "n" if itemsize == 8 => DType::I64,
        "L" | "Q" | "N" if itemsize == 8 => DType::U64,
        "l" if itemsize == 4 => DType::I32,
        "L" if itemsize == 4 => DType::U32,
        "e" => DType::F16,
        "f" => DType::F32,
        "d" => DType::F64,
        "Zf" => DType::C64,
        "Zd" => DType::C128,
        _ => return Err(Error::Buffer(format!("buffer format {format:?} has no DLPack dtype"))),
    };
    if !native && dtype.itemsize() != Some(1) {
        return Err(Error::Buffer(format!("buffer format {format:?} is not in native byte order; DLPack data must be")));
    }
    if dtype.itemsize() != Some(itemsize) {
        return Err(Error::Buffer(format!("buffer format {format:?} says {dtype} but itemsize is {itemsize}")));
    }
    Ok(dtype)
}

/// The struct-module format code of a dtype, for exporting a buffer.
pub fn format_of(dtype: DType) -> Option<&'static CStr> {
    Some(match dtype {
        DType::BOOL => c"?",
        DType::I8 => c"b",
        DType::U8 => c"B",
        DType::I16 => c"h",
        DType::U16 => c"H",
        DType::I32 => c"i",
        DType::U32 => c"I",
        DType::I64 => c"q",
        DType::U64 => c"Q",
        DType::F16 => c"e",
        DType::F32 => c"f",
        DType::F64 => c"d",
        DType::C64 => c"Zf",
        DType::C128 => c"Zd",
        _ => return None,
    })
}

/// A buffer held for one kernel call: the `Py_buffer`, with its shape and
/// strides (in elements) copied out and validated once.
pub(crate) struct BufferTensor {
    owner: BufferOwner,
    shape: SmallVec<[i64; 6]>,
    strides: SmallVec<[i64; 6]>,
    dtype: DType,
    flags: Flags,
    extent: Extent,
}

impl std::fmt::Debug for BufferTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferTensor").field("shape", &self.shape).field("strides", &self.strides).field("dtype", &self.dtype).finish()
    }
}

impl BufferTensor {
    /// The view (validated at import).
    pub(crate) fn view(&self) -> TensorView<'_> {
        // SAFETY: `extent` is what check_layout returned for exactly these
        // shape, strides, dtype, flags and address (byte offset 0) in
        // `import_held`; the exporter keeps `buf` valid while the buffer is held
        // (by `self.owner`), and a read-only buffer carries READ_ONLY.
        unsafe {
            TensorView::from_validated_parts(
                self.owner.view.buf.cast_const().cast(),
                &self.shape,
                &self.strides,
                self.dtype,
                Device::CPU,
                self.flags,
                self.extent,
            )
        }
    }

    /// Whether the buffer is read-only.
    pub(crate) fn is_read_only(&self) -> bool {
        self.flags.contains(Flags::READ_ONLY)
    }

    /// An owning DLPack tensor holding the buffer.
    pub(crate) fn into_managed(self) -> PyResult<ManagedTensor> {
        let data = self.owner.view.buf;
        let desc = TensorDesc {
            dtype: self.dtype,
            device: Device::CPU,
            shape: &self.shape,
            strides: Some(&self.strides),
            byte_offset: 0,
            flags: self.flags,
        };
        // SAFETY: as in `view`: `owner` keeps `buf` valid for the layout it
        // described until the DLPack deleter runs; read-only buffers are flagged.
        unsafe { ManagedTensor::export_owner(self.owner, data.cast::<c_void>(), &desc) }.map_err(crate::errors::to_pyerr)
    }
}

/// Imports `obj` through the buffer protocol with zero copies. With
/// `writable`, a read-only buffer is refused; otherwise the tensor carries
/// READ_ONLY when the buffer is read-only.
pub fn import(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<ManagedTensor> {
    import_held(obj, writable)?.into_managed()
}

/// [`import`], held for a call (no DLPack struct built).
pub(crate) fn import_held(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<BufferTensor> {
    let mut view: Box<ffi::Py_buffer> = Box::new(
        // SAFETY: Py_buffer is a plain C struct; all-zero is its documented empty state.
        unsafe { std::mem::zeroed() },
    );
    let flags = ffi::PyBUF_RECORDS_RO | if writable { ffi::PyBUF_WRITABLE } else { 0 };
    // SAFETY: `view` is a valid, empty Py_buffer; on failure nothing must be released.
    if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } != 0 {
        let err = PyErr::take(obj.py()).unwrap_or_else(|| PyBufferError::new_err("buffer request failed"));
        return Err(err);
    }
    let owner = BufferOwner { view };
    let v = &*owner.view;
    let itemsize = v.itemsize as usize;
    let dtype = if v.format.is_null() {
        parse_format("B", itemsize)
    } else {
        // SAFETY: the exporter provides a NUL-terminated format string while the buffer is held.
        let f = unsafe { CStr::from_ptr(v.format) };
        match f.to_str() {
            Ok(f) => parse_format(f, itemsize),
            Err(_) => parse_format(&f.to_string_lossy(), itemsize),
        }
    }
    .map_err(crate::errors::to_pyerr)?;
    // Bound ndim before anything reads `shape`/`strides`.
    let ndim = usize::try_from(v.ndim).ok().filter(|&n| n <= MAX_NDIM).ok_or_else(|| {
        crate::errors::to_pyerr(Error::InvalidField {
            field: "Py_buffer.ndim".into(),
            value: v.ndim.to_string(),
            reason: format!("must be in 0..={MAX_NDIM}"),
        })
    })?;
    if ndim > 0 && v.shape.is_null() {
        return Err(PyBufferError::new_err("buffer has ndim > 0 but no shape"));
    }
    let mut shape: SmallVec<[i64; 6]> = SmallVec::with_capacity(ndim);
    for d in 0..ndim {
        // SAFETY: shape has ndim entries (PyBUF_ND is part of PyBUF_RECORDS_RO).
        shape.push(unsafe { *v.shape.add(d) } as i64);
    }
    let strides: SmallVec<[i64; 6]> = if v.strides.is_null() {
        contiguous_strides(&shape).map_err(crate::errors::to_pyerr)?
    } else {
        // itemsize >= 1: parse_format matched it to a byte-sized dtype.
        let item =
            i64::try_from(itemsize).ok().filter(|&i| i > 0).ok_or_else(|| PyBufferError::new_err(format!("buffer itemsize {itemsize}")))?;
        let mut strides = SmallVec::with_capacity(ndim);
        for d in 0..ndim {
            // SAFETY: strides has ndim entries when non-NULL.
            let bytes = unsafe { *v.strides.add(d) } as i64;
            if bytes.checked_rem(item) != Some(0) {
                return Err(PyBufferError::new_err(format!(
                    "buffer stride {bytes} bytes (dim {d}) is not a multiple of the itemsize {itemsize}: DLPack strides count elements"
                )));
            }
            strides.push(bytes / item);
        }
        strides
    };
    let read_only = v.readonly != 0;
    if writable && read_only {
        return Err(PyBufferError::new_err("the buffer is read-only and this argument is written"));
    }
    let flags = if read_only { Flags::READ_ONLY } else { Flags::empty() };
    // SAFETY: the exporter guarantees `buf` covers the layout it described
    // while the buffer is held (and `owner` holds it); the layout is validated
    // here like any foreign tensor.
    let extent = unsafe { TensorView::from_raw_parts(v.buf.cast_const().cast(), 0, &shape, Some(&strides), dtype, Device::CPU, flags) }
        .map_err(crate::errors::to_pyerr)?
        .extent();
    Ok(BufferTensor { owner, shape, strides, dtype, flags, extent })
}

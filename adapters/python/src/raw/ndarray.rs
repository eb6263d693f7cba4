//! Exact `numpy.ndarray`s read in place: the array object's own fields (data
//! pointer, dimensions, byte strides, dtype number and byte order, flags),
//! without a buffer export, a format string or a capsule.
//!
//! NumPy's `PyArrayObject_fields` and the head of `PyArray_Descr` (up to
//! `type_num`) have kept their layout across NumPy 1.x and 2.x; the layout
//! assumed here is **checked once per process** against what NumPy itself
//! reports for probe arrays (`__array_interface__`, `strides`, `flags`,
//! `dtype.num`, `dtype.byteorder`), and the fast path stays off when anything
//! differs (every array then takes the buffer protocol, as before).
//!
//! Invariants:
//! - fields are read only from objects whose type is exactly `numpy.ndarray`
//!   (checked by pointer), while the caller holds a strong reference, with
//!   the GIL held; `nd` is bounded by [`MAX_NDIM`] (and checked for being
//!   negative) before `dimensions` or `strides` is read, and those arrays are
//!   read for `nd` entries only;
//! - the shape and strides are copied out and validated like any foreign
//!   tensor ([`TensorView::from_raw_parts`]); a read that takes anything
//!   unusual (a dtype without a DLPack code, non-native byte order, a byte
//!   stride that is not a whole number of elements, an array NumPy would warn
//!   about when written) is declined, and the caller takes the buffer protocol
//!   with its errors;
//! - the copy is used only while it still describes the array: each view
//!   compares the object's fields with it again when Python code may have
//!   run since it was taken (see `import::python_may_run`), so an array
//!   resized, reshaped, retyped or made read-only in between is an error, not
//!   a read of its freed buffer. (Memory the array borrows from a base object
//!   that is itself resized or freed meanwhile is beyond what its fields can
//!   show; a buffer export would not protect either: NumPy lets
//!   `resize(refcheck=False)` free a buffer that is exported.)

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_long};

use dlbridge_core::layout::{Extent, MAX_NDIM};
use dlbridge_core::{DType, Device, Error, Flags, TensorView};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// `NPY_ARRAY_WRITEABLE`.
const WRITEABLE: u32 = 0x0400;
/// `NPY_ARRAY_WARN_ON_WRITE` (NumPy warns when such an array is written or
/// exported writable; those arrays take the buffer protocol, which warns).
const WARN_ON_WRITE: u32 = 0x8000_0000;

/// The head of NumPy's `PyArrayObject_fields` (stable across NumPy 1.x and 2.x).
#[repr(C)]
struct ArrayFields {
    ob_base: ffi::PyObject,
    data: *mut u8,
    nd: c_int,
    dimensions: *const isize,
    strides: *const isize,
    base: *mut ffi::PyObject,
    descr: *const DescrHead,
    flags: c_int,
}

/// The head of NumPy's `PyArray_Descr`, up to `type_num` (stable across NumPy 1.x and 2.x).
#[repr(C)]
struct DescrHead {
    ob_base: ffi::PyObject,
    typeobj: *mut ffi::PyTypeObject,
    kind: c_char,
    type_: c_char,
    byteorder: c_char,
    former_flags: c_char,
    type_num: c_int,
}

/// `numpy.ndarray`, when NumPy is importable and its layout is what this
/// module reads (checked once).
static NDARRAY: PyOnceLock<Option<(Py<pyo3::types::PyType>, bool)>> = PyOnceLock::new();

/// `(numpy.ndarray, whether its fields may be read in place)`, or None without NumPy.
fn ndarray_type(py: Python<'_>) -> Option<&(Py<pyo3::types::PyType>, bool)> {
    if NDARRAY.get(py).is_none() {
        // Importing NumPy and reading the probes runs Python code, and a thread
        // that waits for another one's first use lets other threads run it:
        // every caller that may not find the answer ready bumps the epoch.
        crate::epoch::python_may_run();
    }
    NDARRAY
        .get_or_init(py, || {
            let np = py.import("numpy").ok()?;
            let ty = np.getattr("ndarray").ok()?.cast_into::<pyo3::types::PyType>().ok()?.unbind();
            let ok = layout_matches(py, &np, &ty).unwrap_or(false);
            Some((ty, ok))
        })
        .as_ref()
}

/// Whether NumPy is installed and its array layout is the one read here.
pub(crate) fn in_place(py: Python<'_>) -> bool {
    ndarray_type(py).is_some_and(|(_, ok)| *ok)
}

/// Whether `obj` is exactly a `numpy.ndarray` (not a subclass: a subclass may
/// override `__dlpack__`); false when NumPy is not installed.
pub(crate) fn is_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    ndarray_type(obj.py()).is_some_and(|(t, _)| std::ptr::eq(obj.get_type_ptr(), t.as_ptr().cast()))
}

/// Reads probe arrays both ways (in place, and through NumPy's own Python
/// API) and says whether they agree on everything [`read_fields`] reads.
fn layout_matches(py: Python<'_>, np: &Bound<'_, PyModule>, ty: &Py<pyo3::types::PyType>) -> PyResult<bool> {
    let code = c"import numpy as np
a = np.arange(60, dtype=np.float64).reshape(3, 4, 5)[1:, ::2, ::-1]
b = np.zeros(7, dtype='>i4')[::3]
b.flags.writeable = False
c = np.zeros((), dtype=np.int8)
probes = [a, b, c, np.zeros((2, 0), dtype=np.complex64), np.zeros(3, dtype=np.float16)]
";
    // Nothing is read before NumPy says its objects are at least this large.
    let basic: usize = ty.bind(py).getattr("__basicsize__")?.extract()?;
    if basic < std::mem::size_of::<ArrayFields>() {
        return Ok(false);
    }
    let globals = pyo3::types::PyDict::new(py);
    globals.set_item("np", np)?;
    py.run(code, Some(&globals), None)?;
    let Some(probes) = globals.get_item("probes")? else { return Ok(false) };
    for p in probes.try_iter()? {
        let p = p?;
        if !std::ptr::eq(p.get_type_ptr(), ty.as_ptr().cast()) {
            return Ok(false);
        }
        // SAFETY: `p` is exactly a numpy.ndarray, alive (held), GIL held; this
        // reads the head fields whose layout is being checked, bounded by `nd`.
        let f = unsafe { read_fields(&p) };
        let Some(f) = f else { return Ok(false) };
        let iface = p.getattr("__array_interface__")?;
        let (data, _): (usize, bool) = iface.get_item("data")?.extract()?;
        let shape: Vec<isize> = p.getattr("shape")?.extract()?;
        let strides: Vec<isize> = p.getattr("strides")?.extract()?;
        let writeable: bool = p.getattr("flags")?.getattr("writeable")?.extract()?;
        let dt = p.getattr("dtype")?;
        let num: c_int = dt.getattr("num")?.extract()?;
        let order: String = dt.getattr("byteorder")?.extract()?;
        if f.data as usize != data
            || f.shape != shape.as_slice()
            || f.strides != strides.as_slice()
            || (f.flags & WRITEABLE != 0) != writeable
            || f.type_num != num
            || order.as_bytes() != [f.byteorder as u8]
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The fields of an array, as NumPy holds them (strides in bytes).
struct Fields<'a> {
    data: *mut u8,
    shape: &'a [isize],
    strides: &'a [isize],
    flags: u32,
    type_num: c_int,
    byteorder: c_char,
}

/// Reads the fields of `obj`; None when `nd` is out of range or a pointer
/// the fields need is NULL.
///
/// # Safety
/// `obj` must be exactly a `numpy.ndarray` whose layout [`layout_matches`]
/// checked (or is checking), and no Python code may run while the result is used.
#[inline]
unsafe fn read_fields<'a>(obj: &'a Bound<'_, PyAny>) -> Option<Fields<'a>> {
    let a = obj.as_ptr().cast::<ArrayFields>();
    // SAFETY: per the contract `obj` is an ndarray, so its object starts with
    // these fields; the GIL is held and nothing mutates it meanwhile.
    let a = unsafe { &*a };
    let nd = usize::try_from(a.nd).ok().filter(|&n| n <= MAX_NDIM)?;
    if a.descr.is_null() || (nd > 0 && (a.dimensions.is_null() || a.strides.is_null())) {
        return None;
    }
    // SAFETY: NumPy keeps `nd` entries in `dimensions` and `strides` (checked
    // non-NULL when nd > 0) for as long as the array is not reshaped in place,
    // which takes Python code; `descr` is the array's dtype (non-NULL).
    let (shape, strides, descr): (&[isize], &[isize], &DescrHead) = unsafe {
        if nd == 0 {
            (&[], &[], &*a.descr)
        } else {
            (std::slice::from_raw_parts(a.dimensions, nd), std::slice::from_raw_parts(a.strides, nd), &*a.descr)
        }
    };
    Some(Fields { data: a.data, shape, strides, flags: a.flags as u32, type_num: descr.type_num, byteorder: descr.byteorder })
}

/// The DLPack dtype of a NumPy type number (the types with a DLPack code).
fn dtype_of(type_num: c_int) -> Option<DType> {
    let long64 = std::mem::size_of::<c_long>() == 8;
    Some(match type_num {
        0 => DType::BOOL,
        1 => DType::I8,
        2 => DType::U8,
        3 => DType::I16,
        4 => DType::U16,
        5 => DType::I32,
        6 => DType::U32,
        7 if long64 => DType::I64,
        7 => DType::I32,
        8 if long64 => DType::U64,
        8 => DType::U32,
        9 => DType::I64,
        10 => DType::U64,
        11 => DType::F32,
        12 => DType::F64,
        14 => DType::C64,
        15 => DType::C128,
        23 => DType::F16,
        _ => return None,
    })
}

/// Arrays of at most this many dimensions are read in place (their strides,
/// in elements, are kept inline); others take the buffer protocol.
const INLINE: usize = 4;

/// An exact `numpy.ndarray` bound to a call: its data pointer, shape, strides
/// (converted to elements) and validated extent, copied out. Kept small: it
/// travels inside every bound argument.
#[derive(Debug)]
pub(crate) struct NdArray {
    data: *const u8,
    shape: [i64; INLINE],
    strides: [i64; INLINE],
    extent: Extent,
    /// The epoch (see `import::python_may_run`) at which the array was last
    /// seen to match these parts.
    seen: Cell<u64>,
    dtype: DType,
    ndim: u8,
    read_only: bool,
}

impl NdArray {
    /// Reads `obj` in place when it is an exact ndarray this path takes (see
    /// the module docs); `Ok(None)` declines (the caller takes the buffer
    /// protocol). `writable` declines read-only arrays (the buffer protocol
    /// gives NumPy's own error for them).
    pub(crate) fn read(obj: &Bound<'_, PyAny>, writable: bool) -> dlbridge_core::Result<Option<Self>> {
        let Some((ty, true)) = ndarray_type(obj.py()) else { return Ok(None) };
        if !std::ptr::eq(obj.get_type_ptr(), ty.as_ptr().cast()) {
            return Ok(None);
        }
        let seen = crate::epoch::epoch();
        // SAFETY: `obj` is exactly numpy.ndarray (checked above), its layout
        // was checked at start-up, the GIL is held and `obj` is alive; the
        // fields are copied out before any Python code can run.
        let Some(f) = (unsafe { read_fields(obj) }) else { return Ok(None) };
        let Some(dtype) = dtype_of(f.type_num) else { return Ok(None) };
        if f.shape.len() > INLINE || f.byteorder as u8 == NON_NATIVE || f.flags & WARN_ON_WRITE != 0 {
            return Ok(None);
        }
        let read_only = f.flags & WRITEABLE == 0;
        if writable && read_only {
            return Ok(None);
        }
        let Some(item) = dtype.itemsize().and_then(|i| isize::try_from(i).ok()) else { return Ok(None) };
        let mut strides = [0i64; INLINE];
        for (d, &s) in strides.iter_mut().zip(f.strides) {
            if s % item != 0 {
                return Ok(None);
            }
            *d = (s / item) as i64;
        }
        let ndim = f.shape.len();
        let mut shape = [0i64; INLINE];
        for (d, &n) in shape.iter_mut().zip(f.shape) {
            *d = n as i64;
        }
        let flags = if read_only { Flags::READ_ONLY } else { Flags::empty() };
        // SAFETY: NumPy guarantees `data` covers the layout the array
        // describes while the array lives unchanged (it is held; `view`
        // re-checks it is unchanged before every use); the layout is validated
        // here like any foreign tensor.
        let extent = unsafe {
            TensorView::from_raw_parts(f.data.cast_const(), 0, &shape[..ndim], Some(&strides[..ndim]), dtype, Device::CPU, flags)
        }?
        .extent();
        Ok(Some(NdArray { data: f.data.cast_const(), shape, strides, extent, seen: Cell::new(seen), dtype, ndim: ndim as u8, read_only }))
    }

    /// The view of `obj` (the array this was read from), after checking that
    /// the array still matches what was read and validated when Python code
    /// may have run since it was last checked (see the module docs).
    #[inline]
    pub(crate) fn view(&self, obj: &Bound<'_, PyAny>) -> dlbridge_core::Result<TensorView<'_>> {
        let now = crate::epoch::epoch();
        if self.seen.get() != now {
            if !self.unchanged(obj) {
                return Err(self.changed());
            }
            self.seen.set(now);
        }
        let ndim = usize::from(self.ndim);
        let flags = if self.read_only { Flags::READ_ONLY } else { Flags::empty() };
        // SAFETY: `extent` is what check_layout returned for exactly these
        // parts at this address in `read`, and the array (held by the caller)
        // still has this data pointer, shape and strides (just checked, with
        // the GIL held); the parts are this struct's own copies.
        Ok(unsafe {
            TensorView::from_validated_parts(
                self.data,
                &self.shape[..ndim],
                &self.strides[..ndim],
                self.dtype,
                Device::CPU,
                flags,
                self.extent,
            )
        })
    }

    #[cold]
    fn changed(&self) -> Error {
        Error::Runtime(
            "the NumPy array was resized, reshaped, retyped or had its flags changed while the call was being prepared \
             (by Python code run meanwhile); call again"
                .into(),
        )
    }

    /// Whether `obj`'s fields still say what was read.
    #[inline]
    fn unchanged(&self, obj: &Bound<'_, PyAny>) -> bool {
        // SAFETY: `obj` is the exact ndarray `read` read (the caller holds it),
        // the GIL is held, and the fields are only compared.
        let Some(f) = (unsafe { read_fields(obj) }) else { return false };
        let ndim = usize::from(self.ndim);
        let item = self.dtype.itemsize().unwrap_or(1) as i64;
        std::ptr::eq(f.data.cast_const(), self.data)
            && f.flags & WARN_ON_WRITE == 0
            && (self.read_only || f.flags & WRITEABLE != 0)
            && dtype_of(f.type_num) == Some(self.dtype)
            && f.byteorder as u8 != NON_NATIVE
            && f.shape.len() == ndim
            && f.shape.iter().zip(&self.shape[..ndim]).all(|(&a, &b)| a as i64 == b)
            && f.strides.iter().zip(&self.strides[..ndim]).all(|(&a, &b)| a as i64 == b * item)
    }
}

/// The byte-order character of a dtype that is not in this machine's order.
const NON_NATIVE: u8 = if cfg!(target_endian = "little") { b'>' } else { b'<' };

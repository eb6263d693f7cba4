//! A vectorcall entry (PEP 590) for `dlbridge.Kernel`.
//!
//! pyo3 gives a pyclass's `__call__` only the `tp_call` slot: every call
//! builds a tuple of the positional arguments and a dict of the keywords,
//! and pyo3 then takes them apart again. A vectorcall entry receives the
//! caller's argument array as it lies on the interpreter's stack, with the
//! keywords' names in a tuple the compiler made once. pyo3 cannot declare one
//! (PyO3#4252) and the limited API has no call to set one on an existing type
//! before 3.12's `Py_TPFLAGS_HAVE_VECTORCALL` — so [`install`] sets the two
//! fields of `dlbridge.Kernel`'s type object that CPython reads, after
//! checking that the type object is laid out as this module assumes.
//!
//! **Invariants**
//! - The type object is written only after every field around the two written
//!   ones read back what the interpreter's own API answers for the same type
//!   (`TypeHead`, [`install`]): its metatype, name, sizes, and the slots
//!   `PyType_GetSlot` and `PyType_GetFlags` report. Any difference (another
//!   interpreter, a free-threaded build, a 32-bit platform) leaves the type as
//!   pyo3 made it, and calls take `tp_call` as before.
//! - The type has no subclasses (no `Py_TPFLAGS_BASETYPE`, checked), and
//!   [`freeze`] makes it immutable (`Py_TPFLAGS_IMMUTABLETYPE`, 3.10+; pyo3
//!   offers `immutable_type` to abi3 builds only from 3.14) once the `dlbridge`
//!   package has set its own attributes on it: from then on nobody can assign
//!   `Kernel.__call__`, which on 3.11 would change `tp_call` and leave the
//!   entry in place (3.12 clears the flag then).
//! - It is written once, at module initialisation, before any Kernel is
//!   called (no other thread can be using the type), and only to add: the
//!   offset of the entry in an instance and the flag that says it is there.
//! - Every `PyKernel` holds `kernel_vectorcall` in its `vectorcall` field
//!   from construction on, at the same offset in every instance (one Rust
//!   struct inside pyo3's fixed instance layout); the offset is measured on a
//!   real instance and checked to lie inside `tp_basicsize`.
//! - The entry is pyo3's own fastcall trampoline (GIL bookkeeping, panics
//!   turned into `PanicException`, errors restored), and the call it makes is
//!   the one `tp_call` makes (`PyKernel::call_objects`): the
//!   same binding, checks and errors.

use std::ffi::{CStr, c_char, c_ulong, c_void};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple, PyType};
use pyo3::{PyTypeInfo, ffi};

use crate::kernel::PyKernel;

/// `Py_TPFLAGS_HAVE_VECTORCALL` (1 << 11 in every CPython since 3.8, where
/// it was `_Py_TPFLAGS_HAVE_VECTORCALL`; the limited API names it from 3.12).
const HAVE_VECTORCALL: c_ulong = 1 << 11;
/// `PY_VECTORCALL_ARGUMENTS_OFFSET`: the high bit of `nargsf`.
const ARGUMENTS_OFFSET: usize = 1 << (usize::BITS - 1);

/// The head of `PyTypeObject` up to `tp_flags`, as CPython 3.8 to 3.14 lay it
/// out in builds with a GIL (`Include/cpython/object.h`). Only read and
/// written after [`check`] has compared it with the interpreter's answers.
#[repr(C)]
struct TypeHead {
    ob_refcnt: isize,
    ob_type: *mut ffi::PyTypeObject,
    ob_size: isize,
    tp_name: *const c_char,
    tp_basicsize: isize,
    tp_itemsize: isize,
    tp_dealloc: *mut c_void,
    tp_vectorcall_offset: isize,
    tp_getattr: *mut c_void,
    tp_setattr: *mut c_void,
    tp_as_async: *mut c_void,
    tp_repr: *mut c_void,
    tp_as_number: *mut c_void,
    tp_as_sequence: *mut c_void,
    tp_as_mapping: *mut c_void,
    tp_hash: *mut c_void,
    tp_call: *mut c_void,
    tp_str: *mut c_void,
    tp_getattro: *mut c_void,
    tp_setattro: *mut c_void,
    tp_as_buffer: *mut c_void,
    tp_flags: c_ulong,
}

/// The entry every `PyKernel` holds (see the module docs).
///
/// # Safety
/// Called by CPython's vectorcall protocol: `callable` is a `dlbridge.Kernel`,
/// `args` holds `nargsf`'s count of positional arguments followed by one value
/// per name in `kwnames` (a tuple of str, or NULL), all borrowed, and the
/// thread is attached to the interpreter.
pub(crate) unsafe extern "C" fn kernel_vectorcall(
    callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    let nargs = (nargsf & !ARGUMENTS_OFFSET) as ffi::Py_ssize_t;
    let entry = pyo3::get_trampoline_function!(fastcall_cfunction_with_keywords, call);
    // SAFETY: the arguments are CPython's, passed on unchanged (the count
    // without the offset flag, which `call` does not use); the trampoline
    // requires an attached thread, which a vectorcall has.
    unsafe { entry(callable, args, nargs, kwnames) }
}

/// The body of [`kernel_vectorcall`], inside pyo3's trampoline.
///
/// # Safety
/// As [`kernel_vectorcall`], with `nargs` the positional count.
unsafe fn call(
    py: Python<'_>,
    callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: CPython passes the callable it was asked to call, alive for the call.
    let callable = unsafe { Borrowed::from_ptr(py, callable) };
    let kernel = callable.cast::<PyKernel>()?;
    let names = if kwnames.is_null() {
        None
    } else {
        // SAFETY: a non-NULL kwnames is a tuple of str owned by the caller for the call.
        Some(unsafe { Borrowed::from_ptr(py, kwnames) }.cast::<PyTuple>()?.to_owned())
    };
    let nargs = usize::try_from(nargs).unwrap_or(0);
    let total = nargs + names.as_ref().map_or(0, |n| n.len());
    let values: &[*mut ffi::PyObject] = if total == 0 {
        &[]
    } else {
        // SAFETY: the protocol puts `nargs` positional values and one value per
        // keyword name at `args`, valid for the call.
        unsafe { std::slice::from_raw_parts(args, total) }
    };
    // SAFETY: each is a live object the caller holds for the call (borrowed; `to_owned` takes a reference).
    let own = |p: *mut ffi::PyObject| unsafe { Borrowed::from_ptr(py, p) }.to_owned();
    let mut out = None;
    if let Some(names) = &names {
        for (name, &value) in names.iter().zip(&values[nargs..]) {
            // Compared as str objects: a name that is not valid UTF-8 (a lone
            // surrogate) is an unexpected keyword, as in tp_call, not an encoding error.
            let name = name.cast_into::<PyString>()?;
            if !name.eq("out") {
                return Err(PyTypeError::new_err(format!("Kernel.__call__() got an unexpected keyword argument {}", name.repr()?)));
            }
            if out.is_some() {
                return Err(PyTypeError::new_err("Kernel.__call__() got multiple values for keyword argument 'out'"));
            }
            out = Some(own(value));
        }
    }
    let positional = values[..nargs].iter().map(|&p| own(p));
    Ok(kernel.get().call_objects(py, positional, out.as_ref())?.into_ptr())
}

/// Whether the type object of `ty` reads as [`TypeHead`] says, compared with
/// the interpreter's own answers for it.
///
/// # Safety
/// `ty` is a live heap type object (a heap type's object is at least as large
/// as `TypeHead`: every CPython's `PyHeapTypeObject` begins with a full `PyTypeObject`).
unsafe fn check(ty: &Bound<'_, PyType>) -> PyResult<bool> {
    let py = ty.py();
    let raw = ty.as_type_ptr();
    // SAFETY: see the function's contract; only reads.
    let head = unsafe { &*raw.cast::<TypeHead>() };
    // SAFETY: `raw` is a live type object (PyType_GetSlot takes heap types from 3.4 on).
    let slot = |s| unsafe { ffi::PyType_GetSlot(raw, s) };
    let int = |name: &str| -> PyResult<isize> { ty.getattr(name)?.extract() };
    // SAFETY: `tp_name` is a NUL-terminated string owned by the type, when the metatype check passed.
    let name_ok = |expected: String| !head.tp_name.is_null() && unsafe { CStr::from_ptr(head.tp_name) }.to_bytes() == expected.as_bytes();
    let metatype_ok = std::ptr::eq(head.ob_type, ty.get_type().as_type_ptr());
    Ok(metatype_ok
        && head.ob_refcnt > 0
        && name_ok(format!("{}.{}", ty.module()?, ty.name()?))
        && head.tp_basicsize == int("__basicsize__")?
        && head.tp_itemsize == int("__itemsize__")?
        && head.tp_dealloc == slot(ffi::Py_tp_dealloc)
        && head.tp_repr == slot(ffi::Py_tp_repr)
        && head.tp_hash == slot(ffi::Py_tp_hash)
        && !head.tp_call.is_null()
        && head.tp_call == slot(ffi::Py_tp_call)
        && head.tp_getattro == slot(ffi::Py_tp_getattro)
        // SAFETY: a live type object.
        && head.tp_flags == unsafe { ffi::PyType_GetFlags(raw) }
        && head.tp_flags & ffi::Py_TPFLAGS_HEAPTYPE != 0
        && head.tp_flags & ffi::Py_TPFLAGS_BASETYPE == 0
        && head.tp_flags & HAVE_VECTORCALL == 0
        && head.tp_vectorcall_offset == 0
        && py.version_info() >= (3, 9))
}

/// Gives `dlbridge.Kernel` its vectorcall entry, measured on `sample`.
/// Returns whether it did (see the module docs for when it does not).
pub fn install(sample: &Bound<'_, PyKernel>) -> PyResult<bool> {
    let py = sample.py();
    let ty = PyKernel::type_object(py);
    // SAFETY: `ty` is pyo3's heap type for PyKernel, alive for the program.
    if !unsafe { check(&ty) }? {
        return Ok(false);
    }
    let offset = (&raw const sample.get().vectorcall) as isize - sample.as_ptr() as isize;
    let basicsize: isize = ty.getattr("__basicsize__")?.extract()?;
    let size = std::mem::size_of::<ffi::vectorcallfunc>() as isize;
    if offset <= 0 || offset % size != 0 || offset + size > basicsize {
        return Ok(false);
    }
    // SAFETY: `check` confirmed the layout of these two fields' neighbours on
    // this very object; module initialisation runs before any Kernel can be
    // called; the offset points at `vectorcall` in every instance (above).
    unsafe {
        let head = &mut *ty.as_type_ptr().cast::<TypeHead>();
        head.tp_vectorcall_offset = offset;
        head.tp_flags |= HAVE_VECTORCALL;
        ffi::PyType_Modified(ty.as_type_ptr());
    }
    INSTALLED.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(true)
}

/// Makes `dlbridge.Kernel` immutable, when [`install`] gave it its entry (see
/// the module docs; called by the `dlbridge` package once it has set the
/// type's `__doc__` and `__signature__`).
pub fn freeze(py: Python<'_>) {
    if !installed() {
        return;
    }
    let ty = PyKernel::type_object(py);
    // SAFETY: `install` checked this type object's layout (the flags field
    // among the rest); the GIL is held, and adding a flag that only refuses
    // later attribute assignments changes nothing a running call relies on.
    unsafe {
        (*ty.as_type_ptr().cast::<TypeHead>()).tp_flags |= ffi::Py_TPFLAGS_IMMUTABLETYPE;
        ffi::PyType_Modified(ty.as_type_ptr());
    }
}

static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether [`install`] gave `dlbridge.Kernel` its vectorcall entry.
pub fn installed() -> bool {
    INSTALLED.load(std::sync::atomic::Ordering::Relaxed)
}

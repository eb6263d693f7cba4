//! The DLPack C exchange API (`type(x).__dlpack_c_exchange_api__`), looked up
//! once per Python type and called directly.
//!
//! Invariants: an [`Api`] points at a producer's static `DLPackExchangeAPI`
//! table (the DLPack spec requires it to live for the whole process) whose
//! major version is ours — found by walking `prev_api` a bounded number of
//! steps. The cache holds a strong reference to every type that has an API,
//! so such a type's address is never reused for another while cached; types
//! without one are cached by address only (a reused address can only send a
//! new type down the slower `__dlpack__` path, never to a wrong table). Every
//! call into the table happens with the GIL held and with objects of the type
//! the table came from. Borrowed `DLTensor`s from
//! `dltensor_from_py_object_no_sync` are only used while the GIL is held, the
//! object is alive and no Python code can have run since they were borrowed
//! (see `import::Lent`), and never outlive the call that borrowed them. Every pointer a producer returns is checked
//! for NULL and then validated like any foreign tensor.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, Ordering};

use dlbridge_core::ffi::{DLDataType, DLDevice, DLManagedTensorVersioned, DLPackExchangeAPI, DLPackExchangeAPIHeader, DLTensor};
use dlbridge_core::{Device, ManagedTensor};
use dlbridge_registry::OutputSpec;
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::PyType;

/// A producer's exchange API table, and the type's own checks for tensors
/// whose memory does not hold their values.
#[derive(Debug, Clone, Copy)]
pub struct Api {
    table: NonNull<DLPackExchangeAPI>,
    checks: &'static Checks,
}

/// Methods of the producer's type that say a tensor's memory is not its value
/// (torch: `is_neg`, `is_conj`), looked up once per type.
#[derive(Debug, Default)]
struct Checks {
    is_neg: Option<Py<PyAny>>,
    is_conj: Option<Py<PyAny>>,
    /// torch: writes must bump the autograd version counter, and inference
    /// tensors may only be written in inference mode.
    torch: Option<TorchWrites>,
}

#[derive(Debug)]
struct TorchWrites {
    /// `torch._C._increment_version`, called with a list (one cheap call for all).
    increment_version: Py<PyAny>,
    /// `torch.Tensor.is_inference`.
    is_inference: Py<PyAny>,
    /// `torch.is_inference_mode_enabled`.
    inference_mode_enabled: Py<PyAny>,
}

impl TorchWrites {
    /// Found when `ty` is a subclass of an already imported `torch.Tensor`.
    fn find(ty: &Bound<'_, PyType>) -> Option<TorchWrites> {
        let py = ty.py();
        let torch = py.import("sys").ok()?.getattr("modules").ok()?.get_item("torch").ok()?;
        let tensor = torch.getattr("Tensor").ok()?.cast_into::<PyType>().ok()?;
        if !ty.is_subclass(&tensor).ok()? {
            return None;
        }
        Some(TorchWrites {
            increment_version: torch.getattr("_C").ok()?.getattr("_increment_version").ok()?.unbind(),
            is_inference: tensor.getattr("is_inference").ok()?.unbind(),
            inference_mode_enabled: torch.getattr("is_inference_mode_enabled").ok()?.unbind(),
        })
    }
}

// SAFETY: the table is immutable static data of the producer, valid for the
// process lifetime; its functions are called with the GIL held.
unsafe impl Send for Api {}
// SAFETY: as above.
unsafe impl Sync for Api {}

struct Entry {
    key: usize,
    _ty: Option<Py<PyType>>,
    api: Option<Api>,
}

/// Every type seen, with its (possibly absent) API. Entries are leaked on
/// purpose: a handful of types per process, and `LAST` may point at any of them.
static CACHE: Mutex<Option<HashMap<usize, &'static Entry>>> = Mutex::new(None);
/// The most recently looked-up entry: the lock-free fast path.
static LAST: AtomicPtr<Entry> = AtomicPtr::new(std::ptr::null_mut());

const CAPSULE_NAME: &CStr = c"dlpack_exchange_api";

/// The exchange API of `obj`'s type, if it has one (cached per type).
pub fn lookup(obj: &Bound<'_, PyAny>) -> PyResult<Option<Api>> {
    // SAFETY: Py_TYPE of a live object is a valid type pointer (borrowed).
    let key = unsafe { pyo3::ffi::Py_TYPE(obj.as_ptr()) } as usize;
    let last = LAST.load(Ordering::Acquire);
    // SAFETY: LAST only ever holds NULL or a leaked, never-freed Entry.
    if let Some(e) = unsafe { last.as_ref() }
        && e.key == key
    {
        return Ok(e.api);
    }
    let cached = CACHE.lock().unwrap_or_else(|p| p.into_inner()).as_ref().and_then(|m| m.get(&key).copied());
    let entry: &'static Entry = match cached {
        Some(e) => e,
        None => {
            let ty = obj.get_type();
            let api = find(&ty)?;
            // Only types with an API are kept alive (their address must never be reused by
            // another type while cached). A negative entry holds no reference: if its
            // address is reused by a new type, that type is read through __dlpack__ —
            // slower, never wrong — and types made at run time are not kept forever.
            let e: &'static Entry = Box::leak(Box::new(Entry { key, _ty: api.map(|_| ty.unbind()), api }));
            CACHE.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).insert(key, e);
            e
        }
    };
    LAST.store((entry as *const Entry).cast_mut(), Ordering::Release);
    Ok(entry.api)
}

fn find(ty: &Bound<'_, PyType>) -> PyResult<Option<Api>> {
    let capsule = match ty.getattr(pyo3::intern!(ty.py(), "__dlpack_c_exchange_api__")) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<PyAttributeError>(ty.py()) => return Ok(None),
        Err(e) => return Err(e),
    };
    // SAFETY: PyCapsule_GetPointer checks the object is a capsule with this
    // name; on mismatch it returns NULL with an exception set.
    let ptr = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), CAPSULE_NAME.as_ptr()) };
    if ptr.is_null() {
        let err = PyErr::take(ty.py()).unwrap_or_else(|| PyBufferError::new_err("empty DLPack exchange API capsule"));
        return Err(err);
    }
    let method = |name: &str| ty.getattr(name).ok().filter(|m| m.is_callable()).map(Bound::unbind);
    let checks: &'static Checks =
        Box::leak(Box::new(Checks { is_neg: method("is_neg"), is_conj: method("is_conj"), torch: TorchWrites::find(ty) }));
    // Walk prev_api (bounded) to a table whose major version is ours.
    let mut header = ptr.cast::<DLPackExchangeAPIHeader>();
    for _ in 0..16 {
        let Some(h) = NonNull::new(header) else { return Ok(None) };
        // SAFETY: the spec makes every table in the chain a static
        // DLPackExchangeAPI starting with this header.
        let hd = unsafe { h.as_ref() };
        if hd.version.major == dlbridge_core::DLPACK_MAJOR {
            // SAFETY: same-major tables carry every field this build reads.
            let api = unsafe { h.cast::<DLPackExchangeAPI>().as_ref() };
            if api.managed_tensor_from_py_object_no_sync.is_none() || api.current_work_stream.is_none() {
                return Ok(None);
            }
            return Ok(Some(Api { table: h.cast(), checks }));
        }
        header = hd.prev_api;
    }
    Ok(None)
}

fn fetch_err(py: Python<'_>, what: &str) -> PyErr {
    PyErr::take(py).unwrap_or_else(|| PyRuntimeError::new_err(format!("{what} failed without setting a Python exception")))
}

/// A producer that cannot export a tensor (torch: sparse, meta, quantized,
/// nested, inside vmap) raises its own error, often a RuntimeError carrying a
/// C++ backtrace: that is a `BufferError` (what `__dlpack__` raises for the
/// same tensors) with the first line of the producer's message.
fn export_err(py: Python<'_>, what: &str) -> PyErr {
    let e = fetch_err(py, what);
    if e.is_instance_of::<PyBufferError>(py) || !e.is_instance_of::<PyRuntimeError>(py) {
        return e;
    }
    let msg = e.value(py).str().map(|s| s.to_string()).unwrap_or_default();
    let first = msg.lines().next().unwrap_or("").trim();
    PyBufferError::new_err(format!("the producer cannot export this tensor through DLPack: {}", crate::raw::capsule::bounded(first)))
}

impl Api {
    fn table(&self) -> &DLPackExchangeAPI {
        // SAFETY: type invariant: a live static table.
        unsafe { self.table.as_ref() }
    }

    /// Refuses tensors whose memory does not hold their values — torch's
    /// negative-bit (`torch._neg_view(x)`, `x.conj().imag`) and conjugate-bit
    /// (`x.conj()` of a complex tensor) views: DLPack would hand over the raw
    /// memory, and reading or writing it would silently give wrong results.
    /// Written arguments that require grad are refused too. `dtype` (when known)
    /// skips the conjugate check for real dtypes, which never carry the bit;
    /// `None` leaves the conjugate check to [`Api::check_conj`] (the caller
    /// learns the dtype later).
    pub fn check_tensor(&self, obj: &Bound<'_, PyAny>, dtype: Option<dlbridge_core::DType>, writable: bool) -> PyResult<()> {
        let py = obj.py();
        if flag(py, self.checks.is_neg.as_ref(), obj)? {
            return Err(PyBufferError::new_err(
                "the tensor is a negative-bit view (torch._neg_view, or the imaginary part of a conj() view): its memory holds the negated values; call .resolve_neg() (or .clone()) first",
            ));
        }
        if let Some(d) = dtype {
            self.check_conj(obj, d)?;
        }
        if writable && let Some(t) = &self.checks.torch {
            if obj.getattr(pyo3::intern!(py, "requires_grad"))?.is_truthy()? {
                return Err(PyBufferError::new_err("the tensor requires grad and this argument is written in place; detach() it first"));
            }
            if flag(py, Some(&t.is_inference), obj)? && !t.inference_mode_enabled.bind(py).call0()?.is_truthy()? {
                return Err(PyBufferError::new_err(
                    "the tensor is an inference tensor, which may only be written inside torch.inference_mode() (torch refuses in-place updates to it too)",
                ));
            }
        }
        Ok(())
    }

    /// The conjugate-bit half of [`Api::check_tensor`], for a tensor of dtype
    /// `dtype` (only complex tensors can carry the bit: real ones cost nothing).
    pub fn check_conj(&self, obj: &Bound<'_, PyAny>, dtype: dlbridge_core::DType) -> PyResult<()> {
        if dtype.code() == dlbridge_core::DTypeCode::Complex && flag(obj.py(), self.checks.is_conj.as_ref(), obj)? {
            return Err(PyBufferError::new_err(
                "the tensor is a conjugate-bit view (x.conj()): its memory holds the unconjugated values; call .resolve_conj() first",
            ));
        }
        Ok(())
    }

    /// Whether the type has a conjugate-bit check (torch).
    pub fn has_conj_check(&self) -> bool {
        self.checks.is_conj.is_some()
    }

    /// Tells autograd that these tensors (all of this API's type) are about to be
    /// written, as torch's own in-place ops do: a graph that saved one of them
    /// (or a view sharing its version counter, e.g. the tensor `detach()` came
    /// from) then refuses to backpropagate through stale values instead of
    /// silently computing wrong gradients. One call for all of them.
    pub fn bump_versions(&self, py: Python<'_>, written: &[&Bound<'_, PyAny>]) -> PyResult<()> {
        match &self.checks.torch {
            Some(t) if !written.is_empty() => {
                t.increment_version.bind(py).call1((pyo3::types::PyList::new(py, written)?,))?;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Whether this is torch's table (its tensors have autograd version counters).
    pub fn is_torch(&self) -> bool {
        self.checks.torch.is_some()
    }

    /// Whether the tensor requires grad (torch), for imports that would alias it.
    pub fn requires_grad(&self, obj: &Bound<'_, PyAny>) -> PyResult<bool> {
        if self.checks.torch.is_none() {
            return Ok(false);
        }
        obj.getattr(pyo3::intern!(obj.py(), "requires_grad"))?.is_truthy()
    }

    /// Whether the producer can lend a DLTensor without allocating.
    pub fn can_borrow(&self) -> bool {
        self.table().dltensor_from_py_object_no_sync.is_some()
    }

    /// Whether the producer can allocate tensors for us (outputs).
    pub fn can_allocate(&self) -> bool {
        let t = self.table();
        t.managed_tensor_allocator.is_some() && t.managed_tensor_to_py_object_no_sync.is_some()
    }

    /// Borrows `obj`'s DLTensor (valid while the GIL is held, `obj` is alive and
    /// control has not returned to Python).
    pub fn borrow(&self, obj: &Bound<'_, PyAny>) -> PyResult<DLTensor> {
        let f =
            self.table().dltensor_from_py_object_no_sync.ok_or_else(|| PyRuntimeError::new_err("no dltensor_from_py_object_no_sync"))?;
        let mut out = DLTensor {
            data: std::ptr::null_mut(),
            device: DLDevice { device_type: dlbridge_core::ffi::DLDeviceType(0), device_id: 0 },
            ndim: 0,
            dtype: DLDataType { code: dlbridge_core::ffi::DLDataTypeCode(0), bits: 0, lanes: 0 },
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        // SAFETY: `obj` has the type this table came from; `out` is a valid DLTensor slot.
        let rc = unsafe { f(obj.as_ptr().cast(), &mut out) };
        if rc != 0 {
            return Err(export_err(obj.py(), "dltensor_from_py_object_no_sync"));
        }
        Ok(out)
    }

    /// An owning DLPack tensor of `obj`.
    pub fn managed(&self, obj: &Bound<'_, PyAny>) -> PyResult<ManagedTensor> {
        let f = self
            .table()
            .managed_tensor_from_py_object_no_sync
            .ok_or_else(|| PyRuntimeError::new_err("no managed_tensor_from_py_object_no_sync"))?;
        let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
        // SAFETY: `obj` has the type this table came from; `out` receives ownership.
        let rc = unsafe { f(obj.as_ptr().cast(), &mut out) };
        if rc != 0 {
            return Err(export_err(obj.py(), "managed_tensor_from_py_object_no_sync"));
        }
        // SAFETY: on success the producer handed us ownership of `out` (NULL is an error inside).
        unsafe { ManagedTensor::from_raw_versioned(out) }.map_err(crate::errors::to_pyerr)
    }

    /// The producer's current work stream for a device (NULL for CPU).
    pub fn current_stream(&self, py: Python<'_>, device: Device) -> PyResult<*mut c_void> {
        if device == Device::CPU {
            return Ok(std::ptr::null_mut());
        }
        let f = self.table().current_work_stream.ok_or_else(|| PyRuntimeError::new_err("no current_work_stream"))?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: plain C call with a valid out pointer.
        let rc = unsafe { f(dlbridge_core::ffi::DLDeviceType(device.kind.0), device.id, &mut stream) };
        if rc != 0 {
            return Err(fetch_err(py, "current_work_stream"));
        }
        Ok(stream)
    }

    /// Allocates an output with the producer's own allocator.
    pub fn allocate(&self, py: Python<'_>, spec: &OutputSpec) -> PyResult<ManagedTensor> {
        let f = self.table().managed_tensor_allocator.ok_or_else(|| PyRuntimeError::new_err("no managed_tensor_allocator"))?;
        let mut shape: smallvec::SmallVec<[i64; 6]> = spec.shape.clone();
        let mut proto = DLTensor {
            data: std::ptr::null_mut(),
            device: spec.device.to_dl(),
            ndim: shape.len() as i32,
            dtype: spec.dtype.to_dl(),
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
        let mut err: Option<String> = None;
        // SAFETY: the prototype and its shape live across the call; `set_error`
        // receives `&mut err` as its context and only writes a String into it.
        let rc = unsafe { f(&mut proto, &mut out, (&raw mut err).cast(), Some(set_error)) };
        if rc != 0 || out.is_null() {
            let msg = err.unwrap_or_else(|| match PyErr::take(py) {
                Some(e) => e.to_string(),
                None => "allocation failed".into(),
            });
            // torch's message: its first line, without the exception type it names
            // and the C++ stack trace (`frame #0: ...`, `Exception raised from ...`) after it.
            let first = msg.lines().next().unwrap_or("").trim();
            let msg = match first.split_once(": ") {
                Some((ty, rest)) if ty.ends_with("Error") && ty.chars().all(|c| c.is_ascii_alphanumeric()) => rest,
                _ => first,
            }
            .to_owned();
            let text = format!("allocating {spec}: {msg}");
            return Err(if msg.to_ascii_lowercase().contains("memory") {
                pyo3::exceptions::PyMemoryError::new_err(text)
            } else {
                PyBufferError::new_err(text)
            });
        }
        // SAFETY: the allocator handed us ownership of `out`.
        unsafe { ManagedTensor::from_raw_versioned(out) }.map_err(crate::errors::to_pyerr)
    }

    /// Turns an owning tensor into the producer's Python object (ownership moves).
    pub fn to_py<'py>(self, py: Python<'py>, tensor: ManagedTensor) -> PyResult<Bound<'py, PyAny>> {
        let f = self
            .table()
            .managed_tensor_to_py_object_no_sync
            .ok_or_else(|| PyRuntimeError::new_err("no managed_tensor_to_py_object_no_sync"))?;
        let raw = tensor.into_raw_versioned();
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: ownership of `raw` passes to the producer whatever the outcome
        // (the exchange API's contract).
        let rc = unsafe { f(raw, &mut out) };
        if rc != 0 || out.is_null() {
            return Err(fetch_err(py, "managed_tensor_to_py_object_no_sync"));
        }
        // SAFETY: a new reference to a Python object.
        Ok(unsafe { Bound::from_owned_ptr(py, out.cast()) })
    }
}

/// `m(obj)` is truthy: one vectorcall with the argument on the stack (no
/// tuple allocated; `m` is a method such as `torch.Tensor.is_neg`).
fn flag(py: Python<'_>, m: Option<&Py<PyAny>>, obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let Some(m) = m else { return Ok(false) };
    let args = [obj.as_ptr()];
    // SAFETY: `m` and `obj` are live objects and the GIL is held; `args` holds
    // one borrowed reference for the duration of the call; the result is a new
    // reference or NULL with an exception set.
    let r = unsafe { vectorcall::PyObject_Vectorcall(m.as_ptr(), args.as_ptr(), 1, std::ptr::null_mut()) };
    if r.is_null() {
        return Err(fetch_err(py, "a tensor check"));
    }
    // SAFETY: a new, non-NULL reference.
    unsafe { Bound::from_owned_ptr(py, r) }.is_truthy()
}

/// `PyObject_Vectorcall` is exported as a function by every CPython this
/// wheel supports (3.11 exports it; it is part of the stable ABI from 3.12),
/// but pyo3 declares it for limited-API builds only from 3.12 on.
mod vectorcall {
    use pyo3::ffi::PyObject;
    unsafe extern "C" {
        pub fn PyObject_Vectorcall(
            callable: *mut PyObject,
            args: *const *mut PyObject,
            nargsf: usize,
            kwnames: *mut PyObject,
        ) -> *mut PyObject;
    }
}

unsafe extern "C" fn set_error(ctx: *mut c_void, kind: *const c_char, message: *const c_char) {
    let text = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: the producer passes NUL-terminated strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    let msg = format!("{}: {}", text(kind), text(message));
    // SAFETY: ctx is the `&mut Option<String>` passed by `allocate`.
    unsafe { *ctx.cast::<Option<String>>() = Some(msg) };
}

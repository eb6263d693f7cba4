//! Python objects in: the fastest path each object offers.
//!
//! 1. `dlbridge.Array`: its memory directly.
//! 2. the DLPack C exchange API (`type(x).__dlpack_c_exchange_api__`, looked up
//!    once per type): a borrowed `DLTensor` (no allocation) for arguments that
//!    are only read in calls that keep the GIL; an owning tensor — which
//!    carries the producer's flags — for every argument that is written, and
//!    for calls that release the GIL;
//! 3. `__dlpack__(max_version=(1, 3))`, the legacy call on `TypeError`, or an
//!    existing capsule (see [`crate::raw::capsule`]);
//! 4. the buffer protocol.
//!
//! A read-only source stays read-only: asked for a writable tensor, it is an
//! error, never a write. Read-only means flagged READ_ONLY, a read-only buffer,
//! or a legacy struct from a producer that was offered the versioned one (it
//! could not have said READ_ONLY). torch tensors whose memory does not hold
//! their values (conjugate-bit and negative-bit views) are refused outright.

use std::cell::Cell;

use dlbridge_core::layout::Extent;
use dlbridge_core::raw::view_from_dltensor;
use dlbridge_core::{DType, Device, Error, Flags, ManagedTensor, TensorView, TensorViewMut};
use dlbridge_registry::binding::Operand;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;

use crate::array::PyArray;
pub(crate) use crate::epoch::{epoch, python_may_run};
use crate::errors::IntoPy;
use crate::raw::buffer::BufferTensor;
use crate::raw::capsule::{self, Consumed, Request};
use crate::raw::exchange::{self, Api};
use crate::raw::ndarray::NdArray;
pub(crate) use crate::raw::ndarray::is_ndarray;

/// Where an imported tensor's memory is held while a call uses it.
#[derive(Debug)]
pub(crate) enum Held {
    /// A `dlbridge.Array`: read in place through [`Tensor::obj`] (a frozen
    /// object whose array never changes), without cloning it.
    Array,
    /// A torch tensor, whose exchange API lends `DLTensor`s (see [`Lent`]):
    /// read and written arguments alike (a lent DLTensor carries no flags,
    /// and torch has no read-only tensors).
    Lent(Lent),
    /// An exact NumPy array, read in place (see [`crate::raw::ndarray`]).
    NumPy(NdArray),
    /// A buffer-protocol export, held for the call.
    Buffer(Box<BufferTensor>),
    /// An owning DLPack tensor.
    Managed(Box<ManagedTensor>),
}

/// A DLTensor the producer lends: it points into the producer's own
/// structures (sizes, strides, storage), which any Python code may change or
/// free (`x.set_(...)`, a `__torch_function__`, a finalizer run by the
/// garbage collector, another thread while the GIL is released).
///
/// **Invariant**: a borrowed DLTensor is used only while no Python code can
/// have run since it was borrowed. Each borrow is validated once and kept
/// with the [`EPOCH`] it was taken at; a view reuses it only while the epoch
/// is unchanged, and borrows (and validates) anew otherwise. Every adapter
/// step that may run Python code bumps the epoch first ([`python_may_run`]);
/// the registry's binding layer runs no adapter code while it holds a view,
/// and the kernels are Rust or C code that does not call into Python; a call
/// that releases the GIL first turns every lent tensor into an owning one
/// ([`Tensor::own`]).
#[derive(Debug, Default)]
pub(crate) struct Lent {
    snap: Cell<Option<Snapshot>>,
}

/// A validated borrow: the parts of its view, and when it was taken.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    epoch: u64,
    data: *const u8,
    shape: *const i64,
    strides: *const i64,
    ndim: usize,
    dtype: DType,
    device: Device,
    extent: Extent,
}

/// One imported Python tensor, bound to a kernel argument.
#[derive(Debug)]
pub(crate) struct Tensor<'py> {
    /// The Python object (kept alive for the call).
    pub(crate) obj: Bound<'py, PyAny>,
    /// The memory.
    pub(crate) held: Held,
    /// The producer's exchange API, if its type has one.
    pub(crate) api: Option<Api>,
    /// Whether the call writes it (a `mut` argument or an output): it was
    /// imported writable, which the producer allows (see the module docs).
    pub(crate) written: bool,
    /// A lent tensor whose conjugate bit is still to be checked (its dtype
    /// was not known at import): [`Tensor::check_deferred`] does it.
    conj_unchecked: bool,
}

impl Tensor<'_> {
    /// The `dlbridge.Array` of a [`Held::Array`] tensor.
    fn array(&self) -> dlbridge_core::Result<&dlbridge_array::Array> {
        match self.obj.cast::<PyArray>() {
            Ok(a) => Ok(a.get().array()),
            Err(_) => Err(Error::Runtime("internal error: a dlbridge.Array tensor whose object is not one".into())),
        }
    }

    /// Re-imports a lent tensor as an owning one (for calls that release the GIL).
    pub(crate) fn own(&mut self) -> PyResult<()> {
        if let (Held::Lent(_), Some(api)) = (&self.held, self.api) {
            python_may_run();
            self.held = Held::Managed(Box::new(api.managed(&self.obj)?));
        }
        Ok(())
    }

    /// The checks that needed the dtype, which a lent tensor learns at its
    /// first view: torch's conjugate bit (complex tensors only; calls into
    /// Python, so it bumps the epoch).
    pub(crate) fn check_deferred(&mut self) -> PyResult<()> {
        if !self.conj_unchecked {
            return Ok(());
        }
        let dtype = match &self.held {
            Held::Lent(l) => self.lent_view(l).map_err(crate::errors::to_pyerr)?.dtype(),
            _ => self.view().map_err(crate::errors::to_pyerr)?.dtype(),
        };
        if let Some(api) = self.api
            && dtype.code() == dlbridge_core::DTypeCode::Complex
        {
            python_may_run();
            api.check_conj(&self.obj, dtype)?;
        }
        self.conj_unchecked = false;
        Ok(())
    }

    /// A lent tensor's view: the snapshot while no Python code can have run
    /// since it was taken, else a new borrow (validated, and kept).
    fn lent_view(&self, lent: &Lent) -> dlbridge_core::Result<TensorView<'_>> {
        let now = epoch();
        if let Some(s) = lent.snap.get()
            && s.epoch == now
        {
            // SAFETY: `s` was validated by `view_from_dltensor` from a borrow of
            // `self.obj` at this same epoch: no Python code has run since (the
            // type's invariant), so the producer's arrays and data are unchanged
            // and alive (`self.obj` is held); `extent` is check_layout's result
            // for exactly these parts at this address (byte offset folded in).
            return Ok(unsafe {
                TensorView::from_validated_parts(
                    s.data,
                    std::slice::from_raw_parts(s.shape, s.ndim),
                    std::slice::from_raw_parts(s.strides, s.ndim),
                    s.dtype,
                    s.device,
                    Flags::empty(),
                    s.extent,
                )
            });
        }
        let api = self.api.ok_or_else(|| Error::Runtime("internal error: a lent tensor without an exchange API".into()))?;
        let t = api.borrow(&self.obj).map_err(crate::errors::from_pyerr)?;
        // SAFETY: the producer lent `t`; its arrays and data stay valid while
        // `self.obj` lives (it does, for `&self`) and no Python code runs, which
        // the type's invariant guarantees for as long as the view lives.
        let v = unsafe { view_from_dltensor(&t, Flags::empty()) }?;
        let strides = v.strides();
        // Only views whose strides are the producer's own array can be kept
        // (a NULL-strides DLTensor gets strides computed into the view).
        if v.ndim() == 0 || std::ptr::eq(strides.as_ptr(), t.strides) {
            lent.snap.set(Some(Snapshot {
                epoch: now,
                data: v.data_ptr().cast(),
                shape: v.shape().as_ptr(),
                strides: strides.as_ptr(),
                ndim: v.ndim(),
                dtype: v.dtype(),
                device: v.device(),
                extent: v.extent(),
            }));
        }
        Ok(v)
    }
}

impl Operand for Tensor<'_> {
    fn view(&self) -> dlbridge_core::Result<TensorView<'_>> {
        Ok(match &self.held {
            Held::Array => self.array()?.view(),
            Held::NumPy(a) => a.view(&self.obj)?,
            Held::Buffer(b) => b.view(),
            Held::Managed(m) => m.view().clone(),
            Held::Lent(l) => {
                let v = self.lent_view(l)?;
                // Set only for types with a conjugate bit; cleared by `check_deferred`.
                if self.conj_unchecked && v.dtype().code() == dlbridge_core::DTypeCode::Complex {
                    return Err(Error::Runtime("internal error: a complex tensor's conjugate bit was not checked".into()));
                }
                v
            }
        })
    }

    fn view_mut(&mut self) -> dlbridge_core::Result<TensorViewMut<'_>> {
        if !self.written {
            return Err(Error::ReadOnly { what: "internal error: a tensor imported read-only was asked for writing; it".into() });
        }
        if matches!(self.held, Held::Managed(_)) {
            return match &mut self.held {
                Held::Managed(m) => m.view_mut(),
                _ => unreachable_lent(),
            };
        }
        let view = self.view()?;
        if view.is_read_only() {
            return Err(Error::ReadOnly { what: "internal error: a read-only tensor was asked for writing; it".into() });
        }
        // SAFETY: Python memory is shared-mutable (every holder of the array or
        // tensor may write it); the caller passed it to be written, the producer
        // allows writes (checked at import: a writable Array, a writable buffer,
        // torch's lent tensors), a lent view lives under [`Lent`]'s invariant,
        // and the registry refuses every overlap between a written view and the
        // call's other views before the kernel runs.
        unsafe { TensorViewMut::from_view(view) }
    }
}

fn unreachable_lent<T>() -> dlbridge_core::Result<T> {
    Err(Error::Runtime("internal error: a managed tensor changed its variant".into()))
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
pub(crate) fn import<'py>(obj: &Bound<'py, PyAny>, writable: bool, mode: Mode) -> PyResult<Tensor<'py>> {
    // The paths that run no Python code leave the epoch alone (see [`Lent`]):
    // a dlbridge.Array, and an exact NumPy array read in place.
    let fast = |held| Ok(Tensor { obj: obj.clone(), held, api: None, written: writable, conj_unchecked: false });
    if let Ok(a) = obj.cast::<PyArray>()
        && !(writable && a.get().array().is_read_only())
    {
        return fast(Held::Array);
    }
    if let Ok(Some(a)) = NdArray::read(obj, writable) {
        return fast(Held::NumPy(a));
    }
    python_may_run();
    let (held, api, can_write) = import_any(obj, writable, mode)?;
    let mut conj_unchecked = false;
    if let Some(api) = api {
        // A lent tensor's dtype is learnt at its first view, after every
        // argument is bound: its conjugate bit is checked then (complex only).
        let dtype = match &held {
            Held::Managed(m) => Some(m.dtype()),
            _ => None,
        };
        conj_unchecked = dtype.is_none() && api.has_conj_check();
        api.check_tensor(obj, dtype, writable)?;
    }
    if writable && !can_write {
        return Err(PyBufferError::new_err(match &held {
            Held::Managed(m) if m.is_legacy() && !m.is_read_only() => format!(
                "{} gives only legacy DLPack capsules (no max_version=(1, 3) answer), which cannot say READ_ONLY, so it is \
                 treated as read-only and this argument is written (pass a capsule you made yourself to allow writes)",
                capsule::type_name(obj)
            ),
            _ => "the tensor is read-only (DLPack READ_ONLY) and this argument is written".to_owned(),
        }));
    }
    Ok(Tensor { obj: obj.clone(), held, api, written: writable, conj_unchecked })
}

/// Where the memory is held, the exchange API, and whether it may be written.
fn import_any(obj: &Bound<'_, PyAny>, writable: bool, mode: Mode) -> PyResult<(Held, Option<Api>, bool)> {
    if let Ok(a) = obj.cast::<PyArray>() {
        let writable = !a.get().array().is_read_only();
        return Ok((Held::Array, None, writable));
    }
    if let Some(api) = exchange::lookup(obj)? {
        // Only torch's tensors are borrowed: torch's borrow is C++ that runs no
        // Python code, which [`Lent`]'s invariant needs (another producer's
        // borrow, taken while views of other tensors are held, could run any
        // code); and the flag-less borrowed DLTensor says all there is of a torch
        // tensor, written or not: torch has no read-only tensors (its DLPack
        // exports never set READ_ONLY, even for memory from a read-only NumPy array).
        if mode == Mode::KeepGil && api.can_borrow() && api.is_torch() {
            return Ok((Held::Lent(Lent::default()), Some(api), true));
        }
        let m = api.managed(obj)?;
        let writable = !m.is_read_only();
        return Ok((Held::Managed(Box::new(m)), Some(api), writable));
    }
    // NumPy arrays (exactly `numpy.ndarray`) that `import` did not read in
    // place: through the buffer protocol (one C call, where `__dlpack__` costs
    // a method call with keywords and a capsule). A buffer NumPy will not give
    // (a read-only array asked for writing, a dtype the buffer protocol lacks)
    // takes the DLPack path and its errors.
    if is_ndarray(obj)
        && let Ok(t) = crate::raw::buffer::import_held(obj, writable)
    {
        let writable = !t.is_read_only();
        return Ok((Held::Buffer(Box::new(t)), None, writable));
    }
    if has_dlpack(obj)? {
        let c = capsule::consume_object(obj, Request::default()).map_err(|e| traced(obj, e))?;
        let writable = c.writable();
        return Ok((Held::Managed(Box::new(c.tensor)), None, writable));
    }
    match crate::raw::buffer::import_held(obj, writable) {
        Ok(t) => {
            let writable = !t.is_read_only();
            Ok((Held::Buffer(Box::new(t)), None, writable))
        }
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => Err(PyTypeError::new_err(format!(
            "expected a tensor (an object with __dlpack__ or the buffer protocol), got {}",
            capsule::type_name(obj)
        ))),
        Err(e) => Err(e),
    }
}

/// `e`, the error of exporting `obj`, or where `obj` is a JAX tracer (an
/// argument inside `jax.jit`, `jax.grad`, `jax.vmap`: it has no memory to
/// read), a TypeError that says what to call instead, caused by `e`.
fn traced(obj: &Bound<'_, PyAny>, e: PyErr) -> PyErr {
    let py = obj.py();
    let attr = |t: &Bound<'_, PyAny>, name: &Bound<'_, pyo3::types::PyString>| t.getattr(name).and_then(|v| v.extract::<String>()).ok();
    let (qualname, module) = (pyo3::intern!(py, "__qualname__"), pyo3::intern!(py, "__module__"));
    let is_tracer = obj
        .get_type()
        .mro()
        .iter()
        .any(|t| attr(&t, qualname).as_deref() == Some("Tracer") && attr(&t, module).as_deref() == Some("jax._src.core"));
    if !is_tracer {
        return e;
    }
    let err = PyTypeError::new_err(format!(
        "a JAX tracer ({}): inside jax.jit, jax.grad or jax.vmap a plain kernel call has no array to read; \
         call the kernel through dlbridge.jax.as_op(kernel)",
        capsule::type_name(obj)
    ));
    err.set_cause(py, Some(e));
    err
}

/// Whether `obj` is a capsule or has `__dlpack__`; an error other than
/// AttributeError raised while looking (a property that raises) propagates.
fn has_dlpack(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = obj.py();
    Ok(obj.cast::<pyo3::types::PyCapsule>().is_ok() || obj.hasattr(pyo3::intern!(py, "__dlpack__"))?)
}

/// `dlbridge.from_dlpack(x, /, *, device=None, copy=None)` as the array API
/// standard defines it, into a `dlbridge.Array`:
/// `copy=None` shares memory (zero copy) when the tensor is on `device`
/// already, and copies when it is not; `copy=True` always returns a new,
/// writable, independent array; `copy=False` never copies and raises
/// `ValueError` where only a copy would work. `device`: `None` (the tensor's
/// own), `"cpu"`, `"cuda"`, `"cuda:N"` or a `(device_type, device_id)` pair;
/// host and CUDA memory are held (see `cuda` for the stream rule). A tensor the
/// producer cannot let us write (see the module docs) comes back read-only.
pub fn from_dlpack(obj: &Bound<'_, PyAny>, device: Option<&Bound<'_, PyAny>>, copy: Option<bool>) -> PyResult<dlbridge_array::Array> {
    let want = device.filter(|d| !d.is_none()).map(crate::array::parse_device).transpose()?;
    let want_cpu = want == Some(dlbridge_core::Device::CPU);
    let array = if let Ok(a) = obj.cast::<PyArray>() {
        a.get().array().clone()
    } else if let Some(api) = exchange::lookup(obj)? {
        api.check_tensor(obj, None, false)?;
        if api.requires_grad(obj)? {
            // A writable alias would let writes bypass autograd (torch's own __dlpack__
            // and NumPy's from_dlpack refuse these tensors too).
            return Err(PyBufferError::new_err("from_dlpack: the tensor requires grad; detach() it first"));
        }
        let m = api.managed(obj)?;
        let a = dlbridge_array::Array::from_managed(m).py_err()?;
        // The exchange API does not synchronise: order the producer's current
        // stream before the legacy stream dlbridge's CUDA arrays live on.
        if crate::cuda::is_cuda(a.device()) {
            let stream = api.current_stream(obj.py(), a.device())? as usize as u64;
            crate::cuda::after_import(a.device(), stream)?;
        }
        a
    } else if has_dlpack(obj)? {
        // Ask for host memory only when the producer is not there already: a
        // producer written to an older standard may not take dl_device.
        let on_cpu = match producer_device(obj)? {
            Some((kind, _)) => kind == dlbridge_core::DeviceType::CPU.0 as i32,
            None => true,
        };
        let ask_host = want_cpu && !on_cpu;
        // copy=False goes to the producer as it is (the array API's rule: a producer
        // that can only export a copy must refuse); copy=True is dlbridge's own copy,
        // made below, unless the producer must move the data to the host anyway.
        let ask_copy = if ask_host || copy == Some(false) { copy } else { None };
        let req = Request { dl_device: ask_host.then_some((1, 0)), copy: ask_copy };
        if ask_host && copy == Some(false) {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "from_dlpack(copy=False, device=cpu): the tensor is not in host memory, and only a copy could bring it there",
            ));
        }
        // No stream is passed: for a CUDA producer that means the legacy default
        // stream, which is where dlbridge's CUDA arrays are ordered.
        let c: Consumed = capsule::consume_object(obj, req)?;
        if copy == Some(false) && c.tensor.is_copied() {
            // Dropping `c` runs the producer's deleter: the copy is freed.
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "from_dlpack(copy=False): {}.__dlpack__ exported a copy (DLPack IS_COPIED), not its own memory",
                capsule::type_name(obj)
            )));
        }
        let writable = c.writable();
        let mut a = dlbridge_array::Array::from_managed(c.tensor).py_err()?;
        if !writable {
            a.set_read_only();
        }
        a
    } else {
        return Err(PyTypeError::new_err(format!(
            "{} has no __dlpack__ method (and is not a DLPack capsule); use dlbridge.asarray for buffer-protocol objects",
            capsule::type_name(obj)
        )));
    };
    let here = array.device();
    if !here.is_host_accessible() && !crate::cuda::is_cuda(here) {
        return Err(PyBufferError::new_err(format!(
            "from_dlpack: the tensor lives on {here}; dlbridge.Array holds host or CUDA memory (pass device=\"cpu\" for a host copy)"
        )));
    }
    match want.filter(|&w| w != here) {
        Some(w) if copy == Some(false) => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "from_dlpack(copy=False, device={w}): the tensor is on {here}, and only a copy could bring it there"
        ))),
        // A copy to the requested device (copy=None or True): new and writable.
        Some(w) => crate::cuda::copy_to(&array, w),
        // copy=True: a new, writable array that shares nothing with the source.
        None if copy == Some(true) => crate::cuda::contiguous(&array),
        None => Ok(array),
    }
}

/// `__dlpack_device__()` of a producer, when it has one.
fn producer_device(obj: &Bound<'_, PyAny>) -> PyResult<Option<(i32, i32)>> {
    if obj.cast::<pyo3::types::PyCapsule>().is_ok() {
        return Ok(None);
    }
    match obj.call_method0(pyo3::intern!(obj.py(), "__dlpack_device__")) {
        Ok(d) => {
            let (kind, id): (Bound<'_, PyAny>, Bound<'_, PyAny>) = d.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "{}.__dlpack_device__() must return a (device_type, device_id) tuple",
                    capsule::type_name(obj)
                ))
            })?;
            let kind: i32 = kind.extract().map_err(|_| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "{}.__dlpack_device__(): device_type is not a 32-bit integer",
                    capsule::type_name(obj)
                ))
            })?;
            let id: i32 = id.extract().map_err(|_| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "{}.__dlpack_device__(): device_id is not a 32-bit integer",
                    capsule::type_name(obj)
                ))
            })?;
            Ok(Some((kind, id)))
        }
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `dlbridge.asarray(obj)`: the buffer protocol (or DLPack), zero copy.
pub fn buffer_to_array(obj: &Bound<'_, PyAny>) -> PyResult<dlbridge_array::Array> {
    if let Ok(a) = obj.cast::<PyArray>() {
        return Ok(a.get().array().clone());
    }
    match crate::raw::buffer::import(obj, false) {
        Ok(t) => dlbridge_array::Array::from_managed(t).py_err(),
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) && has_dlpack(obj)? => from_dlpack(obj, None, None),
        Err(e) => Err(e),
    }
}

//! Which framework makes a call's outputs: one table from array types to
//! output makers, `dlbridge.register_allocator`'s.
//!
//! A call's outputs are made by the framework of its first tensor argument,
//! found here by that argument's type (or a base class of it, the latest
//! registration first). The built-in frameworks sit in the same table as any
//! other:
//!
//! * `numpy.ndarray` and NumPy's scalars (`numpy.generic`): `numpy.empty`
//!   (`Maker::Numpy`);
//! * `torch.Tensor`: the allocator of torch's DLPack C exchange API
//!   (`Maker::Exchange`; a type missing from the table whose exchange API
//!   can allocate is served the same way);
//! * `cupy.ndarray` and `jax.Array`: Python functions, registered by the
//!   `dlbridge` package through `register_allocator` (see `dlbridge/_frameworks.py`);
//! * anything else: `dlbridge.Array` on the inputs' device.
//!
//! A type may be named by a `"module.Name"` string, so registering a framework
//! never imports it: the name is looked up in `sys.modules` when a call's
//! first argument is not of a type seen before (types are cached by identity,
//! through weak references, so none is kept alive; any registration clears
//! the cache).
//!
//! A registered maker is three optional functions (`PyMaker`): `allocate(shape,
//! dtype, device)` returns a new writable row-major array (or None: the
//! output is a `dlbridge.Array` on that device, as for a dtype the framework
//! lacks); `finish(array)` turns what the kernel wrote into what the caller
//! gets (an immutable framework's zero-copy import: `jax.dlpack.from_dlpack`);
//! `stream(device)` is the framework's current CUDA stream, on which the
//! kernel runs. What `allocate` returns is checked against what the output
//! needs (shape, dtype, device, row-major and writable) before any kernel
//! writes it.

use std::sync::{Arc, Mutex, PoisonError};

use dlbridge_core::{Device, TensorView};
use dlbridge_registry::OutputSpec;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple, PyType, PyWeakrefMethods, PyWeakrefReference};

/// How a framework makes outputs.
#[derive(Debug)]
pub(crate) enum Maker {
    /// The producer's own DLPack C exchange API allocator (torch).
    Exchange,
    /// `numpy.empty` (a dtype NumPy lacks becomes a `dlbridge.Array`).
    Numpy,
    /// Functions given to `dlbridge.register_allocator`.
    Python(PyMaker),
}

/// A framework's output functions, as registered.
#[derive(Debug)]
pub(crate) struct PyMaker {
    /// The registered type as given: `cupy.ndarray`, `mylib.Tensor`.
    pub label: String,
    /// `allocate(shape, dtype, device) -> array | None`.
    pub allocate: Option<Py<PyAny>>,
    /// `finish(array) -> object`: what the caller gets.
    pub finish: Option<Py<PyAny>>,
    /// `stream(device) -> int`: the framework's current CUDA stream.
    pub stream: Option<Py<PyAny>>,
}

/// What a registration is keyed by.
#[derive(Debug)]
enum Key {
    Type(Py<PyType>),
    /// `module` and the attribute path in it (`"jax"`, `"Array"`).
    Name(String, String),
}

impl Key {
    fn same(&self, other: &Key) -> bool {
        match (self, other) {
            (Key::Type(a), Key::Type(b)) => a.is(b),
            (Key::Name(m, a), Key::Name(n, b)) => m == n && a == b,
            _ => false,
        }
    }
    fn clone_ref(&self, py: Python<'_>) -> Key {
        match self {
            Key::Type(t) => Key::Type(t.clone_ref(py)),
            Key::Name(m, a) => Key::Name(m.clone(), a.clone()),
        }
    }
    /// The registered type, if it can be had without importing anything.
    fn resolve<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyType>> {
        match self {
            Key::Type(t) => Some(t.bind(py).clone()),
            Key::Name(module, path) => {
                let modules = py.import("sys").ok()?.getattr("modules").ok()?;
                let mut obj = modules.get_item(module).ok()?;
                for part in path.split('.') {
                    obj = obj.getattr(part).ok()?;
                }
                obj.cast_into::<PyType>().ok()
            }
        }
    }
}

#[derive(Default)]
struct Table {
    /// In registration order; the latest match wins.
    entries: Vec<(Key, Arc<Maker>)>,
    /// Types already looked up, by address, each with a weak reference that
    /// tells it from a later type at the same address (a type is never kept
    /// alive by being looked up; dead entries are dropped as others are added).
    cache: Vec<(usize, Py<PyWeakrefReference>, Option<Arc<Maker>>)>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn with_table<R>(f: impl FnOnce(&mut Table) -> R) -> R {
    let mut guard = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(|| Table {
        entries: vec![
            (Key::Name("numpy".into(), "ndarray".into()), Arc::new(Maker::Numpy)),
            // A NumPy scalar (`np.float32(2)`) as the first tensor: NumPy's outputs.
            (Key::Name("numpy".into(), "generic".into()), Arc::new(Maker::Numpy)),
            (Key::Name("torch".into(), "Tensor".into()), Arc::new(Maker::Exchange)),
        ],
        cache: Vec::new(),
    }))
}

/// The maker registered for `obj`'s type or a base class of it (the latest
/// registration first), if any.
pub(crate) fn lookup(obj: &Bound<'_, PyAny>) -> Option<Arc<Maker>> {
    let py = obj.py();
    let ty = obj.get_type();
    let addr = ty.as_ptr() as usize;
    let found = with_table(|t| {
        t.cache.iter().find(|(a, w, _)| *a == addr && w.bind(py).upgrade().is_some_and(|live| live.is(&ty))).map(|(_, _, m)| m.clone())
    });
    if let Some(m) = found {
        return m;
    }
    // Resolving names and subclass checks run Python code, which may register
    // (and so lock the table): work on a copy of the entries.
    let entries: Vec<(Key, Arc<Maker>)> = with_table(|t| t.entries.iter().map(|(k, m)| (k.clone_ref(py), m.clone())).collect());
    let maker = entries
        .iter()
        .rev()
        .find(|(k, _)| k.resolve(py).is_some_and(|base| ty.is_subclass(&base).unwrap_or(false)))
        .map(|(_, m)| m.clone());
    if let Ok(weak) = PyWeakrefReference::new(&ty) {
        let dead = with_table(|t| {
            let (live, dead): (Vec<_>, Vec<_>) =
                std::mem::take(&mut t.cache).into_iter().partition(|(a, w, _)| *a != addr && w.bind(py).upgrade().is_some());
            t.cache = live;
            t.cache.push((addr, weak.unbind(), maker.clone()));
            dead
        });
        drop(dead); // outside the lock
    }
    maker
}

/// `dlbridge.register_allocator(array_type, allocate=None, *, finish=None, stream=None)`.
pub fn register(
    array_type: &Bound<'_, PyAny>,
    allocate: Option<Bound<'_, PyAny>>,
    finish: Option<Bound<'_, PyAny>>,
    stream: Option<Bound<'_, PyAny>>,
) -> PyResult<()> {
    let (key, label) = if let Ok(t) = array_type.cast::<PyType>() {
        let label = format!("{}.{}", t.module()?, t.qualname()?);
        (Key::Type(t.clone().unbind()), label)
    } else if let Ok(s) = array_type.cast::<PyString>() {
        let text = s.to_str()?;
        match text.split_once('.') {
            Some((module, path)) if !module.is_empty() && !path.is_empty() && path.split('.').all(|p| !p.is_empty()) => {
                (Key::Name(module.into(), path.into()), text.to_owned())
            }
            _ => {
                return Err(PyValueError::new_err(format!(
                    "register_allocator: array_type {text:?} is not a \"module.Name\" string (e.g. \"cupy.ndarray\")"
                )));
            }
        }
    } else {
        return Err(PyTypeError::new_err(format!(
            "register_allocator: array_type must be a type or a \"module.Name\" string, not {}",
            array_type.get_type().name()?
        )));
    };
    let callable = |f: Option<Bound<'_, PyAny>>, what: &str| -> PyResult<Option<Py<PyAny>>> {
        match f.filter(|f| !f.is_none()) {
            None => Ok(None),
            Some(f) if f.is_callable() => Ok(Some(f.unbind())),
            Some(f) => Err(PyTypeError::new_err(format!("register_allocator: {what} must be callable, not {}", f.get_type().name()?))),
        }
    };
    let maker = PyMaker {
        label,
        allocate: callable(allocate, "allocate")?,
        finish: callable(finish, "finish")?,
        stream: callable(stream, "stream")?,
    };
    if maker.allocate.is_none() && maker.finish.is_none() {
        return Err(PyTypeError::new_err(format!(
            "register_allocator({}): give allocate, finish or both (with neither, outputs are dlbridge.Arrays already)",
            maker.label
        )));
    }
    let old = with_table(|t| {
        let old = t.entries.iter().position(|(k, _)| k.same(&key)).map(|i| t.entries.remove(i));
        t.entries.push((key, Arc::new(Maker::Python(maker))));
        (old, std::mem::take(&mut t.cache))
    });
    // Python objects are dropped outside the lock (a finaliser may register).
    drop(old);
    Ok(())
}

/// The arguments `allocate` and `stream` take: the DLPack device pair.
fn device_pair(d: Device) -> (i32, i32) {
    (d.kind.0 as i32, d.id)
}

impl PyMaker {
    /// Calls `allocate` for `spec` (row-major); None where it declines or has
    /// no `allocate`.
    pub(crate) fn allocate<'py>(&self, py: Python<'py>, spec: &OutputSpec) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(f) = &self.allocate else { return Ok(None) };
        let shape = PyTuple::new(py, spec.shape.iter())?;
        let dtype = spec.dtype.numpy_name().map_or_else(|| spec.dtype.to_string(), str::to_owned);
        let out = f.bind(py).call1((shape, dtype, device_pair(spec.device)))?;
        Ok((!out.is_none()).then_some(out))
    }

    /// Checks what `allocate` returned against `spec`: an error naming the
    /// registration and what was wrong.
    pub(crate) fn check(&self, view: &TensorView<'_>, spec: &OutputSpec) -> PyResult<()> {
        let wrong = |what: String| {
            PyValueError::new_err(format!("the allocator registered for {} returned {what}; the output needs {spec}", self.label))
        };
        if view.shape() != spec.shape.as_slice() {
            return Err(wrong(format!("shape {:?}", view.shape())));
        }
        if view.dtype() != spec.dtype {
            return Err(wrong(format!("dtype {}", view.dtype())));
        }
        if view.device() != spec.device {
            return Err(wrong(format!("an array on {}", view.device())));
        }
        if !view.is_contiguous() {
            return Err(wrong(format!("a non-contiguous array (strides {:?})", view.strides())));
        }
        Ok(())
    }

    /// What the caller gets for an output: `finish(out)`, or `out`.
    pub(crate) fn finish<'py>(&self, out: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        match &self.finish {
            Some(f) => f.bind(out.py()).call1((out,)),
            None => Ok(out),
        }
    }

    /// The framework's current stream on `device`, if it says.
    pub(crate) fn stream(&self, py: Python<'_>, device: Device) -> PyResult<Option<usize>> {
        let Some(f) = &self.stream else { return Ok(None) };
        let s = f.bind(py).call1((device_pair(device),))?;
        let s: usize = s.extract().map_err(|_| {
            PyTypeError::new_err(format!("the stream function registered for {} returned {s:?}, not a stream handle (int)", self.label))
        })?;
        Ok(Some(s))
    }
}

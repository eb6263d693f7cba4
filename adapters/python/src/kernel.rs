//! `dlbridge.Kernel`: a registry kernel callable on any framework's tensors.
//!
//! `kernel(*args, out=None)`: tensors come in by the fastest path each object
//! offers (see [`crate::import`]); outputs are allocated by the framework of the
//! first tensor argument (torch through its exchange API allocator, NumPy with
//! `numpy.empty`, anything else as `dlbridge.Array`), or written into `out=` /
//! the extra positional tensors (destination-passing style, as TVM). The GIL is
//! released while the kernel runs when the call moves at least
//! [`RELEASE_GIL_MIN`] elements; tiny calls keep it (releasing costs more than
//! they take, and borrowed exchange views need it).

use std::sync::Arc;

use dlbridge_array::Array;
use dlbridge_core::{DType, Error, ManagedTensor, TensorViewMut};
use dlbridge_registry::signature::{ParamKind, ScalarKind};
use dlbridge_registry::{Arg, Kernel, OutputSpec};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};
use smallvec::SmallVec;

use crate::array::PyArray;
use crate::errors::IntoPy;
use crate::exchange::Api;
use crate::import::{Held, Imported, Mode, import};

/// Calls moving at least this many elements release the GIL while the kernel runs.
pub const RELEASE_GIL_MIN: usize = 1 << 15;

/// A registry kernel, callable from Python.
#[pyclass(name = "Kernel", module = "dlbridge", frozen)]
#[derive(Debug)]
pub struct PyKernel {
    kernel: Arc<Kernel>,
}

impl PyKernel {
    /// Wraps a kernel.
    pub fn new(kernel: Arc<Kernel>) -> PyKernel {
        PyKernel { kernel }
    }
}

/// How outputs are allocated.
#[derive(Clone, Copy)]
enum Alloc {
    Exchange(Api),
    Numpy,
    Array,
}

/// An output this call allocated.
enum NewOut {
    Exchange(Api, ManagedTensor),
    Numpy(Py<PyAny>, Imported),
    Array(Array),
}

static NDARRAY: PyOnceLock<Option<Py<PyType>>> = PyOnceLock::new();

fn is_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    let py = obj.py();
    let ty = NDARRAY
        .get_or_init(py, || py.import("numpy").and_then(|m| m.getattr("ndarray")).and_then(|t| Ok(t.cast_into::<PyType>()?.unbind())).ok());
    ty.as_ref().is_some_and(|t| obj.get_type().is(t.bind(py)))
}

fn numpy_dtype(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F16 => "float16",
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::BOOL => "bool",
        DType::C64 => "complex64",
        DType::C128 => "complex128",
        _ => return None,
    })
}

fn arity_error(k: &Kernel, given: usize) -> PyErr {
    let sig = k.signature();
    let names: Vec<&str> = sig.params.iter().map(|p| p.name.as_str()).collect();
    let outs: Vec<&str> = sig.outputs.iter().map(|p| p.name.as_str()).collect();
    PyTypeError::new_err(format!(
        "{}() takes {} arguments ({}){} but {given} were given",
        sig.name,
        names.len(),
        names.join(", "),
        if outs.is_empty() {
            String::new()
        } else {
            format!(", or {} with the outputs ({}) appended", names.len() + outs.len(), outs.join(", "))
        }
    ))
}

enum In<'py> {
    Tensor(Bound<'py, PyAny>, Imported, bool),
    Scalar(Arg<'static>),
}

impl PyKernel {
    fn run<'py>(&self, py: Python<'py>, args: &Bound<'py, PyTuple>, out: Option<&Bound<'py, PyAny>>) -> PyResult<Py<PyAny>> {
        let k = &*self.kernel;
        let sig = k.signature();
        let (np, no) = (sig.params.len(), sig.outputs.len());
        let nargs = args.len();
        // Which objects are outputs given by the caller?
        let given_outs: Option<SmallVec<[Bound<'py, PyAny>; 2]>> = match out {
            Some(o) if !o.is_none() => {
                if nargs != np {
                    return Err(arity_error(k, nargs));
                }
                if no == 0 {
                    return Err(PyTypeError::new_err(format!("{}() has no outputs; out= is not accepted", sig.name)));
                }
                let list: SmallVec<[Bound<'py, PyAny>; 2]> = if let Ok(t) = o.cast::<PyTuple>() {
                    t.iter().collect()
                } else if let Ok(l) = o.cast::<pyo3::types::PyList>() {
                    l.iter().collect()
                } else {
                    smallvec::smallvec![o.clone()]
                };
                if list.len() != no {
                    let plural = if no == 1 { "" } else { "s" };
                    return Err(PyTypeError::new_err(format!("{}(): out= needs {no} tensor{plural}, got {}", sig.name, list.len())));
                }
                Some(list)
            }
            _ if nargs == np => None,
            _ if no > 0 && nargs == np + no => Some(args.iter().skip(np).collect()),
            _ => return Err(arity_error(k, nargs)),
        };

        let mut mode = Mode::KeepGil;
        let mut ins = self.import_inputs(py, args, mode)?;
        let mut outs_imported: SmallVec<[(Bound<'py, PyAny>, Imported); 2]> = SmallVec::new();
        if let Some(list) = &given_outs {
            for o in list {
                outs_imported.push((
                    o.clone(),
                    import(o, true, mode)
                        .map_err(|e| arg_context(py, e, &sig.name, &format!("output {}", sig.outputs[outs_imported.len()].name)))?,
                ));
            }
        }

        // A first look at every tensor: sizes for the GIL decision, output specs.
        // Lent DLTensors are borrowed only for this block, in which no Python runs.
        let (total, specs) = {
            lend_all(&mut ins)?;
            let result = self.measure(&ins, &outs_imported, given_outs.is_none() && no > 0);
            unlend_all(&mut ins);
            result?
        };
        // Large calls release the GIL: take owning references instead of lent ones.
        if total >= RELEASE_GIL_MIN {
            mode = Mode::Own;
            for (idx, i) in ins.iter_mut().enumerate() {
                if let In::Tensor(obj, t, w) = i
                    && matches!(t.held, Held::Lent)
                {
                    *t = import(obj, *w, mode).map_err(|e| arg_context(py, e, &sig.name, &format!("argument {}", sig.params[idx].name)))?;
                }
            }
        }

        // Framework of the first tensor argument decides how outputs are allocated.
        let alloc = ins
            .iter()
            .find_map(|i| match i {
                In::Tensor(obj, t, _) => Some(match t.api {
                    Some(api) if api.can_allocate() => Alloc::Exchange(api),
                    _ if is_ndarray(obj) => Alloc::Numpy,
                    _ => Alloc::Array,
                }),
                In::Scalar(_) => None,
            })
            .unwrap_or(Alloc::Array);
        // Declared before the views that borrow them.
        let mut new_outs: SmallVec<[NewOut; 2]> = SmallVec::new();
        for spec in &specs {
            new_outs.push(allocate(py, alloc, spec, mode)?);
        }
        // Autograd learns about the writes, as from torch's own in-place ops.
        bump_versions(py, &ins, &outs_imported)?;

        // From here to the kernel call no Python code runs: lent DLTensors are
        // borrowed now and stay valid until the views are dropped.
        lend_all(&mut ins)?;
        // Views of the inputs.
        let mut views: SmallVec<[Arg<'_>; 8]> = SmallVec::new();
        for (idx, i) in ins.iter().enumerate() {
            views.push(match i {
                In::Scalar(a) => match a {
                    Arg::F64(x) => Arg::F64(*x),
                    Arg::I64(x) => Arg::I64(*x),
                    Arg::Bool(x) => Arg::Bool(*x),
                    _ => return Err(pyo3::exceptions::PyRuntimeError::new_err("internal error: a scalar slot holds a tensor")),
                },
                In::Tensor(_, t, writable) => {
                    let v = t.view()?;
                    if *writable {
                        // SAFETY: Python tensors are shared-mutable memory; this call is
                        // the writer, and the registry refuses any overlap between a
                        // written tensor and every other argument before the kernel runs.
                        Arg::TensorMut(unsafe { TensorViewMut::from_view(v) }.map_err(|e| {
                            arg_context(py, crate::errors::to_pyerr(e), &sig.name, &format!("argument {}", sig.params[idx].name))
                        })?)
                    } else {
                        Arg::Tensor(v)
                    }
                }
            });
        }

        let mut out_views: SmallVec<[TensorViewMut<'_>; 2]> = SmallVec::new();
        for (idx, (_, t)) in outs_imported.iter().enumerate() {
            // SAFETY: as for writable inputs: the registry refuses overlaps.
            out_views.push(
                unsafe { TensorViewMut::from_view(t.view()?) }
                    .map_err(|e| arg_context(py, crate::errors::to_pyerr(e), &sig.name, &format!("output {}", sig.outputs[idx].name)))?,
            );
        }
        for n in new_outs.iter_mut() {
            out_views.push(match n {
                NewOut::Exchange(_, m) => m.view_mut().py_err()?,
                // SAFETY: a freshly allocated NumPy array nobody else has seen yet.
                NewOut::Numpy(_, t) => unsafe { TensorViewMut::from_view(t.view()?) }.py_err()?,
                NewOut::Array(a) => a.view_mut().py_err()?,
            });
        }

        let stream = match (alloc, views.iter().find_map(|a| a.tensor_meta())) {
            (Alloc::Exchange(api), Some((_, _, dev))) => api.current_stream(py, dev)?,
            _ => std::ptr::null_mut(),
        };
        let stream_addr = stream as usize;
        let result = if mode == Mode::Own {
            py.detach(|| k.call_on_stream(&mut views, &mut out_views, stream_addr as *mut std::ffi::c_void))
        } else {
            k.call_on_stream(&mut views, &mut out_views, stream)
        };
        drop(out_views);
        drop(views);
        result.py_err()?;
        drop(ins);

        // Results.
        if let Some(list) = given_outs {
            if let Some(o) = out.filter(|o| !o.is_none()) {
                return Ok(o.clone().unbind());
            }
            return Ok(if list.len() == 1 { list[0].clone().unbind() } else { PyTuple::new(py, list)?.into_any().unbind() });
        }
        let mut results: SmallVec<[Bound<'py, PyAny>; 2]> = SmallVec::new();
        for n in new_outs {
            results.push(match n {
                NewOut::Exchange(api, m) => api.to_py(py, m)?,
                NewOut::Numpy(obj, _) => obj.into_bound(py),
                NewOut::Array(a) => Bound::new(py, PyArray::new(a))?.into_any(),
            });
        }
        Ok(match results.len() {
            0 => py.None(),
            1 => results.pop().map(|r| r.unbind()).unwrap_or_else(|| py.None()),
            _ => PyTuple::new(py, results)?.into_any().unbind(),
        })
    }

    /// Elements moved by the call (saturating: zero-stride views can claim 2^62
    /// each) and, when `specs`, the outputs to allocate. Every lent tensor must be borrowed.
    fn measure(&self, ins: &[In<'_>], outs: &[(Bound<'_, PyAny>, Imported)], specs: bool) -> PyResult<(usize, SmallVec<[OutputSpec; 2]>)> {
        let mut total = 0usize;
        let mut views: SmallVec<[Arg<'_>; 8]> = SmallVec::new();
        for i in ins {
            views.push(match i {
                In::Scalar(Arg::F64(x)) => Arg::F64(*x),
                In::Scalar(Arg::I64(x)) => Arg::I64(*x),
                In::Scalar(Arg::Bool(x)) => Arg::Bool(*x),
                In::Scalar(_) => {
                    return Err(crate::errors::to_pyerr(Error::Runtime("internal error: a scalar slot holds a tensor".into())));
                }
                In::Tensor(_, t, _) => {
                    let v = t.view()?;
                    total = total.saturating_add(v.numel());
                    Arg::Tensor(v)
                }
            });
        }
        for (_, t) in outs {
            total = total.saturating_add(t.view()?.numel());
        }
        let specs = if specs { self.kernel.prepare_outputs(&views).py_err()?.into_iter().collect() } else { SmallVec::new() };
        Ok((total, specs))
    }

    fn import_inputs<'py>(&self, py: Python<'py>, args: &Bound<'py, PyTuple>, mode: Mode) -> PyResult<SmallVec<[In<'py>; 8]>> {
        let sig = self.kernel.signature();
        let mut ins: SmallVec<[In<'py>; 8]> = SmallVec::new();
        for (i, p) in sig.params.iter().enumerate() {
            let obj = args.get_item(i)?;
            let ctx = |e: PyErr| arg_context(py, e, &sig.name, &format!("argument {}", p.name));
            ins.push(match &p.kind {
                ParamKind::Scalar(kind) => In::Scalar(match kind {
                    ScalarKind::F64 => Arg::F64(scalar_f64(&obj).map_err(ctx)?),
                    ScalarKind::I64 => Arg::I64(scalar(&obj, "an int").map_err(ctx)?),
                    ScalarKind::Bool => Arg::Bool(scalar(&obj, "a bool").map_err(ctx)?),
                }),
                ParamKind::Tensor(t) => {
                    let imported = import(&obj, t.mutable, mode).map_err(ctx)?;
                    In::Tensor(obj, imported, t.mutable)
                }
            });
        }
        Ok(ins)
    }
}

/// Borrows every lent DLTensor of `ins` (see [`Held::Borrowed`]): the caller runs
/// no Python code until [`unlend_all`] or until `ins` is dropped.
fn lend_all(ins: &mut [In<'_>]) -> PyResult<()> {
    for i in ins.iter_mut() {
        if let In::Tensor(obj, t, _) = i {
            // SAFETY: `obj` lives in `ins` beside `t`; the caller's contract above.
            unsafe { t.lend(obj) }?;
        }
    }
    Ok(())
}

fn unlend_all(ins: &mut [In<'_>]) {
    for i in ins.iter_mut() {
        if let In::Tensor(_, t, _) = i {
            t.unlend();
        }
    }
}

/// Tells torch's autograd that the torch tensors this call writes (mut
/// arguments, given outputs) are modified, in one call.
fn bump_versions<'a, 'py>(py: Python<'py>, ins: &'a [In<'py>], outs: &'a [(Bound<'py, PyAny>, Imported)]) -> PyResult<()> {
    let written_ins = ins.iter().filter_map(|i| match i {
        In::Tensor(obj, t, true) => Some((obj, t)),
        _ => None,
    });
    let mut api = None;
    let mut written: SmallVec<[&'a Bound<'py, PyAny>; 4]> = SmallVec::new();
    for (obj, t) in written_ins.chain(outs.iter().map(|(o, t)| (o, t))) {
        if let Some(a) = t.api.filter(|a| a.is_torch()) {
            api = Some(a);
            written.push(obj);
        }
    }
    match api {
        Some(a) => a.bump_versions(py, &written),
        None => Ok(()),
    }
}

static COMPLEXFLOATING: PyOnceLock<Option<Py<PyType>>> = PyOnceLock::new();

/// A real scalar. Complex numbers are refused (NumPy's complex scalars would
/// otherwise convert through `__float__`, silently dropping the imaginary part);
/// errors other than "wrong type" (OverflowError, an exception raised by
/// `__float__`) propagate as they are.
fn scalar_f64(obj: &Bound<'_, PyAny>) -> PyResult<f64> {
    if let Ok(f) = obj.cast::<pyo3::types::PyFloat>() {
        return Ok(f.value());
    }
    let py = obj.py();
    let complex = obj.is_instance_of::<pyo3::types::PyComplex>()
        || COMPLEXFLOATING
            .get_or_init(py, || {
                py.import("numpy").and_then(|m| m.getattr("complexfloating")).and_then(|t| Ok(t.cast_into::<PyType>()?.unbind())).ok()
            })
            .as_ref()
            .is_some_and(|t| obj.is_instance(t.bind(py)).unwrap_or(false));
    if complex {
        return Err(PyTypeError::new_err(format!("expected a real float, got {} (a complex number)", type_name(obj))));
    }
    scalar(obj, "a float")
}

fn scalar<'py, T: pyo3::conversion::FromPyObjectOwned<'py>>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<T> {
    obj.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        if e.is_instance_of::<PyTypeError>(obj.py()) { PyTypeError::new_err(format!("expected {what}, got {}", type_name(obj))) } else { e }
    })
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// Prefixes an exception's message with the kernel and argument, keeping its type.
fn arg_context(py: Python<'_>, e: PyErr, kernel: &str, what: &str) -> PyErr {
    let msg = e.value(py).str().map(|s| s.to_string()).unwrap_or_default();
    if msg.starts_with(&format!("{kernel}:")) {
        return e;
    }
    let ty = e.get_type(py);
    match ty.call1((format!("{kernel}: {what}: {msg}"),)) {
        Ok(v) => PyErr::from_value(v),
        Err(_) => e,
    }
}

fn allocate(py: Python<'_>, alloc: Alloc, spec: &OutputSpec, mode: Mode) -> PyResult<NewOut> {
    match alloc {
        Alloc::Exchange(api) => Ok(NewOut::Exchange(api, api.allocate(py, spec)?)),
        Alloc::Numpy if numpy_dtype(spec.dtype).is_some() && spec.device == dlbridge_core::Device::CPU => {
            let np = py.import("numpy")?;
            let shape = PyTuple::new(py, spec.shape.iter())?;
            let obj = np.call_method1("empty", (shape, numpy_dtype(spec.dtype)))?;
            let t = import(&obj, true, mode)?;
            Ok(NewOut::Numpy(obj.unbind(), t))
        }
        _ => {
            if spec.device != dlbridge_core::Device::CPU {
                return Err(PyValueError::new_err(format!("cannot allocate {spec}: dlbridge.Array lives on the CPU")));
            }
            Ok(NewOut::Array(Array::zeros(spec.dtype, &spec.shape).py_err()?))
        }
    }
}

#[pymethods]
impl PyKernel {
    /// The kernel's name.
    #[getter]
    fn name(&self) -> String {
        self.kernel.name().to_owned()
    }
    /// The signature text.
    #[getter]
    fn signature(&self) -> String {
        self.kernel.signature_text().to_owned()
    }
    /// One-line description.
    #[getter]
    fn doc(&self) -> String {
        self.kernel.doc().to_owned()
    }
    /// Devices the kernel runs on.
    #[getter]
    fn devices(&self) -> Vec<String> {
        self.kernel.devices().map(|d| d.to_string()).collect()
    }
    /// The inputs (scalars, tensors, `mut` tensors) in call order, as `dlbridge.Param`s.
    #[getter]
    fn params(&self) -> Vec<PyParam> {
        let sig = self.kernel.signature();
        sig.params.iter().map(|p| PyParam::of(sig, p)).collect()
    }
    /// The outputs, as `dlbridge.Param`s (allocated by the call unless given).
    #[getter]
    fn outputs(&self) -> Vec<PyParam> {
        let sig = self.kernel.signature();
        sig.outputs.iter().map(|p| PyParam::of(sig, p)).collect()
    }
    /// The type variables and the dtypes each may take, in declaration order:
    /// `{"T": ["f32", "f64"]}` (empty for a kernel without type variables).
    #[getter]
    fn dtypes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let d = pyo3::types::PyDict::new(py);
        for tv in &self.kernel.signature().type_vars {
            d.set_item(&tv.name, tv.allowed.iter().map(|t| t.to_string()).collect::<Vec<_>>())?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let devices: Vec<String> = self.kernel.devices().map(|d| d.to_string()).collect();
        format!("<dlbridge.Kernel {} [{}]>", self.kernel.signature_text(), devices.join(", "))
    }

    /// `(shape, dtype, device)` of every output for these inputs (what `__call__` allocates).
    #[pyo3(signature = (*args))]
    fn prepare_outputs<'py>(&self, py: Python<'py>, args: &Bound<'py, PyTuple>) -> PyResult<Vec<(Vec<i64>, String, String)>> {
        let sig = self.kernel.signature();
        if args.len() != sig.params.len() {
            return Err(arity_error(&self.kernel, args.len()));
        }
        let mut ins = self.import_inputs(py, args, Mode::KeepGil)?;
        lend_all(&mut ins)?;
        let specs = self.measure(&ins, &[], true).map(|(_, specs)| specs);
        unlend_all(&mut ins);
        let specs = specs?;
        Ok(specs.iter().map(|s| (s.shape.to_vec(), s.dtype.to_string(), s.device.to_string())).collect())
    }

    /// Runs the kernel; see the module docs.
    #[pyo3(signature = (*args, out=None))]
    fn __call__<'py>(&self, py: Python<'py>, args: &Bound<'py, PyTuple>, out: Option<&Bound<'py, PyAny>>) -> PyResult<Py<PyAny>> {
        self.run(py, args, out)
    }
}

/// One dim of a `dlbridge.Param`: a fixed size, a symbol (`M`) or a group (`...B`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ParamDim {
    Fixed(i64),
    Named(String),
}

/// An input or output of a kernel's signature, as `Kernel.params` and
/// `Kernel.outputs` list them.
#[pyclass(name = "Param", module = "dlbridge", frozen, eq, hash)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyParam {
    name: String,
    tensor: bool,
    dtype: String,
    dtypes: Vec<String>,
    dims: Option<Vec<ParamDim>>,
    mutable: bool,
    text: String,
}

impl PyParam {
    fn of(sig: &dlbridge_registry::Signature, p: &dlbridge_registry::signature::Param) -> PyParam {
        use dlbridge_registry::signature::{DTypeRef, Dim};
        match &p.kind {
            ParamKind::Scalar(s) => {
                let s = s.to_string();
                PyParam {
                    name: p.name.clone(),
                    tensor: false,
                    dtype: s.clone(),
                    dtypes: vec![s.clone()],
                    dims: None,
                    mutable: false,
                    text: s,
                }
            }
            ParamKind::Tensor(t) => {
                let (dtype, dtypes) = match t.dtype {
                    DTypeRef::Concrete(d) => (d.to_string(), vec![d.to_string()]),
                    DTypeRef::Var(i) => {
                        let tv = &sig.type_vars[i];
                        (tv.name.clone(), tv.allowed.iter().map(|d| d.to_string()).collect())
                    }
                };
                let dims = t
                    .dims
                    .iter()
                    .map(|d| match *d {
                        Dim::Fixed(n) => ParamDim::Fixed(n),
                        Dim::Sym(i) => ParamDim::Named(sig.symbols[i].clone()),
                        Dim::Rest(i) => ParamDim::Named(format!("...{}", sig.rests[i])),
                    })
                    .collect();
                let text = format!("{}{dtype}{}", if t.mutable { "mut " } else { "" }, sig.fmt_dims(&t.dims));
                PyParam { name: p.name.clone(), tensor: true, dtype, dtypes, dims: Some(dims), mutable: t.mutable, text }
            }
        }
    }
}

#[pymethods]
impl PyParam {
    /// Its name in the signature.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }
    /// `"tensor"` or `"scalar"`.
    #[getter]
    fn kind(&self) -> &'static str {
        if self.tensor { "tensor" } else { "scalar" }
    }
    /// A tensor's dtype as written: a concrete dtype (`f32`) or a type
    /// variable (`T`, see `dtypes`); a scalar's type (`f64`, `i64`, `bool`).
    #[getter]
    fn dtype(&self) -> &str {
        &self.dtype
    }
    /// The dtypes it accepts: the type variable's allowed set, or the one dtype.
    #[getter]
    fn dtypes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.dtypes)
    }
    /// A tensor's dims as written, `int` for a fixed size and `str` for a
    /// symbol (`"M"`) or a group of any number of dims (`"...B"`); None for a scalar.
    #[getter]
    fn dims<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(dims) = &self.dims else { return Ok(None) };
        let items: Vec<Bound<'py, PyAny>> = dims
            .iter()
            .map(|d| match d {
                ParamDim::Fixed(n) => pyo3::types::PyInt::new(py, *n).into_any(),
                ParamDim::Named(s) => pyo3::types::PyString::new(py, s).into_any(),
            })
            .collect();
        PyTuple::new(py, items).map(Some)
    }
    /// Whether the kernel writes this input in place (`mut`).
    #[getter]
    fn mutable(&self) -> bool {
        self.mutable
    }
    /// The type as the signature writes it: `T[M, K]`, `mut f32[N]`, `f64`.
    #[getter]
    fn annotation(&self) -> &str {
        &self.text
    }

    /// `name: type`, as in the signature.
    fn __str__(&self) -> String {
        format!("{}: {}", self.name, self.text)
    }

    fn __repr__(&self) -> String {
        let quoted = |v: &[String]| v.iter().map(|s| format!("'{s}'")).collect::<Vec<_>>();
        let dtypes = quoted(&self.dtypes);
        let dims = match &self.dims {
            None => "None".to_owned(),
            Some(d) => {
                let parts: Vec<String> = d
                    .iter()
                    .map(|d| match d {
                        ParamDim::Fixed(n) => n.to_string(),
                        ParamDim::Named(s) => format!("'{s}'"),
                    })
                    .collect();
                if parts.len() == 1 { format!("({},)", parts[0]) } else { format!("({})", parts.join(", ")) }
            }
        };
        format!(
            "dlbridge.Param(name='{}', kind='{}', dtype='{}', dtypes=({}{}), dims={dims}, mutable={})",
            self.name,
            self.kind(),
            self.dtype,
            dtypes.join(", "),
            if dtypes.len() == 1 { "," } else { "" },
            if self.mutable { "True" } else { "False" }
        )
    }
}

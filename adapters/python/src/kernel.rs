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
//!
//! Arguments are bound by the registry's binding layer
//! (`dlbridge_registry::binding`): this module only says how Python objects
//! become tensors and scalars (`Objects`) and which framework allocates the
//! outputs (`PyAllocator`: torch's exchange API, NumPy, else `dlbridge.Array`).

use std::sync::Arc;

use dlbridge_core::{DType, Device, ManagedTensor, Slot};
use dlbridge_registry::binding::{Adapter, Allocator, ArrayAllocator, Binding, Job, Operand, Scalar};
use dlbridge_registry::signature::{ParamKind, ScalarKind};
use dlbridge_registry::{Kernel, OutputSpec};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};
use smallvec::SmallVec;

use crate::array::PyArray;
use crate::cuda::DeviceArrays;
use crate::errors::{IntoPy, PyFail, locate};
use crate::exchange::Api;
use crate::frameworks::{Maker, PyMaker};
use crate::import::{Mode, Tensor, import, python_may_run};

/// Calls moving at least this many elements release the GIL while the kernel runs.
pub const RELEASE_GIL_MIN: usize = 1 << 15;

/// A registry kernel, callable from Python.
#[pyclass(name = "Kernel", module = "dlbridge", frozen, weakref)]
#[derive(Debug)]
pub struct PyKernel {
    /// The type's vectorcall entry, at the same offset in every instance
    /// (see [`crate::vectorcall`]; read by CPython once the entry is installed).
    pub(crate) vectorcall: pyo3::ffi::vectorcallfunc,
    kernel: Arc<Kernel>,
}

impl PyKernel {
    /// Wraps a kernel.
    pub fn new(kernel: Arc<Kernel>) -> PyKernel {
        PyKernel { vectorcall: crate::vectorcall::kernel_vectorcall, kernel }
    }
}

/// Python objects as kernel arguments: the registry binding layer's adapter.
struct Objects<'py> {
    py: Python<'py>,
}

impl<'py> Adapter for Objects<'py> {
    type Value<'a> = Bound<'py, PyAny>;
    type Tensor<'a> = Tensor<'py>;
    type Error = PyFail;

    fn tensor<'a>(&mut self, obj: Self::Value<'a>, writable: bool) -> Result<Self::Tensor<'a>, PyFail> {
        Ok(import(&obj, writable, Mode::KeepGil)?)
    }
    fn scalar(&mut self, obj: Bound<'py, PyAny>, kind: ScalarKind) -> Result<Scalar, PyFail> {
        python_may_run();
        Ok(match kind {
            ScalarKind::F64 => Scalar::F64(scalar_f64(&obj)?),
            ScalarKind::I64 => Scalar::I64(scalar(&obj, "an int")?),
            ScalarKind::Bool => Scalar::Bool(scalar(&obj, "a bool")?),
        })
    }
    fn locate(&mut self, e: PyFail, kernel: &str, slot: Slot) -> PyFail {
        PyFail(locate(self.py, e.0, kernel, &slot))
    }
}

type Call<'k, 'py> = Binding<'k, Tensor<'py>, PyFail>;

/// What a bound call's tensors say about it (see `PyKernel::survey`).
struct Survey {
    /// Elements moved, all tensors together.
    total: usize,
    /// The first tensor whose producer has a stream API, and its device.
    streams: Option<(Api, Device)>,
    /// The first tensor's device.
    first: Option<Device>,
}

/// An output allocator for Python callers: it claims a call by its first
/// tensor argument and turns what it allocated into Python objects.
trait PyAllocator<'py>: Allocator<PyFail> + Sized {
    /// The Python object of an output, as the caller gets it.
    fn to_py(&self, py: Python<'py>, out: Self::Tensor) -> PyResult<Bound<'py, PyAny>>;
    /// The Python object of an output before any hand-over (a registered
    /// framework's `finish`): the object the kernel writes.
    fn raw(&self, py: Python<'py>, out: Self::Tensor) -> PyResult<Bound<'py, PyAny>> {
        self.to_py(py, out)
    }
}

/// An allocator's error, located at `kernel`'s output `output`.
fn at_output(py: Python<'_>, e: PyFail, kernel: &str, output: &str) -> PyFail {
    PyFail(locate(py, e.0, kernel, &Slot::Output(output.into())))
}

/// torch (and any producer whose exchange API can allocate): the producer's own allocator.
struct Exchange<'py> {
    py: Python<'py>,
    api: Api,
}

impl Allocator<PyFail> for Exchange<'_> {
    type Tensor = ManagedTensor;
    fn returns_new_memory(&self) -> bool {
        true
    }
    fn locate(&mut self, e: PyFail, kernel: &str, output: &str) -> PyFail {
        at_output(self.py, e, kernel, output)
    }
    fn allocate(&mut self, spec: &OutputSpec) -> Result<ManagedTensor, PyFail> {
        // torch's allocator may dispatch to Python (a TorchDispatchMode).
        python_may_run();
        if spec.is_row_major() {
            return Ok(self.api.allocate(self.py, spec)?);
        }
        // The exchange allocator takes a shape only (row-major): allocate in
        // memory order, then re-export the same memory permuted.
        let t = self.api.allocate(self.py, &OutputSpec { shape: spec.memory_shape(), order: Default::default(), ..spec.clone() })?;
        Ok(t.permute(&spec.axes()).map_err(crate::errors::to_pyerr)?)
    }
}

impl<'py> Exchange<'py> {
    /// The allocator of `first`'s exchange API, if it can allocate.
    fn claim(first: &Tensor<'py>) -> Option<Self> {
        first.api.filter(|a| a.can_allocate()).map(|api| Exchange { py: first.obj.py(), api })
    }
}

impl<'py> PyAllocator<'py> for Exchange<'py> {
    fn to_py(&self, py: Python<'py>, out: ManagedTensor) -> PyResult<Bound<'py, PyAny>> {
        self.api.to_py(py, out)
    }
}

/// NumPy: `numpy.empty`; a dtype NumPy lacks (bf16, float8, ...) becomes a `dlbridge.Array`.
struct Numpy<'py> {
    py: Python<'py>,
}

impl<'py> Allocator<PyFail> for Numpy<'py> {
    type Tensor = Tensor<'py>;
    fn returns_new_memory(&self) -> bool {
        true
    }
    fn locate(&mut self, e: PyFail, kernel: &str, output: &str) -> PyFail {
        at_output(self.py, e, kernel, output)
    }
    fn allocate(&mut self, spec: &OutputSpec) -> Result<Tensor<'py>, PyFail> {
        python_may_run();
        let py = self.py;
        let obj = match numpy_dtype(spec.dtype).filter(|_| spec.device == Device::CPU) {
            Some(dtype) if spec.is_row_major() => {
                let shape = PyTuple::new(py, spec.shape.iter())?;
                py.import(pyo3::intern!(py, "numpy"))?.call_method1(pyo3::intern!(py, "empty"), (shape, dtype))?
            }
            // In the inputs' memory order, as NumPy's own ufuncs (order='K').
            Some(dtype) => {
                let shape = PyTuple::new(py, spec.memory_shape().iter())?;
                let a = py.import(pyo3::intern!(py, "numpy"))?.call_method1(pyo3::intern!(py, "empty"), (shape, dtype))?;
                a.call_method1(pyo3::intern!(py, "transpose"), (PyTuple::new(py, spec.axes().iter())?,))?
            }
            None => Bound::new(py, PyArray::new(<ArrayAllocator as Allocator<PyFail>>::allocate(&mut ArrayAllocator, spec)?))?.into_any(),
        };
        Ok(import(&obj, true, Mode::Own)?)
    }
}

impl<'py> PyAllocator<'py> for Numpy<'py> {
    fn to_py(&self, _: Python<'py>, out: Tensor<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(out.obj)
    }
}

/// Anything else: `dlbridge.Array`, on the call's device (host or CUDA).
struct Arrays<'py> {
    py: Python<'py>,
}

impl Allocator<PyFail> for Arrays<'_> {
    type Tensor = dlbridge_array::Array;
    fn returns_new_memory(&self) -> bool {
        true
    }
    fn locate(&mut self, e: PyFail, kernel: &str, output: &str) -> PyFail {
        at_output(self.py, e, kernel, output)
    }
    fn allocate(&mut self, spec: &OutputSpec) -> Result<dlbridge_array::Array, PyFail> {
        DeviceArrays.allocate(spec)
    }
}

impl<'py> PyAllocator<'py> for Arrays<'py> {
    fn to_py(&self, py: Python<'py>, out: dlbridge_array::Array) -> PyResult<Bound<'py, PyAny>> {
        Ok(Bound::new(py, PyArray::new(out))?.into_any())
    }
}

/// A framework registered with `dlbridge.register_allocator`: its
/// `allocate` (checked), else a `dlbridge.Array` on the device; its `finish`
/// makes what the caller gets.
struct Registered<'py> {
    py: Python<'py>,
    maker: Arc<Maker>,
    /// Whether the last error came from the registered function itself.
    raised: std::cell::Cell<bool>,
}

impl Registered<'_> {
    fn maker(&self) -> PyResult<&PyMaker> {
        match &*self.maker {
            Maker::Python(m) => Ok(m),
            _ => Err(pyo3::exceptions::PyRuntimeError::new_err("internal error: a registered allocator without its functions")),
        }
    }
}

impl<'py> Allocator<PyFail> for Registered<'py> {
    type Tensor = Tensor<'py>;
    fn locate(&mut self, e: PyFail, kernel: &str, output: &str) -> PyFail {
        // An exception the registered function raised is its own: it keeps its
        // type and arguments (a KeyError's key, an OSError's errno), and where
        // it happened goes in a note.
        if self.raised.replace(false) {
            let py = self.py;
            let note = format!("in dlbridge kernel {kernel}: output {output} (allocated by {})", self.describe());
            let _ = e.0.value(py).call_method1(pyo3::intern!(py, "add_note"), (note,));
            return e;
        }
        at_output(self.py, e, kernel, output)
    }
    fn describe(&self) -> String {
        match &*self.maker {
            Maker::Python(m) => format!("the allocator registered for {}", m.label),
            _ => "the allocator".into(),
        }
    }
    fn allocate(&mut self, spec: &OutputSpec) -> Result<Tensor<'py>, PyFail> {
        python_may_run();
        let py = self.py;
        let m = self.maker()?;
        // Row-major: a registered framework is asked for a shape only.
        let spec = &OutputSpec { order: Default::default(), ..spec.clone() };
        let allocated = m.allocate(py, spec);
        self.raised.set(allocated.is_err());
        let Some(obj) = allocated? else {
            let a = <DeviceArrays as Allocator<PyFail>>::allocate(&mut DeviceArrays, spec)?;
            return Ok(import(Bound::new(py, PyArray::new(a))?.as_any(), true, Mode::Own)?);
        };
        let t = import(&obj, true, Mode::Own).map_err(|e| {
            PyFail(pyo3::exceptions::PyValueError::new_err(format!(
                "the allocator registered for {} returned {}, which dlbridge cannot write: {}",
                m.label,
                type_name(&obj),
                e.value(py)
            )))
        })?;
        m.check(&t.view().map_err(crate::errors::to_pyerr)?, spec)?;
        Ok(t)
    }
}

impl<'py> PyAllocator<'py> for Registered<'py> {
    fn to_py(&self, _: Python<'py>, out: Tensor<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.maker()?.finish(out.obj)
    }
    fn raw(&self, _: Python<'py>, out: Tensor<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(out.obj)
    }
}

fn numpy_dtype(d: DType) -> Option<&'static str> {
    d.numpy_name().filter(|_| d.in_numpy())
}

impl PyKernel {
    /// Binds `args` (and `out=`) to the kernel's parameters, into `call` (an
    /// empty binding of this kernel: it is filled where it lives, never moved).
    #[inline(always)]
    fn bind<'py, I>(&self, py: Python<'py>, args: I, out: Option<&Bound<'py, PyAny>>, call: &mut Call<'_, 'py>) -> PyResult<()>
    where
        I: ExactSizeIterator<Item = Bound<'py, PyAny>>,
    {
        let k: &Kernel = &self.kernel;
        let mut objects = Objects { py };
        match out.filter(|o| !o.is_none()) {
            None => Ok(k.bind_into(&mut objects, args, call)?),
            Some(o) => {
                let list: SmallVec<[Bound<'py, PyAny>; 2]> = if let Ok(t) = o.cast::<PyTuple>() {
                    t.iter().collect()
                } else if let Ok(l) = o.cast::<pyo3::types::PyList>() {
                    l.iter().collect()
                } else {
                    smallvec::smallvec![o.clone()]
                };
                Ok(k.bind_out_into(&mut objects, args, list, call)?)
            }
        }
    }

    /// After binding: the checks that needed a lent tensor's dtype, then the
    /// call's size, the device of the first tensor whose producer has a
    /// stream API, and the first tensor's device. The views taken here are the snapshots the call goes on
    /// using (see `import::Lent`); errors name their argument.
    fn survey<'py>(&self, py: Python<'py>, call: &mut Call<'_, 'py>) -> PyResult<Survey> {
        let k: &Kernel = &self.kernel;
        let sig = k.signature();
        // The slot of the i-th operand (tensor parameters, then outputs), built only for errors.
        let slot = |i: usize| -> Slot {
            let mut tensors = sig.params.iter().filter(|p| p.tensor().is_some());
            match tensors.nth(i) {
                Some(p) => Slot::Argument(p.name.clone()),
                None => Slot::Output(
                    sig.outputs
                        .get(i - sig.params.iter().filter(|p| p.tensor().is_some()).count())
                        .map(|p| p.name.clone())
                        .unwrap_or_default(),
                ),
            }
        };
        for (i, t) in call.operands_mut().enumerate() {
            t.check_deferred().map_err(|e| locate(py, e, k.name(), &slot(i)))?;
        }
        let mut total = 0usize;
        let (mut device, mut first) = (None, None);
        for (i, t) in call.operands().enumerate() {
            let v = t.view().map_err(|e| locate(py, crate::errors::to_pyerr(e), k.name(), &slot(i)))?;
            total = total.saturating_add(v.numel());
            first = first.or(Some(v.device()));
            if device.is_none()
                && let Some(api) = t.api
            {
                device = Some((api, v.device()));
            }
        }
        Ok(Survey { total, streams: device, first })
    }

    /// A call: `kernel(*args, out=out)`, from either entry (`tp_call` or
    /// [`crate::vectorcall`]).
    pub(crate) fn call_objects<'py, I>(&self, py: Python<'py>, args: I, out: Option<&Bound<'py, PyAny>>) -> PyResult<Py<PyAny>>
    where
        I: ExactSizeIterator<Item = Bound<'py, PyAny>>,
    {
        let mut call = self.kernel.binding();
        self.bind(py, args, out, &mut call)?;
        let Survey { total, streams: device, first: first_device } = self.survey(py, &mut call)?;
        let maker = call.operands().next().and_then(|t| crate::frameworks::lookup(&t.obj));
        // Large calls release the GIL: lent exchange views need it, so own them first.
        let release = total >= RELEASE_GIL_MIN;
        if release {
            for t in call.operands_mut() {
                t.own()?;
            }
        }
        // The kernel runs on the caller's current stream: torch's (through the
        // exchange API), or the one a registered framework names (CuPy's).
        let stream = match (device, maker.as_deref(), first_device) {
            (Some((api, device)), _, _) => api.current_stream(py, device)? as usize,
            (None, Some(Maker::Python(m)), Some(d)) if crate::cuda::is_cuda(d) => m.stream(py, d)?.unwrap_or(0),
            _ => 0,
        };

        // dlbridge's CUDA arrays are ordered on the legacy default stream (see
        // `cuda`): a call on another stream waits for it, and it for the call.
        let stream_u = stream as u64;
        let order = if stream_u > dlbridge_cuda::stream::LEGACY {
            call.operands()
                .filter_map(|t| t.obj.cast::<PyArray>().ok().map(|a| a.get().array().device()))
                .find(|&d| crate::cuda::is_cuda(d))
                .map(crate::cuda::device)
                .transpose()
                .py_err()?
        } else {
            None
        };
        if let Some(dev) = &order {
            dev.stream_wait(dlbridge_cuda::stream::LEGACY, stream_u).py_err()?;
        }
        let result = dispatch(py, &mut call, out, maker.as_ref(), stream, release);
        if let Some(dev) = &order {
            dev.stream_wait(stream_u, dlbridge_cuda::stream::LEGACY).py_err()?;
        }
        result
    }
}

/// Allocates the outputs (given ones, else those of the first tensor's
/// framework, `maker`) and runs.
fn dispatch<'py>(
    py: Python<'py>,
    call: &mut Call<'_, 'py>,
    out: Option<&Bound<'py, PyAny>>,
    maker: Option<&Arc<Maker>>,
    stream: usize,
    release: bool,
) -> PyResult<Py<PyAny>> {
    if call.given_outputs().is_some() {
        finish(py, call, Arrays { py }, stream, release)?;
        let given = call.take_given_outputs().unwrap_or_default();
        if let Some(o) = out.filter(|o| !o.is_none()) {
            return Ok(o.clone().unbind());
        }
        return Ok(match given.len() {
            1 => given.into_iter().next().map(|t| t.obj.unbind()).unwrap_or_else(|| py.None()),
            _ => PyTuple::new(py, given.into_iter().map(|t| t.obj))?.into_any().unbind(),
        });
    }
    // The framework of the first tensor argument allocates the outputs (see `frameworks`).
    let Some(first) = call.operands().next() else {
        return finish(py, call, Arrays { py }, stream, release);
    };
    match maker {
        Some(m) if matches!(**m, Maker::Numpy) => finish(py, call, Numpy { py }, stream, release),
        Some(m) if matches!(**m, Maker::Python(_)) => {
            finish(py, call, Registered { py, maker: m.clone(), raised: Default::default() }, stream, release)
        }
        // torch, and any type whose exchange API can allocate; else dlbridge.Array.
        _ => match Exchange::claim(first) {
            Some(a) => finish(py, call, a, stream, release),
            None => finish(py, call, Arrays { py }, stream, release),
        },
    }
}

/// Allocates with `alloc`, runs (releasing the GIL when asked) and returns
/// the outputs as one object, a tuple, or None.
fn finish<'py, A: PyAllocator<'py>>(
    py: Python<'py>,
    call: &mut Call<'_, 'py>,
    mut alloc: A,
    stream: usize,
    release: bool,
) -> PyResult<Py<PyAny>> {
    let outs = call.run_with(
        &mut alloc,
        stream as *mut std::ffi::c_void,
        |job: Job<'_>| if release { py.detach(|| job.run()) } else { job.run() },
    )?;
    // Autograd learns about the writes, as from torch's own in-place ops (after
    // the call, and only when it succeeded: a refused call wrote nothing).
    bump_versions(py, call)?;
    let mut results: SmallVec<[Bound<'py, PyAny>; 2]> = SmallVec::new();
    for o in outs {
        results.push(alloc.to_py(py, o)?);
    }
    Ok(match results.len() {
        0 => py.None(),
        1 => results.pop().map(|r| r.unbind()).unwrap_or_else(|| py.None()),
        _ => PyTuple::new(py, results)?.into_any().unbind(),
    })
}

/// Tells torch's autograd that the torch tensors this call writes (mut
/// arguments, given outputs) are modified, in one call.
fn bump_versions<'py>(py: Python<'py>, call: &Call<'_, 'py>) -> PyResult<()> {
    let mut api = None;
    let mut written: SmallVec<[&Bound<'py, PyAny>; 4]> = SmallVec::new();
    for t in call.operands().filter(|t| t.written) {
        if let Some(a) = t.api.filter(|a| a.is_torch()) {
            api = Some(a);
            written.push(&t.obj);
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
    /// A number naming this very kernel (`dlbridge_registry::handles`), for
    /// programs of other frameworks that call it later (dlbridge.jax's
    /// custom calls): they run this kernel even after its name is given to
    /// another. A new number each call; it keeps nothing alive.
    fn _handle(&self) -> u64 {
        dlbridge_registry::handles::handle(&self.kernel)
    }
    /// A digest of what this kernel is (its signature, options, origins and
    /// the source or file that defines it): a program built for it checks,
    /// when it runs, that it runs this kernel (dlbridge.jax's custom calls).
    fn _digest(&self) -> String {
        self.kernel.digest()
    }
    /// Whether each output element depends only on the inputs' elements at
    /// its own position (an `ElementwiseKernel` that reads no index, size or
    /// raw input): a batch can be one call on the stacked inputs.
    #[getter]
    fn per_element(&self) -> bool {
        self.kernel.opts().per_element
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
    /// Where each device's implementation comes from: `(device, origin)`,
    /// the origin `built-in (file:line)`, a plugin's path, or what compiled it.
    #[getter]
    fn origins(&self) -> Vec<(String, String)> {
        self.kernel.origins().map(|(d, o)| (d.to_string(), o.to_owned())).collect()
    }
    /// Whether an output whose dims are exactly an input's (`...S`, `...B, N`)
    /// is allocated in the memory order of the inputs shaped like it (NumPy's
    /// `order='K'`, torch's TensorIterator); False for kernels whose outputs
    /// are always row-major.
    #[getter]
    fn outputs_follow_inputs(&self) -> bool {
        self.kernel.opts().outputs_follow_inputs()
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

    /// Two `Kernel`s are equal when they are the same registered kernel (one
    /// registry entry, with the same implementations): a kernel recompiled
    /// under the same name, or extended to another device, is another kernel.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<PyKernel>().is_ok_and(|o| Arc::ptr_eq(&self.kernel, &o.get().kernel))
    }

    fn __hash__(&self) -> u64 {
        Arc::as_ptr(&self.kernel) as usize as u64
    }

    /// `(shape, dtype, device)` of every output for these inputs (what `__call__` allocates).
    #[pyo3(signature = (*args))]
    fn prepare_outputs<'py>(&self, py: Python<'py>, args: &Bound<'py, PyTuple>) -> PyResult<Vec<(Vec<i64>, String, String)>> {
        let mut call = self.kernel.binding();
        self.bind(py, args.iter(), None, &mut call)?;
        self.survey(py, &mut call)?;
        if call.given_outputs().is_some() {
            return Err(PyTypeError::new_err(format!("{}.prepare_outputs() takes the inputs only, not the outputs", self.kernel.name())));
        }
        let specs = call.output_specs()?;
        Ok(specs.iter().map(|s| (s.shape.to_vec(), s.dtype.to_string(), s.device.to_string())).collect())
    }

    /// `(shape, dtype)` of every output for arguments known by shape and dtype
    /// only (a traced call): a tensor argument is a `(shape, dtype)` pair (the
    /// dtype by NumPy's or dlbridge's name), a scalar a Python float, int or
    /// bool. The dtypes come back by NumPy's names. The registry's checks run
    /// as for a call (a mismatch is the call's error).
    #[pyo3(signature = (*args))]
    fn abstract_outputs(&self, args: &Bound<'_, PyTuple>) -> PyResult<Vec<(Vec<i64>, String)>> {
        crate::meta::abstract_outputs(&self.kernel, args)
    }

    /// The call's checks and outputs for arguments known by layout only (a
    /// traced call; `dlbridge.torch`'s fake implementations): a tensor
    /// argument is `(shape, dtype)` or `(shape, strides, dtype, (device_type,
    /// device_id))`, a scalar a Python value. For each output: `(shape, dims,
    /// dtype, order)`, `dims` saying where each dim comes from (an int, `("dim",
    /// arg, axis)`, or `(op, a, b)` with `op` one of `+ - * // min max`),
    /// `order` the memory order (outermost dim first; empty for row-major).
    /// A mismatch is the call's own error.
    #[pyo3(signature = (*args))]
    fn abstract_call(&self, py: Python<'_>, args: &Bound<'_, PyTuple>) -> PyResult<Vec<Py<PyAny>>> {
        crate::meta::abstract_call(py, &self.kernel, args)
    }

    /// Runs the kernel; see the module docs.
    #[pyo3(signature = (*args, out=None))]
    fn __call__<'py>(&self, py: Python<'py>, args: &Bound<'py, PyTuple>, out: Option<&Bound<'py, PyAny>>) -> PyResult<Py<PyAny>> {
        self.call_objects(py, args.iter(), out)
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
                        Dim::Rest(i) => ParamDim::Named(sig.fmt_rest(i)),
                        Dim::Expr(i) => ParamDim::Named(sig.fmt_expr(i)),
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

/// A new writable array of `shape` and `dtype` on `like`'s device, made by
/// `like`'s framework as a call's output would be (`finish` not yet applied:
/// see [`hand_over`]). For Python code that fills an output itself (the
/// `mut` outputs of a `ReductionKernel`).
pub fn empty_like<'py>(like: &Bound<'py, PyAny>, shape: Vec<i64>, dtype: &str) -> PyResult<Bound<'py, PyAny>> {
    let py = like.py();
    let first = import(like, false, Mode::Own)?;
    let device = first.view().py_err()?.device();
    let dtype = DType::from_numpy_name(dtype)
        .or_else(|| dtype.parse().ok())
        .ok_or_else(|| PyTypeError::new_err(format!("unknown dtype {dtype:?}")))?;
    let spec = OutputSpec { name: "out".into(), shape: shape.into_iter().collect(), dtype, device, order: Default::default() };
    fn made<'py, A: PyAllocator<'py>>(py: Python<'py>, mut a: A, spec: &OutputSpec) -> PyResult<Bound<'py, PyAny>> {
        let t = a.allocate(spec)?;
        // `finish` is the caller's (hand_over): give back the writable object itself.
        a.raw(py, t)
    }
    match crate::frameworks::lookup(like) {
        Some(m) if matches!(*m, Maker::Numpy) => made(py, Numpy { py }, &spec),
        Some(m) if matches!(*m, Maker::Python(_)) => made(py, Registered { py, maker: m, raised: Default::default() }, &spec),
        _ => match Exchange::claim(&first) {
            Some(a) => made(py, a, &spec),
            None => made(py, Arrays { py }, &spec),
        },
    }
}

/// What a caller of `like`'s framework gets for `out`, an array made by
/// [`empty_like`] and written since: the registered `finish` of `like`'s
/// framework, or `out` itself.
pub fn hand_over<'py>(like: &Bound<'py, PyAny>, out: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    match crate::frameworks::lookup(like).as_deref() {
        Some(Maker::Python(m)) => m.finish(out),
        _ => Ok(out),
    }
}

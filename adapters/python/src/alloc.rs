//! The allocators of a call's outputs: each claims a call by its first tensor
//! argument and makes the outputs with that tensor's framework (torch through
//! its exchange API, NumPy with `numpy.empty`, a framework registered with
//! `dlbridge.register_allocator`, else `dlbridge.Array`).

use std::sync::Arc;

use dlbridge_core::{DType, Device, ManagedTensor, Slot};
use dlbridge_registry::OutputSpec;
use dlbridge_registry::binding::{Allocator, ArrayAllocator, Operand};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::array::PyArray;
use crate::cuda::DeviceArrays;
use crate::errors::{IntoPy, PyFail, locate, type_name};
use crate::frameworks::{Maker, PyMaker};
use crate::import::{Mode, Tensor, import, python_may_run};
use crate::raw::exchange::Api;

/// An output allocator for Python callers: it claims a call by its first
/// tensor argument and turns what it allocated into Python objects.
pub(crate) trait PyAllocator<'py>: Allocator<PyFail> + Sized {
    /// The Python object of an output, as the caller gets it.
    fn to_py(&self, py: Python<'py>, out: Self::Tensor) -> PyResult<Bound<'py, PyAny>>;
    /// The Python object of an output before any hand-over (a registered
    /// framework's `finish`): the object the kernel writes.
    fn raw(&self, py: Python<'py>, out: Self::Tensor) -> PyResult<Bound<'py, PyAny>> {
        self.to_py(py, out)
    }
}

/// An allocator's error, located at `kernel`'s output `output`.
pub(crate) fn at_output(py: Python<'_>, e: PyFail, kernel: &str, output: &str) -> PyFail {
    PyFail(locate(py, e.0, kernel, &Slot::Output(output.into())))
}

/// torch (and any producer whose exchange API can allocate): the producer's own allocator.
pub(crate) struct Exchange<'py> {
    pub(crate) py: Python<'py>,
    pub(crate) api: Api,
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
    pub(crate) fn claim(first: &Tensor<'py>) -> Option<Self> {
        first.api.filter(|a| a.can_allocate()).map(|api| Exchange { py: first.obj.py(), api })
    }
}

impl<'py> PyAllocator<'py> for Exchange<'py> {
    fn to_py(&self, py: Python<'py>, out: ManagedTensor) -> PyResult<Bound<'py, PyAny>> {
        self.api.to_py(py, out)
    }
}

/// NumPy: `numpy.empty`; a dtype NumPy lacks (bf16, float8, ...) becomes a `dlbridge.Array`.
pub(crate) struct Numpy<'py> {
    pub(crate) py: Python<'py>,
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
pub(crate) struct Arrays<'py> {
    pub(crate) py: Python<'py>,
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
pub(crate) struct Registered<'py> {
    pub(crate) py: Python<'py>,
    pub(crate) maker: Arc<Maker>,
    /// Whether the last error came from the registered function itself.
    pub(crate) raised: std::cell::Cell<bool>,
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

pub(crate) fn numpy_dtype(d: DType) -> Option<&'static str> {
    d.numpy_name().filter(|_| d.in_numpy())
}

/// A new writable array of `shape` and `dtype` on `like`'s device, made by
/// `like`'s framework as a call's output would be (`finish` not yet applied:
/// see [`hand_over`]). For Python code that fills an output itself (the
/// `mut` outputs of a `ReductionKernel`): `kernel` and `output` name it in
/// errors, as a call's own outputs are named, and memory that overlaps any
/// of `inputs` (name, array) is refused, as for a call's outputs.
pub fn empty_like<'py>(
    like: &Bound<'py, PyAny>,
    shape: Vec<i64>,
    dtype: &str,
    kernel: &str,
    output: &str,
    inputs: &[(String, Bound<'py, PyAny>)],
) -> PyResult<Bound<'py, PyAny>> {
    let py = like.py();
    let first = import(like, false, Mode::Own)?;
    let device = first.view().py_err()?.device();
    let dtype = DType::from_numpy_name(dtype)
        .or_else(|| dtype.parse().ok())
        .ok_or_else(|| PyTypeError::new_err(format!("unknown dtype {dtype:?}")))?;
    let spec = OutputSpec { name: output.into(), shape: shape.into_iter().collect(), dtype, device, order: Default::default() };
    /// One allocation through `a`, its errors located at `kernel`'s `output`.
    fn one<'py, A: PyAllocator<'py>>(
        py: Python<'py>,
        mut a: A,
        spec: &OutputSpec,
        kernel: &str,
        output: &str,
    ) -> Result<(Bound<'py, PyAny>, String), PyFail> {
        let t = match a.allocate(spec) {
            Ok(t) => t,
            Err(e) => return Err(a.locate(e, kernel, output)),
        };
        // `finish` is the caller's (hand_over): give back the writable object itself.
        Ok((a.raw(py, t)?, a.describe()))
    }
    let (out, describe) = match crate::frameworks::lookup(like) {
        Some(m) if matches!(*m, Maker::Numpy) => one(py, Numpy { py }, &spec, kernel, output)?,
        Some(m) if matches!(*m, Maker::Python(_)) => {
            one(py, Registered { py, maker: m, raised: Default::default() }, &spec, kernel, output)?
        }
        _ => match Exchange::claim(&first) {
            Some(a) => one(py, a, &spec, kernel, output)?,
            None => one(py, Arrays { py }, &spec, kernel, output)?,
        },
    };
    let fresh = import(&out, false, Mode::Own)?;
    let w = fresh.view().py_err()?;
    for (name, arg) in inputs {
        let t = import(arg, false, Mode::Own)?;
        if dlbridge_registry::views_overlap(&w, &t.view().py_err()?) {
            let e = dlbridge_core::Error::InvalidArgument(format!(
                "{describe} returned memory that overlaps {}; an allocator must return new memory",
                Slot::Argument(name.clone())
            ));
            return Err(at_output(py, e.into(), kernel, output).0);
        }
    }
    Ok(out)
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

//! A call of `dlbridge.Kernel` from Python: the arguments bound by the
//! registry's binding layer (`Objects` says how Python objects become tensors
//! and scalars), the views checked, the outputs allocated (see [`crate::alloc`])
//! and the kernel run, releasing the GIL for large calls.

use std::sync::Arc;

use dlbridge_core::{Device, Slot};
use dlbridge_registry::Kernel;
use dlbridge_registry::binding::{Adapter, Args, Binding, Job, Operand, Scalar};
use dlbridge_registry::signature::ScalarKind;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};
use smallvec::SmallVec;

use crate::alloc::{Arrays, Exchange, Numpy, PyAllocator, Registered};
use crate::array::PyArray;
use crate::errors::{IntoPy, PyFail, locate, type_name};
use crate::frameworks::Maker;
use crate::import::{Mode, Tensor, import, python_may_run};
use crate::kernel::{PyKernel, RELEASE_GIL_MIN};
use crate::raw::exchange::Api;

/// Python objects as kernel arguments: the registry binding layer's adapter.
pub(crate) struct Objects<'py> {
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

/// A Python call's values bound to a kernel's parameters.
pub(crate) type PyBinding<'k, 'py> = Binding<'k, Tensor<'py>, PyFail>;

/// What a bound call's tensors say about it (see `PyKernel::survey`).
pub(crate) struct Survey {
    /// Elements moved, all tensors together.
    total: usize,
    /// The first tensor whose producer has a stream API, and its device.
    streams: Option<(Api, Device)>,
    /// The first tensor's device.
    first: Option<Device>,
}

impl PyKernel {
    /// Binds `args` (and `out=`) to the kernel's parameters, into `call` (an
    /// empty binding of this kernel: it is filled where it lives, never moved).
    #[inline(always)]
    pub(crate) fn bind<'py, I>(
        &self,
        py: Python<'py>,
        args: I,
        out: Option<&Bound<'py, PyAny>>,
        call: &mut PyBinding<'_, 'py>,
    ) -> PyResult<()>
    where
        I: ExactSizeIterator<Item = Bound<'py, PyAny>>,
    {
        let k: &Kernel = &self.kernel;
        let mut objects = Objects { py };
        match out.filter(|o| !o.is_none()) {
            None => Ok(k.bind_into(&mut objects, Args::positional(args), call)?),
            Some(o) => {
                let list: SmallVec<[Bound<'py, PyAny>; 2]> = if let Ok(t) = o.cast::<PyTuple>() {
                    t.iter().collect()
                } else if let Ok(l) = o.cast::<pyo3::types::PyList>() {
                    l.iter().collect()
                } else {
                    smallvec::smallvec![o.clone()]
                };
                Ok(k.bind_into(&mut objects, Args::with_out(args, list), call)?)
            }
        }
    }

    /// After binding: the checks that needed a lent tensor's dtype, then the
    /// call's size, the device of the first tensor whose producer has a
    /// stream API, and the first tensor's device. The views taken here are the snapshots the call goes on
    /// using (see `import::Lent`); errors name their argument.
    pub(crate) fn survey<'py>(&self, py: Python<'py>, call: &mut PyBinding<'_, 'py>) -> PyResult<Survey> {
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
pub(crate) fn dispatch<'py>(
    py: Python<'py>,
    call: &mut PyBinding<'_, 'py>,
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
pub(crate) fn finish<'py, A: PyAllocator<'py>>(
    py: Python<'py>,
    call: &mut PyBinding<'_, 'py>,
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
pub(crate) fn bump_versions<'py>(py: Python<'py>, call: &PyBinding<'_, 'py>) -> PyResult<()> {
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

pub(crate) static COMPLEXFLOATING: PyOnceLock<Option<Py<PyType>>> = PyOnceLock::new();

/// A real scalar. Complex numbers are refused (NumPy's complex scalars would
/// otherwise convert through `__float__`, silently dropping the imaginary part);
/// errors other than "wrong type" (OverflowError, an exception raised by
/// `__float__`) propagate as they are.
pub(crate) fn scalar_f64(obj: &Bound<'_, PyAny>) -> PyResult<f64> {
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

pub(crate) fn scalar<'py, T: pyo3::conversion::FromPyObjectOwned<'py>>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<T> {
    obj.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        if e.is_instance_of::<PyTypeError>(obj.py()) { PyTypeError::new_err(format!("expected {what}, got {}", type_name(obj))) } else { e }
    })
}

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

use dlbridge_registry::Kernel;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::param::PyParam;

/// Calls moving at least this many elements release the GIL while the kernel runs.
pub const RELEASE_GIL_MIN: usize = 1 << 15;

/// A registry kernel, callable from Python.
#[pyclass(name = "Kernel", module = "dlbridge", frozen, weakref)]
#[derive(Debug)]
pub struct PyKernel {
    /// The type's vectorcall entry, at the same offset in every instance
    /// (see [`crate::vectorcall`]; read by CPython once the entry is installed).
    pub(crate) vectorcall: pyo3::ffi::vectorcallfunc,
    pub(crate) kernel: Arc<Kernel>,
}

impl PyKernel {
    /// Wraps a kernel.
    pub fn new(kernel: Arc<Kernel>) -> PyKernel {
        PyKernel { vectorcall: crate::vectorcall::kernel_vectorcall, kernel }
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

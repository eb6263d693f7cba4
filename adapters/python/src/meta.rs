//! `Kernel.abstract_call` and `Kernel.abstract_outputs`: a call known by
//! layout only, for tracers (torch's fake tensors, JAX's abstract evaluation).
//! The checks and the output rule are the registry's
//! ([`Kernel::check_meta`]); this module only translates Python values.

use dlbridge_core::{DType, Device, DeviceType};
use dlbridge_registry::signature::{ParamKind, ScalarKind};
use dlbridge_registry::{DimOrigin, Kernel, MetaArg, MetaOutput, Scalar, TensorMeta};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use crate::errors::IntoPy;

/// One argument as Python gave it: a tensor's layout, or a scalar.
enum Given {
    Tensor { shape: Vec<i64>, strides: Vec<i64>, dtype: DType, device: Device },
    Scalar(Scalar),
}

/// Reads the arguments: a tensor as `(shape, dtype)` (row-major, on the CPU)
/// or `(shape, strides, dtype, (device_type, device_id))`, the dtype by
/// NumPy's or dlbridge's name; a scalar as a Python float, int or bool.
fn read(kernel: &Kernel, method: &str, args: &Bound<'_, PyTuple>) -> PyResult<Vec<Given>> {
    let sig = kernel.signature();
    if args.len() != sig.params.len() {
        return Err(PyTypeError::new_err(format!(
            "{}.{method}() takes {} arguments ({}), got {}",
            sig.name,
            sig.params.len(),
            sig.params.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
            args.len()
        )));
    }
    let mut given = Vec::with_capacity(args.len());
    for (p, a) in sig.params.iter().zip(args.iter()) {
        let fail = |what: String| PyTypeError::new_err(format!("{}: argument {}: {what}", sig.name, p.name));
        given.push(match &p.kind {
            ParamKind::Tensor(_) => {
                let layout = || fail(format!("expected a (shape, dtype) or (shape, strides, dtype, device) tuple, got {}", short(&a)));
                let t = a.cast::<PyTuple>().map_err(|_| layout())?;
                let (shape, strides, dtype, device): (Vec<i64>, Option<Vec<i64>>, Bound<'_, PyAny>, Device) = match t.len() {
                    2 => (t.get_item(0)?.extract().map_err(|_| layout())?, None, t.get_item(1)?, Device::CPU),
                    4 => {
                        let (kind, id): (u32, i32) = t.get_item(3)?.extract().map_err(|_| layout())?;
                        (
                            t.get_item(0)?.extract().map_err(|_| layout())?,
                            Some(t.get_item(1)?.extract().map_err(|_| layout())?),
                            t.get_item(2)?,
                            Device { kind: DeviceType(kind), id },
                        )
                    }
                    _ => return Err(layout()),
                };
                let name: String = dtype.extract().map_err(|_| layout())?;
                let dtype =
                    DType::from_numpy_name(&name).or_else(|| name.parse().ok()).ok_or_else(|| fail(format!("unknown dtype {name:?}")))?;
                let strides = match strides {
                    Some(s) => s,
                    None => dlbridge_core::layout::contiguous_strides(&shape).py_err()?.to_vec(),
                };
                Given::Tensor { shape, strides, dtype, device }
            }
            ParamKind::Scalar(kind) => Given::Scalar(match kind {
                ScalarKind::F64 => Scalar::F64(a.extract().map_err(|_| fail(format!("expected an f64 scalar, got {}", short(&a))))?),
                ScalarKind::I64 => Scalar::I64(a.extract().map_err(|_| fail(format!("expected an i64 scalar, got {}", short(&a))))?),
                ScalarKind::Bool => Scalar::Bool(a.extract().map_err(|_| fail(format!("expected a bool scalar, got {}", short(&a))))?),
            }),
        });
    }
    Ok(given)
}

/// A value's type and a clipped repr, for errors.
fn short(a: &Bound<'_, PyAny>) -> String {
    let repr = a.repr().map_or_else(|_| "?".to_owned(), |r| r.to_string());
    let repr: String = repr.chars().take(60).collect();
    format!("{} {repr}", a.get_type().name().map_or_else(|_| "?".to_owned(), |n| n.to_string()))
}

/// The registry's answer for `args` read by [`read`].
fn check(kernel: &Kernel, given: &[Given]) -> PyResult<smallvec::SmallVec<[MetaOutput; 2]>> {
    let args: Vec<MetaArg<'_>> = given
        .iter()
        .map(|g| match g {
            Given::Tensor { shape, strides, dtype, device } => {
                MetaArg::Tensor(TensorMeta { shape, strides, dtype: *dtype, device: *device })
            }
            Given::Scalar(s) => MetaArg::Scalar(*s),
        })
        .collect();
    kernel.check_meta(&args).py_err()
}

/// A dim's origin as Python sees it: an int, `("dim", arg, axis)` or `(op, a, b)`.
fn origin(py: Python<'_>, o: &DimOrigin) -> PyResult<Py<PyAny>> {
    Ok(match o {
        DimOrigin::Fixed(n) => n.into_pyobject(py)?.into_any().unbind(),
        DimOrigin::Input { arg, axis } => ("dim", *arg, *axis).into_pyobject(py)?.into_any().unbind(),
        DimOrigin::Op(op, a, b) => (PyString::new(py, op.text()), origin(py, a)?, origin(py, b)?).into_pyobject(py)?.into_any().unbind(),
    })
}

/// `Kernel.abstract_call(*args)`: for each output, `(shape, dims, dtype, order)`.
pub(crate) fn abstract_call(py: Python<'_>, kernel: &Kernel, args: &Bound<'_, PyTuple>) -> PyResult<Vec<Py<PyAny>>> {
    let given = read(kernel, "abstract_call", args)?;
    let outs = check(kernel, &given)?;
    let mut list = Vec::with_capacity(outs.len());
    for o in &outs {
        let dims = o.dims.iter().map(|d| origin(py, d)).collect::<PyResult<Vec<_>>>()?;
        let order: Vec<usize> = o.spec.order.to_vec();
        list.push((o.spec.shape.to_vec(), dims, o.spec.dtype.to_string(), order).into_pyobject(py)?.into_any().unbind());
    }
    Ok(list)
}

/// `Kernel.abstract_outputs(*args)`: for each output, `(shape, dtype)` with
/// the dtype by NumPy's name.
pub(crate) fn abstract_outputs(kernel: &Kernel, args: &Bound<'_, PyTuple>) -> PyResult<Vec<(Vec<i64>, String)>> {
    let given = read(kernel, "abstract_outputs", args)?;
    let outs = check(kernel, &given)?;
    Ok(outs
        .iter()
        .map(|o| (o.spec.shape.to_vec(), o.spec.dtype.numpy_name().map_or_else(|| o.spec.dtype.to_string(), str::to_owned)))
        .collect())
}

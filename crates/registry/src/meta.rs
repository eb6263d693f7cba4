//! Calls known by layout only: what a tracer (torch's fake tensors, JAX's
//! abstract evaluation) needs from a kernel without running it.
//!
//! [`Kernel::check_meta`](crate::Kernel::check_meta) takes each tensor
//! argument as a [`TensorMeta`] (shape, strides, dtype, device) and runs the
//! call's own checks and output rule on it: the signature ([`crate::solution`]),
//! the writable-layout and contiguity checks, the kernel's shape rule. It gives
//! each output's [`OutputSpec`] and, for every output dim, its [`DimOrigin`]:
//! which argument dim (or arithmetic on them) it is, so that a tracer with
//! symbolic sizes builds the output's shape from its own symbols. The rules
//! exist once, here and in `call`; adapters only translate.

use dlbridge_core::{DType, Device, Error, Result, TensorView};
use smallvec::SmallVec;

use crate::arg::Arg;
use crate::signature::{DimOrigin, Scalar};
use crate::solution::OutputSpec;

/// A tensor argument known by its layout only.
#[derive(Debug, Clone, Copy)]
pub struct TensorMeta<'a> {
    /// Its shape.
    pub shape: &'a [i64],
    /// Its strides, in elements (as many as `shape` has dims).
    pub strides: &'a [i64],
    /// Its dtype.
    pub dtype: DType,
    /// Its device.
    pub device: Device,
}

/// One argument of a call known by layout only.
#[derive(Debug, Clone, Copy)]
pub enum MetaArg<'a> {
    /// A tensor.
    Tensor(TensorMeta<'a>),
    /// A scalar.
    Scalar(Scalar),
}

/// One output of a call known by layout only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaOutput {
    /// Its shape, dtype, device and memory order, as the call allocates it.
    pub spec: OutputSpec,
    /// Where each dim of `spec.shape` comes from.
    pub dims: SmallVec<[DimOrigin; 6]>,
}

/// Read-only stand-ins for the tensor arguments of `args` (views of one
/// static zero, broadcast to their shape: the checks read shapes and dtypes
/// only), with their devices and strides beside them.
pub(crate) struct StandIns<'a> {
    pub(crate) args: SmallVec<[Arg<'a>; 8]>,
    pub(crate) devices: SmallVec<[Device; 8]>,
    pub(crate) strides: SmallVec<[&'a [i64]; 8]>,
}

impl<'a> StandIns<'a> {
    pub(crate) fn new(name: &str, params: &[crate::signature::Param], args: &[MetaArg<'a>]) -> Result<StandIns<'a>> {
        let mut s = StandIns { args: SmallVec::new(), devices: SmallVec::new(), strides: SmallVec::new() };
        for (i, a) in args.iter().enumerate() {
            let slot = || dlbridge_core::Slot::Argument(params.get(i).map_or_else(|| format!("#{i}"), |p| p.name.clone()));
            match *a {
                MetaArg::Tensor(t) => {
                    if t.strides.len() != t.shape.len() {
                        return Err(Error::InvalidArgument(format!("{} strides for {} dims", t.strides.len(), t.shape.len()))
                            .at(name.to_owned(), slot()));
                    }
                    s.args.push(Arg::Tensor(TensorView::zeros_broadcast(t.dtype, t.shape).map_err(|e| e.at(name.to_owned(), slot()))?));
                    s.devices.push(t.device);
                    s.strides.push(t.strides);
                }
                MetaArg::Scalar(v) => {
                    s.args.push(Arg::Scalar(v));
                    s.devices.push(Device::CPU);
                    s.strides.push(&[]);
                }
            }
        }
        Ok(s)
    }
}

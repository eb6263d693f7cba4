//! [`Arg`]: one checked argument of a kernel call, as the kernel's implementation receives it.

use dlbridge_core::{DType, Device, TensorView, TensorViewMut};

use crate::signature::Scalar;

/// One argument of a kernel call, in signature order.
#[derive(Debug)]
pub enum Arg<'a> {
    /// A tensor the kernel only reads.
    Tensor(TensorView<'a>),
    /// A tensor the kernel may write (required for `mut` parameters).
    TensorMut(TensorViewMut<'a>),
    /// A scalar.
    Scalar(Scalar),
}

impl Arg<'_> {
    /// An `f64` scalar argument.
    #[inline]
    pub const fn f64(x: f64) -> Self {
        Arg::Scalar(Scalar::F64(x))
    }
    /// An `i64` scalar argument.
    #[inline]
    pub const fn i64(x: i64) -> Self {
        Arg::Scalar(Scalar::I64(x))
    }
    /// A `bool` scalar argument.
    #[inline]
    pub const fn bool(x: bool) -> Self {
        Arg::Scalar(Scalar::Bool(x))
    }

    /// What kind of argument this is, for error messages.
    pub fn describe(&self) -> String {
        match self {
            Arg::Tensor(v) => format!("a {} tensor of shape {:?}", v.dtype(), v.shape()),
            Arg::TensorMut(v) => format!("a writable {} tensor of shape {:?}", v.dtype(), v.shape()),
            Arg::Scalar(s) => s.to_string(),
        }
    }

    /// Shape, dtype and device of a tensor argument.
    pub fn tensor_meta(&self) -> Option<(&[i64], DType, Device)> {
        match self {
            Arg::Tensor(v) => Some((v.shape(), v.dtype(), v.device())),
            Arg::TensorMut(v) => Some((v.shape(), v.dtype(), v.device())),
            _ => None,
        }
    }
}

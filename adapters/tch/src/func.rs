//! Registry kernels as functions of tch tensors: [`kernel`] looks one up once,
//! and [`TchKernel::call1`] calls it with its arguments in signature order,
//! tensors and scalars in one list, returning a `tch::Tensor`:
//!
//! ```text
//! let gelu = dlbridge_tch::kernel("gelu")?;
//! let y = gelu.call1(&x)?;                               // x.gelu("none")
//! let h = dlbridge_tch::kernel("matmul")?.call1((&x, &w))?;
//! dlbridge_tch::kernel("axpy")?.call0((2.0, &x, &y))?;   // y += 2x, in place
//! ```
//!
//! Errors are [`KernelError`]s, which `?` turns into a `tch::TchError` or a
//! `dlbridge::Error`, whichever the caller returns.

use std::sync::Arc;

use dlbridge_core::Error;
use dlbridge_registry::signature::{ParamKind, ScalarKind};
use dlbridge_registry::{Kernel, Registry, Scalar};
use smallvec::SmallVec;
use tch::Tensor;

/// A call's arguments, inline up to 6 (no allocation for a call's list).
pub type ArgList<'t> = SmallVec<[Arg<'t>; 6]>;

/// One argument of a [`TchKernel`] call: a tensor or a scalar.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'t> {
    /// A tensor parameter's tensor (a `mut` one is written in place).
    Tensor(&'t Tensor),
    /// A scalar parameter's value.
    Scalar(Scalar),
}

impl<'t> From<&'t Tensor> for Arg<'t> {
    fn from(t: &'t Tensor) -> Arg<'t> {
        Arg::Tensor(t)
    }
}

impl From<f64> for Arg<'_> {
    fn from(v: f64) -> Self {
        Arg::Scalar(Scalar::F64(v))
    }
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Scalar(Scalar::I64(v))
    }
}

impl From<bool> for Arg<'_> {
    fn from(v: bool) -> Self {
        Arg::Scalar(Scalar::Bool(v))
    }
}

impl From<Scalar> for Arg<'_> {
    fn from(v: Scalar) -> Self {
        Arg::Scalar(v)
    }
}

/// A call's arguments in signature order: one tensor (`&x`), a tuple of up to
/// six tensors and scalars (`(&a, &b)`, `(2.0, &x, &y)`), or a slice of [`Arg`]s.
pub trait Args<'t> {
    /// The arguments, in order.
    fn args(self) -> ArgList<'t>;
}

impl<'t> Args<'t> for &'t Tensor {
    fn args(self) -> ArgList<'t> {
        smallvec::smallvec![Arg::Tensor(self)]
    }
}

impl<'t> Args<'t> for &[Arg<'t>] {
    fn args(self) -> ArgList<'t> {
        self.iter().copied().collect()
    }
}

impl<'t, const N: usize> Args<'t> for [Arg<'t>; N] {
    fn args(self) -> ArgList<'t> {
        self.into_iter().collect()
    }
}

macro_rules! tuple_args {
    ($($name:ident),+) => {
        impl<'t, $($name: Into<Arg<'t>>),+> Args<'t> for ($($name,)+) {
            #[allow(non_snake_case)]
            fn args(self) -> ArgList<'t> {
                let ($($name,)+) = self;
                smallvec::smallvec![$($name.into()),+]
            }
        }
    };
}
tuple_args!(A);
tuple_args!(A, B);
tuple_args!(A, B, C);
tuple_args!(A, B, C, D);
tuple_args!(A, B, C, D, E);
tuple_args!(A, B, C, D, E, F);

/// An error of a [`TchKernel`] call: a `dlbridge::Error`, convertible by `?`
/// into a `tch::TchError` (its message, as `TchError::Torch`) or back into a
/// `dlbridge::Error` (unchanged).
#[derive(Debug)]
pub struct KernelError(pub Error);

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for KernelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl From<Error> for KernelError {
    fn from(e: Error) -> Self {
        KernelError(e)
    }
}

impl From<KernelError> for Error {
    fn from(e: KernelError) -> Self {
        e.0
    }
}

impl From<KernelError> for tch::TchError {
    fn from(e: KernelError) -> Self {
        tch::TchError::Torch(e.0.to_string())
    }
}

/// A [`TchKernel`] call's result.
pub type KernelResult<T> = std::result::Result<T, KernelError>;

/// A registry kernel, called on tch tensors (see the module docs).
#[derive(Debug, Clone)]
pub struct TchKernel {
    kernel: Arc<Kernel>,
}

/// The kernel `name` of dlbridge's global registry (the built-ins, and every
/// kernel this program registered), as a function of tch tensors. An unknown
/// name is the registry's error, which says why (a refused registration's
/// reason, or the names nearest to it).
pub fn kernel(name: &str) -> KernelResult<TchKernel> {
    Ok(TchKernel { kernel: Registry::global().get(name)? })
}

impl From<Arc<Kernel>> for TchKernel {
    fn from(kernel: Arc<Kernel>) -> Self {
        TchKernel { kernel }
    }
}

impl TchKernel {
    /// The kernel itself (its signature, devices, docs).
    pub fn kernel(&self) -> &Arc<Kernel> {
        &self.kernel
    }

    /// Splits `args` into the tensors and the scalars [`crate::call`] takes,
    /// checking them against the signature (an error names the parameter).
    #[allow(clippy::type_complexity)]
    fn split<'t>(&self, args: ArgList<'t>) -> KernelResult<(SmallVec<[&'t Tensor; 6]>, SmallVec<[Scalar; 4]>)> {
        let sig = self.kernel.signature();
        if args.len() != sig.params.len() {
            let names: Vec<&str> = sig.params.iter().map(|p| p.name.as_str()).collect();
            return Err(Error::InvalidArgument(format!(
                "{} takes {} arguments ({}), got {}",
                sig.name,
                names.len(),
                names.join(", "),
                args.len()
            ))
            .into());
        }
        let (mut tensors, mut scalars) = (SmallVec::new(), SmallVec::new());
        for (p, a) in sig.params.iter().zip(args) {
            let wrong = |what: &str| Error::InvalidArgument(format!("{}: argument {}: expected {what}", sig.name, p.name));
            match (&p.kind, a) {
                (ParamKind::Tensor(_), Arg::Tensor(t)) => tensors.push(t),
                (ParamKind::Tensor(_), Arg::Scalar(s)) => return Err(wrong(&format!("a tensor, got the scalar {s:?}")).into()),
                // An integer literal for an f64 parameter is its value (as in Python).
                (ParamKind::Scalar(ScalarKind::F64), Arg::Scalar(Scalar::I64(i))) => scalars.push(Scalar::F64(i as f64)),
                (ParamKind::Scalar(_), Arg::Scalar(s)) => scalars.push(s),
                (ParamKind::Scalar(k), Arg::Tensor(t)) => {
                    return Err(wrong(&format!("a {k} scalar, got a tensor of shape {:?}", t.size())).into());
                }
            }
        }
        Ok((tensors, scalars))
    }

    /// Calls the kernel: its outputs, allocated by tch on the inputs' device
    /// (`mut` tensors are written in place).
    pub fn call<'t>(&self, args: impl Args<'t>) -> KernelResult<Vec<Tensor>> {
        let (tensors, scalars) = self.split(args.args())?;
        Ok(crate::call(&self.kernel, &tensors, &scalars)?)
    }

    /// Calls a kernel with one output and returns it.
    pub fn call1<'t>(&self, args: impl Args<'t>) -> KernelResult<Tensor> {
        self.expect_outputs(1, "call1", "with one output")?;
        let mut outs = self.call(args)?;
        outs.pop().ok_or_else(|| Error::Runtime(format!("{}: no output came back", self.kernel.name())).into())
    }

    /// Calls a kernel without outputs (one that writes its `mut` tensors).
    pub fn call0<'t>(&self, args: impl Args<'t>) -> KernelResult<()> {
        self.expect_outputs(0, "call0", "without outputs")?;
        self.call(args).map(drop)
    }

    /// Refuses `method` (for kernels `with`: "with one output") unless the
    /// kernel has `want` outputs.
    fn expect_outputs(&self, want: usize, method: &str, with: &str) -> KernelResult<()> {
        let n = self.kernel.signature().outputs.len();
        if n == want {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!("{}: {method} is for kernels {with}; this one has {n} (use call)", self.kernel.name())).into())
    }

    /// Calls the kernel writing its outputs into `outputs` (destination-passing style).
    pub fn call_into<'t>(&self, args: impl Args<'t>, outputs: &[&Tensor]) -> KernelResult<()> {
        let (tensors, scalars) = self.split(args.args())?;
        Ok(crate::call_into(&self.kernel, &tensors, &scalars, outputs)?)
    }
}

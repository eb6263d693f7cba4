//! Calling registry kernels on [`Array`]s, through the registry's binding
//! layer: outputs are allocated as Arrays ([`ArrayAllocator`]) from the shapes
//! the signature gives, or written into the Arrays you pass.

use dlbridge_registry::binding::{Adapter, Args, ArrayAllocator, Operand};
use dlbridge_registry::signature::{Scalar, ScalarKind};

use crate::{Array, Error, Kernel, Result, TensorView, TensorViewMut};

/// One argument of [`call`]: an array to read, an array to write in place
/// (`mut` parameters), or a scalar.
#[derive(Debug)]
pub enum ArrayArg<'r> {
    /// Read-only tensor.
    In(&'r Array),
    /// Tensor written in place (must be unshared and writable).
    Mut(&'r mut Array),
    /// A scalar (`ArrayArg::f64(0.5)`, or `Scalar::F64(0.5).into()`).
    Scalar(Scalar),
}

impl From<Scalar> for ArrayArg<'_> {
    fn from(s: Scalar) -> Self {
        ArrayArg::Scalar(s)
    }
}

/// An Array argument, borrowed for the call.
#[derive(Debug)]
pub enum ArrayRef<'r> {
    /// Read only.
    Shared(&'r Array),
    /// Written (a `mut` parameter or an output).
    Unique(&'r mut Array),
}

impl ArrayRef<'_> {
    #[inline(always)]
    fn array(&self) -> &Array {
        match self {
            ArrayRef::Shared(a) => a,
            ArrayRef::Unique(a) => a,
        }
    }
}

impl Operand for ArrayRef<'_> {
    #[inline]
    fn view(&self) -> Result<TensorView<'_>> {
        // One call, its result written straight into ours.
        Ok(Array::view(self.array()))
    }
    #[inline]
    fn view_mut(&mut self) -> Result<TensorViewMut<'_>> {
        match self {
            ArrayRef::Unique(a) => Array::view_mut(a),
            ArrayRef::Shared(_) => {
                Err(Error::ReadOnly { what: "parameter is `mut`: pass ArrayArg::Mut, not ArrayArg::In; the Array".into() })
            }
        }
    }
}

impl<'r> ArrayArg<'r> {
    /// An `f64` scalar argument.
    pub const fn f64(x: f64) -> Self {
        ArrayArg::Scalar(Scalar::F64(x))
    }
    /// An `i64` scalar argument.
    pub const fn i64(x: i64) -> Self {
        ArrayArg::Scalar(Scalar::I64(x))
    }
    /// A `bool` scalar argument.
    pub const fn bool(x: bool) -> Self {
        ArrayArg::Scalar(Scalar::Bool(x))
    }

    /// The same argument, borrowed for a shorter time.
    pub fn reborrow(&mut self) -> ArrayArg<'_> {
        match self {
            ArrayArg::In(a) => ArrayArg::In(a),
            ArrayArg::Mut(a) => ArrayArg::Mut(a),
            ArrayArg::Scalar(s) => ArrayArg::Scalar(*s),
        }
    }
}

/// The [`Adapter`] for [`ArrayArg`]s.
#[derive(Debug, Clone, Copy, Default)]
pub struct Arrays;

impl Adapter for Arrays {
    type Value<'r> = ArrayArg<'r>;
    type Tensor<'r> = ArrayRef<'r>;
    type Error = Error;

    #[inline(always)]
    fn tensor<'r>(&mut self, value: Self::Value<'r>, writable: bool) -> Result<Self::Tensor<'r>> {
        match value {
            ArrayArg::In(a) if writable => Err(Error::ReadOnly {
                what: format!("the kernel writes this {} Array: pass ArrayArg::Mut, not ArrayArg::In; the Array", a.dtype()),
            }),
            ArrayArg::In(a) => Ok(ArrayRef::Shared(a)),
            ArrayArg::Mut(a) => Ok(ArrayRef::Unique(a)),
            other => Err(Error::InvalidArgument(format!("expected a tensor but got {}", describe(&other)))),
        }
    }

    fn scalar(&mut self, value: ArrayArg<'_>, kind: ScalarKind) -> Result<Scalar> {
        match value {
            ArrayArg::Scalar(s) => Ok(s),
            other => Err(Error::InvalidArgument(format!("expected a {kind} scalar but got {}", describe(&other)))),
        }
    }

    fn locate(&mut self, error: Error, kernel: &str, slot: dlbridge_core::Slot) -> Error {
        error.at(kernel, slot)
    }
}

fn describe(a: &ArrayArg<'_>) -> String {
    match a {
        ArrayArg::In(x) => format!("a {} Array of shape {:?}", x.dtype(), x.shape()),
        ArrayArg::Mut(x) => format!("a writable {} Array of shape {:?}", x.dtype(), x.shape()),
        ArrayArg::Scalar(s) => s.to_string(),
    }
}

/// Checks the arguments, allocates the outputs as zeroed Arrays of the shapes
/// and dtypes the signature gives, runs the kernel and returns the outputs.
/// `args` are the parameters in signature order.
pub fn call(kernel: &Kernel, args: &mut [ArrayArg<'_>]) -> Result<Vec<Array>> {
    let mut binding = kernel.bind(&mut Arrays, Args::positional(args.iter_mut().map(ArrayArg::reborrow)))?;
    Ok(binding.run(&mut ArrayAllocator, std::ptr::null_mut())?.into_vec())
}

/// Runs the kernel writing into the given output Arrays (destination-passing style).
pub fn call_into(kernel: &Kernel, args: &mut [ArrayArg<'_>], outs: &mut [&mut Array]) -> Result<()> {
    let outs = outs.iter_mut().map(|o| ArrayArg::Mut(o));
    let mut binding = kernel.bind(&mut Arrays, Args::with_out(args.iter_mut().map(ArrayArg::reborrow), outs))?;
    binding.run(&mut ArrayAllocator, std::ptr::null_mut()).map(drop)
}

/// Runs `kernel` once on the CPU, on small arrays its signature describes
/// (every symbol and `...` group 2 long, fixed dims as written, each type
/// variable its first dtype, zeros in every tensor; scalars `1.0`, `1`,
/// `true`), with its outputs allocated: the kernel's own errors come back.
/// A test that a kernel's body reads the parameters it declares by the names
/// it declares (`ins.f64("alhpa")` for `alpha` is an error naming `alhpa`).
/// Kernels that need more than the signature says (a reduction's kept dims)
/// may refuse these shapes with their own error.
pub fn try_kernel(kernel: &Kernel) -> Result<Vec<Array>> {
    use dlbridge_registry::signature::{DTypeRef, Dim, ParamKind};
    let sig = kernel.signature();
    let shape_of = |dims: &[Dim]| -> Vec<i64> {
        dims.iter()
            .map(|d| match *d {
                Dim::Fixed(n) => n,
                Dim::Sym(_) | Dim::Rest(_) | Dim::Expr(_) => 2,
            })
            .collect()
    };
    let mut arrays = Vec::new();
    for p in &sig.params {
        if let ParamKind::Tensor(t) = &p.kind {
            let dtype = match t.dtype {
                DTypeRef::Concrete(d) => d,
                DTypeRef::Var(i) => sig.type_vars[i].allowed[0],
            };
            arrays
                .push(Array::zeros(dtype, &shape_of(&t.dims)).map_err(|e| e.at(sig.name.clone(), crate::Slot::Argument(p.name.clone())))?);
        }
    }
    let mut tensors = arrays.iter_mut();
    let mut args: Vec<ArrayArg<'_>> = Vec::with_capacity(sig.params.len());
    for p in &sig.params {
        args.push(match &p.kind {
            ParamKind::Scalar(ScalarKind::F64) => ArrayArg::Scalar(Scalar::F64(1.0)),
            ParamKind::Scalar(ScalarKind::I64) => ArrayArg::Scalar(Scalar::I64(1)),
            ParamKind::Scalar(ScalarKind::Bool) => ArrayArg::Scalar(Scalar::Bool(true)),
            ParamKind::Tensor(t) => {
                let a = tensors.next().ok_or_else(|| Error::Runtime(format!("{}: try_kernel lost a tensor", sig.name)))?;
                if t.mutable { ArrayArg::Mut(a) } else { ArrayArg::In(a) }
            }
        });
    }
    call(kernel, &mut args)
}

//! Calling registry kernels on [`Array`]s: outputs are allocated as Arrays
//! from `prepare_outputs`, or written into the Arrays you pass.

use crate::{Arg, Array, Kernel, Result};

/// One argument of [`call`]: an array to read, an array to write in place
/// (`mut` parameters), or a scalar.
#[derive(Debug)]
pub enum ArrayArg<'r> {
    /// Read-only tensor.
    In(&'r Array),
    /// Tensor written in place (must be unshared and writable).
    Mut(&'r mut Array),
    /// f64 scalar.
    F64(f64),
    /// i64 scalar.
    I64(i64),
    /// bool scalar.
    Bool(bool),
}

fn to_args<'r>(args: &'r mut [ArrayArg<'_>]) -> Result<Vec<Arg<'r>>> {
    let mut out = Vec::with_capacity(args.len());
    for a in args.iter_mut() {
        out.push(match a {
            ArrayArg::In(x) => Arg::Tensor(x.view()),
            ArrayArg::Mut(x) => Arg::TensorMut(x.view_mut()?),
            ArrayArg::F64(v) => Arg::F64(*v),
            ArrayArg::I64(v) => Arg::I64(*v),
            ArrayArg::Bool(v) => Arg::Bool(*v),
        });
    }
    Ok(out)
}

/// Checks the arguments, allocates the outputs as zeroed Arrays of the shapes
/// and dtypes the signature gives, runs the kernel and returns the outputs.
pub fn call(kernel: &Kernel, args: &mut [ArrayArg<'_>]) -> Result<Vec<Array>> {
    let mut views = to_args(args)?;
    let specs = kernel.prepare_outputs(&views)?;
    let mut outs: Vec<Array> = specs.iter().map(|s| Array::zeros(s.dtype, &s.shape)).collect::<Result<_>>()?;
    {
        let mut out_views = outs.iter_mut().map(|o| o.view_mut()).collect::<Result<Vec<_>>>()?;
        kernel.call(&mut views, &mut out_views)?;
    }
    Ok(outs)
}

/// Runs the kernel writing into the given output Arrays (destination-passing style).
pub fn call_into(kernel: &Kernel, args: &mut [ArrayArg<'_>], outs: &mut [&mut Array]) -> Result<()> {
    let mut views = to_args(args)?;
    let mut out_views = outs.iter_mut().map(|o| o.view_mut()).collect::<Result<Vec<_>>>()?;
    kernel.call(&mut views, &mut out_views)
}

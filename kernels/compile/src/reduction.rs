//! [`ReductionKernel`]: CuPy's `ReductionKernel` on dlbridge's registry.
//!
//! The registered signature takes the outputs as `mut` tensors
//! (`l2norm<T: ...>(x: T[...S], y: mut T[...O])`): the kernel reduces each
//! input over its trailing `x.ndim - y.ndim` dims into `y` (the registry
//! checks that `y`'s shape is `x`'s leading dims: `KernelOpts::kept_leading_dims`). [`ReductionKernel::reduce`] (and the
//! Python class) turn CuPy's `axis=` and `keepdims=` into that form with zero
//! copies: the input is viewed with the reduced axes moved last, and the
//! output is allocated with the kept dims.

use dlbridge_array::Array;
use dlbridge_core::{DType, Error, Result};
use dlbridge_registry::{Arg, DynKernelFn, Kernel, KernelOpts};

use crate::builder::specialise::build_library;
use crate::params::ParamType;
use crate::source_kernel::SourceKernel;
use crate::spec::{Reduction, ReductionSpec};

/// A kernel compiled from a map / reduce / post-map description, one
/// specialisation per combination of dtypes, built on first use.
pub type ReductionKernel = SourceKernel<ReductionSpec>;

impl SourceKernel<ReductionSpec> {
    /// Parses and checks CuPy's arguments; nothing is compiled until a call
    /// needs it. `identity` None starts each reduction from its first mapped
    /// element.
    pub fn new(r: Reduction<'_>) -> Result<ReductionKernel> {
        let spec = ReductionSpec::new(&r)?;
        let doc = format!(
            "ReductionKernel: map `{}`, reduce `{}`, post-map `{}`; reduces each input over its last x.ndim - y.ndim dims",
            spec.map_expr, spec.reduce_expr, spec.post_map_expr
        );
        SourceKernel::from_spec(spec, build, KernelOpts { kept_leading_dims: true, ..KernelOpts::DEFAULT }, doc)
    }

    /// Runs `kernel` (this kernel, registered) on `inputs` reduced over
    /// `axis` (None: every axis; negative axes count from the end) into new
    /// Arrays, with the reduced dims kept as 1 when `keepdims`.
    pub fn reduce(&self, kernel: &Kernel, inputs: &[&Array], axis: Option<&[i64]>, keepdims: bool) -> Result<Vec<Array>> {
        let first = inputs.first().ok_or_else(|| Error::InvalidArgument(format!("{}: no input", self.spec().name)))?;
        let ndim = first.ndim();
        let axes = normalize_axes(&self.spec().name, axis, ndim)?;
        let kept: Vec<usize> = (0..ndim).filter(|d| !axes.contains(d)).collect();
        let perm: Vec<usize> = kept.iter().chain(&axes).copied().collect();
        let views: Vec<Array> = inputs.iter().map(|a| a.permute(&perm)).collect::<Result<_>>()?;
        let out_shape: Vec<i64> = kept.iter().map(|&d| first.shape()[d]).collect();
        // Output dtypes: concrete, or the dtype an input with the same placeholder has.
        let mut outs = Vec::with_capacity(self.spec().outputs.len());
        for o in &self.spec().outputs {
            let dtype = match o.ty {
                ParamType::Concrete(d) => d,
                ParamType::Var(v) => self
                    .spec()
                    .inputs
                    .iter()
                    .zip(inputs)
                    .find(|(p, _)| p.ty == ParamType::Var(v))
                    .map(|(_, a)| a.dtype())
                    .ok_or_else(|| Error::Runtime(format!("{}: output type {v} is bound by no input", self.spec().name)))?,
            };
            outs.push(Array::zeros(dtype, &out_shape)?);
        }
        {
            let mut args: Vec<Arg<'_>> = views.iter().map(|v| Arg::Tensor(v.view())).collect();
            for o in outs.iter_mut() {
                args.push(Arg::TensorMut(o.view_mut()?));
            }
            kernel.call(&mut args, &mut [])?;
        }
        if !keepdims {
            return Ok(outs);
        }
        let keep_shape: Vec<i64> = (0..ndim).map(|d| if axes.contains(&d) { 1 } else { first.shape()[d] }).collect();
        outs.into_iter().map(|o| reshape_contiguous(o, &keep_shape)).collect()
    }
}

/// Sorted, distinct, non-negative axes; None is every axis.
fn normalize_axes(name: &str, axis: Option<&[i64]>, ndim: usize) -> Result<Vec<usize>> {
    let Some(axis) = axis else { return Ok((0..ndim).collect()) };
    let mut out = Vec::with_capacity(axis.len());
    for &a in axis {
        let d = if a < 0 { a + ndim as i64 } else { a };
        if d < 0 || d >= ndim as i64 {
            return Err(Error::InvalidArgument(format!("{name}: axis {a} is out of bounds for an array of {ndim} dims")));
        }
        if out.contains(&(d as usize)) {
            return Err(Error::InvalidArgument(format!("{name}: axis {a} is repeated")));
        }
        out.push(d as usize);
    }
    out.sort_unstable();
    Ok(out)
}

/// A fresh contiguous Array given a new shape of the same size (the kept dims
/// with 1s inserted): its bytes, re-described.
fn reshape_contiguous(a: Array, shape: &[i64]) -> Result<Array> {
    Array::from_bytes(a.dtype(), shape, a.view().as_bytes()?)
}

/// Generates, compiles (or finds) and loads the specialisation for `bind`.
fn build(spec: &ReductionSpec, bind: &[(char, DType)]) -> Result<DynKernelFn> {
    build_library(spec, bind, &crate::codegen::cpu::reduction_cpp(spec, bind)?)
}

//! Arguments, signature checking and output preparation.
//!
//! [`bind`] checks a call's arguments against a [`Signature`] and records
//! what the type variables, dim symbols and `...` groups were bound to; all of
//! it lives inline (no heap allocation for signatures within the `MAX_*`
//! limits and tensors of up to 8 dims per group).

use std::fmt;

use dlbridge_core::{DType, Device, Error, Result, TensorView, TensorViewMut};
use smallvec::SmallVec;

use crate::signature::{DTypeRef, Dim, MAX_RESTS, MAX_SYMBOLS, MAX_TYPE_VARS, ParamKind, ScalarKind, Signature, TensorType};

/// One argument of a kernel call, in signature order.
#[derive(Debug)]
pub enum Arg<'a> {
    /// A tensor the kernel only reads.
    Tensor(TensorView<'a>),
    /// A tensor the kernel may write (required for `mut` parameters).
    TensorMut(TensorViewMut<'a>),
    /// An `f64` scalar.
    F64(f64),
    /// An `i64` scalar.
    I64(i64),
    /// A `bool` scalar.
    Bool(bool),
}

impl Arg<'_> {
    /// What kind of argument this is, for error messages.
    pub fn describe(&self) -> String {
        match self {
            Arg::Tensor(v) => format!("a {} tensor of shape {:?}", v.dtype(), v.shape()),
            Arg::TensorMut(v) => format!("a writable {} tensor of shape {:?}", v.dtype(), v.shape()),
            Arg::F64(x) => format!("f64 {x}"),
            Arg::I64(x) => format!("i64 {x}"),
            Arg::Bool(x) => format!("bool {x}"),
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

/// Shape, dtype and device of an output, computed from the inputs alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSpec {
    /// Output name from the signature.
    pub name: String,
    /// Shape to allocate.
    pub shape: SmallVec<[i64; 6]>,
    /// Dtype to allocate.
    pub dtype: DType,
    /// Device to allocate on (the inputs' device).
    pub device: Device,
}

#[derive(Debug, Clone, Copy, Default)]
struct Bound {
    value: i64,
    by: u8,
}

#[derive(Debug, Clone, Default)]
struct BoundRest {
    dims: SmallVec<[i64; 8]>,
    by: u8,
}

/// What one call bound its signature's variables to.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    dtypes: [Option<(DType, u8)>; MAX_TYPE_VARS],
    syms: [Option<Bound>; MAX_SYMBOLS],
    rests: [Option<BoundRest>; MAX_RESTS],
    device: Option<(Device, u8)>,
}

impl Bindings {
    /// The dtype type variable `i` was bound to.
    pub fn dtype(&self, i: usize) -> Option<DType> {
        self.dtypes.get(i).copied().flatten().map(|(d, _)| d)
    }
    /// The value dim symbol `i` was bound to.
    pub fn symbol(&self, i: usize) -> Option<i64> {
        self.syms.get(i).copied().flatten().map(|b| b.value)
    }
    /// The device every tensor argument is on (None if the call has no tensors).
    pub fn device(&self) -> Option<Device> {
        self.device.map(|(d, _)| d)
    }
}

struct Ctx<'s> {
    sig: &'s Signature,
}

impl Ctx<'_> {
    fn arg_err(&self, param: usize, err: Error) -> Error {
        err.context(format!("{}: argument {}", self.sig.name, self.param_name(param)))
    }
    fn param_name(&self, i: usize) -> &str {
        let n = self.sig.params.len();
        if i < n { &self.sig.params[i].name } else { &self.sig.outputs[i - n].name }
    }

    /// Checks one tensor against its type, binding variables on first sight.
    fn tensor(&self, b: &mut Bindings, idx: usize, ty: &TensorType, shape: &[i64], dtype: DType, device: Device) -> Result<()> {
        let by = idx as u8;
        // dtype
        match ty.dtype {
            DTypeRef::Concrete(d) if d != dtype => {
                return Err(self.arg_err(idx, Error::DTypeMismatch { expected: d.to_string(), got: dtype }));
            }
            DTypeRef::Concrete(_) => {}
            DTypeRef::Var(v) => match b.dtypes[v] {
                Some((bound, by0)) if bound != dtype => {
                    return Err(self.arg_err(
                        idx,
                        Error::DTypeMismatch {
                            expected: format!("{} = {bound} (bound by {})", self.sig.type_vars[v].name, self.param_name(by0 as usize)),
                            got: dtype,
                        },
                    ));
                }
                Some(_) => {}
                None => {
                    if !self.sig.type_vars[v].allowed.contains(&dtype) {
                        return Err(self.arg_err(idx, Error::DTypeMismatch { expected: self.sig.describe_dtype(ty.dtype), got: dtype }));
                    }
                    b.dtypes[v] = Some((dtype, by));
                }
            },
        }
        // device
        match b.device {
            Some((d, by0)) if d != device => {
                return Err(self.arg_err(
                    idx,
                    Error::UnsupportedDevice { got: device, what: format!("{} is on {d}; all tensors must share one device", self.param_name(by0 as usize)) },
                ));
            }
            Some(_) => {}
            None => b.device = Some((device, by)),
        }
        // rank
        let rest_at = ty.rest_position();
        let fixed = ty.dims.len() - usize::from(rest_at.is_some());
        let rank_ok = if rest_at.is_some() { shape.len() >= fixed } else { shape.len() == fixed };
        if !rank_ok {
            return Err(self.arg_err(
                idx,
                Error::Mismatch(format!(
                    "expected {}{} dims {} but got {} dims {:?}",
                    if rest_at.is_some() { "at least " } else { "" },
                    fixed,
                    self.sig.fmt_dims(&ty.dims),
                    shape.len(),
                    shape
                )),
            ));
        }
        let rest_len = shape.len() - fixed;
        let mut axis = 0usize;
        for d in &ty.dims {
            match *d {
                Dim::Fixed(n) => {
                    if shape[axis] != n {
                        return Err(self.arg_err(idx, Error::Mismatch(format!("dim {axis} must be {n} but got {}", shape[axis]))));
                    }
                    axis += 1;
                }
                Dim::Sym(s) => {
                    let got = shape[axis];
                    match b.syms[s] {
                        Some(bound) if bound.value != got => {
                            return Err(self.arg_err(
                                idx,
                                Error::Mismatch(format!(
                                    "dim {} = {} (bound by {}) but got {got}",
                                    self.sig.symbols[s],
                                    bound.value,
                                    self.param_name(bound.by as usize)
                                )),
                            ));
                        }
                        Some(_) => {}
                        None => b.syms[s] = Some(Bound { value: got, by }),
                    }
                    axis += 1;
                }
                Dim::Rest(r) => {
                    let got = &shape[axis..axis + rest_len];
                    match &b.rests[r] {
                        Some(bound) if bound.dims.as_slice() != got => {
                            return Err(self.arg_err(
                                idx,
                                Error::Mismatch(format!(
                                    "...{} = {:?} (bound by {}) but got {:?}",
                                    self.sig.rests[r],
                                    bound.dims.as_slice(),
                                    self.param_name(bound.by as usize),
                                    got
                                )),
                            ));
                        }
                        Some(_) => {}
                        None => b.rests[r] = Some(BoundRest { dims: got.into(), by }),
                    }
                    axis += rest_len;
                }
            }
        }
        Ok(())
    }
}

/// Checks the inputs of a call against `sig` and returns the bindings.
///
/// Errors name the kernel, the argument, what was expected and what came:
/// `matmul: argument b: dim K = 3 (bound by a) but got 4`.
pub fn bind(sig: &Signature, args: &[Arg<'_>]) -> Result<Bindings> {
    if args.len() != sig.params.len() {
        return Err(Error::InvalidArgument(format!(
            "{}: expected {} arguments ({}) but got {}",
            sig.name,
            sig.params.len(),
            sig.params.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
            args.len()
        )));
    }
    let ctx = Ctx { sig };
    let mut b = Bindings::default();
    for (i, (param, arg)) in sig.params.iter().zip(args).enumerate() {
        match (&param.kind, arg) {
            (ParamKind::Scalar(ScalarKind::F64), Arg::F64(_))
            | (ParamKind::Scalar(ScalarKind::I64), Arg::I64(_))
            | (ParamKind::Scalar(ScalarKind::Bool), Arg::Bool(_)) => {}
            (ParamKind::Scalar(k), other) => {
                return Err(ctx.arg_err(i, Error::InvalidArgument(format!("expected a {k} scalar but got {}", other.describe()))));
            }
            (ParamKind::Tensor(t), Arg::Tensor(v)) => {
                if t.mutable {
                    return Err(ctx.arg_err(i, Error::ReadOnly { what: "parameter is `mut` (written in place) but the tensor given".into() }));
                }
                ctx.tensor(&mut b, i, t, v.shape(), v.dtype(), v.device())?;
            }
            (ParamKind::Tensor(t), Arg::TensorMut(v)) => ctx.tensor(&mut b, i, t, v.shape(), v.dtype(), v.device())?,
            (ParamKind::Tensor(t), other) => {
                return Err(ctx.arg_err(
                    i,
                    Error::InvalidArgument(format!("expected a tensor {} but got {}", sig.fmt_dims(&t.dims), other.describe())),
                ));
            }
        }
    }
    Ok(b)
}

/// Checks caller-given outputs against the bindings (dtype, shape, device).
pub fn check_outputs(sig: &Signature, b: &mut Bindings, outs: &[TensorViewMut<'_>]) -> Result<()> {
    if outs.len() != sig.outputs.len() {
        return Err(Error::InvalidArgument(format!(
            "{}: expected {} outputs ({}) but got {}",
            sig.name,
            sig.outputs.len(),
            sig.outputs.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
            outs.len()
        )));
    }
    let ctx = Ctx { sig };
    for (j, (param, out)) in sig.outputs.iter().zip(outs).enumerate() {
        if let Some(t) = param.tensor() {
            ctx.tensor(b, sig.params.len() + j, t, out.shape(), out.dtype(), out.device())
                .map_err(retitle_output)?;
        }
    }
    Ok(())
}

fn retitle_output(e: Error) -> Error {
    match e {
        Error::Context { context, source } => Error::Context { context: context.replace(": argument ", ": output "), source },
        other => other,
    }
}

/// Shapes, dtypes and devices of every output, from bound inputs alone
/// (Tensor Comprehensions' prepareOutputs step).
pub fn output_specs(sig: &Signature, b: &Bindings) -> Result<SmallVec<[OutputSpec; 2]>> {
    let device = b.device().unwrap_or(Device::CPU);
    let mut specs = SmallVec::new();
    for p in &sig.outputs {
        let Some(t) = p.tensor() else { continue };
        let dtype = match t.dtype {
            DTypeRef::Concrete(d) => d,
            DTypeRef::Var(v) => b.dtype(v).ok_or_else(|| unbound(sig, &sig.type_vars[v].name))?,
        };
        let mut shape = SmallVec::new();
        for d in &t.dims {
            match *d {
                Dim::Fixed(n) => shape.push(n),
                Dim::Sym(s) => shape.push(b.symbol(s).ok_or_else(|| unbound(sig, &sig.symbols[s]))?),
                Dim::Rest(r) => shape.extend_from_slice(&b.rests[r].as_ref().ok_or_else(|| unbound(sig, &sig.rests[r]))?.dims),
            }
        }
        specs.push(OutputSpec { name: p.name.clone(), shape, dtype, device });
    }
    Ok(specs)
}

fn unbound(sig: &Signature, what: &str) -> Error {
    Error::Runtime(format!("{}: `{what}` is not bound (bind the inputs first)", sig.name))
}

impl fmt::Display for OutputSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}{:?} on {}", self.name, self.dtype, self.shape.as_slice(), self.device)
    }
}

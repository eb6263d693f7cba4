//! Signature checking and output preparation: the [`Solution`] of a call.
//!
//! [`solve`] checks a call's arguments against a [`Signature`] and records
//! what its type variables, dim symbols and `...` groups are for them (the
//! [`Solution`]); all of it lives inline (no heap allocation for signatures within the `MAX_*`
//! limits and tensors of up to 8 dims per group).

use std::fmt;

use dlbridge_core::{DType, Device, Error, Result, Slot, TensorView, TensorViewMut};
use smallvec::SmallVec;

use crate::arg::Arg;
use crate::signature::{DTypeRef, Dim, DimOrigin, MAX_RESTS, MAX_SYMBOLS, MAX_TYPE_VARS, ParamKind, ScalarKind, Signature, TensorType};

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
    /// The order of the dims in memory, outermost first (a permutation of
    /// `0..shape.len()`); empty for row-major. An output whose dims are exactly
    /// an input's (an elementwise `...S`, softmax's `...B, N`) follows the memory
    /// order of the inputs shaped like it, as NumPy's ufuncs (`order='K'`) and torch's TensorIterator lay out
    /// theirs: `add(x.t(), x.t())` is then a pass over memory in order, not a
    /// transpose. An allocator allocates [`OutputSpec::memory_shape`] row-major
    /// and permutes it by [`OutputSpec::axes`]; one that allocates row-major
    /// anyway still gets the right values (every kernel writes any strides).
    pub order: SmallVec<[usize; 6]>,
}

impl OutputSpec {
    /// Whether the output is laid out row-major (the common case).
    #[inline]
    pub fn is_row_major(&self) -> bool {
        self.order.is_empty()
    }

    /// The shape in memory order: what to allocate row-major.
    pub fn memory_shape(&self) -> SmallVec<[i64; 6]> {
        if self.order.is_empty() { self.shape.clone() } else { self.order.iter().map(|&d| self.shape[d]).collect() }
    }

    /// The permutation of a row-major [`OutputSpec::memory_shape`] allocation
    /// that gives this output's dims: dim `i` of the output is dim `axes[i]`
    /// of the allocation (the argument of NumPy's `transpose` and torch's
    /// `permute`). The identity for a row-major output.
    pub fn axes(&self) -> SmallVec<[usize; 6]> {
        if self.order.is_empty() {
            return (0..self.shape.len()).collect();
        }
        let mut axes: SmallVec<[usize; 6]> = smallvec::smallvec![0; self.order.len()];
        for (k, &d) in self.order.iter().enumerate() {
            axes[d] = k;
        }
        axes
    }

    /// The strides, in elements, of a dense tensor of this shape in this order.
    pub fn strides(&self) -> SmallVec<[i64; 6]> {
        let n = self.shape.len();
        let mut strides: SmallVec<[i64; 6]> = smallvec::smallvec![0; n];
        let mut step = 1i64;
        for k in (0..n).rev() {
            let d = if self.order.is_empty() { k } else { self.order[k] };
            strides[d] = step;
            step = step.saturating_mul(self.shape[d].max(1));
        }
        strides
    }
}

/// What one call's arguments solve its signature's variables to. Compact and inline:
/// `...` groups are recorded as (argument, first dim, count) and read back
/// from the argument's shape.
#[derive(Debug, Clone, Default)]
pub struct Solution {
    dtypes: [Option<(DType, u8)>; MAX_TYPE_VARS],
    syms: [i64; MAX_SYMBOLS],
    sym_by: [u8; MAX_SYMBOLS],
    sym_mask: u32,
    rests: [(u8, u8, u8); MAX_RESTS],
    rest_mask: u8,
    /// `...` groups whose value is `bshape` (a broadcast group the inputs
    /// broadcast to a shape no single one of them has).
    bcast_mask: u8,
    bshape: SmallVec<[i64; 6]>,
    device: Option<(Device, u8)>,
}

impl Solution {
    /// The dtype type variable `i` was bound to.
    #[inline]
    pub fn dtype(&self, i: usize) -> Option<DType> {
        self.dtypes.get(i).copied().flatten().map(|(d, _)| d)
    }
    /// The value dim symbol `i` was bound to.
    #[inline]
    pub fn symbol(&self, i: usize) -> Option<i64> {
        (i < MAX_SYMBOLS && self.sym_mask & (1 << i) != 0).then(|| self.syms[i])
    }
    /// The dims `...` group `i` was bound to (read from the argument that
    /// bound it, or the broadcast shape of a `*` group's inputs).
    pub fn rest<'s>(&'s self, i: usize, args: &'s [Arg<'_>]) -> Option<&'s [i64]> {
        if i >= MAX_RESTS || self.rest_mask & (1 << i) == 0 {
            return None;
        }
        if self.bcast_mask & (1 << i) != 0 {
            return Some(&self.bshape);
        }
        let (by, start, len) = self.rests[i];
        let (shape, _, _) = args.get(by as usize)?.tensor_meta()?;
        shape.get(start as usize..start as usize + len as usize)
    }
    /// The device every tensor argument is on (None if the call has no tensors).
    #[inline]
    pub fn device(&self) -> Option<Device> {
        self.device.map(|(d, _)| d)
    }
}

struct Ctx<'s, 'x> {
    sig: &'s Signature,
    args: &'s [Arg<'x>],
}

impl Ctx<'_, '_> {
    fn arg_err(&self, param: usize, err: Error) -> Error {
        err.at(self.sig.name.clone(), self.slot(param))
    }
    fn slot(&self, i: usize) -> Slot {
        let n = self.sig.params.len();
        if i < n { Slot::Argument(self.sig.params[i].name.clone()) } else { Slot::Output(self.sig.outputs[i - n].name.clone()) }
    }
    fn param_name(&self, i: usize) -> &str {
        let n = self.sig.params.len();
        if i < n { &self.sig.params[i].name } else { &self.sig.outputs[i - n].name }
    }

    /// Checks one tensor against its type, binding variables on first sight.
    /// The hot path returns a tiny [`Fail`]; the message is built (cold) by [`Ctx::explain`].
    #[inline]
    fn tensor(&self, b: &mut Solution, idx: usize, ty: &TensorType, shape: &[i64], dtype: DType, device: Device) -> Result<()> {
        match self.check(b, idx, ty, shape, dtype, device) {
            Ok(()) => Ok(()),
            Err(fail) => Err(self.explain(b, idx, ty, shape, dtype, device, fail)),
        }
    }

    #[inline]
    fn check(&self, b: &mut Solution, idx: usize, ty: &TensorType, shape: &[i64], dtype: DType, device: Device) -> Result<(), Fail> {
        let by = idx as u8;
        match ty.dtype {
            DTypeRef::Concrete(d) => {
                if d != dtype {
                    return Err(Fail::DType);
                }
            }
            DTypeRef::Var(v) => match b.dtypes[v] {
                Some((bound, _)) => {
                    if bound != dtype {
                        return Err(Fail::DType);
                    }
                }
                None => {
                    if !self.sig.type_vars[v].allowed.contains(&dtype) {
                        return Err(Fail::DType);
                    }
                    b.dtypes[v] = Some((dtype, by));
                }
            },
        }
        match b.device {
            Some((d, _)) => {
                if d != device {
                    return Err(Fail::Device);
                }
            }
            None => b.device = Some((device, by)),
        }
        let dims = &ty.dims[..];
        let fixed = dims.len() - usize::from(ty.has_rest());
        if if ty.has_rest() { shape.len() < fixed } else { shape.len() != fixed } {
            return Err(Fail::Rank);
        }
        let rest_len = shape.len() - fixed;
        let mut axis = 0usize;
        for d in dims {
            match *d {
                Dim::Fixed(n) => {
                    if shape[axis] != n {
                        return Err(Fail::Dim(axis));
                    }
                    axis += 1;
                }
                Dim::Sym(s) => {
                    let got = shape[axis];
                    if b.sym_mask & (1 << s) != 0 {
                        if b.syms[s] != got {
                            return Err(Fail::Dim(axis));
                        }
                    } else {
                        b.syms[s] = got;
                        b.sym_by[s] = by;
                        b.sym_mask |= 1 << s;
                    }
                    axis += 1;
                }
                Dim::Expr(e) => {
                    // Outputs only (the parser refuses it in inputs): every
                    // symbol is bound by now.
                    let want = self.sig.exprs[e].eval(&|s| (b.sym_mask & (1 << s) != 0).then(|| b.syms[s]));
                    if want != Some(shape[axis]) {
                        return Err(Fail::Dim(axis));
                    }
                    axis += 1;
                }
                Dim::Rest(r) => {
                    let got = &shape[axis..axis + rest_len];
                    match b.rest(r, self.args) {
                        Some(bound) => {
                            if !same_dims(bound, got) {
                                if !self.sig.is_broadcast(r) || idx >= self.sig.params.len() {
                                    return Err(Fail::Rest(r));
                                }
                                let joined = broadcast_shapes(bound, got).ok_or(Fail::Rest(r))?;
                                b.bshape = joined;
                                b.bcast_mask |= 1 << r;
                            }
                        }
                        None => {
                            if idx >= self.sig.params.len() {
                                return Err(Fail::Rest(r));
                            }
                            // ndim <= MAX_NDIM (64), so positions fit a u8.
                            b.rests[r] = (by, axis as u8, rest_len as u8);
                            b.rest_mask |= 1 << r;
                        }
                    }
                    axis += rest_len;
                }
            }
        }
        Ok(())
    }

    /// The error for a failed check, naming the kernel, argument, expectation and value.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn explain(&self, b: &Solution, idx: usize, ty: &TensorType, shape: &[i64], dtype: DType, device: Device, fail: Fail) -> Error {
        let err = match fail {
            Fail::DType => match ty.dtype {
                DTypeRef::Var(v) => match b.dtypes[v] {
                    Some((bound, by0)) => Error::DTypeMismatch {
                        expected: format!("{} = {bound} (bound by {})", self.sig.type_vars[v].name, self.param_name(by0 as usize)),
                        got: dtype,
                    },
                    None => Error::DTypeMismatch { expected: self.sig.describe_dtype(ty.dtype), got: dtype },
                },
                DTypeRef::Concrete(d) => Error::DTypeMismatch { expected: d.to_string(), got: dtype },
            },
            Fail::Device => {
                let (d, by0) = b.device.unwrap_or((device, 0));
                Error::UnsupportedDevice {
                    got: device,
                    what: format!("{} is on {d}; all tensors must share one device", self.param_name(by0 as usize)),
                }
            }
            Fail::Rank => Error::Mismatch(format!(
                "expected {}{} dims {} but got {} dims {:?}",
                if ty.has_rest() { "at least " } else { "" },
                ty.dims.len() - usize::from(ty.has_rest()),
                self.sig.fmt_dims(&ty.dims),
                shape.len(),
                shape
            )),
            Fail::Dim(axis) => {
                // Which dim of the type sits at this axis (before any `...`, or counted from the end).
                let rest_len = shape.len() + usize::from(ty.has_rest()) - ty.dims.len();
                let mut a = 0usize;
                let mut which = None;
                for d in &ty.dims {
                    let width = if matches!(d, Dim::Rest(_)) { rest_len } else { 1 };
                    if axis < a + width {
                        which = Some(*d);
                        break;
                    }
                    a += width;
                }
                match which {
                    Some(Dim::Sym(s)) => Error::Mismatch(format!(
                        "dim {} = {} (bound by {}) but got {}",
                        self.sig.symbols[s],
                        b.syms[s],
                        self.param_name(b.sym_by[s] as usize),
                        shape[axis]
                    )),
                    Some(Dim::Fixed(n)) => Error::Mismatch(format!("dim {axis} must be {n} but got {}", shape[axis])),
                    Some(Dim::Expr(e)) => {
                        let want = self.sig.exprs[e].eval(&|s| (b.sym_mask & (1 << s) != 0).then(|| b.syms[s]));
                        Error::Mismatch(format!(
                            "dim {axis} must be {} = {} but got {}",
                            self.sig.fmt_expr(e),
                            want.map_or_else(|| "?".to_owned(), |v| v.to_string()),
                            shape[axis]
                        ))
                    }
                    _ => Error::Mismatch(format!("dim {axis} does not match")),
                }
            }
            Fail::Rest(r) if self.sig.is_broadcast(r) && idx < self.sig.params.len() => match b.rest(r, self.args) {
                Some(bound) => Error::Mismatch(format!(
                    "shape {shape:?} does not broadcast with {bound:?} (*{} so far, from the inputs before it)",
                    self.sig.rests[r]
                )),
                None => Error::Runtime(format!("{}: *{} is not bound by any input", self.sig.name, self.sig.rests[r])),
            },
            Fail::Rest(r) => match b.rest(r, self.args) {
                Some(bound) => {
                    let fixed_before = ty.dims.iter().take_while(|d| !matches!(d, Dim::Rest(_))).count();
                    let rest_len = shape.len() + 1 - ty.dims.len();
                    let by = if b.bcast_mask & (1 << r) != 0 {
                        "the inputs, broadcast".to_owned()
                    } else {
                        self.param_name(b.rests[r].0 as usize).to_owned()
                    };
                    Error::Mismatch(format!(
                        "{} = {bound:?} (bound by {by}) but got {:?}",
                        self.sig.fmt_rest(r),
                        &shape[fixed_before..fixed_before + rest_len]
                    ))
                }
                None => Error::Runtime(format!("{}: {} is not bound by any input", self.sig.name, self.sig.fmt_rest(r))),
            },
            Fail::InPlaceBroadcast(r) => Error::Mismatch(format!(
                "the parameter is `mut` (written in place), so its shape must be the inputs' broadcast shape *{} = {:?}, but it is {shape:?}",
                self.sig.rests[r],
                b.rest(r, self.args).unwrap_or(&[])
            )),
        };
        self.arg_err(idx, err)
    }
}

/// What a check found wrong (the text comes later, off the hot path).
#[derive(Debug, Clone, Copy)]
enum Fail {
    DType,
    Device,
    Rank,
    Dim(usize),
    Rest(usize),
    /// A `mut` input of a broadcast group without the group's full shape.
    InPlaceBroadcast(usize),
}

/// Checks the inputs of a call against `sig` and solves its variables
/// (dtypes, dim symbols, `...` groups, the device) for them.
///
/// Errors name the kernel, the argument, what was expected and what came:
/// `matmul: argument b: dim K = 3 (bound by a) but got 4`.
pub fn solve(sig: &Signature, args: &[Arg<'_>]) -> Result<Solution> {
    let mut b = Solution::default();
    solve_into(sig, args, true, &mut b)?;
    Ok(b)
}

/// [`solve`] for computing output specs only: a read-only view in a `mut` slot
/// is fine there (nothing is written; the call itself checks it).
pub(crate) fn solve_for_specs(sig: &Signature, args: &[Arg<'_>]) -> Result<Solution> {
    let mut b = Solution::default();
    solve_into(sig, args, false, &mut b)?;
    Ok(b)
}

/// Checks the inputs into `b` (fresh: [`Solution::default`]), in place: a
/// call's hot path does not move its solution around. `writes`: a read-only
/// view in a `mut` slot is an error.
pub(crate) fn solve_into(sig: &Signature, args: &[Arg<'_>], writes: bool, b: &mut Solution) -> Result<()> {
    solve_on(sig, args, writes, None, b)
}

/// [`solve_into`], with each tensor argument's device taken from `devices`
/// (indexed like `args`) instead of its view where given: a call known by
/// layout only ([`crate::meta`]) has views of host memory standing in for
/// tensors on any device.
#[inline(always)]
pub(crate) fn solve_on(sig: &Signature, args: &[Arg<'_>], writes: bool, devices: Option<&[Device]>, b: &mut Solution) -> Result<()> {
    if args.len() != sig.params.len() {
        return Err(arity_error(sig, args.len()));
    }
    let ctx = Ctx { sig, args };
    let device = |i: usize, v: &TensorView<'_>| devices.and_then(|d| d.get(i).copied()).unwrap_or_else(|| v.device());
    for (i, (param, arg)) in sig.params.iter().zip(args).enumerate() {
        match (&param.kind, arg) {
            (ParamKind::Tensor(t), Arg::Tensor(v)) => {
                if t.mutable && writes {
                    return Err(read_only_error(&ctx, i));
                }
                ctx.tensor(b, i, t, v.shape(), v.dtype(), device(i, v))?;
            }
            (ParamKind::Tensor(t), Arg::TensorMut(v)) => ctx.tensor(b, i, t, v.shape(), v.dtype(), device(i, v.as_view()))?,
            (ParamKind::Scalar(kind), Arg::Scalar(s)) if s.kind() == *kind => {}
            (kind, other) => return Err(kind_error(&ctx, i, kind, other)),
        }
    }
    if b.bcast_mask != 0 {
        in_place_broadcasts(&ctx, b)?;
    }
    Ok(())
}

/// A `mut` input of a broadcast group is written in place: it must have the
/// full broadcast shape (NumPy refuses `x += y` that would grow `x` too).
#[cold]
#[inline(never)]
fn in_place_broadcasts(ctx: &Ctx<'_, '_>, b: &Solution) -> Result<()> {
    for (i, p) in ctx.sig.params.iter().enumerate() {
        let Some(t) = p.tensor().filter(|t| t.mutable) else { continue };
        for d in &t.dims {
            if let Dim::Rest(r) = *d
                && b.bcast_mask & (1 << r) != 0
                && let Some((shape, dtype, device)) = ctx.args[i].tensor_meta()
                && !same_dims(shape, &b.bshape)
            {
                return Err(ctx.explain(b, i, t, shape, dtype, device, Fail::InPlaceBroadcast(r)));
            }
        }
    }
    Ok(())
}

/// NumPy's broadcast of two shapes (right-aligned; a dim of 1 stretches), or
/// None when some dim pair differs with neither being 1.
pub fn broadcast_shapes(a: &[i64], b: &[i64]) -> Option<SmallVec<[i64; 6]>> {
    let n = a.len().max(b.len());
    let mut out = SmallVec::with_capacity(n);
    for k in 0..n {
        let x = if k + a.len() >= n { a[k + a.len() - n] } else { 1 };
        let y = if k + b.len() >= n { b[k + b.len() - n] } else { 1 };
        out.push(match (x, y) {
            _ if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        });
    }
    Some(out)
}

/// A signature compiled once, when its kernel is made, into one rule per
/// parameter and output: the check a call runs first ([`check_call`]).
///
/// The rules make the same checks as [`bind`] and [`check_outputs`] and bind
/// the same [`Solution`]; the common tensor type `T[...S]` (a whole shape
/// bound as one group, as every elementwise signature has) is checked with a
/// shape comparison instead of a walk over the type's dims. When any rule
/// fails, the call runs the checks again the general way, which builds the
/// error: a rule only ever decides "accepted", never what the error says.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Parameters in signature order, then outputs; `None` when a tensor
    /// type is not of the `D[...R]` form (the call then takes the general
    /// checks directly).
    rules: Option<Box<[Rule]>>,
    /// Whether a parameter is `mut` (the layout checks then take the general path).
    pub(crate) has_mut: bool,
}

#[derive(Debug, Clone, Copy)]
enum Rule {
    /// A scalar parameter of this kind.
    Scalar(ScalarKind),
    /// A tensor of type `D[...R]`: its whole shape is group `rest`.
    Whole { dtype: DTypeRef, rest: usize, mutable: bool },
}

impl Plan {
    pub(crate) fn new(sig: &Signature) -> Plan {
        let rule = |p: &crate::signature::Param| match &p.kind {
            ParamKind::Scalar(k) => Some(Rule::Scalar(*k)),
            ParamKind::Tensor(t) => match (t.dtype, &t.dims[..]) {
                (DTypeRef::Var(v), _) if v >= MAX_TYPE_VARS => None,
                (dtype, [Dim::Rest(r)]) if *r < MAX_RESTS => Some(Rule::Whole { dtype, rest: *r, mutable: t.mutable }),
                _ => None,
            },
        };
        Plan {
            rules: sig.params.iter().chain(&sig.outputs).map(rule).collect(),
            has_mut: sig.params.iter().any(|p| p.tensor().is_some_and(|t| t.mutable)),
        }
    }
}

/// Checks a call's arguments and outputs against `sig` into `b` (fresh:
/// [`Solution::default`]): [`solve`] then [`check_outputs`], the same checks
/// and solution, through `plan` (made from `sig`) first.
#[inline]
pub(crate) fn check_call(sig: &Signature, plan: &Plan, args: &[Arg<'_>], outs: &[TensorViewMut<'_>], b: &mut Solution) -> Result<()> {
    if let Some(rules) = &plan.rules
        && planned(sig, rules, args, outs, b)
    {
        return Ok(());
    }
    // Something is wrong, or the signature needs the general walk: the
    // general checks decide, and name what is wrong.
    *b = Solution::default();
    solve_into(sig, args, true, b)?;
    check_outputs(sig, b, args, outs)
}

/// What the rules bound so far. Kept apart from [`Solution`] (and copied in
/// once, at the end) so the checks read back registers, not the bytes they
/// just stored.
struct Planned<'s> {
    dtypes: [Option<(DType, u8)>; MAX_TYPE_VARS],
    device: Option<(Device, u8)>,
    groups: [Option<(&'s [i64], u8)>; MAX_RESTS],
}

/// The rules over a call: true when every one holds, with `b` then holding
/// what [`bind`] and [`check_outputs`] would have bound.
#[inline]
fn planned(sig: &Signature, rules: &[Rule], args: &[Arg<'_>], outs: &[TensorViewMut<'_>], b: &mut Solution) -> bool {
    let n = args.len();
    if n != sig.params.len() || outs.len() != sig.outputs.len() || rules.len() != n + outs.len() {
        return false;
    }
    let mut st = Planned { dtypes: [None; MAX_TYPE_VARS], device: None, groups: [None; MAX_RESTS] };
    let (params, outputs) = rules.split_at(n);
    for (i, (rule, arg)) in params.iter().zip(args).enumerate() {
        let (view, read_only_in_mut_slot) = match (*rule, arg) {
            (Rule::Scalar(kind), Arg::Scalar(s)) if s.kind() == kind => continue,
            (Rule::Whole { mutable, .. }, Arg::Tensor(v)) => (v, mutable),
            (Rule::Whole { .. }, Arg::TensorMut(v)) => (v.as_view(), false),
            _ => return false,
        };
        if read_only_in_mut_slot || !whole(sig, &mut st, i, true, *rule, view) {
            return false;
        }
    }
    for (j, (rule, out)) in outputs.iter().zip(outs).enumerate() {
        if !whole(sig, &mut st, n + j, false, *rule, out.as_view()) {
            return false;
        }
    }
    b.dtypes = st.dtypes;
    b.device = st.device;
    for (r, g) in st.groups.iter().enumerate() {
        if let Some((shape, by)) = *g {
            // ndim <= MAX_NDIM (64): it fits a u8.
            b.rests[r] = (by, 0, shape.len() as u8);
            b.rest_mask |= 1 << r;
        }
    }
    true
}

/// One tensor against its `Whole` rule (`idx`: its slot, parameters then
/// outputs; only inputs bind a `...` group).
#[inline(always)]
fn whole<'s>(sig: &Signature, st: &mut Planned<'s>, idx: usize, input: bool, rule: Rule, view: &'s TensorView<'_>) -> bool {
    let Rule::Whole { dtype: want, rest: r, .. } = rule else { return false };
    let (shape, dtype, device) = (view.shape(), view.dtype(), view.device());
    let by = idx as u8;
    match want {
        DTypeRef::Concrete(d) => {
            if d != dtype {
                return false;
            }
        }
        // v < MAX_TYPE_VARS: Plan::new made no rule otherwise.
        DTypeRef::Var(v) => match st.dtypes[v] {
            Some((bound, _)) => {
                if bound != dtype {
                    return false;
                }
            }
            None => {
                if !sig.type_vars.get(v).is_some_and(|tv| tv.allowed.contains(&dtype)) {
                    return false;
                }
                st.dtypes[v] = Some((dtype, by));
            }
        },
    }
    match st.device {
        Some((d, _)) => {
            if d != device {
                return false;
            }
        }
        None => st.device = Some((device, by)),
    }
    match st.groups[r] {
        Some((bound, _)) => same_dims(bound, shape),
        None if input && shape.len() <= u8::MAX as usize => {
            st.groups[r] = Some((shape, by));
            true
        }
        None => false,
    }
}

/// Two dim lists are equal (a loop the compiler keeps inline: these are a few
/// dims, where a `memcmp` call costs more than the comparison).
#[inline(always)]
fn same_dims(a: &[i64], b: &[i64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

#[cold]
#[inline(never)]
fn arity_error(sig: &Signature, got: usize) -> Error {
    count_error(sig, "arguments", &sig.params, got)
}

/// `k: expected 2 outputs (y, z) but got 1`.
fn count_error(sig: &Signature, what: &str, expected: &[crate::signature::Param], got: usize) -> Error {
    let names: Vec<&str> = expected.iter().map(|p| p.name.as_str()).collect();
    Error::InvalidArgument(format!("{}: expected {} {what} ({}) but got {got}", sig.name, expected.len(), names.join(", ")))
}

#[cold]
#[inline(never)]
fn read_only_error(ctx: &Ctx<'_, '_>, i: usize) -> Error {
    ctx.arg_err(i, Error::ReadOnly { what: "parameter is `mut` (written in place) but the tensor given".into() })
}

#[cold]
#[inline(never)]
fn kind_error(ctx: &Ctx<'_, '_>, i: usize, kind: &ParamKind, other: &Arg<'_>) -> Error {
    match kind {
        ParamKind::Scalar(k) => ctx.arg_err(i, Error::InvalidArgument(format!("expected a {k} scalar but got {}", other.describe()))),
        ParamKind::Tensor(t) => {
            ctx.arg_err(i, Error::InvalidArgument(format!("expected a tensor {} but got {}", ctx.sig.fmt_dims(&t.dims), other.describe())))
        }
    }
}

/// Checks caller-given outputs against the solution (dtype, shape, device).
pub fn check_outputs(sig: &Signature, b: &mut Solution, args: &[Arg<'_>], outs: &[TensorViewMut<'_>]) -> Result<()> {
    if outs.len() != sig.outputs.len() {
        return Err(output_arity_error(sig, outs.len()));
    }
    let ctx = Ctx { sig, args };
    for (j, (param, out)) in sig.outputs.iter().zip(outs).enumerate() {
        if let Some(t) = param.tensor() {
            ctx.tensor(b, sig.params.len() + j, t, out.shape(), out.dtype(), out.device())?;
        }
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn output_arity_error(sig: &Signature, got: usize) -> Error {
    count_error(sig, "outputs", &sig.outputs, got)
}

/// The value of output `name`'s dim expression `e`: an error naming the
/// expression and the sizes it came from when it is negative or cannot be
/// computed.
#[cold]
fn output_dim_error(sig: &Signature, b: &Solution, name: &str, e: usize, v: Option<i64>) -> Error {
    let mut used: Vec<String> = Vec::new();
    for (i, s) in sig.symbols.iter().enumerate() {
        let mut syms = Vec::new();
        sig.exprs[e].symbols(&mut syms);
        if syms.contains(&i)
            && let Some(v) = b.symbol(i)
        {
            used.push(format!("{s} = {v}"));
        }
    }
    let what = match v {
        Some(v) => format!("is {v}, below 0"),
        None => "cannot be computed (a division by a non-positive value, or an overflow)".to_owned(),
    };
    Error::Mismatch(format!(
        "{}: output {name}: dim {} {what} with {}: the inputs are too small for it",
        sig.name,
        sig.fmt_expr(e),
        used.join(", ")
    ))
}

#[inline]
fn output_dim(sig: &Signature, b: &Solution, name: &str, e: usize) -> Result<i64> {
    match sig.exprs[e].eval(&|s| b.symbol(s)) {
        Some(v) if v >= 0 => Ok(v),
        v => Err(output_dim_error(sig, b, name, e, v)),
    }
}

/// Shapes, dtypes and devices of every output, from bound inputs alone
/// (Tensor Comprehensions' prepareOutputs step). `follow_inputs`: outputs
/// shaped like inputs take their memory order (see [`OutputSpec::order`]); a
/// kernel that takes only contiguous tensors gets row-major ones.
pub fn output_specs(sig: &Signature, b: &Solution, args: &[Arg<'_>], follow_inputs: bool) -> Result<SmallVec<[OutputSpec; 2]>> {
    output_specs_strided(sig, b, args, follow_inputs, None)
}

/// [`output_specs`], with each tensor argument's strides taken from `strides`
/// (indexed like `args`) instead of its view where given (see [`solve_on`]).
pub(crate) fn output_specs_strided(
    sig: &Signature,
    b: &Solution,
    args: &[Arg<'_>],
    follow_inputs: bool,
    strides: Option<&[&[i64]]>,
) -> Result<SmallVec<[OutputSpec; 2]>> {
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
                Dim::Rest(r) => shape.extend_from_slice(b.rest(r, args).ok_or_else(|| unbound(sig, &sig.rests[r]))?),
                Dim::Expr(e) => shape.push(output_dim(sig, b, &p.name, e)?),
            }
        }
        let order = if follow_inputs && shape.len() > 1 { memory_order(sig, &t.dims, &shape, args, strides) } else { SmallVec::new() };
        specs.push(OutputSpec { name: p.name.clone(), shape, dtype, device, order });
    }
    Ok(specs)
}

/// The memory order (outermost dim first) of an output of `shape` whose dims
/// are `dims` (`[...S]` for an elementwise kernel, `[...B, N]` for softmax), from
/// the inputs whose dims are exactly those too; empty when that is row-major
/// (so is an output shaped like no input, e.g. matmul's). The rule is torch's
/// TensorIterator's (`reorder_dimensions`), on absolute strides as NumPy's
/// `order='K'`: dims are sorted from inner to outer by an insertion sort
/// whose comparison asks the inputs in argument order, the first one that
/// tells two dims apart deciding (smaller |stride| inner, equal strides: the
/// smaller dim inner); a dim an input broadcasts (or has a zero stride in)
/// tells nothing, and when no input tells, the dims keep their row-major
/// order. As torch, inputs of the output's shape that are all contiguous (size-1
/// dims aside) give a row-major output at once. So `relu(x.t())`
/// and `add(x.t(), x.t())` come out with `x.t()`'s strides, `add(x, b)` with a
/// broadcast bias row-major, `add(x, y.t())` row-major (the first input decides).
fn memory_order<'a>(
    sig: &Signature,
    dims: &[Dim],
    shape: &[i64],
    args: &'a [Arg<'_>],
    given: Option<&[&'a [i64]]>,
) -> SmallVec<[usize; 6]> {
    let n = shape.len();
    // (shape, strides) of each input with the output's dims, aligned to the
    // output's trailing dims (a shorter input broadcasts from the left).
    let mut inputs: SmallVec<[(&[i64], &[i64]); 4]> = SmallVec::new();
    for (i, (p, a)) in sig.params.iter().zip(args).enumerate() {
        let Some(t) = p.tensor() else { continue };
        if t.dims.as_slice() != dims {
            continue;
        }
        let mut v = match a {
            Arg::Tensor(v) => (v.shape(), v.strides()),
            Arg::TensorMut(v) => (v.shape(), v.strides()),
            _ => continue,
        };
        if let Some(s) = given.and_then(|g| g.get(i)) {
            v.1 = s;
        }
        if v.0.len() <= n {
            inputs.push(v);
        }
    }
    // torch's fast path: inputs of the output's shape, all contiguous (size-1
    // dims aside), make a row-major output (`x.t()` of a [1, n] is contiguous).
    if inputs.iter().all(|&(s, st)| s == shape && dlbridge_core::layout::is_contiguous(s, st)) {
        return SmallVec::new();
    }
    // |stride| of output dim `d` in `input`, or None where it tells nothing:
    // the input broadcasts that dim (or has no such dim), or a zero stride.
    let stride = |(s, st): (&[i64], &[i64]), d: usize| -> Option<u64> {
        let j = d.checked_sub(n - s.len())?;
        (!(s[j] == 1 && shape[d] != 1) && st[j] != 0).then(|| st[j].unsigned_abs())
    };
    // torch's comparison of the dims at positions `dim0 < dim1` of `perm`
    // (`dim0` the inner one): > 0 swap them, < 0 keep them, 0 no input tells.
    let compare = |d0: usize, d1: usize| -> i32 {
        for &i in &inputs {
            let (Some(a), Some(b)) = (stride(i, d0), stride(i, d1)) else { continue };
            if a != b {
                return if a < b { -1 } else { 1 };
            }
            // Equal strides: the smaller dim goes inside.
            if shape[d0] > shape[d1] {
                return 1;
            }
        }
        0
    };
    // `perm` lists dims from the innermost out (torch's `perm_`).
    let mut perm: SmallVec<[usize; 6]> = (0..n).rev().collect();
    for i in 1..n {
        let mut dim1 = i;
        for dim0 in (0..i).rev() {
            let c = compare(perm[dim0], perm[dim1]);
            if c > 0 {
                perm.swap(dim0, dim1);
                dim1 = dim0;
            } else if c < 0 {
                break;
            }
        }
    }
    perm.reverse();
    if perm.iter().enumerate().all(|(k, &d)| k == d) { SmallVec::new() } else { perm }
}

fn unbound(sig: &Signature, what: &str) -> Error {
    Error::Runtime(format!("{}: `{what}` is not bound (bind the inputs first)", sig.name))
}

impl fmt::Display for OutputSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}{:?} on {}", self.name, self.dtype, self.shape.as_slice(), self.device)?;
        if !self.order.is_empty() {
            write!(f, " (memory order {:?})", self.order.as_slice())?;
        }
        Ok(())
    }
}

/// ReductionKernel's rule ([`crate::KernelOpts::kept_leading_dims`]): each
/// `mut` tensor argument has the kept (leading) dims of the first read-only
/// tensor argument's shape, the reduced axes being the trailing ones.
pub(crate) fn check_kept_leading(sig: &Signature, args: &[Arg<'_>]) -> Result<()> {
    let tensors = || sig.params.iter().zip(args).filter_map(|(p, a)| Some((p, p.tensor()?, a.tensor_meta()?.0)));
    let Some((_, _, x)) = tensors().find(|(_, t, _)| !t.mutable) else { return Ok(()) };
    for (p, _, o) in tensors().filter(|(_, t, _)| t.mutable) {
        if !(o.len() <= x.len() && o == &x[..o.len()]) {
            return Err(Error::InvalidArgument(format!(
                "{}: output `{}` has shape {o:?}; it must be the kept (leading) dims of the input shape {x:?}, the reduced axes last",
                sig.name, p.name
            )));
        }
    }
    Ok(())
}

/// Where each dim of an output of `dims` comes from, for the call `b` solves:
/// a fixed size, a dim of an argument, or arithmetic on those (see
/// [`DimOrigin`]). A broadcast group's dim comes from the first
/// argument whose size there is the group's (a size of 1 is fixed).
pub(crate) fn dim_origins(sig: &Signature, b: &Solution, args: &[Arg<'_>], dims: &[Dim]) -> Result<SmallVec<[DimOrigin; 6]>> {
    let rank = |i: usize| args.get(i).and_then(Arg::tensor_meta).map_or(0, |(s, _, _)| s.len());
    // The axis of argument `i` where its type's dim `at` (an index into the type's dims) lies.
    let axis_of = |t: &TensorType, i: usize, at: usize| -> usize {
        let rest_len = (rank(i) + usize::from(t.has_rest())).saturating_sub(t.dims.len());
        t.dims[..at].iter().map(|d| if matches!(d, Dim::Rest(_)) { rest_len } else { 1 }).sum()
    };
    let symbol = |s: usize| -> Result<DimOrigin> {
        if b.sym_mask & (1 << s) == 0 {
            return Err(unbound(sig, &sig.symbols[s]));
        }
        let by = b.sym_by[s] as usize;
        let t = sig.params.get(by).and_then(|p| p.tensor()).ok_or_else(|| unbound(sig, &sig.symbols[s]))?;
        let at = t.dims.iter().position(|d| *d == Dim::Sym(s)).ok_or_else(|| unbound(sig, &sig.symbols[s]))?;
        Ok(DimOrigin::Input { arg: by, axis: axis_of(t, by, at) })
    };
    let mut out = SmallVec::new();
    for d in dims {
        match *d {
            Dim::Fixed(n) => out.push(DimOrigin::Fixed(n)),
            Dim::Sym(s) => out.push(symbol(s)?),
            Dim::Expr(e) => out.push(DimOrigin::of_expr(&sig.exprs[e], &symbol)?),
            Dim::Rest(r) if b.bcast_mask & (1 << r) != 0 => {
                let len = b.bshape.len();
                for (k, &want) in b.bshape.iter().enumerate() {
                    let from = sig.params.iter().enumerate().find_map(|(i, p)| {
                        let t = p.tensor()?;
                        let at = t.dims.iter().position(|d| *d == Dim::Rest(r))?;
                        let (shape, _, _) = args.get(i)?.tensor_meta()?;
                        let part = shape.len() + 1 - t.dims.len();
                        let j = (k + part).checked_sub(len)?;
                        let axis = axis_of(t, i, at) + j;
                        (want != 1 && shape.get(axis) == Some(&want)).then_some(DimOrigin::Input { arg: i, axis })
                    });
                    out.push(from.unwrap_or(DimOrigin::Fixed(want)));
                }
            }
            Dim::Rest(r) => {
                if b.rest_mask & (1 << r) == 0 {
                    return Err(unbound(sig, &sig.rests[r]));
                }
                let (by, start, len) = b.rests[r];
                out.extend((0..len as usize).map(|k| DimOrigin::Input { arg: by as usize, axis: start as usize + k }));
            }
        }
    }
    Ok(out)
}

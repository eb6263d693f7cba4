//! A definition's backward, derived from its statements.
//!
//! The backward is itself a definition (`NAME_backward`): its parameters are
//! the forward's inputs and `grad_<output>` per output; its outputs are
//! `grad_<input>` per floating input, then scratch tensors (a name the
//! definition uses itself gets `_2`, ...). It recomputes
//! the forward with every statement writing a fresh version of its output
//! (`v<k>_<O>`: a later statement that reads `O` reads the version before
//! it), then runs the statements in reverse, accumulating each version's
//! gradient (`g<k>_<O>`) into the gradients of what its statement read:
//!
//! * `=`, `+=`: `∂O/∂read = ∂rhs/∂read`; `*=`: the product of the other
//!   factors times `∂rhs/∂read` (`O / rhs` where no factor is zero; where
//!   one is, the product of the rest for it and 0 for the others, from a
//!   count of zeros and a product of the non-zero factors); `max=`, `min=`:
//!   through the arg max, tied maxima sharing it evenly (as torch's `amax`);
//! * a statement without `!` also passes its gradient to the version it
//!   started from, one more factor or candidate (`+=` as is);
//! * `∂rhs/∂read` is the symbolic derivative of the right side with respect
//!   to that one read (the sum and product rules, the quotient rule, each
//!   builtin's derivative, `?:` through the branch taken; comparisons, integer
//!   tensors and `floor`-like builtins pass none).
//!
//! A read whose indices are distinct plain indices (`A(i, kk)`) gathers:
//! `grad_A(i, kk) += g(i, j) * B(kk, j)`, parallel over `grad_A` and
//! reducing over the rest. Any other read (`I(n, c, h + kh, w + kw)`)
//! scatters: every iteration adds to the element it read, one after the
//! other on the CPU, a thread per iteration with atomic adds on CUDA.

use std::collections::{BTreeMap, BTreeSet};

use super::check::{Access, Affine, Checked, OutType, Output, Param, Statement, TensorRef};
use super::parse::{Bin, ElemType, Expr, Op, Pos, Un};
use super::size::Size;

/// Why a definition has no derived backward.
pub type Why = String;

fn num(v: f64) -> Expr {
    Expr::Num { value: v, int: false }
}
fn call(f: &str, args: Vec<Expr>) -> Expr {
    Expr::Call(f.to_owned(), args, Pos::default())
}
fn bin(op: Bin, a: Expr, b: Expr) -> Expr {
    Expr::Binary(op, Box::new(a), Box::new(b))
}
fn is_num(e: &Expr, v: f64) -> bool {
    matches!(e, Expr::Num { value, .. } if *value == v)
}
fn mul(a: Expr, b: Expr) -> Expr {
    if is_num(&a, 1.0) {
        return b;
    }
    if is_num(&b, 1.0) {
        return a;
    }
    bin(Bin::Mul, a, b)
}
fn div(a: Expr, b: Expr) -> Expr {
    bin(Bin::Div, a, b)
}
fn neg(a: Expr) -> Expr {
    Expr::Unary(Un::Neg, Box::new(a))
}
fn add_opt(a: Option<Expr>, b: Option<Expr>) -> Option<Expr> {
    match (a, b) {
        (Some(a), Some(b)) => Some(bin(Bin::Add, a, b)),
        (a, None) => a,
        (None, b) => b,
    }
}
fn select(c: Expr, a: Option<Expr>, b: Option<Expr>) -> Option<Expr> {
    if a.is_none() && b.is_none() {
        return None;
    }
    Some(Expr::Select(Box::new(c), Box::new(a.unwrap_or(num(0.0))), Box::new(b.unwrap_or(num(0.0)))))
}

/// Derivatives with respect to a group of tensor reads (the same element,
/// read at several places): the reads whose numbers, in the order [`reads`]
/// lists them, are in `targets`.
struct Diff<'a> {
    targets: &'a [usize],
    seen: usize,
    is_tensor: &'a dyn Fn(&str) -> bool,
}

impl Diff<'_> {
    /// Whether the next read is one of the targets.
    fn hit(&mut self) -> bool {
        let hit = self.targets.binary_search(&self.seen).is_ok();
        self.seen += 1;
        hit
    }

    fn d(&mut self, e: &Expr) -> Option<Expr> {
        match e {
            Expr::Num { .. } => None,
            Expr::Name(n, _) => {
                if (self.is_tensor)(n) {
                    self.hit().then(|| num(1.0))
                } else {
                    None
                }
            }
            Expr::Call(f, _, _) if (self.is_tensor)(f) => self.hit().then(|| num(1.0)),
            Expr::Call(f, args, _) => {
                let ds: Vec<Option<Expr>> = args.iter().map(|a| self.d(a)).collect();
                let a = args.first().cloned().unwrap_or(num(0.0));
                let b = args.get(1).cloned().unwrap_or(num(0.0));
                let (da, db) = (ds.first().cloned().flatten(), ds.get(1).cloned().flatten());
                let one = |f1: Expr| da.clone().map(|da| mul(f1, da));
                match f.as_str() {
                    "exp" | "expm1" => one(call("exp", vec![a])),
                    "log" => one(div(num(1.0), a)),
                    "log1p" => one(div(num(1.0), bin(Bin::Add, num(1.0), a))),
                    "log2" => one(div(num(1.0), mul(a, num(std::f64::consts::LN_2)))),
                    "log10" => one(div(num(1.0), mul(a, num(std::f64::consts::LN_10)))),
                    "sqrt" => one(div(num(0.5), call("sqrt", vec![a]))),
                    "rsqrt" => one(mul(num(-0.5), div(call("rsqrt", vec![a.clone()]), a))),
                    "cbrt" => one(div(num(1.0), mul(num(3.0), mul(call("cbrt", vec![a.clone()]), call("cbrt", vec![a]))))),
                    "tanh" => one(bin(Bin::Sub, num(1.0), mul(call("tanh", vec![a.clone()]), call("tanh", vec![a])))),
                    "sinh" => one(call("cosh", vec![a])),
                    "cosh" => one(call("sinh", vec![a])),
                    "tan" => one(bin(Bin::Add, num(1.0), mul(call("tan", vec![a.clone()]), call("tan", vec![a])))),
                    "sin" => one(call("cos", vec![a])),
                    "cos" => one(neg(call("sin", vec![a]))),
                    "asin" => one(call("rsqrt", vec![bin(Bin::Sub, num(1.0), mul(a.clone(), a))])),
                    "acos" => one(neg(call("rsqrt", vec![bin(Bin::Sub, num(1.0), mul(a.clone(), a))]))),
                    "atan" => one(div(num(1.0), bin(Bin::Add, num(1.0), mul(a.clone(), a)))),
                    "erf" | "erfc" => {
                        let g = mul(num(std::f64::consts::FRAC_2_SQRT_PI), call("exp", vec![neg(mul(a.clone(), a))]));
                        one(if f == "erf" { g } else { neg(g) })
                    }
                    "fabs" => one(Expr::Select(Box::new(bin(Bin::Ge, a, num(0.0))), Box::new(num(1.0)), Box::new(num(-1.0)))),
                    "sigmoid" => {
                        let s = call("sigmoid", vec![a]);
                        one(mul(s.clone(), bin(Bin::Sub, num(1.0), s)))
                    }
                    "floor" | "ceil" | "round" | "trunc" => None,
                    "atan2" => {
                        let den = bin(Bin::Add, mul(a.clone(), a.clone()), mul(b.clone(), b.clone()));
                        let ta = da.map(|da| mul(b.clone(), da));
                        let tb = db.map(|db| neg(mul(a.clone(), db)));
                        add_opt(ta, tb).map(|t| div(t, den))
                    }
                    "pow" => {
                        let ta = da.map(|da| mul(mul(b.clone(), call("pow", vec![a.clone(), bin(Bin::Sub, b.clone(), num(1.0))])), da));
                        let tb = db.map(|db| mul(mul(call("pow", vec![a.clone(), b.clone()]), call("log", vec![a.clone()])), db));
                        add_opt(ta, tb)
                    }
                    // Ties: `fmax`/`fmin` to the first (as torch.fmax), `max`/`min`
                    // half to each (as torch.maximum).
                    "fmax" => select(bin(Bin::Ge, a, b), da, db),
                    "fmin" => select(bin(Bin::Le, a, b), da, db),
                    "max" | "min" => {
                        let (wins, loses) = if f == "max" { (Bin::Gt, Bin::Lt) } else { (Bin::Lt, Bin::Gt) };
                        let tie = add_opt(da.clone(), db.clone()).map(|s| mul(num(0.5), s));
                        let rest = select(bin(loses, a.clone(), b.clone()), db, tie);
                        select(bin(wins, a, b), da, rest)
                    }
                    "fmod" => add_opt(da, db.map(|db| neg(mul(call("trunc", vec![div(a, b)]), db)))),
                    _ => None,
                }
            }
            Expr::Unary(Un::Neg, a) => self.d(a).map(neg),
            Expr::Unary(Un::Not, a) => {
                self.d(a);
                None
            }
            Expr::Binary(op, a, b) => {
                let (da, db) = (self.d(a), self.d(b));
                let (a, b) = ((**a).clone(), (**b).clone());
                match op {
                    Bin::Add => add_opt(da, db),
                    Bin::Sub => add_opt(da, db.map(neg)),
                    Bin::Mul => add_opt(da.map(|da| mul(da, b.clone())), db.map(|db| mul(a.clone(), db))),
                    Bin::Div => {
                        add_opt(da.map(|da| div(da, b.clone())), db.map(|db| neg(div(mul(a.clone(), db), mul(b.clone(), b.clone())))))
                    }
                    Bin::Rem => da,
                    _ => None,
                }
            }
            Expr::Select(c, a, b) => {
                self.d(c);
                let (da, db) = (self.d(a), self.d(b));
                select((**c).clone(), da, db)
            }
        }
    }
}

/// Every tensor read of `e`, in the order [`Diff`] counts them: (name, index expressions).
fn reads<'e>(e: &'e Expr, is_tensor: &dyn Fn(&str) -> bool, out: &mut Vec<(&'e str, &'e [Expr])>) {
    match e {
        Expr::Num { .. } => {}
        Expr::Name(n, _) => {
            if is_tensor(n) {
                out.push((n, &[]));
            }
        }
        Expr::Call(f, args, _) if is_tensor(f) => out.push((f, args)),
        Expr::Call(_, args, _) => args.iter().for_each(|a| reads(a, is_tensor, out)),
        Expr::Unary(_, a) => reads(a, is_tensor, out),
        Expr::Binary(_, a, b) => {
            reads(a, is_tensor, out);
            reads(b, is_tensor, out);
        }
        Expr::Select(c, a, b) => {
            reads(c, is_tensor, out);
            reads(a, is_tensor, out);
            reads(b, is_tensor, out);
        }
    }
}

/// `e` with every tensor name renamed by `map`.
fn rename(e: &Expr, map: &dyn Fn(&str) -> Option<String>) -> Expr {
    match e {
        Expr::Num { .. } => e.clone(),
        Expr::Name(n, p) => Expr::Name(map(n).unwrap_or_else(|| n.clone()), *p),
        Expr::Call(f, args, p) => Expr::Call(map(f).unwrap_or_else(|| f.clone()), args.iter().map(|a| rename(a, map)).collect(), *p),
        Expr::Unary(op, a) => Expr::Unary(*op, Box::new(rename(a, map))),
        Expr::Binary(op, a, b) => Expr::Binary(*op, Box::new(rename(a, map)), Box::new(rename(b, map))),
        Expr::Select(c, a, b) => Expr::Select(Box::new(rename(c, map)), Box::new(rename(a, map)), Box::new(rename(b, map))),
    }
}

/// An index expression (affine in indices and sizes) as an [`Affine`].
fn affine_of(e: &Expr, symbols: &BTreeSet<String>) -> Affine {
    let classify = |n: &str| if symbols.contains(n) { super::check::Name::Size } else { super::check::Name::Index };
    super::check::affine_of(e, &classify).unwrap_or(Affine { vars: BTreeMap::new(), konst: Size::default() })
}

fn plain(v: &str) -> Affine {
    Affine { vars: BTreeMap::from([(v.to_owned(), 1)]), konst: Size::default() }
}

fn access_text(name: &str, vars: &[String]) -> String {
    format!("{name}({})", vars.join(", "))
}

/// Builds the backward's statements against its tensors, by name.
struct Builder {
    params: Vec<Param>,
    outputs: Vec<Output>,
    symbols: BTreeSet<String>,
    stmts: Vec<Statement>,
}

impl Builder {
    fn tensor(&self, name: &str) -> Option<TensorRef> {
        if let Some(i) = self.params.iter().position(|p| p.name == name) {
            return Some(TensorRef::Param(i));
        }
        self.outputs.iter().position(|o| o.name == name).map(TensorRef::Output)
    }
    fn is_float(&self, name: &str) -> bool {
        match self.tensor(name) {
            Some(TensorRef::Param(i)) => self.params[i].ty == ElemType::Float,
            Some(TensorRef::Output(i)) => self.outputs[i].ty == OutType::Float,
            None => false,
        }
    }
    fn out(&self, name: &str) -> usize {
        match self.tensor(name) {
            Some(TensorRef::Output(i)) => i,
            _ => unreachable!("`{name}` is an output of the backward"),
        }
    }

    /// The accesses of `rhs` (reads), then the written one.
    fn accesses(&self, rhs: &Expr, written: Access) -> Vec<Access> {
        let mut rs = Vec::new();
        reads(rhs, &|n| self.tensor(n).is_some(), &mut rs);
        let mut out: Vec<Access> = rs
            .into_iter()
            .map(|(n, args)| Access {
                tensor: self.tensor(n).unwrap_or(TensorRef::Param(0)),
                index: args.iter().map(|a| affine_of(a, &self.symbols)).collect(),
                text: if args.is_empty() {
                    n.to_owned()
                } else {
                    format!("{n}({})", args.iter().map(Expr::text).collect::<Vec<_>>().join(", "))
                },
            })
            .collect();
        out.push(written);
        out
    }

    /// `out(lhs) op rhs` over `ranges`, reducing over `reduced`.
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &mut self,
        out: &str,
        lhs: Vec<String>,
        reduced: Vec<String>,
        ranges: BTreeMap<String, (Size, Size)>,
        op: Op,
        init: bool,
        rhs: Expr,
    ) {
        let o = self.out(out);
        let written = Access { tensor: TensorRef::Output(o), index: lhs.iter().map(|v| plain(v)).collect(), text: access_text(out, &lhs) };
        let accesses = self.accesses(&rhs, written);
        let text = format!("{} {} {}", access_text(out, &lhs), op.text(init), rhs.text());
        self.stmts.push(Statement { out: o, lhs, reduced, ranges, op, init, rhs, accesses, text, scatter: None });
    }

    /// `out(index) += rhs` for every value of `vars`, one after the other.
    fn scatter(&mut self, out: &str, index: &[Expr], vars: Vec<String>, ranges: BTreeMap<String, (Size, Size)>, rhs: Expr) {
        let o = self.out(out);
        let ix: Vec<Affine> = index.iter().map(|a| affine_of(a, &self.symbols)).collect();
        let text_ix = index.iter().map(Expr::text).collect::<Vec<_>>().join(", ");
        let written = Access { tensor: TensorRef::Output(o), index: ix.clone(), text: format!("{out}({text_ix})") };
        let accesses = self.accesses(&rhs, written);
        let text = format!("{out}({text_ix}) += {} (scattered)", rhs.text());
        self.stmts.push(Statement {
            out: o,
            lhs: Vec::new(),
            reduced: vars,
            ranges,
            op: Op::Add,
            init: false,
            rhs,
            accesses,
            text,
            scatter: Some(ix),
        });
    }

    /// `out(z0, z1, ...) = rhs(z...)` over `out`'s whole shape.
    fn fill(&mut self, out: &str, fresh: &[String], rhs: impl Fn(&[String]) -> Expr) {
        let o = self.out(out);
        let dims = self.outputs[o].dims.clone();
        let vars: Vec<String> = fresh[..dims.len()].to_vec();
        let ranges = vars.iter().zip(&dims).map(|(v, d)| (v.clone(), (Size::c(0), d.clone()))).collect();
        let rhs = rhs(&vars);
        self.gather(out, vars, Vec::new(), ranges, Op::Assign, false, rhs);
    }
}

fn read(name: &str, vars: &[String]) -> Expr {
    if vars.is_empty() {
        Expr::Name(name.to_owned(), Pos::default())
    } else {
        call(name, vars.iter().map(|v| Expr::Name(v.clone(), Pos::default())).collect())
    }
}

/// The backward of `c`, or why there is none.
pub fn derive(c: &Checked) -> Result<Checked, Why> {
    if !c.has_float {
        return Err(format!("`{}` has no floating-point input to differentiate", c.name));
    }
    writes_whole(c)?;
    let mut l = layout(c)?;
    let symbols: BTreeSet<String> = c.symbols.iter().map(|(s, ..)| s.clone()).collect();
    let mut b = Builder { params: std::mem::take(&mut l.params), outputs: std::mem::take(&mut l.outputs), symbols, stmts: Vec::new() };
    let fw = forward(c, &l, &mut b)?;
    let (gbuf, grad_out, grad_in, fresh_vars) = (&l.gbuf, &l.grad_out, &l.grad_in, &l.fresh_vars);
    let latest = &fw.latest;
    // The gradients' start: the outputs' gradients for their final
    // versions, zero for the others and for the inputs' gradients.
    for (k, s) in c.stmts.iter().enumerate() {
        if let Some(g) = &gbuf[k] {
            if latest[s.out] == Some(k) {
                let given = grad_out[s.out].clone();
                b.fill(g, fresh_vars, |z| read(&given, z));
            } else {
                b.fill(g, fresh_vars, |_| num(0.0));
            }
        }
    }
    for g in grad_in.iter().flatten() {
        b.fill(g, fresh_vars, |_| num(0.0));
    }
    // The statements in reverse.
    for (k, s) in c.stmts.iter().enumerate().rev() {
        backward_of(c, k, s, &l, &fw, &mut b);
    }
    let tensors = b.params.len() + b.outputs.len();
    if tensors > dlbridge_registry::signature::MAX_PARAMS {
        return Err(format!(
            "the backward of `{}` needs {tensors} tensors (inputs, gradients, a version of each statement's output), more than a kernel takes ({}): write fewer statements per output, or give a backward",
            c.name,
            dlbridge_registry::signature::MAX_PARAMS
        ));
    }
    let name = format!("{}_backward", c.name);
    let text =
        format!("# the backward of `{}`, derived\n{}", c.name, b.stmts.iter().map(|s| s.text.clone()).collect::<Vec<_>>().join("\n"));
    Ok(Checked { name, params: b.params, outputs: b.outputs, stmts: b.stmts, symbols: c.symbols.clone(), has_float: true, text })
}

/// Every statement after an output's first must write all of it.
fn writes_whole(c: &Checked) -> Result<(), Why> {
    let mut first = vec![true; c.outputs.len()];
    for s in &c.stmts {
        let o = &c.outputs[s.out];
        if !first[s.out] {
            for (v, d) in s.lhs.iter().zip(&o.dims) {
                let (lo, hi) = &s.ranges[v];
                if lo != &Size::c(0) || hi != d {
                    return Err(format!(
                        "`{}` writes only part of `{}`: a backward is derived for statements that write all of it",
                        s.text, o.name
                    ));
                }
            }
        }
        first[s.out] = false;
    }
    Ok(())
}

/// The tensors the backward takes and writes beyond the definition's own:
/// the outputs' gradients (parameters), the inputs' gradients, a version of
/// each statement's output with its gradient, and the counts `*=`, `max=`
/// and `min=` need; with fresh index names for filling them.
struct Layout {
    params: Vec<Param>,
    outputs: Vec<Output>,
    grad_out: Vec<String>,
    grad_in: Vec<Option<String>>,
    version: Vec<String>,
    gbuf: Vec<Option<String>>,
    /// Per `*=` statement: the scratch tensors counting its zero factors and
    /// holding the product of the others; per `max=`/`min=` statement: the
    /// one counting the ties for the result.
    counts: Vec<Option<(String, Option<String>)>>,
    fresh_vars: Vec<String>,
}

fn layout(c: &Checked) -> Result<Layout, Why> {
    let mut used: BTreeSet<String> = c.params.iter().map(|p| p.name.clone()).collect();
    used.extend(c.outputs.iter().map(|o| o.name.clone()));
    used.extend(c.symbols.iter().map(|(s, ..)| s.clone()));
    for s in &c.stmts {
        used.extend(s.ranges.keys().cloned());
    }
    // `want`, or `want_2`, ... where the definition (or the backward so far) uses it.
    let fresh_name = |want: String, used: &mut BTreeSet<String>| -> Result<String, Why> {
        let name =
            if used.contains(&want) { (2u32..).map(|k| format!("{want}_{k}")).find(|n| !used.contains(n)).unwrap_or(want) } else { want };
        used.insert(name.clone());
        Ok(name)
    };
    let mut params = c.params.clone();
    let mut grad_out = Vec::new();
    for o in &c.outputs {
        let name = fresh_name(format!("grad_{}", o.name), &mut used)?;
        let ty = match o.ty {
            OutType::Float => ElemType::Float,
            OutType::Fixed(d) => ElemType::Fixed(d),
        };
        params.push(Param { name: name.clone(), ty, dims: o.dims.clone() });
        grad_out.push(name);
    }
    let mut outputs = Vec::new();
    let mut grad_in: Vec<Option<String>> = Vec::new();
    for p in &c.params {
        if p.ty == ElemType::Float {
            let name = fresh_name(format!("grad_{}", p.name), &mut used)?;
            outputs.push(Output { name: name.clone(), ty: OutType::Float, dims: p.dims.clone() });
            grad_in.push(Some(name));
        } else {
            grad_in.push(None);
        }
    }
    let mut version = Vec::new();
    let mut gbuf = Vec::new();
    // Per `*=` statement: how many of its factors are zero and the product
    // of the others; per `max=`/`min=` statement: how many tie for the
    // result.
    let mut counts: Vec<Option<(String, Option<String>)>> = Vec::new();
    for (k, s) in c.stmts.iter().enumerate() {
        let o = &c.outputs[s.out];
        let v = fresh_name(format!("v{k}_{}", o.name), &mut used)?;
        outputs.push(Output { name: v.clone(), ty: o.ty, dims: o.dims.clone() });
        version.push(v);
        if o.ty == OutType::Float {
            let g = fresh_name(format!("g{k}_{}", o.name), &mut used)?;
            outputs.push(Output { name: g.clone(), ty: OutType::Float, dims: o.dims.clone() });
            gbuf.push(Some(g));
            let scratch = |name: String, used: &mut BTreeSet<String>, outputs: &mut Vec<Output>| -> Result<String, Why> {
                let name = fresh_name(name, used)?;
                outputs.push(Output { name: name.clone(), ty: OutType::Float, dims: o.dims.clone() });
                Ok(name)
            };
            counts.push(match s.op {
                Op::Mul => Some((
                    scratch(format!("n{k}_{}", o.name), &mut used, &mut outputs)?,
                    Some(scratch(format!("p{k}_{}", o.name), &mut used, &mut outputs)?),
                )),
                Op::Max | Op::Min => Some((scratch(format!("n{k}_{}", o.name), &mut used, &mut outputs)?, None)),
                Op::Assign | Op::Add => None,
            });
        } else {
            gbuf.push(None);
            counts.push(None);
        }
    }
    let max_rank = c.outputs.iter().map(|o| o.dims.len()).chain(c.params.iter().map(|p| p.dims.len())).max().unwrap_or(0);
    let mut fresh_vars = Vec::new();
    for d in 0..max_rank {
        fresh_vars.push(fresh_name(format!("z{d}"), &mut used)?);
    }
    Ok(Layout { params, outputs, grad_out, grad_in, version, gbuf, counts, fresh_vars })
}

/// The forward as the backward runs it: which statement last wrote each
/// output (`latest`), the version each accumulating statement starts from
/// (`prev_of`) and each statement's right side over versions (`rhs_v`).
struct Forward {
    latest: Vec<Option<usize>>,
    prev_of: Vec<Option<usize>>,
    rhs_v: Vec<Expr>,
}

/// The forward, each statement writing a version of its own.
fn forward(c: &Checked, l: &Layout, b: &mut Builder) -> Result<Forward, Why> {
    let version = &l.version;
    let mut latest: Vec<Option<usize>> = vec![None; c.outputs.len()];
    let mut prev_of: Vec<Option<usize>> = vec![None; c.stmts.len()];
    let mut rhs_v: Vec<Expr> = Vec::new();
    for (k, s) in c.stmts.iter().enumerate() {
        let at = latest.clone();
        let map = |n: &str| c.outputs.iter().position(|o| o.name == n).and_then(|o| at[o]).map(|j| version[j].clone());
        let rhs = rename(&s.rhs, &map);
        if !s.init && s.op != Op::Assign {
            let j = latest[s.out].ok_or_else(|| format!("`{}` starts from an unset value", s.text))?;
            prev_of[k] = Some(j);
            let lhs_ranges = s.lhs.iter().map(|v| (v.clone(), s.ranges[v].clone())).collect();
            b.gather(&version[k], s.lhs.clone(), Vec::new(), lhs_ranges, Op::Assign, false, read(&version[j], &s.lhs));
        }
        b.gather(&version[k], s.lhs.clone(), s.reduced.clone(), s.ranges.clone(), s.op, s.init, rhs.clone());
        latest[s.out] = Some(k);
        rhs_v.push(rhs);
    }
    Ok(Forward { latest, prev_of, rhs_v })
}

/// The backward of statement `k`: its gradient carried to what it reads and
/// to the version it started from.
fn backward_of(c: &Checked, k: usize, s: &Statement, l: &Layout, fw: &Forward, b: &mut Builder) {
    let (version, gbuf, grad_in, counts) = (&l.version, &l.gbuf, &l.grad_in, &l.counts);
    let (prev_of, rhs_v) = (&fw.prev_of, &fw.rhs_v);
    let version_index = |n: &str| version.iter().position(|v| v == n);
    let Some(gk) = gbuf[k].clone() else { return };
    let rhs = &rhs_v[k];
    let vk = read(&version[k], &s.lhs);
    let gk_read = read(&gk, &s.lhs);
    let names: BTreeSet<String> = b.params.iter().map(|p| p.name.clone()).chain(b.outputs.iter().map(|o| o.name.clone())).collect();
    let is_tensor = |n: &str| names.contains(n);
    let mut rs = Vec::new();
    reads(rhs, &is_tensor, &mut rs);
    let all_vars: Vec<String> = s.lhs.iter().chain(&s.reduced).cloned().collect();
    let lhs_ranges: BTreeMap<String, (Size, Size)> = s.lhs.iter().map(|v| (v.clone(), s.ranges[v].clone())).collect();
    let vj = prev_of[k].map(|j| read(&version[j], &s.lhs));
    let eq = |a: Expr, b: Expr| bin(Bin::Eq, a, b);
    let pick = |c: Expr, a: Expr, b: Expr| Expr::Select(Box::new(c), Box::new(a), Box::new(b));
    // The derivative of the statement's result with respect to one of
    // its factors (`*=`) or candidates (`max=`, `min=`): `x`.
    let mut of_result: Box<dyn Fn(&Expr) -> Expr> = Box::new(|_| num(1.0));
    if let Some((n, p)) = counts[k].clone() {
        let (nr, start_n) = (read(&n, &s.lhs), |x: &Expr| pick(eq(x.clone(), num(0.0)), num(1.0), num(0.0)));
        match (s.op, p) {
            // The product of the others: the result over `x` where no
            // factor is zero; where one is, the product of the others
            // for that one and 0 for the rest; 0 where more are.
            (Op::Mul, Some(p)) => {
                let pr = read(&p, &s.lhs);
                b.gather(&n, s.lhs.clone(), Vec::new(), lhs_ranges.clone(), Op::Assign, false, vj.as_ref().map_or(num(0.0), start_n));
                let p0 = vj.as_ref().map_or(num(1.0), |vj| pick(eq(vj.clone(), num(0.0)), num(1.0), vj.clone()));
                b.gather(&p, s.lhs.clone(), Vec::new(), lhs_ranges.clone(), Op::Assign, false, p0);
                b.gather(&n, s.lhs.clone(), s.reduced.clone(), s.ranges.clone(), Op::Add, false, start_n(rhs));
                b.gather(
                    &p,
                    s.lhs.clone(),
                    s.reduced.clone(),
                    s.ranges.clone(),
                    Op::Mul,
                    false,
                    pick(eq(rhs.clone(), num(0.0)), num(1.0), rhs.clone()),
                );
                let vk = vk.clone();
                of_result = Box::new(move |x: &Expr| {
                    let lone = pick(eq(nr.clone(), num(1.0)), pr.clone(), num(0.0));
                    let none = pick(eq(nr.clone(), num(0.0)), div(vk.clone(), x.clone()), num(0.0));
                    pick(eq(x.clone(), num(0.0)), lone, none)
                });
            }
            // Ties share the gradient evenly (as torch's amax).
            _ => {
                let tie = |x: &Expr| pick(eq(x.clone(), vk.clone()), num(1.0), num(0.0));
                b.gather(&n, s.lhs.clone(), Vec::new(), lhs_ranges.clone(), Op::Assign, false, vj.as_ref().map_or(num(0.0), tie));
                b.gather(&n, s.lhs.clone(), s.reduced.clone(), s.ranges.clone(), Op::Add, false, tie(rhs));
                let vk = vk.clone();
                of_result = Box::new(move |x: &Expr| pick(eq(x.clone(), vk.clone()), div(num(1.0), nr.clone()), num(0.0)));
            }
        }
    }
    // Reads of the same element (`A(i) * A(i)`) share one derivative
    // and one statement of the backward.
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (r, (name, args)) in rs.iter().enumerate() {
        let key = format!("{name}({})", args.iter().map(Expr::text).collect::<Vec<_>>().join(", "));
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(r),
            None => groups.push((key, vec![r])),
        }
    }
    for (_, members) in &groups {
        let (name, args) = rs[members[0]];
        let target = match (c.params.iter().position(|p| p.name == name), version_index(name)) {
            (Some(p), _) => grad_in[p].clone(),
            (None, Some(j)) => gbuf[j].clone(),
            _ => None,
        };
        let Some(target) = target else { continue };
        if !b.is_float(name) {
            continue;
        }
        let mut d = Diff { targets: members, seen: 0, is_tensor: &is_tensor };
        let Some(dr) = d.d(rhs) else { continue };
        let factor = match s.op {
            Op::Assign | Op::Add => dr,
            Op::Mul | Op::Max | Op::Min => mul(of_result(rhs), dr),
        };
        let value = mul(gk_read.clone(), factor);
        let index_vars: Option<Vec<String>> = args
            .iter()
            .map(|a| match a {
                Expr::Name(v, _) if !b.symbols.contains(v) && all_vars.contains(v) => Some(v.clone()),
                _ => None,
            })
            .collect();
        match index_vars {
            Some(vars) if vars.iter().collect::<BTreeSet<_>>().len() == vars.len() => {
                let reduced: Vec<String> = all_vars.iter().filter(|v| !vars.contains(v)).cloned().collect();
                b.gather(&target, vars, reduced, s.ranges.clone(), Op::Add, false, value);
            }
            _ => b.scatter(&target, args, all_vars.clone(), s.ranges.clone(), value),
        }
    }
    if let Some(j) = prev_of[k]
        && let Some(gj) = gbuf[j].clone()
        && let Some(vj) = &vj
    {
        let factor = match s.op {
            Op::Assign | Op::Add => num(1.0),
            Op::Mul | Op::Max | Op::Min => of_result(vj),
        };
        b.gather(&gj, s.lhs.clone(), Vec::new(), lhs_ranges, Op::Add, false, mul(gk_read.clone(), factor));
    }
}

#[cfg(test)]
mod tests {
    use super::super::check::check;
    use super::super::parse::parse;
    use super::*;

    fn backward(text: &str) -> Checked {
        derive(&check(&parse(text).unwrap()[0], text).unwrap()).unwrap()
    }

    #[test]
    fn matmul_gathers_both_gradients() {
        let b = backward("def matmul(float(M,N) A, float(N,K) B) -> (output) { output(i, j) +=! A(i, kk) * B(kk, j) }");
        let texts: Vec<&str> = b.stmts.iter().map(|s| s.text.as_str()).collect();
        assert!(texts.contains(&"grad_A(i, kk) += g0_output(i, j) * B(kk, j)"), "{texts:#?}");
        assert!(texts.contains(&"grad_B(kk, j) += g0_output(i, j) * A(i, kk)"), "{texts:#?}");
        assert_eq!(b.outputs[0].name, "grad_A");
        assert_eq!(b.outputs[1].name, "grad_B");
    }

    #[test]
    fn convolution_scatters_into_its_input() {
        let b = backward(
            "def conv(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) { O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * W1(m, c, kh, kw) }",
        );
        let s = b.stmts.iter().find(|s| s.text.starts_with("grad_I") && s.text.contains("+=")).unwrap();
        assert!(s.scatter.is_some(), "{}", s.text);
        let s = b.stmts.iter().find(|s| s.text.starts_with("grad_W1") && s.text.contains("+=")).unwrap();
        assert!(s.scatter.is_none(), "{}", s.text);
    }

    #[test]
    fn the_derivative_of_builtins_and_quotients() {
        let e = parse("def f(float(N) A) -> (O) { O(i) = exp(A(i)) / A(i) }").unwrap();
        let rhs = &e[0].stmts[0].rhs;
        let t = |n: &str| n == "A";
        let d0 = Diff { targets: &[0], seen: 0, is_tensor: &t }.clone_d(rhs);
        assert_eq!(d0.unwrap().text(), "exp(A(i)) / A(i)");
        let d1 = Diff { targets: &[1], seen: 0, is_tensor: &t }.clone_d(rhs);
        assert_eq!(d1.unwrap().text(), "-(exp(A(i)) / (A(i) * A(i)))");
        let both = Diff { targets: &[0, 1], seen: 0, is_tensor: &t }.clone_d(rhs);
        assert_eq!(both.unwrap().text(), "exp(A(i)) / A(i) + -(exp(A(i)) / (A(i) * A(i)))");
    }

    #[test]
    fn reads_of_one_element_share_a_statement() {
        let b = backward("def f(float(N) A, float(N) B) -> (O) { O(i) = A(i) * A(i) + A(i) * B(i) + A(i + 0) }");
        let grads: Vec<&str> =
            b.stmts.iter().filter(|s| s.text.starts_with("grad_A") && s.text.contains("+=")).map(|s| s.text.as_str()).collect();
        // `A(i)` three times, `A(i + 0)` once: two statements.
        assert_eq!(grads.len(), 2, "{grads:?}");
        assert!(grads[0].contains("A(i) + A(i)"), "{}", grads[0]);
        let grads_b = b.stmts.iter().filter(|s| s.text.starts_with("grad_B") && s.text.contains("+=")).count();
        assert_eq!(grads_b, 1);
    }

    impl Diff<'_> {
        fn clone_d(mut self, e: &Expr) -> Option<Expr> {
            self.d(e)
        }
    }
}

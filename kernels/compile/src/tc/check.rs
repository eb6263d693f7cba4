//! A parsed definition checked: names resolved, index expressions made
//! affine, every index's range inferred as Tensor Comprehensions infers it,
//! the outputs' shapes and types derived.
//!
//! # Ranges
//! An index on the left of a statement is an output index; one only on the
//! right is a reduction index. `where i in lo:hi` gives a range outright.
//! The others are inferred in rounds: in each round, an index whose every
//! other index in some access `A(..., a·i + rest, ...)` is known gets the
//! largest range that keeps each such access within `A`'s size along that
//! dim (`0 <= a·i + rest < D` for every value of `rest`); the ranges found in
//! one round are intersected and become known for the next. An index still
//! unknown when a round finds nothing is an error naming it and its accesses.
//! An output's shape is the upper end of each of its indices' ranges (TC's
//! prepareOutputs). Every access is also checked against its tensor's sizes
//! when the kernel runs, so a range that the accesses do not bound (an
//! index that reaches past a tensor through a `where`) is an error, never a
//! read out of bounds.

use std::collections::{BTreeMap, BTreeSet};

use dlbridge_core::{DType, DTypeCode, Result};

use super::parse::{Bin, Def, DimDecl, ElemType, Expr, Op, Pos, Un, error_at};
use super::size::{self, Size};
use dlbridge_registry::signature::{MAX_PARAMS, MAX_SYMBOLS};

/// The scalar functions a definition may call, with their arity.
pub const BUILTINS: &[(&str, usize)] = &[
    ("exp", 1),
    ("expm1", 1),
    ("log", 1),
    ("log1p", 1),
    ("log2", 1),
    ("log10", 1),
    ("sqrt", 1),
    ("rsqrt", 1),
    ("cbrt", 1),
    ("tanh", 1),
    ("sinh", 1),
    ("cosh", 1),
    ("tan", 1),
    ("sin", 1),
    ("cos", 1),
    ("asin", 1),
    ("acos", 1),
    ("atan", 1),
    ("erf", 1),
    ("erfc", 1),
    ("fabs", 1),
    ("floor", 1),
    ("ceil", 1),
    ("round", 1),
    ("trunc", 1),
    ("sigmoid", 1),
    ("atan2", 2),
    ("pow", 2),
    ("fmax", 2),
    ("fmin", 2),
    ("fmod", 2),
    ("max", 2),
    ("min", 2),
];

/// A tensor a statement reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorRef {
    Param(usize),
    Output(usize),
}

/// An index expression: `Σ a·index + (a size: `K / 2`, `H - KH`)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Affine {
    pub vars: BTreeMap<String, i64>,
    pub konst: Size,
}

/// One access `A(e0, e1, ...)`.
#[derive(Debug, Clone)]
pub struct Access {
    pub tensor: TensorRef,
    pub index: Vec<Affine>,
    /// `A(i, kk)`, for messages.
    pub text: String,
}

/// A checked statement.
#[derive(Debug, Clone)]
pub struct Statement {
    pub out: usize,
    /// Output indices, in the left side's order.
    pub lhs: Vec<String>,
    /// Reduction indices, in order of first use.
    pub reduced: Vec<String>,
    /// `[lo, hi)` of every index.
    pub ranges: BTreeMap<String, (Size, Size)>,
    pub op: Op,
    pub init: bool,
    pub rhs: Expr,
    /// Every access on the right, and the left one.
    pub accesses: Vec<Access>,
    pub text: String,
    /// A derived gradient's scatter: the written element's index (affine in
    /// the indices, which all loop in `reduced`); each iteration adds `rhs`
    /// there, one after the other.
    pub scatter: Option<Vec<Affine>>,
}

/// An output's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutType {
    /// The definition's floating type (`T`, or `f32` without float inputs).
    Float,
    Fixed(DType),
}

/// A checked output.
#[derive(Debug, Clone)]
pub struct Output {
    pub name: String,
    pub ty: OutType,
    pub dims: Vec<Size>,
}

/// A checked parameter.
#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub ty: ElemType,
    /// Its sizes: a symbol or number where the text declares it (a derived
    /// gradient's parameter may have a computed size, like its output's).
    pub dims: Vec<Size>,
}

/// A checked definition.
#[derive(Debug, Clone)]
pub struct Checked {
    pub name: String,
    pub params: Vec<Param>,
    pub outputs: Vec<Output>,
    pub stmts: Vec<Statement>,
    /// Size symbols in order of first appearance, each with where it is
    /// read from (parameter, dim).
    pub symbols: Vec<(String, usize, usize)>,
    /// Whether a parameter has the floating type (then `T` is a type variable).
    pub has_float: bool,
    pub text: String,
}

impl Checked {
    pub fn tensor_name(&self, t: TensorRef) -> &str {
        match t {
            TensorRef::Param(i) => &self.params[i].name,
            TensorRef::Output(i) => &self.outputs[i].name,
        }
    }
    /// The size of tensor `t` along dim `d`.
    pub fn dim(&self, t: TensorRef, d: usize) -> Size {
        match t {
            TensorRef::Param(i) => self.params[i].dims[d].clone(),
            TensorRef::Output(i) => self.outputs[i].dims[d].clone(),
        }
    }
    pub fn rank(&self, t: TensorRef) -> usize {
        match t {
            TensorRef::Param(i) => self.params[i].dims.len(),
            TensorRef::Output(i) => self.outputs[i].dims.len(),
        }
    }
    pub fn is_float(&self, t: TensorRef) -> bool {
        match t {
            TensorRef::Param(i) => self.params[i].ty == ElemType::Float,
            TensorRef::Output(i) => self.outputs[i].ty == OutType::Float,
        }
    }
}

fn decl_size(d: &DimDecl) -> Size {
    match d {
        DimDecl::Sym(s, _) => Size::sym(s),
        DimDecl::Int(n) => Size::c(*n),
    }
}

/// What a name in a statement is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name {
    Index,
    Size,
    Tensor(TensorRef),
}

struct Ctx<'d> {
    def: &'d Def,
    text: &'d str,
    params: Vec<Param>,
    outputs: Vec<Option<Output>>,
    symbols: Vec<(String, usize, usize)>,
}

impl Ctx<'_> {
    fn err(&self, pos: Pos, message: impl std::fmt::Display) -> dlbridge_core::Error {
        error_at(self.text, pos, format!("def {}: {message}", self.def.name))
    }
    /// A statement whose index arithmetic leaves the bounds the generated code computes in.
    fn too_big(&self, s: &super::parse::Stmt) -> dlbridge_core::Error {
        let message = format!(
            "in `{}`: the index arithmetic uses numbers beyond {} (coefficients, offsets or ranges)",
            s.text,
            size::MAX_COEFFICIENT
        );
        self.err(s.pos, message)
    }
    fn is_symbol(&self, n: &str) -> bool {
        self.symbols.iter().any(|(s, ..)| s == n)
    }
    fn tensor(&self, n: &str) -> Option<TensorRef> {
        if let Some(i) = self.params.iter().position(|p| p.name == n) {
            return Some(TensorRef::Param(i));
        }
        self.def.outputs.iter().position(|o| o.name == n).map(TensorRef::Output)
    }
    fn rank(&self, t: TensorRef) -> Option<usize> {
        match t {
            TensorRef::Param(i) => Some(self.params[i].dims.len()),
            TensorRef::Output(i) => self.outputs[i].as_ref().map(|o| o.dims.len()),
        }
    }
    fn dim(&self, t: TensorRef, d: usize) -> Size {
        match t {
            TensorRef::Param(i) => self.params[i].dims[d].clone(),
            TensorRef::Output(i) => self.outputs[i].as_ref().map_or(Size::c(0), |o| o.dims[d].clone()),
        }
    }
    fn classify(&self, n: &str) -> Name {
        if let Some(t) = self.tensor(n) {
            return Name::Tensor(t);
        }
        if self.is_symbol(n) { Name::Size } else { Name::Index }
    }
}

/// Checks one parsed definition.
pub fn check(def: &Def, text: &str) -> Result<Checked> {
    let mut cx = Ctx { def, text, params: Vec::new(), outputs: vec![None; def.outputs.len()], symbols: Vec::new() };
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for (pi, p) in def.params.iter().enumerate() {
        if !seen.insert(&p.name) {
            return Err(cx.err(p.pos, format!("parameter `{}` is declared twice", p.name)));
        }
        for (d, dim) in p.dims.iter().enumerate() {
            match dim {
                DimDecl::Sym(s, _) if !cx.is_symbol(s) => cx.symbols.push((s.clone(), pi, d)),
                DimDecl::Int(n) if *n < 0 => return Err(cx.err(p.pos, format!("parameter `{}` has a negative size", p.name))),
                _ => {}
            }
        }
        cx.params.push(Param { name: p.name.clone(), ty: p.ty, dims: p.dims.iter().map(decl_size).collect() });
    }
    for o in &def.outputs {
        if !seen.insert(&o.name) {
            return Err(cx.err(o.pos, format!("`{}` is both a parameter and an output, or an output twice", o.name)));
        }
        if cx.is_symbol(&o.name) {
            return Err(cx.err(o.pos, format!("output `{}` has the name of a size symbol", o.name)));
        }
        if let Some(d) = &o.decl {
            for dim in &d.dims {
                if let DimDecl::Sym(s, p) = dim
                    && !cx.is_symbol(s)
                {
                    return Err(cx.err(*p, format!("output `{}`: size `{s}` is not a size of any parameter", o.name)));
                }
            }
        }
    }
    if def.stmts.is_empty() {
        return Err(cx.err(def.pos, "the definition has no statements"));
    }
    let tensors = def.params.len() + def.outputs.len();
    if tensors > MAX_PARAMS {
        return Err(cx.err(def.pos, format!("{tensors} parameters and outputs; a kernel takes at most {MAX_PARAMS} together")));
    }
    if cx.symbols.len() > MAX_SYMBOLS {
        return Err(cx.err(def.pos, format!("{} size symbols; a kernel takes at most {MAX_SYMBOLS}", cx.symbols.len())));
    }
    let mut stmts = Vec::new();
    for s in &def.stmts {
        stmts.push(check_stmt(&mut cx, s)?);
    }
    let mut outputs = Vec::new();
    for (o, decl) in cx.outputs.iter().zip(&def.outputs) {
        match o {
            Some(o) => outputs.push(o.clone()),
            None => return Err(cx.err(decl.pos, format!("output `{}` is never written", decl.name))),
        }
    }
    let has_float = cx.params.iter().any(|p| p.ty == ElemType::Float);
    Ok(Checked { name: def.name.clone(), params: cx.params, outputs, stmts, symbols: cx.symbols, has_float, text: def.text.clone() })
}

/// The names of `e` by kind, in order of first appearance.
fn walk<'e>(e: &'e Expr, f: &mut dyn FnMut(&'e Expr)) {
    f(e);
    match e {
        Expr::Num { .. } | Expr::Name(..) => {}
        Expr::Call(_, args, _) => args.iter().for_each(|a| walk(a, f)),
        Expr::Unary(_, a) => walk(a, f),
        Expr::Binary(_, a, b) => {
            walk(a, f);
            walk(b, f);
        }
        Expr::Select(c, a, b) => {
            walk(c, f);
            walk(a, f);
            walk(b, f);
        }
    }
}

/// Why an expression is not an affine index.
pub(crate) enum NotAffine {
    /// It reads tensor `name`.
    Tensor(String, Pos),
    /// A product of indices, a division of an index, a call, ...: why, naming the part.
    Other(String),
}

impl Affine {
    fn scaled(&self, k: i64) -> Affine {
        let vars = if k == 0 { BTreeMap::new() } else { self.vars.iter().map(|(v, c)| (v.clone(), c.saturating_mul(k))).collect() };
        Affine { vars, konst: self.konst.scale(k) }
    }
    fn plus(self, o: Affine) -> Affine {
        let mut vars = self.vars;
        for (v, k) in o.vars {
            let c = vars.entry(v).or_insert(0);
            *c = c.saturating_add(k);
        }
        vars.retain(|_, k| *k != 0);
        Affine { vars, konst: self.konst.add(&o.konst) }
    }
    /// Its constant value, when it uses no index and no size.
    fn constant(&self) -> Option<i64> {
        if self.vars.is_empty() { self.konst.as_const() } else { None }
    }
}

/// `e` as an affine index expression, each name classified by `classify`:
/// sums of indices times integers, plus sizes.
pub(crate) fn affine_of(e: &Expr, classify: &dyn Fn(&str) -> Name) -> std::result::Result<Affine, NotAffine> {
    Ok(match e {
        Expr::Num { value, int: true } => Affine { vars: BTreeMap::new(), konst: Size::c(*value as i64) },
        Expr::Name(n, p) => match classify(n) {
            Name::Index => Affine { vars: BTreeMap::from([(n.clone(), 1)]), konst: Size::default() },
            Name::Size => Affine { vars: BTreeMap::new(), konst: Size::sym(n) },
            Name::Tensor(_) => return Err(NotAffine::Tensor(n.clone(), *p)),
        },
        Expr::Unary(Un::Neg, a) => affine_of(a, classify)?.scaled(-1),
        Expr::Binary(Bin::Add, a, b) => affine_of(a, classify)?.plus(affine_of(b, classify)?),
        Expr::Binary(Bin::Sub, a, b) => affine_of(a, classify)?.plus(affine_of(b, classify)?.scaled(-1)),
        Expr::Binary(Bin::Mul, x, y) => {
            let (a, b) = (affine_of(x, classify)?, affine_of(y, classify)?);
            match (a.constant(), b.constant()) {
                (Some(k), _) => b.scaled(k),
                (_, Some(k)) => a.scaled(k),
                _ => {
                    let what = match (a.vars.is_empty(), b.vars.is_empty()) {
                        (true, true) => "two sizes",
                        (false, false) => "two indices",
                        _ => "an index by a size",
                    };
                    return Err(NotAffine::Other(format!(
                        "`{}` multiplies {what}; indices and sizes are multiplied only by integers",
                        e.text()
                    )));
                }
            }
        }
        Expr::Binary(Bin::Div, x, y) => {
            let (a, b) = (affine_of(x, classify)?, affine_of(y, classify)?);
            match b.constant() {
                Some(k) if k > 0 && a.vars.is_empty() => Affine { vars: BTreeMap::new(), konst: a.konst.div_floor(k) },
                Some(k) if k > 0 => {
                    return Err(NotAffine::Other(format!("`{}` divides an index; only a size is divided (`K / 2`)", e.text())));
                }
                _ => return Err(NotAffine::Other(format!("`{}` divides by `{}`, not by a positive integer", e.text(), y.text()))),
            }
        }
        _ => return Err(NotAffine::Other(format!("`{}` is not an index expression", e.text()))),
    })
}

/// `e` as an affine index expression, or an error naming the access.
fn affine(cx: &Ctx<'_>, e: &Expr, pos: Pos, access: &str) -> Result<Affine> {
    affine_of(e, &|n| cx.classify(n)).map_err(|why| match why {
        NotAffine::Tensor(n, p) => cx.err(p, format!("in `{access}`: a tensor (`{n}`) cannot be an index")),
        NotAffine::Other(why) => {
            cx.err(pos, format!("in `{access}`: {why} (an index is a sum of indices times integers, plus sizes: `2 * h + kh - K / 2`)"))
        }
    })
}

/// `e` as a size (a `where` bound): integers and size symbols with `+ -`,
/// times or divided by integers.
fn size_of(cx: &Ctx<'_>, e: &Expr, pos: Pos) -> Result<Size> {
    let rule = "a bound is integers and size symbols with + and -, times or divided by integers";
    let bad = |why: String| cx.err(pos, format!("in the bound `{}`: {why} ({rule})", e.text()));
    Ok(match e {
        Expr::Num { value, int: true } => Size::c(*value as i64),
        Expr::Name(n, _) if cx.is_symbol(n) => Size::sym(n),
        Expr::Name(n, _) => {
            let symbols: Vec<&str> = cx.symbols.iter().map(|(s, ..)| s.as_str()).collect();
            let known =
                if symbols.is_empty() { "the parameters have none".to_owned() } else { format!("the parameters': {}", symbols.join(", ")) };
            return Err(bad(format!("`{n}` is not a size symbol ({known})")));
        }
        Expr::Unary(Un::Neg, a) => size_of(cx, a, pos)?.scale(-1),
        Expr::Binary(Bin::Add, a, b) => size_of(cx, a, pos)?.add(&size_of(cx, b, pos)?),
        Expr::Binary(Bin::Sub, a, b) => size_of(cx, a, pos)?.sub(&size_of(cx, b, pos)?),
        Expr::Binary(Bin::Mul, a, b) => {
            let (a, b) = (size_of(cx, a, pos)?, size_of(cx, b, pos)?);
            match (a.as_const(), b.as_const()) {
                (Some(k), _) => b.scale(k),
                (_, Some(k)) => a.scale(k),
                _ => return Err(bad("it multiplies two sizes".to_owned())),
            }
        }
        Expr::Binary(Bin::Div, a, b) => match size_of(cx, b, pos)?.as_const() {
            Some(k) if k > 0 => size_of(cx, a, pos)?.div_floor(k),
            _ => return Err(bad(format!("it divides by `{}`, not by a positive integer", b.text()))),
        },
        _ => return Err(bad("it is not a size".to_owned())),
    })
}

/// Checks one statement against the definition and the statements before it
/// (`cx`), and on an output's first statement fixes its shape and type.
fn check_stmt(cx: &mut Ctx<'_>, s: &super::parse::Stmt) -> Result<Statement> {
    let out = written_output(cx, s)?;
    let lhs = lhs_indices(cx, s, out)?;
    let (reduced, mut accesses) = rhs_names(cx, s, &lhs)?;
    // Numbers the generated code computes with stay small (no overflow there).
    if !accesses.iter().all(|a| a.index.iter().all(|ix| ix.konst.small() && ix.vars.values().all(|k| k.abs() <= size::MAX_COEFFICIENT))) {
        return Err(cx.too_big(s));
    }
    // Indices inside accesses' index expressions were collected above
    // (walk visits the arguments); index names used as values too.
    if s.op == Op::Assign && !reduced.is_empty() {
        return Err(cx.err(
            s.pos,
            format!(
                "`{}` appears only on the right of `=`: an index only on the right is reduced, which needs a reduction (`+=!`, `*=!`, `max=!`, `min=!`)",
                reduced[0]
            ),
        ));
    }
    if !s.init && s.op != Op::Assign && cx.outputs[out].is_none() {
        return Err(cx.err(
            s.pos,
            format!(
                "`{}` is the first statement writing `{}`, whose start value is unset: write `{}` (start from the reduction's identity) or assign `{}` first",
                s.text,
                s.lhs,
                s.op.text(true),
                s.lhs
            ),
        ));
    }
    // The left access, when the output's shape is known already.
    let lhs_text = format!("{}({})", s.lhs, lhs.join(", "));
    let lhs_access = Access {
        tensor: TensorRef::Output(out),
        index: lhs.iter().map(|v| Affine { vars: BTreeMap::from([(v.clone(), 1)]), konst: Size::default() }).collect(),
        text: lhs_text,
    };
    own_reads(cx, s, out, &accesses, &lhs_access, &reduced)?;
    let mut constraining = accesses.clone();
    let shaped = cx.outputs[out].is_some();
    if shaped {
        constraining.push(lhs_access.clone());
    } else if let Some(decl) = cx.def.outputs[out].decl.as_ref().filter(|d| !d.dims.is_empty()) {
        if decl.dims.len() != lhs.len() {
            return Err(
                cx.err(s.pos, format!("`{}` is declared with {} dims but written with {} indices", s.lhs, decl.dims.len(), lhs.len()))
            );
        }
        cx.outputs[out] = Some(Output {
            name: s.lhs.clone(),
            ty: OutType::Float,
            dims: decl
                .dims
                .iter()
                .map(|d| match d {
                    DimDecl::Sym(n, _) => Size::sym(n),
                    DimDecl::Int(n) => Size::c(*n),
                })
                .collect(),
        });
        constraining.push(lhs_access.clone());
    }
    let ranges = index_ranges(cx, s, &lhs, &reduced, &constraining)?;
    check_reach(cx, s, &ranges, accesses.iter().chain(shaped.then_some(&lhs_access)))?;
    // The output's shape and type, on its first statement.
    if cx.outputs[out].is_none() || !shaped {
        let mut dims = Vec::new();
        for v in &lhs {
            let (lo, hi) = &ranges[v];
            if lo.as_const().is_some_and(|c| c < 0) {
                return Err(cx.err(
                    s.pos,
                    format!("in `{}`: index `{v}` may be negative (its range starts at {})", s.text, lo.text(&|n| n.to_owned())),
                ));
            }
            dims.push(hi.clone());
        }
        let declared = cx.def.outputs[out].decl.as_ref().map(|d| d.ty);
        let ty = match declared {
            Some(ElemType::Float) => OutType::Float,
            Some(ElemType::Fixed(d)) => OutType::Fixed(d),
            None => written_type(cx, s, None),
        };
        let dims = cx.outputs[out].as_ref().map_or(dims, |o| o.dims.clone());
        cx.outputs[out] = Some(Output { name: s.lhs.clone(), ty, dims });
    } else if cx.def.outputs[out].decl.is_none() {
        // An untyped output widens to what every statement writes it
        // (`O(i) = 2` then `O(i) += A(i)` is floating), never truncated.
        let ty = written_type(cx, s, cx.outputs[out].as_ref().map(|o| o.ty));
        if let Some(o) = cx.outputs[out].as_mut() {
            o.ty = ty;
        }
    }
    accesses.push(lhs_access);
    Ok(Statement { out, lhs, reduced, ranges, op: s.op, init: s.init, rhs: s.rhs.clone(), accesses, text: s.text.clone(), scatter: None })
}

/// The output statement `s` writes.
fn written_output(cx: &Ctx<'_>, s: &super::parse::Stmt) -> Result<usize> {
    match cx.tensor(&s.lhs) {
        Some(TensorRef::Output(i)) => Ok(i),
        Some(TensorRef::Param(_)) => {
            Err(cx.err(s.pos, format!("`{}` is a parameter: a statement writes an output (parameters are read-only)", s.lhs)))
        }
        None => {
            let outs: Vec<&str> = cx.def.outputs.iter().map(|o| o.name.as_str()).collect();
            Err(cx.err(s.pos, format!("`{}` is not an output of this definition (its outputs: {})", s.lhs, outs.join(", "))))
        }
    }
}

/// The left side's indices: names that are neither sizes nor tensors, each once.
fn lhs_indices(cx: &Ctx<'_>, s: &super::parse::Stmt, out: usize) -> Result<Vec<String>> {
    let mut lhs: Vec<String> = Vec::new();
    for (v, p) in &s.index {
        if cx.is_symbol(v) || cx.tensor(v).is_some() {
            return Err(cx.err(*p, format!("`{v}` on the left of a statement must be an index, not a size or a tensor")));
        }
        if lhs.contains(v) {
            return Err(cx.err(*p, format!("index `{v}` appears twice on the left")));
        }
        lhs.push(v.clone());
    }
    if let Some(r) = cx.rank(TensorRef::Output(out))
        && r != lhs.len()
    {
        return Err(cx.err(s.pos, format!("`{}` has {r} dims, but this statement writes it with {} indices", s.lhs, lhs.len())));
    }
    Ok(lhs)
}

/// The names on the right side: the indices it reduces over (those not on
/// the left) and its tensor accesses, each checked against its tensor's rank.
fn rhs_names(cx: &Ctx<'_>, s: &super::parse::Stmt, lhs: &[String]) -> Result<(Vec<String>, Vec<Access>)> {
    let mut reduced: Vec<String> = Vec::new();
    let mut accesses = Vec::new();
    let mut problem: Option<dlbridge_core::Error> = None;
    walk(&s.rhs, &mut |e| {
        if problem.is_some() {
            return;
        }
        match e {
            Expr::Name(n, p) => match cx.classify(n) {
                Name::Index => {
                    if !lhs.contains(n) && !reduced.contains(n) {
                        reduced.push(n.clone());
                    }
                }
                Name::Size => {}
                Name::Tensor(t) => match cx.rank(t) {
                    None => problem = Some(cx.err(*p, format!("`{n}` is read before any statement writes it"))),
                    Some(0) => {}
                    Some(r) => problem = Some(cx.err(*p, format!("`{n}` has {r} dims: write `{n}(...)` with {r} indices"))),
                },
            },
            Expr::Call(f, args, p) => match cx.tensor(f) {
                Some(t) => match cx.rank(t) {
                    None => problem = Some(cx.err(*p, format!("`{f}` is read before any statement writes it"))),
                    Some(r) if r != args.len() => {
                        problem = Some(cx.err(*p, format!("`{f}` has {r} dims but is read with {} indices", args.len())));
                    }
                    Some(_) => {
                        let text = e.text();
                        let mut index = Vec::new();
                        for a in args {
                            match affine(cx, a, *p, &text) {
                                Ok(x) => index.push(x),
                                Err(err) => {
                                    problem = Some(err);
                                    return;
                                }
                            }
                        }
                        accesses.push(Access { tensor: t, index, text });
                    }
                },
                None => match BUILTINS.iter().find(|(b, _)| b == f) {
                    Some((_, n)) if *n != args.len() => {
                        problem =
                            Some(cx.err(*p, format!("`{f}` takes {n} argument{}, not {}", if *n == 1 { "" } else { "s" }, args.len())));
                    }
                    Some(_) => {}
                    None => {
                        let names: Vec<&str> = BUILTINS.iter().map(|(b, _)| *b).collect();
                        problem =
                            Some(cx.err(*p, format!("`{f}` is neither a tensor of this definition nor a builtin ({})", names.join(", "))));
                    }
                },
            },
            _ => {}
        }
    });
    if let Some(e) = problem {
        return Err(e);
    }
    Ok((reduced, accesses))
}

/// A statement reads its own output only at the element it writes, and a
/// reduction not at all: any other read would see elements this statement
/// has or has not written yet, by the order the loops run in.
fn own_reads(cx: &Ctx<'_>, s: &super::parse::Stmt, out: usize, accesses: &[Access], lhs_access: &Access, reduced: &[String]) -> Result<()> {
    let mut reads_itself_0d = false;
    walk(&s.rhs, &mut |e| reads_itself_0d |= matches!(e, Expr::Name(n, _) if *n == s.lhs));
    let whole = Access { tensor: TensorRef::Output(out), index: Vec::new(), text: s.lhs.clone() };
    let own: Vec<&Access> =
        accesses.iter().filter(|a| a.tensor == TensorRef::Output(out)).chain(reads_itself_0d.then_some(&whole)).collect();
    if let Some(a) = own.iter().find(|a| a.index != lhs_access.index) {
        return Err(cx.err(
            s.pos,
            format!(
                "`{}` reads `{}`, another element of `{}` than it writes: a statement reads its own output only at the element it writes ({}); write the result to a new output",
                s.text, a.text, s.lhs, lhs_access.text
            ),
        ));
    }
    if let Some(a) = own.first().filter(|_| !reduced.is_empty()) {
        return Err(cx.err(
            s.pos,
            format!(
                "`{}` reads `{}` while it reduces over `{}`: a reduction does not read its own output; reduce into a new output and combine them in a statement after it",
                s.text,
                a.text,
                reduced.join("`, `")
            ),
        ));
    }
    Ok(())
}

/// Each index's range: its `where` range, else inferred in rounds from the
/// accesses it appears in (`constraining`), once the other indices there
/// have theirs.
fn index_ranges(
    cx: &Ctx<'_>,
    s: &super::parse::Stmt,
    lhs: &[String],
    reduced: &[String],
    constraining: &[Access],
) -> Result<BTreeMap<String, (Size, Size)>> {
    let all_vars: Vec<String> = lhs.iter().chain(reduced).cloned().collect();
    let mut ranges: BTreeMap<String, (Size, Size)> = BTreeMap::new();
    for w in &s.wheres {
        if !all_vars.contains(&w.var) {
            return Err(cx.err(w.pos, format!("`where {} in ...`: `{}` is not an index of this statement", w.var, w.var)));
        }
        if ranges.contains_key(&w.var) {
            return Err(cx.err(w.pos, format!("index `{}` has two `where` ranges", w.var)));
        }
        ranges.insert(w.var.clone(), (size_of(cx, &w.lo, w.pos)?, size_of(cx, &w.hi, w.pos)?));
    }
    loop {
        let unknown: Vec<&String> = all_vars.iter().filter(|v| !ranges.contains_key(*v)).collect();
        if unknown.is_empty() {
            break;
        }
        let mut found: BTreeMap<String, (Size, Size)> = BTreeMap::new();
        for v in &unknown {
            for a in constraining {
                for (d, ix) in a.index.iter().enumerate() {
                    let Some(&k) = ix.vars.get(*v) else { continue };
                    if ix.vars.keys().any(|o| o != *v && !ranges.contains_key(o)) {
                        continue;
                    }
                    // rest = Σ other terms + konst: its smallest and largest values.
                    let (rmin, rmax) = extremes(ix, &ranges, Some(v.as_str()));
                    let size = cx.dim(a.tensor, d);
                    // 0 <= k·v + rest <= size - 1 for every rest.
                    let (lo, hi) = if k > 0 {
                        (rmin.scale(-1).div_ceil(k), size.add_c(-1).sub(&rmax).div_floor(k).add_c(1))
                    } else {
                        let m = -k;
                        (rmax.sub(&size).add_c(1).div_ceil(m), rmin.div_floor(m).add_c(1))
                    };
                    let e = found.entry((*v).clone()).or_insert_with(|| (lo.clone(), hi.clone()));
                    *e = (e.0.smax(&lo), e.1.smin(&hi));
                }
            }
        }
        if found.is_empty() {
            let v = unknown[0];
            let uses: Vec<&str> =
                constraining.iter().filter(|a| a.index.iter().any(|ix| ix.vars.contains_key(v))).map(|a| a.text.as_str()).collect();
            let why = if uses.is_empty() {
                format!("it is used in no tensor access; give it a range with `where {v} in lo:hi`")
            } else {
                format!(
                    "every access it is in ({}) has another index whose range is unknown; give one a range with `where {v} in lo:hi`",
                    uses.join(", ")
                )
            };
            return Err(cx.err(s.pos, format!("in `{}`: the range of index `{v}` cannot be inferred: {why}", s.text)));
        }
        // An index of the output is an element of it: never below 0
        // (`O(i) = A(-i)` writes O(0) only).
        for (v, (lo, _)) in found.iter_mut() {
            if lhs.contains(v) {
                *lo = lo.smax(&Size::c(0));
            }
        }
        ranges.extend(found);
    }
    if !ranges.values().all(|(lo, hi)| lo.small() && hi.small()) {
        return Err(cx.too_big(s));
    }
    Ok(ranges)
}

/// An access that certainly leaves its tensor (a `where` range wider than
/// the tensor, by a constant) is an error now rather than at the call; only
/// where every range surely has an element (sizes are >= 0).
fn check_reach<'a>(
    cx: &Ctx<'_>,
    s: &super::parse::Stmt,
    ranges: &BTreeMap<String, (Size, Size)>,
    accesses: impl Iterator<Item = &'a Access>,
) -> Result<()> {
    let nonempty = |v: &String| match ranges[v].1.sub(&ranges[v].0) {
        Size::Lin(l) => l.c > 0 && l.terms.values().all(|k| *k >= 0),
        _ => false,
    };
    for a in accesses.filter(|a| cx.rank(a.tensor).is_some()) {
        for (d, ix) in a.index.iter().enumerate() {
            if !ix.vars.keys().all(nonempty) {
                continue;
            }
            let (lo, hi) = extremes(ix, ranges, None);
            let size = cx.dim(a.tensor, d);
            let name = |x: &Size| x.as_const().map_or_else(|| x.text(&|n| n.to_owned()), |k| k.to_string());
            let past = hi.sub(&size).as_const().is_some_and(|k| k >= 0);
            let before = lo.as_const().is_some_and(|k| k < 0);
            if past || before {
                return Err(cx.err(
                    s.pos,
                    format!(
                        "in `{}`: `{}` reaches index {} along dim {d}, which has size {}: a `where` range reaches past the tensor",
                        s.text,
                        a.text,
                        name(if past { &hi } else { &lo }),
                        name(&size)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The type statement `s` gives an untyped output, which statements before
/// it made `before`: the type of its right side joined with `before`, and a
/// sum or product of truth values counts in int64, as torch.sum's.
fn written_type(cx: &Ctx<'_>, s: &super::parse::Stmt, before: Option<OutType>) -> OutType {
    let mut t = type_of(cx, &s.rhs);
    if t == Ty::Fixed(DType::BOOL) && matches!(s.op, Op::Add | Op::Mul) {
        t = Ty::Fixed(DType::I64);
    }
    if let Some(b) = before {
        t = join(t, b.into());
    }
    match t {
        Ty::Float => OutType::Float,
        Ty::Fixed(d) | Ty::Weak(d) => OutType::Fixed(d),
    }
}

/// The smallest and largest value of index expression `ix` over `ranges`
/// (`[lo, hi)` per index), leaving out index `skip`'s term.
fn extremes(ix: &Affine, ranges: &BTreeMap<String, (Size, Size)>, skip: Option<&str>) -> (Size, Size) {
    let (mut lo, mut hi) = (ix.konst.clone(), ix.konst.clone());
    for (v, c) in ix.vars.iter().filter(|(v, _)| Some(v.as_str()) != skip) {
        let (first, last) = (&ranges[v].0, ranges[v].1.add_c(-1));
        let (small, large) = if *c > 0 { (first.scale(*c), last.scale(*c)) } else { (last.scale(*c), first.scale(*c)) };
        lo = lo.add(&small);
        hi = hi.add(&large);
    }
    (lo, hi)
}

/// An expression's type, for an output's: floating, a fixed integer type,
/// or an integer that any other type wins over (literals, indices).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    Float,
    Fixed(DType),
    Weak(DType),
}

impl From<ElemType> for Ty {
    fn from(t: ElemType) -> Ty {
        match t {
            ElemType::Float => Ty::Float,
            ElemType::Fixed(d) => Ty::Fixed(d),
        }
    }
}

impl From<OutType> for Ty {
    fn from(t: OutType) -> Ty {
        match t {
            OutType::Float => Ty::Float,
            OutType::Fixed(d) => Ty::Fixed(d),
        }
    }
}

pub(crate) fn join(a: Ty, b: Ty) -> Ty {
    let bool_ty = |t: Ty| t == Ty::Fixed(DType::BOOL);
    match (a, b) {
        (Ty::Float, _) | (_, Ty::Float) => Ty::Float,
        // Truth values with any integer are integers (`(A(i) > 0) * 3`), as in torch and C.
        (x, Ty::Fixed(y) | Ty::Weak(y)) if bool_ty(x) && y != DType::BOOL => Ty::Fixed(y),
        (Ty::Fixed(y) | Ty::Weak(y), x) if bool_ty(x) && y != DType::BOOL => Ty::Fixed(y),
        (Ty::Fixed(x), Ty::Fixed(y)) => Ty::Fixed(join_ints(x, y)),
        (Ty::Fixed(x), Ty::Weak(_)) | (Ty::Weak(_), Ty::Fixed(x)) => Ty::Fixed(x),
        (Ty::Weak(x), Ty::Weak(_)) => Ty::Weak(x),
    }
}

/// The type two integer types compute in, as NumPy's and torch's: the wider
/// of one signedness; of a signed and an unsigned, the signed one where it
/// is wider, else the signed type of twice the unsigned one's width (int8
/// with uint8 is int16), int64 at most.
fn join_ints(x: DType, y: DType) -> DType {
    let signed = |d: DType| d.code() == DTypeCode::Int;
    if signed(x) == signed(y) {
        return if y.bits() > x.bits() { y } else { x };
    }
    let (s, u) = if signed(x) { (x, y) } else { (y, x) };
    if s.bits() > u.bits() { s } else { DType::new(DTypeCode::Int, (u.bits().saturating_mul(2)).min(64), 1).unwrap_or(DType::I64) }
}

fn type_of(cx: &Ctx<'_>, e: &Expr) -> Ty {
    let tensor_ty = |t: TensorRef| match t {
        TensorRef::Param(i) => cx.params[i].ty.into(),
        TensorRef::Output(i) => cx.outputs[i].as_ref().map_or(Ty::Float, |o| o.ty.into()),
    };
    expr_type(e, &tensor_ty, &|n| cx.classify(n))
}

/// An expression's type, each tensor's from `tensor_ty`, each name classified by `classify`.
pub(crate) fn expr_type(e: &Expr, tensor_ty: &dyn Fn(TensorRef) -> Ty, classify: &dyn Fn(&str) -> Name) -> Ty {
    let ty = |e: &Expr| expr_type(e, tensor_ty, classify);
    match e {
        Expr::Num { int: true, .. } => Ty::Weak(DType::I64),
        Expr::Num { .. } => Ty::Float,
        Expr::Name(n, _) => match classify(n) {
            Name::Tensor(t) => tensor_ty(t),
            _ => Ty::Weak(DType::I64),
        },
        Expr::Call(f, args, _) => match classify(f) {
            Name::Tensor(t) => tensor_ty(t),
            _ if f == "max" || f == "min" => args.iter().map(ty).fold(Ty::Weak(DType::I64), join),
            _ => Ty::Float,
        },
        // `-` of a truth value is an integer (C's int; torch refuses it).
        Expr::Unary(Un::Neg, a) => join(ty(a), Ty::Weak(DType::I64)),
        Expr::Unary(Un::Not, _) => Ty::Fixed(DType::BOOL),
        Expr::Binary(op, a, b) => {
            let (x, y) = (ty(a), ty(b));
            if op.is_comparison() {
                Ty::Fixed(DType::BOOL)
            } else if *op == Bin::Sub && x == Ty::Fixed(DType::BOOL) && y == x {
                // A difference of truth values is -1, 0 or 1 (C's int; torch refuses it).
                Ty::Fixed(DType::I64)
            } else {
                join(x, y)
            }
        }
        Expr::Select(_, a, b) => join(ty(a), ty(b)),
    }
}

#[cfg(test)]
mod tests;

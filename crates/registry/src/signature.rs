//! The signature language: one declaration per kernel drives validation,
//! output allocation, error text and the text users see.
//!
//! ```text
//! signature := NAME generics? '(' params? ')' ( '->' '(' outputs ')' )?
//! generics  := '<' tvar ( ',' tvar )* '>'
//! tvar      := NAME ':' DTYPE ( '|' DTYPE )*
//! param     := NAME ':' ( SCALAR | tensor )        SCALAR := f64 | i64 | bool
//! tensor    := 'mut'? ( DTYPE | TVAR ) '[' ( dim ( ',' dim )* )? ']'
//! dim       := INT | NAME | '...' NAME | '(' dexpr ')'
//! dexpr     := dterm ( ('+' | '-') dterm )*
//! dterm     := datom ( ('*' | '/') datom )*           ('/' divides rounding down, by a positive divisor)
//! datom     := INT | NAME | '(' dexpr ')' | ('min' | 'max') '(' dexpr ',' dexpr ')'
//! outputs   := NAME ':' ( DTYPE | TVAR ) '[' dims ']' ( ',' ... )*
//! bcast     := '*' NAME                            (a tensor's only dim)
//! ```
//!
//! Example: `matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])`.
//! A dim symbol is bound on first sight and checked after; `...S` binds any
//! number of dims as a whole; `mut` marks an input the kernel writes in place.
//! `*S` is a broadcast group (at most one per signature, and a tensor's only
//! dim): the inputs' shapes broadcast together as NumPy broadcasts them, `S`
//! is bound to the result, outputs have exactly that shape, and a `mut` input
//! must already have it (an in-place write never broadcasts). The kernel gets
//! the inputs with their own shapes and broadcasts them itself (right-aligned;
//! a missing dim or a dim of size 1 repeats).
//! A dim may be an expression of dim symbols (`(H - KH + 1)`,
//! `((H - 2) / 2 + 1)`): the caller's framework allocates an output with its
//! value, and an input (whose expression may use only symbols the inputs
//! before it bind) or an output passed in must have it.
//! Parsing also type-checks: every type variable and every output dim must be
//! bound by some input.
//!
//! Signatures come from plugins too, so the text is foreign input: its length
//! is checked against [`MAX_SIGNATURE_LEN`] before anything else is done with
//! it, every list in it is bounded (`MAX_*` below) as it is parsed, so parsing
//! is linear in the text, and an error quotes at most [`MAX_EXCERPT`] bytes of
//! it (a window around the offending column) plus names of at most
//! [`MAX_NAME_LEN`] bytes.

use std::borrow::Cow;
use std::fmt;

use dlbridge_core::{DType, Error, Result};

/// At most this many type variables per signature (a call's solution holds them inline).
pub const MAX_TYPE_VARS: usize = 4;
/// At most this many dim symbols per signature.
pub const MAX_SYMBOLS: usize = 16;
/// At most this many `...NAME` groups per signature.
pub const MAX_RESTS: usize = 4;
/// At most this many parameters plus outputs.
pub const MAX_PARAMS: usize = 16;
/// Longest signature text accepted, in bytes (the longest built-in is about
/// 100). Checked before the text is looked at.
pub const MAX_SIGNATURE_LEN: usize = 4096;
/// Longest name (kernel, type variable, parameter, dim symbol), in bytes.
pub const MAX_NAME_LEN: usize = 64;
/// At most this many dtypes per type variable.
pub const MAX_ALLOWED_DTYPES: usize = 32;
/// At most this many dims per tensor type (a DLPack tensor dlbridge accepts
/// has at most this many).
pub const MAX_DIMS: usize = dlbridge_core::layout::MAX_NDIM;
/// Most bytes of signature text an error message quotes.
pub const MAX_EXCERPT: usize = 200;

/// A type variable with the dtypes it may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeVar {
    /// Its name (`T`).
    pub name: String,
    /// The dtypes it may be bound to, in declaration order.
    pub allowed: Vec<DType>,
}

/// A tensor's dtype in a signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DTypeRef {
    /// A fixed dtype.
    Concrete(DType),
    /// Type variable number `i`.
    Var(usize),
}

/// One dim of a tensor type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    /// A fixed size.
    Fixed(i64),
    /// Dim symbol number `i`.
    Sym(usize),
    /// `...NAME` group number `i`: any number of dims.
    Rest(usize),
    /// Expression number `i` ([`Signature::exprs`]) of the inputs' dim
    /// symbols (outputs only).
    Expr(usize),
}

/// An output dim computed from the inputs' dim symbols.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DimExpr {
    /// A constant.
    Int(i64),
    /// Dim symbol number `i`.
    Sym(usize),
    /// `a + b`.
    Add(Box<DimExpr>, Box<DimExpr>),
    /// `a - b`.
    Sub(Box<DimExpr>, Box<DimExpr>),
    /// `a * b`.
    Mul(Box<DimExpr>, Box<DimExpr>),
    /// `a / b`, rounding down; `b` must be positive.
    Div(Box<DimExpr>, Box<DimExpr>),
    /// The smaller of the two.
    Min(Box<DimExpr>, Box<DimExpr>),
    /// The larger of the two.
    Max(Box<DimExpr>, Box<DimExpr>),
}

impl DimExpr {
    /// Its value with the dim symbols `sym` gives; `None` where a symbol is
    /// unbound, a divisor is not positive or the arithmetic overflows.
    pub fn eval(&self, sym: &dyn Fn(usize) -> Option<i64>) -> Option<i64> {
        let two = |a: &DimExpr, b: &DimExpr| Some((a.eval(sym)?, b.eval(sym)?));
        match self {
            DimExpr::Int(n) => Some(*n),
            DimExpr::Sym(i) => sym(*i),
            DimExpr::Add(a, b) => two(a, b).and_then(|(a, b)| a.checked_add(b)),
            DimExpr::Sub(a, b) => two(a, b).and_then(|(a, b)| a.checked_sub(b)),
            DimExpr::Mul(a, b) => two(a, b).and_then(|(a, b)| a.checked_mul(b)),
            DimExpr::Div(a, b) => two(a, b).and_then(|(a, b)| if b > 0 { Some(a.div_euclid(b)) } else { None }),
            DimExpr::Min(a, b) => two(a, b).map(|(a, b)| a.min(b)),
            DimExpr::Max(a, b) => two(a, b).map(|(a, b)| a.max(b)),
        }
    }

    /// The text, with `names` for the symbols, parenthesised only where needed.
    pub fn text(&self, names: &[String]) -> String {
        self.fmt_prec(names, 0)
    }

    fn fmt_prec(&self, names: &[String], outer: u8) -> String {
        let bin = |a: &DimExpr, op: &str, b: &DimExpr, prec: u8| {
            let t = format!("{} {op} {}", a.fmt_prec(names, prec), b.fmt_prec(names, prec + 1));
            if prec < outer { format!("({t})") } else { t }
        };
        match self {
            DimExpr::Int(n) if *n < 0 => format!("(0 - {})", n.unsigned_abs()),
            DimExpr::Int(n) => n.to_string(),
            DimExpr::Sym(i) => names.get(*i).cloned().unwrap_or_else(|| format!("?{i}")),
            DimExpr::Add(a, b) => bin(a, "+", b, 1),
            DimExpr::Sub(a, b) => bin(a, "-", b, 1),
            DimExpr::Mul(a, b) => bin(a, "*", b, 2),
            DimExpr::Div(a, b) => bin(a, "/", b, 2),
            DimExpr::Min(a, b) => format!("min({}, {})", a.fmt_prec(names, 0), b.fmt_prec(names, 0)),
            DimExpr::Max(a, b) => format!("max({}, {})", a.fmt_prec(names, 0), b.fmt_prec(names, 0)),
        }
    }

    /// Pushes the dim symbols it uses onto `out`.
    pub fn symbols(&self, out: &mut Vec<usize>) {
        match self {
            DimExpr::Int(_) => {}
            DimExpr::Sym(i) => out.push(*i),
            DimExpr::Add(a, b) | DimExpr::Sub(a, b) | DimExpr::Mul(a, b) | DimExpr::Div(a, b) | DimExpr::Min(a, b) | DimExpr::Max(a, b) => {
                a.symbols(out);
                b.symbols(out);
            }
        }
    }
}

/// Arithmetic on dims, as a signature's dim expressions have it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DimOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`, rounding down.
    FloorDiv,
    /// The smaller.
    Min,
    /// The larger.
    Max,
}

impl DimOp {
    /// The operator's text (`+`, `-`, `*`, `//`, `min`, `max`).
    pub fn text(self) -> &'static str {
        match self {
            DimOp::Add => "+",
            DimOp::Sub => "-",
            DimOp::Mul => "*",
            DimOp::FloorDiv => "//",
            DimOp::Min => "min",
            DimOp::Max => "max",
        }
    }
}

/// Where one output dim comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DimOrigin {
    /// A size fixed by the signature (or a broadcast dim of 1).
    Fixed(i64),
    /// Dim `axis` of argument `arg` (an index into the call's arguments).
    Input {
        /// The argument.
        arg: usize,
        /// Its dim.
        axis: usize,
    },
    /// Arithmetic on two origins (a signature's dim expression).
    Op(DimOp, Box<DimOrigin>, Box<DimOrigin>),
}

impl DimOrigin {
    /// The origin of a dim expression whose symbols have the origins `symbol` gives.
    pub(crate) fn of_expr(e: &DimExpr, symbol: &dyn Fn(usize) -> Result<DimOrigin>) -> Result<DimOrigin> {
        let op = |op: DimOp, a: &DimExpr, b: &DimExpr| -> Result<DimOrigin> {
            Ok(DimOrigin::Op(op, Box::new(Self::of_expr(a, symbol)?), Box::new(Self::of_expr(b, symbol)?)))
        };
        match e {
            DimExpr::Int(n) => Ok(DimOrigin::Fixed(*n)),
            DimExpr::Sym(s) => symbol(*s),
            DimExpr::Add(a, b) => op(DimOp::Add, a, b),
            DimExpr::Sub(a, b) => op(DimOp::Sub, a, b),
            DimExpr::Mul(a, b) => op(DimOp::Mul, a, b),
            DimExpr::Div(a, b) => op(DimOp::FloorDiv, a, b),
            DimExpr::Min(a, b) => op(DimOp::Min, a, b),
            DimExpr::Max(a, b) => op(DimOp::Max, a, b),
        }
    }
}

/// A tensor parameter's type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorType {
    /// Its dtype.
    pub dtype: DTypeRef,
    /// Its dims (at most one `Rest`).
    pub dims: Vec<Dim>,
    /// Whether the kernel writes it in place.
    pub mutable: bool,
    /// Whether `dims` holds a `...NAME` group (cached at parse time).
    pub has_rest: bool,
}

impl TensorType {
    /// Position of the `...NAME` group, if any.
    pub fn rest_position(&self) -> Option<usize> {
        self.dims.iter().position(|d| matches!(d, Dim::Rest(_)))
    }
    /// Whether the dims include a `...NAME` group.
    #[inline]
    pub fn has_rest(&self) -> bool {
        self.has_rest
    }
}

/// Scalar parameter types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarKind {
    /// `f64`
    F64,
    /// `i64`
    I64,
    /// `bool`
    Bool,
}

impl fmt::Display for ScalarKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScalarKind::F64 => "f64",
            ScalarKind::I64 => "i64",
            ScalarKind::Bool => "bool",
        })
    }
}

/// A scalar argument: the value of an `f64`, `i64` or `bool` parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// For `f64` parameters.
    F64(f64),
    /// For `i64` parameters.
    I64(i64),
    /// For `bool` parameters.
    Bool(bool),
}

impl Scalar {
    /// The parameter kind this scalar fits.
    #[inline]
    pub fn kind(self) -> ScalarKind {
        match self {
            Scalar::F64(_) => ScalarKind::F64,
            Scalar::I64(_) => ScalarKind::I64,
            Scalar::Bool(_) => ScalarKind::Bool,
        }
    }
}

/// `f64 2.5`, `i64 -1`, `bool true`: the kind and the value.
impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ", self.kind())?;
        match self {
            Scalar::F64(x) => fmt::Display::fmt(x, f),
            Scalar::I64(x) => fmt::Display::fmt(x, f),
            Scalar::Bool(x) => fmt::Display::fmt(x, f),
        }
    }
}

impl From<f64> for Scalar {
    fn from(x: f64) -> Scalar {
        Scalar::F64(x)
    }
}

impl From<i64> for Scalar {
    fn from(x: i64) -> Scalar {
        Scalar::I64(x)
    }
}

impl From<bool> for Scalar {
    fn from(x: bool) -> Scalar {
        Scalar::Bool(x)
    }
}

/// What a parameter is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamKind {
    /// A scalar.
    Scalar(ScalarKind),
    /// A tensor.
    Tensor(TensorType),
}

/// A named parameter or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// Its name.
    pub name: String,
    /// Its type.
    pub kind: ParamKind,
}

impl Param {
    /// The tensor type, if this is a tensor.
    pub fn tensor(&self) -> Option<&TensorType> {
        match &self.kind {
            ParamKind::Tensor(t) => Some(t),
            ParamKind::Scalar(_) => None,
        }
    }
}

/// A parsed, type-checked kernel signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// Kernel name.
    pub name: String,
    /// Type variables.
    pub type_vars: Vec<TypeVar>,
    /// Inputs (scalars, tensors, `mut` tensors) in call order.
    pub params: Vec<Param>,
    /// Outputs, allocated by the caller's framework when not given.
    pub outputs: Vec<Param>,
    /// Dim symbol names, indexed by [`Dim::Sym`].
    pub symbols: Vec<String>,
    /// `...NAME` group names, indexed by [`Dim::Rest`].
    pub rests: Vec<String>,
    /// Which `...` groups are broadcast groups (written `*NAME`), indexed like `rests`.
    pub broadcast: Vec<bool>,
    /// Output dims computed from the inputs' symbols, indexed by [`Dim::Expr`].
    pub exprs: Vec<DimExpr>,
}

impl Signature {
    /// Parses and type-checks a signature.
    ///
    /// Text longer than [`MAX_SIGNATURE_LEN`] bytes is refused before it is
    /// read; otherwise the work is linear in the text.
    pub fn parse(text: &str) -> Result<Signature> {
        if text.len() > MAX_SIGNATURE_LEN {
            return Err(signature_error(
                text,
                0,
                format!("the signature is {} bytes long; at most {MAX_SIGNATURE_LEN} are allowed", text.len()),
            ));
        }
        Parser::new(text).signature()
    }

    fn fmt_dtype(&self, d: DTypeRef) -> String {
        match d {
            DTypeRef::Concrete(d) => d.to_string(),
            DTypeRef::Var(i) => self.type_vars[i].name.clone(),
        }
    }

    /// Text of one dims list, e.g. `[M, K]` or `[...B, N]`.
    pub fn fmt_dims(&self, dims: &[Dim]) -> String {
        let parts: Vec<String> = dims
            .iter()
            .map(|d| match *d {
                Dim::Fixed(n) => n.to_string(),
                Dim::Sym(i) => self.symbols[i].clone(),
                Dim::Rest(i) => self.fmt_rest(i),
                Dim::Expr(i) => self.fmt_expr(i),
            })
            .collect();
        format!("[{}]", parts.join(", "))
    }

    /// Text of output dim expression `i`, in parentheses: `(H - KH + 1)`.
    pub fn fmt_expr(&self, i: usize) -> String {
        match self.exprs.get(i) {
            Some(e @ (DimExpr::Min(..) | DimExpr::Max(..))) => e.text(&self.symbols),
            Some(e) => format!("({})", e.text(&self.symbols)),
            None => format!("?expr{i}"),
        }
    }

    /// Text of `...` group `i`: `...NAME`, or `*NAME` for a broadcast group.
    pub fn fmt_rest(&self, i: usize) -> String {
        if self.is_broadcast(i) { format!("*{}", self.rests[i]) } else { format!("...{}", self.rests[i]) }
    }

    /// Whether `...` group `i` is a broadcast group (`*NAME`).
    #[inline]
    pub fn is_broadcast(&self, i: usize) -> bool {
        self.broadcast.get(i).copied().unwrap_or(false)
    }

    fn fmt_param(&self, p: &Param) -> String {
        match &p.kind {
            ParamKind::Scalar(s) => format!("{}: {s}", p.name),
            ParamKind::Tensor(t) => {
                format!("{}: {}{}{}", p.name, if t.mutable { "mut " } else { "" }, self.fmt_dtype(t.dtype), self.fmt_dims(&t.dims))
            }
        }
    }

    /// Text of the allowed dtypes of a tensor, e.g. `T (one of f32, f64)` or `f32`.
    pub fn describe_dtype(&self, d: DTypeRef) -> String {
        match d {
            DTypeRef::Concrete(d) => d.to_string(),
            DTypeRef::Var(i) => {
                let tv = &self.type_vars[i];
                let names: Vec<String> = tv.allowed.iter().map(|d| d.to_string()).collect();
                format!("{} (one of {})", tv.name, names.join(", "))
            }
        }
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if !self.type_vars.is_empty() {
            let tvs: Vec<String> = self
                .type_vars
                .iter()
                .map(|tv| {
                    let ds: Vec<String> = tv.allowed.iter().map(|d| d.to_string()).collect();
                    format!("{}: {}", tv.name, ds.join("|"))
                })
                .collect();
            write!(f, "<{}>", tvs.join(", "))?;
        }
        let ps: Vec<String> = self.params.iter().map(|p| self.fmt_param(p)).collect();
        write!(f, "({})", ps.join(", "))?;
        if !self.outputs.is_empty() {
            let os: Vec<String> = self.outputs.iter().map(|p| self.fmt_param(p)).collect();
            write!(f, " -> ({})", os.join(", "))?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Int(i64),
    Punct(&'static str),
    End,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "`{s}`"),
            Tok::Int(n) => write!(f, "`{n}`"),
            Tok::Punct(p) => write!(f, "`{p}`"),
            Tok::End => f.write_str("end of signature"),
        }
    }
}

/// The largest `i <= at` (and `<= s.len()`) on a char boundary of `s`.
fn floor_boundary(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// `s` cut to at most `max` bytes (on a char boundary) with `…` appended when
/// cut: how foreign text is quoted in error messages.
pub(crate) fn clip(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max { Cow::Borrowed(s) } else { Cow::Owned(format!("{}…", &s[..floor_boundary(s, max)])) }
}

/// An [`Error::Signature`] for `text` at byte offset `at`. The column counts
/// characters (so the caret lines up); a text longer than [`MAX_EXCERPT`]
/// bytes is shown as a window of at most that many bytes around the offset,
/// with `…` where it was cut, and the column is the one within that window
/// (the message then says where the window lies). Never reads more of `text`
/// than the bytes before `at` and the window.
pub(crate) fn signature_error(text: &str, at: usize, message: String) -> Error {
    let at = floor_boundary(text, at);
    if text.len() <= MAX_EXCERPT {
        return Error::Signature { signature: text.to_owned(), column: text[..at].chars().count() + 1, message };
    }
    let start = floor_boundary(text, at.saturating_sub(MAX_EXCERPT / 2));
    let end = floor_boundary(text, start + MAX_EXCERPT);
    let (head, tail) = (if start > 0 { "…" } else { "" }, if end < text.len() { "…" } else { "" });
    let column = usize::from(start > 0) + text[start..at].chars().count() + 1;
    let whole = text.len();
    let message = if start == 0 {
        format!("{message} (in a {whole}-byte signature, shown cut)")
    } else {
        format!("{message} (character {} of a {whole}-byte signature, shown cut)", text[..at].chars().count() + 1)
    };
    Error::Signature { signature: format!("{head}{}{tail}", &text[start..end]), column, message }
}

struct Parser<'s> {
    text: &'s str,
    toks: Vec<(Tok, usize)>,
    pos: usize,
    lex_error: Option<(usize, String)>,
}

const PUNCTS: [&str; 15] = ["...", "->", "<", ">", "(", ")", "[", "]", ",", ":", "|", "-", "*", "+", "/"];

impl<'s> Parser<'s> {
    fn new(text: &'s str) -> Parser<'s> {
        let mut toks = Vec::new();
        let mut lex_error = None;
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i];
            if c.is_ascii_whitespace() {
                i += 1;
            } else if c.is_ascii_alphabetic() || c == b'_' {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                if i - start > MAX_NAME_LEN {
                    lex_error = Some((start + 1, format!("name `{}` is longer than {MAX_NAME_LEN} bytes", clip(&text[start..i], 32))));
                    break;
                }
                toks.push((Tok::Ident(text[start..i].to_owned()), start + 1));
            } else if c.is_ascii_digit() {
                let start = i;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                match text[start..i].parse::<i64>() {
                    Ok(n) => toks.push((Tok::Int(n), start + 1)),
                    Err(_) => {
                        lex_error = Some((start + 1, format!("integer `{}` is too large", clip(&text[start..i], 32))));
                        break;
                    }
                }
            } else if let Some(p) = PUNCTS.iter().find(|p| text[i..].starts_with(**p)) {
                toks.push((Tok::Punct(p), i + 1));
                i += p.len();
            } else {
                let ch = text[i..].chars().next().unwrap_or('?');
                lex_error = Some((i + 1, format!("unexpected character `{}`", ch.escape_debug())));
                break;
            }
        }
        toks.push((Tok::End, text.len() + 1));
        Parser { text, toks, pos: 0, lex_error }
    }

    /// An error at 1-based byte column `column`.
    fn err(&self, column: usize, message: impl Into<String>) -> Error {
        signature_error(self.text, column.saturating_sub(1), message.into())
    }

    fn peek(&self) -> &Tok {
        &self.toks[self.pos].0
    }
    fn col(&self) -> usize {
        self.toks[self.pos].1
    }
    fn bump(&mut self) -> (Tok, usize) {
        let t = self.toks[self.pos].clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }
    fn eat(&mut self, p: &str) -> bool {
        if *self.peek() == Tok::Punct(PUNCTS.iter().find(|q| **q == p).copied().unwrap_or("")) {
            self.bump();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, p: &str, what: &str) -> Result<()> {
        if self.eat(p) { Ok(()) } else { Err(self.err(self.col(), format!("expected `{p}` {what}, found {}", self.peek()))) }
    }
    fn ident(&mut self, what: &str) -> Result<(String, usize)> {
        match self.bump() {
            (Tok::Ident(s), col) => Ok((s, col)),
            (other, col) => Err(self.err(col, format!("expected {what}, found {other}"))),
        }
    }

    fn signature(mut self) -> Result<Signature> {
        if let Some((col, msg)) = self.lex_error.take() {
            return Err(self.err(col, msg));
        }
        let (name, _) = self.ident("the kernel name")?;
        let mut sig = Signature {
            name,
            type_vars: Vec::new(),
            params: Vec::new(),
            outputs: Vec::new(),
            symbols: Vec::new(),
            rests: Vec::new(),
            broadcast: Vec::new(),
            exprs: Vec::new(),
        };
        if self.eat("<") {
            loop {
                if sig.type_vars.len() == MAX_TYPE_VARS {
                    return Err(self.err(self.col(), format!("more than {MAX_TYPE_VARS} type variables")));
                }
                let (tv, col) = self.ident("a type variable name")?;
                if sig.type_vars.iter().any(|t| t.name == tv) {
                    return Err(self.err(col, format!("type variable `{tv}` declared twice")));
                }
                if tv.parse::<DType>().is_ok() || matches!(tv.as_str(), "mut") {
                    return Err(self.err(col, format!("type variable `{tv}` would shadow a dtype or keyword")));
                }
                self.expect(":", "after a type variable")?;
                let mut allowed = Vec::new();
                loop {
                    if allowed.len() == MAX_ALLOWED_DTYPES {
                        return Err(self.err(self.col(), format!("more than {MAX_ALLOWED_DTYPES} dtypes for `{tv}`")));
                    }
                    let (d, col) = self.ident("a dtype")?;
                    let dtype = d.parse::<DType>().map_err(|_| self.err(col, format!("unknown dtype `{d}`")))?;
                    if allowed.contains(&dtype) {
                        return Err(self.err(col, format!("dtype `{d}` listed twice")));
                    }
                    allowed.push(dtype);
                    if !self.eat("|") {
                        break;
                    }
                }
                sig.type_vars.push(TypeVar { name: tv, allowed });
                if !self.eat(",") {
                    break;
                }
            }
            self.expect(">", "to close the type variables")?;
        }
        self.expect("(", "to open the parameters")?;
        let mut input_syms = vec![false; 0];
        let mut input_rests = vec![false; 0];
        let mut tv_bound = vec![false; sig.type_vars.len()];
        if !self.eat(")") {
            loop {
                let col = self.col();
                let p = self.param(&mut sig, false)?;
                if let Some(t) = p.tensor() {
                    if let DTypeRef::Var(i) = t.dtype {
                        tv_bound[i] = true;
                    }
                    // An input's dim expression is checked, not bound: its
                    // symbols must be bound by the inputs before it.
                    for d in &t.dims {
                        if let Dim::Expr(e) = *d {
                            let mut used = Vec::new();
                            sig.exprs[e].symbols(&mut used);
                            if let Some(&s) = used.iter().find(|&&s| !input_syms.get(s).copied().unwrap_or(false)) {
                                return Err(self.err(
                                    col,
                                    format!("`{}`: dim `{}` is used in an expression before an input binds it", p.name, sig.symbols[s]),
                                ));
                            }
                        }
                    }
                    for d in &t.dims {
                        match *d {
                            Dim::Sym(i) => set(&mut input_syms, i),
                            Dim::Rest(i) => set(&mut input_rests, i),
                            Dim::Fixed(_) | Dim::Expr(_) => {}
                        }
                    }
                }
                sig.params.push(p);
                if !self.eat(",") {
                    break;
                }
            }
            self.expect(")", "to close the parameters")?;
        }
        if self.eat("->") {
            self.expect("(", "to open the outputs")?;
            loop {
                let col = self.col();
                let p = self.param(&mut sig, true)?;
                let t = p.tensor().ok_or_else(|| self.err(col, format!("output `{}` must be a tensor", p.name)))?;
                if let DTypeRef::Var(i) = t.dtype
                    && !tv_bound[i]
                {
                    return Err(
                        self.err(col, format!("output `{}`: type variable `{}` is not bound by any input", p.name, sig.type_vars[i].name))
                    );
                }
                for d in &t.dims {
                    match *d {
                        Dim::Sym(i) if !input_syms.get(i).copied().unwrap_or(false) => {
                            return Err(self.err(col, format!("output `{}`: dim `{}` is not bound by any input", p.name, sig.symbols[i])));
                        }
                        Dim::Rest(i) if !input_rests.get(i).copied().unwrap_or(false) => {
                            return Err(self.err(col, format!("output `{}`: `{}` is not bound by any input", p.name, sig.fmt_rest(i))));
                        }
                        Dim::Expr(i) => {
                            let mut used = Vec::new();
                            sig.exprs[i].symbols(&mut used);
                            if let Some(&s) = used.iter().find(|&&s| !input_syms.get(s).copied().unwrap_or(false)) {
                                return Err(
                                    self.err(col, format!("output `{}`: dim `{}` is not bound by any input", p.name, sig.symbols[s]))
                                );
                            }
                        }
                        _ => {}
                    }
                }
                sig.outputs.push(p);
                if !self.eat(",") {
                    break;
                }
            }
            self.expect(")", "to close the outputs")?;
        }
        if *self.peek() != Tok::End {
            return Err(self.err(self.col(), format!("unexpected {} after the signature", self.peek())));
        }
        if let Some(i) = tv_bound.iter().position(|b| !b) {
            return Err(self.err(1, format!("type variable `{}` is not used by any input tensor", sig.type_vars[i].name)));
        }
        Ok(sig)
    }

    fn param(&mut self, sig: &mut Signature, output: bool) -> Result<Param> {
        if sig.params.len() + sig.outputs.len() == MAX_PARAMS {
            return Err(self.err(self.col(), format!("more than {MAX_PARAMS} parameters and outputs")));
        }
        let (name, col) = self.ident("a parameter name")?;
        if sig.params.iter().chain(&sig.outputs).any(|p| p.name == name) {
            return Err(self.err(col, format!("parameter `{name}` declared twice")));
        }
        self.expect(":", "after a parameter name")?;
        let mutable = matches!(self.peek(), Tok::Ident(s) if s == "mut");
        if mutable {
            let col = self.col();
            self.bump();
            if output {
                return Err(self.err(col, "outputs are always written: `mut` is for inputs"));
            }
        }
        let (ty, ty_col) = self.ident("a dtype, type variable or scalar type")?;
        if !matches!(self.peek(), Tok::Punct("[")) {
            if mutable {
                return Err(self.err(ty_col, "`mut` needs a tensor type like `mut T[N]`"));
            }
            let kind = match ty.as_str() {
                "f64" => ScalarKind::F64,
                "i64" => ScalarKind::I64,
                "bool" => ScalarKind::Bool,
                other => {
                    return Err(self.err(ty_col, format!("scalars are f64, i64 or bool; for a tensor write `{other}[dims]`")));
                }
            };
            return Ok(Param { name, kind: ParamKind::Scalar(kind) });
        }
        let dtype = match sig.type_vars.iter().position(|t| t.name == ty) {
            Some(i) => DTypeRef::Var(i),
            None => DTypeRef::Concrete(
                ty.parse::<DType>().map_err(|_| self.err(ty_col, format!("`{ty}` is neither a dtype nor a declared type variable")))?,
            ),
        };
        self.expect("[", "to open the dims")?;
        let mut dims = Vec::new();
        if !self.eat("]") {
            loop {
                let col = self.col();
                if dims.len() == MAX_DIMS {
                    return Err(self.err(col, format!("more than {MAX_DIMS} dims")));
                }
                let is_expr = matches!(self.peek(), Tok::Punct("("))
                    || (matches!(self.peek(), Tok::Ident(s) if s == "min" || s == "max")
                        && matches!(self.toks.get(self.pos + 1), Some((Tok::Punct("("), _))));
                if is_expr {
                    if sig.exprs.len() == MAX_SYMBOLS {
                        return Err(self.err(col, format!("more than {MAX_SYMBOLS} dim expressions")));
                    }
                    let e = self.dim_atom(sig, 0)?;
                    sig.exprs.push(e);
                    dims.push(Dim::Expr(sig.exprs.len() - 1));
                    if !self.eat(",") {
                        break;
                    }
                    continue;
                }
                let dim = match self.bump() {
                    (Tok::Int(n), _) => Dim::Fixed(n),
                    (Tok::Ident(s), _) => {
                        if sig.rests.contains(&s) {
                            return Err(self.err(col, format!("`{s}` is already a `...{s}` group")));
                        }
                        Dim::Sym(index_of(&mut sig.symbols, &s, MAX_SYMBOLS).map_err(|m| self.err(col, m))?)
                    }
                    (Tok::Punct("..."), _) => {
                        let (s, c) = self.ident("a name after `...`")?;
                        if sig.symbols.contains(&s) {
                            return Err(self.err(c, format!("`{s}` is already a single dim")));
                        }
                        if dims.iter().any(|d| matches!(d, Dim::Rest(_))) {
                            return Err(self.err(col, "at most one `...` group per tensor"));
                        }
                        Dim::Rest(self.group(sig, &s, c, false)?)
                    }
                    (Tok::Punct("*"), _) => {
                        let (s, c) = self.ident("a name after `*`")?;
                        if sig.symbols.contains(&s) {
                            return Err(self.err(c, format!("`{s}` is already a single dim")));
                        }
                        if !dims.is_empty() || !matches!(self.peek(), Tok::Punct("]")) {
                            return Err(self.err(col, format!("`*{s}` broadcasts whole shapes: it must be the tensor's only dim")));
                        }
                        Dim::Rest(self.group(sig, &s, c, true)?)
                    }
                    (Tok::Punct("-"), _) => return Err(self.err(col, "dims must not be negative")),
                    (other, _) => return Err(self.err(col, format!("expected a dim (integer, name or `...NAME`), found {other}"))),
                };
                dims.push(dim);
                if !self.eat(",") {
                    break;
                }
            }
            self.expect("]", "to close the dims")?;
        }
        let has_rest = dims.iter().any(|d| matches!(d, Dim::Rest(_)));
        Ok(Param { name, kind: ParamKind::Tensor(TensorType { dtype, dims, mutable, has_rest }) })
    }
}

/// How deeply dim expressions may nest (they are foreign input).
const MAX_EXPR_DEPTH: usize = 16;

impl Parser<'_> {
    fn dim_expr(&mut self, sig: &mut Signature, depth: usize) -> Result<DimExpr> {
        let mut e = self.dim_term(sig, depth)?;
        loop {
            if self.eat("+") {
                e = DimExpr::Add(Box::new(e), Box::new(self.dim_term(sig, depth)?));
            } else if self.eat("-") {
                e = DimExpr::Sub(Box::new(e), Box::new(self.dim_term(sig, depth)?));
            } else {
                return Ok(e);
            }
        }
    }

    fn dim_term(&mut self, sig: &mut Signature, depth: usize) -> Result<DimExpr> {
        let mut e = self.dim_atom(sig, depth)?;
        loop {
            if self.eat("*") {
                e = DimExpr::Mul(Box::new(e), Box::new(self.dim_atom(sig, depth)?));
            } else if self.eat("/") {
                e = DimExpr::Div(Box::new(e), Box::new(self.dim_atom(sig, depth)?));
            } else {
                return Ok(e);
            }
        }
    }

    fn dim_atom(&mut self, sig: &mut Signature, depth: usize) -> Result<DimExpr> {
        let col = self.col();
        if depth == MAX_EXPR_DEPTH {
            return Err(self.err(col, format!("a dim expression nests more than {MAX_EXPR_DEPTH} deep")));
        }
        match self.bump() {
            (Tok::Int(n), _) => Ok(DimExpr::Int(n)),
            (Tok::Punct("("), _) => {
                let e = self.dim_expr(sig, depth + 1)?;
                self.expect(")", "to close the dim expression")?;
                Ok(e)
            }
            (Tok::Ident(f), _) if (f == "min" || f == "max") && matches!(self.peek(), Tok::Punct("(")) => {
                self.bump();
                let a = self.dim_expr(sig, depth + 1)?;
                self.expect(",", &format!("between `{f}`'s arguments"))?;
                let b = self.dim_expr(sig, depth + 1)?;
                self.expect(")", &format!("to close `{f}(`"))?;
                Ok(if f == "min" { DimExpr::Min(Box::new(a), Box::new(b)) } else { DimExpr::Max(Box::new(a), Box::new(b)) })
            }
            (Tok::Ident(s), _) => {
                if sig.rests.contains(&s) {
                    return Err(self.err(col, format!("`{s}` is a `...{s}` group, not a single dim")));
                }
                Ok(DimExpr::Sym(index_of(&mut sig.symbols, &s, MAX_SYMBOLS).map_err(|m| self.err(col, m))?))
            }
            (other, _) => Err(self.err(col, format!("expected a dim symbol, integer or `(` in a dim expression, found {other}"))),
        }
    }

    /// The index of `...` group `name` (`*name` when `broadcast`), declared on
    /// first sight; a name is one kind of group throughout, and a signature
    /// has at most one broadcast group.
    fn group(&self, sig: &mut Signature, name: &str, col: usize, broadcast: bool) -> Result<usize> {
        if let Some(i) = sig.rests.iter().position(|n| n == name) {
            if sig.broadcast[i] != broadcast {
                let (was, now) = if broadcast { ("...", "*") } else { ("*", "...") };
                return Err(
                    self.err(col, format!("`{was}{name}` is written `{now}{name}` here: a group is broadcast (`*`) everywhere or nowhere"))
                );
            }
            return Ok(i);
        }
        if broadcast && sig.broadcast.iter().any(|b| *b) {
            return Err(self.err(col, format!("`*{name}`: at most one broadcast group per signature")));
        }
        let i = index_of(&mut sig.rests, name, MAX_RESTS).map_err(|m| self.err(col, m))?;
        sig.broadcast.push(broadcast);
        Ok(i)
    }
}

fn set(flags: &mut Vec<bool>, i: usize) {
    if flags.len() <= i {
        flags.resize(i + 1, false);
    }
    flags[i] = true;
}

fn index_of(names: &mut Vec<String>, name: &str, max: usize) -> std::result::Result<usize, String> {
    if let Some(i) = names.iter().position(|n| n == name) {
        return Ok(i);
    }
    if names.len() == max {
        return Err(format!("more than {max} distinct names of this kind"));
    }
    names.push(name.to_owned());
    Ok(names.len() - 1)
}

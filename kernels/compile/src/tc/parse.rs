//! The comprehension language's text to its syntax tree: a lexer and a
//! recursive-descent parser. Every error names the line and column and
//! quotes the offending line.
//!
//! ```text
//! program   := def+
//! def       := 'def' NAME '(' params? ')' '->' '(' outputs ')' '{' stmt* '}'
//! param     := TYPE ( '(' dim ( ',' dim )* ')' )? NAME         dim := NAME | INT
//! outputs   := output ( ',' output )*                          output := ( TYPE ( '(' dim, ... ')' )? )? NAME
//! stmt      := NAME ( '(' ( NAME ( ',' NAME )* )? ')' )? OP expr ( 'where' range ( ',' range )* )?
//! OP        := '=' | '+=' | '*=' | 'max=' | 'min=' | '+=!' | '*=!' | 'max=!' | 'min=!'
//! range     := NAME 'in' expr ':' expr
//! expr      := the C operators ?:, ||, &&, == != < <= > >=, + -, * / %, unary - and !,
//!              NAME '(' args ')' (a tensor access or a builtin), NAME, numbers
//! ```
//! `#` starts a comment to the end of the line.

use std::fmt;

use dlbridge_core::{DType, Error, ErrorKind, Result};

/// A place in the text: 1-based line and column (in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.col)
    }
}

/// A declared element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemType {
    /// A floating-point type (`float`, `double`, `half`, `float16/32/64`,
    /// `bfloat16`): the definition's floating type, the caller's choice.
    Float,
    /// A fixed integer or boolean type.
    Fixed(DType),
}

/// A declared dim: a size symbol or a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DimDecl {
    Sym(String, Pos),
    Int(i64),
}

/// A parameter (`float(M, N) A`) or a typed output.
#[derive(Debug, Clone)]
pub struct TensorDecl {
    pub name: String,
    pub pos: Pos,
    pub ty: ElemType,
    pub dims: Vec<DimDecl>,
}

/// An output: its name, and its type when the text gives one.
#[derive(Debug, Clone)]
pub struct OutputDecl {
    pub name: String,
    pub pos: Pos,
    pub decl: Option<TensorDecl>,
}

/// A statement's operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Assign,
    Add,
    Mul,
    Max,
    Min,
}

impl Op {
    /// Its text, with `!` when the statement initialises first.
    pub fn text(self, init: bool) -> String {
        let s = match self {
            Op::Assign => "=",
            Op::Add => "+=",
            Op::Mul => "*=",
            Op::Max => "max=",
            Op::Min => "min=",
        };
        if init { format!("{s}!") } else { s.to_owned() }
    }
}

/// Unary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Un {
    Neg,
    Not,
}

/// Binary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    And,
    Or,
}

impl Bin {
    pub fn text(self) -> &'static str {
        match self {
            Bin::Add => "+",
            Bin::Sub => "-",
            Bin::Mul => "*",
            Bin::Div => "/",
            Bin::Rem => "%",
            Bin::Lt => "<",
            Bin::Le => "<=",
            Bin::Gt => ">",
            Bin::Ge => ">=",
            Bin::Eq => "==",
            Bin::Ne => "!=",
            Bin::And => "&&",
            Bin::Or => "||",
        }
    }
    fn prec(self) -> u8 {
        match self {
            Bin::Or => 1,
            Bin::And => 2,
            Bin::Eq | Bin::Ne => 3,
            Bin::Lt | Bin::Le | Bin::Gt | Bin::Ge => 4,
            Bin::Add | Bin::Sub => 5,
            Bin::Mul | Bin::Div | Bin::Rem => 6,
        }
    }
    pub fn is_comparison(self) -> bool {
        matches!(self, Bin::Lt | Bin::Le | Bin::Gt | Bin::Ge | Bin::Eq | Bin::Ne | Bin::And | Bin::Or)
    }
}

/// An expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A number; `int` when written without a point or exponent.
    Num {
        value: f64,
        int: bool,
    },
    /// A name: an index, a size symbol or a 0-d tensor.
    Name(String, Pos),
    /// `A(i, j + 1)`: a tensor access (or, while parsing, a call; the checker
    /// tells them apart by the name).
    Call(String, Vec<Expr>, Pos),
    Unary(Un, Box<Expr>),
    Binary(Bin, Box<Expr>, Box<Expr>),
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
}

impl Expr {
    /// How deep its tree is (a leaf is 1).
    pub fn levels(&self) -> usize {
        match self {
            Expr::Num { .. } | Expr::Name(..) => 1,
            Expr::Call(_, args, _) => 1 + args.iter().map(Expr::levels).max().unwrap_or(0),
            Expr::Unary(_, a) => 1 + a.levels(),
            Expr::Binary(_, a, b) => 1 + a.levels().max(b.levels()),
            Expr::Select(c, a, b) => 1 + c.levels().max(a.levels()).max(b.levels()),
        }
    }

    /// How many operands and operators it has.
    pub fn size(&self) -> usize {
        match self {
            Expr::Num { .. } | Expr::Name(..) => 1,
            Expr::Call(_, args, _) => 1 + args.iter().map(Expr::size).sum::<usize>(),
            Expr::Unary(_, a) => 1 + a.size(),
            Expr::Binary(_, a, b) => 1 + a.size() + b.size(),
            Expr::Select(c, a, b) => 1 + c.size() + a.size() + b.size(),
        }
    }

    /// The expression as text, parenthesised where needed.
    pub fn text(&self) -> String {
        self.fmt_prec(0)
    }
    fn fmt_prec(&self, outer: u8) -> String {
        match self {
            Expr::Num { value, int } => {
                if *int {
                    format!("{}", *value as i64)
                } else {
                    let s = format!("{value:?}");
                    if s.contains(['.', 'e', 'i', 'N']) { s } else { format!("{s}.0") }
                }
            }
            Expr::Name(n, _) => n.clone(),
            Expr::Call(f, args, _) => format!("{f}({})", args.iter().map(|a| a.fmt_prec(0)).collect::<Vec<_>>().join(", ")),
            Expr::Unary(Un::Neg, e) => format!("-{}", e.fmt_prec(7)),
            Expr::Unary(Un::Not, e) => format!("!{}", e.fmt_prec(7)),
            Expr::Binary(op, a, b) => {
                let p = op.prec();
                let t = format!("{} {} {}", a.fmt_prec(p), op.text(), b.fmt_prec(p + 1));
                if p < outer { format!("({t})") } else { t }
            }
            Expr::Select(c, a, b) => {
                let t = format!("{} ? {} : {}", c.fmt_prec(1), a.fmt_prec(0), b.fmt_prec(0));
                if outer > 0 { format!("({t})") } else { t }
            }
        }
    }
}

/// `where i in lo:hi`.
#[derive(Debug, Clone)]
pub struct Where {
    pub var: String,
    pub pos: Pos,
    pub lo: Expr,
    pub hi: Expr,
}

/// One statement.
#[derive(Debug, Clone)]
pub struct Stmt {
    pub lhs: String,
    pub pos: Pos,
    pub index: Vec<(String, Pos)>,
    pub op: Op,
    pub init: bool,
    pub rhs: Expr,
    pub wheres: Vec<Where>,
    /// The statement's text, for messages and the generated code's comments.
    pub text: String,
}

/// One `def`.
#[derive(Debug, Clone)]
pub struct Def {
    pub name: String,
    pub pos: Pos,
    pub params: Vec<TensorDecl>,
    pub outputs: Vec<OutputDecl>,
    pub stmts: Vec<Stmt>,
    /// The definition's text, from `def` to its `}`.
    pub text: String,
}

/// Most nesting of parentheses, calls and operators the parser follows (the
/// text is foreign input; a chain `a + b + c` is read in a loop).
const MAX_DEPTH: usize = 64;

/// Most levels of a parsed expression: a chain `a + b + c` is a level per
/// operator (every pass over an expression recurses through its levels).
pub const MAX_LEVELS: usize = 128;

/// Most operands and operators in an expression: each read of a floating
/// tensor on a right side becomes a statement of the derived backward.
pub const MAX_TERMS: usize = 1024;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Num(f64, bool),
    Punct(&'static str),
    End,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Name(s) => write!(f, "`{s}`"),
            Tok::Num(..) => f.write_str("a number"),
            Tok::Punct(p) => write!(f, "`{p}`"),
            Tok::End => f.write_str("the end of the text"),
        }
    }
}

const PUNCTS: &[&str] = &[
    "->", "+=!", "*=!", "+=", "*=", "==", "!=", "<=", ">=", "&&", "||", "(", ")", "{", "}", ",", ":", "?", "+", "-", "*", "/", "%", "<",
    ">", "!", "=",
];

/// An error at `pos` of `text`, quoting the line with a caret under the column.
pub(crate) fn error_at(text: &str, pos: Pos, message: impl fmt::Display) -> Error {
    let line = text.lines().nth(pos.line.saturating_sub(1)).unwrap_or("");
    let shown: String = line.chars().take(160).collect();
    // The caret's indent copies the line's tabs, so it lines up however wide a tab is shown.
    let caret: String = shown.chars().take(pos.col.saturating_sub(1)).map(|c| if c == '\t' { '\t' } else { ' ' }).collect();
    Error::Coded { kind: ErrorKind::Value, message: format!("{pos}: {message}\n  {shown}\n  {caret}^") }
}

struct Lexer;

impl Lexer {
    fn run(text: &str) -> Result<Vec<(Tok, Pos, usize)>> {
        let mut toks = Vec::new();
        let (mut line, mut line_start) = (1usize, 0usize);
        let bytes = text.as_bytes();
        let mut i = 0;
        let pos_of = |i: usize, line: usize, line_start: usize| Pos { line, col: text[line_start..i].chars().count() + 1 };
        while i < bytes.len() {
            let c = bytes[i];
            if c == b'\n' {
                i += 1;
                line += 1;
                line_start = i;
            } else if c.is_ascii_whitespace() {
                i += 1;
            } else if c == b'#' {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            } else if c.is_ascii_alphabetic() || c == b'_' {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let word = &text[start..i];
                if word.len() > 64 {
                    return Err(error_at(
                        text,
                        pos_of(start, line, line_start),
                        format!("the name `{}…` is longer than 64 characters", &word[..32]),
                    ));
                }
                // `max=`, `min=`, `max=!`, `min=!` are operators.
                if (word == "max" || word == "min") && bytes.get(i) == Some(&b'=') && bytes.get(i + 1) != Some(&b'=') {
                    let bang = bytes.get(i + 1) == Some(&b'!');
                    let op = match (word, bang) {
                        ("max", false) => "max=",
                        ("max", true) => "max=!",
                        ("min", false) => "min=",
                        _ => "min=!",
                    };
                    toks.push((Tok::Punct(op), pos_of(start, line, line_start), start));
                    i += 1 + usize::from(bang);
                    continue;
                }
                toks.push((Tok::Name(word.to_owned()), pos_of(start, line, line_start), start));
            } else if c.is_ascii_digit() || (c == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)) {
                let start = i;
                let mut int = true;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                if i < bytes.len() && bytes[i] == b'.' {
                    int = false;
                    i += 1;
                    while i < bytes.len() && bytes[i].is_ascii_digit() {
                        i += 1;
                    }
                }
                if i < bytes.len() && (bytes[i] == b'e' || bytes[i] == b'E') {
                    let mut j = i + 1;
                    if j < bytes.len() && (bytes[j] == b'+' || bytes[j] == b'-') {
                        j += 1;
                    }
                    if j < bytes.len() && bytes[j].is_ascii_digit() {
                        int = false;
                        i = j;
                        while i < bytes.len() && bytes[i].is_ascii_digit() {
                            i += 1;
                        }
                    }
                }
                // C's float suffix (`1.0f`).
                if !int && i < bytes.len() && (bytes[i] == b'f' || bytes[i] == b'F') {
                    i += 1;
                }
                if i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'.') {
                    let end = text[i..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.')).map_or(text.len(), |k| i + k);
                    return Err(error_at(
                        text,
                        pos_of(start, line, line_start),
                        format!("`{}` is not a number (numbers are decimal: `16`, `1.5`, `2e-3`, `1.5f`)", &text[start..end]),
                    ));
                }
                let digits = text[start..i].trim_end_matches(['f', 'F']);
                let value: f64 =
                    digits.parse().map_err(|_| error_at(text, pos_of(start, line, line_start), format!("bad number `{digits}`")))?;
                if int && digits.parse::<u64>().map_or(true, |v| v > 1 << 53) {
                    return Err(error_at(
                        text,
                        pos_of(start, line, line_start),
                        format!("the integer `{digits}` is too large (at most 2^53 = 9007199254740992)"),
                    ));
                }
                if !value.is_finite() {
                    return Err(error_at(
                        text,
                        pos_of(start, line, line_start),
                        format!("the number `{digits}` is out of range (a literal must be a finite double)"),
                    ));
                }
                toks.push((Tok::Num(value, int), pos_of(start, line, line_start), start));
            } else if let Some(p) = PUNCTS.iter().find(|p| text[i..].starts_with(**p)) {
                toks.push((Tok::Punct(p), pos_of(i, line, line_start), i));
                i += p.len();
            } else {
                let ch = text[i..].chars().next().unwrap_or('?');
                return Err(error_at(text, pos_of(i, line, line_start), format!("unexpected character `{}`", ch.escape_debug())));
            }
        }
        toks.push((Tok::End, pos_of(text.len(), line, line_start), text.len()));
        Ok(toks)
    }
}

/// Parses every `def` of `text`.
pub fn parse(text: &str) -> Result<Vec<Def>> {
    let toks = Lexer::run(text)?;
    let mut p = Parser { text, toks, pos: 0 };
    let mut defs = Vec::new();
    while p.peek() != &Tok::End {
        defs.push(p.def()?);
    }
    if defs.is_empty() {
        return Err(Error::Coded { kind: ErrorKind::Value, message: "the text has no `def`".to_owned() });
    }
    Ok(defs)
}

/// The element type a type name denotes.
fn elem_type(name: &str) -> Option<ElemType> {
    Some(match name {
        "float" | "double" | "half" | "float16" | "float32" | "float64" | "bfloat16" => ElemType::Float,
        "int8" => ElemType::Fixed(DType::I8),
        "int16" => ElemType::Fixed(DType::I16),
        "int32" | "int" => ElemType::Fixed(DType::I32),
        "int64" | "long" => ElemType::Fixed(DType::I64),
        "uint8" => ElemType::Fixed(DType::U8),
        "uint16" => ElemType::Fixed(DType::U16),
        "uint32" => ElemType::Fixed(DType::U32),
        "uint64" => ElemType::Fixed(DType::U64),
        "bool" => ElemType::Fixed(DType::BOOL),
        _ => return None,
    })
}

const TYPE_NAMES: &str =
    "float, double, half, float16, float32, float64, bfloat16, int8, int16, int32, int64, uint8, uint16, uint32, uint64, bool";

struct Parser<'t> {
    text: &'t str,
    toks: Vec<(Tok, Pos, usize)>,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].0
    }
    fn peek_at(&self, k: usize) -> &Tok {
        &self.toks[(self.pos + k).min(self.toks.len() - 1)].0
    }
    fn here(&self) -> Pos {
        self.toks[self.pos].1
    }
    fn offset(&self) -> usize {
        self.toks[self.pos].2
    }
    fn bump(&mut self) -> (Tok, Pos) {
        let (t, p, _) = self.toks[self.pos].clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        (t, p)
    }
    fn err(&self, pos: Pos, message: impl fmt::Display) -> Error {
        error_at(self.text, pos, message)
    }
    fn is(&self, p: &str) -> bool {
        matches!(self.peek(), Tok::Punct(q) if *q == p)
    }
    fn eat(&mut self, p: &str) -> bool {
        if self.is(p) {
            self.bump();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, p: &str, what: &str) -> Result<Pos> {
        let at = self.here();
        if self.eat(p) { Ok(at) } else { Err(self.err(at, format!("expected `{p}` {what}, found {}", self.peek()))) }
    }
    fn name(&mut self, what: &str) -> Result<(String, Pos)> {
        match self.bump() {
            (Tok::Name(s), p) => Ok((s, p)),
            (t, p) => Err(self.err(p, format!("expected {what}, found {t}"))),
        }
    }

    fn def(&mut self) -> Result<Def> {
        let start = self.offset();
        let (kw, at) = self.name("`def`")?;
        if kw != "def" {
            return Err(self.err(at, format!("expected `def`, found `{kw}`")));
        }
        let (name, pos) = self.name("the definition's name")?;
        // The name becomes a registered kernel's, a torch operator's
        // (`torch.ops.dlbridge.NAME`) and an attribute of what `dlbridge.define`
        // returns: a leading `_` would meet those objects' own attributes.
        if name.starts_with('_') {
            return Err(self.err(
                pos,
                format!("`def {name}`: a definition's name may not start with `_` (names starting with `_` belong to the objects it becomes: rename it, e.g. `{}`)", name.trim_start_matches('_')),
            ));
        }
        self.expect("(", "to open the parameters")?;
        let mut params = Vec::new();
        if !self.eat(")") {
            loop {
                params.push(self.tensor_decl(true)?.ok_or_else(|| self.err(self.here(), "expected a parameter type"))?);
                if !self.eat(",") {
                    break;
                }
            }
            self.expect(")", "to close the parameters")?;
        }
        self.expect("->", "before the outputs")?;
        self.expect("(", "to open the outputs")?;
        let mut outputs = Vec::new();
        loop {
            let decl = self.tensor_decl(false)?;
            let (oname, opos) = match &decl {
                Some(d) => (d.name.clone(), d.pos),
                None => self.name("an output name")?,
            };
            outputs.push(OutputDecl { name: oname, pos: opos, decl });
            if !self.eat(",") {
                break;
            }
        }
        self.expect(")", "to close the outputs")?;
        self.expect("{", "to open the definition's body")?;
        let mut stmts = Vec::new();
        while !self.is("}") {
            if self.peek() == &Tok::End {
                return Err(self.err(self.here(), format!("`def {name}` is not closed: expected `}}`")));
            }
            stmts.push(self.stmt()?);
        }
        let end = self.offset() + 1;
        self.bump();
        Ok(Def { name, pos, params, outputs, stmts, text: self.text[start..end].to_owned() })
    }

    /// `float(M, N) A` (or, for an output, `float(M) O`, or just a name:
    /// then `None` and nothing is consumed).
    fn tensor_decl(&mut self, param: bool) -> Result<Option<TensorDecl>> {
        let (ty_name, ty_pos) = match self.peek() {
            Tok::Name(s) => (s.clone(), self.here()),
            t => return Err(self.err(self.here(), format!("expected {}, found {t}", if param { "a parameter type" } else { "an output" }))),
        };
        let typed = matches!(self.peek_at(1), Tok::Name(_) | Tok::Punct("("));
        if !param && !typed {
            return Ok(None);
        }
        let Some(ty) = elem_type(&ty_name) else {
            return Err(self.err(ty_pos, format!("unknown type `{ty_name}`: the types are {TYPE_NAMES}")));
        };
        self.bump();
        let mut dims = Vec::new();
        if self.eat("(") {
            loop {
                match self.bump() {
                    (Tok::Name(s), p) => dims.push(DimDecl::Sym(s, p)),
                    (Tok::Num(v, true), _) => dims.push(DimDecl::Int(v as i64)),
                    (t, p) => return Err(self.err(p, format!("expected a size symbol or an integer, found {t}"))),
                }
                if !self.eat(",") {
                    break;
                }
            }
            self.expect(")", "to close the sizes")?;
        }
        let (name, pos) = self.name(if param { "the parameter's name" } else { "the output's name" })?;
        Ok(Some(TensorDecl { name, pos, ty, dims }))
    }

    fn stmt(&mut self) -> Result<Stmt> {
        let start = self.offset();
        let (lhs, pos) = self.name("a statement (`O(i, j) = ...`)")?;
        let mut index = Vec::new();
        if self.eat("(") && !self.eat(")") {
            loop {
                match self.bump() {
                    (Tok::Name(s), p) => index.push((s, p)),
                    (t, p) => {
                        return Err(self.err(
                            p,
                            format!("expected an index name on the left of the statement, found {t} (the left side takes plain indices)"),
                        ));
                    }
                }
                if !self.eat(",") {
                    break;
                }
            }
            if !self.is(")") {
                return Err(self.err(
                    self.here(),
                    format!("expected `,` or `)` after an index on the left, found {} (the left side takes plain indices)", self.peek()),
                ));
            }
            self.bump();
        }
        let at = self.here();
        let (op, init) = match self.bump().0 {
            Tok::Punct("=") => (Op::Assign, false),
            Tok::Punct("+=") => (Op::Add, false),
            Tok::Punct("+=!") => (Op::Add, true),
            Tok::Punct("*=") => (Op::Mul, false),
            Tok::Punct("*=!") => (Op::Mul, true),
            Tok::Punct("max=") => (Op::Max, false),
            Tok::Punct("max=!") => (Op::Max, true),
            Tok::Punct("min=") => (Op::Min, false),
            Tok::Punct("min=!") => (Op::Min, true),
            t => return Err(self.err(at, format!("expected `=`, `+=`, `*=`, `max=`, `min=` or their `!` forms, found {t}"))),
        };
        let rhs = self.bounded_expr("the right side")?;
        let mut wheres = Vec::new();
        if matches!(self.peek(), Tok::Name(w) if w == "where") {
            self.bump();
            loop {
                let (var, vpos) = self.name("an index after `where`")?;
                let (kw, kpos) = self.name("`in`")?;
                if kw != "in" {
                    return Err(self.err(kpos, format!("expected `in`, found `{kw}`")));
                }
                let lo = self.bounded_expr("a range's start")?;
                self.expect(":", "between a range's bounds (`lo:hi`)")?;
                let hi = self.bounded_expr("a range's end")?;
                wheres.push(Where { var, pos: vpos, lo, hi });
                if !self.eat(",") {
                    break;
                }
            }
        }
        let end = self.offset();
        let text = self.text[start..end].split_whitespace().collect::<Vec<_>>().join(" ");
        Ok(Stmt { lhs, pos, index, op, init, rhs, wheres, text })
    }

    fn too_deep(&self, at: Pos) -> Error {
        self.err(
            at,
            format!(
                "the expression is more than {MAX_LEVELS} levels deep (a chain `a + b + ...` is a level per operator): split it over several statements (`O(i) += ...` adds to `O`)"
            ),
        )
    }

    /// An expression within [`MAX_TERMS`] (`what` names it in the error, at
    /// its start); every expression the parser returns is within
    /// [`MAX_LEVELS`].
    fn bounded_expr(&mut self, what: &str) -> Result<Expr> {
        let at = self.here();
        let e = self.expr(0)?;
        let terms = e.size();
        if terms > MAX_TERMS {
            return Err(
                self.err(at, format!("{what} has {terms} operands and operators, more than {MAX_TERMS}: split it over several statements"))
            );
        }
        Ok(e)
    }

    fn expr(&mut self, depth: usize) -> Result<Expr> {
        if depth > MAX_DEPTH {
            return Err(self.err(self.here(), format!("the expression nests more than {MAX_DEPTH} deep")));
        }
        let cond = self.binary(1, depth)?;
        let at = self.here();
        if self.eat("?") {
            let a = self.expr(depth + 1)?;
            self.expect(":", "in `c ? a : b`")?;
            let b = self.expr(depth + 1)?;
            let select = Expr::Select(Box::new(cond), Box::new(a), Box::new(b));
            if select.levels() > MAX_LEVELS {
                return Err(self.too_deep(at));
            }
            return Ok(select);
        }
        Ok(cond)
    }

    fn bin_op(&self) -> Option<Bin> {
        Some(match self.peek() {
            Tok::Punct("||") => Bin::Or,
            Tok::Punct("&&") => Bin::And,
            Tok::Punct("==") => Bin::Eq,
            Tok::Punct("!=") => Bin::Ne,
            Tok::Punct("<") => Bin::Lt,
            Tok::Punct("<=") => Bin::Le,
            Tok::Punct(">") => Bin::Gt,
            Tok::Punct(">=") => Bin::Ge,
            Tok::Punct("+") => Bin::Add,
            Tok::Punct("-") => Bin::Sub,
            Tok::Punct("*") => Bin::Mul,
            Tok::Punct("/") => Bin::Div,
            Tok::Punct("%") => Bin::Rem,
            _ => return None,
        })
    }

    fn binary(&mut self, min_prec: u8, depth: usize) -> Result<Expr> {
        let mut lhs = self.unary(depth)?;
        let mut levels = lhs.levels();
        while let Some(op) = self.bin_op().filter(|op| op.prec() >= min_prec) {
            let at = self.here();
            self.bump();
            let rhs = self.binary(op.prec() + 1, depth + 1)?;
            levels = 1 + levels.max(rhs.levels());
            if levels > MAX_LEVELS {
                return Err(self.too_deep(at));
            }
            lhs = Expr::Binary(op, Box::new(lhs), Box::new(rhs));
        }
        Ok(lhs)
    }

    fn unary(&mut self, depth: usize) -> Result<Expr> {
        if depth > MAX_DEPTH {
            return Err(self.err(self.here(), format!("the expression nests more than {MAX_DEPTH} deep")));
        }
        if self.eat("-") {
            return Ok(Expr::Unary(Un::Neg, Box::new(self.unary(depth + 1)?)));
        }
        if self.eat("+") {
            return self.unary(depth + 1);
        }
        if self.eat("!") {
            return Ok(Expr::Unary(Un::Not, Box::new(self.unary(depth + 1)?)));
        }
        match self.bump() {
            (Tok::Num(v, int), _) => Ok(Expr::Num { value: v, int }),
            (Tok::Punct("("), _) => {
                let e = self.expr(depth + 1)?;
                self.expect(")", "to close `(`")?;
                Ok(e)
            }
            (Tok::Name(n), p) => {
                if self.eat("(") {
                    let mut args = Vec::new();
                    if !self.eat(")") {
                        loop {
                            args.push(self.expr(depth + 1)?);
                            if !self.eat(",") {
                                break;
                            }
                        }
                        self.expect(")", &format!("to close `{n}(`"))?;
                    }
                    Ok(Expr::Call(n, args, p))
                } else {
                    Ok(Expr::Name(n, p))
                }
            }
            (t, p) => Err(self.err(p, format!("expected an expression, found {t}"))),
        }
    }
}

#[cfg(test)]
mod tests;

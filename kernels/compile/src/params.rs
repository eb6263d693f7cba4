//! CuPy's parameter language and the kernel specifications built from it.
//!
//! CuPy (`cupy/_core/_kernel.pyx`, `ParameterInfo`) declares a kernel's
//! parameters as text: `in_params = 'T x, raw T y'`, `out_params = 'float32 z'`.
//! The text is a comma-separated list; each parameter is whitespace-separated
//! tokens `[keywords...] TYPE NAME`:
//!
//! * `TYPE` of one character (`T`, `U`) is a *type placeholder* (a type
//!   variable, bound to a dtype per call); anything longer must be a NumPy
//!   dtype name (`bool`, `int8`..`int64`, `uint8`..`uint64`, `float16`,
//!   `float32`, `float64`, `complex64`, `complex128`);
//! * keywords: `raw` (the array is not broadcast; the body indexes it with a
//!   flat C-order index, `y[k]`) and `mut` (dlbridge's spelling of CuPy's
//!   `_non_const`, both accepted: an input the body may write; inputs are
//!   otherwise `const`).
//!
//! [`ElementwiseSpec`] and [`ReductionSpec`] validate a whole kernel (names,
//! type variables, what may be raw) and derive its registry signature: the
//! one place the registry learns its dtypes and shapes from. Elementwise
//! kernels broadcast their non-raw operands with the `*S` group; each raw
//! input gets its own `...R<k>` group.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use dlbridge_core::{DType, Error, ErrorKind, Result};
use dlbridge_registry::Signature;
use dlbridge_registry::signature::{MAX_NAME_LEN, MAX_PARAMS, MAX_RESTS, MAX_TYPE_VARS};

/// A parameter's type: a placeholder bound per call, or a fixed dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamType {
    /// A one-character type placeholder (`T`).
    Var(char),
    /// A fixed dtype (written with its NumPy name in the parameter text).
    Concrete(DType),
}

/// One parsed parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// Its name as the body refers to it.
    pub name: String,
    /// Its type.
    pub ty: ParamType,
    /// `raw`: not broadcast, indexed by the body with a flat C-order index.
    pub raw: bool,
    /// `mut` (or CuPy's `_non_const`): an input the body may write.
    pub mutable: bool,
}

/// The dtype a NumPy dtype name denotes (`float32` → `f32`); `None` for
/// anything that is not exactly one of NumPy's canonical names
/// ([`dlbridge_core::dtype::NUMPY_NAMES`]).
pub fn numpy_dtype(name: &str) -> Option<DType> {
    DType::from_numpy_name(name)
}

/// The NumPy name of a dtype (`f32` → `float32`); `None` when NumPy has none.
pub fn numpy_name(d: DType) -> Option<&'static str> {
    d.numpy_name()
}

/// The dtypes a type variable may take on the CPU backend, in the order the
/// signature lists them.
pub const CPU_DTYPES: &[DType] = &[
    DType::BOOL,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::C64,
    DType::C128,
];

/// The C++ type of one element on the CPU backend (`f32` → `float`, `f16` →
/// `float16`, `c64` → `std::complex<float>`).
pub fn cpu_ctype(d: DType) -> Result<&'static str> {
    element_ctype(d, "CPU", CPU_DTYPES)
}

/// The C/C++ type of one element for a backend (the CPU's and CUDA's are the
/// same `<stdint.h>` names, and the `float16`/`bfloat16` of
/// [`crate::halfs`]; complex is `std::complex`, which only the CPU has); a
/// dtype outside `supported` is a Type error naming the dtype, the backend
/// and what it supports.
pub(crate) fn element_ctype(d: DType, backend: &str, supported: &[DType]) -> Result<&'static str> {
    if !supported.contains(&d) {
        let numpy = numpy_name(d).map(|n| format!(" ({n})")).unwrap_or_default();
        return Err(Error::Coded {
            kind: ErrorKind::Type,
            message: format!(
                "dtype {d}{numpy} is not supported by the {backend} backend (yet); it supports {}",
                dtype_list(supported, ", ")
            ),
        });
    }
    Ok(match d {
        DType::BOOL => "bool",
        DType::I8 => "int8_t",
        DType::I16 => "int16_t",
        DType::I32 => "int32_t",
        DType::I64 => "int64_t",
        DType::U8 => "uint8_t",
        DType::U16 => "uint16_t",
        DType::U32 => "uint32_t",
        DType::U64 => "uint64_t",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::C64 => "std::complex<float>",
        DType::C128 => "std::complex<double>",
        other => {
            return Err(Error::Coded {
                kind: ErrorKind::Type,
                message: format!("dtype {other} has no element type in generated {backend} code"),
            });
        }
    })
}

fn dtype_list(ds: &[DType], sep: &str) -> String {
    ds.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(sep)
}

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(message.into())
}

/// Parses CuPy parameter text (`'T x, raw T y'`); `what` (`in_params` or
/// `out_params`) names the text in errors. Empty (or blank) text is no
/// parameters. Only the syntax is checked here: names, placement rules and
/// type variables are checked by [`ElementwiseSpec::new`] and
/// [`ReductionSpec::new`].
pub fn parse_params(text: &str, what: &str) -> Result<Vec<Param>> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (k, piece) in text.split(',').enumerate() {
        let tokens: Vec<&str> = piece.split_whitespace().collect();
        let at = format!("{what}: parameter {} (`{}`)", k + 1, piece.trim());
        let (ty, name, keywords) = match tokens.as_slice() {
            [] => return Err(invalid(format!("{what}: parameter {} is empty (a stray comma?)", k + 1))),
            [_] => return Err(invalid(format!("{at}: expected `TYPE NAME`, e.g. `T x` or `float32 x`"))),
            [keywords @ .., ty, name] => (*ty, *name, keywords),
        };
        let mut raw = false;
        let mut mutable = false;
        for &kw in keywords {
            match kw {
                "raw" if !raw => raw = true,
                "mut" | "_non_const" if !mutable => mutable = true,
                "raw" | "mut" | "_non_const" => return Err(invalid(format!("{at}: keyword `{kw}` given twice"))),
                other => {
                    return Err(invalid(format!(
                        "{at}: unknown keyword `{other}` (the keywords are `raw` and `mut`, also spelt `_non_const`)"
                    )));
                }
            }
        }
        let ty = parse_type(ty).map_err(|m| invalid(format!("{at}: {m}")))?;
        out.push(Param { name: name.to_owned(), ty, raw, mutable });
    }
    Ok(out)
}

fn parse_type(t: &str) -> std::result::Result<ParamType, String> {
    let mut chars = t.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        return if c.is_ascii_alphabetic() {
            Ok(ParamType::Var(c))
        } else {
            Err(format!("type placeholder `{t}` must be one ASCII letter, like `T`"))
        };
    }
    numpy_dtype(t).map(ParamType::Concrete).ok_or_else(|| {
        let names: Vec<&str> = dlbridge_core::dtype::NUMPY_NAMES.iter().map(|(_, n)| *n).collect();
        format!("unknown type `{t}` (a type is a one-letter placeholder such as `T` or a NumPy dtype name: {})", names.join(", "))
    })
}

/// C++ keywords and alternative tokens (C++20), none of which can name a
/// kernel or a parameter.
const CPP_KEYWORDS: &[&str] = &[
    "alignas",
    "alignof",
    "and",
    "and_eq",
    "asm",
    "auto",
    "bitand",
    "bitor",
    "bool",
    "break",
    "case",
    "catch",
    "char",
    "char8_t",
    "char16_t",
    "char32_t",
    "class",
    "compl",
    "concept",
    "const",
    "consteval",
    "constexpr",
    "constinit",
    "const_cast",
    "continue",
    "co_await",
    "co_return",
    "co_yield",
    "decltype",
    "default",
    "delete",
    "do",
    "double",
    "dynamic_cast",
    "else",
    "enum",
    "explicit",
    "export",
    "extern",
    "false",
    "float",
    "for",
    "friend",
    "goto",
    "if",
    "inline",
    "int",
    "long",
    "mutable",
    "namespace",
    "new",
    "noexcept",
    "not",
    "not_eq",
    "nullptr",
    "operator",
    "or",
    "or_eq",
    "private",
    "protected",
    "public",
    "register",
    "reinterpret_cast",
    "requires",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "static_assert",
    "static_cast",
    "struct",
    "switch",
    "template",
    "this",
    "thread_local",
    "throw",
    "true",
    "try",
    "typedef",
    "typeid",
    "typename",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "wchar_t",
    "while",
    "xor",
    "xor_eq",
];

/// Names the generated code declares in the body's scope.
const RESERVED: &[&str] = &["i", "_ind"];

/// Macros the headers of the generated code define (`<cmath>`, `<cerrno>`,
/// `<cstdio>`, `<cstdint>`, `<cfloat>`, `<climits>`, `<cassert>`, ...): a
/// parameter of that name would be replaced by the preprocessor.
const MACROS: &[&str] = &[
    "NULL",
    "errno",
    "EOF",
    "BUFSIZ",
    "assert",
    "offsetof",
    "INFINITY",
    "NAN",
    "HUGE_VAL",
    "HUGE_VALF",
    "HUGE_VALL",
    "M_E",
    "M_LOG2E",
    "M_LOG10E",
    "M_LN2",
    "M_LN10",
    "M_PI",
    "M_PI_2",
    "M_PI_4",
    "M_1_PI",
    "M_2_PI",
    "M_2_SQRTPI",
    "M_SQRT2",
    "M_SQRT1_2",
    "FLT_MAX",
    "FLT_MIN",
    "FLT_EPSILON",
    "DBL_MAX",
    "DBL_MIN",
    "DBL_EPSILON",
    "INT_MAX",
    "INT_MIN",
    "UINT_MAX",
    "LONG_MAX",
    "LONG_MIN",
    "LLONG_MAX",
    "LLONG_MIN",
    "CHAR_BIT",
    "SIZE_MAX",
    "INT8_MAX",
    "INT16_MAX",
    "INT32_MAX",
    "INT64_MAX",
    "UINT8_MAX",
    "UINT16_MAX",
    "UINT32_MAX",
    "UINT64_MAX",
    "EXIT_SUCCESS",
    "EXIT_FAILURE",
    "RAND_MAX",
    "FP_NAN",
    "FP_INFINITE",
    "FP_ZERO",
    "FP_NORMAL",
    "FP_SUBNORMAL",
    "EDOM",
    "ERANGE",
    "EINVAL",
];

/// Names the generated code uses in the body's scope (types, namespaces): a
/// parameter of that name would hide them.
const USED_NAMES: &[&str] = &[
    "std",
    "ptrdiff_t",
    "size_t",
    "int8_t",
    "int16_t",
    "int32_t",
    "int64_t",
    "uint8_t",
    "uint16_t",
    "uint32_t",
    "uint64_t",
    "DLTensor",
    "float16",
    "bfloat16",
];

/// A name as error messages show it: at most 80 characters (a 5000-character
/// name is not echoed whole).
pub(crate) fn shortened(name: &str) -> String {
    if name.chars().count() <= 80 { name.to_owned() } else { format!("{}...", name.chars().take(77).collect::<String>()) }
}

/// Why `name` cannot name a kernel or parameter, if it cannot.
pub(crate) fn bad_name(name: &str) -> Option<String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Some("is not a C identifier (ASCII letters, digits and `_`, not starting with a digit)".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Some(format!("is longer than {MAX_NAME_LEN} bytes"));
    }
    if CPP_KEYWORDS.contains(&name) {
        return Some("is a C++ keyword".into());
    }
    if RESERVED.contains(&name) {
        return Some("is reserved: the generated code declares it (`i` the flat index, `_ind` the size)".into());
    }
    if MACROS.contains(&name) {
        return Some("is reserved: a macro of the C library headers the generated code includes".into());
    }
    if USED_NAMES.contains(&name) {
        return Some("is reserved: the generated code uses that type or namespace".into());
    }
    if name.starts_with('_') || name.starts_with("dlbridge") {
        return Some("is reserved: names starting with `_` or `dlbridge` belong to the generated code".into());
    }
    None
}

/// Why a preamble macro may not be named `name`, if it may not: the
/// generated code after the preamble uses that name.
fn macro_clash(name: &str) -> Option<&'static str> {
    if CPP_KEYWORDS.contains(&name) {
        Some("is a C++ keyword the generated code uses")
    } else if RESERVED.contains(&name) || name == "n" {
        Some("the generated code declares")
    } else if USED_NAMES.contains(&name) {
        Some("is a type or namespace the generated code uses")
    } else if name.starts_with("dlbridge")
        || name.starts_with("DLBRIDGE")
        || name.strip_prefix('_').is_some_and(|r| r.starts_with(|c: char| c.is_ascii_lowercase()))
    {
        Some("is reserved: names starting with `_` and a lower-case letter, `dlbridge` or `DLBRIDGE` belong to the generated code")
    } else {
        None
    }
}

/// Both kinds of kernel's parameter lists, parsed and checked ([`check_common`]).
fn parse_checked(kind: &str, name: &str, in_params: &str, out_params: &str) -> Result<(Vec<Param>, Vec<Param>)> {
    let inputs = parse_params(in_params, "in_params").map_err(|e| in_kernel(kind, name, e))?;
    let outputs = parse_params(out_params, "out_params").map_err(|e| in_kernel(kind, name, e))?;
    check_common(kind, name, &inputs, &outputs)?;
    Ok((inputs, outputs))
}

/// The checks both kinds of kernel make. `kind` is `ElementwiseKernel` or
/// `ReductionKernel`.
fn check_common(kind: &str, name: &str, inputs: &[Param], outputs: &[Param]) -> Result<()> {
    if let Some(why) = bad_name(name) {
        return Err(invalid(format!("{kind} name `{}` {why}", shortened(name))));
    }
    let at = |m: String| invalid(format!("{kind} `{name}`: {m}"));
    if inputs.len() + outputs.len() > MAX_PARAMS {
        return Err(at(format!(
            "{} parameters; at most {MAX_PARAMS} inputs and outputs together are supported",
            inputs.len() + outputs.len()
        )));
    }
    let vars = type_vars_of(inputs.iter().chain(outputs));
    let mut seen = BTreeSet::new();
    for (p, what) in inputs.iter().map(|p| (p, "in_params")).chain(outputs.iter().map(|p| (p, "out_params"))) {
        if let Some(why) = bad_name(&p.name) {
            return Err(at(format!("{what}: parameter name `{}` {why}", shortened(&p.name))));
        }
        if !seen.insert(p.name.as_str()) {
            return Err(at(format!("{what}: parameter `{}` is declared twice (names are unique across in_params and out_params)", p.name)));
        }
        let mut chars = p.name.chars();
        if let (Some(c), None) = (chars.next(), chars.next())
            && vars.contains(&c)
        {
            return Err(at(format!("{what}: parameter `{}` has the name of a type placeholder", p.name)));
        }
    }
    for o in outputs {
        if o.mutable {
            return Err(at(format!("out_params: output `{}` is `mut`: outputs are always written, `mut` is for inputs", o.name)));
        }
        // An elementwise output may take its type from the array passed for
        // it (CuPy's `X x, Y y` -> `Z z`): see `ElementwiseSpec::outputs_given`.
        if let ParamType::Var(c) = o.ty
            && kind == RK
            && !inputs.iter().any(|p| p.ty == ParamType::Var(c))
        {
            return Err(at(format!(
                "out_params: output `{}` has type `{c}`, which no input has, so no call can bind it (give an input type `{c}` or use a concrete type)",
                o.name
            )));
        }
    }
    // The body sees `i` (the flat index) and `n` (the size): a placeholder of
    // either name would be a type where the body means a value.
    if let Some(c) = vars.iter().find(|c| matches!(c, 'i' | 'n'))
        && kind != RK
    {
        let what = if *c == 'i' { "the flat index `i`" } else { "the size `n`" };
        return Err(at(format!(
            "type placeholder `{c}` has the name of {what} the body sees; use another letter (CuPy's are upper case: `T`, `U`)"
        )));
    }
    if vars.len() > MAX_TYPE_VARS {
        let list: Vec<String> = vars.iter().map(|c| format!("`{c}`")).collect();
        return Err(at(format!("{} type placeholders ({}); at most {MAX_TYPE_VARS} are supported", vars.len(), list.join(", "))));
    }
    Ok(())
}

fn type_vars_of<'p>(params: impl Iterator<Item = &'p Param>) -> Vec<char> {
    let mut vars = Vec::new();
    for p in params {
        if let ParamType::Var(c) = p.ty
            && !vars.contains(&c)
        {
            vars.push(c);
        }
    }
    vars
}

fn check_text(kind: &str, name: &str, field: &str, text: &str, required: bool) -> Result<()> {
    if text.contains('\0') {
        return Err(invalid(format!("{kind} `{name}`: {field} contains a NUL character")));
    }
    if required && text.trim().is_empty() {
        return Err(invalid(format!("{kind} `{name}`: {field} is empty")));
    }
    let scanned = scan(text);
    if let Some((what, line)) = scanned.open {
        return Err(invalid(format!(
            "{kind} `{name}`: {field} leaves {what} open (from line {line}): it would swallow the generated code after it"
        )));
    }
    if scanned.continued {
        return Err(invalid(format!(
            "{kind} `{name}`: {field} ends in a backslash, which would continue its last line into the generated code"
        )));
    }
    // Each fragment stays where it is put: it closes what it opens and opens
    // nothing it leaves open (`}` would end the generated function and put
    // the rest of the text outside it; an open `#if 0` would swallow it).
    if let Some(why) = misplaced(&scanned.code) {
        return Err(invalid(format!(
            "{kind} `{name}`: {field} {why}: each fragment must close the brackets and `#if`s it opens, and no others"
        )));
    }
    let code = scanned.code;
    // Fragments inside the generated function hold statements or expressions:
    // a macro defined there would go on rewriting the generated code after it.
    if field != "preamble"
        && let Some(line) =
            code.lines().map(str::trim_start).find(|l| ["define", "undef", "include", "line"].iter().any(|d| is_directive(l, d)))
    {
        return Err(invalid(format!(
            "{kind} `{name}`: {field} has the directive `{}`, which belongs in the preamble (it would go on acting on the generated code after it)",
            shortened(line.trim())
        )));
    }
    // The preamble's macros act on everything after it: none may take a name the generated code uses.
    for line in code.lines().map(str::trim_start).filter(|l| is_directive(l, "define") || is_directive(l, "undef")) {
        let rest = line[1..].trim_start();
        let rest = rest.strip_prefix("define").or_else(|| rest.strip_prefix("undef")).unwrap_or(rest).trim_start();
        let macro_name: String = rest.chars().take_while(|&c| c.is_ascii_alphanumeric() || c == '_').collect();
        if let Some(why) = macro_clash(&macro_name) {
            return Err(invalid(format!("{kind} `{name}`: {field} (re)defines the macro `{}`, which {why}", shortened(&macro_name))));
        }
    }
    // `loop_prep`, `after_loop` and the expressions run in functions that
    // serve many elements: a `return` there would end more than one. The
    // operation runs in a function of its own per element, where a `return`
    // ends that element only. (What macros make of a text is checked after
    // preprocessing, when the library is built: see `fragments`.)
    if field != "preamble" && field != "operation" && has_word(&code, "return") {
        return Err(invalid(format!(
            "{kind} `{name}`: {field} uses `return`, which would end more than one element here; use `continue` in the operation to skip an element"
        )));
    }
    Ok(())
}

/// Whether `line` (code only, leading spaces trimmed) is the preprocessor
/// directive `name` (`#define`, `# define`, ...).
fn is_directive(line: &str, name: &str) -> bool {
    line.strip_prefix('#').is_some_and(|rest| {
        rest.trim_start().strip_prefix(name).is_some_and(|r| !r.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
    })
}

/// `text` as the compiler's tokenizer sees it: lines ending in a backslash
/// joined to the next (`ret\` + newline + `urn` is `return`, and a `//`
/// comment so continued goes on), then comments and string / character
/// literals blanked out (each replaced by a space; newlines inside a block
/// comment or raw string kept, so lines still count), so a word in them is not
/// taken for code. Unterminated ones end the text.
#[cfg(test)]
fn code_only(text: &str) -> String {
    scan(text).code
}

/// What [`scan`] found.
pub(crate) struct Scanned {
    /// The code, as [`code_only`] returns it.
    pub code: String,
    /// A comment or literal still open at the end of the text, and the line it opened on.
    pub open: Option<(&'static str, usize)>,
    /// Whether the last line ends in a backslash (continued into whatever follows).
    pub continued: bool,
}

/// Joins continued lines (a backslash, optionally spaces, then a newline: GCC
/// and Clang splice those too), then blanks comments and literals.
pub(crate) fn scan(text: &str) -> Scanned {
    let chars: Vec<char> = text.chars().collect();
    // Splice, remembering each kept character's line.
    let (mut joined, mut lines) = (Vec::with_capacity(chars.len()), Vec::with_capacity(chars.len()));
    let (mut k, mut line) = (0, 1);
    let mut continued = false;
    while k < chars.len() {
        if chars[k] == '\\' {
            let mut e = k + 1;
            while e < chars.len() && (chars[e] == ' ' || chars[e] == '\t') {
                e += 1;
            }
            if e < chars.len() && chars[e] == '\r' && chars.get(e + 1) == Some(&'\n') {
                e += 1;
            }
            if e < chars.len() && chars[e] == '\n' {
                k = e + 1;
                line += 1;
                continue;
            }
            if e == chars.len() {
                continued = true;
                break;
            }
        }
        joined.push(chars[k]);
        lines.push(line);
        if chars[k] == '\n' {
            line += 1;
        }
        k += 1;
    }
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(joined.len());
    let mut open = None;
    let mut k = 0;
    while k < joined.len() {
        let c = joined[k];
        let next = joined.get(k + 1).copied();
        match c {
            '/' if next == Some('/') => {
                while k < joined.len() && joined[k] != '\n' {
                    k += 1;
                }
                continue;
            }
            '/' if next == Some('*') => {
                let at = lines[k];
                k += 2;
                out.push(' ');
                loop {
                    if k >= joined.len() {
                        open = Some(("a `/*` comment", at));
                        break;
                    }
                    if joined[k] == '*' && joined.get(k + 1) == Some(&'/') {
                        k += 2;
                        break;
                    }
                    if joined[k] == '\n' {
                        out.push('\n');
                    }
                    k += 1;
                }
                continue;
            }
            '"' | '\'' => {
                // The identifier just before: a literal's prefix (u8, u, U, L, R, u8R, ...)
                // or, for `'`, a number's digit separator (1'000'000).
                let mut b = out.len();
                while b > 0 && out[..b].ends_with(ident) {
                    b -= out[..b].chars().next_back().map_or(1, char::len_utf8);
                }
                let before = &out[b..];
                let prefix = matches!(before, "u8" | "u" | "U" | "L");
                let raw = c == '"' && matches!(before, "R" | "u8R" | "uR" | "UR" | "LR");
                if c == '\'' && !before.is_empty() && !prefix {
                    out.push(c);
                    k += 1;
                    continue;
                }
                let at = lines[k];
                out.truncate(b);
                out.push(' ');
                k += 1;
                if raw {
                    // R"delim( ... )delim"
                    let d: String = joined[k..].iter().take_while(|&&x| x != '(').collect();
                    let close: Vec<char> = format!("){d}\"").chars().collect();
                    k += d.chars().count() + 1;
                    loop {
                        if k >= joined.len() {
                            open = Some(("a raw string literal", at));
                            break;
                        }
                        if joined[k..].starts_with(&close) {
                            k += close.len();
                            break;
                        }
                        if joined[k] == '\n' {
                            out.push('\n');
                        }
                        k += 1;
                    }
                    continue;
                }
                let mut escaped = false;
                loop {
                    if k >= joined.len() || joined[k] == '\n' {
                        open = Some((if c == '"' { "a string literal" } else { "a character literal" }, at));
                        break;
                    }
                    let d = joined[k];
                    k += 1;
                    if !escaped && d == c {
                        break;
                    }
                    escaped = !escaped && d == '\\';
                }
                continue;
            }
            c => out.push(c),
        }
        k += 1;
        if open.is_some() {
            break;
        }
    }
    Scanned { code: digraphs_spelled_out(&out), open, continued }
}

/// `code` (comments and literals blanked) with each digraph replaced by the
/// token it is (`<%` `{`, `%>` `}`, `<:` `[`, `:>` `]`, `%:` `#`), so that
/// brackets and directives are seen whichever way they are spelled. `<::`
/// not followed by `:` or `>` is `<` then `::`, as the compiler reads it.
fn digraphs_spelled_out(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = String::with_capacity(code.len());
    let mut k = 0;
    while k < b.len() {
        let two = &b[k..b.len().min(k + 2)];
        let rep = match two {
            b"<%" => Some('{'),
            b"%>" => Some('}'),
            b"<:" if b.get(k + 2) != Some(&b':') || matches!(b.get(k + 3), Some(b':' | b'>')) => Some('['),
            b":>" => Some(']'),
            b"%:" => Some('#'),
            _ => None,
        };
        match rep {
            Some(c) => {
                out.push(c);
                k += 2;
            }
            None => {
                let ch = code[k..].chars().next().unwrap_or(' ');
                out.push(ch);
                k += ch.len_utf8();
            }
        }
    }
    out
}

/// Why `code` (from [`scan`]) cannot stay where it is put: a bracket closed
/// that it did not open, or one left open, or a preprocessor conditional not
/// closed in it (each would carry the text out of its place, or the generated
/// code after it into the user's).
fn misplaced(code: &str) -> Option<String> {
    let mut stack: Vec<(char, usize)> = Vec::new();
    let mut conds: Vec<usize> = Vec::new();
    for (n, l) in code.lines().enumerate() {
        let line = n + 1;
        let t = l.trim_start();
        if ["if", "ifdef", "ifndef"].iter().any(|d| is_directive(t, d)) {
            conds.push(line);
        } else if ["elif", "else", "elifdef", "elifndef"].iter().any(|d| is_directive(t, d)) && conds.is_empty() {
            return Some(format!("has `{}` on line {line} without its `#if`", t.trim_end()));
        } else if is_directive(t, "endif") && conds.pop().is_none() {
            return Some(format!("has `#endif` on line {line} without its `#if`"));
        }
        for c in l.chars() {
            match c {
                '(' | '[' | '{' => stack.push((c, line)),
                ')' | ']' | '}' => {
                    let want = match c {
                        ')' => '(',
                        ']' => '[',
                        _ => '{',
                    };
                    match stack.pop() {
                        Some((o, _)) if o == want => {}
                        Some((o, at)) => return Some(format!("closes `{o}` (line {at}) with `{c}` on line {line}")),
                        None => return Some(format!("closes a `{c}` on line {line} that it did not open")),
                    }
                }
                _ => {}
            }
        }
    }
    if let Some((o, at)) = stack.pop() {
        return Some(format!("leaves the `{o}` of line {at} open"));
    }
    conds.pop().map(|at| format!("leaves the `#if` of line {at} open (no `#endif`)"))
}

/// Whether `word` appears in `text` as a whole identifier.
fn has_word(text: &str, word: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// Adds the kernel's name to a parameter-text error.
fn in_kernel(kind: &str, name: &str, e: Error) -> Error {
    match e {
        Error::InvalidArgument(m) => invalid(format!("{kind} `{name}`: {m}")),
        other => other,
    }
}

/// `<T: bool|i8|..., U: ...>`, or nothing without type variables.
fn generics(vars: &[char]) -> String {
    if vars.is_empty() {
        return String::new();
    }
    let allowed = dtype_list(CPU_DTYPES, "|");
    let parts: Vec<String> = vars.iter().map(|c| format!("{c}: {allowed}")).collect();
    format!("<{}>", parts.join(", "))
}

/// The dtype text of a parameter: the variable's name, or with `bind` its
/// bound dtype.
pub(crate) fn dtype_text(ty: ParamType, bind: Option<&[(char, DType)]>) -> Result<String> {
    match (ty, bind) {
        (ParamType::Concrete(d), _) => Ok(d.to_string()),
        (ParamType::Var(c), None) => Ok(c.to_string()),
        (ParamType::Var(c), Some(b)) => b
            .iter()
            .find(|(v, _)| *v == c)
            .map(|(_, d)| d.to_string())
            .ok_or_else(|| invalid(format!("type placeholder `{c}` is not bound"))),
    }
}

/// Checks that `bind` binds exactly `vars`, each once.
pub(crate) fn check_bind(kind: &str, name: &str, vars: &[char], bind: &[(char, DType)]) -> Result<()> {
    for (k, (c, _)) in bind.iter().enumerate() {
        if !vars.contains(c) {
            return Err(invalid(format!("{kind} `{name}`: binds `{c}`, which is not one of its type placeholders")));
        }
        if bind[..k].iter().any(|(p, _)| p == c) {
            return Err(invalid(format!("{kind} `{name}`: binds `{c}` twice")));
        }
    }
    if let Some(c) = vars.iter().find(|c| !bind.iter().any(|(v, _)| v == *c)) {
        return Err(invalid(format!("{kind} `{name}`: type placeholder `{c}` is not bound")));
    }
    Ok(())
}

/// The dtype a parameter has under `bind` (which [`check_bind`] accepted).
/// `T=f32,U=i64`: a binding of placeholders, as text.
pub(crate) fn bind_text(bind: &[(char, DType)]) -> String {
    bind.iter().map(|(v, d)| format!("{v}={d}")).collect::<Vec<_>>().join(",")
}

pub(crate) fn bound_dtype(ty: ParamType, bind: &[(char, DType)]) -> Result<DType> {
    match ty {
        ParamType::Concrete(d) => Ok(d),
        ParamType::Var(c) => {
            bind.iter().find(|(v, _)| *v == c).map(|&(_, d)| d).ok_or_else(|| invalid(format!("type placeholder `{c}` is not bound")))
        }
    }
}

/// The registry must accept the derived signature; the checks above are
/// meant to make this hold, so a refusal here is a gap in them.
fn check_signature(kind: &str, name: &str, signature: &str) -> Result<()> {
    Signature::parse(signature).map(drop).map_err(|e| invalid(format!("{kind} `{name}`: the registry refuses its derived signature: {e}")))
}

const EW: &str = "ElementwiseKernel";

/// The input that gives the loop its shape when every declared input is raw
/// (see [`ElementwiseSpec::sized_by_caller`]).
pub(crate) const LOOP: &str = "_loop";
const RK: &str = "ReductionKernel";

/// Most raw inputs an elementwise kernel may have: each takes one `...`
/// group of the signature, and the broadcast group `*S` takes one.
pub const MAX_RAW_PARAMS: usize = MAX_RESTS - 1;

/// The optional parts of an elementwise kernel, as CuPy names them.
#[derive(Debug, Clone, Default)]
pub struct ElementwiseOptions {
    /// Code at file scope before the kernel (helper functions, constants).
    pub preamble: String,
    /// Code run once before the loop (per thread).
    pub loop_prep: String,
    /// Code run once after the loop (per thread).
    pub after_loop: String,
}

/// A validated CuPy `ElementwiseKernel`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElementwiseSpec {
    /// Kernel name (the registry name).
    pub name: String,
    /// Inputs, in call order.
    pub inputs: Vec<Param>,
    /// Outputs, in call order.
    pub outputs: Vec<Param>,
    /// The loop body (one element, index `i`).
    pub operation: String,
    /// Code at file scope before the kernel (helper functions, constants).
    pub preamble: String,
    /// Code run once before the loop, per thread.
    pub loop_prep: String,
    /// Code run once after the loop, per thread.
    pub after_loop: String,
}

impl ElementwiseSpec {
    /// Parses and validates an elementwise kernel, with CuPy's arguments.
    ///
    /// Refused (an [`Error::InvalidArgument`] naming the kernel and the
    /// parameter): names that are not C identifiers, C++ keywords, reserved
    /// (`i`, `_ind`, a leading `_` or `dlbridge`) or declared twice; `mut`
    /// outputs; more than [`MAX_TYPE_VARS`] placeholders or `MAX_RAW_PARAMS`
    /// (3) raw parameters; an empty operation. Raw outputs and outputs whose
    /// type no input has are the caller's to pass
    /// ([`ElementwiseSpec::outputs_given`]); with no non-raw input the caller
    /// gives the loop's shape ([`ElementwiseSpec::sized_by_caller`]).
    pub fn new(
        in_params: &str,
        out_params: &str,
        operation: &str,
        name: &str,
        preamble: &str,
        loop_prep: &str,
        after_loop: &str,
    ) -> Result<Self> {
        let (inputs, outputs) = parse_checked(EW, name, in_params, out_params)?;
        let at = |m: String| invalid(format!("{EW} `{name}`: {m}"));
        // A raw output is passed by the caller (its shape is not the loop's):
        // see `outputs_given`.
        let raws = inputs.iter().chain(&outputs).filter(|p| p.raw).count();
        if raws > MAX_RAW_PARAMS {
            return Err(at(format!(
                "{raws} raw parameters; at most {MAX_RAW_PARAMS} are supported (each is one `...` group of the signature)"
            )));
        }
        let mut inputs = inputs;
        if inputs.iter().all(|p| p.raw) {
            // No input gives the loop its shape: the caller does, with CuPy's
            // `size=`, as an array of that shape (a zero-stride view of one byte).
            inputs.push(Param { name: LOOP.into(), ty: ParamType::Concrete(DType::U8), raw: false, mutable: false });
        }
        for (field, text, required) in [
            ("operation", operation, true),
            ("preamble", preamble, false),
            ("loop_prep", loop_prep, false),
            ("after_loop", after_loop, false),
        ] {
            check_text(EW, name, field, text, required)?;
        }
        let spec = ElementwiseSpec {
            name: name.to_owned(),
            inputs,
            outputs,
            operation: operation.to_owned(),
            preamble: preamble.to_owned(),
            loop_prep: loop_prep.to_owned(),
            after_loop: after_loop.to_owned(),
        };
        check_signature(EW, name, &spec.signature())?;
        Ok(spec)
    }

    /// Whether an element's result may depend on more than the inputs'
    /// elements at its position, as far as the text shows: a raw input, a
    /// `loop_prep` or `after_loop` (state shared by the elements of a chunk), a
    /// preamble with directives (a macro may paste any name), an operation
    /// with `static` or `thread_local` state or an `&` (an element's
    /// address), or one that names the flat index `i`, the size `n`, `_ind` or
    /// another name of the generated code's (`_end`). Such a kernel is not
    /// batched as one call on stacked inputs (`jax.vmap`); the test errs on
    /// the side of per-element calls.
    pub fn reads_position(&self) -> bool {
        let generated_name = |code: &str| {
            // `_end`, `_t`, `_w`, ...: the generated code's own names, which say where
            // the element is (or which chunk of the call).
            code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(|w| w.starts_with('_') && w.len() > 1 && !w.starts_with("__"))
        };
        let op = scan(&self.operation).code;
        let pre = scan(&self.preamble).code;
        self.inputs.iter().any(|p| p.raw)
            || !self.loop_prep.trim().is_empty()
            || !self.after_loop.trim().is_empty()
            // A macro of the preamble may spell any of these (`a##b` pasting `_ind`).
            || pre.lines().any(|l| l.trim_start().starts_with('#'))
            // State kept across elements, or an element's address.
            || ["static", "thread_local"].iter().any(|w| has_word(&op, w))
            || op.replace("&&", "").contains('&')
            || [&op, &pre].iter().any(|code| ["i", "n", "_ind"].iter().any(|w| has_word(code, w)) || generated_name(code))
    }

    /// Whether the caller passes the outputs: an output is raw (its shape is
    /// not the loop's), or its type placeholder is no input's (CuPy's
    /// `squared_diff_super_generic`, `X x, Y y` -> `Z z`), so only the array
    /// passed for it can bind it. The signature then has every output as a
    /// trailing `mut` input (the order of the tensors is unchanged), and a
    /// call without them is the registry's arity error.
    pub fn outputs_given(&self) -> bool {
        self.outputs.iter().any(|o| o.raw || matches!(o.ty, ParamType::Var(c) if !self.inputs.iter().any(|p| p.ty == ParamType::Var(c))))
    }

    /// Whether every input the user declared is raw, so the loop's shape is
    /// given by the caller (CuPy's `size=`): the signature then ends its
    /// inputs with `_loop: u8[*S]`, which takes an array of that shape.
    pub fn sized_by_caller(&self) -> bool {
        self.inputs.last().is_some_and(|p| p.name == LOOP)
    }
}

/// CuPy's `ReductionKernel` arguments, by name: [`Reduction::new`] takes
/// the ones CuPy requires, in CuPy's order; set the optional ones with
/// struct update syntax (`Reduction { reduce_type: Some("float64"),
/// ..Reduction::new(...) }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reduction<'s> {
    /// The inputs (`T x, float32 w`).
    pub in_params: &'s str,
    /// The outputs (`T y`).
    pub out_params: &'s str,
    /// Maps one input element to a value of the reduce type.
    pub map_expr: &'s str,
    /// Combines two values `a` and `b` (associative, as CuPy requires).
    pub reduce_expr: &'s str,
    /// Writes the outputs from the reduced value `a` (`y = sqrt(a)`).
    pub post_map_expr: &'s str,
    /// The reduction's starting value; `None` (or blank) starts from the
    /// first mapped element.
    pub identity: Option<&'s str>,
    /// Kernel name (the registry name).
    pub name: &'s str,
    /// The type values are reduced in (a NumPy dtype name or C++ type);
    /// `None` (or blank) is the first output's type.
    pub reduce_type: Option<&'s str>,
    /// Code at file scope before the kernel.
    pub preamble: &'s str,
}

impl<'s> Reduction<'s> {
    /// CuPy's required arguments, in its order; no `reduce_type`, no preamble.
    pub const fn new(
        in_params: &'s str,
        out_params: &'s str,
        map_expr: &'s str,
        reduce_expr: &'s str,
        post_map_expr: &'s str,
        identity: Option<&'s str>,
        name: &'s str,
    ) -> Self {
        Reduction { in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name, reduce_type: None, preamble: "" }
    }
}

/// A validated CuPy `ReductionKernel`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReductionSpec {
    /// Kernel name (the registry name).
    pub name: String,
    /// Inputs (never raw or `mut`).
    pub inputs: Vec<Param>,
    /// Outputs (never raw); the call passes them as `mut` tensors.
    pub outputs: Vec<Param>,
    /// Maps one input element to a value of the reduce type.
    pub map_expr: String,
    /// Combines two values `a` and `b` (associative, as CuPy requires).
    pub reduce_expr: String,
    /// Writes the outputs from the reduced value `a` (`y = sqrt(a)`).
    pub post_map_expr: String,
    /// The reduction's starting value; `None` starts from the first mapped
    /// element (and makes an empty reduction an error).
    pub identity: Option<String>,
    /// The C++ type values are reduced in (a NumPy dtype name or C++ type
    /// text); `None` is the first output's type.
    pub reduce_type: Option<String>,
    /// Code at file scope before the kernel.
    pub preamble: String,
}

impl ReductionSpec {
    /// Parses and validates a reduction kernel; the arguments are CuPy's, in
    /// CuPy's order. A blank `identity` or `reduce_type` counts as `None`.
    ///
    /// Refused, besides what [`ElementwiseSpec::new`] refuses for names and
    /// type placeholders: raw or `mut` inputs, raw outputs, no input or no
    /// output, an empty `map_expr`, `reduce_expr` or `post_map_expr`.
    pub fn new(r: &Reduction<'_>) -> Result<Self> {
        let Reduction { in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name, reduce_type, preamble } = *r;
        let (inputs, outputs) = parse_checked(RK, name, in_params, out_params)?;
        let at = |m: String| invalid(format!("{RK} `{name}`: {m}"));
        if inputs.is_empty() {
            return Err(at("in_params is empty: a reduction needs an input to reduce".into()));
        }
        if outputs.is_empty() {
            return Err(at("out_params is empty: a reduction needs an output".into()));
        }
        if let Some(p) = inputs.iter().find(|p| p.raw) {
            return Err(at(format!("in_params: input `{}` is raw: reduction inputs are never raw", p.name)));
        }
        if let Some(p) = inputs.iter().find(|p| p.mutable) {
            return Err(at(format!("in_params: input `{}` is `mut`: a reduction only reads its inputs", p.name)));
        }
        if let Some(p) = outputs.iter().find(|p| p.raw) {
            return Err(at(format!("out_params: output `{}` is raw: reduction outputs are never raw", p.name)));
        }
        let blank_none = |s: Option<&str>| s.filter(|t| !t.trim().is_empty()).map(str::to_owned);
        let identity = blank_none(identity);
        let reduce_type = blank_none(reduce_type);
        for (field, text, required) in [
            ("map_expr", map_expr, true),
            ("reduce_expr", reduce_expr, true),
            ("post_map_expr", post_map_expr, true),
            ("identity", identity.as_deref().unwrap_or(""), false),
            ("reduce_type", reduce_type.as_deref().unwrap_or(""), false),
            ("preamble", preamble, false),
        ] {
            check_text(RK, name, field, text, required)?;
        }
        let spec = ReductionSpec {
            name: name.to_owned(),
            inputs,
            outputs,
            map_expr: map_expr.to_owned(),
            reduce_expr: reduce_expr.to_owned(),
            post_map_expr: post_map_expr.to_owned(),
            identity,
            reduce_type,
            preamble: preamble.to_owned(),
        };
        check_signature(RK, name, &spec.signature())?;
        Ok(spec)
    }
}

/// What both kinds of kernel from source share: a name, typed parameters,
/// and the registry signature they make.
pub trait Spec {
    /// `ElementwiseKernel` or `ReductionKernel` (errors name it).
    const KIND: &'static str;

    /// The kernel's name.
    fn name(&self) -> &str;

    /// Its inputs and outputs, in call order.
    fn params(&self) -> (&[Param], &[Param]);

    /// Code at file scope before the kernel.
    fn preamble(&self) -> &str;

    /// Every text the user wrote, by its field name (compiler diagnostics
    /// that point into one are reported against it).
    fn texts(&self) -> Vec<(&'static str, &str)>;

    /// The signature with `generics` after the name and, with `bind`, every
    /// placeholder replaced by its dtype.
    fn render(&self, generics: &str, bind: Option<&[(char, DType)]>) -> Result<String>;

    /// The type placeholders, in order of first appearance (inputs first).
    fn type_vars(&self) -> Vec<char> {
        let (inputs, outputs) = self.params();
        type_vars_of(inputs.iter().chain(outputs))
    }

    /// The registry signature (see each kind's [`Spec::render`]).
    fn signature(&self) -> String {
        // Without `bind`, dtype_text cannot fail.
        self.render(&generics(&self.type_vars()), None).unwrap_or_default()
    }

    /// The signature of one specialisation: every placeholder replaced by the
    /// dtype `bind` gives it, no type variables, the same name.
    fn specialised_signature(&self, bind: &[(char, DType)]) -> Result<String> {
        self.check_bind(bind)?;
        self.render("", Some(bind))
    }

    /// `ReductionKernel l2norm (T=f32)`: the specialisation, for messages.
    fn what(&self, bind: &[(char, DType)]) -> String {
        let (kind, name, dtypes) = (Self::KIND, self.name(), bind_text(bind));
        if dtypes.is_empty() { format!("{kind} {name}") } else { format!("{kind} {name} ({dtypes})") }
    }

    /// Checks `bind` against the kernel's placeholders (each bound once, no others).
    fn check_bind(&self, bind: &[(char, DType)]) -> Result<()> {
        check_bind(Self::KIND, self.name(), &self.type_vars(), bind)
    }
}

/// The [`Spec`] methods that read the fields both kinds have.
macro_rules! common_fields {
    () => {
        fn name(&self) -> &str {
            &self.name
        }

        fn params(&self) -> (&[Param], &[Param]) {
            (&self.inputs, &self.outputs)
        }

        fn preamble(&self) -> &str {
            &self.preamble
        }
    };
}

impl Spec for ElementwiseSpec {
    const KIND: &'static str = EW;
    common_fields!();

    fn texts(&self) -> Vec<(&'static str, &str)> {
        vec![("operation", &self.operation), ("preamble", &self.preamble), ("loop_prep", &self.loop_prep), ("after_loop", &self.after_loop)]
    }

    /// The registry signature: `name<T: bool|...|f64>(x: T[*S], y: mut T[*S],
    /// r: T[...R0]) -> (z: T[*S])`. Non-raw operands share the broadcast group
    /// `*S`; raw input `k` (counting raw inputs only) has its own `...R<k>`.
    /// Outputs the caller passes ([`ElementwiseSpec::outputs_given`]) are
    /// trailing `mut` inputs: `(x: X[*S], y: Y[*S], z: mut Z[*S])`.
    fn render(&self, generics: &str, bind: Option<&[(char, DType)]>) -> Result<String> {
        let mut s = format!("{}{generics}(", self.name);
        let mut raw_k = 0;
        for (k, p) in self.inputs.iter().enumerate() {
            let sep = if k > 0 { ", " } else { "" };
            let mutable = if p.mutable { "mut " } else { "" };
            let dims = if p.raw {
                raw_k += 1;
                format!("...R{}", raw_k - 1)
            } else {
                "*S".to_owned()
            };
            let _ = write!(s, "{sep}{}: {mutable}{}[{dims}]", p.name, dtype_text(p.ty, bind)?);
        }
        if self.outputs_given() {
            for p in &self.outputs {
                let dims = if p.raw {
                    raw_k += 1;
                    format!("...R{}", raw_k - 1)
                } else {
                    "*S".to_owned()
                };
                let _ = write!(s, ", {}: mut {}[{dims}]", p.name, dtype_text(p.ty, bind)?);
            }
            s.push(')');
            return Ok(s);
        }
        s.push(')');
        if !self.outputs.is_empty() {
            let outs: Vec<String> =
                self.outputs.iter().map(|p| Ok(format!("{}: {}[*S]", p.name, dtype_text(p.ty, bind)?))).collect::<Result<_>>()?;
            let _ = write!(s, " -> ({})", outs.join(", "));
        }
        Ok(s)
    }
}

impl Spec for ReductionSpec {
    const KIND: &'static str = RK;
    common_fields!();

    fn texts(&self) -> Vec<(&'static str, &str)> {
        vec![
            ("map_expr", &self.map_expr),
            ("reduce_expr", &self.reduce_expr),
            ("post_map_expr", &self.post_map_expr),
            ("identity", self.identity.as_deref().unwrap_or("")),
            ("reduce_type", self.reduce_type.as_deref().unwrap_or("")),
            ("preamble", &self.preamble),
        ]
    }

    /// The registry signature: `name<T: bool|...|f64>(x: T[...S], y: mut
    /// T[...O])`. Inputs share `...S`; the outputs come as `mut` inputs
    /// sharing `...O` (their shape is the caller's: the kept dims, which the
    /// Rust layer computes from `axis` and `keepdims` and which the kernel
    /// checks against the inputs).
    fn render(&self, generics: &str, bind: Option<&[(char, DType)]>) -> Result<String> {
        let mut parts = Vec::with_capacity(self.inputs.len() + self.outputs.len());
        for p in &self.inputs {
            parts.push(format!("{}: {}[...S]", p.name, dtype_text(p.ty, bind)?));
        }
        for p in &self.outputs {
            parts.push(format!("{}: mut {}[...O]", p.name, dtype_text(p.ty, bind)?));
        }
        Ok(format!("{}{generics}({})", self.name, parts.join(", ")))
    }
}

#[cfg(test)]
mod return_tests {
    use super::*;

    #[test]
    fn return_in_a_comment_or_a_string_is_not_a_return() {
        assert_eq!(
            code_only("y = x; // no early return\nz = 1; /* return */ w = \"return\"; c = '\\''; return"),
            "y = x; \nz = 1;   w =  ; c =  ; return"
        );
        assert!(has_word(&code_only("y = x; return;"), "return"));
        assert!(!has_word(&code_only("y = x; // no early return here"), "return"));
        assert!(!has_word(&code_only("y = x; /* return */"), "return"));
    }

    #[test]
    fn a_return_spliced_across_lines_in_loop_prep_or_after_loop_is_refused() {
        // A backslash-newline joins `ret` and `urn` before the compiler tokenizes.
        let e = ElementwiseSpec::new("T x", "T z", "z = x", "splice", "", "if (1) ret\\\nurn;", "").unwrap_err();
        assert!(e.to_string().contains("loop_prep uses `return`"), "{e}");
        assert!(!has_word(&code_only("// a comment \\\n return;"), "return"), "a continued comment hides the line");
        for (prep, after) in [("return;", ""), ("", "if (1) return;")] {
            let e = ElementwiseSpec::new("T x", "T z", "z = x", "frag", "", prep, after).unwrap_err();
            assert!(e.to_string().contains("uses `return`"), "{e}");
        }
        // The operation runs per element: a `return` there ends that element.
        ElementwiseSpec::new("T x", "T z", "z = x; if (x > 0) return; z = -1", "early", "", "", "").unwrap();
        ElementwiseSpec::new("T x", "T z", "z = TWICE(x)", "mac_ok", "#define TWICE(v) ((v) * 2)", "", "").unwrap();
    }

    #[test]
    fn digraphs_count_as_the_brackets_and_directives_they_spell() {
        let e = ElementwiseSpec::new("T x", "T z", "z = x; %> %>", "dg", "", "", "").unwrap_err();
        assert!(e.to_string().contains("closes a `}`"), "{e}");
        let e = ElementwiseSpec::new("T x", "T z", "z = x; <%", "dg2", "", "", "").unwrap_err();
        assert!(e.to_string().contains("leaves the `{`"), "{e}");
        let e = ElementwiseSpec::new("T x", "T z", "%:define Y 1\nz = x", "dg3", "", "", "").unwrap_err();
        assert!(e.to_string().contains("belongs in the preamble"), "{e}");
        ElementwiseSpec::new("T x", "T z", "z = x; int a<:2:> = <%0, 1%>; (void)a;", "dg_ok", "", "", "").unwrap();
        assert_eq!(digraphs_spelled_out("std::vector<::x> <:1:> %:%:"), "std::vector<::x> [1] ##");
    }

    #[test]
    fn a_parameter_named_like_a_c_library_macro_is_refused_by_name() {
        for name in ["M_PI", "NULL", "errno", "INFINITY"] {
            let e = ElementwiseSpec::new(&format!("T x, T {name}"), "T z", "z = x", "mac_param", "", "", "").unwrap_err().to_string();
            assert_eq!(
                e,
                format!(
                    "ElementwiseKernel `mac_param`: in_params: parameter name `{name}` is reserved: a macro of the C library headers the generated code includes"
                )
            );
        }
    }

    #[test]
    fn return_in_loop_prep_is_refused_and_points_to_continue() {
        let e = ElementwiseSpec::new("T x", "T z", "z = x", "ret", "", "if (1) return;", "").unwrap_err().to_string();
        assert!(e.contains("uses `return`") && e.contains("use `continue`"), "{e}");
        ElementwiseSpec::new("T x", "T z", "z = x; T returned = x; (void)returned", "ret_ok", "", "", "").unwrap();
        ElementwiseSpec::new("T x", "T z", "z = f(x)", "ret_pre", "__device__ T f(T v) { return v; }", "", "").unwrap();
    }

    fn ew_err(op: &str, preamble: &str, prep: &str, after: &str) -> String {
        ElementwiseSpec::new("T x", "T z", op, "k", preamble, prep, after).unwrap_err().to_string()
    }

    #[test]
    fn a_fragment_that_would_leave_its_place_is_refused() {
        // `}` ends the generated function: what follows would be code at file scope.
        let m = ew_err("z = x; } void evil() { z = x;", "", "", "");
        assert!(m.contains("operation closes a `}` on line 1 that it did not open"), "{m}");
        let m = ew_err("z = x", "int helper() {", "", "");
        assert!(m.contains("preamble leaves the `{` of line 1 open"), "{m}");
        let m = ew_err("z = (x", "", "", "");
        assert!(m.contains("operation leaves the `(` of line 1 open"), "{m}");
        let m = ew_err("z = x", "", "", "if (1) { (void)0; )");
        assert!(m.contains("after_loop closes `{` (line 1) with `)` on line 1"), "{m}");
        // A comment or string left open swallows the generated code after it.
        let m = ew_err("z = x; /* and the rest", "", "", "");
        assert!(m.contains("operation leaves a `/*` comment open (from line 1)"), "{m}");
        let m = ew_err("z = x", "", "const char* s = \"open;", "");
        assert!(m.contains("loop_prep leaves a string literal open (from line 1)"), "{m}");
        let m = ew_err("z = x; // \\", "", "", "");
        assert!(m.contains("operation ends in a backslash"), "{m}");
        // `#if 0` left open in the preamble would compile the kernel out.
        let m = ew_err("z = x", "#if 0\nint unused;", "", "");
        assert!(m.contains("preamble leaves the `#if` of line 1 open (no `#endif`)"), "{m}");
        let m = ew_err("z = x", "#endif", "", "");
        assert!(m.contains("preamble has `#endif` on line 1 without its `#if`"), "{m}");
        // Macros belong in the preamble; there none may rename what the generated code uses.
        let m = ew_err("#define SQ(v) ((v) * (v))\nz = SQ(x)", "", "", "");
        assert!(m.contains("operation has the directive `#define SQ(v) ((v) * (v))`, which belongs in the preamble"), "{m}");
        for (mac, why) in [
            ("i", "the generated code declares"),
            ("float", "keyword"),
            ("size_t", "type or namespace"),
            ("_ind", "the generated code declares"),
            ("_q0", "reserved"),
        ] {
            let m = ew_err("z = x", &format!("#define {mac} 0"), "", "");
            assert!(m.contains(&format!("preamble (re)defines the macro `{mac}`")) && m.contains(why), "{m}");
        }
        let m = ew_err("z = x", "#undef DLBRIDGE_PARALLEL_MIN", "", "");
        assert!(m.contains("(re)defines the macro `DLBRIDGE_PARALLEL_MIN`"), "{m}");
        // The same for every reduction fragment: an identity that closes the cast it is put in.
        let e = ReductionSpec::new(&Reduction::new("T x", "T y", "x", "a + b", "y = a", Some("0), evil("), "r")).unwrap_err();
        assert!(e.to_string().contains("identity closes a `)` on line 1 that it did not open"), "{e}");
    }

    #[test]
    fn ordinary_code_stays_accepted() {
        // Brackets, literals and comments that close, digit separators, raw strings,
        // `#pragma` in the body, conditionals and helper macros in the preamble.
        ElementwiseSpec::new("T x", "T z", "#pragma unroll\nfor (int k = 0; k < 2; ++k) { z = x + 1'000 + (T)u8'a'; }\nconst char* s = R\"d(a ) \" } return)d\"; (void)s; /* { */", "ok", "#ifndef SCALE\n#define SCALE(v) ((v) * 2)\n#endif\n#define _USE_MATH_DEFINES\ntemplate <typename V> V twice(V v) { return v + v; }", "int count = 0; // {", "(void)count;")
        .unwrap();
        assert_eq!(scan("a R\"x(} return\n)x\" b").code, "a  \n b");
        assert_eq!(scan("x = 1'000'000; y = 'c';").code, "x = 1'000'000; y =  ;");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Ok(v) => panic!("expected an error, got {v:?}"),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Value, "{e}");
                e.to_string()
            }
        }
    }

    fn ew(i: &str, o: &str) -> Result<ElementwiseSpec> {
        ElementwiseSpec::new(i, o, "z = x", "k", "", "", "")
    }

    fn red(i: &str, o: &str) -> Result<ReductionSpec> {
        ReductionSpec::new(&Reduction::new(i, o, "x", "a + b", "y = a", Some("0"), "r"))
    }

    #[test]
    fn params_parse_types_keywords_and_names() {
        let ps = parse_params(" T x,raw  U y , float32 alpha, mut raw T b, _non_const int64 c ", "in_params").unwrap();
        assert_eq!(
            ps,
            vec![
                Param { name: "x".into(), ty: ParamType::Var('T'), raw: false, mutable: false },
                Param { name: "y".into(), ty: ParamType::Var('U'), raw: true, mutable: false },
                Param { name: "alpha".into(), ty: ParamType::Concrete(DType::F32), raw: false, mutable: false },
                Param { name: "b".into(), ty: ParamType::Var('T'), raw: true, mutable: true },
                Param { name: "c".into(), ty: ParamType::Concrete(DType::I64), raw: false, mutable: true },
            ]
        );
        assert!(parse_params("", "out_params").unwrap().is_empty());
        assert!(parse_params("   ", "out_params").unwrap().is_empty());
    }

    #[test]
    fn param_syntax_errors_name_the_offending_token() {
        assert_eq!(
            err(parse_params("T x, raww T y", "in_params")),
            "in_params: parameter 2 (`raww T y`): unknown keyword `raww` (the keywords are `raw` and `mut`, also spelt `_non_const`)"
        );
        assert_eq!(
            err(parse_params("float33 x", "in_params")),
            "in_params: parameter 1 (`float33 x`): unknown type `float33` (a type is a one-letter placeholder such as \
             `T` or a NumPy dtype name: bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, bfloat16, \
             float32, float64, complex64, complex128)"
        );
        assert_eq!(
            err(parse_params("f32 x", "in_params")).split(" (a type").next().unwrap(),
            "in_params: parameter 1 (`f32 x`): unknown type `f32`"
        );
        assert_eq!(err(parse_params("x", "out_params")), "out_params: parameter 1 (`x`): expected `TYPE NAME`, e.g. `T x` or `float32 x`");
        assert_eq!(err(parse_params("T x,", "in_params")), "in_params: parameter 2 is empty (a stray comma?)");
        assert_eq!(err(parse_params("T x,, T y", "in_params")), "in_params: parameter 2 is empty (a stray comma?)");
        assert_eq!(
            err(parse_params("1 x", "in_params")),
            "in_params: parameter 1 (`1 x`): type placeholder `1` must be one ASCII letter, like `T`"
        );
        assert_eq!(err(parse_params("raw raw T x", "in_params")), "in_params: parameter 1 (`raw raw T x`): keyword `raw` given twice");
        assert_eq!(
            err(parse_params("mut _non_const T x", "in_params")),
            "in_params: parameter 1 (`mut _non_const T x`): keyword `_non_const` given twice"
        );
    }

    #[test]
    fn numpy_names_round_trip_and_cpu_types() {
        for (d, name) in dlbridge_core::dtype::NUMPY_NAMES {
            assert_eq!(numpy_dtype(name), Some(d));
            assert_eq!(numpy_name(d), Some(name));
        }
        assert_eq!(numpy_dtype("float"), None);
        assert_eq!(numpy_dtype("f32"), None);
        assert_eq!(numpy_name(DType::BF16), Some("bfloat16"));
        assert_eq!(cpu_ctype(DType::F32).unwrap(), "float");
        assert_eq!(cpu_ctype(DType::U16).unwrap(), "uint16_t");
        assert_eq!(cpu_ctype(DType::F16).unwrap(), "float16");
        assert_eq!(cpu_ctype(DType::BF16).unwrap(), "bfloat16");
        assert_eq!(cpu_ctype(DType::C128).unwrap(), "std::complex<double>");
        for &d in CPU_DTYPES {
            assert!(cpu_ctype(d).is_ok(), "{d}");
        }
        let f8 = DType::new(dlbridge_core::DTypeCode::Float, 64, 2).unwrap();
        let e = cpu_ctype(f8).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Type);
        assert_eq!(
            e.to_string(),
            format!(
                "dtype {f8} is not supported by the CPU backend (yet); it supports bool, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64, c64, c128"
            )
        );
    }

    #[test]
    fn elementwise_signature_broadcasts_non_raw_operands_and_gives_raw_ones_their_own_group() {
        let s =
            ElementwiseSpec::new("T x, mut T y, raw T r, float32 alpha, raw mut U q", "T z, float64 w", "z = x", "k", "", "", "").unwrap();
        assert_eq!(s.type_vars(), vec!['T', 'U']);
        let all = "bool|i8|i16|i32|i64|u8|u16|u32|u64|f16|bf16|f32|f64|c64|c128";
        let sig = s.signature();
        assert_eq!(
            sig,
            format!(
                "k<T: {all}, U: {all}>(x: T[*S], y: mut T[*S], r: T[...R0], alpha: f32[*S], q: mut U[...R1]) -> (z: T[*S], w: f64[*S])"
            )
        );
        assert_eq!(Signature::parse(&sig).unwrap().to_string(), sig);
        let spec = s.specialised_signature(&[('U', DType::I32), ('T', DType::F64)]).unwrap();
        assert_eq!(spec, "k(x: f64[*S], y: mut f64[*S], r: f64[...R0], alpha: f32[*S], q: mut i32[...R1]) -> (z: f64[*S], w: f64[*S])");
        assert_eq!(Signature::parse(&spec).unwrap().to_string(), spec);
    }

    #[test]
    fn cupy_examples_are_accepted() {
        let sq = ElementwiseSpec::new("float32 x, float32 y", "float32 z", "z = (x - y) * (x - y)", "squared_diff", "", "", "").unwrap();
        assert_eq!(sq.signature(), "squared_diff(x: f32[*S], y: f32[*S]) -> (z: f32[*S])");
        assert_eq!(sq.specialised_signature(&[]).unwrap(), sq.signature());
        let rev = ElementwiseSpec::new("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse", "", "", "").unwrap();
        assert!(rev.signature().ends_with("(x: T[*S], y: T[...R0]) -> (z: T[*S])"), "{}", rev.signature());
        let l2 = ReductionSpec::new(&Reduction::new("T x", "T y", "x * x", "a + b", "y = sqrt(a)", Some("0"), "l2norm")).unwrap();
        let sig = l2.signature();
        assert!(sig.starts_with("l2norm<T: bool|") && sig.ends_with(">(x: T[...S], y: mut T[...O])"), "{sig}");
        Signature::parse(&sig).unwrap();
        assert_eq!(l2.specialised_signature(&[('T', DType::F32)]).unwrap(), "l2norm(x: f32[...S], y: mut f32[...O])");
        assert_eq!(l2.identity.as_deref(), Some("0"));
        let blank =
            ReductionSpec::new(&Reduction { reduce_type: Some(""), ..Reduction::new("T x", "T y", "x", "a + b", "y = a", Some(" "), "s") })
                .unwrap();
        assert_eq!((blank.identity, blank.reduce_type), (None, None));
    }

    #[test]
    fn a_placeholder_only_raw_inputs_use_is_fine() {
        let s = ElementwiseSpec::new("float32 x, raw U table", "float32 z", "z = x + table[0]", "k", "", "", "").unwrap();
        assert_eq!(s.type_vars(), vec!['U']);
        Signature::parse(&s.signature()).unwrap();
    }

    #[test]
    fn names_must_be_c_identifiers_and_not_reserved() {
        let name = |n: &str| err(ElementwiseSpec::new("T x", "T z", "z = x", n, "", "", ""));
        assert_eq!(
            name("my-kernel"),
            "ElementwiseKernel name `my-kernel` is not a C identifier (ASCII letters, digits and `_`, not starting with a digit)"
        );
        assert_eq!(
            name("1st"),
            "ElementwiseKernel name `1st` is not a C identifier (ASCII letters, digits and `_`, not starting with a digit)"
        );
        assert_eq!(name(""), "ElementwiseKernel name `` is not a C identifier (ASCII letters, digits and `_`, not starting with a digit)");
        assert_eq!(name("class"), "ElementwiseKernel name `class` is a C++ keyword");
        assert_eq!(
            name("_k"),
            "ElementwiseKernel name `_k` is reserved: names starting with `_` or `dlbridge` belong to the generated code"
        );
        assert_eq!(name(&"k".repeat(65)), format!("ElementwiseKernel name `{}` is longer than 64 bytes", "k".repeat(65)));
        assert_eq!(name(&"k".repeat(5000)), format!("ElementwiseKernel name `{}...` is longer than 64 bytes", "k".repeat(77)));
        let param = |i: &str, o: &str| err(ew(i, o));
        assert_eq!(
            param("T i", "T z"),
            "ElementwiseKernel `k`: in_params: parameter name `i` is reserved: the generated code declares it (`i` the flat index, `_ind` the size)"
        );
        assert!(ew("T x, int32 n", "T z").is_ok(), "`n` is free for parameters, as in CuPy");
        assert!(param("T _ind", "T z").contains("parameter name `_ind` is reserved"));
        assert_eq!(
            param("T x", "T dlbridge_out"),
            "ElementwiseKernel `k`: out_params: parameter name `dlbridge_out` is reserved: names starting with `_` or `dlbridge` belong to the generated code"
        );
        assert_eq!(
            param("T x", "T _z"),
            "ElementwiseKernel `k`: out_params: parameter name `_z` is reserved: names starting with `_` or `dlbridge` belong to the generated code"
        );
        assert_eq!(param("T int", "T z"), "ElementwiseKernel `k`: in_params: parameter name `int` is a C++ keyword");
        assert_eq!(
            param("T x, T int64_t", "T z"),
            "ElementwiseKernel `k`: in_params: parameter name `int64_t` is reserved: the generated code uses that type or namespace"
        );
        assert!(param("T std", "T z").contains("parameter name `std` is reserved"));
        assert_eq!(
            param("T x.y", "T z"),
            "ElementwiseKernel `k`: in_params: parameter name `x.y` is not a C identifier (ASCII letters, digits and `_`, not starting with a digit)"
        );
        assert_eq!(
            param("T x, T x", "T z"),
            "ElementwiseKernel `k`: in_params: parameter `x` is declared twice (names are unique across in_params and out_params)"
        );
        assert_eq!(
            param("T x", "T x"),
            "ElementwiseKernel `k`: out_params: parameter `x` is declared twice (names are unique across in_params and out_params)"
        );
        assert_eq!(param("T x, T T", "T z"), "ElementwiseKernel `k`: in_params: parameter `T` has the name of a type placeholder");
    }

    #[test]
    fn parameter_text_errors_name_the_kernel() {
        assert_eq!(
            err(ew("T x, raww T y", "T z")),
            "ElementwiseKernel `k`: in_params: parameter 2 (`raww T y`): unknown keyword `raww` (the keywords are `raw` and `mut`, also spelt `_non_const`)"
        );
        assert_eq!(
            err(red("T x", "T")),
            "ReductionKernel `r`: out_params: parameter 1 (`T`): expected `TYPE NAME`, e.g. `T x` or `float32 x`"
        );
    }

    #[test]
    fn elementwise_placement_rules() {
        assert_eq!(
            err(ew("T x", "mut T z")),
            "ElementwiseKernel `k`: out_params: output `z` is `mut`: outputs are always written, `mut` is for inputs"
        );
        // No non-raw input: the caller gives the loop's shape (CuPy's size=) through `_loop`.
        let sized = ew("raw T x", "T z").unwrap();
        assert!(sized.sized_by_caller() && !sized.outputs_given());
        assert!(sized.signature().ends_with("(x: T[...R0], _loop: u8[*S]) -> (z: T[*S])"), "{}", sized.signature());
        // A raw output is passed by the caller, as a `mut` input with its own group.
        let raw_out = ew("raw T x", "raw T y").unwrap();
        assert!(raw_out.sized_by_caller() && raw_out.outputs_given());
        assert!(raw_out.signature().ends_with("(x: T[...R0], _loop: u8[*S], y: mut T[...R1])"), "{}", raw_out.signature());
        assert!(!ew("T x", "T z").unwrap().sized_by_caller());
        // An output type no input has is bound by the array passed for it (CuPy's super-generic example).
        let given = ew("X x, Y y", "Z z, X w").unwrap();
        assert!(given.outputs_given());
        assert!(given.signature().ends_with("(x: X[*S], y: Y[*S], z: mut Z[*S], w: mut X[*S])"), "{}", given.signature());
        assert!(!ew("T x", "T z").unwrap().outputs_given());
        assert_eq!(
            err(ew("A a, B b, C c, D d, E e", "A z")),
            "ElementwiseKernel `k`: 5 type placeholders (`A`, `B`, `C`, `D`, `E`); at most 4 are supported"
        );
        assert_eq!(
            err(ew("T x, raw T a, raw T b, raw T c, raw T d", "T z")),
            "ElementwiseKernel `k`: 4 raw parameters; at most 3 are supported (each is one `...` group of the signature)"
        );
        let many: Vec<String> = (0..17).map(|k| format!("T x{k}")).collect();
        assert_eq!(
            err(ew(&many.join(", "), "T z")),
            "ElementwiseKernel `k`: 18 parameters; at most 16 inputs and outputs together are supported"
        );
        // A kernel without outputs writes a `mut` input in place.
        ElementwiseSpec::new("mut T x", "", "x = x * 2", "k", "", "", "").unwrap();
    }

    #[test]
    fn kernel_texts_are_checked() {
        assert_eq!(err(ElementwiseSpec::new("T x", "T z", "  ", "k", "", "", "")), "ElementwiseKernel `k`: operation is empty");
        assert_eq!(
            err(ElementwiseSpec::new("T x", "T z", "z = x", "k", "int a;\0", "", "")),
            "ElementwiseKernel `k`: preamble contains a NUL character"
        );
        assert_eq!(
            err(ReductionSpec::new(&Reduction::new("T x", "T y", "x", "", "y = a", None, "r"))),
            "ReductionKernel `r`: reduce_expr is empty"
        );
        assert_eq!(
            err(ReductionSpec::new(&Reduction::new("T x", "T y", "x", "a + b", "y = a", Some("0\0"), "r"))),
            "ReductionKernel `r`: identity contains a NUL character"
        );
    }

    #[test]
    fn reduction_placement_rules() {
        assert_eq!(err(red("raw T x", "T y")), "ReductionKernel `r`: in_params: input `x` is raw: reduction inputs are never raw");
        assert_eq!(err(red("mut T x", "T y")), "ReductionKernel `r`: in_params: input `x` is `mut`: a reduction only reads its inputs");
        assert_eq!(err(red("T x", "raw T y")), "ReductionKernel `r`: out_params: output `y` is raw: reduction outputs are never raw");
        assert_eq!(
            err(red("", "T y")).as_str(),
            "ReductionKernel `r`: out_params: output `y` has type `T`, which no input has, so no call can bind it (give an input type `T` or use a concrete type)"
        );
        assert_eq!(err(red("", "float32 y")), "ReductionKernel `r`: in_params is empty: a reduction needs an input to reduce");
        assert_eq!(err(red("T x", "")), "ReductionKernel `r`: out_params is empty: a reduction needs an output");
        assert_eq!(
            err(red("T x", "mut T y")),
            "ReductionKernel `r`: out_params: output `y` is `mut`: outputs are always written, `mut` is for inputs"
        );
        assert_eq!(
            err(red("T x", "T i")),
            "ReductionKernel `r`: out_params: parameter name `i` is reserved: the generated code declares it (`i` the flat index, `_ind` the size)"
        );
    }

    #[test]
    fn binding_must_cover_exactly_the_placeholders() {
        let s = ElementwiseSpec::new("T x, U y", "T z", "z = x + y", "k", "", "", "").unwrap();
        assert_eq!(err(s.specialised_signature(&[('T', DType::F32)])), "ElementwiseKernel `k`: type placeholder `U` is not bound");
        assert_eq!(
            err(s.specialised_signature(&[('T', DType::F32), ('U', DType::F32), ('V', DType::F32)])),
            "ElementwiseKernel `k`: binds `V`, which is not one of its type placeholders"
        );
        assert_eq!(
            err(s.specialised_signature(&[('T', DType::F32), ('T', DType::F64), ('U', DType::F32)])),
            "ElementwiseKernel `k`: binds `T` twice"
        );
        let r = ReductionSpec::new(&Reduction::new("T x", "T y", "x", "a + b", "y = a", None, "r")).unwrap();
        assert_eq!(err(r.specialised_signature(&[])), "ReductionKernel `r`: type placeholder `T` is not bound");
    }
}

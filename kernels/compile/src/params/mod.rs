//! CuPy's parameter language.
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
//! This folder is the language alone: [`Param`] and its parsing (here), the
//! names a parameter or macro may not take (`names.rs`) and the scanning of
//! the C++ fragments a kernel carries (`scan.rs`: comments, strings, brackets
//! and directives). It uses only `dlbridge-core` and the registry's limits;
//! the kernel specifications built on it are in `../spec.rs`.

mod names;
mod scan;

use dlbridge_core::{DType, Error, ErrorKind, Result};

pub(crate) use names::{bad_name, macro_clash, shortened};
pub(crate) use scan::{check_text, has_word, scan};
#[cfg(test)]
pub(crate) use scan::{code_only, digraphs_spelled_out};

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
/// [`crate::codegen::halfs`]; complex is `std::complex`, which only the CPU has); a
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

pub(crate) fn dtype_list(ds: &[DType], sep: &str) -> String {
    ds.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(sep)
}

pub(crate) fn invalid(message: impl Into<String>) -> Error {
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

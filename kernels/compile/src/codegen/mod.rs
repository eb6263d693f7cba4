//! Code generation, one file per backend: `cpu.rs` (C++ for the system
//! compiler, loaded as a plugin), `cuda.rs` (CUDA C for NVRTC), the C++ both
//! share (`headers.rs`: the runtime headers of `include/`, `halfs.rs`: the
//! 2-byte float types). A new backend is a file here and a `Backend` below.
//! Code generation reads a kernel's [`Spec`] and its parameters (`params/`);
//! it builds nothing and runs nothing (that is `builder/` and `launch.rs`).
//!
//! This file holds what the generators share: the line-counting source
//! buffer, C string literals, the head of every generated file (the
//! generator's comment, the runtime, the placeholders' typedefs, the user's
//! preamble) and a reduction's helper functions.

pub(crate) mod cpu;
pub(crate) mod cuda;
mod halfs;
pub(crate) mod headers;

use std::fmt::Write as _;

use dlbridge_core::{DType, Error, ErrorKind, Result};

use crate::params::{Param, ParamType, bound_dtype, numpy_dtype};
use crate::spec::{ReductionSpec, Spec};

/// CuPy's `_in_ind` and `_out_ind` in a reduction's map and post-map
/// (`_in_ind.size() / _out_ind.size()` is the reduced count, CuPy's mean
/// idiom), from the reduced count `_J` and the number of outputs `_M`.
pub(crate) const IN_OUT_IND: [&str; 3] =
    ["  const dlbridge::Size _in_ind(_M * _J), _out_ind(_M);", "  (void)_in_ind;", "  (void)_out_ind;"];

/// Generated source, counting lines so that `#line` directives can point
/// back at the true line.
pub(crate) struct Src {
    pub(crate) text: String,
    newlines: usize,
    file: &'static str,
    /// The nonce of the fragment marks, for sources whose user fragments are
    /// checked after preprocessing ([`crate::builder::fragments`]).
    marks: Option<String>,
}

impl Src {
    /// Generated lines are numbered as `file`.
    pub(crate) fn for_file(file: &'static str) -> Src {
        Src { text: String::with_capacity(32 * 1024), newlines: 0, file, marks: None }
    }
    /// A source whose every user fragment is marked (begin and end, with a
    /// nonce no user text can know), so that [`crate::builder::fragments::check`] finds
    /// each one in the preprocessed file. The first line names the nonce.
    pub(crate) fn marked(file: &'static str) -> Src {
        let nonce = crate::builder::fragments::nonce();
        let mut src = Src::for_file(file);
        src.line(&format!("{}{nonce}", crate::builder::fragments::HEADER));
        src.marks = Some(nonce);
        src
    }
    pub(crate) fn push(&mut self, s: &str) {
        self.newlines += s.bytes().filter(|&b| b == b'\n').count();
        self.text.push_str(s);
    }
    pub(crate) fn line(&mut self, s: &str) {
        self.push(s);
        self.push("\n");
    }
    /// Returns to the generated file's own numbering.
    pub(crate) fn resync(&mut self) {
        // The directive sits on physical line `newlines + 1`, so the next
        // line is `newlines + 2`.
        let next = self.newlines + 2;
        let file = self.file;
        self.line(&format!("#line {next} \"{file}\""));
    }
    /// User text, numbered as its own file `label`, then `closer` (`;` after
    /// a statement, `)` after an expression) on a line of its own, still in
    /// the user's numbering: harmless when the text ends with one, safe
    /// after a trailing `//` comment, and an unfinished text is reported in
    /// the user's file, not in generated code.
    pub(crate) fn user(&mut self, label: &str, text: &str, closer: &str) {
        if let Some(nonce) = self.marks.clone() {
            self.line(&crate::builder::fragments::mark(&nonce, "begin", label));
        }
        self.line(&format!("#line 1 \"{label}\""));
        self.push(text);
        if !text.ends_with('\n') {
            self.push("\n");
        }
        if let Some(nonce) = self.marks.clone() {
            // The closer is generated code: checked as such, outside the fragment.
            self.line(&crate::builder::fragments::mark(&nonce, "end", label));
        }
        if !closer.is_empty() {
            self.line(closer);
        }
        self.resync();
    }
}

/// A C++ string literal holding `s` (escaped; non-ASCII as octal escapes).
pub(crate) fn c_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'?' => out.push_str("\\?"),
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
    out.push('"');
    out
}

/// One line of `text` for the kernel's description: whitespace collapsed, cut.
pub(crate) fn summary(text: &str) -> String {
    let one: Vec<&str> = text.split_whitespace().collect();
    let one = one.join(" ");
    if one.chars().count() > 120 { format!("{}...", one.chars().take(117).collect::<String>()) } else { one }
}

/// What a backend's generated files differ in at their head.
pub(crate) struct Backend {
    /// After the generator's name on the first line (`" (CUDA)"`).
    pub(crate) label: &'static str,
    /// The file name diagnostics use for generated (non-user) lines.
    pub(crate) file: &'static str,
    /// The C type of a dtype, or the backend's refusal.
    pub(crate) ctype: fn(DType) -> Result<&'static str>,
    /// The runtime the generated code needs, after the comments.
    pub(crate) runtime: fn(&mut Src),
    /// Whether the user's fragments are marked for the check after
    /// preprocessing (the system compiler's backend; NVRTC cannot preprocess
    /// alone).
    pub(crate) marked: bool,
}

/// The head of one specialisation's source, and what its body needs.
pub(crate) struct Head<'s> {
    pub(crate) src: Src,
    /// The specialised registry signature.
    pub(crate) signature: String,
    /// Every parameter in call order (inputs, then outputs).
    pub(crate) all: Vec<&'s Param>,
    /// The C type of each of `all`: its placeholder (a typedef) or its dtype's type.
    pub(crate) ctypes: Vec<String>,
}

/// Starts the source of `spec`'s specialisation for `bind` on `backend`:
/// comments naming it, the runtime, a typedef per placeholder, the user's
/// preamble, then the heading of `section`.
///
/// Errors: a binding that does not cover exactly the placeholders (Value), a
/// dtype the backend has no C type for (Type, naming the placeholder or
/// parameter).
pub(crate) fn head<'s, S: Spec>(backend: &Backend, spec: &'s S, bind: &[(char, DType)], section: &str) -> Result<Head<'s>> {
    let (kind, name) = (S::KIND, spec.name());
    let signature = spec.specialised_signature(bind)?;
    let ctype = |d: DType, what: &dyn std::fmt::Display| {
        (backend.ctype)(d).map_err(|e| Error::Coded { kind: ErrorKind::Type, message: format!("{kind} `{name}`: {what}: {e}") })
    };
    let (inputs, outputs) = spec.params();
    let all: Vec<&Param> = inputs.iter().chain(outputs).collect();
    // The generated code names each parameter's type by an alias of its own
    // (`dlbridge_type_T`, `dlbridge_type_i64`), declared before any user
    // text: a text that declares `T` or `int64_t` in a nearer scope (a
    // `typedef` in `loop_prep`) changes what its own code means, never the
    // type the generated code reads and writes.
    let mut aliases: Vec<(String, String)> = Vec::new();
    let ctypes = all
        .iter()
        .map(|p| {
            let (alias, ct) = match p.ty {
                ParamType::Var(c) => (type_alias(&c.to_string()), c.to_string()),
                ParamType::Concrete(d) => {
                    (type_alias(&d.to_string()), ctype(d, &format_args!("parameter `{}`", p.name)).map(str::to_owned)?)
                }
            };
            if !aliases.iter().any(|(a, _)| *a == alias) {
                aliases.push((alias.clone(), ct));
            }
            Ok(alias)
        })
        .collect::<Result<_>>()?;
    let mut types = Vec::new();
    for c in spec.type_vars() {
        let d = bound_dtype(ParamType::Var(c), bind)?;
        types.push((c, d, ctype(d, &format_args!("type placeholder `{c}`"))?));
    }
    let mut src = if backend.marked { Src::marked(backend.file) } else { Src::for_file(backend.file) };
    src.resync();
    let what = if kind.starts_with("tc.") { "Tensor Comprehensions definition" } else { &format!("CuPy {kind}") };
    src.line(&format!("// Generated by dlbridge-compile {}{}: {what} `{name}`.", env!("CARGO_PKG_VERSION"), backend.label));
    if types.is_empty() {
        src.line("// No type placeholders.");
    } else {
        let t: Vec<String> = types.iter().map(|(c, d, ct)| format!("{c} = {d} ({ct})")).collect();
        src.line(&format!("// Specialisation: {}.", t.join(", ")));
    }
    src.line(&format!("// Signature: {signature}"));
    if backend.marked && spec.preamble().contains("include") {
        // libstdc++ 12's <memory> spells an attribute `__noinline__`, which
        // the CPU runtime defines as CUDA's qualifier: a preamble that may
        // include it has it included first.
        src.line("#include <memory>");
    }
    (backend.runtime)(&mut src);
    src.line("");
    src.line("// ---- the kernel's types ----");
    for (c, _, ct) in &types {
        src.line(&format!("typedef {ct} {c};"));
    }
    for (alias, ct) in &aliases {
        src.line(&format!("typedef {ct} {alias};"));
    }
    if !spec.preamble().is_empty() {
        src.user("preamble", spec.preamble(), "");
    }
    src.line("");
    src.line(&format!("// ---- {section} ----"));
    Ok(Head { src, signature, all, ctypes })
}

/// The generated code's own name for the type `what` (a placeholder or a
/// dtype's name): under the prefix no user text may name.
pub(crate) fn type_alias(what: &str) -> String {
    format!("dlbridge_type_{what}")
}

/// What opens the generated code that follows the preamble: a namespace of
/// its own (which no text may open), around an anonymous one (internal
/// linkage). A declaration the text puts in the file's anonymous namespace
/// or at file scope is then never nearer to the generated code than the
/// runtime's own: it is the same entity or an ambiguity the compiler
/// reports, never a silent stand-in.
pub(crate) const OPEN_GENERATED: &str = "namespace dlbridge_kernel {\nnamespace {";

/// What closes [`OPEN_GENERATED`].
pub(crate) const CLOSE_GENERATED: &str = "}  // namespace\n}  // namespace dlbridge_kernel";

/// The reduction's helpers, the same on both backends but for `qualifier`
/// (`inline`, or CUDA's `__device__ __forceinline__`) and the C type of a
/// dtype (`ctype`): `_type_reduce`, then the identity, map, reduce and
/// post-map functions around the user's expressions (in an anonymous
/// namespace when `namespaced`, which the caller closes).
pub(crate) fn reduction_helpers(
    src: &mut Src,
    spec: &ReductionSpec,
    ctypes: &[String],
    qualifier: &str,
    ctype: fn(DType) -> Result<&'static str>,
    namespaced: bool,
) -> Result<()> {
    let (kind, name, n_in) = (ReductionSpec::KIND, &spec.name, spec.inputs.len());
    match &spec.reduce_type {
        None => src.line(&format!("typedef {} _type_reduce;", ctypes[n_in])),
        Some(t) => match numpy_dtype(t.trim()) {
            Some(d) => {
                let ct =
                    ctype(d).map_err(|e| Error::Coded { kind: ErrorKind::Type, message: format!("{kind} `{name}`: reduce_type: {e}") })?;
                src.line(&format!("typedef {ct} _type_reduce;"));
            }
            None => {
                src.line("typedef");
                src.user("reduce_type", t, "");
                src.line("_type_reduce;");
            }
        },
    }
    if namespaced {
        OPEN_GENERATED.lines().for_each(|l| src.line(l));
    }
    if let Some(identity) = &spec.identity {
        src.line(&format!("{qualifier} _type_reduce dlbridge_identity() {{"));
        src.line("  return static_cast<_type_reduce>(");
        src.user("identity", identity, ");");
        src.line("}");
    }
    let in_params: Vec<String> = spec.inputs.iter().enumerate().map(|(t, p)| format!("const {}& {}", ctypes[t], p.name)).collect();
    src.line(&format!(
        "{qualifier} _type_reduce dlbridge_map({}, ptrdiff_t _i, ptrdiff_t _j, ptrdiff_t _J, ptrdiff_t _M) {{",
        in_params.join(", ")
    ));
    src.line("  (void)_i;");
    src.line("  (void)_j;");
    src.line("  (void)_J;");
    IN_OUT_IND.iter().for_each(|l| src.line(l));
    src.line("  return static_cast<_type_reduce>(");
    src.user("map_expr", &spec.map_expr, ");");
    src.line("}");
    src.line(&format!("{qualifier} _type_reduce dlbridge_reduce(const _type_reduce& a, const _type_reduce& b) {{"));
    src.line("  return static_cast<_type_reduce>(");
    src.user("reduce_expr", &spec.reduce_expr, ");");
    src.line("}");
    let out_params: Vec<String> = spec.outputs.iter().enumerate().map(|(m, p)| format!("{}& {}", ctypes[n_in + m], p.name)).collect();
    src.line(&format!(
        "{qualifier} void dlbridge_post_map(const _type_reduce& a, {}, ptrdiff_t _i, ptrdiff_t _J, ptrdiff_t _M) {{",
        out_params.join(", ")
    ));
    src.line("  (void)_i;");
    src.line("  (void)_J;");
    IN_OUT_IND.iter().for_each(|l| src.line(l));
    src.user("post_map_expr", &spec.post_map_expr, ";");
    src.line("}");
    Ok(())
}

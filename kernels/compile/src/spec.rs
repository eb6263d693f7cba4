//! The specification of a kernel from source, shared by every kind and
//! backend: [`Spec`] (what code generation, building and the registry need
//! of a kernel) and CuPy's two kinds of it, [`ElementwiseSpec`] and
//! [`ReductionSpec`], built from parameter text (`params/`).
//!
//! Both validate a whole kernel (names, type variables, what may be raw) and
//! derive its registry signature: the one place the registry learns its
//! dtypes and shapes from. Elementwise kernels broadcast their non-raw
//! operands with the `*S` group; each raw input gets its own `...R<k>` group.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use dlbridge_core::{DType, Error, Result};
use dlbridge_registry::Signature;
use dlbridge_registry::signature::{MAX_PARAMS, MAX_RESTS, MAX_TYPE_VARS};

use crate::params::*;

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
    /// preamble with directives (a macro may paste any name), an operation or
    /// preamble with `static` or `thread_local` state, an `&` or another way
    /// to an element's address (`std::addressof`, `std::ref`, `bit_cast`), or
    /// one that names the flat index `i`, the size `n`, `_ind` or another
    /// name of the generated code's (`_end`). Such a kernel is not
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
            // State kept across elements, or an element's address (through a
            // function of the preamble's too: `where(const T& v)`).
            || [&op, &pre].iter().any(|code| {
                ["static", "thread_local"].iter().any(|w| has_word(code, w))
                    || code.replace("&&", "").contains('&')
                    || batch::ADDRESS_FUNCTIONS.iter().any(|w| has_word(code, w))
                    || ["i", "n", "_ind"].iter().any(|w| has_word(code, w))
                    || generated_name(code)
            })
            // A function that takes the element by reference: the operation
            // calls only what cannot see where its arguments lie.
            || !batch::calls_only_position_blind(&op, &pre, &self.inputs.iter().chain(&self.outputs).map(|p| p.name.as_str()).collect::<Vec<_>>(), &self.type_vars())
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

mod batch;
#[cfg(test)]
mod tests;

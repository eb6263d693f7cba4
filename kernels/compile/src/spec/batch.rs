//! Whether an elementwise operation may run batched (`jax.vmap` as one call
//! on stacked inputs): by an allowlist of what it names, not by a list of
//! what it must not.
//!
//! An element's position reaches the text through a name (`i`, `_ind`), an
//! address (`&y`), state kept across elements (`static`), state each call
//! starts afresh (`errno`, the floating-point environment) or a function
//! that takes the element by reference (`std::addressof(y)`). Rather than
//! name every such way, a batched operation has no preamble and names only
//! its parameters, its type variables, the runtime's math (the names the CPU
//! runtime brings in with `using std::...`), casts and types, and control
//! flow; it takes no address and makes no reference. Anything else keeps
//! the kernel's calls per element, which is always right, only slower.

use std::collections::BTreeSet;
use std::sync::OnceLock;

/// The CPU runtime's header, whose `using std::...` names are its math.
const RUNTIME: &str = include_str!("../../include/dlbridge_compile/cpu_runtime.h");

/// Names a batched operation may call besides the runtime's math: casts,
/// operators that look like calls, fundamental types and the dtypes' C++
/// names (functional casts), `rsqrt`.
const CALLABLE: &[&str] = &[
    "if",
    "while",
    "for",
    "switch",
    "return",
    "sizeof",
    "alignof",
    "decltype",
    "static_cast",
    "const_cast",
    "noexcept",
    "float",
    "double",
    "int",
    "long",
    "short",
    "char",
    "bool",
    "unsigned",
    "signed",
    "float16",
    "bfloat16",
    "half",
    "int8_t",
    "int16_t",
    "int32_t",
    "int64_t",
    "uint8_t",
    "uint16_t",
    "uint32_t",
    "uint64_t",
    "size_t",
    "ptrdiff_t",
    "rsqrt",
    "rsqrtf",
    "min",
    "max",
    "abs",
];

/// Names through which a text can learn where an element lies without `&`:
/// std's functions that take an object by reference and give back where it
/// lies, and GCC's builtins that read a frame. A text naming one anywhere is
/// never batched, even where the preamble defines a function of the same
/// name (a `using` could make the call resolve to std's).
pub(crate) const ADDRESS_FUNCTIONS: &[&str] = &[
    "addressof",
    "__addressof",
    "__builtin_addressof",
    "to_address",
    "pointer_to",
    "data",
    "begin",
    "end",
    "cbegin",
    "cend",
    "launder",
    "reference_wrapper",
    "ref",
    "cref",
    "tie",
    "forward_as_tuple",
    "bit_cast",
    "__builtin_bit_cast",
    "memcpy",
    "memmove",
    "__builtin_frame_address",
    "__builtin_return_address",
];

/// The runtime's math: each `using std::NAME;` of its header.
fn runtime_math() -> &'static BTreeSet<&'static str> {
    static MATH: OnceLock<BTreeSet<&'static str>> = OnceLock::new();
    MATH.get_or_init(|| {
        RUNTIME
            .split("using std::")
            .skip(1)
            .filter_map(|rest| rest.split(';').next())
            .map(str::trim)
            .filter(|n| n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
            .collect()
    })
}

/// One call in code: the called name, and whether it was qualified by `std`
/// (`std::f(`, `::std::f(`) or another scope (`k::f(`, `x.f(`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Call<'a> {
    pub(crate) name: &'a str,
    pub(crate) scope: Scope,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(crate) enum Scope {
    /// `f(`
    None,
    /// `std::f(` or `::std::f(`
    Std,
    /// `k::f(`, `T::f(`
    Other,
    /// `x.f(`, `p->f(`: a member function, which sees `this`
    Member,
}

fn ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The index after the `>` matching the `<` at `at`, if the brackets close
/// before a `;`, `{` or `}`.
fn skip_template_args(code: &[u8], at: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut k = at;
    while k < code.len() {
        match code[k] {
            b'<' => depth += 1,
            b'>' => {
                depth -= 1;
                if depth == 0 {
                    return Some(k + 1);
                }
            }
            b';' | b'{' | b'}' => return None,
            _ => {}
        }
        k += 1;
    }
    None
}

fn skip_space(code: &[u8], mut k: usize) -> usize {
    while k < code.len() && code[k].is_ascii_whitespace() {
        k += 1;
    }
    k
}

/// The calls in `code` (comments and literals already blanked): every name
/// followed by `(`, after template arguments if any.
pub(crate) fn calls(code: &str) -> Vec<Call<'_>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut k = 0;
    while k < b.len() {
        if !ident_start(b[k]) || (k > 0 && (ident_char(b[k - 1]) || b[k - 1] == b'.' && k > 1 && b[k - 2].is_ascii_digit())) {
            k += 1;
            continue;
        }
        let start = k;
        while k < b.len() && ident_char(b[k]) {
            k += 1;
        }
        let name = &code[start..k];
        let mut after = skip_space(b, k);
        if after < b.len() && b[after] == b'<' {
            match skip_template_args(b, after) {
                Some(end) => after = skip_space(b, end),
                None => continue,
            }
        }
        if after >= b.len() || b[after] != b'(' {
            continue;
        }
        // What stands before the name: `::` (and the scope's name), `.`, `->`.
        let before = code[..start].trim_end();
        let scope = if let Some(q) = before.strip_suffix("::") {
            let q = q.trim_end();
            let last = q.rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or("");
            if last == "std" { Scope::Std } else { Scope::Other }
        } else if before.ends_with('.') || before.ends_with("->") {
            Scope::Member
        } else {
            Scope::None
        };
        out.push(Call { name, scope });
    }
    out
}

/// Each name that follows a `::` in `code`, and whether what precedes the
/// `::` is `std` (`std::exp` is `(true, "exp")`, `k::f` is `(false, "f")`,
/// `numeric_limits<T>::max` is `(false, "max")`).
fn qualified_names(code: &str) -> Vec<(bool, &str)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(off) = code[from..].find("::") {
        let at = from + off;
        from = at + 2;
        let rest = code[from..].trim_start();
        let name_len = rest.bytes().take_while(|&b| ident_char(b)).count();
        if name_len == 0 {
            continue;
        }
        let before = code[..at].trim_end();
        let scope = before.rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or("");
        out.push((scope == "std", &rest[..name_len]));
    }
    out
}

/// `code` with C++'s alternative tokens for `&` spelt as `&` (`bitand` is
/// `&`, `and` is `&&`, `and_eq` is `&=`).
fn ampersands(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = String::with_capacity(code.len());
    let mut k = 0;
    while k < b.len() {
        if ident_start(b[k]) && (k == 0 || !ident_char(b[k - 1])) {
            let start = k;
            while k < b.len() && ident_char(b[k]) {
                k += 1;
            }
            out.push_str(match &code[start..k] {
                "bitand" => "&",
                "and" => "&&",
                "and_eq" => "&=",
                w => w,
            });
        } else {
            let c = code[k..].chars().next().unwrap_or(' ');
            out.push(c);
            k += c.len_utf8();
        }
    }
    out
}

/// Whether `code` names a pointer type: a `*` that multiplies nothing, being
/// followed by `)`, `>`, `,`, `*`, `]` or the end, or preceded by `(`.
fn names_a_pointer_type(code: &str) -> bool {
    let b = code.as_bytes();
    (0..b.len()).filter(|&k| b[k] == b'*').any(|k| {
        let next = skip_space(b, k + 1);
        let prev = b[..k].iter().rposition(|c| !c.is_ascii_whitespace());
        next >= b.len() || matches!(b[next], b')' | b'>' | b',' | b'*' | b']') || prev.is_none_or(|p| matches!(b[p], b'(' | b'<' | b','))
    })
}

/// Whether `code` takes an address or names a reference type: a `&` that is
/// not half of a `&&`, or a `&&` that ends a type (`(W&&)y`, `(T(&&)[1])y`,
/// `static_cast<W&&>(y)`) rather than joining two conditions.
fn takes_a_reference(code: &str) -> bool {
    let b = code.as_bytes();
    let mut k = 0;
    while k < b.len() {
        if b[k] != b'&' {
            k += 1;
            continue;
        }
        if k + 1 < b.len() && b[k + 1] == b'&' {
            let next = skip_space(b, k + 2);
            if next >= b.len() || matches!(b[next], b')' | b'>' | b']' | b'[' | b',') {
                return true;
            }
            k += 2;
            continue;
        }
        return true;
    }
    false
}

/// Keywords a batched operation may hold besides [`CALLABLE`]: control
/// flow, literals, operators' alternative spellings (an address taken with
/// `bitand` or `and` is judged below). Any other keyword (`struct`,
/// `operator`, `this`, `asm`, `static`, `extern`, `goto`, `new`, `throw`,
/// `auto`, ...) keeps the kernel's calls per element.
const KEYWORDS: &[&str] = &[
    "else", "do", "break", "continue", "case", "default", "const", "true", "false", "std", "void", "and", "or", "not", "not_eq", "xor",
    "bitor", "compl", "or_eq", "xor_eq", "bitand", "and_eq",
];

/// The runtime's math a batched operation may call: functions whose result
/// IEEE 754 fixes exactly (correctly rounded or exact), so a vector path and
/// a scalar one give the same bits. The others (`tanh`, `sin`, `exp`, ...)
/// may be computed by a vector library in a loop's body and by the scalar
/// library in its tail, a last-place difference that depends on where an
/// element lies: a kernel calling them runs one call per batch element.
const EXACT_MATH: &[&str] = &[
    "abs",
    "fabs",
    "sqrt",
    "fma",
    "fmin",
    "fmax",
    "fmod",
    "remainder",
    "copysign",
    "floor",
    "ceil",
    "trunc",
    "round",
    "nearbyint",
    "rint",
    "isnan",
    "isinf",
    "isfinite",
    "signbit",
    "min",
    "max",
    "std",
    "complex",
    "real",
    "imag",
    "conj",
];

/// The identifiers of `code` (comments and literals blanked; numbers, with
/// their suffixes and exponents, are not names).
fn identifiers(code: &str) -> Vec<&str> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut k = 0;
    while k < b.len() {
        let c = b[k];
        if c.is_ascii_digit() || (c == b'.' && b.get(k + 1).is_some_and(u8::is_ascii_digit)) {
            k += 1;
            while k < b.len()
                && (ident_char(b[k])
                    || b[k] == b'.'
                    || b[k] == b'\''
                    || (matches!(b[k], b'+' | b'-') && matches!(b[k - 1], b'e' | b'E' | b'p' | b'P')))
            {
                k += 1;
            }
            continue;
        }
        if ident_start(c) || !c.is_ascii() || c == b'$' {
            let start = k;
            while k < b.len() && (ident_char(b[k]) || !b[k].is_ascii() || b[k] == b'$') {
                k += 1;
            }
            out.push(&code[start..k]);
            continue;
        }
        k += 1;
    }
    out
}

/// Whether the operation `op`, with the preamble `pre` (both with comments
/// and literals blanked), can only compute each element from its own
/// arguments: the preamble is empty, and every name the operation uses is
/// one of its parameters (`params`), its type variables, the runtime's
/// math, a cast or type of [`CALLABLE`], or a keyword of [`KEYWORDS`]. A
/// name the text declares or takes from elsewhere (a local, a preamble
/// function, `errno`, `fesetround`, a header's global) could hold state
/// that a call starts afresh, so it keeps the calls per element; only an
/// allowlist, never a reading of what the text declares, decides.
pub(crate) fn calls_only_position_blind(op: &str, pre: &str, params: &[&str], type_vars: &[char]) -> bool {
    if !pre.trim().is_empty() {
        return false;
    }
    let math = runtime_math();
    let is_type_var = |n: &str| n.len() == 1 && n.chars().next().is_some_and(|c| type_vars.contains(&c));
    if !identifiers(op)
        .iter()
        .all(|n| params.contains(n) || is_type_var(n) || EXACT_MATH.contains(n) || CALLABLE.contains(n) || KEYWORDS.contains(n))
    {
        return false;
    }
    // An address taken, however spelt (`&y`, `bitand y`, `(W&&)y`), or a reference type made;
    // a pointer type named (`(T*)4096`, `(int(*)(int))f`, `<T*>`), which makes an address of a number.
    let op = ampersands(op);
    if takes_a_reference(&op) || names_a_pointer_type(&op) {
        return false;
    }
    // Every qualified name, called or not (a type in a cast, `std::add_lvalue_reference_t<T[1]>`,
    // makes a reference without `&`), is std's math; every call the runtime's math, a cast or a
    // type; a member function only `<complex>`'s (`z.real()`).
    let exact = |n: &str| EXACT_MATH.contains(&n) && math.contains(n);
    qualified_names(&op).iter().all(|(std, name)| *std && exact(name))
        && calls(&op).iter().all(|c| {
            !ADDRESS_FUNCTIONS.contains(&c.name)
                && match c.scope {
                    Scope::Std | Scope::Member => exact(c.name),
                    Scope::None => exact(c.name) || CALLABLE.contains(&c.name) || is_type_var(c.name),
                    Scope::Other => false,
                }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtimes_math_is_read_from_its_header() {
        let m = runtime_math();
        for name in ["exp", "tanh", "erf", "fma", "isnan", "complex", "min", "max", "numeric_limits"] {
            assert!(m.contains(name), "{name}");
        }
        assert!(!m.contains("addressof"));
    }

    #[test]
    fn calls_are_found_with_their_scope() {
        let c = calls("y = std::exp(x) + k::f<T>(x) + g (x) + v.h(1) + p->q() + ::std::sin(x) + a < b; z = 1.5e3f;");
        let names: Vec<(&str, Scope)> = c.iter().map(|c| (c.name, c.scope)).collect();
        assert_eq!(
            names,
            [("exp", Scope::Std), ("f", Scope::Other), ("g", Scope::None), ("h", Scope::Member), ("q", Scope::Member), ("sin", Scope::Std)]
        );
    }

    #[test]
    fn a_call_that_could_see_an_elements_address_keeps_calls_per_element() {
        let blind = |op: &str, pre: &str| calls_only_position_blind(op, pre, &["x", "y", "z", "v"], &['T']);
        assert!(blind("y = sqrt(x) * T(2) + max(x, 0.f)", ""));
        assert!(blind("y = std::fabs(x) + static_cast<float>(x)", ""));
        // Math a vector library may round otherwise than the scalar one: per element.
        assert!(!blind("y = tanh(x)", ""));
        assert!(!blind("y = std::exp(x)", ""));
        assert!(!blind("y = sin(x) + x", ""));
        assert!(blind("y = (x > 0 && x < 1) ? x.real() : T(0)", ""));
        assert!(blind("y = (x > 0 and x < 1) ? x : T(0)", ""));
        assert!(blind("if (x > 0) { y = x; } else { y = -x; }", ""));
        assert!(blind("y = std::fmin(x, T(1)) + 1.5e+3f + 0x1p-2", ""));
        assert!(blind("y = x * x * (T)2 * -x", ""));
        // A preamble, a local, or any name from elsewhere: per element.
        assert!(!blind("y = k::twice(x)", "namespace k { inline float twice(float v) { return 2 * v; } }"));
        assert!(!blind("y = x", "inline float twice(float v) { return 2 * v; }"));
        assert!(!blind("auto t = tanh(x); y = t", ""));
        assert!(!blind("for (int k = 0; k < 3; ++k) { y = y + x; }", ""));
        assert!(!blind("y = unknown(x)", ""));
        assert!(!blind("y = x.foo()", ""));
        assert!(!blind("y = x; (fesetround)(FE_UPWARD)", ""));
        assert!(!blind("y = x + (T)(errno == 77); errno = 77", ""));
        assert!(!blind("y = x + (T)[]{ return errno == 77; }()", ""));
        assert!(!blind("(void)sizeof errno; y = (T)(errno == 77)", ""));
        assert!(!blind("int a = 0; (void)a, errno = errno; y = x", ""));
        // Addresses and references, however spelt.
        assert!(!blind("y = x + (T)(reinterpret_cast<unsigned long>(std::__addressof(y)) % 64)", ""));
        assert!(!blind("y = std::pointer_traits<T*>::pointer_to(y) != nullptr", ""));
        assert!(!blind("y = x + (T)(((size_t)(bitand y) / sizeof(T)) % 16)", ""));
        assert!(!blind("y = x + (T)(((size_t)&y / sizeof(T)) % 16)", ""));
        // A number made an address.
        assert!(!blind("y = *(T*)(size_t)4096", ""));
        assert!(!blind("y = ((T *)(size_t)4096)[3]", ""));
        assert!(!blind("y = rint(x); ((int(*)(int))4096ULL)(0x800)", ""));
        assert!(!blind("y = reinterpret_cast<T*>(4096)[0]", ""));
        assert!(!blind("y = frexp(x, (int*)0)", ""));
        assert!(!blind("y = x + (T)((((unsigned long)(T(&&)[1])y) / sizeof(T)) % 16)", ""));
        assert!(!blind("y = x + (T)(((unsigned long)(T(and)[1])y) % 16)", ""));
        assert!(!blind("y = x + (T)((unsigned long)static_cast<T(&&)[1]>(y) % 16)", ""));
        assert!(!blind("y = x + (T)((((unsigned long)(std::add_lvalue_reference_t<T[1]>)y) / sizeof(T)) % 16)", ""));
    }
}

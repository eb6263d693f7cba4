//! Whether an elementwise operation may run batched (`jax.vmap` as one call
//! on stacked inputs): by what it calls, not by a list of what it must not.
//!
//! An element's position reaches the text through a name (`i`, `_ind`), an
//! address (`&y`), state kept across elements (`static`) or a function that
//! takes the element by reference (`std::addressof(y)`, `std::__addressof`,
//! `std::pointer_traits<T*>::pointer_to(y)`, a template of the preamble's
//! taking `U&&`). Rather than name every such function, a batched operation
//! calls only what cannot see where its arguments lie: the runtime's math
//! (the names the CPU runtime brings in with `using std::...`), `min`/`max`,
//! casts and types, and functions the preamble defines when the preamble
//! takes no reference (`&`, `&&`, `bitand`, `and`), has no member function
//! or operator (`this`) at all, and itself calls only what this rule allows. Any other call keeps the kernel's
//! calls per element, which is always right, only slower.

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

/// The functions `code` defines: names followed by a parameter list and a
/// body (`f(float v) {`, `f(float v) const noexcept -> float {`).
pub(crate) fn defined_functions(code: &str) -> BTreeSet<&str> {
    let b = code.as_bytes();
    let mut out = BTreeSet::new();
    for call in calls(code) {
        // Each occurrence of the name: find its `(`, the matching `)`, then a `{`.
        let mut from = 0;
        while let Some(off) = code[from..].find(call.name) {
            let at = from + off;
            from = at + call.name.len();
            let mut k = skip_space(b, from);
            if k < b.len() && b[k] == b'<' {
                match skip_template_args(b, k) {
                    Some(end) => k = skip_space(b, end),
                    None => continue,
                }
            }
            if k >= b.len() || b[k] != b'(' {
                continue;
            }
            let mut depth = 0usize;
            while k < b.len() {
                match b[k] {
                    b'(' => depth += 1,
                    b')' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                k += 1;
            }
            // After the parameters: qualifiers, a trailing return type, then `{`.
            let rest = &code[(k + 1).min(code.len())..];
            let head = rest.split(['{', ';', '(', ')', '=']).next().unwrap_or("");
            if rest[head.len()..].starts_with('{') {
                out.insert(call.name);
            }
        }
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

/// Keywords a batched text may hold besides [`CALLABLE`]: control flow,
/// qualifiers, literals. Any other keyword (`struct`, `operator`, `this`,
/// `asm`, `static`, `extern`, `goto`, `new`, `throw`, ...) keeps the kernel's
/// calls per element.
const KEYWORDS: &[&str] = &[
    "else",
    "do",
    "break",
    "continue",
    "case",
    "default",
    "const",
    "constexpr",
    "volatile",
    "auto",
    "inline",
    "true",
    "false",
    "nullptr",
    "namespace",
    "std",
    "void",
    // Operators' alternative spellings (`bitand` and `and` taking an address are judged below).
    "and",
    "or",
    "not",
    "not_eq",
    "xor",
    "bitor",
    "compl",
    "or_eq",
    "xor_eq",
    "bitand",
    "and_eq",
];

/// The identifiers of `code` (comments and literals blanked), each with the
/// token before it and the first non-space character after it, and the
/// depth of parentheses, brackets and braces it lies at within its statement.
fn identifiers(code: &str) -> Vec<Ident<'_>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let (mut k, mut depth, mut prev): (usize, usize, &str) = (0, 0, ";");
    while k < b.len() {
        let c = b[k];
        if c.is_ascii_whitespace() {
            k += 1;
            continue;
        }
        // A number (its letters: suffixes, exponents, hex digits) is no name.
        if c.is_ascii_digit() || (c == b'.' && b.get(k + 1).is_some_and(u8::is_ascii_digit)) {
            while k < b.len()
                && (ident_char(b[k])
                    || b[k] == b'.'
                    || b[k] == b'\''
                    || (matches!(b[k], b'+' | b'-') && matches!(b[k - 1], b'e' | b'E' | b'p' | b'P')))
            {
                k += 1;
            }
            prev = "0";
            continue;
        }
        if ident_start(c) || !c.is_ascii() || c == b'$' {
            let start = k;
            while k < b.len() && (ident_char(b[k]) || !b[k].is_ascii() || b[k] == b'$') {
                k += 1;
            }
            let name = &code[start..k];
            let next = b.get(skip_space(b, k)).copied().unwrap_or(b';');
            out.push(Ident { name, prev, next, depth });
            prev = name;
            continue;
        }
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if matches!(c, b';' | b'{' | b'}') {
            depth = if c == b'{' { 0 } else { depth };
        }
        prev = &code[k..k + 1];
        k += 1;
    }
    out
}

struct Ident<'a> {
    name: &'a str,
    prev: &'a str,
    next: u8,
    depth: usize,
}

/// Whether every name in `code` is one a batched text may use: a
/// parameter, a type variable, the runtime's math, a cast or type, a
/// keyword of [`KEYWORDS`], a name `known` already holds, or one the text
/// declares (after a type, `auto`, `namespace`, or after a comma that
/// continues a declaration). Names the text declares are added to `known`.
/// Anything else (`errno`, `fesetround` taken as a value, a macro of the
/// C library, a global of a header) could read state a call starts afresh.
fn names_all_known<'a>(code: &'a str, known: &mut BTreeSet<&'a str>, type_vars: &[char]) -> bool {
    let math = runtime_math();
    let is_type = |n: &str| {
        CALLABLE.contains(&n)
            || ["auto", "namespace", "void"].contains(&n)
            || (n.len() == 1 && n.chars().next().is_some_and(|c| type_vars.contains(&c)))
    };
    // A declaration's statement: its names after a top-level comma are declared too.
    let mut declaring = false;
    for id in identifiers(code) {
        let declared = is_type(id.prev) && !matches!(id.next, b':' | b'<') && !CALLABLE.contains(&id.name);
        if id.prev == ";" || id.prev == "{" || id.prev == "}" {
            declaring = false;
        }
        if is_type(id.prev) && id.depth == 0 {
            declaring = true;
        }
        let continued = declaring && id.prev == "," && id.depth == 0 && matches!(id.next, b'=' | b',' | b';' | b'[' | b'(' | b'{');
        if declared || continued {
            known.insert(id.name);
            continue;
        }
        let ok = known.contains(id.name)
            || math.contains(id.name)
            || CALLABLE.contains(&id.name)
            || KEYWORDS.contains(&id.name)
            || is_type(id.name);
        if !ok {
            return false;
        }
    }
    true
}

/// Whether the operation `op`, with the preamble `pre` (both with comments
/// and literals blanked), calls only what cannot see where an element lies,
/// and names only its parameters (`params`), its type variables, the
/// runtime's math, casts and types, and what it or the preamble declares.
pub(crate) fn calls_only_position_blind(op: &str, pre: &str, params: &[&str], type_vars: &[char]) -> bool {
    let mut known: BTreeSet<&str> = params.iter().copied().collect();
    let mut pre_known = known.clone();
    let pre_names = names_all_known(pre, &mut pre_known, type_vars);
    if pre_names {
        known = pre_known;
    }
    if !names_all_known(op, &mut known, type_vars) {
        return false;
    }
    let math = runtime_math();
    let (op, pre) = (ampersands(op), ampersands(pre));
    let word = |code: &str, words: &[&str]| words.iter().any(|w| crate::params::has_word(code, w));
    // A preamble with a member function or an operator (which sees its object as
    // `this`, and runs without a call's parentheses) or a `using`: never batched. One
    // whose functions could take an element by reference: none of its functions count as
    // position-blind.
    if word(&pre, &["this", "operator", "using"]) || word(&op, &["this", "using", "typedef", "template"]) || takes_a_reference(&op) {
        return false;
    }
    let is_type_var = |n: &str| n.len() == 1 && n.chars().next().is_some_and(|c| type_vars.contains(&c));
    // Whether `code` calls, and names after a `::`, only the runtime's math, casts and
    // types, and the functions in `defined`.
    let blind = |code: &str, defined: &BTreeSet<&str>| {
        // Every qualified name, called or not (a type in a cast, `std::add_lvalue_reference_t<T[1]>`,
        // makes a reference without `&`): std's math, or a function of the preamble's.
        qualified_names(code).iter().all(|(std, name)| if *std { math.contains(name) } else { defined.contains(name) })
            && calls(code).iter().all(|c| {
                if ADDRESS_FUNCTIONS.contains(&c.name) {
                    return false;
                }
                match c.scope {
                    Scope::Std => math.contains(c.name),
                    Scope::None => math.contains(c.name) || CALLABLE.contains(&c.name) || is_type_var(c.name) || defined.contains(c.name),
                    Scope::Other => defined.contains(c.name) && !c.name.starts_with('_'),
                    // `z.real()`, `z.imag()` of `<complex>`; no member function of the text's.
                    Scope::Member => math.contains(c.name),
                }
            })
    };
    // The preamble's functions count as blind only when their own bodies are, by
    // this same rule: a body that calls anything else (`fegetround`, which reads
    // the floating-point environment each call starts from) could tell one call's
    // elements from another's.
    let mut defined = if pre.contains('&') { BTreeSet::new() } else { defined_functions(&pre) };
    if !pre_names || !blind(&pre, &defined) {
        defined.clear();
    }
    blind(&op, &defined)
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
        assert!(blind("y = tanh(x) * T(2) + max(x, 0.f)", ""));
        assert!(blind("y = std::exp(x) + static_cast<float>(x)", ""));
        assert!(blind("y = k::twice(x)", "namespace k { inline float twice(float v) { return 2 * v; } }"));
        assert!(blind("y = twice(x)", "inline float twice(float v) const noexcept { return 2 * v; }"));
        assert!(!blind("y = x + (T)(reinterpret_cast<unsigned long>(std::__addressof(y)) % 64)", ""));
        assert!(!blind("y = std::pointer_traits<T*>::pointer_to(y) != nullptr", ""));
        assert!(!blind("y = where(y)", "template <class U> float where(U&& v) { return 0; }"));
        assert!(!blind("y = __addressof(y) != 0", "using namespace std;"));
        assert!(!blind("y = k::__addressof(y) != 0", "namespace k { float __addressof(float v) { return v; } }"));
        assert!(!blind("y = unknown(x)", ""));
        assert!(!blind("y = x.foo()", ""));
        assert!(!blind("y = x + (T)(((size_t)(bitand y) / sizeof(T)) % 16)", ""));
        assert!(!blind("y = x + (T)(where(y) % 16)", "inline unsigned long where(float bitand v) { return 0; }"));
        assert!(!blind("y = x + (T)(((W&&)y).where())", "struct W { float v; unsigned long where() { return (unsigned long)this; } };"));
        assert!(!blind("y = x + T(w(y))", "inline float w(float and v) { return v; }"));
        assert!(blind("y = (x > 0 && x < 1) ? x.real() : T(0)", ""));
        assert!(blind("y = (x > 0 and x < 1) ? x : T(0)", ""));
        assert!(!blind("y = x + (T)(((W&&)y) + 0)", "struct W { float v; unsigned long operator+(int) { return 0; } };"));
        assert!(!blind("y = x + (T)((((unsigned long)(T(&&)[1])y) / sizeof(T)) % 16)", ""));
        assert!(!blind("y = x + (T)(((unsigned long)(T(and)[1])y) % 16)", ""));
        assert!(!blind("y = x + (T)((unsigned long)static_cast<T(&&)[1]>(y) % 16)", ""));
        assert!(!blind("y = x + (T)((((unsigned long)(std::add_lvalue_reference_t<T[1]>)y) / sizeof(T)) % 16)", ""));
        assert!(!blind("typedef T A1[1]; typedef A1 and AR; y = x + (T)((((unsigned long)(AR)y) / sizeof(T)) % 16)", ""));
        assert!(blind("y = std::fmin(x, T(1)) + k::twice(x)", "namespace k { inline float twice(float v) { return 2 * v; } }"));
        // Names that reach state a call starts afresh, whatever the spelling of the call.
        assert!(!blind("y = x; (fesetround)(FE_UPWARD)", ""));
        assert!(!blind("auto exp = fesetround; y = x; exp(FE_UPWARD)", ""));
        assert!(!blind("y = x + (T)(errno == 77); errno = 77", ""));
        assert!(!blind("R r{1}; y = x", "struct R { int v; R(int k) : v(k) {} };"));
        assert!(!blind("float r = twice(x, errno = 77); y = r", "inline float twice(float v, int e) { return 2 * v; }"));
        // What the text declares is its own.
        assert!(blind("volatile float a = x, b = 3.0f; y = (T)(a / b) * 3.0f - x", ""));
        assert!(blind("auto t = tanh(x); const T u = t * T(2); y = u", ""));
        assert!(blind("for (int k = 0; k < 3; ++k) { y = y + x; } if (x > 0) { y = x; } else { y = -x; }", ""));
        // A preamble function's own calls follow the same rule.
        let fenv = "namespace q { inline float first(float v) { float r = fegetround() == FE_TONEAREST ? v : v + 1; fesetround(FE_UPWARD); return r; } }";
        assert!(!blind("y = q::first(x)", fenv));
        assert!(!blind("y = twice(x)", "inline float twice(float v) { return 2 * std::fegetround(); }"));
        assert!(!blind("y = twice(x)", "inline float twice(float v) { return v + (float)k::secret(); }"));
        assert!(blind("y = twice(x)", "inline float half(float v) { return v / 2; } inline float twice(float v) { return 4 * half(v); }"));
    }
}

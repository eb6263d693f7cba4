//! The names a kernel, a parameter or a preamble macro may not take: C++
//! keywords, the names the generated code declares or uses, the C library's
//! macros, and the `_`/`dlbridge` prefixes the generated code keeps for itself.

use dlbridge_registry::signature::MAX_NAME_LEN;

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
pub(crate) fn macro_clash(name: &str) -> Option<&'static str> {
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

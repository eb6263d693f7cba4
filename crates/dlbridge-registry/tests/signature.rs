use dlbridge_core::{DType, ErrorKind};
use dlbridge_registry::Signature;
use dlbridge_registry::signature::{DTypeRef, Dim, ParamKind, ScalarKind};

#[test]
fn design_examples_parse_and_print_back() {
    for text in [
        "matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])",
        "add<T: f32|f64|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])",
        "axpy<T: f32|f64>(alpha: f64, x: T[N], y: mut T[N])",
        "softmax<T: f32|f64>(x: T[...B, N]) -> (y: T[...B, N])",
        "sum_all<T: f32>(x: T[...S]) -> (y: T[])",
        "fill(x: mut u8[4, ...R], value: i64, flag: bool)",
    ] {
        let sig = Signature::parse(text).unwrap();
        assert_eq!(sig.to_string(), text);
        assert_eq!(Signature::parse(&sig.to_string()).unwrap(), sig);
    }
}

#[test]
fn parsed_structure_is_what_was_written() {
    let sig = Signature::parse("axpy<T: f32|f64>(alpha: f64, x: T[N], y: mut T[N])").unwrap();
    assert_eq!(sig.name, "axpy");
    assert_eq!(sig.type_vars[0].allowed, vec![DType::F32, DType::F64]);
    assert_eq!(sig.params[0].kind, ParamKind::Scalar(ScalarKind::F64));
    let y = sig.params[2].tensor().unwrap();
    assert!(y.mutable);
    assert_eq!(y.dtype, DTypeRef::Var(0));
    assert_eq!(y.dims, vec![Dim::Sym(0)]);
    assert!(sig.outputs.is_empty());
}

fn err(text: &str) -> (usize, String) {
    match Signature::parse(text).unwrap_err() {
        e @ dlbridge_core::Error::Signature { .. } => {
            assert_eq!(e.kind(), ErrorKind::Value);
            let dlbridge_core::Error::Signature { column, message, .. } = e else { unreachable!() };
            (column, message)
        }
        other => panic!("expected a signature error, got {other:?}"),
    }
}

#[test]
fn parse_errors_point_at_the_column() {
    let cases: &[(&str, usize, &str)] = &[
        ("matmul(a: f32[M, K)", 19, "expected `]`"),
        ("f(x: q7[N])", 6, "neither a dtype nor a declared type variable"),
        ("f(x: f32[N]) -> (y: f32[M])", 18, "dim `M` is not bound"),
        ("f<T: f32>(x: f64[N])", 1, "type variable `T` is not used"),
        ("f<T: f32|f32>(x: T[N])", 10, "listed twice"),
        ("f(x: f32[N], x: f32[N])", 14, "declared twice"),
        ("f(x: f32)", 6, "scalars are f64, i64 or bool"),
        ("f(x: f32[N]) -> (y: mut f32[N])", 21, "`mut` is for inputs"),
        ("f(x: f32[...A, ...B])", 16, "at most one `...`"),
        ("f(x: f32[N, ...N])", 16, "already a single dim"),
        ("f(x: f32[-1])", 10, "must not be negative"),
        ("f(x: f32[N]) extra", 14, "unexpected `extra`"),
        ("f(x: f32[N]) -> (s: f64)", 18, "must be a tensor"),
        ("f(x: f32[N]", 12, "expected `)`"),
        ("f(x: f32[99999999999999999999])", 10, "too large"),
        ("f(x: f32[N]) $", 14, "unexpected character"),
        ("", 1, "expected the kernel name"),
        ("f<f32: f32>(x: f32[N])", 3, "shadow"),
    ];
    for &(text, column, needle) in cases {
        let (c, m) = err(text);
        assert!(m.contains(needle), "{text:?}: message {m:?} should contain {needle:?}");
        assert_eq!(c, column, "{text:?}: {m}");
    }
}

#[test]
fn parse_error_text_shows_a_caret() {
    let e = Signature::parse("matmul(a: f32[M, K)").unwrap_err().to_string();
    assert!(e.contains("column 19"), "{e}");
    assert!(e.contains("\n  matmul(a: f32[M, K)\n                    ^"), "{e:?}");
}

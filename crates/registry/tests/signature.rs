use dlbridge_core::{DType, ErrorKind};
use dlbridge_registry::Signature;
use dlbridge_registry::signature::{DTypeRef, Dim, ParamKind, ScalarKind};

/// `text` parses, prints back as itself, and that parses to the same signature.
fn assert_prints_back(text: &str) {
    let sig = Signature::parse(text).unwrap();
    assert_eq!(sig.to_string(), text);
    assert_eq!(Signature::parse(&sig.to_string()).unwrap(), sig);
}

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
        assert_prints_back(text);
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

/// Parses `text`, which must fail, and returns the message; checks that it took
/// well under a second and that the message is short.
fn refused_quickly(what: &str, text: &str) -> String {
    let start = std::time::Instant::now();
    let e = Signature::parse(text).unwrap_err();
    let took = start.elapsed();
    let msg = e.to_string();
    eprintln!("{what}: {} bytes refused in {took:?} with a {}-byte message", text.len(), msg.len());
    assert!(took < std::time::Duration::from_secs(1), "{what}: took {took:?}");
    assert!(msg.len() < 1024, "{what}: message of {} bytes", msg.len());
    assert_eq!(e.kind(), ErrorKind::Value);
    msg
}

#[test]
fn a_megabyte_signature_is_refused_at_once_with_a_short_message() {
    let mut text = String::from("big(");
    let mut i = 0;
    while text.len() < 1 << 20 {
        text.push_str(&format!("x{i}: f32[N], "));
        i += 1;
    }
    text.push_str("y: f32[N])");
    let msg = refused_quickly("1 MB of parameters", &text);
    assert!(msg.contains(&format!("the signature is {} bytes long; at most 4096 are allowed", text.len())), "{msg}");
    let msg = refused_quickly("1 MB of one 3-byte character", &"€".repeat(1 << 18));
    assert!(msg.contains("at most 4096"), "{msg}");
}

#[test]
fn a_hundred_thousand_parameters_are_refused_quickly() {
    let params: Vec<String> = (0..100_000).map(|i| format!("x{i}: f32[N]")).collect();
    let msg = refused_quickly("10^5 parameters", &format!("f({})", params.join(", ")));
    assert!(msg.contains("at most 4096"), "{msg}");
    // Within the length limit, the parameter limit stops the parse at the 17th.
    let params: Vec<String> = (0..200).map(|i| format!("x{i}: f32[N]")).collect();
    let text = format!("f({})", params.join(", "));
    let msg = refused_quickly("200 parameters", &text);
    assert!(msg.contains("more than 16 parameters and outputs"), "{msg}");
    assert!(msg.contains("x16: f32[N]"), "the excerpt shows where: {msg}");
}

#[test]
fn pathological_signatures_within_the_limit_stay_linear() {
    let cases = [
        ("repeated `...` groups", format!("f(x: f32[{}])", vec!["...A"; 600].join(", "))),
        ("many dims", format!("f(x: f32[{}])", vec!["N"; 1300].join(", "))),
        ("many type variables", format!("f<{}>(x: T0[N])", (0..300).map(|i| format!("T{i}: f32")).collect::<Vec<_>>().join(", "))),
        ("many dtypes for one variable", format!("f<T: {}>(x: T[N])", (1..450).map(|i| format!("f32x{i}")).collect::<Vec<_>>().join("|"))),
        ("many dim symbols", format!("f(x: f32[{}])", (0..600).map(|i| format!("D{i}")).collect::<Vec<_>>().join(", "))),
        ("one long name", format!("{}(x: f32[N])", "n".repeat(4000))),
        ("one long integer", format!("f(x: f32[{}])", "9".repeat(4000))),
        ("nothing but punctuation", "(".repeat(4096)),
    ];
    for (what, text) in &cases {
        assert!(text.len() <= 4096, "{what}: {} bytes", text.len());
        let msg = refused_quickly(what, text);
        eprintln!("{msg}");
        let first = msg.lines().next().unwrap_or("");
        assert!(!first.contains(&"n".repeat(40)) && !first.contains(&"9".repeat(40)), "{what}: names are cut in the message: {msg}");
    }
}

#[test]
fn an_error_deep_in_a_long_signature_shows_a_window_with_the_caret_under_it() {
    let dims = vec!["N"; 63].join(", ");
    let params: Vec<String> = "abcdefg".chars().map(|p| format!("{p}: f32[{dims}]")).collect();
    // The error is the `$`; multi-byte characters follow it, so the window's end
    // falls inside one (they are 3 bytes each).
    let text = format!("f({}, h: f32[N, ${}])", params.join(", "), "€".repeat(200));
    assert!(text.len() < 4096);
    let dollar = text.find('$').unwrap();
    let e = Signature::parse(&text).unwrap_err();
    let dlbridge_core::Error::Signature { signature, column, message } = &e else { panic!("{e:?}") };
    assert!(signature.len() <= 200 + 2 * '…'.len_utf8(), "{signature}");
    assert!(signature.starts_with('…') && signature.ends_with('…'), "{signature}");
    assert!(message.starts_with("unexpected character `$`"), "{message}");
    assert!(message.contains(&format!("(character {} of a {}-byte signature, shown cut)", dollar + 1, text.len())), "{message}");
    assert_eq!(signature.chars().nth(column - 1), Some('$'), "{signature} / {column}");
    let shown = e.to_string();
    assert!(shown.len() < 1024, "{shown}");
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 3, "{shown}");
    let caret = lines[2].chars().count() - 1;
    assert_eq!(lines[1].chars().nth(caret), Some('$'), "the caret points at the `$`:\n{shown}");
}

#[test]
fn a_short_signature_with_multibyte_text_puts_the_caret_under_the_character() {
    let (column, message) = err("f(é: f32[N])");
    assert_eq!(column, 3);
    assert!(message.contains("unexpected character `é`"), "{message}");
    let (column, _) = err("f(x: f32[N]) → (y: f32[N])");
    assert_eq!(column, 14, "columns count characters");
}

#[test]
fn dim_expressions_parse_print_back_and_evaluate() {
    for text in [
        "conv<T: f32>(x: T[N, H], w: T[KH]) -> (y: T[N, (H - KH + 1)])",
        "pool(x: f32[H, W]) -> (y: f32[((H - 2) / 2 + 1), min(H, W)])",
        "scale(x: f32[N], g: f32[(2 * N - 1)]) -> (y: f32[max(N, 3)])",
    ] {
        assert_prints_back(text);
    }
    let sig = Signature::parse("pool(x: f32[H, W]) -> (y: f32[((H - 2) / 2 + 1), min(H, W)])").unwrap();
    let out = sig.outputs[0].tensor().unwrap();
    let value = |d: usize| match out.dims[d] {
        Dim::Expr(e) => sig.exprs[e].eval(&|s| Some([7, 4][s])),
        _ => None,
    };
    assert_eq!((value(0), value(1)), (Some(3), Some(4)));
    // Rounding down, also below zero.
    let sig = Signature::parse("f(x: f32[H]) -> (y: f32[((H - 2) / 2)])").unwrap();
    let Dim::Expr(e) = sig.outputs[0].tensor().unwrap().dims[0] else { panic!() };
    assert_eq!(sig.exprs[e].eval(&|_| Some(1)), Some(-1));
    assert_eq!(sig.exprs[e].eval(&|_| None), None);
}

#[test]
fn dim_expressions_use_only_symbols_bound_before() {
    let (_, m) = err("f(x: f32[N]) -> (y: f32[(N + M)])");
    assert!(m.contains("dim `M` is not bound"), "{m}");
    let (_, m) = err("f(g: f32[(N - 1)], x: f32[N])");
    assert!(m.contains("dim `N` is used in an expression before an input binds it"), "{m}");
    let (_, m) = err("f(x: f32[N]) -> (y: f32[(N - ...)])");
    assert!(m.contains("in a dim expression"), "{m}");
    let deep = format!("f(x: f32[N]) -> (y: f32[{}N{}])", "(".repeat(40), ")".repeat(40));
    let (_, m) = err(&deep);
    assert!(m.contains("nests more than"), "{m}");
}

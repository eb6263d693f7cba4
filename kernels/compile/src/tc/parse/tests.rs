//! The tests of `parse.rs`.

use super::*;

#[test]
fn the_seed_matmul_parses() {
    let defs = parse("def matmul(float(M,N) A, float(N,K) B) -> (output) {\n  output(i, j) +=! A(i, kk) * B(kk, j)\n}").unwrap();
    assert_eq!(defs.len(), 1);
    let d = &defs[0];
    assert_eq!(d.name, "matmul");
    assert_eq!(d.params.len(), 2);
    assert_eq!(
        d.params[0].dims,
        vec![DimDecl::Sym("M".into(), Pos { line: 1, col: 18 }), DimDecl::Sym("N".into(), Pos { line: 1, col: 20 })]
    );
    assert_eq!(d.outputs[0].name, "output");
    let s = &d.stmts[0];
    assert_eq!((s.op, s.init), (Op::Add, true));
    assert_eq!(s.rhs.text(), "A(i, kk) * B(kk, j)");
    assert_eq!(s.text, "output(i, j) +=! A(i, kk) * B(kk, j)");
}

#[test]
fn the_caret_lines_up_under_tabs() {
    let text = "def f(float(N) A) -> (O) {\n\tO(i) = A(i) $ 1\n}";
    let e = parse(text).unwrap_err().to_string();
    assert!(e.ends_with("\n  \tO(i) = A(i) $ 1\n  \t            ^"), "{e}");
}

#[test]
fn operators_comments_and_where_clauses_parse() {
    let text = "# pooling\ndef avgpool(float(B, C, H, W) input) -> (output) {\n  output(b, c, h, w) +=! input(b, c, h * 2 + r_kh, w * 2 + r_kw) / 4.0 # mean\n    where r_kh in 0:2, r_kw in 0:2\n  output(b, c, h, w) max= output(b, c, h, w) > 0 && 1 ? 2.5e-1 : -1\n}";
    let d = &parse(text).unwrap()[0];
    assert_eq!(d.stmts.len(), 2);
    assert_eq!(d.stmts[0].wheres.len(), 2);
    assert_eq!(d.stmts[0].rhs.text(), "input(b, c, h * 2 + r_kh, w * 2 + r_kw) / 4.0");
    assert_eq!(d.stmts[1].op, Op::Max);
    assert_eq!(d.stmts[1].rhs.text(), "output(b, c, h, w) > 0 && 1 ? 0.25 : -1");
}

#[test]
fn a_parse_error_names_line_column_and_text() {
    let e = parse("def f(float(N) A) -> (B) {\n  B(i) = A(i) +* 2\n}").unwrap_err().to_string();
    assert!(e.contains("line 2, column 16"), "{e}");
    assert!(e.contains("B(i) = A(i) +* 2"), "{e}");
    assert!(e.contains("expected an expression, found `*`"), "{e}");
    let e = parse("def f(floot(N) A) -> (B) { B(i) = A(i) }").unwrap_err().to_string();
    assert!(e.contains("unknown type `floot`"), "{e}");
    let e = parse("def f(float(N) A) -> (B) {\n B(i) = A(i)\n").unwrap_err().to_string();
    assert!(e.contains("is not closed"), "{e}");
    let e = parse("def f(float(N) A) -> (B) { B(i + 1) = A(i) }").unwrap_err().to_string();
    assert!(e.contains("plain indices"), "{e}");
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let text = format!("def f(float(N) A) -> (B) {{ B(i) = {}A(i){} }}", "(".repeat(10_000), ")".repeat(10_000));
    assert!(parse(&text).unwrap_err().to_string().contains("nests more than"));
    let text = format!("def f(float(N) A) -> (B) {{ B(i) = {}A(i) }}", "-".repeat(10_000));
    assert!(parse(&text).unwrap_err().to_string().contains("nests more than"));
}

/// A chain of operators builds a tree as deep as it is long: bounded,
/// at the operator that goes over, by the tree's depth (where a group
/// stands in a chain matters, not how many operators precede it).
#[test]
fn a_long_chain_of_operators_is_an_error_at_the_operator_over_the_bound() {
    let sum = |n: usize| format!("def f(float(N) A) -> (B) {{ B(i) = {} }}", vec!["A(i)"; n].join(" + "));
    // A(i) is two levels (the read and its index): n terms are n + 1 levels.
    assert!(parse(&sum(MAX_LEVELS - 1)).is_ok());
    let e = parse(&sum(MAX_LEVELS)).unwrap_err().to_string();
    assert!(e.contains(&format!("more than {MAX_LEVELS} levels deep")), "{e}");
    let col = "def f(float(N) A) -> (B) { B(i) = ".len() + (MAX_LEVELS - 1) * "A(i) + ".len() - 1;
    assert!(e.starts_with(&format!("line 1, column {col}:")), "{e}");
    // Five groups of 60 multiplied, or a group after five factors: 60-odd levels.
    let group = format!("({})", vec!["A(i)"; 60].join(" + "));
    assert!(parse(&format!("def f(float(N) A) -> (B) {{ B(i) = {} }}", [group.as_str(); 5].join(" * "))).is_ok());
    assert!(parse(&format!("def f(float(N) A) -> (B) {{ B(i) = A(i) * A(i) * A(i) * A(i) * A(i) * exp{group} }}")).is_ok());
    // A chain in an index or a range's bound too; 100 000 terms: an error, not a stack overflow.
    for text in [
        sum(100_000),
        format!("def f(float(N) A) -> (B) {{ B(i) = A(i{}) }}", " + 1".repeat(100_000)),
        format!("def f(float(N) A) -> (B) {{ B(i) = A(i) where i in 0:N{} }}", " - 1".repeat(100_000)),
    ] {
        assert!(parse(&text).unwrap_err().to_string().contains("levels deep"));
    }
}

#[test]
fn a_right_side_over_the_size_bound_is_an_error() {
    let group = format!("({})", vec!["A(i)"; 32].join(" + "));
    let ok = format!("def f(float(N) A) -> (B) {{ B(i) = {} }}", [group.as_str(); 10].join(" + "));
    assert!(parse(&ok).is_ok());
    let text = format!("def f(float(N) A) -> (B) {{\n  B(i) = {}\n}}", [group.as_str(); 11].join(" + "));
    let e = parse(&text).unwrap_err().to_string();
    assert!(e.starts_with("line 2, column 10: the right side has 1055 operands and operators, more than 1024"), "{e}");
}

#[test]
fn a_malformed_number_is_named_where_it_starts() {
    for (bad, col) in [("0x10", 35), ("1.5.2", 35), ("2e", 35), ("3abc", 35), ("1_000", 35)] {
        let e = parse(&format!("def f(int64(N) A) -> (B) {{ B(i) = {bad} + A(i) }}")).unwrap_err().to_string();
        assert!(e.starts_with(&format!("line 1, column {col}: `{bad}` is not a number")), "{e}");
    }
    assert!(parse("def f(float(N) A) -> (B) { B(i) = 1.5f + 2e-3 + .5 + 3. + A(i) }").is_ok());
}

#[test]
fn an_integer_literal_over_two_to_the_53_is_an_error() {
    assert!(parse("def f(int64(N) A) -> (B) { B(i) = A(i) + 9007199254740992 }").is_ok());
    for big in ["9007199254740993", "18446744073709551616", "99999999999999999999999"] {
        let e = parse(&format!("def f(int64(N) A) -> (B) {{ B(i) = A(i) + {big} }}")).unwrap_err().to_string();
        assert!(e.contains(&format!("the integer `{big}` is too large")), "{e}");
    }
}

#[test]
fn a_literal_out_of_double_range_is_an_error_where_it_is_written() {
    let e = parse("def f(float(N) A) -> (B) {\n  B(i) = A(i) * 1e999\n}").unwrap_err().to_string();
    assert!(e.starts_with("line 2, column 17: the number `1e999` is out of range"), "{e}");
    assert!(parse("def f(float(N) A) -> (B) { B(i) = A(i) * 1e-999 + 1.7976931348623157e308 }").is_ok());
}

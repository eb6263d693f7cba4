//! The tests of `check.rs`.

use super::super::parse::parse;
use super::*;

fn checked(text: &str) -> Checked {
    let d = parse(text).unwrap();
    check(&d[0], text).unwrap()
}
fn dims(c: &Checked, o: usize) -> Vec<String> {
    c.outputs[o].dims.iter().map(|d| d.text(&|n| n.to_owned())).collect()
}

#[test]
fn matmul_ranges_and_output_shape() {
    let c = checked("def matmul(float(M,N) A, float(N,K) B) -> (output) { output(i, j) +=! A(i, kk) * B(kk, j) }");
    assert_eq!(c.stmts[0].lhs, vec!["i", "j"]);
    assert_eq!(c.stmts[0].reduced, vec!["kk"]);
    assert_eq!(dims(&c, 0), vec!["M", "K"]);
    assert_eq!(c.outputs[0].ty, OutType::Float);
}

#[test]
fn convolution_and_pooling_shapes_follow_tc() {
    let c =
        checked("def conv(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) { O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * W1(m, c, kh, kw) }");
    assert_eq!(dims(&c, 0), vec!["N", "M", "H - KH + 1", "W - KW + 1"]);
    let c = checked(
        "def avgpool(float(B, C, H, W) input) -> (output) {\n output(b, c, h, w) +=! input(b, c, h * 2 + r_kh, w * 2 + r_kw) / 4.0 where r_kh in 0:2, r_kw in 0:2\n}",
    );
    assert_eq!(dims(&c, 0), vec!["B", "C", "(H - 2) / 2 + 1", "(W - 2) / 2 + 1"]);
}

#[test]
fn an_index_without_a_range_is_named_with_its_accesses() {
    let text = "def f(float(N) A) -> (O) { O(i) +=! A(i + j + k) }";
    let e = check(&parse(text).unwrap()[0], text).unwrap_err().to_string();
    assert!(e.contains("the range of index `i` cannot be inferred"), "{e}");
    assert!(e.contains("A(i + j + k)"), "{e}");
    let text = "def f(float(N) A) -> (O) { O(i) = 1.0 }";
    let e = check(&parse(text).unwrap()[0], text).unwrap_err().to_string();
    assert!(e.contains("is used in no tensor access"), "{e}");
}

#[test]
fn misuse_is_named() {
    for (text, want) in [
        ("def f(float(N) A) -> (O) { O(i) = A(i, i) }", "`A` has 1 dims but is read with 2"),
        ("def f(float(N) A) -> (O) { O(i) = foo(A(i)) }", "`foo` is neither a tensor"),
        ("def f(float(N) A) -> (O) { O(i) = A(i * i) }", "in `A(i * i)`: `i * i` multiplies two indices"),
        ("def f(float(N) A) -> (O) { O(i) = A(i * N) }", "`i * N` multiplies an index by a size"),
        ("def f(float(N) A) -> (O) { O(i) = A(i / 2) }", "`i / 2` divides an index; only a size is divided (`K / 2`)"),
        ("def f(float(N) A) -> (O) { O(i) = A(N / 0) where i in 0:N }", "`N / 0` divides by `0`, not by a positive integer"),
        ("def f(float(N) A) -> (O) { O(i) = A(i) where i in 0:N*N }", "in the bound `N * N`: it multiplies two sizes"),
        ("def f(float(N) A) -> (O) { O(i) = A(i) where i in 0:M }", "in the bound `M`: `M` is not a size symbol (the parameters': N)"),
        ("def f(float(N) A) -> (O) { A(i) = A(i) }", "is a parameter"),
        ("def f(float(N) A) -> (O) { O(i) = A(j) }", "appears only on the right of `=`"),
        ("def f(float(N) A) -> (O, P) { O(i) = A(i) }", "output `P` is never written"),
        ("def f(float(N) A) -> (O) { O(i) = P(i) }", "neither a tensor"),
        ("def f(float(N) A) -> (O, P) { O(i) = P(i)\n P(i) = A(i) }", "`P` is read before any statement writes it"),
        ("def f(float(N) A) -> (O) { O(i) = A(i * 4000000 * 4000000 * 4000000 * 4000000 - i * 7) }", "beyond 1048576"),
        ("def f(float(N) A) -> (O) { O(i) +=! A(i + j) where j in 0:2000000 }", "beyond 1048576"),
        (
            "def f(float(N) A) -> (O) { O(i) = A(i)\n O(i) = O(i) + O(N - 1 - i) }",
            "reads `O(N - 1 - i)`, another element of `O` than it writes: a statement reads its own output only at the element it writes (O(i))",
        ),
        ("def f(float(N) A) -> (O) { O(i) = A(i)\n O(i) = O(i - 1) where i in 1:N }", "reads `O(i - 1)`, another element"),
        ("def f(float(N, N) A) -> (O) { O(i, j) = A(i, j)\n O(i, j) += O(i, k) * A(k, j) }", "reads `O(i, k)`, another element"),
        ("def f(float(N, N) A) -> (O) { O(i) = A(i, 0)\n O(i) +=! O(i) * A(i, k) }", "reads `O(i)` while it reduces over `k`"),
        ("def f(float(N) A) -> (O) { O = A(0)\n O max= O * A(i) }", "reads `O` while it reduces over `i`"),
    ] {
        let e = check(&parse(text).unwrap()[0], text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}: {e}");
    }
}

#[test]
fn a_where_range_past_a_tensor_is_an_error_at_define_time() {
    for (text, want) in [
        (
            "def f(float(N) A) -> (O) {\n O(i) = A(i) where i in 0:2\n O(i) += A(i) where i in 0:4\n}",
            "line 3, column 2: def f: in `O(i) += A(i) where i in 0:4`: `O(i)` reaches index 3 along dim 0, which has size 2",
        ),
        ("def f(float(N, 3) A) -> (O) { O(i) +=! A(i, k) where k in 0:5 }", "`A(i, k)` reaches index 4 along dim 1, which has size 3"),
        ("def f(float(N) A) -> (O) { O(i) = A(i) where i in 0:N + 1 }", "`A(i)` reaches index N along dim 0, which has size N"),
        ("def f(float(N) A) -> (O) { O(i) = A(i - 1) where i in 0:2 }", "`A(i - 1)` reaches index -1"),
    ] {
        let e = check(&parse(text).unwrap()[0], text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}: {e}");
    }
    // Empty or unknown ranges are left to the call.
    checked("def f(float(N, M) A) -> (O) { O(i) +=! A(i, k) where k in 0:M }");
    checked("def f(float(N) A) -> (O) { O(i) +=! A(i + k) where k in 0:N }");
    checked("def f(float(N) A) -> (O) { O(i) = A(i) where i in 0:N }");
}

#[test]
fn a_statement_may_read_its_own_element() {
    let c = checked("def f(float(N) A) -> (O) { O(i) = A(i)\n O(i) = O(i) * O(i) + 1 }");
    assert_eq!(c.stmts.len(), 2);
}

/// An output's index is never below 0: `A(-i)` leaves only `i = 0`.
#[test]
fn an_output_index_range_starts_at_zero_or_above() {
    let c = checked("def f(float(N) A) -> (O) { O(i) = A(-i) }");
    assert_eq!(dims(&c, 0), vec!["1"]);
    let (lo, hi) = &c.stmts[0].ranges["i"];
    assert_eq!((lo.eval(&|_| Some(5)), hi.eval(&|_| Some(5))), (Some(0), Some(1)));
    let c = checked("def f(float(N) A) -> (O) { O(i) = A(N - 1 - i) }");
    assert_eq!(dims(&c, 0), vec!["N"]);
}

#[test]
fn too_many_tensors_or_sizes_are_named_where_the_def_starts() {
    let outs: Vec<String> = (0..17).map(|k| format!("O{k}")).collect();
    let body: Vec<String> = outs.iter().map(|o| format!("{o}(i) = A(i)")).collect();
    let text = format!("def many(float(N) A) -> ({}) {{\n{}\n}}", outs.join(", "), body.join("\n"));
    let e = check(&parse(&text).unwrap()[0], &text).unwrap_err().to_string();
    assert!(e.starts_with("line 1, column 5: def many: 18 parameters and outputs; a kernel takes at most 16 together"), "{e}");
    let dims: Vec<String> = (0..17).map(|k| format!("D{k}")).collect();
    let text = format!("def wide(float({}) A) -> (O) {{ O(i) = A({}) }}", dims.join(", "), vec!["i"; 17].join(", "));
    let e = check(&parse(&text).unwrap()[0], &text).unwrap_err().to_string();
    assert!(e.contains("def wide: 17 size symbols; a kernel takes at most 16"), "{e}");
}

#[test]
fn softmax_with_intermediate_outputs() {
    let c = checked(
        "def softmax(float(N, D) I) -> (O, maxVal, expDistance, expSum) {\n  maxVal(n) max=! I(n, d)\n  expDistance(n, d) = exp(I(n, d) - maxVal(n))\n  expSum(n) +=! expDistance(n, d)\n  O(n, d) = expDistance(n, d) / expSum(n)\n}",
    );
    assert_eq!(dims(&c, 0), vec!["N", "D"]);
    assert_eq!(dims(&c, 1), vec!["N"]);
    assert_eq!(c.stmts.len(), 4);
}

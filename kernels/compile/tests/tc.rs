//! Tensor Comprehensions' language end to end in Rust: definitions become
//! registry kernels whose outputs are shaped by range inference, computed on
//! the CPU by generated C++ (or a GEMM), checked against direct loops.

use dlbridge_array::Array;
use dlbridge_compile::tc;
use dlbridge_core::DType;
use dlbridge_registry::{Arg, Registry};

mod common;
use common::{close, define_one, run, seq};

const MATMUL: &str = "def matmul(float(M,N) A, float(N,K) B) -> (output) {\n  output(i, j) +=! A(i, kk) * B(kk, j)\n}";

#[test]
fn the_seed_matmul_matches_direct_loops_in_f32_and_f64() {
    let reg = Registry::new();
    let (k, kernel) = define_one(&reg, MATMUL);
    assert_eq!(k.signature(), "matmul<T: f32|f64|f16|bf16>(A: T[M, N], B: T[N, K]) -> (output: T[M, K])");
    let (m, n, kk) = (5, 7, 3);
    let (a, b) = (seq(m * n, 0.1), seq(n * kk, 0.2));
    let mut want = vec![0.0; m * kk];
    for i in 0..m {
        for j in 0..kk {
            want[i * kk + j] = (0..n).map(|l| a[i * n + l] * b[l * kk + j]).sum();
        }
    }
    let (xa, xb) = (Array::from_slice(&a, &[m as i64, n as i64]).unwrap(), Array::from_slice(&b, &[n as i64, kk as i64]).unwrap());
    let out = run(&kernel, &[&xa, &xb]).unwrap();
    assert_eq!(out[0].shape(), &[m as i64, kk as i64]);
    close(&out[0].to_vec::<f64>().unwrap(), &want, 1e-12);
    let a32: Vec<f32> = a.iter().map(|v| *v as f32).collect();
    let b32: Vec<f32> = b.iter().map(|v| *v as f32).collect();
    let (xa, xb) = (Array::from_slice(&a32, &[m as i64, n as i64]).unwrap(), Array::from_slice(&b32, &[n as i64, kk as i64]).unwrap());
    let out = run(&kernel, &[&xa, &xb]).unwrap();
    let got: Vec<f64> = out[0].to_vec::<f32>().unwrap().iter().map(|v| *v as f64).collect();
    close(&got, &want, 1e-5);
    // A size bound twice is named with both arguments.
    let bad = Array::from_slice(&b32, &[kk as i64, n as i64]).unwrap();
    let e = run(&kernel, &[&xa, &bad]).unwrap_err().to_string();
    assert!(e.contains("dim N = 7 (bound by A) but got 3"), "{e}");
}

#[test]
fn a_valid_convolution_returns_h_minus_kh_plus_one() {
    let reg = Registry::new();
    let (k, kernel) = define_one(
        &reg,
        "def convolution(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) {\n  O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * W1(m, c, kh, kw)\n}",
    );
    assert!(k.signature().ends_with("-> (O: T[N, M, (H - KH + 1), (W - KW + 1)])"), "{}", k.signature());
    let (n, c, h, w, m, kh, kw) = (2usize, 3usize, 6usize, 5usize, 4usize, 3usize, 2usize);
    let (i, wt) = (seq(n * c * h * w, 0.05), seq(m * c * kh * kw, 0.1));
    let (oh, ow) = (h - kh + 1, w - kw + 1);
    let mut want = vec![0.0; n * m * oh * ow];
    for a in 0..n {
        for b in 0..m {
            for y in 0..oh {
                for x in 0..ow {
                    let mut s = 0.0;
                    for cc in 0..c {
                        for p in 0..kh {
                            for q in 0..kw {
                                s += i[((a * c + cc) * h + y + p) * w + x + q] * wt[((b * c + cc) * kh + p) * kw + q];
                            }
                        }
                    }
                    want[((a * m + b) * oh + y) * ow + x] = s;
                }
            }
        }
    }
    let xi = Array::from_slice(&i, &[n as i64, c as i64, h as i64, w as i64]).unwrap();
    let xw = Array::from_slice(&wt, &[m as i64, c as i64, kh as i64, kw as i64]).unwrap();
    let out = run(&kernel, &[&xi, &xw]).unwrap();
    assert_eq!(out[0].shape(), &[n as i64, m as i64, oh as i64, ow as i64]);
    close(&out[0].to_vec::<f64>().unwrap(), &want, 1e-12);
    // A kernel larger than the image: an error naming the output's dim and the sizes.
    let big = Array::zeros(DType::F64, &[m as i64, c as i64, 9, 1]).unwrap();
    let e = run(&kernel, &[&xi, &big]).unwrap_err().to_string();
    assert!(e.contains("convolution: output O: dim (H - KH + 1) is -2, below 0 with H = 6, KH = 9"), "{e}");
}

#[test]
fn average_pooling_with_where_clauses_halves_the_image() {
    let reg = Registry::new();
    let (k, kernel) = define_one(
        &reg,
        "def avgpool(float(B, C, H, W) input) -> (output) {\n  output(b, c, h, w) +=! input(b, c, h * 2 + r_kh, w * 2 + r_kw) / 4.0\n    where r_kh in 0:2, r_kw in 0:2\n}",
    );
    assert!(k.signature().contains("output: T[B, C, ((H - 2) / 2 + 1), ((W - 2) / 2 + 1)]"), "{}", k.signature());
    let x: Vec<f32> = (0..2 * 8 * 6).map(|v| v as f32).collect();
    let xi = Array::from_slice(&x, &[1, 2, 8, 6]).unwrap();
    let out = run(&kernel, &[&xi]).unwrap();
    assert_eq!(out[0].shape(), &[1, 2, 4, 3]);
    let got = out[0].to_vec::<f32>().unwrap();
    // The first window: (0 + 1 + 6 + 7) / 4.
    assert_eq!(got[0], 3.5);
    assert_eq!(got[1], 5.5);
    // Odd sizes round down as TC's do: 7 x 5 -> 3 x 2.
    let xi = Array::from_slice(&x[..35], &[1, 1, 7, 5]).unwrap();
    assert_eq!(run(&kernel, &[&xi]).unwrap()[0].shape(), &[1, 1, 3, 2]);
    // Too small for one window: no windows.
    let xi = Array::from_slice(&x[..1], &[1, 1, 1, 1]).unwrap();
    assert_eq!(run(&kernel, &[&xi]).unwrap()[0].shape(), &[1, 1, 0, 0]);
}

#[test]
fn softmax_returns_its_four_outputs() {
    let reg = Registry::new();
    let (k, kernel) = define_one(
        &reg,
        "def softmax(float(N, D) I) -> (O, maxVal, expDistance, expSum) {\n  maxVal(n) max=! I(n, d)\n  expDistance(n, d) = exp(I(n, d) - maxVal(n))\n  expSum(n) +=! expDistance(n, d)\n  O(n, d) = expDistance(n, d) / expSum(n)\n}",
    );
    assert!(k.signature().ends_with("-> (O: T[N, D], maxVal: T[N], expDistance: T[N, D], expSum: T[N])"), "{}", k.signature());
    let x = seq(3 * 9, 0.3);
    let xi = Array::from_slice(&x, &[3, 9]).unwrap();
    let out = run(&kernel, &[&xi]).unwrap();
    assert_eq!(out.len(), 4);
    let o = out[0].to_vec::<f64>().unwrap();
    for r in 0..3 {
        let row = &x[r * 9..r * 9 + 9];
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - mx).exp()).sum();
        let want: Vec<f64> = row.iter().map(|v| (v - mx).exp() / s).collect();
        close(&o[r * 9..r * 9 + 9], &want, 1e-12);
        assert_eq!(out[1].to_vec::<f64>().unwrap()[r], mx);
    }
}

#[test]
fn statements_without_bang_accumulate_onto_earlier_ones() {
    let reg = Registry::new();
    let (_, kernel) = define_one(
        &reg,
        "def fcrelu(float(B, M) I, float(N, M) W1, float(N) B1) -> (O1) {\n  O1(b, n) +=! I(b, m) * W1(n, m)\n  O1(b, n) += B1(n)\n  O1(b, n) = fmax(O1(b, n), 0) # relu\n}",
    );
    let (i, w, b) = (seq(4 * 6, 0.1), seq(5 * 6, 0.1), seq(5, 1.0));
    let xi = Array::from_slice(&i, &[4, 6]).unwrap();
    let xw = Array::from_slice(&w, &[5, 6]).unwrap();
    let xb = Array::from_slice(&b, &[5]).unwrap();
    let out = run(&kernel, &[&xi, &xw, &xb]).unwrap();
    let mut want = vec![0.0; 20];
    for r in 0..4 {
        for n in 0..5 {
            want[r * 5 + n] = (b[n] + (0..6).map(|m| i[r * 6 + m] * w[n * 6 + m]).sum::<f64>()).max(0.0);
        }
    }
    close(&out[0].to_vec::<f64>().unwrap(), &want, 1e-12);
}

#[test]
fn integer_definitions_keep_their_types() {
    let reg = Registry::new();
    let (k, kernel) = define_one(&reg, "def rowmax(int32(R, C) X) -> (Y) { Y(r) max=! X(r, c) * 2 }");
    assert_eq!(k.signature(), "rowmax(X: i32[R, C]) -> (Y: i32[R])");
    let x = Array::from_slice(&[1i32, -5, 3, -7, -2, -9], &[2, 3]).unwrap();
    let out = run(&kernel, &[&x]).unwrap();
    assert_eq!(out[0].dtype(), DType::I32);
    assert_eq!(out[0].to_vec::<i32>().unwrap(), vec![6, -4]);
}

#[test]
fn a_where_range_past_a_tensor_is_an_error_not_a_read() {
    let reg = Registry::new();
    let (_, kernel) = define_one(&reg, "def shift(float(N) A) -> (O) { O(i) +=! A(i + k) where k in 0:3, i in 0:N }");
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    let e = run(&kernel, &[&x]).unwrap_err().to_string();
    assert!(e.contains("A(i + k) reaches index 5 along dim 0, which has size 4"), "{e}");
}

#[test]
fn strided_views_are_read_through_their_strides() {
    let reg = Registry::new();
    let (_, kernel) = define_one(&reg, "def colsum(float(R, C) X) -> (S) { S(c) +=! X(r, c) }");
    let x = Array::from_slice(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let t = x.t().unwrap();
    assert_eq!(t.data_ptr(), x.data_ptr(), "a view, not a copy");
    let mut args = [Arg::Tensor(t.view())];
    let specs = kernel.prepare_outputs(&args).unwrap();
    assert_eq!(&specs[0].shape[..], &[2]);
    let mut s = Array::zeros(DType::F64, &[2]).unwrap();
    kernel.call(&mut args, &mut [s.view_mut().unwrap()]).unwrap();
    assert_eq!(s.to_vec::<f64>().unwrap(), vec![6.0, 15.0]);
}

#[test]
fn a_definition_named_like_a_builtin_gets_a_free_name() {
    let reg = Registry::global();
    let defs = tc::define_in(reg, MATMUL).unwrap();
    assert_ne!(defs[0].registered.name(), "matmul", "the built-in keeps its name");
    assert!(defs[0].registered.name().starts_with("matmul_"), "{}", defs[0].registered.name());
    assert!(reg.get("matmul").unwrap().origins().any(|(_, o)| !o.contains("compiled from source")));
}

#[test]
fn elementwise_statements_fuse_only_where_each_reads_its_own_element() {
    let reg = Registry::new();
    let (_, kernel) = define_one(
        &reg,
        "def fused(float(N) X) -> (A2, B2, C2) {\n  A2(i) = X(i) * 2\n  B2(i) = A2(i) + A2(N - 1 - i)\n  C2(i) = B2(i) * B2(i)\n  C2(i) = C2(i) + A2(i)\n}",
    );
    let x: Vec<f64> = (1..=9).map(f64::from).collect();
    let out = run(&kernel, &[&Array::from_slice(&x, &[9]).unwrap()]).unwrap();
    let a: Vec<f64> = x.iter().map(|v| v * 2.0).collect();
    let b: Vec<f64> = (0..9).map(|i| a[i] + a[8 - i]).collect();
    let c: Vec<f64> = (0..9).map(|i| b[i] * b[i] + a[i]).collect();
    assert_eq!(out[1].to_vec::<f64>().unwrap(), b, "B2 reads A2's mirror element: not fused with A2");
    assert_eq!(out[2].to_vec::<f64>().unwrap(), c);
}

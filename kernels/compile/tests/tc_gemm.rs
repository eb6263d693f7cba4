//! A contraction runs as GEMMs, without compiling anything, and falls back
//! to the generated loops for layouts that do not merge. The library
//! cache's counters are per process: this file's one test has them alone.

use dlbridge_array::Array;
use dlbridge_registry::Registry;

mod common;
use common::{close, define_one, run, seq};

#[test]
fn a_contraction_runs_as_gemm_without_compiling_and_falls_back_on_other_layouts() {
    use dlbridge_compile::LibraryCache;
    use std::sync::atomic::Ordering;
    let reg = Registry::new();
    let (_, kernel) = define_one(&reg, "def fc_gemm(float(B,M) I, float(N,M) W1) -> (O1) {\n  O1(b, n) +=! I(b, m) * W1(n, m)\n}");
    let stats = &LibraryCache::global().stats;
    let loads = || stats.compiled.load(Ordering::Relaxed) + stats.disk_hits.load(Ordering::Relaxed);
    let (i, w) = (seq(4 * 6, 0.1), seq(5 * 6, 0.1));
    let mut want = vec![0.0; 20];
    for r in 0..4 {
        for n in 0..5 {
            want[r * 5 + n] = (0..6).map(|m| i[r * 6 + m] * w[n * 6 + m]).sum::<f64>();
        }
    }
    let xi = Array::from_slice(&i, &[4, 6]).unwrap();
    let xw = Array::from_slice(&w, &[5, 6]).unwrap();
    let before = loads();
    let out = run(&kernel, &[&xi, &xw]).unwrap();
    close(&out[0].to_vec::<f64>().unwrap(), &want, 1e-12);
    assert_eq!(loads(), before, "W1(n, m) is read transposed through its strides: one GEMM, no library");
    // An input whose M dims do not merge (a permuted 3-d view read as b, m1, m2) runs the loops.
    let (_, k3) = define_one(&reg, "def merge3(float(B,P,Q) X, float(P,Q,N) Y) -> (O) {\n  O(b, n) +=! X(b, p, q) * Y(p, q, n)\n}");
    let x: Vec<f64> = seq(2 * 3 * 4, 0.1);
    let y: Vec<f64> = seq(3 * 4 * 5, 0.1);
    let xs = Array::from_slice(&x, &[2, 4, 3]).unwrap(); // then viewed as [2, 3, 4], transposed
    let xt = xs.permute(&[0, 2, 1]).unwrap();
    let ya = Array::from_slice(&y, &[3, 4, 5]).unwrap();
    let mut want = vec![0.0; 10];
    for b in 0..2 {
        for n in 0..5 {
            want[b * 5 + n] =
                (0..3).flat_map(|p| (0..4).map(move |q| (p, q))).map(|(p, q)| x[(b * 4 + q) * 3 + p] * y[(p * 4 + q) * 5 + n]).sum();
        }
    }
    let before = loads();
    let out = run(&k3, &[&xt, &ya]).unwrap();
    close(&out[0].to_vec::<f64>().unwrap(), &want, 1e-12);
    assert_eq!(loads(), before + 1, "the generated loops were built for this layout");
    // A contiguous X merges p and q into one K: a GEMM again.
    let xc = Array::from_slice(&x, &[2, 3, 4]).unwrap();
    let before = loads();
    run(&k3, &[&xc, &ya]).unwrap();
    assert_eq!(loads(), before);
}

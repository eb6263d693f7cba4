//! A small MLP forward pass in tch where some layers run registry kernels on tch
//! tensors mid-graph (matmul, add, gelu, softmax), checked against tch's own result.
//!
//! `LIBTORCH_USE_PYTORCH=1 cargo run --release -p dlbridge-tch --example mlp [-- THREADS [RUNS]]`
//!
//! THREADS, if given, is passed to `tch::set_num_threads` (torch's intra-op
//! pool); registry kernels called through dlbridge-tch follow torch's count.
//! The two forward passes are timed alternately, RUNS times each (41 unless
//! given; a smoke run passes a few), after a warm-up, and the medians printed.
#![forbid(unsafe_code)]

use std::time::Instant;

use tch::{Device, Kind, Tensor};

fn time_ms(f: &mut impl FnMut()) -> f64 {
    let s = Instant::now();
    f();
    s.elapsed().as_secs_f64() * 1e3
}

/// Medians of `a` and `b` over `runs` alternate runs (after `runs / 4` of each to warm up).
fn medians_ms(mut a: impl FnMut(), mut b: impl FnMut(), runs: usize) -> (f64, f64) {
    for _ in 0..runs / 4 {
        a();
        b();
    }
    let (mut ta, mut tb): (Vec<f64>, Vec<f64>) = (0..runs).map(|_| (time_ms(&mut a), time_ms(&mut b))).unzip();
    ta.sort_by(f64::total_cmp);
    tb.sort_by(f64::total_cmp);
    (ta[runs / 2], tb[runs / 2])
}

fn main() -> dlbridge_core::Result<()> {
    dlbridge_cpu::link();
    if let Some(n) = std::env::args().nth(1) {
        tch::set_num_threads(n.parse().expect("THREADS: a positive integer"));
    }
    let runs: usize = std::env::args().nth(2).map_or(41, |r| r.parse().expect("RUNS: a positive integer"));
    assert!(runs > 0, "RUNS: a positive integer");
    let kernel = dlbridge_tch::kernel;
    let (matmul, add, gelu, softmax) = (kernel("matmul")?, kernel("add")?, kernel("gelu")?, kernel("softmax")?);
    tch::manual_seed(0);
    let opts = (Kind::Float, Device::Cpu);
    let (batch, d_in, hidden, d_out) = (256, 512, 1024, 10);
    let x = Tensor::randn([batch, d_in], opts);
    let w1 = Tensor::randn([d_in, hidden], opts) * (1.0 / (d_in as f64).sqrt());
    let b1 = Tensor::randn([hidden], opts) * 0.1;
    let w2 = Tensor::randn([hidden, d_out], opts) * (1.0 / (hidden as f64).sqrt());
    let b2 = Tensor::randn([d_out], opts) * 0.1;

    let reference = || (x.matmul(&w1) + &b1).gelu("none").matmul(&w2).g_add(&b2).softmax(-1, Kind::Float);
    let mixed = || -> dlbridge_core::Result<Tensor> {
        // layer 1: dlbridge matmul + dlbridge add (bias broadcast as a zero-stride tch view) + dlbridge gelu
        let h = matmul.call1((&x, &w1))?;
        let h = add.call1((&h, &b1.expand([batch, hidden], false)))?;
        let h = gelu.call1(&h)?;
        // layer 2: tch itself, mid-graph
        let logits = h.matmul(&w2) + &b2;
        // head: dlbridge softmax on the tch tensor
        Ok(softmax.call1(&logits)?)
    };

    let want = reference();
    let got = mixed()?;
    let err = (&got - &want).abs().max().double_value(&[]);
    let (t_tch, t_mixed) = medians_ms(|| drop(reference()), || drop(mixed().expect("forward")), runs);
    println!("MLP {batch}x{d_in} -> {hidden} (gelu) -> {d_out} (softmax), f32 on CPU");
    println!(
        "  threads            : torch {}, registry kernels (through dlbridge-tch) {}",
        tch::get_num_threads(),
        dlbridge_tch::with_torch_threads(dlbridge_registry::threads::num_threads)
    );
    println!("  tch only           : {t_tch:8.3} ms");
    println!("  tch + dlbridge     : {t_mixed:8.3} ms  ({:.2}x)", t_mixed / t_tch);
    println!("  max |error|        : {err:.3e}");
    println!(
        "  rows sum to 1      : {:.6}",
        got.sum_dim_intlist([1i64].as_slice(), false, Kind::Float).mean(Kind::Float).double_value(&[])
    );
    assert!(err < 1e-5, "mixed forward pass differs from tch by {err}");
    Ok(())
}

//! The calls of `benches/call.rs`, one variant N times in a loop, for
//! profilers that count instructions (`valgrind --tool=callgrind`) or sample
//! (`perf record`), and a quick ns/call figure:
//! `cargo run --release -p dlbridge-tch --example tch_call_probe -- MODE [N]`.
//!
//! MODE: `arrays` (`Kernel::call` on 3 one-element f32 Arrays), `tch`
//! (`dlbridge_tch::call_into` on 3 one-element tch tensors), `tch_alloc`
//! (`dlbridge_tch::call`, the output allocated by tch), `tch_kernel` (the same
//! through `dlbridge_tch::kernel("add")?.call1((&x, &y))`).
#![forbid(unsafe_code)]

use std::hint::black_box;

use dlbridge_array::Array;
use dlbridge_core::DType;
use dlbridge_registry::{Arg, Registry};
use tch::{Device, Kind, Tensor};

fn main() -> dlbridge_core::Result<()> {
    dlbridge_cpu::link();
    let mut argv = std::env::args().skip(1);
    let mode = argv.next().unwrap_or_else(|| "tch".into());
    let n: u64 = argv.next().map_or(1_000_000, |s| s.parse().expect("N: a count"));
    let add = Registry::global().get("add")?;
    let a = Array::from_slice(&[1.0f32], &[1])?;
    let b = Array::from_slice(&[2.0f32], &[1])?;
    let mut out = Array::zeros(DType::F32, &[1])?;
    let ta = Tensor::ones([1], (Kind::Float, Device::Cpu));
    let tb = Tensor::ones([1], (Kind::Float, Device::Cpu));
    let tout = Tensor::zeros([1], (Kind::Float, Device::Cpu));
    let tadd = dlbridge_tch::kernel("add")?;
    let start = std::time::Instant::now();
    for _ in 0..n {
        match mode.as_str() {
            "arrays" => add.call(&mut [Arg::Tensor(black_box(&a).view()), Arg::Tensor(black_box(&b).view())], &mut [out.view_mut()?])?,
            "tch" => dlbridge_tch::call_into(&add, &[black_box(&ta), black_box(&tb)], &[], &[&tout])?,
            "tch_alloc" => drop(dlbridge_tch::call(&add, &[black_box(&ta), black_box(&tb)], &[])?),
            "tch_kernel" => drop(tadd.call1((black_box(&ta), black_box(&tb)))?),
            other => panic!("unknown mode {other}: arrays, tch, tch_alloc or tch_kernel"),
        }
    }
    println!("{mode}: {:.1} ns/call", start.elapsed().as_secs_f64() * 1e9 / n.max(1) as f64);
    Ok(())
}

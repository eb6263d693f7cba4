//! The extra cost of `dlbridge_tch::call_into` on tch tensors over the same
//! kernel on Arrays (3 one-element f32 tensors, `add`; target: at most 150 ns).
//!
//! `LIBTORCH_USE_PYTORCH=1 cargo bench -p dlbridge-tch --bench call` (medians:
//! `target/criterion/add_3_one_element_tensors/*/new/estimates.json`;
//! `examples/tch_call_probe.rs` runs the same calls under a profiler).
#![forbid(unsafe_code)]

use criterion::{Criterion, criterion_group, criterion_main};
use dlbridge_array::Array;
use dlbridge_core::DType;
use dlbridge_registry::{Arg, Registry};
use tch::{Device, Kind, Tensor};

fn bench(c: &mut Criterion) {
    dlbridge_cpu::link();
    let add = Registry::global().get("add").unwrap();
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    let b = Array::from_slice(&[2.0f32], &[1]).unwrap();
    let mut out = Array::zeros(DType::F32, &[1]).unwrap();
    let ta = Tensor::ones([1], (Kind::Float, Device::Cpu));
    let tb = Tensor::ones([1], (Kind::Float, Device::Cpu));
    let tout = Tensor::zeros([1], (Kind::Float, Device::Cpu));
    let mut g = c.benchmark_group("add_3_one_element_tensors");
    g.bench_function("arrays_kernel_call", |bench| {
        bench.iter(|| add.call(&mut [Arg::Tensor(a.view()), Arg::Tensor(b.view())], &mut [out.view_mut().unwrap()]).unwrap())
    });
    g.bench_function("tch_call_into", |bench| bench.iter(|| dlbridge_tch::call_into(&add, &[&ta, &tb], &[], &[&tout]).unwrap()));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

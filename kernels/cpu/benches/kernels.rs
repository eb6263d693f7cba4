//! Registry call overhead and kernel throughput.
//!
//! `cargo bench -p dlbridge-kernels-cpu --bench kernels`
#![forbid(unsafe_code)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dlbridge_array::Array;
use dlbridge_core::DType;
use dlbridge_kernels_cpu::elementwise::map2;
use dlbridge_kernels_cpu::num::Scalar;
use dlbridge_registry::{Arg, Registry};

fn overhead(c: &mut Criterion) {
    dlbridge_kernels_cpu::link();
    let add = Registry::global().get("add").unwrap();
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    let b = Array::from_slice(&[2.0f32], &[1]).unwrap();
    let mut out = Array::zeros(DType::F32, &[1]).unwrap();
    let mut g = c.benchmark_group("call_overhead_3_tiny_arrays");
    g.bench_function("direct_kernel_fn", |bench| {
        bench.iter(|| {
            let mut o = out.view_mut().unwrap();
            map2::<f32>(&black_box(&a).view(), &black_box(&b).view(), &mut o, f32::add).unwrap();
        })
    });
    g.bench_function("registry_call", |bench| {
        bench.iter(|| {
            add.call(&mut [Arg::Tensor(black_box(&a).view()), Arg::Tensor(black_box(&b).view())], &mut [out.view_mut().unwrap()]).unwrap();
        })
    });
    g.finish();
}

fn throughput(c: &mut Criterion) {
    dlbridge_kernels_cpu::link();
    let reg = Registry::global();
    let mut g = c.benchmark_group("throughput");
    g.sample_size(20);

    let n = 16 << 20;
    let x = Array::arange(n, DType::F32).unwrap();
    let y = Array::arange(n, DType::F32).unwrap();
    let mut z = Array::zeros(DType::F32, &[n]).unwrap();
    let add = reg.get("add").unwrap();
    g.throughput(Throughput::Bytes(3 * 4 * n as u64));
    g.bench_function("add_16M_f32", |bench| {
        bench.iter(|| add.call(&mut [Arg::Tensor(x.view()), Arg::Tensor(y.view())], &mut [z.view_mut().unwrap()]).unwrap())
    });
    drop((x, y, z));

    let m = 1024;
    let a = Array::from_vec((0..m * m).map(|i| (i % 17) as f32 * 0.1).collect(), &[m, m]).unwrap();
    let b = Array::from_vec((0..m * m).map(|i| (i % 13) as f32 * 0.1).collect(), &[m, m]).unwrap();
    let mut c_out = Array::zeros(DType::F32, &[m, m]).unwrap();
    let mm = reg.get("matmul").unwrap();
    g.throughput(Throughput::Elements(2 * (m * m * m) as u64));
    g.bench_function("matmul_1024_f32", |bench| {
        bench.iter(|| mm.call(&mut [Arg::Tensor(a.view()), Arg::Tensor(b.view())], &mut [c_out.view_mut().unwrap()]).unwrap())
    });

    let s = Array::from_vec((0..4096 * 1024).map(|i| (i % 101) as f32 * 0.05).collect(), &[4096, 1024]).unwrap();
    let mut s_out = Array::zeros(DType::F32, &[4096, 1024]).unwrap();
    let sm = reg.get("softmax").unwrap();
    g.throughput(Throughput::Elements(4096 * 1024));
    g.bench_function("softmax_4096x1024_f32", |bench| {
        bench.iter(|| sm.call(&mut [Arg::Tensor(s.view())], &mut [s_out.view_mut().unwrap()]).unwrap())
    });
    g.finish();
}

criterion_group!(benches, overhead, throughput);
criterion_main!(benches);

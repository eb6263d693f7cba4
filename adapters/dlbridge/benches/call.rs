//! The registry's call overhead on 3 one-element f32 Arrays (`add`): the
//! kernel's Rust function called directly (inlined into the loop, and called
//! through a function pointer as the registry calls it), the same kernel through
//! [`Kernel::call`] (every check: signature, read-only, overlap, dispatch),
//! with and without the [`Registry::global`] lookup, and through the binding
//! layer every adapter uses ([`dlbridge::call_into`]: `Kernel::bind` with `Args::with_out`,
//! then `Binding::run`). Every variant builds its views inside the loop.
//!
//! `cargo bench -p dlbridge --bench call` (medians:
//! `target/criterion/call_3_one_element_f32_arrays/*/new/estimates.json`).
#![forbid(unsafe_code)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use dlbridge::{Arg, Array, ArrayArg, DType, Registry, TensorView, TensorViewMut};
use dlbridge_cpu::elementwise::{Add, map2_op};

fn bench(c: &mut Criterion) {
    let add = dlbridge::get_kernel("add").unwrap();
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    let b = Array::from_slice(&[2.0f32], &[1]).unwrap();
    let mut out = Array::zeros(DType::F32, &[1]).unwrap();
    let mut g = c.benchmark_group("call_3_one_element_f32_arrays");
    g.bench_function("direct_kernel_fn", |bench| {
        bench.iter(|| map2_op::<f32>(&black_box(&a).view(), &black_box(&b).view(), &mut out.view_mut().unwrap(), Add).unwrap())
    });
    // The same function, called (not inlined into this loop), as the registry calls it.
    let kernel_fn: fn(&TensorView<'_>, &TensorView<'_>, &mut TensorViewMut<'_>, Add) -> dlbridge::Result<()> = map2_op::<f32>;
    g.bench_function("direct_kernel_fn_called", |bench| {
        bench.iter(|| black_box(kernel_fn)(&black_box(&a).view(), &black_box(&b).view(), &mut out.view_mut().unwrap(), Add).unwrap())
    });
    g.bench_function("registry_call", |bench| {
        bench.iter(|| {
            add.call(&mut [Arg::Tensor(black_box(&a).view()), Arg::Tensor(black_box(&b).view())], &mut [out.view_mut().unwrap()]).unwrap()
        })
    });
    g.bench_function("registry_lookup_and_call", |bench| {
        bench.iter(|| {
            let add = Registry::global().get(black_box("add")).unwrap();
            add.call(&mut [Arg::Tensor(black_box(&a).view()), Arg::Tensor(black_box(&b).view())], &mut [out.view_mut().unwrap()]).unwrap()
        })
    });
    g.bench_function("binding_call_into", |bench| {
        bench.iter(|| dlbridge::call_into(&add, &mut [ArrayArg::In(black_box(&a)), ArrayArg::In(black_box(&b))], &mut [&mut out]).unwrap())
    });
    g.finish();
    let check = out.to_vec::<f32>().unwrap();
    assert_eq!(check, [3.0], "add wrote {check:?}");
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! The calls of `benches/call.rs`, one variant N times in a loop, for
//! profilers that count instructions or sample (criterion's harness would
//! drown them), and a quick ns/call figure:
//!
//! ```sh
//! cargo run --release -p dlbridge --example call_probe -- MODE [N]
//! valgrind --tool=callgrind target/release/examples/call_probe MODE 20000
//! perf record -F 5000 target/release/examples/call_probe MODE 10000000
//! ```
//!
//! MODE: `direct` (the kernel's Rust function), `registry` (`Kernel::call`),
//! `binding` (`dlbridge::call_into`: the binding layer), `noop` (`Kernel::call`
//! of a kernel that does nothing: the registry's own cost), `views` (only the
//! three views every variant builds). On 3 one-element f32 Arrays (`add`).
#![forbid(unsafe_code)]

use std::hint::black_box;

use dlbridge::registry_crate::Impl;
use dlbridge::{Arg, Array, ArrayArg, DType, DeviceType, KernelDef, KernelOpts, Registry};
use dlbridge_cpu::elementwise::{Add, map2_op};

fn main() -> dlbridge::Result<()> {
    let mut argv = std::env::args().skip(1);
    let mode = argv.next().unwrap_or_else(|| "registry".into());
    let n: u64 = argv.next().map_or(1_000_000, |s| s.parse().expect("N: a count"));
    let add = dlbridge::get_kernel("add")?;
    let reg = Registry::new();
    let noop = reg.register(KernelDef {
        signature: "noop<T: f32|f64>(a: T[...S], b: T[...S]) -> (out: T[...S])".into(),
        device: DeviceType::CPU,
        imp: Impl::Generic(|call| {
            let (ins, mut outs) = call.io();
            black_box((ins.tensor("a")?, ins.tensor("b")?, outs.take("out")?));
            Ok(())
        }),
        opts: KernelOpts::ELEMENTWISE,
        origin: "call_probe".into(),
        doc: String::new(),
        identity: String::new(),
    })?;
    let a = Array::from_slice(&[1.0f32], &[1])?;
    let b = Array::from_slice(&[2.0f32], &[1])?;
    let mut out = Array::zeros(DType::F32, &[1])?;
    let start = std::time::Instant::now();
    for _ in 0..n {
        let (a, b) = (black_box(&a), black_box(&b));
        match mode.as_str() {
            "direct" => map2_op::<f32>(&a.view(), &b.view(), &mut out.view_mut()?, Add)?,
            "registry" => add.call(&mut [Arg::Tensor(a.view()), Arg::Tensor(b.view())], &mut [out.view_mut()?])?,
            "binding" => dlbridge::call_into(&add, &mut [ArrayArg::In(a), ArrayArg::In(b)], &mut [&mut out])?,
            "noop" => noop.call(&mut [Arg::Tensor(a.view()), Arg::Tensor(b.view())], &mut [out.view_mut()?])?,
            "views" => drop(black_box((a.view(), b.view(), out.view_mut()?))),
            other => panic!("unknown mode {other}: direct, registry, binding, noop or views"),
        }
    }
    println!("{mode}: {:.1} ns/call", start.elapsed().as_secs_f64() * 1e9 / n.max(1) as f64);
    if ["direct", "registry", "binding"].contains(&mode.as_str()) {
        assert_eq!(out.to_vec::<f32>()?, [3.0]);
    }
    Ok(())
}

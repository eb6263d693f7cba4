#![forbid(unsafe_code)]

use dlbridge_array::Array;
use dlbridge_core::DType;
use dlbridge_cpu::num::Num;
use dlbridge_registry::{Arg, Registry};
use std::hint::black_box;
use std::time::Instant;
fn main() {
    dlbridge_cpu::link();
    let add = Registry::global().get("add").unwrap();
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    let b = Array::from_slice(&[2.0f32], &[1]).unwrap();
    let mut out = Array::zeros(DType::F32, &[1]).unwrap();
    let n: u32 = std::env::args().nth(1).map_or(2_000_000, |s| s.parse().unwrap());
    let mode = std::env::args().nth(2).unwrap_or_default();
    for round in 0..3 {
        if mode != "registry" {
            let t = Instant::now();
            for _ in 0..n {
                let mut o = out.view_mut().unwrap();
                dlbridge_cpu::elementwise::map2::<f32>(&black_box(&a).view(), &black_box(&b).view(), &mut o, f32::add).unwrap();
            }
            println!("{round} direct:   {:?}", t.elapsed() / n);
        }
        if mode != "direct" {
            let t = Instant::now();
            for _ in 0..n {
                add.call(&mut [Arg::Tensor(black_box(&a).view()), Arg::Tensor(black_box(&b).view())], &mut [out.view_mut().unwrap()])
                    .unwrap();
            }
            println!("{round} registry: {:?}", t.elapsed() / n);
        }
    }
}

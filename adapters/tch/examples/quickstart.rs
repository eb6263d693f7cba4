//! A Rust app mixing tch tensors with dlbridge kernels: tensors go in with zero
//! copies, outputs are allocated by tch, and DLPack goes both ways.
//!
//! ```text
//! . .venv/bin/activate && LIBTORCH_USE_PYTORCH=1 cargo run -q -p dlbridge-tch --example quickstart
//! ```
#![forbid(unsafe_code)]

use tch::{Device, Kind, Tensor};

fn main() -> dlbridge::Result<()> {
    let x = Tensor::randn([64, 32], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([32, 16], (Kind::Float, Device::Cpu));
    let (matmul, gelu) = (dlbridge::get_kernel("matmul")?, dlbridge::get_kernel("gelu")?);
    let h = dlbridge_tch::call(&matmul, &[&x, &w], &[])?.remove(0); // a tch::Tensor, made by tch
    let y = dlbridge_tch::call(&gelu, &[&h], &[])?.remove(0);
    assert!(y.allclose(&x.matmul(&w).gelu("none"), 1e-5, 1e-5, false));

    let m = dlbridge_tch::to_dlpack(&y)?; // zero copy; y's storage lives until the deleter runs
    let back = dlbridge_tch::from_dlpack(m)?; // zero copy; the deleter runs when torch frees it
    assert_eq!(back.data_ptr(), y.data_ptr());
    println!("gelu(x @ w) through dlbridge: {:?}, equal to tch's own, zero copy", y.size());
    Ok(())
}

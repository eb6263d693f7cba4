//! A Rust app mixing tch tensors with dlbridge kernels: tensors go in with zero
//! copies, outputs are allocated by tch, and DLPack goes both ways.
//!
//! ```text
//! . .venv/bin/activate && LIBTORCH_USE_PYTORCH=1 cargo run -q -p dlbridge --features tch --example quickstart
//! ```
#![forbid(unsafe_code)]

use tch::{Device, Kind, Tensor};

fn main() -> dlbridge::Result<()> {
    let x = Tensor::randn([64, 32], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([32, 16], (Kind::Float, Device::Cpu));
    let (matmul, gelu) = (dlbridge::tch::kernel("matmul")?, dlbridge::tch::kernel("gelu")?);
    let h = matmul.call1((&x, &w))?; // a tch::Tensor, made by tch
    let y = gelu.call1(&h)?;
    assert!(y.allclose(&x.matmul(&w).gelu("none"), 1e-5, 1e-5, false));
    // Tensors and scalars in one list, in signature order: axpy(alpha: f64, x, y: mut) is y += alpha * x.
    let acc = y.copy();
    dlbridge::tch::kernel("axpy")?.call0((2.0, &y.flatten(0, -1), &acc.flatten(0, -1)))?;
    assert!(acc.allclose(&(&y * 3.0), 1e-6, 1e-6, false));

    let m = dlbridge::tch::to_dlpack(&y)?; // zero copy; y's storage lives until the deleter runs
    let back = dlbridge::tch::from_dlpack(m)?; // zero copy; the deleter runs when torch frees it
    assert_eq!(back.data_ptr(), y.data_ptr());
    println!("gelu(x @ w) through dlbridge: {:?}, equal to tch's own, zero copy", y.size());
    Ok(())
}

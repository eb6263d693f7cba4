//! A Rust program mixing tch tensors with a kernel of its own and a built-in.
use dlbridge::{Call, register_kernel};
use tch::{Device, Kind, Tensor};

/// y = alpha * x + 1, on f32 tensors of any length.
fn scale_shift(call: &mut Call<'_, '_>) -> dlbridge::Result<()> {
    let (ins, mut outs) = call.io();
    let (x, alpha) = (ins.tensor("x")?, ins.f64("alpha")? as f32);
    let y = outs.take("y")?;
    y.iter_mut::<f32>()?.zip(x.iter::<f32>()?).for_each(|(y, x)| *y = alpha * x + 1.0);
    Ok(())
}

register_kernel!("scale_shift(x: f32[N], alpha: f64) -> (y: f32[N])", generic scale_shift);

fn main() -> dlbridge::Result<()> {
    let x = Tensor::arange(4, (Kind::Float, Device::Cpu));
    let y = dlbridge::tch::kernel("scale_shift")?.call1((&x, 2.0))?; // a tch::Tensor
    let z = dlbridge::tch::kernel("relu")?.call1(&(&y - 4.0))?; // a built-in
    println!("y = {:?}", Vec::<f32>::try_from(&y).unwrap());
    println!("relu(y - 4) = {:?}", Vec::<f32>::try_from(&z).unwrap());
    Ok(())
}

//! Elementwise kernels: add, sub, mul, div, maximum, axpy, relu, gelu.
//!
//! Any matching strided layouts are accepted. When every tensor is
//! contiguous, a vectorisable slice loop runs, split across rayon threads
//! above [`PAR_MIN`] elements. An output that is exactly an input (the
//! registry refuses any other overlap) is computed in place.

use dlbridge_core::{Error, Result, TensorView, TensorViewMut};
use dlbridge_registry::{Call, KernelOpts, register_kernel};
use rayon::prelude::*;

use crate::num::{Compute, Real, Scalar};

/// Below this many elements a kernel runs on the calling thread.
pub const PAR_MIN: usize = 1 << 16;
/// Elements per rayon task.
const CHUNK: usize = 1 << 14;

#[inline(always)]
fn run3<T: Scalar>(o: &mut [T], x: &[T], y: &[T], f: impl Fn(T, T) -> T) {
    for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
        *o = f(x, y);
    }
}

#[inline(always)]
fn run2<T: Scalar>(o: &mut [T], x: &[T], f: impl Fn(T, T) -> T) {
    for (o, &x) in o.iter_mut().zip(x) {
        *o = f(*o, x);
    }
}

#[inline(always)]
fn run1<T: Scalar>(o: &mut [T], f: impl Fn(T) -> T) {
    for o in o.iter_mut() {
        *o = f(*o);
    }
}

fn chunks3<T: Scalar>(o: &mut [T], x: &[T], y: &[T], f: impl Fn(T, T) -> T + Sync + Send + Copy) {
    if o.len() < PAR_MIN {
        run3(o, x, y, f);
    } else {
        o.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).zip(y.par_chunks(CHUNK)).for_each(|((o, x), y)| run3(o, x, y, f));
    }
}

/// `o[i] = f(o[i], x[i])`
fn chunks2<T: Scalar>(o: &mut [T], x: &[T], f: impl Fn(T, T) -> T + Sync + Send + Copy) {
    if o.len() < PAR_MIN {
        run2(o, x, f);
    } else {
        o.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(o, x)| run2(o, x, f));
    }
}

fn chunks1<T: Scalar>(o: &mut [T], f: impl Fn(T) -> T + Sync + Send + Copy) {
    if o.len() < PAR_MIN {
        run1(o, f);
    } else {
        o.par_chunks_mut(CHUNK).for_each(|o| run1(o, f));
    }
}

fn aliases(v: &TensorView<'_>, out: &TensorViewMut<'_>) -> bool {
    v.numel() > 0 && v.data_ptr() == out.as_view().data_ptr()
}

/// `out = f(a, b)` over any matching layouts (the body of add, sub, mul, ...; public
/// so benchmarks can call a kernel without the registry).
pub fn map2<T: Scalar>(
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    f: impl Fn(T, T) -> T + Sync + Send + Copy,
) -> Result<()> {
    let (aa, ba) = (aliases(a, out), aliases(b, out));
    if a.is_contiguous() && b.is_contiguous() && out.is_contiguous() {
        let o = out.as_slice_mut::<T>()?;
        match (aa, ba) {
            (false, false) => chunks3(o, a.as_slice()?, b.as_slice()?, f),
            (true, false) => chunks2(o, b.as_slice()?, f),
            (false, true) => chunks2(o, a.as_slice()?, move |o, x| f(x, o)),
            (true, true) => chunks1(o, move |v| f(v, v)),
        }
        return Ok(());
    }
    match (aa, ba) {
        (false, false) => out.iter_mut::<T>()?.zip(a.iter::<T>()?.zip(b.iter::<T>()?)).for_each(|(o, (x, y))| *o = f(x, y)),
        (true, false) => out.iter_mut::<T>()?.zip(b.iter::<T>()?).for_each(|(o, y)| *o = f(*o, y)),
        (false, true) => out.iter_mut::<T>()?.zip(a.iter::<T>()?).for_each(|(o, x)| *o = f(x, *o)),
        (true, true) => out.iter_mut::<T>()?.for_each(|o| *o = f(*o, *o)),
    }
    Ok(())
}

/// `out = f(x)` over any matching layouts.
pub fn map1<T: Scalar>(x: &TensorView<'_>, out: &mut TensorViewMut<'_>, f: impl Fn(T) -> T + Sync + Send + Copy) -> Result<()> {
    let alias = aliases(x, out);
    if x.is_contiguous() && out.is_contiguous() {
        let o = out.as_slice_mut::<T>()?;
        if alias {
            chunks1(o, f)
        } else {
            chunks2(o, x.as_slice()?, move |_, x| f(x))
        }
        return Ok(());
    }
    if alias {
        out.iter_mut::<T>()?.for_each(|o| *o = f(*o));
    } else {
        out.iter_mut::<T>()?.zip(x.iter::<T>()?).for_each(|(o, x)| *o = f(x));
    }
    Ok(())
}

fn binary<T: Scalar>(call: &mut Call<'_, '_>, f: impl Fn(T, T) -> T + Sync + Send + Copy) -> Result<()> {
    let (ins, mut outs) = call.io();
    map2(ins.tensor("a")?, ins.tensor("b")?, outs.take("out")?, f)
}

fn unary<T: Scalar>(call: &mut Call<'_, '_>, f: impl Fn(T) -> T + Sync + Send + Copy) -> Result<()> {
    let (ins, mut outs) = call.io();
    map1(ins.tensor("x")?, outs.take("y")?, f)
}

fn add<T: Scalar>(call: &mut Call<'_, '_>) -> Result<()> {
    binary::<T>(call, T::add)
}
fn sub<T: Scalar>(call: &mut Call<'_, '_>) -> Result<()> {
    binary::<T>(call, T::sub)
}
fn mul<T: Scalar>(call: &mut Call<'_, '_>) -> Result<()> {
    binary::<T>(call, T::mul)
}
fn maximum<T: Scalar>(call: &mut Call<'_, '_>) -> Result<()> {
    binary::<T>(call, T::maximum)
}

fn div<T: Scalar>(call: &mut Call<'_, '_>) -> Result<()> {
    let (ins, mut outs) = call.io();
    let (a, b) = (ins.tensor("a")?, ins.tensor("b")?);
    if T::IS_INT && b.iter::<T>()?.any(|v| v == T::zero()) {
        return Err(Error::InvalidArgument("integer division by zero (argument b has a zero)".into()));
    }
    map2(a, b, outs.take("out")?, T::div)
}

fn relu<T: Scalar>(call: &mut Call<'_, '_>) -> Result<()> {
    unary::<T>(call, |x: T| x.maximum(T::zero()))
}

fn gelu<T: Real>(call: &mut Call<'_, '_>) -> Result<()> {
    unary::<T>(call, |x: T| {
        let c = x.up();
        let half = <T::C as Compute>::of(0.5);
        T::down(half * c * (<T::C as Compute>::ONE + (c * <T::C as Compute>::of(std::f64::consts::FRAC_1_SQRT_2)).erf()))
    })
}

fn axpy<T: Scalar>(call: &mut Call<'_, '_>) -> Result<()> {
    let (ins, mut outs) = call.io();
    let (alpha, x, y) = (T::from_f64(ins.f64("alpha")?), ins.tensor("x")?, outs.take("y")?);
    if x.is_contiguous() && y.is_contiguous() {
        chunks2(y.as_slice_mut::<T>()?, x.as_slice::<T>()?, move |y, x| y.add(alpha.mul(x)));
    } else {
        y.iter_mut::<T>()?.zip(x.iter::<T>()?).for_each(|(y, x)| *y = y.add(alpha.mul(x)));
    }
    Ok(())
}

register_kernel!("add<T: f32|f64|f16|bf16|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])",
    each scalars!(add),
    opts = KernelOpts::ELEMENTWISE, doc = "elementwise a + b (integers wrap)");
register_kernel!("sub<T: f32|f64|f16|bf16|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])",
    each scalars!(sub),
    opts = KernelOpts::ELEMENTWISE, doc = "elementwise a - b (integers wrap)");
register_kernel!("mul<T: f32|f64|f16|bf16|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])",
    each scalars!(mul),
    opts = KernelOpts::ELEMENTWISE, doc = "elementwise a * b (integers wrap)");
register_kernel!("div<T: f32|f64|f16|bf16|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])",
    each scalars!(div),
    opts = KernelOpts::ELEMENTWISE, doc = "elementwise a / b (integer: truncating; a zero divisor is an error)");
register_kernel!("maximum<T: f32|f64|f16|bf16|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])",
    each scalars!(maximum),
    opts = KernelOpts::ELEMENTWISE, doc = "elementwise max(a, b), NaN-propagating");
register_kernel!("relu<T: f32|f64|f16|bf16|i32|i64>(x: T[...S]) -> (y: T[...S])",
    each scalars!(relu),
    opts = KernelOpts::ELEMENTWISE, doc = "max(x, 0), NaN-propagating");
register_kernel!("gelu<T: f32|f64|f16|bf16>(x: T[...S]) -> (y: T[...S])",
    each reals!(gelu),
    opts = KernelOpts::ELEMENTWISE, doc = "x * Phi(x) with the exact erf (torch's approximate='none')");
register_kernel!("axpy<T: f32|f64|f16|bf16>(alpha: f64, x: T[N], y: mut T[N])",
    each reals!(axpy),
    doc = "y += alpha * x, in place");

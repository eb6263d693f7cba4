//! Reductions over the last dim (sum, mean, softmax) and over everything
//! (sum_all, mean_all).
//!
//! Any strides are accepted: a strided input is gathered into row order
//! first (one copy, documented), a contiguous one is read in place. Rows run
//! in parallel above [`PAR_MIN`](crate::elementwise::PAR_MIN) elements; sums
//! use 8 independent accumulators (vectorisable) in a wide type: f64 for
//! floats, i64 (wrapping) for integers.
//!
//! Every scratch buffer (the gathered copy of a strided input, the staged
//! rows of a strided output) is allocated fallibly: a broadcast input of 2^46
//! elements is an `OutOfMemory` error, never an abort.

use std::borrow::Cow;

use dlbridge_core::half::{bf16, f16};
use dlbridge_core::view::try_vec_with_capacity;
use dlbridge_core::{Element, Result, TensorView, TensorViewMut};
use dlbridge_registry::{Call, KernelOpts, register_kernel};
use rayon::prelude::*;

use crate::elementwise::PAR_MIN;
use crate::num::{Compute, Real, Scalar};

/// Elements that can be summed in a wider accumulator.
pub trait Summable: Scalar {
    /// The accumulator type.
    type A: Copy + Send + Sync;
    /// Accumulator zero.
    const AZ: Self::A;
    /// Widen one element.
    fn up(self) -> Self::A;
    /// Add two accumulators.
    fn plus(a: Self::A, b: Self::A) -> Self::A;
    /// Narrow the total.
    fn fin(a: Self::A) -> Self;
    /// The mean of `n` elements with this total (NaN for n = 0).
    fn mean(a: Self::A, n: usize) -> Self;
}

macro_rules! summable_float {
    ($($t:ty),*) => {$(
        impl Summable for $t {
            type A = f64;
            const AZ: f64 = 0.0;
            #[inline(always)] fn up(self) -> f64 { Scalar::to_f64(self) }
            #[inline(always)] fn plus(a: f64, b: f64) -> f64 { a + b }
            #[inline(always)] fn fin(a: f64) -> Self { <$t as Scalar>::from_f64(a) }
            #[inline(always)] fn mean(a: f64, n: usize) -> Self { <$t as Scalar>::from_f64(a / n as f64) }
        }
    )*};
}
summable_float!(f32, f64, f16, bf16);

macro_rules! summable_int {
    ($($t:ty),*) => {$(
        impl Summable for $t {
            type A = i64;
            const AZ: i64 = 0;
            #[inline(always)] fn up(self) -> i64 { self as i64 }
            #[inline(always)] fn plus(a: i64, b: i64) -> i64 { a.wrapping_add(b) }
            #[inline(always)] fn fin(a: i64) -> Self { a as $t }
            #[inline(always)] fn mean(a: i64, n: usize) -> Self { if n == 0 { 0 } else { (a / n as i64) as $t } }
        }
    )*};
}
summable_int!(i32, i64);

/// Sum of a slice with 8 independent lanes.
#[inline]
fn lane_sum<T: Summable>(x: &[T]) -> T::A {
    let mut lanes = [T::AZ; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            lanes[i] = T::plus(lanes[i], c[i].up());
        }
    }
    let mut total = T::AZ;
    for l in lanes {
        total = T::plus(total, l);
    }
    for &v in chunks.remainder() {
        total = T::plus(total, v.up());
    }
    total
}

fn par_sum<T: Summable>(x: &[T]) -> T::A {
    if x.len() < PAR_MIN { lane_sum(x) } else { x.par_chunks(PAR_MIN).map(lane_sum::<T>).reduce(|| T::AZ, T::plus) }
}

/// The input's elements in row-major order: borrowed when contiguous, gathered otherwise.
fn row_major<'v, T: Element>(x: &TensorView<'v>) -> Result<Cow<'v, [T]>> {
    if x.is_contiguous() { Ok(Cow::Borrowed(x.as_slice::<T>()?)) } else { Ok(Cow::Owned(x.to_vec::<T>()?)) }
}

/// Writes `values` (row-major) into `out`, whatever its strides.
fn write_out<T: Element>(out: &mut TensorViewMut<'_>, values: impl Iterator<Item = T>) -> Result<()> {
    out.iter_mut::<T>()?.zip(values).for_each(|(o, v)| *o = v);
    Ok(())
}

/// Applies `f(row) -> T` to each last-dim row of `x`, writing one value per row into `out`.
fn per_row<T: Element>(x: &TensorView<'_>, out: &mut TensorViewMut<'_>, f: impl Fn(&[T]) -> T + Sync + Send) -> Result<()> {
    let n = x.shape().last().copied().unwrap_or(1) as usize;
    let data = row_major::<T>(x)?;
    let rows = out.numel();
    if n == 0 {
        return write_out(out, std::iter::repeat_n(f(&[]), rows));
    }
    if out.is_contiguous() {
        let o = out.as_slice_mut::<T>()?;
        if data.len() < PAR_MIN {
            o.iter_mut().zip(data.chunks(n)).for_each(|(o, r)| *o = f(r));
        } else {
            o.par_iter_mut().zip(data.par_chunks(n)).for_each(|(o, r)| *o = f(r));
        }
        return Ok(());
    }
    let mut values: Vec<T> = try_vec_with_capacity(rows, "per-row results")?;
    values.extend(data.chunks(n).map(&f));
    write_out(out, values.into_iter())
}

/// `x` and `y`, the one input and output of every reduction here.
fn io<'c, 'a>(call: &'c mut Call<'_, 'a>) -> Result<(&'c TensorView<'c>, &'c mut TensorViewMut<'a>)> {
    let (ins, mut outs) = call.io();
    Ok((ins.tensor("x")?, outs.take("y")?))
}

fn sum<T: Summable>(call: &mut Call<'_, '_>) -> Result<()> {
    let (x, out) = io(call)?;
    per_row::<T>(x, out, |r| T::fin(lane_sum(r)))
}

fn mean<T: Summable>(call: &mut Call<'_, '_>) -> Result<()> {
    let (x, out) = io(call)?;
    per_row::<T>(x, out, |r| T::mean(lane_sum(r), r.len()))
}

fn sum_all<T: Summable>(call: &mut Call<'_, '_>) -> Result<()> {
    let (x, out) = io(call)?;
    let total = par_sum(&row_major::<T>(x)?);
    write_out(out, std::iter::once(T::fin(total)))
}

fn mean_all<T: Summable>(call: &mut Call<'_, '_>) -> Result<()> {
    let (x, out) = io(call)?;
    let data = row_major::<T>(x)?;
    let total = par_sum(&data);
    write_out(out, std::iter::once(T::mean(total, data.len())))
}

/// Numerically stable softmax of one row: subtract the max, exponentiate, normalise.
/// Four passes, each a plain loop the compiler vectorises (8 independent lanes
/// for the max and the sum); a NaN anywhere makes the row NaN, like torch.
#[inline]
fn softmax_row<T: Real>(x: &[T], y: &mut [T]) {
    let neg = <T::C as Compute>::NEG_INF;
    let mut lanes = [neg; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            let v = c[i].up();
            lanes[i] = if v > lanes[i] { v } else { lanes[i] };
        }
    }
    let mut m = neg;
    for v in lanes.into_iter().chain(chunks.remainder().iter().map(|v| v.up())) {
        m = if v > m { v } else { m };
    }
    for (o, &v) in y.iter_mut().zip(x) {
        *o = T::down((v.up() - m).exp());
    }
    let mut acc = [<T::C as Compute>::ZERO; 8];
    let mut chunks = y.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] = acc[i] + c[i].up();
        }
    }
    let mut s = <T::C as Compute>::ZERO;
    for v in acc.into_iter().chain(chunks.remainder().iter().map(|v| v.up())) {
        s = s + v;
    }
    let inv = <T::C as Compute>::ONE / s;
    for o in y.iter_mut() {
        *o = T::down(o.up() * inv);
    }
}

fn softmax<T: Real>(call: &mut Call<'_, '_>) -> Result<()> {
    let (x, out) = io(call)?;
    let n = x.shape().last().copied().unwrap_or(1) as usize;
    if x.numel() == 0 {
        return Ok(());
    }
    let data = row_major::<T>(x)?;
    if out.is_contiguous() {
        let o = out.as_slice_mut::<T>()?;
        if data.len() < PAR_MIN {
            o.chunks_mut(n).zip(data.chunks(n)).for_each(|(y, r)| softmax_row(r, y));
        } else {
            o.par_chunks_mut(n).zip(data.par_chunks(n)).for_each(|(y, r)| softmax_row(r, y));
        }
        return Ok(());
    }
    let mut tmp: Vec<T> = try_vec_with_capacity(data.len(), "softmax output staging")?;
    tmp.resize(data.len(), T::zero());
    tmp.par_chunks_mut(n).zip(data.par_chunks(n)).for_each(|(y, r)| softmax_row(r, y));
    write_out(out, tmp.into_iter())
}

register_kernel!("sum<T: f32|f64|f16|bf16|i32|i64>(x: T[...B, N]) -> (y: T[...B])",
    each scalars!(sum),
    doc = "sum over the last dim (f64 accumulation for floats, wrapping i64 for integers)");
register_kernel!("mean<T: f32|f64|f16|bf16>(x: T[...B, N]) -> (y: T[...B])",
    each reals!(mean),
    doc = "mean over the last dim (NaN for an empty dim)");
register_kernel!("sum_all<T: f32|f64|f16|bf16|i32|i64>(x: T[...S]) -> (y: T[])",
    each scalars!(sum_all),
    doc = "sum of every element, as a 0-d tensor");
register_kernel!("mean_all<T: f32|f64|f16|bf16>(x: T[...S]) -> (y: T[])",
    each reals!(mean_all),
    doc = "mean of every element, as a 0-d tensor");
register_kernel!("softmax<T: f32|f64|f16|bf16>(x: T[...B, N]) -> (y: T[...B, N])",
    each reals!(softmax),
    opts = KernelOpts::DEFAULT, doc = "softmax over the last dim, max-subtracted (numerically stable)");

//! Reductions over the last dim (sum, mean, softmax) and over everything
//! (sum_all, mean_all).
//!
//! Any strides are accepted. The last-dim kernels read rows in place when
//! their stride is 1 (whatever the batch dims' strides: sliced, broadcast),
//! and otherwise gather a few rows at a time into a per-thread buffer
//! ([`crate::strided::map_rows`]); a row whose stride is 0 is one value
//! repeated, summed without reading it N times. Rows run in parallel above
//! [`PAR_MIN`] elements. Sums run in blocks of 1024 elements with 32
//! independent lanes in the element's compute type (f32 for f32/f16/bf16, f64
//! for f64: vector code, dispatched at run time to AVX2/AVX-512 with `pulp`),
//! and add the block totals in a wide accumulator (f64 for floats, wrapping
//! i64 for integers): as fast as a plain f32 sum, far more accurate than one.
//!
//! The all-element reductions copy a strided input into row order first (one
//! fallibly allocated copy: a broadcast input of 2^46 elements is an
//! `OutOfMemory` error, never an abort).
// Indexed loops on purpose: they stay inside pulp's `#[target_feature]` functions
// (an iterator adaptor's `fold` may be left out of line, compiled for the baseline).
#![allow(clippy::needless_range_loop)]

use std::borrow::Cow;

use dlbridge_core::half::{bf16, f16};
use dlbridge_core::{Element, Result, TensorView, TensorViewMut};
use dlbridge_registry::{Call, KernelOpts, register_kernel};
use rayon::prelude::*;

use crate::elementwise::PAR_MIN;
use crate::num::{Compute, Real, Scalar};
use crate::strided::map_rows;

/// Elements that can be summed: in lanes of type `L`, block totals in `A`.
pub trait Summable: Scalar {
    /// The lane (per-block) accumulator: the compute type.
    type L: Copy + Send + Sync + Default + std::ops::Add<Output = Self::L>;
    /// The total's accumulator type.
    type A: Copy + Send + Sync;
    /// Accumulator zero.
    const AZ: Self::A;
    /// Widen one element into a lane.
    fn lane(self) -> Self::L;
    /// A block's lane total into the accumulator.
    fn widen(l: Self::L) -> Self::A;
    /// Add two accumulators.
    fn plus(a: Self::A, b: Self::A) -> Self::A;
    /// `n` times one element, exactly as far as the accumulator allows (a zero-stride row).
    fn times(self, n: usize) -> Self::A;
    /// Narrow the total.
    fn fin(a: Self::A) -> Self;
    /// The mean of `n` elements with this total (NaN for n = 0).
    fn mean(a: Self::A, n: usize) -> Self;
    /// The sum of a slice, inside pulp's dispatch (explicit SIMD for f32 and
    /// bf16; [`lane_sum`] otherwise).
    #[inline(always)]
    fn simd_sum<S: pulp::Simd>(_simd: S, x: &[Self]) -> Self::A {
        lane_sum(x)
    }
}

macro_rules! summable_float {
    ($($t:ty => $l:ty, $lane:expr $(, $simd:ident)?);*) => {$(
        impl Summable for $t {
            $(#[inline(always)] fn simd_sum<S: pulp::Simd>(simd: S, x: &[Self]) -> f64 { $simd(simd, x) })?
            type L = $l;
            type A = f64;
            const AZ: f64 = 0.0;
            #[inline(always)] fn lane(self) -> $l { $lane(self) }
            #[inline(always)] fn widen(l: $l) -> f64 { l as f64 }
            #[inline(always)] fn plus(a: f64, b: f64) -> f64 { a + b }
            #[inline(always)] fn times(self, n: usize) -> f64 { Scalar::to_f64(self) * n as f64 }
            #[inline(always)] fn fin(a: f64) -> Self { <$t as Scalar>::from_f64(a) }
            #[inline(always)] fn mean(a: f64, n: usize) -> Self { <$t as Scalar>::from_f64(a / n as f64) }
        }
    )*};
}
summable_float!(f32 => f32, |x| x, simd_sum_f32; f64 => f64, |x| x; f16 => f32, f16::to_f32; bf16 => f32, crate::num::bf16_to_f32, simd_sum_bf16);

/// The sum of a slice of f32 in explicit SIMD: blocks of [`BLOCK`] elements in
/// four vector accumulators (f32), block totals added in f64.
#[inline(always)]
fn simd_sum_f32<S: pulp::Simd>(simd: S, x: &[f32]) -> f64 {
    let mut total = 0.0f64;
    let mut start = 0;
    while start < x.len() {
        let block = &x[start..x.len().min(start + BLOCK)];
        start += block.len();
        let (head, tail) = S::as_simd_f32s(block);
        let z = simd.splat_f32s(0.0);
        let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
        let full = head.len() / 4 * 4;
        let mut i = 0;
        while i < full {
            a0 = simd.add_f32s(a0, head[i]);
            a1 = simd.add_f32s(a1, head[i + 1]);
            a2 = simd.add_f32s(a2, head[i + 2]);
            a3 = simd.add_f32s(a3, head[i + 3]);
            i += 4;
        }
        while i < head.len() {
            a0 = simd.add_f32s(a0, head[i]);
            i += 1;
        }
        let mut s = simd.reduce_sum_f32s(simd.add_f32s(simd.add_f32s(a0, a1), simd.add_f32s(a2, a3)));
        for &v in tail {
            s += v;
        }
        total += s as f64;
    }
    total
}

/// bf16 blocks widened into an f32 buffer (a vectorised shift), then [`simd_sum_f32`].
#[inline(always)]
fn simd_sum_bf16<S: pulp::Simd>(simd: S, x: &[bf16]) -> f64 {
    let mut buf = [0.0f32; 256];
    let mut total = 0.0f64;
    let mut start = 0;
    while start < x.len() {
        let block = &x[start..x.len().min(start + 256)];
        start += block.len();
        let b = &mut buf[..block.len()];
        for i in 0..b.len() {
            b[i] = crate::num::bf16_to_f32(block[i]);
        }
        total += simd_sum_f32(simd, b);
    }
    total
}

macro_rules! summable_int {
    ($($t:ty),*) => {$(
        impl Summable for $t {
            type L = i64;
            type A = i64;
            const AZ: i64 = 0;
            #[inline(always)] fn lane(self) -> i64 { self as i64 }
            #[inline(always)] fn widen(l: i64) -> i64 { l }
            #[inline(always)] fn plus(a: i64, b: i64) -> i64 { a.wrapping_add(b) }
            #[inline(always)] fn times(self, n: usize) -> i64 { (self as i64).wrapping_mul(n as i64) }
            #[inline(always)] fn fin(a: i64) -> Self { a as $t }
            #[inline(always)] fn mean(a: i64, n: usize) -> Self { if n == 0 { 0 } else { (a / n as i64) as $t } }
        }
    )*};
}
summable_int!(i32, i64);

/// Lanes per block sum (4 AVX-512 registers of f32: enough to hide the add latency).
const LANES: usize = 32;
/// Elements per block before the lanes are folded into the wide accumulator.
const BLOCK: usize = 1024;

/// Sum of a slice: blocks of [`BLOCK`] elements summed in [`LANES`] independent
/// lanes of `T::L`, block totals added in `T::A`. (Integers wrap: lanes of i64
/// wrap like the total would.)
#[inline(always)]
fn lane_sum<T: Summable>(x: &[T]) -> T::A {
    let mut total = T::AZ;
    let mut start = 0;
    while start < x.len() {
        let block = &x[start..x.len().min(start + BLOCK)];
        start += block.len();
        let mut lanes = [T::L::default(); LANES];
        let full = block.len() / LANES * LANES;
        let mut i = 0;
        while i < full {
            let c = &block[i..i + LANES];
            for l in 0..LANES {
                lanes[l] = lanes[l] + c[l].lane();
            }
            i += LANES;
        }
        let mut w = LANES;
        while w > 1 {
            w /= 2;
            for l in 0..w {
                lanes[l] = lanes[l] + lanes[l + w];
            }
        }
        let mut s = lanes[0];
        for &v in &block[full..] {
            s = s + v.lane();
        }
        total = T::plus(total, T::widen(s));
    }
    total
}

fn par_sum<T: Summable>(x: &[T]) -> T::A {
    let arch = pulp::Arch::new();
    if x.len() < PAR_MIN {
        arch.dispatch(LaneSum(x))
    } else {
        x.par_chunks(PAR_MIN).map(|c| arch.dispatch(LaneSum(c))).reduce(|| T::AZ, T::plus)
    }
}

/// The input's elements in row-major order: borrowed when contiguous, copied otherwise.
fn row_major<'v, T: Element>(x: &TensorView<'v>) -> Result<Cow<'v, [T]>> {
    if x.is_contiguous() { Ok(Cow::Borrowed(x.as_slice::<T>()?)) } else { Ok(Cow::Owned(x.to_vec::<T>()?)) }
}

/// Writes `values` (row-major) into `out`, whatever its strides.
fn write_out<T: Element>(out: &mut TensorViewMut<'_>, values: impl Iterator<Item = T>) -> Result<()> {
    out.iter_mut::<T>()?.zip(values).for_each(|(o, v)| *o = v);
    Ok(())
}

/// `x` and `y`, the one input and output of every reduction here.
fn io<'c, 'a>(call: &'c mut Call<'_, 'a>) -> Result<(&'c TensorView<'c>, &'c mut TensorViewMut<'a>)> {
    let (ins, mut outs) = call.io();
    Ok((ins.tensor("x")?, outs.take("y")?))
}

/// [`lane_sum`] for `pulp`'s dispatch (`with_simd` is `inline(always)`, so the
/// loop is compiled for AVX2 / AVX-512 inside pulp's `#[target_feature]` function).
struct LaneSum<'r, T>(&'r [T]);
impl<T: Summable> pulp::WithSimd for LaneSum<'_, T> {
    type Output = T::A;
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) -> T::A {
        T::simd_sum(simd, self.0)
    }
}

/// [`softmax_row`] for `pulp`'s dispatch.
struct SoftmaxRow<'r, T: Real>(&'r [T], &'r mut [T], &'r mut [T::C]);
impl<T: Real> pulp::WithSimd for SoftmaxRow<'_, T> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        softmax_row(self.0, self.1, self.2)
    }
}

/// `T::A` of one row: `row` is the whole row, or its one value when the row has
/// stride 0 (then `n` is its length).
#[inline]
fn row_total<T: Summable>(arch: pulp::Arch, row: &[T], n: usize) -> T::A {
    if row.len() < n { row[0].times(n) } else { arch.dispatch(LaneSum(row)) }
}

fn sum<T: Summable + Default>(call: &mut Call<'_, '_>) -> Result<()> {
    let (x, out) = io(call)?;
    let arch = pulp::Arch::new();
    map_rows::<T, T, u8>(x, out, 0, true, |r, n, o, _| o[0] = T::fin(row_total(arch, r, n)))
}

fn mean<T: Summable + Default>(call: &mut Call<'_, '_>) -> Result<()> {
    let (x, out) = io(call)?;
    let arch = pulp::Arch::new();
    map_rows::<T, T, u8>(x, out, 0, true, |r, n, o, _| o[0] = T::mean(row_total(arch, r, n), n))
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

/// Numerically stable softmax of one row: the max (32 lanes), then e^(x - max)
/// into the f32/f64 scratch row with its sum accumulated in the same pass (32
/// lanes), then the scaled, rounded output. Plain loops the compiler
/// vectorises ([`crate::num::exp_f32`] is branch-free); a NaN anywhere makes the
/// row NaN, like torch.
#[inline(always)]
fn softmax_row<T: Real>(x: &[T], y: &mut [T], tmp: &mut [T::C]) {
    let n = x.len();
    let (y, tmp) = (&mut y[..n], &mut tmp[..n]);
    let neg = <T::C as Compute>::NEG_INF;
    let zero = <T::C as Compute>::ZERO;
    let full = n / LANES * LANES;
    let mut lanes = [neg; LANES];
    let mut i = 0;
    while i < full {
        let c = &x[i..i + LANES];
        for l in 0..LANES {
            let v = c[l].up();
            lanes[l] = if v > lanes[l] || v.is_nan() { v } else { lanes[l] };
        }
        i += LANES;
    }
    let mut m = neg;
    for l in 0..LANES {
        m = if lanes[l] > m || lanes[l].is_nan() { lanes[l] } else { m };
    }
    for &v in &x[full..] {
        let v = v.up();
        m = if v > m || v.is_nan() { v } else { m };
    }
    let mut acc = [zero; LANES];
    let mut i = 0;
    while i < full {
        let (c, t) = (&x[i..i + LANES], &mut tmp[i..i + LANES]);
        for l in 0..LANES {
            let e = (c[l].up() - m).exp();
            t[l] = e;
            acc[l] = acc[l] + e;
        }
        i += LANES;
    }
    let mut s = zero;
    for k in full..n {
        let e = (x[k].up() - m).exp();
        tmp[k] = e;
        s = s + e;
    }
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            acc[l] = acc[l] + acc[l + w];
        }
    }
    let inv = <T::C as Compute>::ONE / (acc[0] + s);
    for k in 0..n {
        y[k] = T::down(tmp[k] * inv);
    }
}

fn softmax<T: Real + Default>(call: &mut Call<'_, '_>) -> Result<()>
where
    T::C: Default,
{
    let (x, out) = io(call)?;
    if x.numel() == 0 {
        return Ok(());
    }
    let n = x.shape().last().copied().unwrap_or(1) as usize;
    let arch = pulp::Arch::new();
    map_rows::<T, T, T::C>(x, out, n, false, |r, _, o, tmp| arch.dispatch(SoftmaxRow(r, o, tmp)))
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

//! Reductions over the last dim (sum, mean, softmax) and over everything
//! (sum_all, mean_all).
//!
//! Any strides are accepted. The last-dim kernels read rows in place when
//! their stride is 1 (whatever the batch dims' strides: sliced, broadcast),
//! and otherwise gather a few rows at a time into a per-thread buffer
//! (`strided::map_rows`); a row whose stride is 0 is one value
//! repeated, summed without reading it N times. When the input is transposed
//! (its innermost batch dim has stride 1), sum and mean add blocks of up to
//! 1024 adjacent rows vertically, one lane per row in an L1 buffer, a whole
//! run (element k of every row: up to 4 KiB, contiguous) at a time, two runs
//! (four for bf16) per pass and two runs prefetched ahead, without gathering. Rows
//! run in parallel above [`PAR_MIN`] elements. Sums run in blocks of 1024
//! elements with independent lanes in the element's compute type (f32 for
//! f32/f16/bf16, f64 for f64: vector code, dispatched at run time to
//! AVX2/AVX-512 with `pulp`; at most 32 elements per lane in a block, as in the
//! vertical sums), and add the block totals in a wide accumulator (f64 for
//! floats, wrapping i64 for integers): as fast as a plain f32 sum, far more
//! accurate than one.
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

use crate::elementwise::PAR_MIN;
use crate::num::{Compute, Num, Real};
use crate::strided::{COL_BLOCK, Cols, ColsMut, ROW_BLOCK, RowKernel, as_u32_pairs, map_rows};

/// Elements that can be summed: in lanes of type `L`, block totals in `A`.
pub trait Summable: Num {
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
    /// bf16; `lane_sum` otherwise).
    #[inline(always)]
    fn simd_sum<S: pulp::Simd>(_simd: S, x: &[Self]) -> Self::A {
        lane_sum::<Self, LANES>(x)
    }
    /// The totals of a block of a transposed input's rows (`out` has one per
    /// row), inside pulp's dispatch (explicit SIMD for f32 and bf16;
    /// `col_sums` otherwise).
    #[inline(always)]
    fn simd_col_sums<S: pulp::Simd>(_simd: S, c: &Cols<'_, Self>, out: &mut [Self::A]) {
        col_sums(c, out)
    }
}

macro_rules! summable_float {
    ($($t:ty => $l:ty, $lane:expr $(, $simd:ident, $cols:ident)?);*) => {$(
        impl Summable for $t {
            $(#[inline(always)] fn simd_sum<S: pulp::Simd>(simd: S, x: &[Self]) -> f64 { $simd(simd, x) })?
            $(#[inline(always)] fn simd_col_sums<S: pulp::Simd>(simd: S, c: &Cols<'_, Self>, out: &mut [f64]) {
                $cols(simd, c, out)
            })?
            type L = $l;
            type A = f64;
            const AZ: f64 = 0.0;
            #[inline(always)] fn lane(self) -> $l { $lane(self) }
            #[inline(always)] fn widen(l: $l) -> f64 { l as f64 }
            #[inline(always)] fn plus(a: f64, b: f64) -> f64 { a + b }
            #[inline(always)] fn times(self, n: usize) -> f64 { Num::to_f64(self) * n as f64 }
            #[inline(always)] fn fin(a: f64) -> Self { <$t as Num>::from_f64(a) }
            #[inline(always)] fn mean(a: f64, n: usize) -> Self { <$t as Num>::from_f64(a / n as f64) }
        }
    )*};
}
summable_float!(f32 => f32, |x| x, simd_sum_f32, col_sums_f32; f64 => f64, |x| x; f16 => f32, f16::to_f32;
                bf16 => f32, crate::num::bf16_to_f32, simd_sum_bf16, col_sums_bf16);

/// [`col_sums`] for f32 in explicit SIMD. Each run of [`LANES`] elements of
/// the rows is added in f32 lanes held in an L1 buffer, a whole run (up to
/// [`COL_BLOCK`] adjacent elements, one per row) at a time, so the input is read
/// as long contiguous runs; the lanes' totals are then widened into `out`.
/// Rows past the last whole vector go to [`col_sums`].
#[inline(always)]
fn col_sums_f32<S: pulp::Simd>(simd: S, c: &Cols<'_, f32>, out: &mut [f64]) {
    let (n, w, l) = (c.n(), c.width(), S::F32_LANES);
    let wide = w / l * l;
    if wide < w {
        col_sums(&c.narrow(wide, w - wide), &mut out[wide..w]);
    }
    let out = &mut out[..wide];
    out.fill(0.0);
    let mut buf = [0.0f32; COL_BLOCK];
    let lanes = &mut buf[..wide];
    let mut k = 0;
    while k < n {
        let end = n.min(k + LANES);
        lanes.fill(0.0);
        // Two runs per pass over the lanes (each lane still adds them in order):
        // half the loads and stores of the lanes.
        while k + 1 < end {
            c.prefetch(k + AHEAD);
            c.prefetch(k + AHEAD + 1);
            let (x0, _) = S::as_simd_f32s(&c.col(k)[..wide]);
            let (x1, _) = S::as_simd_f32s(&c.col(k + 1)[..wide]);
            let (acc, _) = S::as_mut_simd_f32s(lanes);
            for ((a, &u), &v) in acc.iter_mut().zip(x0).zip(x1) {
                *a = simd.add_f32s(simd.add_f32s(*a, u), v);
            }
            k += 2;
        }
        if k < end {
            let (xs, _) = S::as_simd_f32s(&c.col(k)[..wide]);
            let (acc, _) = S::as_mut_simd_f32s(lanes);
            for (a, &x) in acc.iter_mut().zip(xs) {
                *a = simd.add_f32s(*a, x);
            }
            k += 1;
        }
        for (o, &v) in out.iter_mut().zip(lanes.iter()) {
            *o += v as f64;
        }
    }
}

/// [`col_sums`] for bf16 in explicit SIMD: each run read as u32 words holding
/// two neighbouring rows' elements (even row in the low half, odd row in the
/// high half: [`simd_sum_bf16`]'s shift and mask), added into even-row and
/// odd-row f32 lanes in L1 buffers a whole run at a time (as [`col_sums_f32`],
/// four runs per pass: its lanes cost twice the loads and stores of f32's).
#[inline(always)]
fn col_sums_bf16<S: pulp::Simd>(simd: S, c: &Cols<'_, bf16>, out: &mut [f64]) {
    let (n, w, l) = (c.n(), c.width(), S::F32_LANES);
    // Word-aligned runs (the first one and the stride even), whole vectors of words.
    let aligned = (0..n.min(2)).all(|k| as_u32_pairs(c.col(k)).0.is_empty());
    let words = if aligned && cfg!(target_endian = "little") { w / 2 / l * l } else { 0 };
    let wide = 2 * words;
    if wide < w {
        col_sums(&c.narrow(wide, w - wide), &mut out[wide..w]);
    }
    if words == 0 {
        return;
    }
    let out = &mut out[..wide];
    out.fill(0.0);
    let (mut even, mut odd) = ([0.0f32; COL_BLOCK / 2], [0.0f32; COL_BLOCK / 2]);
    let (even, odd) = (&mut even[..words], &mut odd[..words]);
    let (mask, sixteen) = (simd.splat_u32s(0xFFFF_0000), simd.splat_u32s(16));
    // A word's even-row element (its low half) and odd-row element, as f32.
    let lo = |v| simd.transmute_f32s_u32s(simd.wrapping_dyn_shl_u32s(v, sixteen));
    let hi = |v| simd.transmute_f32s_u32s(simd.and_u32s(v, mask));
    let mut k = 0;
    while k < n {
        let end = n.min(k + LANES);
        even.fill(0.0);
        odd.fill(0.0);
        // Four runs per pass over the lanes (each lane still adds them in order):
        // a quarter of the loads and stores of the lanes.
        while k + 3 < end {
            for a in 0..4 {
                c.prefetch(k + AHEAD + a);
            }
            let (_, p0, _) = as_u32_pairs(&c.col(k)[..wide]);
            let (_, p1, _) = as_u32_pairs(&c.col(k + 1)[..wide]);
            let (_, p2, _) = as_u32_pairs(&c.col(k + 2)[..wide]);
            let (_, p3, _) = as_u32_pairs(&c.col(k + 3)[..wide]);
            let ((v0, _), (v1, _)) = (S::as_simd_u32s(p0), S::as_simd_u32s(p1));
            let ((v2, _), (v3, _)) = (S::as_simd_u32s(p2), S::as_simd_u32s(p3));
            let (ev, _) = S::as_mut_simd_f32s(even);
            let (ov, _) = S::as_mut_simd_f32s(odd);
            let vs = v0.iter().zip(v1).zip(v2.iter().zip(v3));
            for ((e, o), ((&w0, &w1), (&w2, &w3))) in ev.iter_mut().zip(ov.iter_mut()).zip(vs) {
                *e = simd.add_f32s(simd.add_f32s(simd.add_f32s(simd.add_f32s(*e, lo(w0)), lo(w1)), lo(w2)), lo(w3));
                *o = simd.add_f32s(simd.add_f32s(simd.add_f32s(simd.add_f32s(*o, hi(w0)), hi(w1)), hi(w2)), hi(w3));
            }
            k += 4;
        }
        while k < end {
            let (_, pairs, _) = as_u32_pairs(&c.col(k)[..wide]);
            let (vs, _) = S::as_simd_u32s(pairs);
            let (ev, _) = S::as_mut_simd_f32s(even);
            let (ov, _) = S::as_mut_simd_f32s(odd);
            for ((e, o), &v) in ev.iter_mut().zip(ov.iter_mut()).zip(vs) {
                *e = simd.add_f32s(*e, lo(v));
                *o = simd.add_f32s(*o, hi(v));
            }
            k += 1;
        }
        for (i, (&e, &o)) in even.iter().zip(odd.iter()).enumerate() {
            out[2 * i] += e as f64;
            out[2 * i + 1] += o as f64;
        }
    }
}

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
        let mut a = [z; 8];
        let quads = head.chunks_exact(8);
        let rest = quads.remainder();
        for q in quads {
            for k in 0..8 {
                a[k] = simd.add_f32s(a[k], q[k]);
            }
        }
        for (k, &v) in rest.iter().enumerate() {
            a[k] = simd.add_f32s(a[k], v);
        }
        let (b0, b1) = (simd.add_f32s(a[0], a[4]), simd.add_f32s(a[1], a[5]));
        let (b2, b3) = (simd.add_f32s(a[2], a[6]), simd.add_f32s(a[3], a[7]));
        let mut s = simd.reduce_sum_f32s(simd.add_f32s(simd.add_f32s(b0, b1), simd.add_f32s(b2, b3)));
        for &v in tail {
            s += v;
        }
        total += s as f64;
    }
    total
}

/// The sum of a slice of bf16, read as pairs of elements in u32 words (the
/// sum does not care about order): the even element of a pair is the word
/// shifted left by 16, the odd one the word with its low half cleared -- two
/// vector ops per 32 elements, no widening shuffles. Blocks of [`BLOCK`]
/// elements in four vector accumulators (f32), block totals in f64 (as
/// [`simd_sum_f32`]).
#[inline(always)]
fn simd_sum_bf16<S: pulp::Simd>(simd: S, x: &[bf16]) -> f64 {
    let (head, pairs, tail) = as_u32_pairs(x);
    let mut total = 0.0f64;
    for &v in head.iter().chain(tail) {
        total += crate::num::bf16_to_f32(v) as f64;
    }
    let (mask, sixteen) = (simd.splat_u32s(0xFFFF_0000), simd.splat_u32s(16));
    let mut start = 0;
    while start < pairs.len() {
        let block = &pairs[start..pairs.len().min(start + BLOCK / 2)];
        start += block.len();
        let (words, rest) = S::as_simd_u32s(block);
        let z = simd.splat_f32s(0.0);
        let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
        let full = words.len() / 2 * 2;
        let mut i = 0;
        while i < full {
            let (u, v) = (words[i], words[i + 1]);
            a0 = simd.add_f32s(a0, simd.transmute_f32s_u32s(simd.wrapping_dyn_shl_u32s(u, sixteen)));
            a1 = simd.add_f32s(a1, simd.transmute_f32s_u32s(simd.and_u32s(u, mask)));
            a2 = simd.add_f32s(a2, simd.transmute_f32s_u32s(simd.wrapping_dyn_shl_u32s(v, sixteen)));
            a3 = simd.add_f32s(a3, simd.transmute_f32s_u32s(simd.and_u32s(v, mask)));
            i += 2;
        }
        if i < words.len() {
            let u = words[i];
            a0 = simd.add_f32s(a0, simd.transmute_f32s_u32s(simd.wrapping_dyn_shl_u32s(u, sixteen)));
            a1 = simd.add_f32s(a1, simd.transmute_f32s_u32s(simd.and_u32s(u, mask)));
        }
        let mut s = simd.reduce_sum_f32s(simd.add_f32s(simd.add_f32s(a0, a1), simd.add_f32s(a2, a3)));
        for &v in rest {
            s += f32::from_bits(v << 16) + f32::from_bits(v & 0xFFFF_0000);
        }
        total += s as f64;
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

/// Lanes per block sum (two AVX-512 registers of f32).
const LANES: usize = 32;
/// Lanes of softmax's max (4 AVX-512 registers of f32: independent chains).
const MAX_LANES: usize = 64;
/// Runs of a transposed input prefetched ahead of the one being added.
const AHEAD: usize = 2;
/// Elements per block before the lanes are folded into the wide accumulator.
const BLOCK: usize = 1024;

/// Sum of a slice: blocks of [`BLOCK`] elements summed in `W` independent
/// lanes of `T::L` ([`LANES`], or 64 where widening each element costs more than
/// the add), block totals added in `T::A`. (Integers wrap: lanes of i64 wrap
/// like the total would.)
#[inline(always)]
fn lane_sum<T: Summable, const W: usize>(x: &[T]) -> T::A {
    let mut total = T::AZ;
    let mut start = 0;
    while start < x.len() {
        let block = &x[start..x.len().min(start + BLOCK)];
        start += block.len();
        let mut lanes = [T::L::default(); W];
        let full = block.len() / W * W;
        let mut i = 0;
        while i < full {
            let c: &[T; W] = block[i..i + W].try_into().expect("W elements");
            for l in 0..W {
                lanes[l] = lanes[l] + c[l].lane();
            }
            i += W;
        }
        let mut w = W;
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
        crate::threads::map_reduce_chunks(x, PAR_MIN, |c| arch.dispatch(LaneSum(c)), || T::AZ, T::plus)
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

/// `T::A` of one row, inside `pulp`'s dispatch: `row` is the whole row, or its
/// one value when the row has stride 0 (then `n` is its length).
#[inline(always)]
fn row_total<T: Summable, S: pulp::Simd>(simd: S, row: &[T], n: usize) -> T::A {
    if row.len() < n { row[0].times(n) } else { T::simd_sum(simd, row) }
}

/// Totals of the rows of a transposed input's block (`out`: one per row),
/// [`ROW_BLOCK`] rows at a time, read a whole run (element k of every row) at a
/// time: runs of up to [`LANES`] elements of each row are added in `T::L` (one
/// lane per row: vector adds down the block), their totals in `T::A` -- the
/// same accuracy as [`lane_sum`]'s lanes.
#[inline(always)]
fn col_sums<T: Summable>(c: &Cols<'_, T>, out: &mut [T::A]) {
    let mut lo = 0;
    while lo < c.width() {
        let w = ROW_BLOCK.min(c.width() - lo);
        col_sums_block(&c.narrow(lo, w), &mut out[lo..lo + w]);
        lo += w;
    }
}

/// [`col_sums`] of at most [`ROW_BLOCK`] rows.
#[inline(always)]
fn col_sums_block<T: Summable>(c: &Cols<'_, T>, out: &mut [T::A]) {
    let (n, w) = (c.n(), c.width());
    let out = &mut out[..w];
    out.fill(T::AZ);
    if w == ROW_BLOCK {
        // A full block: fixed-size loops, so the lanes stay in vector registers.
        let out: &mut [T::A; ROW_BLOCK] = out.try_into().expect("a full block");
        let mut k = 0;
        while k < n {
            let end = n.min(k + LANES);
            let mut lanes = [T::L::default(); ROW_BLOCK];
            while k < end {
                let col: &[T; ROW_BLOCK] = c.col(k).try_into().expect("a full block");
                for i in 0..ROW_BLOCK {
                    lanes[i] = lanes[i] + col[i].lane();
                }
                k += 1;
            }
            for i in 0..ROW_BLOCK {
                out[i] = T::plus(out[i], T::widen(lanes[i]));
            }
        }
        return;
    }
    let mut lanes = [T::L::default(); ROW_BLOCK];
    let lanes = &mut lanes[..w];
    let mut k = 0;
    while k < n {
        let end = n.min(k + LANES);
        lanes.fill(T::L::default());
        while k < end {
            let col = &c.col(k)[..w];
            for i in 0..w {
                lanes[i] = lanes[i] + col[i].lane();
            }
            k += 1;
        }
        for i in 0..w {
            out[i] = T::plus(out[i], T::widen(lanes[i]));
        }
    }
}

/// sum (`MEAN = false`) or mean (`MEAN = true`) over the last dim.
struct SumRows<const MEAN: bool>;
impl<T: Summable + Default, const MEAN: bool> RowKernel<T, T> for SumRows<MEAN> {
    type S = u8;
    const ORDER_FREE: bool = true;
    #[inline(always)]
    fn row<V: pulp::Simd>(&self, simd: V, x: &[T], n: usize, y: &mut [T], _: &mut [u8]) {
        let total = row_total(simd, x, n);
        y[0] = if MEAN { T::mean(total, n) } else { T::fin(total) };
    }
    #[inline(always)]
    fn cols<V: pulp::Simd>(&self, simd: V, c: &Cols<'_, T>, y: &mut [T]) {
        let mut acc = [T::AZ; COL_BLOCK];
        let acc = &mut acc[..c.width()];
        T::simd_col_sums(simd, c, acc);
        for (y, &a) in y.iter_mut().zip(acc.iter()) {
            *y = if MEAN { T::mean(a, c.n()) } else { T::fin(a) };
        }
    }
}

fn sum<T: Summable + Default>(call: &mut Call<'_, '_>) -> Result<()> {
    let (x, out) = io(call)?;
    map_rows::<T, T, _>(x, out, 0, &SumRows::<false>)
}

fn mean<T: Summable + Default>(call: &mut Call<'_, '_>) -> Result<()> {
    let (x, out) = io(call)?;
    map_rows::<T, T, _>(x, out, 0, &SumRows::<true>)
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

/// Numerically stable softmax of one row: the max (64 lanes), then e^(x - max)
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
    // The max in MAX_LANES independent lanes (a plain `>` select: one vector max per
    // lane group, no dependency chain through NaN checks). A NaN is skipped here and
    // turns the row into NaN in the next pass (e^(NaN - m) is NaN, so is the sum).
    let wide = n / MAX_LANES * MAX_LANES;
    let mut lanes = [neg; MAX_LANES];
    let mut i = 0;
    while i < wide {
        let c = &x[i..i + MAX_LANES];
        for l in 0..MAX_LANES {
            let v = c[l].up();
            lanes[l] = if v > lanes[l] { v } else { lanes[l] };
        }
        i += MAX_LANES;
    }
    // A tree over the lanes (vector maxes), not a scalar fold of MAX_LANES values.
    let mut w = MAX_LANES;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            lanes[l] = if lanes[l + w] > lanes[l] { lanes[l + w] } else { lanes[l] };
        }
    }
    let mut m = lanes[0];
    for &v in &x[wide..] {
        let v = v.up();
        m = if v > m { v } else { m };
    }
    let full = n / LANES * LANES;
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
    map_rows::<T, T, _>(x, out, n, &SoftmaxRows)
}

/// [`softmax_row`] on every row.
struct SoftmaxRows;
impl<T: Real + Default> RowKernel<T, T> for SoftmaxRows
where
    T::C: Default,
{
    type S = T::C;
    const ORDER_FREE: bool = false;
    #[inline(always)]
    fn row<V: pulp::Simd>(&self, _: V, x: &[T], _: usize, y: &mut [T], tmp: &mut [T::C]) {
        softmax_row(x, y, tmp)
    }
    const COLS_FULL: bool = true;
    fn cols_full_scratch(n: usize, w: usize) -> usize {
        if size_of::<T>() == size_of::<T::C>() { 2 * w } else { w * (n + 2) }
    }
    /// [`softmax_row`] on a block of a transposed input's rows, vectorised
    /// across the rows (each element of the block's rows is one contiguous
    /// run): their maxes, then e^(x - max) with the sums (into the output
    /// itself for f32 and f64, else an f32 scratch), then the scaled output,
    /// one run at a time. A block's runs stay in L2 or L3 between the passes, so
    /// the input is read from memory once and the output written once, in
    /// runs, where a row-major output would make every call a transpose. Every
    /// pass prefetches the runs it reads 8 ahead (the input again for the
    /// second pass, the output for the third): a block (1 MiB of scratch
    /// elements) does not stay in a 1 MiB L2.
    #[inline(always)]
    fn cols_full<V: pulp::Simd>(&self, _: V, c: &Cols<'_, T>, y: &mut ColsMut<'_, T>, scratch: &mut [T::C]) {
        let (n, w) = (c.n(), c.width());
        let (m, rest) = scratch.split_at_mut(w);
        let (s, tmp) = rest.split_at_mut(w);
        m.fill(<T::C as Compute>::NEG_INF);
        s.fill(<T::C as Compute>::ZERO);
        // As in softmax_row: a NaN is skipped by the max and makes its row NaN below.
        for k in 0..n {
            c.prefetch(k + 8);
            for (m, &x) in m.iter_mut().zip(c.col(k)) {
                let v = x.up();
                *m = if v > *m { v } else { *m };
            }
        }
        if size_of::<T>() == size_of::<T::C>() {
            // f32 and f64 (math in their own type, so the output can hold e^(x - max)
            // exactly): the output is the scratch, and stays in cache for the scaling,
            // where a separate f32 scratch would be one more buffer through the caches.
            for k in 0..n {
                c.prefetch(k + 8);
                y.prefetch(k + 8);
                for ((y, s), (&x, &m)) in y.col_mut(k).iter_mut().zip(s.iter_mut()).zip(c.col(k).iter().zip(m.iter())) {
                    let e = (x.up() - m).exp();
                    *y = T::down(e);
                    *s = *s + e;
                }
            }
            for v in s.iter_mut() {
                *v = <T::C as Compute>::ONE / *v;
            }
            for k in 0..n {
                y.prefetch(k + 8);
                for (y, &s) in y.col_mut(k).iter_mut().zip(s.iter()) {
                    *y = T::down(y.up() * s);
                }
            }
            return;
        }
        let tmp = &mut tmp[..n * w];
        for (k, t) in tmp.chunks_exact_mut(w).enumerate() {
            c.prefetch(k + 8);
            for ((t, s), (&x, &m)) in t.iter_mut().zip(s.iter_mut()).zip(c.col(k).iter().zip(m.iter())) {
                let e = (x.up() - m).exp();
                *t = e;
                *s = *s + e;
            }
        }
        for v in s.iter_mut() {
            *v = <T::C as Compute>::ONE / *v;
        }
        for (k, t) in tmp.chunks_exact(w).enumerate() {
            y.prefetch(k + 8);
            for ((y, &t), &s) in y.col_mut(k).iter_mut().zip(t).zip(s.iter()) {
                *y = T::down(t * s);
            }
        }
    }
}

register_kernel!("sum<T: f32|f64|f16|bf16|i32|i64>(x: T[...B, N]) -> (y: T[...B])",
    each numbers!(sum),
    doc = "sum over the last dim (f64 accumulation for floats, wrapping i64 for integers)");
register_kernel!("mean<T: f32|f64|f16|bf16>(x: T[...B, N]) -> (y: T[...B])",
    each reals!(mean),
    doc = "mean over the last dim (NaN for an empty dim)");
register_kernel!("sum_all<T: f32|f64|f16|bf16|i32|i64>(x: T[...S]) -> (y: T[])",
    each numbers!(sum_all),
    doc = "sum of every element, as a 0-d tensor");
register_kernel!("mean_all<T: f32|f64|f16|bf16>(x: T[...S]) -> (y: T[])",
    each reals!(mean_all),
    doc = "mean of every element, as a 0-d tensor");
register_kernel!("softmax<T: f32|f64|f16|bf16>(x: T[...B, N]) -> (y: T[...B, N])",
    each reals!(softmax),
    opts = KernelOpts::DEFAULT, doc = "softmax over the last dim, max-subtracted (numerically stable)");

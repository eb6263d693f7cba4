//! Elementwise kernels: add, sub, mul, div, maximum, axpy, relu, gelu.
//!
//! Any layouts of the same shape are accepted (transposed, broadcast with zero
//! strides, sliced with steps, negative strides): `strided` (private) walks them
//! in memory order and hands each kernel runs of slices, which the loops here
//! turn into vector code (runtime dispatch to AVX2 / AVX-512 with `pulp`). Work
//! is split across dlbridge's thread pool (see `threads`) above [`PAR_MIN`] elements. An output that is
//! exactly an input (the registry refuses any other overlap) is computed in place.
// Indexed loops on purpose: they stay inside pulp's `#[target_feature]` functions
// (an iterator adaptor's `fold` may be left out of line, compiled for the baseline).
#![allow(clippy::needless_range_loop)]

use dlbridge_core::{Error, Result, Slot, TensorView, TensorViewMut};
use dlbridge_registry::{Call, KernelOpts, register_kernel};

use crate::num::{Compute, Num, Real, SliceConv};
pub use crate::strided::PAR_MIN;
use crate::strided::{RunKernel, Src, update_map, zip_map};

/// A binary element operation. A trait method marked `inline(always)` rather
/// than a closure or fn item: LLVM refuses to inline a large `Fn::call` (gelu on
/// bf16) into pulp's `#[target_feature]` function, and the out-of-line copy is
/// compiled for the baseline target, scalar.
pub trait Op2<T>: Copy + Send + Sync {
    /// `f(a, b)`
    fn apply(self, a: T, b: T) -> T;
}
/// A unary element operation (see [`Op2`]).
pub trait Op1<T>: Copy + Send + Sync {
    /// Little arithmetic per element (relu): bound by memory, so f32 runs use
    /// 256-bit vectors.
    const MEMORY_BOUND: bool = false;
    /// `f(x)`
    fn apply(self, x: T) -> T;
}

/// Any closure or fn as an operation (inlined when LLVM's heuristics allow it).
#[derive(Clone, Copy, Debug)]
pub struct FnOp<F>(pub F);
impl<T, F: Fn(T, T) -> T + Copy + Send + Sync> Op2<T> for FnOp<F> {
    #[inline(always)]
    fn apply(self, a: T, b: T) -> T {
        (self.0)(a, b)
    }
}
impl<T, F: Fn(T) -> T + Copy + Send + Sync> Op1<T> for FnOp<F> {
    #[inline(always)]
    fn apply(self, x: T) -> T {
        (self.0)(x)
    }
}

macro_rules! ops2 {
    ($($name:ident: $doc:literal $body:expr),*) => {$(
        #[doc = $doc]
        #[derive(Clone, Copy, Debug)]
        pub struct $name;
        impl<T: Num> Op2<T> for $name {
            #[inline(always)]
            fn apply(self, a: T, b: T) -> T {
                let f: fn(T, T) -> T = $body;
                f(a, b)
            }
        }
    )*};
}
ops2!(Add: "a + b" |a: T, b: T| a.add(b), Sub: "a - b" |a: T, b: T| a.sub(b), Mul: "a * b" |a: T, b: T| a.mul(b),
      Div: "a / b" |a: T, b: T| a.div(b), Maximum: "max(a, b)" |a: T, b: T| a.maximum(b));

/// `y + alpha * x` (axpy's operation).
#[derive(Clone, Copy, Debug)]
struct Axpy<T>(T);
impl<T: Num> Op2<T> for Axpy<T> {
    #[inline(always)]
    fn apply(self, y: T, x: T) -> T {
        y.add(self.0.mul(x))
    }
}

/// max(x, 0)
#[derive(Clone, Copy, Debug)]
pub struct Relu;
impl<T: Num> Op1<T> for Relu {
    const MEMORY_BOUND: bool = true;
    #[inline(always)]
    fn apply(self, x: T) -> T {
        x.maximum(T::zero())
    }
}

/// gelu with the exact erf, computed in `T::C`: `0.5 x (1 + erf(x / sqrt 2))`
/// ([`crate::num::gelu_f32`] for f32, f16 and bf16).
#[derive(Clone, Copy, Debug)]
pub struct Gelu;
impl<T: Real> Op1<T> for Gelu {
    #[inline(always)]
    fn apply(self, x: T) -> T {
        T::down(x.up().gelu())
    }
}

/// `o[i] = f(a[i], b[i])` over one run, for every kind of source: each arm is a
/// plain indexed loop (no iterator adaptors: those are separate functions that
/// would not be compiled for the dispatched instruction set) that the compiler
/// vectorises, at the widest instruction set the CPU has (see [`Run2`]).
#[inline(always)]
fn run2<T: Num>(o: &mut [T], a: &Src<'_, T>, b: &Src<'_, T>, op: impl Op2<T>) {
    let f = |x, y| op.apply(x, y);
    let n = o.len();
    match (a, b) {
        (Src::Slice(x), Src::Slice(y)) => {
            let (x, y) = (&x[..n], &y[..n]);
            for i in 0..n {
                o[i] = f(x[i], y[i]);
            }
        }
        (Src::Slice(x), &Src::Splat(y)) => {
            let x = &x[..n];
            for i in 0..n {
                o[i] = f(x[i], y);
            }
        }
        (&Src::Splat(x), Src::Slice(y)) => {
            let y = &y[..n];
            for i in 0..n {
                o[i] = f(x, y[i]);
            }
        }
        (&Src::Splat(x), &Src::Splat(y)) => {
            let v = f(x, y);
            for o in o.iter_mut() {
                *o = v;
            }
        }
        (Src::Out, Src::Slice(y)) => {
            let y = &y[..n];
            for i in 0..n {
                o[i] = f(o[i], y[i]);
            }
        }
        (Src::Slice(x), Src::Out) => {
            let x = &x[..n];
            for i in 0..n {
                o[i] = f(x[i], o[i]);
            }
        }
        (Src::Out, &Src::Splat(y)) => {
            for i in 0..n {
                o[i] = f(o[i], y);
            }
        }
        (&Src::Splat(x), Src::Out) => {
            for i in 0..n {
                o[i] = f(x, o[i]);
            }
        }
        (Src::Out, Src::Out) => {
            for i in 0..n {
                o[i] = f(o[i], o[i]);
            }
        }
    }
}

/// `o[i] = f(x[i])` over one run (indexed loops, as in [`run2`]).
#[inline(always)]
fn run1<T: Num>(o: &mut [T], x: &Src<'_, T>, op: impl Op1<T>) {
    let f = |x| op.apply(x);
    let n = o.len();
    match x {
        Src::Slice(x) => {
            let x = &x[..n];
            for i in 0..n {
                o[i] = f(x[i]);
            }
        }
        &Src::Splat(x) => {
            let v = f(x);
            for o in o.iter_mut() {
                *o = v;
            }
        }
        Src::Out => {
            for i in 0..n {
                o[i] = f(o[i]);
            }
        }
    }
}

/// [`run2`] as a [`RunKernel`]: inlined, with the strided walk, into the function
/// `pulp` compiles for AVX2 / AVX-512 (a closure would not do: its body is a
/// separate function compiled for the baseline target).
struct Run2<F>(F);
impl<T: Num, F: Op2<T>> RunKernel<T, 2> for Run2<F> {
    #[inline(always)]
    fn run(&self, o: &mut [T], [a, b]: [Src<'_, T>; 2]) {
        run2(o, &a, &b, self.0)
    }
}

/// [`run1`] as a [`RunKernel`] (see [`Run2`]).
struct Run1<F>(F);
impl<T: Num, F: Op1<T>> RunKernel<T, 1> for Run1<F> {
    const MEMORY_BOUND: bool = F::MEMORY_BOUND;
    #[inline(always)]
    fn run(&self, o: &mut [T], [x]: [Src<'_, T>; 1]) {
        run1(o, &x, self.0)
    }
}

/// gelu as a [`RunKernel`]. Where [`Real::down_slice`] narrows faster than the
/// fused loop (bf16 with AVX512-BF16), a run is computed in f32 a block at a
/// time into a buffer that stays in L1, then narrowed. The fused loop is
/// compute-bound, and the software rounding is ~8 of its ~30 vector
/// instructions, where `vcvtneps2bf16` narrows 16 lanes in one. It holds
/// `T::down_slice()`, asked once per call rather than once per run.
struct GeluRun<T: Real>(Option<SliceConv<T::C, T>>);
impl<T: Real> RunKernel<T, 1> for GeluRun<T> {
    #[inline(always)]
    fn run(&self, o: &mut [T], [x]: [Src<'_, T>; 1]) {
        const BLOCK: usize = 256;
        match (self.0, &x) {
            (Some(down), Src::Slice(x)) => {
                let mut buf = [<T::C as Compute>::ZERO; BLOCK];
                let n = o.len();
                let mut i = 0;
                while i < n {
                    let m = BLOCK.min(n - i);
                    let (xs, os) = (&x[i..i + m], &mut o[i..i + m]);
                    for j in 0..m {
                        buf[j] = xs[j].up().gelu();
                    }
                    down(&buf[..m], os);
                    i += m;
                }
            }
            _ => run1(o, &x, Gelu),
        }
    }
}

/// `o = o + alpha * x` (axpy) as a [`RunKernel`] for [`update_map`].
struct AxpyRun<T>(T);
impl<T: Num> RunKernel<T, 1> for AxpyRun<T> {
    #[inline(always)]
    fn run(&self, o: &mut [T], [x]: [Src<'_, T>; 1]) {
        run2(o, &Src::Out, &x, Axpy(self.0))
    }
}

/// `out = f(a, b)` over any layouts of the same shape (the body of add, sub,
/// mul, ...; public so benchmarks can call a kernel without the registry).
/// `out` may be exactly `a` or `b`.
pub fn map2<T: Num>(
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    f: impl Fn(T, T) -> T + Sync + Send + Copy,
) -> Result<()> {
    map2_op(a, b, out, FnOp(f))
}

/// [`map2`] with an [`Op2`] (always inlined into the vector loop).
pub fn map2_op<T: Num>(a: &TensorView<'_>, b: &TensorView<'_>, out: &mut TensorViewMut<'_>, f: impl Op2<T>) -> Result<()> {
    zip_map::<T, 2>(out, [a, b], &Run2(f))
}

/// `out = f(x)` over any layouts of the same shape; `out` may be exactly `x`.
pub fn map1<T: Num>(x: &TensorView<'_>, out: &mut TensorViewMut<'_>, f: impl Fn(T) -> T + Sync + Send + Copy) -> Result<()> {
    map1_op(x, out, FnOp(f))
}

/// [`map1`] with an [`Op1`] (always inlined into the vector loop).
pub fn map1_op<T: Num>(x: &TensorView<'_>, out: &mut TensorViewMut<'_>, f: impl Op1<T>) -> Result<()> {
    zip_map::<T, 1>(out, [x], &Run1(f))
}

fn binary<T: Num>(call: &mut Call<'_, '_>, f: impl Op2<T>) -> Result<()> {
    let (ins, mut outs) = call.io();
    map2_op(ins.tensor("a")?, ins.tensor("b")?, outs.take("out")?, f)
}

fn unary<T: Num>(call: &mut Call<'_, '_>, f: impl Op1<T>) -> Result<()> {
    let (ins, mut outs) = call.io();
    map1_op(ins.tensor("x")?, outs.take("y")?, f)
}

fn add<T: Num>(call: &mut Call<'_, '_>) -> Result<()> {
    binary::<T>(call, Add)
}
fn sub<T: Num>(call: &mut Call<'_, '_>) -> Result<()> {
    binary::<T>(call, Sub)
}
fn mul<T: Num>(call: &mut Call<'_, '_>) -> Result<()> {
    binary::<T>(call, Mul)
}
fn maximum<T: Num>(call: &mut Call<'_, '_>) -> Result<()> {
    binary::<T>(call, Maximum)
}

fn div<T: Num>(call: &mut Call<'_, '_>) -> Result<()> {
    let kernel = call.kernel_name();
    let (ins, mut outs) = call.io();
    let (a, b) = (ins.tensor("a")?, ins.tensor("b")?);
    if T::IS_INT && b.iter::<T>()?.any(|v| v == T::zero()) {
        return Err(Error::InvalidArgument("integer division by zero (it has a zero)".into()).at(kernel, Slot::Argument("b".into())));
    }
    map2_op::<T>(a, b, outs.take("out")?, Div)
}

fn relu<T: Num>(call: &mut Call<'_, '_>) -> Result<()> {
    unary::<T>(call, Relu)
}

fn gelu<T: Real>(call: &mut Call<'_, '_>) -> Result<()> {
    let (ins, mut outs) = call.io();
    zip_map::<T, 1>(outs.take("y")?, [ins.tensor("x")?], &GeluRun(T::down_slice()))
}

fn axpy<T: Num>(call: &mut Call<'_, '_>) -> Result<()> {
    let (ins, mut outs) = call.io();
    let (alpha, x, y) = (T::from_f64(ins.f64("alpha")?), ins.tensor("x")?, outs.take("y")?);
    // y is both an input (read first) and the output: y = y + alpha * x.
    update_map::<T, 1>(y, [x], &AxpyRun(alpha))
}

/// The binary elementwise kernels: `name<T>(a: T[...S], b: T[...S]) -> (out: T[...S])`
/// (broadcasting) over every [`Num`] type, one line each.
macro_rules! binary_kernels {
    ($($name:ident: $doc:literal,)+) => {$(
        register_kernel!(concat!(stringify!($name), "<T: f32|f64|f16|bf16|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])"),
            each numbers!($name), opts = KernelOpts::ELEMENTWISE, doc = $doc);
    )+};
}
binary_kernels! {
    add: "elementwise a + b (integers wrap)",
    sub: "elementwise a - b (integers wrap)",
    mul: "elementwise a * b (integers wrap)",
    div: "elementwise a / b (integer: truncating; a zero divisor is an error)",
    maximum: "elementwise max(a, b), NaN-propagating",
}
register_kernel!("relu<T: f32|f64|f16|bf16|i32|i64>(x: T[...S]) -> (y: T[...S])",
    each numbers!(relu),
    opts = KernelOpts::ELEMENTWISE, doc = "max(x, 0), NaN-propagating");
register_kernel!("gelu<T: f32|f64|f16|bf16>(x: T[...S]) -> (y: T[...S])",
    each reals!(gelu),
    opts = KernelOpts::ELEMENTWISE, doc = "x * Phi(x) with the exact erf (torch's approximate='none')");
register_kernel!("axpy<T: f32|f64|f16|bf16>(alpha: f64, x: T[N], y: mut T[N])",
    each reals!(axpy),
    doc = "y += alpha * x, in place");

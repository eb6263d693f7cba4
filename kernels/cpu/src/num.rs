//! Numeric traits the kernels are generic over.

use dlbridge_core::Element;
use dlbridge_core::half::{bf16, f16};

/// Elements the arithmetic kernels handle. Integer ops wrap (never panic).
pub trait Scalar: Element + PartialOrd + Default {
    /// Whether this is an integer type (division by zero must be refused).
    const IS_INT: bool;
    /// Zero.
    fn zero() -> Self;
    /// `a + b`
    fn add(self, b: Self) -> Self;
    /// `a - b`
    fn sub(self, b: Self) -> Self;
    /// `a * b`
    fn mul(self, b: Self) -> Self;
    /// `a / b` (callers refuse integer division by zero first).
    fn div(self, b: Self) -> Self;
    /// `max(a, b)`, propagating NaN like torch.maximum.
    fn maximum(self, b: Self) -> Self;
    /// To f64 (for scalar arguments and accumulation).
    fn to_f64(self) -> f64;
    /// From f64 (rounding; integers truncate, saturating).
    fn from_f64(x: f64) -> Self;
}

macro_rules! int_scalar {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            const IS_INT: bool = true;
            fn zero() -> Self { 0 }
            #[inline(always)] fn add(self, b: Self) -> Self { self.wrapping_add(b) }
            #[inline(always)] fn sub(self, b: Self) -> Self { self.wrapping_sub(b) }
            #[inline(always)] fn mul(self, b: Self) -> Self { self.wrapping_mul(b) }
            #[inline(always)] fn div(self, b: Self) -> Self { if b == 0 { 0 } else { self.wrapping_div(b) } }
            #[inline(always)] fn maximum(self, b: Self) -> Self { if self > b { self } else { b } }
            #[inline(always)] fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)] fn from_f64(x: f64) -> Self { x as $t }
        }
    )*};
}
int_scalar!(i32, i64);

macro_rules! float_scalar {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            const IS_INT: bool = false;
            fn zero() -> Self { 0.0 }
            #[inline(always)] fn add(self, b: Self) -> Self { self + b }
            #[inline(always)] fn sub(self, b: Self) -> Self { self - b }
            #[inline(always)] fn mul(self, b: Self) -> Self { self * b }
            #[inline(always)] fn div(self, b: Self) -> Self { self / b }
            #[inline(always)] fn maximum(self, b: Self) -> Self { if self.is_nan() || self > b { self } else { b } }
            #[inline(always)] fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)] fn from_f64(x: f64) -> Self { x as $t }
        }
    )*};
}
float_scalar!(f32, f64);

macro_rules! half_scalar {
    ($($t:ty => $up:path, $down:path);*) => {$(
        impl Scalar for $t {
            const IS_INT: bool = false;
            fn zero() -> Self { <$t>::ZERO }
            #[inline(always)] fn add(self, b: Self) -> Self { $down($up(self) + $up(b)) }
            #[inline(always)] fn sub(self, b: Self) -> Self { $down($up(self) - $up(b)) }
            #[inline(always)] fn mul(self, b: Self) -> Self { $down($up(self) * $up(b)) }
            #[inline(always)] fn div(self, b: Self) -> Self { $down($up(self) / $up(b)) }
            #[inline(always)] fn maximum(self, b: Self) -> Self {
                // Exact (both values are representable), and branch-free so it vectorises.
                let (a, b) = ($up(self), $up(b));
                $down(if a.is_nan() || a > b { a } else { b })
            }
            #[inline(always)] fn to_f64(self) -> f64 { self.to_f64() }
            #[inline(always)] fn from_f64(x: f64) -> Self { <$t>::from_f64(x) }
        }
    )*};
}
half_scalar!(f16 => f16::to_f32, f16::from_f32; bf16 => bf16_to_f32, f32_to_bf16);

/// bf16 -> f32 (exact: the bf16 bits are the f32's upper half). A shift, so loops over it vectorise.
#[inline(always)]
pub fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

/// f32 -> bf16, rounding to nearest even like `bf16::from_f32` (NaN stays a quiet
/// NaN with its sign), but branch-free so loops over it vectorise.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> bf16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x40;
    bf16::from_bits(if x.is_nan() { nan } else { rounded } as u16)
}

/// Floating-point elements: computed in `C` (f32 for f32/f16/bf16, f64 for f64).
pub trait Real: Scalar {
    /// The type the math runs in.
    type C: Compute;
    /// Widen.
    fn up(self) -> Self::C;
    /// Narrow (round to nearest).
    fn down(c: Self::C) -> Self;
}

/// The math the float kernels need, on f32 and f64.
pub trait Compute:
    Copy
    + Send
    + Sync
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::iter::Sum
{
    /// 0
    const ZERO: Self;
    /// 1
    const ONE: Self;
    /// -inf
    const NEG_INF: Self;
    /// e^x
    fn exp(self) -> Self;
    /// The error function.
    fn erf(self) -> Self;
    /// From f64.
    fn of(x: f64) -> Self;
    /// NaN check.
    fn is_nan(self) -> bool;
}

/// e^x for f32 without a libm call, so loops over it vectorise (SSE2 is
/// enough): x = n*ln2 + r with |r| <= ln2/2, e^r by a degree-6 polynomial,
/// 2^n by building the exponent bits. Max relative error ~2e-7 (about 2 ulp)
/// over the normal range; 0 below -87.3 (where f32 would go subnormal), +inf
/// above 88.7, NaN for NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding and subtracting rounds to an integer
    let xc = x.clamp(-87.336_54, 88.722_83);
    let shifted = xc * LOG2E + ROUND;
    let n = shifted - ROUND;
    // The integer n sits in the low mantissa bits of `shifted` (no float->int
    // conversion, whose saturating semantics would stop vectorisation).
    let ni = shifted.to_bits() as i32 - 0x4B40_0000;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // 2^n as two normal powers of two (n is in [-126, 128]): no overflow at either end.
    let half = ni >> 1;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((ni - half + 127) as u32) << 23);
    let y = p * s1 * s2;
    if x < -87.336_54 {
        0.0
    } else if x > 88.722_83 {
        f32::INFINITY
    } else {
        y
    }
}

/// erf for f32 without a libm call (Abramowitz & Stegun 7.1.26 on |x|, with
/// [`exp_f32`]); max absolute error below 1e-6 in f32 arithmetic (the formula's
/// own bound is 1.5e-7), vectorisable.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t * (0.254_829_6 + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let y = 1.0 - poly * exp_f32(-a * a);
    // Near 0 the series is exact to f32 precision (and erf(0) is exactly 0).
    let x2 = x * x;
    let series = x * (std::f32::consts::FRAC_2_SQRT_PI * (1.0 + x2 * (-1.0 / 3.0 + x2 * (0.1 + x2 * (-1.0 / 42.0)))));
    if x.is_nan() {
        x
    } else if a < 0.3 {
        series
    } else {
        y.copysign(x)
    }
}

impl Compute for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    const NEG_INF: f32 = f32::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> f32 {
        exp_f32(self)
    }
    #[inline(always)]
    fn erf(self) -> f32 {
        erf_f32(self)
    }
    #[inline(always)]
    fn of(x: f64) -> f32 {
        x as f32
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

impl Compute for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    const NEG_INF: f64 = f64::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> f64 {
        f64::exp(self)
    }
    #[inline(always)]
    fn erf(self) -> f64 {
        libm::erf(self)
    }
    #[inline(always)]
    fn of(x: f64) -> f64 {
        x
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}

impl Real for f32 {
    type C = f32;
    #[inline(always)]
    fn up(self) -> f32 {
        self
    }
    #[inline(always)]
    fn down(c: f32) -> f32 {
        c
    }
}
impl Real for f64 {
    type C = f64;
    #[inline(always)]
    fn up(self) -> f64 {
        self
    }
    #[inline(always)]
    fn down(c: f64) -> f64 {
        c
    }
}
impl Real for f16 {
    type C = f32;
    #[inline(always)]
    fn up(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn down(c: f32) -> f16 {
        f16::from_f32(c)
    }
}
impl Real for bf16 {
    type C = f32;
    #[inline(always)]
    fn up(self) -> f32 {
        bf16_to_f32(self)
    }
    #[inline(always)]
    fn down(c: f32) -> bf16 {
        f32_to_bf16(c)
    }
}

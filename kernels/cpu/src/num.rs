//! Numeric traits the kernels are generic over.

use dlbridge_core::Element;
use dlbridge_core::half::{bf16, f16};

pub use crate::convert::{SliceConv, bf16_to_f32, f32_to_bf16};

/// Elements the arithmetic kernels handle. Integer ops wrap (never panic).
pub trait Num: Element + PartialOrd + Default {
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
        impl Num for $t {
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
        impl Num for $t {
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
        impl Num for $t {
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

/// Floating-point elements: computed in `C` (f32 for f32/f16/bf16, f64 for f64).
pub trait Real: Num {
    /// The type the math runs in.
    type C: Compute;
    /// Widen.
    fn up(self) -> Self::C;
    /// Narrow (round to nearest).
    fn down(c: Self::C) -> Self;
    /// [`Real::down`] over a slice, where the CPU narrows faster a vector at a
    /// time than the compiler's code for `down` does (bf16 with AVX512-BF16);
    /// None elsewhere. It gives the same values as `down`.
    #[inline(always)]
    fn down_slice() -> Option<SliceConv<Self::C, Self>> {
        None
    }
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
    /// gelu with the exact erf: `x/2 (1 + erf(x / sqrt 2))`.
    fn gelu(self) -> Self;
    /// From f64.
    fn of(x: f64) -> Self;
    /// NaN check.
    fn is_nan(self) -> bool;
}

/// e^x for f32 without a libm call, so loops over it vectorise: x = n*ln2 + r
/// with |r| <= ln2/2, e^r by a degree-6 polynomial (fused multiply-adds where
/// the CPU has them: `mul_add` is exact either way, so every path gives the
/// same bits), 2^n by building the exponent bits. Max relative error ~2e-7
/// (about 2 ulp) over the normal range; 0 below -87.3 (where f32 would go
/// subnormal), +inf above 88.7, NaN for NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding and subtracting rounds to an integer
    let xc = x.clamp(-87.336_54, 88.722_83);
    let shifted = xc.mul_add(LOG2E, ROUND);
    let n = shifted - ROUND;
    // The integer n sits in the low mantissa bits of `shifted` (no float->int
    // conversion, whose saturating semantics would stop vectorisation).
    let ni = shifted.to_bits() as i32 - 0x4B40_0000;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, xc));
    let mut p: f32 = 1.0 / 720.0;
    p = p.mul_add(r, 1.0 / 120.0);
    p = p.mul_add(r, 1.0 / 24.0);
    p = p.mul_add(r, 1.0 / 6.0);
    p = p.mul_add(r, 0.5);
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
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

/// `P(x2) / Q(x2)`, each polynomial by Horner's rule with fused
/// multiply-adds (coefficients highest power first).
#[inline(always)]
fn ratio<const P: usize, const Q: usize>(x2: f32, p: &[f32; P], q: &[f32; Q]) -> f32 {
    let horner = |c: &[f32]| c[1..].iter().fold(c[0], |acc, &k| acc.mul_add(x2, k));
    horner(p) / horner(q)
}

/// erf for f32 without a libm call: x P(x^2) / Q(x^2) on [-4, 4] (the rational
/// approximation Eigen and XLA use for f32; P of degree 6 and Q of degree 4 in
/// x^2, Horner with fused multiply-adds), +-1 where erf rounds to +-1 in f32
/// (|x| >= 3.9). About 16 vector operations and one division per lane; max
/// absolute error 3.3e-7 (measured against libm over [-6, 6]), NaN for NaN.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let xc = x.clamp(-4.0, 4.0);
    let y = xc * ratio(xc * xc, &ERF_PF, &ERF_QF);
    if xc.abs() >= 3.9 { 1.0f32.copysign(x) } else { y }
}

/// The rational erf's coefficients, highest power of x^2 first: numerator
/// (times x) and denominator (see [`erf_f32`]).
const ERF_P: [f64; 7] = [
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
];
const ERF_Q: [f64; 5] = [-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03, -1.42647390514189e-02];

/// The coefficients rounded to f32.
const fn to_f32<const N: usize>(c: [f64; N]) -> [f32; N] {
    let mut out = [0.0f32; N];
    let mut i = 0;
    while i < N {
        out[i] = c[i] as f32;
        i += 1;
    }
    out
}

/// `c[i] * scale / 2^k` for the coefficient of x^(2k) (highest power first):
/// a polynomial in (x/sqrt 2)^2 rewritten as one in x^2.
const fn fold<const N: usize>(c: [f64; N], scale: f64) -> [f32; N] {
    let mut out = [0.0f32; N];
    let mut i = 0;
    while i < N {
        let mut p = 1.0f64;
        let mut k = 0;
        while k < N - 1 - i {
            p *= 2.0;
            k += 1;
        }
        out[i] = (c[i] * scale / p) as f32;
        i += 1;
    }
    out
}
const ERF_PF: [f32; 7] = to_f32(ERF_P);
const ERF_QF: [f32; 5] = to_f32(ERF_Q);
const GELU_P: [f32; 7] = fold(ERF_P, std::f64::consts::FRAC_1_SQRT_2);
const GELU_Q: [f32; 5] = fold(ERF_Q, 1.0);

/// gelu for f32: `x/2 (1 + erf(x / sqrt 2))` with [`erf_f32`]'s rational
/// approximation, the 1/sqrt 2 folded into its coefficients and the last step
/// one fused multiply-add (`x/2 + x/2 * erf`): three vector operations fewer.
/// `erf` is +-1 for |x| >= 3.9 sqrt 2, as in [`erf_f32`]; NaN stays NaN.
#[inline(always)]
pub fn gelu_f32(x: f32) -> f32 {
    const LIM: f32 = (4.0 * std::f64::consts::SQRT_2) as f32;
    const ONE_AT: f32 = (3.9 * std::f64::consts::SQRT_2) as f32;
    let half = 0.5 * x;
    let xc = x.clamp(-LIM, LIM);
    let e = xc * ratio(xc * xc, &GELU_P, &GELU_Q);
    let e = if xc.abs() >= ONE_AT { 1.0f32.copysign(x) } else { e };
    half.mul_add(e, half)
}

/// The constants, `of` and `is_nan` of a primitive float type.
macro_rules! float_basics {
    ($t:ty) => {
        const ZERO: $t = 0.0;
        const ONE: $t = 1.0;
        const NEG_INF: $t = <$t>::NEG_INFINITY;
        #[inline(always)]
        fn of(x: f64) -> $t {
            x as $t
        }
        #[inline(always)]
        fn is_nan(self) -> bool {
            <$t>::is_nan(self)
        }
    };
}

impl Compute for f32 {
    float_basics!(f32);
    #[inline(always)]
    fn exp(self) -> f32 {
        exp_f32(self)
    }
    #[inline(always)]
    fn erf(self) -> f32 {
        erf_f32(self)
    }
    #[inline(always)]
    fn gelu(self) -> f32 {
        gelu_f32(self)
    }
}

impl Compute for f64 {
    float_basics!(f64);
    #[inline(always)]
    fn exp(self) -> f64 {
        f64::exp(self)
    }
    #[inline(always)]
    fn erf(self) -> f64 {
        libm::erf(self)
    }
    #[inline(always)]
    fn gelu(self) -> f64 {
        0.5 * self * (1.0 + libm::erf(self * std::f64::consts::FRAC_1_SQRT_2))
    }
}

/// f32 and f64 compute in themselves.
macro_rules! computes_in_itself {
    ($($t:ty),+) => {$(
        impl Real for $t {
            type C = $t;
            #[inline(always)]
            fn up(self) -> $t {
                self
            }
            #[inline(always)]
            fn down(c: $t) -> $t {
                c
            }
        }
    )+};
}
computes_in_itself!(f32, f64);
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
    #[inline(always)]
    fn down_slice() -> Option<SliceConv<f32, bf16>> {
        crate::strided::narrow_bf16_fn()
    }
}

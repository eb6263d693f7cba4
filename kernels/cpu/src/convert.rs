//! Conversions between f32 and bf16 the kernels share: the scalar ones (written
//! so that loops over them vectorise) and the type of a whole-slice conversion.

use dlbridge_core::half::bf16;

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

/// A conversion of a whole slice, `dst[i] = f(src[i])` (see [`Real::down_slice`](crate::num::Real::down_slice)).
pub type SliceConv<S, D> = fn(&[S], &mut [D]);

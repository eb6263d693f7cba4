//! The vectorisable exp and erf against the standard library, over the whole f32 range.

use dlbridge_cpu::num::{erf_f32, exp_f32};

#[test]
fn exp_f32_is_within_3_ulp_of_std_over_the_normal_range() {
    let mut worst = 0.0f64;
    let mut x = -87.0f32;
    while x < 88.5 {
        let (got, want) = (exp_f32(x) as f64, (x as f64).exp());
        worst = worst.max(((got - want) / want).abs());
        x += 0.000_731;
    }
    assert!(worst < 3.0 * f32::EPSILON as f64, "max relative error {worst:e}");
}

#[test]
fn exp_f32_edge_cases() {
    assert_eq!(exp_f32(0.0), 1.0);
    assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_f32(-1000.0), 0.0);
    assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(exp_f32(89.0), f32::INFINITY);
    assert!(exp_f32(f32::NAN).is_nan());
}

#[test]
fn erf_f32_is_within_1e6_of_the_reference() {
    let mut worst = 0.0f64;
    let mut x = -6.0f32;
    while x < 6.0 {
        let got = erf_f32(x) as f64;
        let want = libm::erf(x as f64);
        worst = worst.max((got - want).abs());
        x += 0.000_37;
    }
    assert!(worst < 1e-6, "max absolute error {worst:e}");
    assert_eq!(erf_f32(0.0), 0.0);
    assert!(erf_f32(f32::NAN).is_nan());
    assert_eq!(erf_f32(f32::INFINITY), 1.0);
    assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
}

#[test]
fn bf16_conversions_match_the_half_crate_bit_for_bit_except_nan_payloads() {
    use dlbridge_core::half::bf16;
    use dlbridge_cpu::num::{bf16_to_f32, f32_to_bf16};
    for bits in 0..=u16::MAX {
        let b = bf16::from_bits(bits);
        let (got, want) = (bf16_to_f32(b), b.to_f32());
        if want.is_nan() {
            // half quiets signalling NaNs; the shift keeps the payload: NaN either way, same sign.
            assert!(got.is_nan() && got.is_sign_negative() == want.is_sign_negative(), "{bits:#06x}");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{bits:#06x}");
        }
    }
    // Every rounding case: all upper halves with a spread of lower halves (ties included).
    for hi in (0..=u16::MAX as u32).step_by(3) {
        for lo in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234] {
            let x = f32::from_bits(hi << 16 | lo);
            assert_eq!(f32_to_bf16(x).to_bits(), bf16::from_f32(x).to_bits(), "{:#010x}", x.to_bits());
        }
    }
}

#[test]
fn gelu_f32_is_within_2e6_absolute_and_1e5_relative_of_the_erf_reference() {
    use dlbridge_cpu::elementwise::{Gelu, Op1};
    let mut worst_abs = 0.0f64;
    let mut x = -10.0f32;
    while x < 10.0 {
        let got = Op1::<f32>::apply(Gelu, x) as f64;
        let xd = x as f64;
        let want = 0.5 * xd * (1.0 + libm::erf(xd / std::f64::consts::SQRT_2));
        worst_abs = worst_abs.max((got - want).abs());
        assert!((got - want).abs() <= 2e-6 + 1e-5 * want.abs(), "gelu({x}) = {got}, want {want}");
        x += 0.000_61;
    }
    assert!(worst_abs < 2e-6, "max absolute error {worst_abs:e}");
}

#[test]
fn gelu_f32_edge_cases() {
    use dlbridge_cpu::num::gelu_f32;
    assert_eq!(gelu_f32(0.0), 0.0);
    // erf is exactly 1 from 3.9 sqrt 2 on, so gelu(x) is x there.
    for x in [5.6f32, 10.0, 1e6, f32::MAX] {
        assert_eq!(gelu_f32(x), x);
    }
    for x in [-5.6f32, -10.0, -1e6] {
        assert_eq!(gelu_f32(x), 0.0, "gelu({x})");
    }
    assert_eq!(gelu_f32(f32::INFINITY), f32::INFINITY);
    // -inf/2 * (1 + erf(-inf)) is -inf * 0: NaN, as torch gives.
    assert!(gelu_f32(f32::NEG_INFINITY).is_nan());
    assert!(gelu_f32(f32::NAN).is_nan());
}

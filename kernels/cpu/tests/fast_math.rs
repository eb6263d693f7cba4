//! The vectorisable exp and erf against the standard library, over the whole f32 range.

use dlbridge_kernels_cpu::num::{erf_f32, exp_f32};

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

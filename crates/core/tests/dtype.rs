use dlbridge_core::{DType, DTypeCode, Device, DeviceType, ErrorKind};

#[test]
fn every_dlpack_dtype_displays_and_parses_back() {
    let all = DType::all_scalar();
    assert!(all.len() >= 30, "all DLPack 1.3 codes with their widths: {}", all.len());
    for code in 0u8..=17 {
        assert!(all.iter().any(|d| d.code() as u8 == code), "code {code} missing");
    }
    for d in all {
        let text = d.to_string();
        assert_eq!(text.parse::<DType>().unwrap(), d, "{text}");
        let vec4 = d.with_lanes(4).unwrap();
        assert_eq!(vec4.to_string().parse::<DType>().unwrap(), vec4);
    }
}

#[test]
fn common_names_are_the_short_ones() {
    assert_eq!(DType::F32.to_string(), "f32");
    assert_eq!(DType::BF16.to_string(), "bf16");
    assert_eq!(DType::C64.to_string(), "c64");
    assert_eq!(DType::BOOL.to_string(), "bool");
    assert_eq!(DType::F8_E4M3FN.to_string(), "f8_e4m3fn");
    assert_eq!("float32".parse::<DType>().unwrap(), DType::F32);
    assert_eq!("f32x4".parse::<DType>().unwrap().lanes(), 4);
}

#[test]
fn bad_dtype_strings_are_type_errors() {
    for bad in ["", "f", "f33", "x4", "f32x", "f32x0", "q8", "i7", "bool16", "f32x99999999"] {
        let e = bad.parse::<DType>().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Type, "{bad}");
    }
}

#[test]
fn raw_codes_beyond_dlpack_are_rejected() {
    for code in 18u8..=255 {
        assert!(DTypeCode::from_u8(code).is_none());
    }
}

#[test]
fn sizes_and_alignment_follow_the_dtype() {
    assert_eq!(DType::C128.itemsize(), Some(16));
    assert_eq!(DType::C128.alignment(), 8);
    assert_eq!(DType::F4_E2M1FN.itemsize(), None);
    assert_eq!(DType::F4_E2M1FN.storage_bits(true), 8);
    assert_eq!(DType::F32.with_lanes(4).unwrap().itemsize(), Some(16));
}

#[test]
fn devices_are_named_and_unknown_codes_representable() {
    assert_eq!(Device::CPU.to_string(), "cpu");
    assert_eq!(Device::cuda(1).to_string(), "cuda:1");
    assert!(!DeviceType(99).is_known());
    assert_eq!(DeviceType(99).to_string(), "unknown(99)");
    for code in [1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18] {
        assert!(DeviceType(code).is_known(), "{code}");
    }
    for code in [0, 5, 6, 19] {
        assert!(!DeviceType(code).is_known(), "{code}");
    }
}

#[test]
fn numpy_names_parse_and_the_x_inside_complex_is_not_a_lane_count() {
    assert_eq!("complex64".parse::<DType>().unwrap(), DType::C64);
    assert_eq!("complex128".parse::<DType>().unwrap(), DType::C128);
    assert_eq!("float32".parse::<DType>().unwrap(), DType::F32);
    assert_eq!("f32x4".parse::<DType>().unwrap().lanes(), 4);
}

#[test]
fn lanes_parse_after_every_kind_of_name() {
    assert_eq!("boolx4".parse::<DType>().unwrap().lanes(), 4);
    assert_eq!("complex128x2".parse::<DType>().unwrap().lanes(), 2);
}

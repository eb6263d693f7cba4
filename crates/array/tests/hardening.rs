//! Allocation failures are errors, constructors refuse what the validator
//! refuses, and every single-lane dtype reads back as plain scalars.

use dlbridge_array::{Array, Item};
use dlbridge_core::num_complex::Complex;
use dlbridge_core::testing::{Fields, ForeignTensor};
use dlbridge_core::{DType, ErrorKind, Flags, ManagedTensor};

/// An f32 Array of `shape` whose every stride is 0: one element of real memory.
/// The ForeignTensor must outlive the Array.
fn broadcast(foreign: &mut ForeignTensor) -> Array {
    // SAFETY: the ForeignTensor outlives the Array (callers keep it alive).
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    Array::from_managed(t).unwrap()
}

fn broadcast_fields(shape: &[i64]) -> Fields {
    Fields {
        strides: Some(vec![0; shape.len()]),
        shape: Some(shape.to_vec()),
        ndim: shape.len() as i32,
        buffer_bytes: 4,
        ..Fields::f32(&[1])
    }
}

fn values(a: &Array) -> Vec<Item> {
    a.items().unwrap().collect::<Result<_, _>>().unwrap()
}

fn floats(a: &Array) -> Vec<f64> {
    values(a)
        .into_iter()
        .map(|s| match s {
            Item::Float(f) => f,
            other => panic!("expected a float, got {other:?}"),
        })
        .collect()
}

fn same(got: &[f64], want: &[f64]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(g, w)| (g.is_nan() && w.is_nan()) || g == w)
}

#[test]
fn zeros_of_256_tib_is_an_out_of_memory_error_not_an_abort() {
    let e = Array::zeros(DType::F32, &[1 << 46]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Memory, "{e}");
    assert!(e.to_string().contains("281474976710656 bytes"), "{e}");
    let e = Array::arange(1 << 46, DType::F32).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Memory, "{e}");
    let e = Array::zeros(DType::C128, &[1 << 20, 1 << 24]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Memory, "{e}");
    // 2^60 bytes: beyond any 57-bit address space, whatever the overcommit policy.
    let e = Array::zeros(DType::F32, &[1 << 58]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Memory, "{e}");
}

#[test]
fn copies_of_a_broadcast_array_are_out_of_memory_errors() {
    let mut foreign = ForeignTensor::new(&broadcast_fields(&[1 << 46]));
    let a = broadcast(&mut foreign);
    assert_eq!(a.numel(), 1 << 46);
    a.check().unwrap();
    assert_eq!(a.contiguous().unwrap_err().kind(), ErrorKind::Memory);
    assert_eq!(a.to_vec::<f32>().unwrap_err().kind(), ErrorKind::Memory);
    assert_eq!(a.view().to_vec::<f32>().unwrap_err().kind(), ErrorKind::Memory);
    // Reading one element at a time needs no allocation.
    assert_eq!(a.items().unwrap().next().unwrap().unwrap(), Item::Float(0.0));
    drop(a);
    assert_eq!(foreign.deleter_calls(), 1);
}

#[test]
fn constructors_refuse_more_than_max_ndim_dims() {
    let ok = [1i64; 64];
    assert_eq!(Array::zeros(DType::F32, &ok).unwrap().ndim(), 64);
    let too_many = [1i64; 65];
    for e in [
        Array::zeros(DType::F32, &too_many).unwrap_err(),
        Array::from_slice(&[1.0f32], &too_many).unwrap_err(),
        Array::from_bytes(DType::U8, &too_many, &[0]).unwrap_err(),
        Array::zeros(DType::F32, &[0; 1000]).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Value, "{e}");
        assert!(e.to_string().contains("64"), "{e}");
    }
}

#[test]
fn constructors_refuse_negative_dims_and_sizes_that_overflow() {
    for (dtype, shape) in [
        (DType::F32, vec![2, -1]),
        (DType::F32, vec![i64::MIN]),
        (DType::F32, vec![i64::MAX, 2]),
        (DType::F32, vec![1 << 62, 1 << 62]),
        (DType::F64, vec![1 << 62]), // element count fits, bytes (2^65) do not
        (DType::F32, vec![1 << 61]), // 2^63 bytes: more than isize::MAX
    ] {
        let e = Array::zeros(dtype, &shape).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Value, "{shape:?}: {e}");
    }
    assert_eq!(Array::arange(-1, DType::I32).unwrap_err().kind(), ErrorKind::Value);
    // A zero dim makes any other dim harmless.
    assert_eq!(Array::zeros(DType::F32, &[0, i64::MAX]).unwrap().numel(), 0);
}

#[test]
fn from_bytes_checks_the_byte_count() {
    assert_eq!(Array::from_bytes(DType::F32, &[2], &[0; 7]).unwrap_err().kind(), ErrorKind::Value);
    assert_eq!(Array::from_bytes(DType::F4_E2M1FN, &[3], &[0; 2]).unwrap().shape(), &[3]);
    let a = Array::from_bytes(DType::I16, &[2], &[1, 0, 0xFF, 0xFF]).unwrap();
    if cfg!(target_endian = "little") {
        assert_eq!(a.to_vec::<i16>().unwrap(), vec![1, -1]);
    }
}

#[test]
fn slice_steps_of_any_size_never_panic() {
    let a = Array::arange(10, DType::I32).unwrap();
    assert_eq!(a.slice(0, 9, -11, i64::MIN).unwrap().to_vec::<i32>().unwrap(), vec![9]);
    assert_eq!(a.slice(0, 0, 10, i64::MIN).unwrap().numel(), 0);
    assert_eq!(a.slice(0, 0, 10, i64::MAX).unwrap().to_vec::<i32>().unwrap(), vec![0]);
    assert_eq!(a.slice(0, i64::MIN, i64::MAX, 1).unwrap().numel(), 10);
    assert_eq!(a.slice(0, i64::MAX, i64::MIN, -1).unwrap().numel(), 10);
    assert!(a.slice(usize::MAX, 0, 1, 1).is_err());
    for s in [a.slice(0, 9, -11, i64::MIN).unwrap(), a.slice(0, 0, 10, i64::MAX).unwrap()] {
        s.check().unwrap();
    }
}

#[test]
fn every_view_operation_keeps_the_validated_extent() {
    let a = Array::arange(24, DType::F64).unwrap();
    let a = Array::from_slice(&a.to_vec::<f64>().unwrap(), &[2, 3, 4]).unwrap();
    let views = [
        a.clone(),
        a.swap_axes(0, 2).unwrap(),
        a.permute(&[1, 2, 0]).unwrap(),
        a.slice(2, -1, -5, -2).unwrap(),
        a.slice(1, 1, 3, 1).unwrap().swap_axes(0, 1).unwrap(),
        a.slice(0, 1, 1, 1).unwrap(),
        Array::from_managed(a.slice(2, 3, 0, -1).unwrap().to_managed().unwrap()).unwrap(),
    ];
    for v in &views {
        v.check().unwrap();
        assert_eq!(v.numel(), v.shape().iter().product::<i64>() as usize);
    }
    assert_eq!(views[3].to_vec::<f64>().unwrap()[..2], [3.0, 1.0]);
}

#[test]
fn scalars_read_every_integer_width_and_bool() {
    let a = Array::from_slice(&[-3i8, 127], &[2]).unwrap();
    assert_eq!(values(&a), vec![Item::Int(-3), Item::Int(127)]);
    let a = Array::from_slice(&[u64::MAX, 0], &[2]).unwrap();
    assert_eq!(values(&a), vec![Item::UInt(u64::MAX), Item::UInt(0)]);
    let a = Array::from_slice(&[i64::MIN, -1], &[2]).unwrap();
    assert_eq!(values(&a), vec![Item::Int(i64::MIN), Item::Int(-1)]);
    let a = Array::from_slice(&[-300i16, 300], &[2]).unwrap();
    assert_eq!(values(&a), vec![Item::Int(-300), Item::Int(300)]);
    let a = Array::from_slice(&[u32::MAX], &[1]).unwrap();
    assert_eq!(values(&a), vec![Item::UInt(u64::from(u32::MAX))]);
    let a = Array::from_bytes(DType::BOOL, &[3], &[0, 1, 2]).unwrap();
    assert_eq!(values(&a), vec![Item::Bool(false), Item::Bool(true), Item::Bool(true)]);
}

#[test]
fn scalars_unpack_sub_byte_integers_low_bits_first() {
    let i4: DType = "i4".parse().unwrap();
    let a = Array::from_bytes(i4, &[3], &[0xF7, 0x08]).unwrap();
    assert_eq!(values(&a), vec![Item::Int(7), Item::Int(-1), Item::Int(-8)]);
    let u4: DType = "u4".parse().unwrap();
    let a = Array::from_bytes(u4, &[2], &[0xF7]).unwrap();
    assert_eq!(values(&a), vec![Item::UInt(7), Item::UInt(15)]);
    let i1: DType = "i1".parse().unwrap();
    let a = Array::from_bytes(i1, &[3], &[0b101]).unwrap();
    assert_eq!(values(&a), vec![Item::Int(-1), Item::Int(0), Item::Int(-1)]);
    let u2: DType = "u2".parse().unwrap();
    let a = Array::from_bytes(u2, &[4], &[0b11_10_01_00]).unwrap();
    assert_eq!(values(&a), vec![Item::UInt(0), Item::UInt(1), Item::UInt(2), Item::UInt(3)]);
}

#[test]
fn scalars_decode_half_and_bfloat16() {
    use dlbridge_core::half::{bf16, f16};
    let a = Array::from_slice(&[f16::from_f32(1.5), f16::INFINITY, f16::from_f32(-0.0)], &[3]).unwrap();
    let got = floats(&a);
    assert_eq!(got[..2], [1.5, f64::INFINITY]);
    assert!(got[2] == 0.0 && got[2].is_sign_negative());
    let a = Array::from_slice(&[bf16::from_f32(3.0), bf16::NAN], &[2]).unwrap();
    assert!(same(&floats(&a), &[3.0, f64::NAN]));
}

#[test]
fn scalars_decode_every_float8_format() {
    let nan = f64::NAN;
    let inf = f64::INFINITY;
    let cases: [(&str, &[u8], &[f64]); 8] = [
        ("f8_e4m3fn", &[0x38, 0x7E, 0x7F, 0xFF, 0x01, 0xB8, 0x00], &[1.0, 448.0, nan, nan, 2f64.powi(-9), -1.0, 0.0]),
        ("f8_e5m2", &[0x3C, 0x7C, 0xFC, 0x7D, 0x7B, 0x01], &[1.0, inf, -inf, nan, 57344.0, 2f64.powi(-16)]),
        ("f8_e4m3fnuz", &[0x40, 0x80, 0x00, 0x7F, 0xC0], &[1.0, nan, 0.0, 240.0, -1.0]),
        ("f8_e5m2fnuz", &[0x40, 0x80, 0x7F], &[1.0, nan, 57344.0]),
        ("f8_e4m3b11fnuz", &[0x58, 0x80, 0x7F], &[1.0, nan, 30.0]),
        ("f8_e3m4", &[0x30, 0x70, 0x7F, 0x6F], &[1.0, inf, nan, 15.5]),
        ("f8_e4m3", &[0x38, 0x78, 0x77, 0xF8], &[1.0, inf, 240.0, -inf]),
        ("f8_e8m0fnu", &[0x7F, 0x80, 0xFF, 0x00], &[1.0, 2.0, nan, 2f64.powi(-127)]),
    ];
    for (name, bytes, want) in cases {
        let a = Array::from_bytes(name.parse().unwrap(), &[bytes.len() as i64], bytes).unwrap();
        let got = floats(&a);
        assert!(same(&got, want), "{name}: got {got:?}, want {want:?}");
    }
}

#[test]
fn scalars_decode_packed_float4_and_float6_across_byte_boundaries() {
    // float4_e2m1fn codes 1, 2, 3, 7 (0.5, 1, 1.5, 6), low nibble first.
    let a = Array::from_bytes(DType::F4_E2M1FN, &[2, 2], &[0x21, 0x73]).unwrap();
    assert_eq!(floats(&a), vec![0.5, 1.0, 1.5, 6.0]);
    // The transpose reads packed elements through strides.
    assert_eq!(floats(&a.t().unwrap()), vec![0.5, 1.5, 1.0, 6.0]);
    let a = Array::from_bytes(DType::F4_E2M1FN, &[2], &[0xF8]).unwrap();
    let got = floats(&a);
    assert!(got[0] == 0.0 && got[0].is_sign_negative());
    assert_eq!(got[1], -6.0);
    // float6_e2m3fn: 0b001000 (1.0) then 0b011111 (7.5), the second straddling two bytes.
    let a = Array::from_bytes("f6_e2m3fn".parse().unwrap(), &[2], &[0xC8, 0x07]).unwrap();
    assert_eq!(floats(&a), vec![1.0, 7.5]);
    // float6_e3m2fn: max finite 28 (0b011111), then 0.0625 (subnormal 0b000001).
    let a = Array::from_bytes("f6_e3m2fn".parse().unwrap(), &[2], &[0x5F, 0x00]).unwrap();
    assert_eq!(floats(&a), vec![28.0, 0.0625]);
}

#[test]
fn scalars_read_padded_sub_byte_elements_one_per_byte() {
    let fields = Fields {
        dtype: (17, 4, 1), // float4_e2m1fn
        flags: Flags::IS_SUBBYTE_TYPE_PADDED.bits(),
        buffer_bytes: 3,
        ..Fields::f32(&[3])
    };
    let mut foreign = ForeignTensor::new(&fields);
    foreign.buffer_mut()[..3].copy_from_slice(&[0x01, 0x07, 0x0A]);
    // SAFETY: the ForeignTensor outlives the Array.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    let a = Array::from_managed(t).unwrap();
    assert_eq!(floats(&a), vec![0.5, 6.0, -1.0]);
}

#[test]
fn scalars_read_complex_values_through_any_strides() {
    let a = Array::from_slice(&[Complex::new(1.0f32, -2.0), Complex::new(3.0, 4.0)], &[2]).unwrap();
    assert_eq!(values(&a), vec![Item::Complex(1.0, -2.0), Item::Complex(3.0, 4.0)]);
    let a = Array::from_slice(&[Complex::new(1.0f64, 2.0), Complex::new(3.0, 4.0)], &[2]).unwrap();
    assert_eq!(values(&a.slice(0, -1, -3, -1).unwrap()), vec![Item::Complex(3.0, 4.0), Item::Complex(1.0, 2.0)]);
    // complex32: two f16 halves (1.0 = 0x3C00, -0.5 = 0xB800).
    let c32: DType = "c32".parse().unwrap();
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&0x3C00u16.to_ne_bytes());
    bytes.extend_from_slice(&0xB800u16.to_ne_bytes());
    let a = Array::from_bytes(c32, &[1], &bytes).unwrap();
    assert_eq!(values(&a), vec![Item::Complex(1.0, -0.5)]);
}

#[test]
fn scalars_of_a_0d_array_and_an_empty_array() {
    assert_eq!(values(&Array::zeros(DType::F64, &[]).unwrap()), vec![Item::Float(0.0)]);
    assert!(values(&Array::zeros(DType::F64, &[3, 0]).unwrap()).is_empty());
}

#[test]
fn scalars_refuse_vector_and_handle_dtypes_naming_them() {
    for name in ["f32x4", "handle64", "i8x2"] {
        let a = Array::zeros(name.parse().unwrap(), &[2]).unwrap();
        let e = a.items().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Type, "{name}: {e}");
        assert!(e.to_string().contains(name), "{name}: {e}");
    }
}

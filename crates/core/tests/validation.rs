//! One test per validation rule of a foreign DLTensor.

use dlbridge_core::testing::{Fields, ForeignTensor};
use dlbridge_core::{DType, Error, ErrorKind, Flags, ManagedTensor, TensorView, TensorViewMut};

/// Imports `fields` as a versioned tensor; returns the result and the deleter count after drop.
fn import(fields: &Fields) -> (Result<(), Error>, usize) {
    let mut foreign = ForeignTensor::new(fields);
    // SAFETY: the ForeignTensor owns every array and outlives the ManagedTensor.
    let result = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.map(drop);
    (result, foreign.deleter_calls())
}

fn expect_err(fields: &Fields, needle: &str) -> Error {
    let (result, calls) = import(fields);
    let err = result.expect_err("descriptor must be rejected");
    assert!(err.to_string().contains(needle), "error {err:?} should mention {needle:?}");
    assert_eq!(calls, 1, "the deleter runs exactly once on the error path");
    err
}

#[test]
fn negative_ndim_is_rejected_naming_the_field() {
    let f = Fields { ndim: -1, ..Fields::f32(&[2]) };
    expect_err(&f, "ndim");
}

#[test]
fn ndim_above_the_limit_is_rejected() {
    let f = Fields { ndim: 65, shape: Some(vec![1; 65]), ..Fields::f32(&[1]) };
    expect_err(&f, "ndim");
}

#[test]
fn negative_dim_is_rejected_naming_its_index() {
    let f = Fields { shape: Some(vec![2, -3]), ndim: 2, ..Fields::f32(&[2, 3]) };
    let e = expect_err(&f, "shape[1]");
    assert!(e.to_string().contains("-3"));
    assert_eq!(e.kind(), ErrorKind::Value);
}

#[test]
fn element_count_overflow_is_rejected() {
    let f = Fields { shape: Some(vec![i64::MAX, i64::MAX, 4]), ndim: 3, ..Fields::f32(&[1, 1, 1]) };
    expect_err(&f, "overflow");
}

#[test]
fn byte_extent_overflow_is_rejected() {
    let f = Fields { shape: Some(vec![1 << 40]), strides: Some(vec![1 << 40]), ndim: 1, ..Fields::f32(&[1]) };
    expect_err(&f, "overflow");
}

#[test]
fn null_data_is_rejected_for_non_empty_tensors() {
    let f = Fields { data_override: Some(0), ..Fields::f32(&[3]) };
    expect_err(&f, "NULL");
}

#[test]
fn null_data_is_accepted_for_zero_size_tensors() {
    let f = Fields { data_override: Some(0), ..Fields::f32(&[3, 0]) };
    let mut foreign = ForeignTensor::new(&f);
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    assert_eq!(t.view().numel(), 0);
    assert_eq!(t.view().as_slice::<f32>().unwrap(), &[] as &[f32]);
    assert_eq!(t.view().extent().span(), 0);
}

#[test]
fn null_shape_with_dims_is_rejected() {
    let f = Fields { shape: None, ..Fields::f32(&[3]) };
    expect_err(&f, "shape");
}

#[test]
fn zero_dim_tensor_may_have_null_shape() {
    let f = Fields { shape: None, ndim: 0, buffer_bytes: 4, ..Fields::f32(&[]) };
    let mut foreign = ForeignTensor::new(&f);
    foreign.buffer_mut()[..4].copy_from_slice(&7.5f32.to_ne_bytes());
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    assert_eq!(t.view().numel(), 1);
    assert_eq!(t.view().as_slice::<f32>().unwrap(), &[7.5]);
}

#[test]
fn unknown_dtype_code_is_a_type_error() {
    let f = Fields { dtype: (42, 32, 1), ..Fields::f32(&[2]) };
    let e = expect_err(&f, "code 42");
    assert_eq!(e.kind(), ErrorKind::Type);
}

#[test]
fn dtype_bits_the_code_does_not_allow_are_rejected() {
    let f = Fields { dtype: (2, 24, 1), ..Fields::f32(&[2]) };
    expect_err(&f, "bits 24");
}

#[test]
fn zero_lanes_are_rejected() {
    let f = Fields { dtype: (2, 32, 0), ..Fields::f32(&[2]) };
    expect_err(&f, "lanes");
}

#[test]
fn unknown_device_code_is_rejected() {
    let f = Fields { device: (99, 0), ..Fields::f32(&[2]) };
    let e = expect_err(&f, "device type code 99");
    assert_eq!(e.kind(), ErrorKind::Buffer);
}

#[test]
fn negative_device_id_is_rejected() {
    let f = Fields { device: (2, -1), ..Fields::f32(&[2]) };
    expect_err(&f, "device_id");
}

#[test]
fn a_cpu_device_id_other_than_zero_is_rejected() {
    for id in [1, 5, i32::MAX] {
        let f = Fields { device: (1, id), ..Fields::f32(&[2]) };
        expect_err(&f, "device.device_id");
    }
}

#[test]
fn misaligned_data_is_rejected() {
    let f = Fields { byte_offset: 2, buffer_bytes: 16, ..Fields::f32(&[2]) };
    expect_err(&f, "aligned");
}

#[test]
fn byte_offset_is_applied() {
    let f = Fields { byte_offset: 8, buffer_bytes: 16, ..Fields::f32(&[2]) };
    let mut foreign = ForeignTensor::new(&f);
    for (i, v) in [0.0f32, 1.0, 2.0, 3.0].iter().enumerate() {
        foreign.buffer_mut()[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
    }
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    assert_eq!(t.view().as_slice::<f32>().unwrap(), &[2.0, 3.0]);
    assert_eq!(t.view().data_ptr() as usize, foreign.buffer_addr() + 8);
}

#[test]
fn null_strides_mean_compact_row_major() {
    let f = Fields::f32(&[2, 3, 4]);
    let mut foreign = ForeignTensor::new(&f);
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    assert_eq!(t.strides(), &[12, 4, 1]);
    assert!(t.view().is_contiguous());
    assert_eq!(t.view().extent().span(), 24 * 4);
}

#[test]
fn size_one_dims_may_carry_any_stride() {
    let data = [1.0f32, 2.0, 3.0];
    let shape = [1, 3, 1];
    let strides = [12345, 1, -999];
    let v = TensorView::from_slice_strided(&data, &shape, Some(&strides), 0).unwrap();
    assert!(v.is_contiguous());
    assert_eq!(v.as_slice::<f32>().unwrap(), &data);
    assert_eq!(v.extent().span(), 12);
}

#[test]
fn zero_strides_broadcast_and_cover_one_element() {
    let data = [5.0f64];
    let shape = [3, 2];
    let strides = [0, 0];
    let v = TensorView::from_slice_strided(&data, &shape, Some(&strides), 0).unwrap();
    assert_eq!(v.numel(), 6);
    assert_eq!(v.extent().span(), 8);
    assert_eq!(v.to_vec::<f64>().unwrap(), vec![5.0; 6]);
    assert!(!v.is_non_overlapping());
}

#[test]
fn negative_strides_read_in_reverse_and_cover_the_right_bytes() {
    let data: Vec<i32> = (0..6).collect();
    let shape = [2, 3];
    let strides = [3, -1];
    // Element [0, 0] is data[2]; rows read 2,1,0 and 5,4,3.
    let v = TensorView::from_slice_strided(&data, &shape, Some(&strides), 2).unwrap();
    assert_eq!(v.to_vec::<i32>().unwrap(), vec![2, 1, 0, 5, 4, 3]);
    assert_eq!(v.extent().byte_lo, -8);
    assert_eq!(v.extent().byte_hi, 16);
    assert!(!v.is_contiguous());
    assert!(v.as_slice::<i32>().is_err());
}

#[test]
fn strided_view_outside_its_slice_is_rejected() {
    let data = [0i32; 4];
    let shape = [3];
    let strides = [2];
    let e = TensorView::from_slice_strided(&data, &shape, Some(&strides), 0).unwrap_err();
    assert!(e.to_string().contains("reaches bytes"), "{e}");
}

#[test]
fn as_slice_checks_the_dtype() {
    let data = [1.0f32, 2.0];
    let shape = [2];
    let v = TensorView::from_slice(&data, &shape).unwrap();
    let e = v.as_slice::<f64>().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Type);
    assert!(e.to_string().contains("expected f64, got f32"), "{e}");
}

#[test]
fn transposed_view_iterates_in_logical_order() {
    let data: Vec<f32> = (0..6).map(|x| x as f32).collect();
    let shape = [3, 2];
    let strides = [1, 3];
    let v = TensorView::from_slice_strided(&data, &shape, Some(&strides), 0).unwrap();
    assert_eq!(v.to_vec::<f32>().unwrap(), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
}

#[test]
fn writable_view_is_refused_for_read_only_tensors() {
    let f = Fields { flags: Flags::READ_ONLY.bits(), ..Fields::f32(&[2]) };
    let mut foreign = ForeignTensor::new(&f);
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let mut t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    assert!(t.is_read_only());
    let e = t.view_mut().unwrap_err();
    assert!(matches!(e, Error::ReadOnly { .. }), "{e:?}");
}

#[test]
fn writable_view_is_refused_when_elements_share_memory() {
    let mut data = [0i64; 4];
    let shape = [2, 2];
    let strides = [1, 1];
    let e = TensorViewMut::from_slice_strided_mut(&mut data, &shape, Some(&strides), 0).unwrap_err();
    assert!(e.to_string().contains("same memory"), "{e}");
}

#[test]
fn writable_strided_view_writes_only_its_elements() {
    let mut data = [0i32; 6];
    let shape = [3];
    let strides = [-2];
    let mut v = TensorViewMut::from_slice_strided_mut(&mut data, &shape, Some(&strides), 5).unwrap();
    for (i, x) in v.iter_mut::<i32>().unwrap().enumerate() {
        *x = i as i32 + 10;
    }
    assert_eq!(data, [0, 12, 0, 11, 0, 10]);
}

#[test]
fn address_space_wrap_is_rejected() {
    let f = Fields { byte_offset: u64::MAX - 3, ..Fields::f32(&[4]) };
    expect_err(&f, "address space");
}

#[test]
fn packed_subbyte_extent_counts_bits() {
    // float4_e2m1fn, 5 elements packed: 20 bits -> 3 bytes.
    let f = Fields { dtype: (17, 4, 1), buffer_bytes: 3, ..Fields::f32(&[5]) };
    let mut foreign = ForeignTensor::new(&f);
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    assert_eq!(t.dtype(), DType::F4_E2M1FN);
    assert_eq!(t.view().extent().span(), 3);
    assert_eq!(t.view().as_bytes().unwrap().len(), 3);
}

#[test]
fn padded_subbyte_flag_gives_a_byte_per_element() {
    let f = Fields { dtype: (17, 4, 1), flags: Flags::IS_SUBBYTE_TYPE_PADDED.bits(), buffer_bytes: 5, ..Fields::f32(&[5]) };
    let mut foreign = ForeignTensor::new(&f);
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    assert!(t.is_subbyte_padded());
    assert_eq!(t.view().extent().span(), 5);
}

#[test]
fn error_kinds_map_to_stable_codes() {
    for kind in [ErrorKind::Type, ErrorKind::Value, ErrorKind::Buffer, ErrorKind::NotFound, ErrorKind::Runtime] {
        assert_eq!(ErrorKind::from_code(kind.code()), kind);
        assert_ne!(kind.code(), 0);
    }
    let e = Error::Shape("x".into()).context("matmul: argument b");
    assert_eq!(e.kind(), ErrorKind::Value);
    assert_eq!(e.to_string(), "matmul: argument b: shape mismatch: x");
}

#[test]
fn a_strided_view_reaching_past_user_space_is_rejected_before_any_read() {
    // Two elements 2^60 bytes apart: representable in 64 bits, but no process
    // has memory there (user space ends below 2^57), so nothing may be read.
    let f = Fields { strides: Some(vec![1 << 58]), ..Fields::f32(&[2]) };
    let e = expect_err(&f, "reaches outside the user address space");
    assert!(e.to_string().contains("user memory ends below 2^57"), "{e}");
    // The largest reach that stays in user space from a real allocation is fine.
    let near = Fields { strides: Some(vec![1 << 40]), ..Fields::f32(&[2]) };
    assert!(import(&near).0.is_ok());
}

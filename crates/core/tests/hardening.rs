//! ndim is bounded before anything reads shape/strides, copies out of a view
//! are fallible allocations, and the layout helpers the buffer protocol uses.

use dlbridge_core::layout::{is_contiguous, is_f_contiguous};
use dlbridge_core::testing::{Fields, ForeignTensor};
use dlbridge_core::{DType, ErrorKind, ManagedTensor, TensorDesc, TensorView};

fn import_err(fields: &Fields) -> dlbridge_core::Error {
    let mut foreign = ForeignTensor::new(fields);
    // SAFETY: the ForeignTensor owns every array it points to and outlives the ManagedTensor.
    let e = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap_err();
    assert_eq!(foreign.deleter_calls(), 1);
    e
}

#[test]
fn ndim_is_checked_before_shape_and_strides_are_read() {
    // 65 dims with NULL shape and strides: the error names ndim, so shape was never looked at.
    let e = import_err(&Fields { ndim: 65, shape: None, strides: None, ..Fields::f32(&[1]) });
    assert!(e.to_string().contains("ndim"), "{e}");
    assert!(!e.to_string().contains("`shape`"), "{e}");
    // A huge ndim over a one-entry shape array: refused without reading past it.
    for ndim in [65, 1 << 20, i32::MAX] {
        let e = import_err(&Fields { ndim, ..Fields::f32(&[1]) });
        assert_eq!(e.kind(), ErrorKind::Value, "{e}");
        assert!(e.to_string().contains("ndim"), "{e}");
    }
    // And through the legacy struct too.
    let mut foreign = ForeignTensor::new(&Fields { ndim: 65, shape: None, ..Fields::f32(&[1]) });
    // SAFETY: as above.
    let e = unsafe { ManagedTensor::from_raw_legacy(foreign.legacy_ptr()) }.unwrap_err();
    assert!(e.to_string().contains("ndim"), "{e}");
}

#[test]
fn exports_refuse_more_than_max_ndim_dims() {
    let shape = [1i64; 65];
    let e = ManagedTensor::from_vec(vec![0.0f32], &shape).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value);
    assert!(e.to_string().contains("ndim"), "{e}");
    let mut data = [0u8; 1];
    let desc = TensorDesc::contiguous(DType::U8, &shape);
    // SAFETY: one readable, writable byte that outlives the (refused) export.
    let e = unsafe { ManagedTensor::export_owner((), data.as_mut_ptr().cast(), &desc) }.unwrap_err();
    assert!(e.to_string().contains("ndim"), "{e}");
}

#[test]
fn copying_a_broadcast_view_of_2_pow_46_elements_is_out_of_memory() {
    let one = [1.0f32];
    let shape = [1i64 << 46];
    let v = TensorView::from_slice_strided(&one, &shape, Some(&[0]), 0).unwrap();
    let e = v.to_vec::<f32>().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Memory, "{e}");
    assert!(e.to_string().contains("out of memory"), "{e}");
    // A small one still copies.
    let shape = [3i64];
    let v = TensorView::from_slice_strided(&one, &shape, Some(&[0]), 0).unwrap();
    assert_eq!(v.to_vec::<f32>().unwrap(), vec![1.0; 3]);
}

#[test]
fn span_bytes_cover_exactly_the_memory_a_layout_touches() {
    let data: Vec<u16> = (0..6).collect();
    let shape = [3i64];
    // Negative stride from the last element: the span starts 4 elements before element [0].
    let v = TensorView::from_slice_strided(&data, &shape, Some(&[-2]), 4).unwrap();
    let (bytes, first) = v.span_bytes().unwrap();
    assert_eq!((bytes.len(), first), (10, 8));
    assert_eq!(u16::from_ne_bytes([bytes[first], bytes[first + 1]]), 4);
    // Zero strides: one element of memory however large the shape.
    let shape = [1000i64, 1000];
    let v = TensorView::from_slice_strided(&data, &shape, Some(&[0, 0]), 5).unwrap();
    assert_eq!(v.span_bytes().unwrap().0.len(), 2);
    let shape = [0i64];
    let v = TensorView::from_slice_strided(&data, &shape, Some(&[1]), 0).unwrap();
    assert!(v.span_bytes().unwrap().0.is_empty());
}

#[test]
fn fortran_contiguity_is_c_contiguity_of_the_reversed_layout() {
    assert!(is_f_contiguous(&[3, 4], &[1, 3]));
    assert!(!is_f_contiguous(&[3, 4], &[4, 1]));
    assert!(is_contiguous(&[3, 4], &[4, 1]));
    assert!(is_f_contiguous(&[3, 1], &[1, 99]), "size-1 dims may carry any stride");
    assert!(is_f_contiguous(&[5], &[1]) && is_contiguous(&[5], &[1]));
    assert!(is_f_contiguous(&[0, 4], &[7, 7]), "empty tensors are contiguous");
    assert!(!is_f_contiguous(&[2, 2], &[0, 0]), "broadcast layouts are not");
    assert!(!is_f_contiguous(&[2, 2], &[1]), "strides must match the shape");
}

#[test]
fn a_legacy_tensor_is_handed_back_as_the_same_pointer() {
    let mut foreign = ForeignTensor::new(&Fields::f32(&[2]));
    let ptr = foreign.legacy_ptr();
    // SAFETY: the ForeignTensor outlives every use of the pointer.
    let t = unsafe { ManagedTensor::from_raw_legacy(ptr) }.unwrap();
    assert_eq!(t.into_raw_legacy().unwrap(), ptr);
    assert_eq!(foreign.deleter_calls(), 0, "ownership passed on, not released");
    let mut foreign = ForeignTensor::new(&Fields::f32(&[2]));
    let ptr = foreign.versioned_ptr();
    // SAFETY: as above.
    let t = unsafe { ManagedTensor::from_raw_versioned(ptr) }.unwrap();
    assert_eq!(t.into_raw_versioned(), ptr);
    assert_eq!(foreign.deleter_calls(), 0);
}

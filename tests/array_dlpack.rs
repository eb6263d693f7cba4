//! Array <-> DLPack across both struct flavours, as another framework would see it.

use dlbridge::{Array, ManagedTensor};
use dlbridge_tests::iota_matrix;

#[test]
fn array_survives_a_legacy_and_versioned_hand_off_without_copies() {
    let a = iota_matrix(3, 4).unwrap();
    let ptr = a.data_ptr();
    let view = a.slice(1, 3, -5, -2).unwrap(); // columns 3 and 1: negative stride
    let expected = view.to_vec::<f32>().unwrap();
    let legacy = view.into_managed().unwrap().into_raw_legacy().unwrap();
    drop(a);
    // SAFETY: `legacy` was just handed over by into_raw_legacy.
    let t = unsafe { ManagedTensor::from_raw_legacy(legacy) }.unwrap();
    let back = Array::from_managed(t).unwrap();
    assert_eq!(back.data_ptr() as usize, ptr as usize + 3 * 4);
    assert_eq!(back.strides(), &[4, -2]);
    assert_eq!(back.to_vec::<f32>().unwrap(), expected);
    assert_eq!(expected, vec![3.0, 1.0, 7.0, 5.0, 11.0, 9.0]);
}

#[test]
fn demo_runs_and_proves_zero_copy() {
    let report = dlbridge::demo::array_round_trip().unwrap();
    assert!(report.contains("pointers equal = true"));
}

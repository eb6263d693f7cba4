//! Ownership: the deleter runs exactly once on every path; exports are zero copy.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dlbridge_core::testing::{Fields, ForeignTensor};
use dlbridge_core::{DType, Error, ErrorKind, ManagedTensor};

#[test]
fn deleter_runs_once_on_drop() {
    let mut foreign = ForeignTensor::new(&Fields::f32(&[4]));
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    assert_eq!(foreign.deleter_calls(), 0);
    drop(t);
    assert_eq!(foreign.deleter_calls(), 1);
}

#[test]
fn deleter_runs_once_when_validation_fails() {
    let mut foreign = ForeignTensor::new(&Fields { dtype: (200, 8, 1), ..Fields::f32(&[4]) });
    // SAFETY: the ForeignTensor outlives the call.
    let e = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Type);
    assert_eq!(foreign.deleter_calls(), 1);
}

#[test]
fn deleter_runs_once_during_unwinding() {
    let mut foreign = ForeignTensor::new(&Fields::f32(&[4]));
    let ptr = foreign.versioned_ptr() as usize;
    let result = std::panic::catch_unwind(move || {
        // SAFETY: the ForeignTensor outlives this closure.
        let _t = unsafe { ManagedTensor::from_raw_versioned(ptr as *mut _) }.unwrap();
        panic!("boom while holding a tensor");
    });
    assert!(result.is_err());
    assert_eq!(foreign.deleter_calls(), 1);
}

#[test]
fn future_major_version_is_refused_and_released() {
    let mut foreign = ForeignTensor::new(&Fields { version: (2, 0), ..Fields::f32(&[4]) });
    // SAFETY: the ForeignTensor outlives the call.
    let e = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap_err();
    assert!(matches!(e, Error::UnsupportedVersion { major: 2, .. }), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::Buffer);
    assert_eq!(foreign.deleter_calls(), 1);
}

#[test]
fn future_minor_version_is_accepted() {
    let mut foreign = ForeignTensor::new(&Fields { version: (1, 9), ..Fields::f32(&[4]) });
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    assert_eq!(t.version(), Some((1, 9)));
}

#[test]
fn null_deleter_is_allowed() {
    let mut foreign = ForeignTensor::new(&Fields::f32(&[4])).without_deleter();
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    drop(t);
    assert_eq!(foreign.deleter_calls(), 0);
}

#[test]
fn null_pointer_is_an_error() {
    // SAFETY: NULL is explicitly allowed by the contract.
    let e = unsafe { ManagedTensor::from_raw_versioned(std::ptr::null_mut()) }.unwrap_err();
    assert!(e.to_string().contains("null pointer"));
}

#[test]
fn legacy_tensors_import_with_no_flags() {
    let mut foreign = ForeignTensor::new(&Fields::f32(&[2, 2]));
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let t = unsafe { ManagedTensor::from_raw_legacy(foreign.legacy_ptr()) }.unwrap();
    assert!(t.is_legacy());
    assert!(!t.is_read_only());
    assert_eq!(t.view().data_ptr() as usize, foreign.buffer_addr());
    drop(t);
    assert_eq!(foreign.deleter_calls(), 1);
}

#[test]
fn flags_are_exposed() {
    let mut foreign = ForeignTensor::new(&Fields { flags: 0b11, ..Fields::f32(&[2]) });
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    assert!(t.is_read_only() && t.is_copied() && !t.is_subbyte_padded());
}

struct CountOnDrop(Arc<AtomicUsize>, #[allow(dead_code)] Vec<f32>);
impl Drop for CountOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn exported_vec_is_zero_copy_and_freed_once() {
    let v = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let addr = v.as_ptr() as usize;
    let t = ManagedTensor::from_vec(v, &[2, 3]).unwrap();
    assert_eq!(t.view().data_ptr() as usize, addr);
    assert_eq!(t.strides(), &[3, 1], "exports always fill strides in");
    assert_eq!(t.version(), Some((1, 3)));
    assert_eq!(t.view().as_slice::<f32>().unwrap()[5], 6.0);
}

#[test]
fn export_owner_keeps_the_owner_until_the_consumer_releases() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut data = vec![0.0f32; 4];
    let ptr = data.as_mut_ptr().cast();
    let owner = CountOnDrop(drops.clone(), data);
    let desc = dlbridge_core::TensorDesc::contiguous(DType::F32, &[4]);
    // SAFETY: the Vec inside the owner holds 4 f32s and does not move with it.
    let t = unsafe { ManagedTensor::export_owner(owner, ptr, &desc) }.unwrap();
    let raw = t.into_raw_versioned();
    assert_eq!(drops.load(Ordering::SeqCst), 0, "ownership handed on, owner alive");
    // A consumer takes it back and drops it.
    // SAFETY: `raw` came from into_raw_versioned and is owned here.
    let t2 = unsafe { ManagedTensor::from_raw_versioned(raw) }.unwrap();
    assert_eq!(t2.view().data_ptr(), ptr.cast_const());
    drop(t2);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn export_with_bad_description_drops_the_owner_and_errors() {
    let drops = Arc::new(AtomicUsize::new(0));
    let owner = CountOnDrop(drops.clone(), vec![]);
    let desc = dlbridge_core::TensorDesc::contiguous(DType::F32, &[-1]);
    // SAFETY: the description is rejected before the (dangling) data is used.
    let e = unsafe { ManagedTensor::export_owner(owner, std::ptr::null_mut(), &desc) }.unwrap_err();
    assert!(e.to_string().contains("shape[0]"));
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn shared_arc_exports_read_only_and_refuses_legacy() {
    let a: Arc<[i64]> = Arc::from(vec![1i64, 2, 3]);
    let mut t = ManagedTensor::from_arc(a.clone(), &[3]).unwrap();
    assert!(t.is_read_only());
    assert!(t.view_mut().is_err());
    assert_eq!(t.view().data_ptr() as usize, a.as_ptr() as usize);
    let e = t.into_raw_legacy().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Buffer);
    assert_eq!(Arc::strong_count(&a), 1, "refused export released its reference");
}

#[test]
fn rewrapping_legacy_and_versioned_is_zero_copy_and_releases_once() {
    let mut foreign = ForeignTensor::new(&Fields::f32(&[3, 2]));
    // SAFETY: the ForeignTensor outlives every tensor below.
    let legacy = unsafe { ManagedTensor::from_raw_legacy(foreign.legacy_ptr()) }.unwrap();
    let as_versioned = legacy.into_raw_versioned();
    // SAFETY: freshly handed over by into_raw_versioned.
    let t = unsafe { ManagedTensor::from_raw_versioned(as_versioned) }.unwrap();
    assert_eq!(t.view().data_ptr() as usize, foreign.buffer_addr());
    assert_eq!(t.shape(), &[3, 2]);
    let back = t.into_raw_legacy().unwrap();
    // SAFETY: freshly handed over by into_raw_legacy.
    let t = unsafe { ManagedTensor::from_raw_legacy(back) }.unwrap();
    assert_eq!(t.strides(), &[2, 1]);
    assert_eq!(foreign.deleter_calls(), 0);
    drop(t);
    assert_eq!(foreign.deleter_calls(), 1);
}

#[test]
fn managed_tensors_move_across_threads() {
    let t = ManagedTensor::from_vec(vec![1u8, 2, 3], &[3]).unwrap();
    let sum = std::thread::spawn(move || t.view().as_slice::<u8>().unwrap().iter().map(|&x| x as u32).sum::<u32>()).join().unwrap();
    assert_eq!(sum, 6);
}

#[test]
fn permute_reorders_dims_zero_copy_and_releases_the_producer_once() {
    let mut foreign = ForeignTensor::new(&Fields::f32(&[2, 3, 4]));
    // SAFETY: the ForeignTensor outlives every tensor below.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    let data = t.view().data_ptr();
    let p = t.permute(&[2, 0, 1]).unwrap();
    assert_eq!((p.shape(), p.strides()), (&[4i64, 2, 3][..], &[1i64, 12, 4][..]));
    assert_eq!(p.view().data_ptr(), data, "the same memory");
    assert_eq!(foreign.deleter_calls(), 0, "the producer's tensor lives inside the permuted one");
    // Handed on and taken back (as torch's to_py does), then dropped: the producer's deleter once.
    // SAFETY: `raw` came from into_raw_versioned and is owned here.
    let back = unsafe { ManagedTensor::from_raw_versioned(p.into_raw_versioned()) }.unwrap();
    assert_eq!(back.strides(), &[1, 12, 4]);
    drop(back);
    assert_eq!(foreign.deleter_calls(), 1);
}

#[test]
fn permute_keeps_read_only_and_refuses_what_is_not_a_permutation() {
    let a: Arc<[f32]> = Arc::from(vec![0.0f32; 6]);
    let mut t = ManagedTensor::from_arc(a.clone(), &[2, 3]).unwrap().permute(&[1, 0]).unwrap();
    assert!(t.is_read_only() && t.view_mut().is_err(), "READ_ONLY carries over");
    assert_eq!(t.strides(), &[1, 3]);
    drop(t);
    assert_eq!(Arc::strong_count(&a), 1);
    for bad in [&[0usize][..], &[0, 0], &[0, 2], &[1, 0, 2]] {
        let t = ManagedTensor::from_arc(a.clone(), &[2, 3]).unwrap();
        let e = t.permute(bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Value, "{bad:?}");
        assert!(e.to_string().contains("not a permutation of 2 dims"), "{e}");
        assert_eq!(Arc::strong_count(&a), 1, "{bad:?}: a refused permute releases the tensor");
    }
}

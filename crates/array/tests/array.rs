use dlbridge_array::{ALIGN, Array};
use dlbridge_core::testing::{Fields, ForeignTensor};
use dlbridge_core::{DType, Device, ErrorKind, Flags, ManagedTensor};

#[test]
fn zeros_are_64_byte_aligned_and_zero() {
    for shape in [&[0i64][..], &[1], &[3, 5], &[2, 3, 4]] {
        let a = Array::zeros(DType::F64, shape).unwrap();
        assert_eq!(a.data_ptr() as usize % ALIGN, 0);
        assert!(a.to_vec::<f64>().unwrap().iter().all(|&x| x == 0.0));
        assert_eq!(a.numel(), shape.iter().product::<i64>() as usize);
    }
}

#[test]
fn from_slice_checks_the_shape() {
    let e = Array::from_slice(&[1.0f32, 2.0, 3.0], &[2, 2]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value);
    assert!(e.to_string().contains("[2, 2]"), "{e}");
    let e = Array::zeros(DType::F32, &[2, -1]).unwrap_err();
    assert!(e.to_string().contains("shape[1]"), "{e}");
}

#[test]
fn arange_fills_every_numeric_dtype() {
    for name in ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64"] {
        let a = Array::arange(5, name.parse().unwrap()).unwrap();
        assert_eq!(a.shape(), &[5]);
        assert_eq!(a.dtype().to_string(), name);
    }
    assert_eq!(Array::arange(4, DType::I64).unwrap().to_vec::<i64>().unwrap(), vec![0, 1, 2, 3]);
    assert!(Array::arange(4, DType::C64).is_err());
}

#[test]
fn from_fn_fills_every_dtype_with_rust_as_conversions() {
    use dlbridge_array::Item;
    let f = |i: usize| [-1.5, 0.0, 2.75, 300.0][i];
    let read = |d: DType| Array::from_fn(d, &[2, 2], f).unwrap().items().unwrap().collect::<Result<Vec<_>, _>>().unwrap();
    assert_eq!(read(DType::I8), [-1, 0, 2, 127].map(Item::Int), "truncating, saturating");
    assert_eq!(read(DType::U8), [0, 0, 2, 255].map(Item::UInt), "negative saturates to 0");
    assert_eq!(read(DType::I64), [-1, 0, 2, 300].map(Item::Int));
    assert_eq!(read(DType::F32), [-1.5, 0.0, 2.75, 300.0].map(Item::Float));
    assert_eq!(read(DType::F16), [-1.5, 0.0, 2.75, 300.0].map(Item::Float));
    assert_eq!(read(DType::BF16), [-1.5, 0.0, 2.75, 300.0].map(Item::Float));
    assert_eq!(read(DType::C128), [(-1.5, 0.0), (0.0, 0.0), (2.75, 0.0), (300.0, 0.0)].map(|(r, i)| Item::Complex(r, i)));
    assert_eq!(read(DType::BOOL), [true, false, true, true].map(Item::Bool));
    let e = Array::from_fn("float8_e4m3fn".parse().unwrap(), &[2], f).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Type, "{e}");
}

#[test]
fn transpose_shares_memory_and_reads_in_logical_order() {
    let a = Array::from_slice(&[0i32, 1, 2, 3, 4, 5], &[2, 3]).unwrap();
    let t = a.t().unwrap();
    assert_eq!(t.data_ptr(), a.data_ptr());
    assert_eq!(t.shape(), &[3, 2]);
    assert_eq!(t.strides(), &[1, 3]);
    assert!(!t.is_contiguous());
    assert_eq!(t.to_vec::<i32>().unwrap(), vec![0, 3, 1, 4, 2, 5]);
    let c = t.contiguous().unwrap();
    assert!(c.is_contiguous());
    assert_eq!(c.as_slice::<i32>().unwrap(), &[0, 3, 1, 4, 2, 5]);
    assert_ne!(c.data_ptr(), a.data_ptr());
}

#[test]
fn broadcast_to_repeats_size_one_dims_read_only_without_copying() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3, 1]).unwrap();
    let b = a.broadcast_to(&[2, 3, 4]).unwrap();
    assert_eq!((b.shape(), b.strides()), (&[2i64, 3, 4][..], &[0i64, 1, 0][..]));
    assert_eq!(b.data_ptr(), a.data_ptr(), "a view");
    assert!(b.is_read_only(), "its elements alias each other");
    assert_eq!(b.contiguous().unwrap().to_vec::<f32>().unwrap(), [[1.0f32; 4], [2.0; 4], [3.0; 4]].concat().repeat(2));
    for bad in [&[2, 2][..], &[1][..], &[2, 3, -1][..]] {
        let e = a.broadcast_to(bad).unwrap_err();
        assert!(e.to_string().contains("does not broadcast to"), "{bad:?}: {e}");
    }
    assert_eq!(Array::zeros(DType::U8, &[1]).unwrap().broadcast_to(&[0]).unwrap().numel(), 0);
}

#[test]
fn slices_share_memory_with_any_step() {
    let a = Array::arange(10, DType::I32).unwrap();
    let s = a.slice(0, 2, 8, 3).unwrap();
    assert_eq!(s.to_vec::<i32>().unwrap(), vec![2, 5]);
    assert_eq!(s.data_ptr() as usize, a.data_ptr() as usize + 8);
    let r = a.slice(0, -1, -11, -1).unwrap();
    assert_eq!(r.to_vec::<i32>().unwrap(), (0..10).rev().collect::<Vec<_>>());
    assert_eq!(r.strides(), &[-1]);
    let empty = a.slice(0, 5, 2, 1).unwrap();
    assert_eq!(empty.numel(), 0);
    assert!(a.slice(0, 0, 5, 0).is_err());
    assert!(a.slice(1, 0, 5, 1).is_err());
    let m = Array::arange(12, DType::F32).unwrap();
    let m = m.view().to_vec::<f32>().unwrap();
    let m = Array::from_slice(&m, &[3, 4]).unwrap();
    let col = m.slice(1, 1, 2, 1).unwrap().slice(0, 2, -4, -1).unwrap();
    assert_eq!(col.shape(), &[3, 1]);
    assert_eq!(col.to_vec::<f32>().unwrap(), vec![9.0, 5.0, 1.0]);
    for arr in [&s, &r, &empty, &col] {
        arr.check().unwrap();
    }
}

#[test]
fn export_is_zero_copy_and_memory_outlives_the_array() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let ptr = a.data_ptr();
    let t = a.t().unwrap().into_managed().unwrap();
    drop(a);
    assert_eq!(t.view().data_ptr().cast::<u8>(), ptr);
    assert_eq!(t.strides(), &[1, 2]);
    assert_eq!(t.view().to_vec::<f32>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
}

#[test]
fn export_import_round_trip_keeps_the_pointer_for_every_dtype() {
    for dtype in DType::all_scalar() {
        if !dtype.is_byte_sized() {
            continue;
        }
        let a = Array::zeros(dtype, &[3, 4]).unwrap();
        let ptr = a.data_ptr();
        let back = Array::from_managed(a.to_managed().unwrap()).unwrap();
        assert_eq!(back.data_ptr(), ptr, "{dtype}");
        assert_eq!(back.dtype(), dtype);
        assert_eq!(back.shape(), &[3, 4]);
        assert_eq!(back.strides(), &[4, 1]);
    }
}

#[test]
fn import_keeps_the_foreign_owner_alive_until_the_last_handle_drops() {
    let mut foreign = ForeignTensor::new(&Fields::f32(&[2, 3]));
    // SAFETY: the ForeignTensor outlives every handle below.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    let a = Array::from_managed(t).unwrap();
    assert_eq!(a.data_ptr() as usize, foreign.buffer_addr());
    let view = a.t().unwrap();
    drop(a);
    assert_eq!(foreign.deleter_calls(), 0);
    let exported = view.into_managed().unwrap();
    assert_eq!(foreign.deleter_calls(), 0);
    drop(exported);
    assert_eq!(foreign.deleter_calls(), 1);
}

#[test]
fn writes_need_an_unshared_writable_array() {
    let mut a = Array::zeros(DType::I64, &[4]).unwrap();
    a.as_slice_mut::<i64>().unwrap()[1] = 7;
    let alias = a.clone();
    let e = a.view_mut().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Buffer);
    assert!(e.to_string().contains("shared by 2 handles"), "{e}");
    drop(alias);
    let export = a.to_managed().unwrap();
    assert!(a.view_mut().is_err(), "refused while exported");
    drop(export);
    a.view_mut().unwrap();
    a.set_read_only();
    assert!(matches!(a.view_mut().unwrap_err(), dlbridge_core::Error::ReadOnly { .. }));
    assert!(a.to_managed().unwrap().is_read_only(), "read-only arrays export READ_ONLY");
}

#[test]
fn read_only_imports_stay_read_only() {
    let mut foreign = ForeignTensor::new(&Fields { flags: Flags::READ_ONLY.bits(), ..Fields::f32(&[2]) });
    // SAFETY: the ForeignTensor outlives every handle below.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    let mut a = Array::from_managed(t).unwrap();
    assert!(a.is_read_only());
    assert!(a.as_slice_mut::<f32>().is_err());
    assert!(a.to_managed().unwrap().is_read_only());
}

#[test]
fn device_memory_is_held_with_zero_copies_and_never_read_on_the_host() {
    let mut foreign = ForeignTensor::new(&Fields { device: (2, 0), ..Fields::f32(&[2, 3]) });
    // SAFETY: the ForeignTensor outlives the ManagedTensor; CUDA data is never read.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    let data = t.view().data_ptr().cast::<u8>();
    let a = Array::from_managed(t).unwrap();
    assert_eq!(a.device(), Device::cuda(0));
    assert_eq!(a.data_ptr(), data, "imported with a copy");
    // Views and exports are metadata: they work, sharing the device memory.
    let t = a.t().unwrap();
    assert_eq!((t.shape(), t.strides(), t.data_ptr()), (&[3, 2][..], &[1, 3][..], data));
    let back = t.to_managed().unwrap();
    assert_eq!((back.device(), back.view().data_ptr().cast::<u8>()), (Device::cuda(0), data));
    drop(back);
    // Every host read is refused, naming the device.
    for e in [a.to_vec::<f32>().unwrap_err(), a.contiguous().unwrap_err(), a.items().err().unwrap(), a.as_slice::<f32>().unwrap_err()] {
        assert_eq!(e.kind(), ErrorKind::Buffer, "{e}");
        assert!(e.to_string().contains("cuda:0"), "{e}");
    }
    assert_eq!(foreign.deleter_calls(), 0);
    drop((a, t));
    assert_eq!(foreign.deleter_calls(), 1);
}

#[test]
fn negative_stride_views_export_and_import() {
    let a = Array::arange(6, DType::F64).unwrap();
    let r = a.slice(0, -1, -7, -2).unwrap();
    let t = r.to_managed().unwrap();
    assert_eq!(t.strides(), &[-2]);
    assert_eq!(t.view().to_vec::<f64>().unwrap(), vec![5.0, 3.0, 1.0]);
    let back = Array::from_managed(t).unwrap();
    assert_eq!(back.to_vec::<f64>().unwrap(), vec![5.0, 3.0, 1.0]);
}

#[test]
fn select_drops_the_dim_and_shares_memory() {
    let m = Array::from_slice(&(0..12).collect::<Vec<i32>>(), &[3, 4]).unwrap();
    let row = m.select(0, 1).unwrap();
    assert_eq!(row.shape(), &[4]);
    assert_eq!(row.to_vec::<i32>().unwrap(), vec![4, 5, 6, 7]);
    assert_eq!(row.data_ptr() as usize, m.data_ptr() as usize + 16);
    let col = m.select(1, -1).unwrap();
    assert_eq!((col.shape(), col.strides()), (&[3i64][..], &[4i64][..]));
    assert_eq!(col.to_vec::<i32>().unwrap(), vec![3, 7, 11]);
    let x = col.select(0, 2).unwrap();
    assert_eq!(x.ndim(), 0);
    assert_eq!(x.to_vec::<i32>().unwrap(), vec![11]);
    assert!(m.select(0, 3).is_err() && m.select(0, -4).is_err() && m.select(2, 0).is_err());
    assert!(m.select(0, i64::MIN).is_err());
    for a in [&row, &col, &x] {
        a.check().unwrap();
    }
}

#[test]
fn permute_refuses_what_is_not_a_permutation_with_the_core_message() {
    let a = Array::zeros(DType::F32, &[2, 3, 4]).unwrap();
    let p = a.permute(&[2, 0, 1]).unwrap();
    assert_eq!((p.shape(), p.strides()), (&[4i64, 2, 3][..], &[1i64, 12, 4][..]));
    for bad in [&[0usize, 1][..], &[0, 1, 1], &[0, 1, 3], &[0, 1, 2, 3]] {
        let e = a.permute(bad).unwrap_err();
        assert_eq!(e.to_string(), format!("permute({bad:?}) is not a permutation of 3 dims"));
    }
}

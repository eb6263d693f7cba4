//! Property tests: the validator answers Ok or an Error for any descriptor,
//! never panics, and every accepted view's byte range is exactly the bytes its
//! elements occupy.

use dlbridge_core::testing::{Fields, ForeignTensor};
use dlbridge_core::{DType, Flags, ManagedTensor, layout};
use proptest::prelude::*;

fn dim() -> impl Strategy<Value = i64> {
    prop_oneof![8 => -1i64..6, 1 => Just(0), 1 => any::<i64>(), 1 => Just(i64::MAX)]
}

fn stride() -> impl Strategy<Value = i64> {
    prop_oneof![8 => -7i64..8, 1 => Just(0), 1 => any::<i64>(), 1 => Just(i64::MIN), 1 => Just(1i64 << 60)]
}

fn raw_dtype() -> impl Strategy<Value = (u8, u8, u16)> {
    prop_oneof![
        6 => prop::sample::select(DType::all_scalar()).prop_map(|d| (d.code() as u8, d.bits(), d.lanes())),
        1 => (any::<u8>(), any::<u8>(), 0u16..5),
    ]
}

fn fields() -> impl Strategy<Value = Fields> {
    (
        prop::collection::vec((dim(), stride()), 0..5),
        any::<bool>(),
        prop_oneof![4 => 0u64..64, 1 => any::<u64>()],
        raw_dtype(),
        0u64..8,
        prop_oneof![4 => Just((1u32, 0i32)), 1 => (0u32..20, -1i32..3)],
        prop_oneof![6 => Just((1u32, 3u32)), 1 => (0u32..4, any::<u32>())],
        prop_oneof![4 => Just(None), 1 => Just(Some(0usize)), 1 => any::<usize>().prop_map(Some)],
        0i32..3,
    )
        .prop_map(|(dims, null_strides, byte_offset, dtype, flags, device, version, data_override, ndim_skew)| {
            let shape: Vec<i64> = dims.iter().map(|d| d.0).collect();
            let strides: Vec<i64> = dims.iter().map(|d| d.1).collect();
            Fields {
                version,
                flags,
                dtype,
                device,
                ndim: shape.len() as i32 - if ndim_skew == 2 { 1 } else { 0 },
                shape: Some(shape),
                strides: if null_strides { None } else { Some(strides) },
                byte_offset,
                buffer_bytes: 64,
                data_override,
            }
        })
}

/// Independently computed: lowest and highest element offset reached.
fn brute_force_range(shape: &[i64], strides: &[i64]) -> Option<(i128, i128)> {
    let numel: i64 = shape.iter().product();
    if numel == 0 {
        return None;
    }
    let mut lo = i128::MAX;
    let mut hi = i128::MIN;
    let mut idx = vec![0i64; shape.len()];
    for _ in 0..numel {
        let off: i128 = idx.iter().zip(strides).map(|(&i, &s)| i as i128 * s as i128).sum();
        lo = lo.min(off);
        hi = hi.max(off);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Some((lo, hi))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn validator_never_panics_and_accepted_ranges_are_exact(f in fields()) {
        let mut foreign = ForeignTensor::new(&f);
        // SAFETY: the ForeignTensor owns the shape/strides arrays it points to and
        // outlives the ManagedTensor; the data pointer is never dereferenced here.
        let result = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) };
        if let Ok(t) = &result {
            let v = t.view();
            let shape = v.shape();
            prop_assert!(shape.iter().all(|&n| n >= 0));
            prop_assert_eq!(v.strides().len(), shape.len());
            let ext = v.extent();
            prop_assert!(ext.byte_lo <= 0 && ext.byte_hi >= 0);
            let numel: u128 = if shape.contains(&0) { 0 } else { shape.iter().map(|&n| n as u128).fold(1, u128::saturating_mul) };
            prop_assert_eq!(numel, ext.numel as u128);
            if ext.numel > 0 && ext.numel <= 4096 {
                let (lo, hi) = brute_force_range(shape, v.strides()).unwrap();
                let bits = v.dtype().storage_bits(t.is_subbyte_padded()) as i128;
                // Every element's bits lie inside [byte_lo, byte_hi), and both ends are attained.
                prop_assert_eq!(ext.byte_lo as i128, (lo * bits).div_euclid(8));
                prop_assert_eq!(ext.byte_hi as i128, ((hi + 1) * bits + 7).div_euclid(8));
                let start = v.data_ptr() as usize as i128;
                prop_assert!(start + ext.byte_lo as i128 >= 0);
                prop_assert!(start + (ext.byte_hi as i128) <= usize::MAX as i128);
                prop_assert_eq!(start as usize % v.dtype().alignment(), 0);
            }
            if ext.numel > 0 {
                prop_assert!(v.data_ptr() as usize != 0);
            }
        }
        drop(result);
        prop_assert_eq!(foreign.deleter_calls(), 1, "deleter exactly once, accepted or not");
    }

    #[test]
    fn in_bounds_strided_layouts_are_accepted_and_read_correctly(
        dims in prop::collection::vec((1i64..5, -6i64..7), 0..4),
    ) {
        let shape: Vec<i64> = dims.iter().map(|d| d.0).collect();
        let strides: Vec<i64> = dims.iter().map(|d| d.1).collect();
        let (lo, hi) = brute_force_range(&shape, &strides).unwrap_or((0, 0));
        // Place element [0..] so the lowest element is index 0 of the buffer.
        let offset = (-lo) as usize;
        let len = (hi - lo + 1) as usize;
        let data: Vec<i32> = (0..len as i32).collect();
        let v = dlbridge_core::TensorView::from_slice_strided(&data, &shape, Some(&strides), offset).unwrap();
        prop_assert_eq!(v.extent().byte_lo as i128, lo * 4);
        prop_assert_eq!(v.extent().byte_hi as i128, (hi + 1) * 4);
        // Read through the iterator and compare with direct indexing.
        let values = v.to_vec::<i32>().unwrap();
        let mut idx = vec![0i64; shape.len()];
        for value in values {
            let off: i64 = idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<i64>() + offset as i64;
            prop_assert_eq!(value, data[off as usize]);
            for d in (0..shape.len()).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] { break; }
                idx[d] = 0;
            }
        }
        prop_assert_eq!(v.is_contiguous(), layout::is_contiguous(&shape, &strides));
    }

    #[test]
    fn check_layout_total_on_any_input(
        shape in prop::collection::vec(any::<i64>(), 0..6),
        strides in prop::collection::vec(any::<i64>(), 0..6),
        addr in any::<usize>(),
        offset in any::<u64>(),
        dtype in prop::sample::select(DType::all_scalar()),
        padded in any::<bool>(),
    ) {
        let strides = if strides.len() == shape.len() { Some(&strides[..]) } else { None };
        let _ = layout::check_layout(&shape, strides, dtype, addr, offset, padded);
        let _ = layout::is_non_overlapping(&shape, strides.unwrap_or(&[]));
    }
}

/// Every element offset of a small layout, by enumeration.
fn offsets(shape: &[i64], strides: &[i64]) -> Vec<i64> {
    let mut out = vec![0i64];
    for (&n, &s) in shape.iter().zip(strides) {
        out = out.iter().flat_map(|&o| (0..n.max(0)).map(move |i| o + i * s)).collect();
    }
    out
}

proptest! {
    /// `is_non_overlapping` is sound (a layout it accepts maps each element to its
    /// own offset, checked by enumeration) and accepts every row-major
    /// contiguous layout, with or without dims of one element.
    #[test]
    fn non_overlapping_is_sound(
        dims in prop::collection::vec((-1i64..5, -9i64..10), 0..5),
        ones in prop::collection::vec(any::<bool>(), 0..5),
    ) {
        let shape: Vec<i64> = dims.iter().map(|d| d.0).collect();
        let strides: Vec<i64> = dims.iter().map(|d| d.1).collect();
        if layout::is_non_overlapping(&shape, &strides) && !shape.contains(&0) {
            let mut o = offsets(&shape, &strides);
            let n = o.len();
            o.sort_unstable();
            o.dedup();
            prop_assert_eq!(o.len(), n, "shape {:?} strides {:?} accepted but overlaps", shape, strides);
        }
        // Contiguous: sizes 1..5, some of them 1 with any stride.
        let sizes: Vec<i64> = dims.iter().zip(ones.iter().chain(std::iter::repeat(&false))).map(|(d, &one)| if one { 1 } else { d.0.clamp(1, 4) }).collect();
        let mut strides = vec![0i64; sizes.len()];
        let mut acc = 1;
        for i in (0..sizes.len()).rev() {
            strides[i] = if sizes[i] == 1 { dims[i].1 } else { acc };
            acc *= sizes[i];
        }
        prop_assert!(layout::is_non_overlapping(&sizes, &strides), "contiguous {:?} {:?} refused", sizes, strides);
    }
}

#[test]
fn read_only_flag_survives_validation() {
    let mut foreign = ForeignTensor::new(&Fields { flags: Flags::READ_ONLY.bits(), ..Fields::f32(&[1]) });
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    assert!(t.view().is_read_only());
}

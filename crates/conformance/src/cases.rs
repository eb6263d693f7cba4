//! The cases: plain functions over any [`Harness`].
//!
//! Invariants (the unsafe here): every raw DLPack pointer a case imports comes
//! from a [`ForeignTensor`] the case owns and keeps alive until the import is
//! dropped, and is imported once; every exported owner keeps the memory its
//! data pointer addresses alive, with the layout the `TensorDesc` describes.

use dlbridge_array::{Array, Item, Items};
use dlbridge_core::testing::{Fields, ForeignTensor};
use dlbridge_core::{DType, Flags, ManagedTensor, Result, TensorDesc, TensorView};

use crate::{Harness, Layout, ReadBack, Spec, Status};

/// The value element `i` of a test tensor holds.
pub fn value(dtype: DType, i: usize) -> f64 {
    if dtype == DType::BOOL { (i % 2) as f64 } else { (i % 100) as f64 }
}

/// A tensor's elements in row-major order as f64 (bool 0/1, complex: real part).
pub fn values(v: &TensorView<'_>) -> Result<Vec<f64>> {
    Items::new(v)?
        .map(|s| {
            Ok(match s? {
                Item::Bool(b) => f64::from(u8::from(b)),
                Item::Int(i) => i as f64,
                Item::UInt(u) => u as f64,
                Item::Float(x) | Item::Complex(x, _) => x,
            })
        })
        .collect()
}

/// A dlbridge-produced reference tensor of `dtype` and `shape` (contiguous), holding [`value`]s.
pub fn reference(dtype: DType, shape: &[i64]) -> Result<ManagedTensor> {
    Array::from_fn(dtype, shape, |i| value(dtype, i))?.into_managed()
}

fn expected(spec: &Spec) -> Vec<f64> {
    (0..spec.numel()).map(|i| value(spec.dtype, i)).collect()
}

fn fail(what: impl Into<String>) -> Status {
    Status::Fail(what.into())
}

/// Exports `spec` from the harness and checks dtype, shape and values.
fn check_export(h: &dyn Harness, spec: &Spec) -> std::result::Result<Option<ManagedTensor>, String> {
    let m = match h.export(spec) {
        Ok(Some(m)) => m,
        Ok(None) => return Ok(None),
        Err(e) => return Err(format!("export of {spec:?} failed: {e}")),
    };
    if m.dtype() != spec.dtype || m.shape() != spec.shape.as_slice() {
        return Err(format!("exported {} {:?}, expected {} {:?}", m.dtype(), m.shape(), spec.dtype, spec.shape));
    }
    let got = values(m.view()).map_err(|e| format!("reading the export: {e}"))?;
    if got != expected(spec) {
        return Err(format!("exported values {got:?}, expected {:?}", expected(spec)));
    }
    Ok(Some(m))
}

fn check_import(h: &dyn Harness, m: ManagedTensor, want: &[f64]) -> std::result::Result<ReadBack, String> {
    let (shape, dtype) = (m.shape().to_vec(), m.dtype());
    let r = h.import(m).map_err(|e| format!("import failed: {e}"))?;
    if r.shape != shape || r.dtype != dtype {
        return Err(format!("imported {} {:?}, expected {dtype} {shape:?}", r.dtype, r.shape));
    }
    if r.values != want {
        return Err(format!("imported values {:?}, expected {want:?}", r.values));
    }
    Ok(r)
}

fn run(f: impl FnOnce() -> std::result::Result<Status, String>) -> Status {
    match f() {
        Ok(s) => s,
        Err(e) => Status::Fail(e),
    }
}

/// Every dtype the adapter has: exported with the right dtype and values, and
/// a dlbridge-produced tensor of it imported with the right values.
pub fn round_trip_of_every_dtype(h: &dyn Harness) -> Status {
    run(|| {
        for dtype in h.dtypes() {
            let spec = Spec::new(dtype, &[2, 3]);
            check_export(h, &spec)?;
            check_import(h, reference(dtype, &[2, 3]).map_err(|e| e.to_string())?, &expected(&spec))?;
        }
        Ok(Status::Pass)
    })
}

/// 0-d tensors and tensors with a zero dim, both ways.
pub fn zero_dim_and_zero_size_shapes(h: &dyn Harness) -> Status {
    run(|| {
        let dtype = h.dtypes()[0];
        for shape in [&[][..], &[0][..], &[3, 0][..], &[0, 4][..]] {
            let spec = Spec::new(dtype, shape);
            check_export(h, &spec)?;
            check_import(h, reference(dtype, shape).map_err(|e| e.to_string())?, &expected(&spec))?;
        }
        Ok(Status::Pass)
    })
}

fn layout_case(h: &dyn Harness, layout: Layout, shape: &[i64]) -> Status {
    run(|| {
        let dtype = *h.dtypes().iter().find(|d| **d != DType::BOOL).unwrap_or(&DType::F32);
        let spec = Spec::new(dtype, shape).with_layout(layout);
        match check_export(h, &spec)? {
            Some(_) => Ok(Status::Pass),
            None => Ok(Status::Skip(format!("{} cannot make a {layout:?} tensor", h.name()))),
        }
    })
}

/// A transposed tensor exports with its strides; values read in logical order.
pub fn transposed_tensors_keep_their_layout(h: &dyn Harness) -> Status {
    layout_case(h, Layout::Transposed, &[3, 4])
}

/// Size-1 dims may carry any stride (consumer side).
pub fn size_one_dims_with_odd_strides(h: &dyn Harness) -> Status {
    run(|| {
        let mut f =
            ForeignTensor::new(&Fields { shape: Some(vec![1, 3, 1]), strides: Some(vec![99, 1, -7]), ndim: 3, ..Fields::f32(&[1, 3, 1]) });
        for (i, v) in [0.0f32, 1.0, 2.0].iter().enumerate() {
            f.buffer_mut()[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
        }
        // SAFETY: the ForeignTensor outlives the import (checked below: released exactly once).
        let m = unsafe { ManagedTensor::from_raw_versioned(f.versioned_ptr()) }.map_err(|e| e.to_string())?;
        check_import(h, m, &[0.0, 1.0, 2.0])?;
        if f.deleter_calls() != 1 {
            return Err(format!("deleter ran {} times", f.deleter_calls()));
        }
        Ok(Status::Pass)
    })
}

/// A view taking every other element (stride 2).
pub fn strided_views_with_a_step(h: &dyn Harness) -> Status {
    layout_case(h, Layout::Step2, &[2, 3])
}

/// Negative strides: exported correctly or not at all; imported correctly or cleanly refused.
pub fn negative_strides_accepted_or_cleanly_refused(h: &dyn Harness) -> Status {
    run(|| {
        let dtype = DType::F32;
        // Consumer: a reversed view produced by dlbridge.
        let data: Vec<f32> = vec![0.0, 1.0, 2.0, 3.0];
        let ptr = data.as_ptr();
        let desc = TensorDesc { strides: Some(&[-1]), byte_offset: 12, ..TensorDesc::contiguous(dtype, &[4]) };
        // SAFETY: element i lives at data[3 - i], inside the Vec the owner keeps.
        let m = unsafe { ManagedTensor::export_owner(data, ptr.cast_mut().cast(), &desc) }.map_err(|e| e.to_string())?;
        let consumer = match h.import(m) {
            Ok(r) if r.values == [3.0, 2.0, 1.0, 0.0] => "accepted",
            Ok(r) => return Err(format!("reversed view read as {:?}", r.values)),
            Err(_) => "refused",
        };
        let producer = match h.dtypes().contains(&dtype).then(|| check_export(h, &Spec::new(dtype, &[4]).with_layout(Layout::Reversed))) {
            Some(Ok(Some(_))) => "exports them",
            Some(Ok(None)) | None => "cannot make them",
            Some(Err(e)) => return Err(e),
        };
        let _ = (consumer, producer);
        Ok(Status::Pass)
    })
}

/// A view that starts inside a larger buffer (data pointer / byte_offset applied).
pub fn views_with_an_offset(h: &dyn Harness) -> Status {
    layout_case(h, Layout::Offset, &[2, 3])
}

/// Import and export share memory where the adapter says they do.
pub fn zero_copy_where_advertised(h: &dyn Harness) -> Status {
    if !h.zero_copy() {
        return Status::Skip(format!("{} copies by design", h.name()));
    }
    run(|| {
        let m = reference(DType::F32, &[4]).map_err(|e| e.to_string())?;
        let ptr = m.view().data_ptr() as usize;
        let r = check_import(h, m, &[0.0, 1.0, 2.0, 3.0])?;
        if r.data_ptr != ptr {
            return Err(format!("import copied: data at {:#x}, producer's at {ptr:#x}", r.data_ptr));
        }
        Ok(Status::Pass)
    })
}

/// The producer's own handle is gone before the consumer reads.
pub fn producer_dropped_before_the_consumer(h: &dyn Harness) -> Status {
    run(|| {
        // The harness drops its framework tensor inside export; the DLPack tensor must stay valid.
        let spec = Spec::new(h.dtypes()[0], &[5]);
        let m = check_export(h, &spec)?;
        drop(m);
        Ok(Status::Pass)
    })
}

/// Whatever the consumer does, the producer's deleter runs exactly once.
pub fn deleter_runs_exactly_once(h: &dyn Harness) -> Status {
    run(|| {
        let mut f = ForeignTensor::new(&Fields::f32(&[3]));
        // SAFETY: the ForeignTensor outlives the import.
        let m = unsafe { ManagedTensor::from_raw_versioned(f.versioned_ptr()) }.map_err(|e| e.to_string())?;
        check_import(h, m, &[0.0, 0.0, 0.0])?;
        match f.deleter_calls() {
            1 => Ok(Status::Pass),
            n => Err(format!("deleter ran {n} times after the consumer was done")),
        }
    })
}

/// READ_ONLY tensors are refused by consumers that write, and never written.
pub fn read_only_is_honoured(h: &dyn Harness) -> Status {
    run(|| {
        let mut f = ForeignTensor::new(&Fields { flags: Flags::READ_ONLY.bits(), ..Fields::f32(&[3]) });
        let before = f.buffer_mut().to_vec();
        // SAFETY: the ForeignTensor outlives the import.
        let m = unsafe { ManagedTensor::from_raw_versioned(f.versioned_ptr()) }.map_err(|e| e.to_string())?;
        let result = h.import(m);
        if result.is_ok() && !h.accepts_read_only() {
            return Err("a READ_ONLY tensor was accepted by a consumer that writes".into());
        }
        if f.buffer_mut().to_vec() != before {
            return Err("a READ_ONLY tensor was written".into());
        }
        if f.deleter_calls() != 1 {
            return Err(format!("deleter ran {} times", f.deleter_calls()));
        }
        Ok(Status::Pass)
    })
}

/// Both struct flavours import (legacy tensors carry no flags).
pub fn legacy_and_versioned_structs(h: &dyn Harness) -> Status {
    run(|| {
        let mut f = ForeignTensor::new(&Fields::f32(&[2]));
        // SAFETY: the ForeignTensor outlives the import.
        let m = unsafe { ManagedTensor::from_raw_legacy(f.legacy_ptr()) }.map_err(|e| e.to_string())?;
        check_import(h, m, &[0.0, 0.0])?;
        if f.deleter_calls() != 1 {
            return Err(format!("legacy deleter ran {} times", f.deleter_calls()));
        }
        Ok(Status::Pass)
    })
}

/// A tensor from a future major version is refused and still released.
pub fn future_major_version_refused_and_released(_h: &dyn Harness) -> Status {
    let mut f = ForeignTensor::new(&Fields { version: (2, 0), ..Fields::f32(&[2]) });
    // SAFETY: the ForeignTensor outlives the call.
    let r = unsafe { ManagedTensor::from_raw_versioned(f.versioned_ptr()) };
    match (r.is_err(), f.deleter_calls()) {
        (true, 1) => Status::Pass,
        (ok, n) => fail(format!("version 2.0 accepted={} deleter calls={n}", !ok)),
    }
}

/// Unknown dtype and device codes are refused and released.
pub fn unknown_dtype_and_device_refused(_h: &dyn Harness) -> Status {
    for fields in [Fields { dtype: (99, 32, 1), ..Fields::f32(&[2]) }, Fields { device: (99, 0), ..Fields::f32(&[2]) }] {
        let mut f = ForeignTensor::new(&fields);
        // SAFETY: the ForeignTensor outlives the call.
        let r = unsafe { ManagedTensor::from_raw_versioned(f.versioned_ptr()) };
        if r.is_ok() || f.deleter_calls() != 1 {
            return fail(format!("{fields:?}: accepted={} deleter calls={}", r.is_ok(), f.deleter_calls()));
        }
    }
    Status::Pass
}

/// The IS_SUBBYTE_TYPE_PADDED flag: handled (values readable) or cleanly refused.
pub fn subbyte_padded_flag_refused_or_handled(h: &dyn Harness) -> Status {
    let mut f = ForeignTensor::new(&Fields {
        dtype: (17, 4, 1),
        flags: Flags::IS_SUBBYTE_TYPE_PADDED.bits(),
        buffer_bytes: 4,
        ..Fields::f32(&[4])
    });
    // SAFETY: the ForeignTensor outlives the import.
    let m = match unsafe { ManagedTensor::from_raw_versioned(f.versioned_ptr()) } {
        Ok(m) => m,
        Err(e) => return fail(format!("dlbridge refused a valid padded f4 tensor: {e}")),
    };
    let _ = h.import(m); // Ok or a clean error: both are conforming
    match f.deleter_calls() {
        1 => Status::Pass,
        n => fail(format!("deleter ran {n} times")),
    }
}

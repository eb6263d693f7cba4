//! Reading foreign `DLTensor`s: the only place a producer's raw pointers are
//! turned into slices.
//!
//! Invariants: every field of a foreign DLTensor is untrusted until checked.
//! The dtype and device codes are validated before anything else; `ndim` is
//! bounded by [`MAX_NDIM`] before `shape`/`strides` are read; the shape and
//! stride arrays are only read for `ndim` entries and only when non-NULL; the
//! data pointer is never dereferenced here (that is [`TensorView`]'s job, after
//! `check_layout` accepted the layout).

use dlpark::ffi::DLTensor;

use crate::Flags;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::MAX_NDIM;
use crate::view::TensorView;

/// Validates a foreign DLTensor and returns a view of it.
///
/// # Safety
/// `tensor` must be NULL or point to a readable `DLTensor` whose `shape`
/// (unless NULL) and `strides` (unless NULL) each point to `ndim` readable
/// `i64`s, and whose data, if the tensor is accepted and lives on a host
/// accessible device, is readable over the layout it describes and not
/// written for `'a`. All of it must stay valid for `'a`.
pub unsafe fn view_from_dltensor<'a>(tensor: *const DLTensor, flags: Flags) -> Result<TensorView<'a>> {
    if tensor.is_null() {
        return Err(Error::NullPointer("DLTensor pointer".into()));
    }
    // SAFETY: non-NULL and readable per the caller's contract; DLTensor is plain
    // old data (integers and raw pointers), so any bit pattern is a valid value.
    let t: DLTensor = unsafe { tensor.read() };
    let dtype = DType::from_dl(t.dtype).map_err(|e| e.context("DLTensor field `dtype`"))?;
    let device = Device::from_dl(t.device)?;
    if t.ndim < 0 || t.ndim as usize > MAX_NDIM {
        return Err(Error::field("ndim", t.ndim, format!("must be in 0..={MAX_NDIM}")));
    }
    let ndim = t.ndim as usize;
    let shape: &'a [i64] = if ndim == 0 {
        &[]
    } else if t.shape.is_null() {
        return Err(Error::field("shape", "NULL", format!("ndim is {ndim}")));
    } else if !(t.shape as usize).is_multiple_of(std::mem::align_of::<i64>()) {
        return Err(Error::field("shape", format!("{:p}", t.shape), "not aligned for i64"));
    } else {
        // SAFETY: non-NULL, aligned, and points to ndim readable i64s for 'a (caller contract).
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let strides: Option<&'a [i64]> = if t.strides.is_null() || ndim == 0 {
        None
    } else if !(t.strides as usize).is_multiple_of(std::mem::align_of::<i64>()) {
        return Err(Error::field("strides", format!("{:p}", t.strides), "not aligned for i64"));
    } else {
        // SAFETY: non-NULL, aligned, ndim readable i64s for 'a (caller contract).
        Some(unsafe { std::slice::from_raw_parts(t.strides, ndim) })
    };
    // SAFETY: the data range is readable for 'a when the layout is accepted (caller contract).
    unsafe { TensorView::from_raw_parts(t.data.cast_const().cast(), t.byte_offset, shape, strides, dtype, device, flags) }
}

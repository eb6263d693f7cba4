//! The C++ shim (`shim.cpp`): at::fromDLPackVersioned, at::toDLPackVersioned
//! and at::toDLPackNonOwning for tch tensors.
//!
//! Invariants: tch's `C_tensor` is a heap `at::Tensor*`, which is what the shim
//! takes and returns. `from_dlpack` hands ownership of the DLPack tensor to
//! torch (its deleter runs when torch frees the storage); callers pre-check
//! everything torch can fail on (dtype, device, strides), because a failed
//! torch import leaks the tensor rather than releasing it. The result is a
//! fresh `at::Tensor*` that `Tensor::from_ptr` then owns.
//! `to_dlpack` returns an owning DLPack tensor validated like any foreign one.
//! A borrowed DLTensor is only turned into a view whose lifetime is bounded by
//! a borrow of the `Tensor` it came from; a writable one ([`borrow_mut`]) only
//! for a tensor the caller hands to a kernel for writing. No C++ exception crosses into Rust:
//! the shim catches them all and reports through the error buffer.

use std::ffi::{c_char, c_void};

use dlbridge_core::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensorVersioned, DLTensor};
use dlbridge_core::raw::view_from_dltensor;
use dlbridge_core::{Error, ErrorKind, Flags, ManagedTensor, Result, TensorView, TensorViewMut};
use tch::Tensor;

unsafe extern "C" {
    fn dlbridge_tch_from_dlpack(src: *mut DLManagedTensorVersioned, err: *mut c_char, err_len: usize) -> *mut c_void;
    fn dlbridge_tch_to_dlpack(tensor: *mut c_void, err: *mut c_char, err_len: usize) -> *mut DLManagedTensorVersioned;
    fn dlbridge_tch_borrow(tensor: *mut c_void, out: *mut DLTensor, err: *mut c_char, err_len: usize) -> i32;
}

fn text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn shim_error(what: &str, buf: &[u8]) -> Error {
    Error::Coded { kind: ErrorKind::Buffer, message: format!("{what}: {}", text(buf)) }
}

fn c_tensor(t: &Tensor) -> *mut c_void {
    t.as_ptr() as *mut c_void
}

/// An owning DLPack tensor sharing `t`'s storage.
pub(crate) fn to_managed(t: &Tensor) -> Result<ManagedTensor> {
    let mut err = [0u8; 512];
    // SAFETY: `t` is a live tch tensor (an at::Tensor*); the shim catches C++ exceptions.
    let raw = unsafe { dlbridge_tch_to_dlpack(c_tensor(t), err.as_mut_ptr().cast(), err.len()) };
    if raw.is_null() {
        return Err(shim_error("at::toDLPackVersioned", &err));
    }
    // SAFETY: a fresh, owned DLPack tensor from torch.
    unsafe { ManagedTensor::from_raw_versioned(raw) }
}

/// A tch tensor owning `m` (its deleter runs when torch frees the storage).
pub(crate) fn from_managed(m: ManagedTensor) -> Result<Tensor> {
    let raw = m.into_raw_versioned();
    let mut err = [0u8; 512];
    // SAFETY: ownership of `raw` passes to torch whatever the outcome.
    let t = unsafe { dlbridge_tch_from_dlpack(raw, err.as_mut_ptr().cast(), err.len()) };
    if t.is_null() {
        return Err(shim_error("at::fromDLPackVersioned", &err));
    }
    // SAFETY: a fresh heap at::Tensor*, which tch's Tensor owns and frees.
    Ok(unsafe { Tensor::from_ptr(t.cast()) })
}

/// A validated view of `t`'s memory, borrowing `t` (no allocation).
pub(crate) fn borrow(t: &Tensor, flags: Flags) -> Result<TensorView<'_>> {
    let mut out = DLTensor {
        data: std::ptr::null_mut(),
        device: DLDevice { device_type: DLDeviceType(0), device_id: 0 },
        ndim: 0,
        dtype: DLDataType { code: DLDataTypeCode(0), bits: 0, lanes: 0 },
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let mut err = [0u8; 512];
    // SAFETY: `t` is a live tch tensor; `out` is a valid slot; exceptions are caught in the shim.
    match unsafe { dlbridge_tch_borrow(c_tensor(t), &mut out, err.as_mut_ptr().cast(), err.len()) } {
        0 => {}
        1 => return Err(Error::InvalidArgument(text(&err))),
        2 => return Err(Error::Buffer(text(&err))),
        3 => {
            return Err(Error::DTypeMismatch { expected: "a non-quantized kind".into(), got: dlbridge_core::DType::U8 }.context(text(&err)));
        }
        _ => return Err(shim_error("at::toDLPackNonOwning", &err)),
    }
    // SAFETY: shape, strides and data point into `t`'s TensorImpl and storage,
    // which live (unmodified: nothing else runs on `t` meanwhile) while `t` is borrowed.
    unsafe { view_from_dltensor(&out, flags) }
}

/// A writable view of `t`'s memory, for a tensor the caller hands to a kernel
/// for writing (a `mut` argument, an output).
pub(crate) fn borrow_mut(t: &Tensor) -> Result<TensorViewMut<'_>> {
    let view = borrow(t, Flags::empty())?;
    // SAFETY: torch memory is shared-mutable (any holder of the tensor may
    // write it); the caller passed `t` to be written, and the registry refuses
    // every overlap between a written view and the other views of a call
    // before the kernel runs, so the kernel's writes alias nothing it reads.
    unsafe { TensorViewMut::from_view(view) }
}

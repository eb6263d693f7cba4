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
//! for a tensor the caller hands to a kernel for writing. [`Lending::lend`] lends
//! every tensor of a call in one shim call; a [`Lent`] DLTensor is turned into
//! a view (validated like any foreign tensor) bounded by the borrow of its
//! `Tensor`. No C++ exception crosses into Rust: the shim catches them all
//! and reports through the error buffer (or a code, for the batch).

use std::ffi::{c_char, c_void};

use dlbridge_core::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensorVersioned, DLTensor};
use dlbridge_core::raw::view_from_dltensor;
use dlbridge_core::{Error, ErrorKind, Flags, ManagedTensor, Result, TensorView, TensorViewMut};
use smallvec::SmallVec;
use tch::Tensor;

unsafe extern "C" {
    fn dlbridge_tch_from_dlpack(src: *mut DLManagedTensorVersioned, err: *mut c_char, err_len: usize) -> *mut c_void;
    fn dlbridge_tch_to_dlpack(tensor: *mut c_void, err: *mut c_char, err_len: usize) -> *mut DLManagedTensorVersioned;
    fn dlbridge_tch_borrow(tensor: *mut c_void, out: *mut DLTensor, err: *mut c_char, err_len: usize) -> i32;
    fn dlbridge_tch_borrow_n(tensors: *const *mut c_void, n: usize, out: *mut DLTensor, codes: *mut i32);
    fn dlbridge_tch_current_cuda_stream(device_id: i32, out: *mut *mut c_void, err: *mut c_char, err_len: usize) -> i32;
}

/// torch's current stream on CUDA device `id` (NULL: the legacy default stream).
pub(crate) fn current_cuda_stream(id: i32) -> Result<*mut c_void> {
    let mut err = [0u8; 512];
    let mut out = std::ptr::null_mut();
    // SAFETY: plain values and a valid out pointer; the shim catches C++ exceptions.
    let rc = unsafe { dlbridge_tch_current_cuda_stream(id, &mut out, err.as_mut_ptr().cast(), err.len()) };
    if rc != 0 {
        return Err(shim_error("torch's current CUDA stream", &err));
    }
    Ok(out)
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

/// A DLTensor with every field zero, for the shim to fill.
fn blank() -> DLTensor {
    DLTensor {
        data: std::ptr::null_mut(),
        device: DLDevice { device_type: DLDeviceType(0), device_id: 0 },
        ndim: 0,
        dtype: DLDataType { code: DLDataTypeCode(0), bits: 0, lanes: 0 },
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

/// The error for a tensor the shim refused to lend (its codes 1 to 3), or
/// for the C++ exception it caught (-1: asked again, one tensor, for the message).
#[cold]
#[inline(never)]
fn refused(t: &Tensor, code: i32) -> Error {
    match code {
        1 => Error::InvalidArgument("the tensor requires grad; call detach() first (dlbridge kernels do not record gradients)".into()),
        2 => Error::Buffer("sparse (non-strided) tensors have no DLPack form".into()),
        3 => Error::DTypeMismatch { expected: "a non-quantized kind".into(), got: dlbridge_core::DType::U8 }
            .context("quantized tensors have no DLPack form"),
        _ => {
            let mut out = blank();
            let mut err = [0u8; 512];
            // SAFETY: `t` is a live tch tensor; `out` is a valid slot; exceptions are caught in the shim.
            match unsafe { dlbridge_tch_borrow(c_tensor(t), &mut out, err.as_mut_ptr().cast(), err.len()) } {
                -1 => shim_error("at::toDLPackNonOwning", &err),
                0 => Error::Runtime("at::toDLPackNonOwning failed once, then succeeded".into()),
                code => refused(t, code),
            }
        }
    }
}

/// A validated view of `t`'s memory, borrowing `t` (no allocation).
pub(crate) fn borrow(t: &Tensor, flags: Flags) -> Result<TensorView<'_>> {
    let mut out = blank();
    // SAFETY: `t` is a live tch tensor; `out` is a valid slot; exceptions are
    // caught in the shim (no buffer: `refused` asks again for the message).
    match unsafe { dlbridge_tch_borrow(c_tensor(t), &mut out, std::ptr::null_mut(), 0) } {
        0 => {}
        code => return Err(refused(t, code)),
    }
    // SAFETY: shape, strides and data point into `t`'s TensorImpl and storage,
    // which live (unmodified: nothing else runs on `t` meanwhile) while `t` is borrowed.
    unsafe { view_from_dltensor(&out, flags) }
}

/// Every tensor of a call, lent by [`Lending::lend`] in one shim call: the
/// shim's DLTensor for each (valid where its code is 0) while the tensors are
/// borrowed for 't.
#[derive(Debug)]
pub(crate) struct Lending<'t> {
    /// The tensors: `first`, then `then` (slices: the lending stays covariant in 't).
    first: &'t [&'t Tensor],
    then: &'t [&'t Tensor],
    dls: SmallVec<[DLTensor; 8]>,
    codes: SmallVec<[i32; 8]>,
}

impl<'t> Lending<'t> {
    /// A lending of the tensors of `first`, then those of `then`, in order;
    /// nothing is lent before [`Lending::lend`].
    #[inline(always)]
    pub(crate) fn new(first: &'t [&'t Tensor], then: &'t [&'t Tensor]) -> Lending<'t> {
        Lending { first, then, dls: SmallVec::new(), codes: SmallVec::new() }
    }

    /// Lends every tensor (what [`borrow`] does for one), in place (a
    /// lending is a few hundred bytes: it is filled where it lives, not
    /// moved); each one is validated when its view is taken ([`Lending::view`]).
    #[inline(always)]
    pub(crate) fn lend(&mut self) -> &Self {
        let ptrs: SmallVec<[*mut c_void; 8]> = self.first.iter().chain(self.then).map(|t| c_tensor(t)).collect();
        self.dls.clear();
        self.codes.clear();
        self.dls.reserve_exact(ptrs.len());
        self.codes.reserve_exact(ptrs.len());
        for _ in 0..ptrs.len() {
            self.dls.push(blank());
            self.codes.push(-1);
        }
        // SAFETY: `ptrs` holds live tch tensors (borrowed for 't); `dls` and
        // `codes` have one writable slot per tensor; the shim catches every C++
        // exception (code -1).
        unsafe { dlbridge_tch_borrow_n(ptrs.as_ptr(), ptrs.len(), self.dls.as_mut_ptr(), self.codes.as_mut_ptr()) };
        self
    }

    /// How many tensors it lends.
    pub(crate) fn len(&self) -> usize {
        self.first.len() + self.then.len()
    }

    /// Tensor `i`.
    pub(crate) fn tensor(&self, i: usize) -> &'t Tensor {
        match self.first.get(i) {
            Some(t) => t,
            None => self.then[i - self.first.len()],
        }
    }

    /// The shim's refusal of tensor `i`, if it refused it (grad, sparse,
    /// quantized), or an error if it was not lent (no [`Lending::lend`] yet).
    #[inline]
    pub(crate) fn check(&self, i: usize) -> Result<()> {
        match self.codes.get(i) {
            Some(0) => Ok(()),
            Some(&code) => Err(refused(self.tensor(i), code)),
            None => Err(Error::Runtime(format!("tch tensor {i} was used before it was lent"))),
        }
    }

    /// The stream a call on these tensors runs on: torch's current stream on
    /// the device of the first lent CUDA tensor (so a CUDA kernel orders with
    /// the caller's other torch work), NULL when none is on CUDA. Read from
    /// the lent DLTensors: no shim call unless a tensor is on CUDA (a refused
    /// tensor fails the call when it is bound, so it is passed over here).
    pub(crate) fn stream(&self) -> Result<*mut c_void> {
        debug_assert_eq!(self.dls.len(), self.len(), "asked before Lending::lend");
        // torch's ROCm builds call HIP devices CUDA (tch's Device::Cuda, the
        // same stream API) and export them as kDLROCM.
        let gpu = [DLDeviceType::CUDA, DLDeviceType::ROCM];
        let cuda = self.dls.iter().zip(&self.codes).find(|(dl, code)| **code == 0 && gpu.contains(&dl.device.device_type));
        match cuda {
            Some((dl, _)) => current_cuda_stream(dl.device.device_id),
            None => Ok(std::ptr::null_mut()),
        }
    }

    /// A validated view of tensor `i`'s memory, borrowing the tensor (the
    /// shim's refusal, if it refused it).
    #[inline]
    pub(crate) fn view(&self, i: usize) -> Result<TensorView<'t>> {
        self.check(i)?;
        // SAFETY: code 0: the shim filled dls[i] from tensor i with
        // at::toDLPackNonOwning, so shape, strides and data point into its
        // TensorImpl and storage, which live (unmodified: nothing else runs on
        // the tensor meanwhile) while it is borrowed for 't.
        unsafe { view_from_dltensor(&self.dls[i], Flags::empty()) }
    }
}

/// A writable view of `t`'s memory, for a tensor the caller hands to a kernel
/// for writing (a `mut` argument, an output).
pub(crate) fn borrow_mut(t: &Tensor) -> Result<TensorViewMut<'_>> {
    writable(borrow(t, Flags::empty())?)
}

/// `view` (of a tensor lent by [`borrow`] or a [`Lending`]), writable: for
/// a tensor the caller hands to a kernel for writing (a `mut` argument, an output).
pub(crate) fn writable(view: TensorView<'_>) -> Result<TensorViewMut<'_>> {
    // SAFETY: torch memory is shared-mutable (any holder of the tensor may
    // write it); the caller passed the tensor to be written, and the registry
    // refuses every overlap between a written view and the other views of a
    // call before the kernel runs, so the kernel's writes alias nothing it reads.
    unsafe { TensorViewMut::from_view(view) }
}

//! Owned DLPack tensors: foreign ones we consume, and Rust owners we export.
//!
//! Invariants: a [`ManagedTensor`] holds exactly one producer reference — a
//! `DLManagedTensorVersioned*` or legacy `DLManagedTensor*` — and calls its
//! deleter exactly once, from `Drop` (which also runs on every error path and
//! during unwinding, because the guard is created before any validation), or
//! never, if ownership is handed on with `into_raw_*`. Of a foreign struct we
//! trust only the deleter: before the version is checked we read nothing but
//! `version` and `deleter` (the fields DLPack freezes); the `DLTensor` is read
//! only after its major version matched, and only through `raw`'s checks. The
//! cached view borrows the producer's shape/strides arrays, which live until
//! the deleter runs, so it is never handed out for longer than `&self`.
//! Export contexts are `#[repr(C)]` with the DLPack struct first, so the
//! pointer the consumer gives back to the deleter is the context's address.

use std::ffi::c_void;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::Arc;

use dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use smallvec::SmallVec;

use crate::Flags;
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::{MAX_NDIM, check_permutation, contiguous_strides};
use crate::raw::view_from_dltensor;
use crate::view::{TensorView, TensorViewMut};

/// The DLPack major version this build implements.
pub const DLPACK_MAJOR: u32 = dlpark::ffi::DLPACK_MAJOR_VERSION;
/// The DLPack minor version this build implements.
pub const DLPACK_MINOR: u32 = dlpark::ffi::DLPACK_MINOR_VERSION;

#[derive(Debug)]
enum RawPtr {
    Versioned(NonNull<DLManagedTensorVersioned>),
    Legacy(NonNull<DLManagedTensor>),
}

/// Calls the producer's deleter exactly once, when dropped.
#[derive(Debug)]
struct Guard(Option<RawPtr>);

impl Guard {
    /// Gives up ownership without calling the deleter.
    fn release(mut self) -> Option<RawPtr> {
        self.0.take()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        match self.0.take() {
            // SAFETY: we own this reference (type invariant) and drop it once; the
            // `deleter` field is frozen by DLPack for every major version, so
            // reading it is valid even when the version was refused.
            Some(RawPtr::Versioned(p)) => unsafe {
                if let Some(deleter) = (*p.as_ptr()).deleter {
                    deleter(p.as_ptr());
                }
            },
            // SAFETY: as above, for the legacy struct.
            Some(RawPtr::Legacy(p)) => unsafe {
                if let Some(deleter) = (*p.as_ptr()).deleter {
                    deleter(p.as_ptr());
                }
            },
            None => {}
        }
    }
}

/// An owned, validated DLPack tensor. Dropping it calls the producer's deleter
/// exactly once.
pub struct ManagedTensor {
    // Declared before `guard`: dropped first, while the arrays it borrows still live.
    view: TensorView<'static>,
    version: Option<DLPackVersion>,
    guard: Guard,
}

// SAFETY: DLPack requires deleters to be callable from any thread, and the
// tensor is only read through `&self` (shared) or written through `&mut self`.
unsafe impl Send for ManagedTensor {}
// SAFETY: `&ManagedTensor` only gives shared, read-only views.
unsafe impl Sync for ManagedTensor {}

impl fmt::Debug for ManagedTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedTensor").field("version", &self.version.map(|v| (v.major, v.minor))).field("view", &self.view).finish()
    }
}

impl ManagedTensor {
    /// Takes ownership of a versioned DLPack tensor and validates it.
    ///
    /// A NULL pointer is an error. Every other error (a major version other
    /// than [`DLPACK_MAJOR`], an unknown dtype or device, a bad layout) calls
    /// the deleter before returning.
    ///
    /// # Safety
    /// `ptr` must be NULL or a `DLManagedTensorVersioned*` whose ownership the
    /// caller hands over (nobody else will call its deleter), whose `version`
    /// and `deleter` fields are readable, and which, if its major version is
    /// ours, satisfies [`view_from_dltensor`]'s contract until its deleter runs.
    pub unsafe fn from_raw_versioned(ptr: *mut DLManagedTensorVersioned) -> Result<ManagedTensor> {
        let Some(p) = NonNull::new(ptr) else {
            return Err(Error::NullPointer("DLManagedTensorVersioned pointer".into()));
        };
        let guard = Guard(Some(RawPtr::Versioned(p)));
        // SAFETY: `version` is the first, frozen field; readable per the contract.
        let version = unsafe { (*p.as_ptr()).version };
        if version.major != DLPACK_MAJOR {
            return Err(Error::UnsupportedVersion { major: version.major, minor: version.minor, supported: DLPACK_MAJOR });
        }
        // SAFETY: the major version matches, so the layout is ours; flags is a plain u64.
        let flags = Flags::from_bits_retain(unsafe { (*p.as_ptr()).flags.bits() });
        // SAFETY: the DLTensor and the arrays it points to live until the deleter
        // runs, which happens only after `view` is dropped (field order, and the
        // view is never handed out for longer than &self).
        let view = unsafe { view_from_dltensor(&raw const (*p.as_ptr()).dl_tensor, flags) }?;
        Ok(ManagedTensor { view, version: Some(version), guard })
    }

    /// Takes ownership of a legacy (unversioned) DLPack tensor and validates it.
    /// Legacy tensors carry no flags: they are writable and not known to be copies.
    ///
    /// # Safety
    /// As [`ManagedTensor::from_raw_versioned`], for a `DLManagedTensor*`.
    pub unsafe fn from_raw_legacy(ptr: *mut DLManagedTensor) -> Result<ManagedTensor> {
        let Some(p) = NonNull::new(ptr) else {
            return Err(Error::NullPointer("DLManagedTensor pointer".into()));
        };
        let guard = Guard(Some(RawPtr::Legacy(p)));
        // SAFETY: as in from_raw_versioned; legacy tensors have no version to check.
        let view = unsafe { view_from_dltensor(&raw const (*p.as_ptr()).dl_tensor, Flags::empty()) }?;
        Ok(ManagedTensor { view, version: None, guard })
    }

    /// A read-only view, borrowing the tensor.
    #[inline]
    pub fn view(&self) -> &TensorView<'_> {
        &self.view
    }

    /// A writable view. Refused for READ_ONLY tensors and for layouts where
    /// elements share memory.
    #[inline]
    pub fn view_mut(&mut self) -> Result<TensorViewMut<'_>> {
        // SAFETY: `&mut self` is the only handle to this producer reference; the
        // DLPack contract hands the consumer access to the memory until the
        // deleter runs, and from_view refuses READ_ONLY tensors.
        unsafe { TensorViewMut::from_view(self.view.clone()) }
    }

    /// The DLPack version, or `None` for a legacy tensor.
    #[inline]
    pub fn version(&self) -> Option<(u32, u32)> {
        self.version.map(|v| (v.major, v.minor))
    }
    /// Whether this came as a legacy `DLManagedTensor`.
    #[inline]
    pub fn is_legacy(&self) -> bool {
        self.version.is_none()
    }
    /// The producer's flags (empty for legacy tensors).
    #[inline]
    pub fn flags(&self) -> Flags {
        self.view.flags()
    }
    /// READ_ONLY: the consumer must not write.
    #[inline]
    pub fn is_read_only(&self) -> bool {
        self.flags().contains(Flags::READ_ONLY)
    }
    /// IS_COPIED: the producer made a copy the consumer owns alone.
    #[inline]
    pub fn is_copied(&self) -> bool {
        self.flags().contains(Flags::IS_COPIED)
    }
    /// IS_SUBBYTE_TYPE_PADDED: sub-byte elements each take a whole byte.
    #[inline]
    pub fn is_subbyte_padded(&self) -> bool {
        self.flags().contains(Flags::IS_SUBBYTE_TYPE_PADDED)
    }
    /// The dtype.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.view.dtype()
    }
    /// The device.
    #[inline]
    pub fn device(&self) -> Device {
        self.view.device()
    }
    /// The shape.
    #[inline]
    pub fn shape(&self) -> &[i64] {
        self.view.shape()
    }
    /// The strides in elements.
    #[inline]
    pub fn strides(&self) -> &[i64] {
        self.view.strides()
    }

    /// Hands ownership on as a versioned DLPack pointer: the receiver must call
    /// its deleter. A legacy tensor is wrapped (zero copy) in a new versioned one.
    pub fn into_raw_versioned(self) -> *mut DLManagedTensorVersioned {
        let this = match self.take_raw(|p| match p {
            RawPtr::Versioned(p) => Some(p.as_ptr()),
            RawPtr::Legacy(_) => None,
        }) {
            Ok(p) => return p,
            Err(this) => this,
        };
        let (data, desc_dims, parts) = this.rewrap_parts();
        let desc = parts.desc(&desc_dims);
        VersionedCtx::boxed(this, data, &desc, desc_dims.clone())
    }

    /// Hands ownership on as a legacy DLPack pointer: the receiver must call its
    /// deleter. A versioned tensor is wrapped (zero copy). READ_ONLY tensors
    /// cannot be expressed in the legacy struct: that is a Buffer error (and the
    /// tensor is released).
    pub fn into_raw_legacy(self) -> Result<*mut DLManagedTensor> {
        if self.is_read_only() {
            return Err(Error::Buffer("a read-only tensor cannot be exported as a legacy DLManagedTensor (it has no flags field)".into()));
        }
        let this = match self.take_raw(|p| match p {
            RawPtr::Legacy(p) => Some(p.as_ptr()),
            RawPtr::Versioned(_) => None,
        }) {
            Ok(p) => return Ok(p),
            Err(this) => this,
        };
        let (data, desc_dims, parts) = this.rewrap_parts();
        let desc = parts.desc(&desc_dims);
        Ok(LegacyCtx::boxed(this, data, &desc, desc_dims.clone()))
    }

    /// What a zero-copy re-export of this tensor needs: data pointer, shape and strides, and the rest.
    fn rewrap_parts(&self) -> (*mut c_void, SmallVec<[i64; 12]>, RewrapParts) {
        let v = &self.view;
        let mut dims: SmallVec<[i64; 12]> = SmallVec::with_capacity(v.ndim() * 2);
        dims.extend_from_slice(v.shape());
        dims.extend_from_slice(v.strides());
        let parts = RewrapParts { dtype: v.dtype(), device: v.device(), ndim: v.ndim(), flags: v.flags() };
        (v.data_ptr().cast_mut(), dims, parts)
    }

    /// Gives up ownership of the producer pointer, without calling its deleter,
    /// when `pick` accepts it (returning what `pick` made of it); otherwise
    /// hands the tensor back untouched.
    #[allow(clippy::result_large_err)] // private: hands the tensor back by value, no boxing wanted
    fn take_raw<P>(self, pick: impl FnOnce(&RawPtr) -> Option<P>) -> std::result::Result<P, ManagedTensor> {
        let Some(taken) = self.guard.0.as_ref().and_then(pick) else {
            return Err(self);
        };
        let ManagedTensor { view, guard, .. } = self;
        drop(view); // it borrows the producer's arrays: gone before ownership leaves
        let _ = guard.release();
        Ok(taken)
    }

    /// Exports any Rust owner of memory as a versioned DLPack tensor, with zero
    /// copies: `owner` is kept alive until the consumer calls the deleter. The
    /// description is validated like any foreign tensor; on error the owner is dropped.
    ///
    /// # Safety
    /// `data` must be valid for the layout `desc` describes (readable, and
    /// writable unless `desc.flags` has READ_ONLY) for as long as `owner` lives,
    /// and the owner must not otherwise write that memory while it is exported
    /// (or must set READ_ONLY and not write it either).
    pub unsafe fn export_owner<O: Send + 'static>(owner: O, data: *mut c_void, desc: &TensorDesc<'_>) -> Result<ManagedTensor> {
        if desc.shape.len() > MAX_NDIM {
            return Err(Error::field("ndim", desc.shape.len(), format!("more than dlbridge's limit of {MAX_NDIM} dims")));
        }
        let strides: SmallVec<[i64; 6]> = match desc.strides {
            Some(s) => s.into(),
            None => contiguous_strides(desc.shape)?,
        };
        if strides.len() != desc.shape.len() {
            return Err(Error::field("strides", format!("{} entries", strides.len()), format!("ndim is {}", desc.shape.len())));
        }
        let mut dims: SmallVec<[i64; 12]> = SmallVec::with_capacity(desc.shape.len() * 2);
        dims.extend_from_slice(desc.shape);
        dims.extend_from_slice(&strides);
        let ptr = VersionedCtx::boxed(owner, data, desc, dims);
        // SAFETY: a freshly built, owned context whose deleter is `versioned_deleter`;
        // its DLTensor arrays live in the context; data validity is the caller's contract.
        unsafe { ManagedTensor::from_raw_versioned(ptr) }
    }

    /// The same memory with its dims reordered, zero copy: dim `i` of the result
    /// is dim `axes[i]` of this tensor (NumPy's `transpose`, torch's `permute`).
    /// This tensor lives inside the result, and its deleter runs when the
    /// result's does; the flags (READ_ONLY included) carry over.
    pub fn permute(self, axes: &[usize]) -> Result<ManagedTensor> {
        check_permutation(axes, self.view.ndim())?;
        let shape: SmallVec<[i64; 6]> = axes.iter().map(|&a| self.view.shape()[a]).collect();
        let strides: SmallVec<[i64; 6]> = axes.iter().map(|&a| self.view.strides()[a]).collect();
        let desc = TensorDesc {
            dtype: self.view.dtype(),
            device: self.view.device(),
            shape: &shape,
            strides: Some(&strides),
            byte_offset: 0,
            flags: self.view.flags(),
        };
        let data = self.view.data_ptr().cast_mut();
        // SAFETY: the result reaches exactly the elements this validated tensor
        // reaches (the same dims, strides and element 0, in another order), and
        // `self`, which keeps that memory alive, moves into the result as its
        // owner; the flags carry over, so it is written only if this one may be.
        unsafe { Self::export_owner(self, data, &desc) }
    }

    /// Exports a `Vec` as a writable contiguous tensor of the given shape.
    pub fn from_vec<T: Element>(mut v: Vec<T>, shape: &[i64]) -> Result<ManagedTensor> {
        check_len(v.len(), shape)?;
        let data = v.as_mut_ptr().cast::<c_void>();
        // SAFETY: the Vec's buffer holds exactly numel contiguous Ts and does not
        // move when the Vec (its owner) moves into the context.
        unsafe { Self::export_owner(v, data, &TensorDesc::contiguous(T::DTYPE, shape)) }
    }

    /// Exports shared, immutable memory as a READ_ONLY contiguous tensor.
    pub fn from_arc<T: Element>(a: Arc<[T]>, shape: &[i64]) -> Result<ManagedTensor> {
        check_len(a.len(), shape)?;
        let data = a.as_ptr().cast_mut().cast::<c_void>();
        let desc = TensorDesc { flags: Flags::READ_ONLY, ..TensorDesc::contiguous(T::DTYPE, shape) };
        // SAFETY: the Arc keeps the slice alive and immutable; flagged READ_ONLY so
        // no consumer writes it.
        unsafe { Self::export_owner(a, data, &desc) }
    }
}

fn check_len(len: usize, shape: &[i64]) -> Result<()> {
    let numel = shape.iter().try_fold(1i64, |a, &n| if n < 0 { None } else { a.checked_mul(n) });
    if numel.and_then(|n| usize::try_from(n).ok()) != Some(len) {
        return Err(Error::Shape(format!("shape {shape:?} does not hold {len} elements")));
    }
    Ok(())
}

/// How an exported tensor's memory is laid out.
#[derive(Debug, Clone, Copy)]
pub struct TensorDesc<'a> {
    /// Element type.
    pub dtype: DType,
    /// Device the memory lives on.
    pub device: Device,
    /// Shape.
    pub shape: &'a [i64],
    /// Strides in elements; `None` for compact row-major (exports always fill strides in).
    pub strides: Option<&'a [i64]>,
    /// Bytes from `data` to element `[0, ..]`.
    pub byte_offset: u64,
    /// DLPack flags to export with.
    pub flags: Flags,
}

impl<'a> TensorDesc<'a> {
    /// A compact row-major CPU tensor, no flags.
    #[inline]
    pub fn contiguous(dtype: DType, shape: &'a [i64]) -> TensorDesc<'a> {
        TensorDesc { dtype, device: Device::CPU, shape, strides: None, byte_offset: 0, flags: Flags::empty() }
    }
}

/// One allocation holding the DLPack struct (first, so its address is the
/// context's), the shape and strides it points to, and the owner of the data.
#[repr(C)]
struct VersionedCtx<O> {
    managed: DLManagedTensorVersioned,
    dims: SmallVec<[i64; 12]>,
    owner: O,
}

impl<O: Send + 'static> VersionedCtx<O> {
    fn boxed(owner: O, data: *mut c_void, desc: &TensorDesc<'_>, dims: SmallVec<[i64; 12]>) -> *mut DLManagedTensorVersioned {
        let ndim = desc.shape.len();
        let mut ctx = Box::new(VersionedCtx {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion { major: DLPACK_MAJOR, minor: DLPACK_MINOR },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(versioned_deleter::<O>),
                flags: desc.flags,
                dl_tensor: dl_tensor(data, desc),
            },
            dims,
            owner,
        });
        // The dims buffer (inline in the box, or on the heap) does not move again.
        let base = ctx.dims.as_mut_ptr();
        ctx.managed.dl_tensor.shape = base;
        ctx.managed.dl_tensor.strides = base.wrapping_add(ndim);
        let raw = Box::into_raw(ctx);
        raw.cast()
    }
}

unsafe extern "C" fn versioned_deleter<O>(p: *mut DLManagedTensorVersioned) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` is the address of a Box<VersionedCtx<O>> we leaked in `boxed`
    // (repr(C), managed first) and DLPack calls the deleter once.
    let ctx = unsafe { Box::from_raw(p.cast::<VersionedCtx<O>>()) };
    // The owner's Drop is arbitrary code: it must not unwind into C.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(ctx)));
}

struct RewrapParts {
    dtype: DType,
    device: Device,
    ndim: usize,
    flags: Flags,
}

impl RewrapParts {
    fn desc<'a>(&self, dims: &'a [i64]) -> TensorDesc<'a> {
        TensorDesc {
            dtype: self.dtype,
            device: self.device,
            shape: &dims[..self.ndim],
            strides: Some(&dims[self.ndim..]),
            byte_offset: 0,
            flags: self.flags,
        }
    }
}

/// The legacy flavour of [`VersionedCtx`].
#[repr(C)]
struct LegacyCtx<O> {
    managed: DLManagedTensor,
    dims: SmallVec<[i64; 12]>,
    owner: O,
}

impl<O: Send + 'static> LegacyCtx<O> {
    fn boxed(owner: O, data: *mut c_void, desc: &TensorDesc<'_>, dims: SmallVec<[i64; 12]>) -> *mut DLManagedTensor {
        let mut ctx = Box::new(LegacyCtx {
            managed: DLManagedTensor {
                dl_tensor: dl_tensor(data, desc),
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(legacy_deleter::<O>),
            },
            dims,
            owner,
        });
        let base = ctx.dims.as_mut_ptr();
        ctx.managed.dl_tensor.shape = base;
        ctx.managed.dl_tensor.strides = base.wrapping_add(desc.shape.len());
        Box::into_raw(ctx).cast()
    }
}

unsafe extern "C" fn legacy_deleter<O>(p: *mut DLManagedTensor) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` is the address of a Box<LegacyCtx<O>> leaked in LegacyCtx::boxed
    // (repr(C), managed first) and DLPack calls the deleter once.
    let ctx = unsafe { Box::from_raw(p.cast::<LegacyCtx<O>>()) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(ctx)));
}

/// The DLTensor for an export; shape and strides are filled in once the context is boxed.
fn dl_tensor(data: *mut c_void, desc: &TensorDesc<'_>) -> DLTensor {
    DLTensor {
        data,
        device: desc.device.to_dl(),
        ndim: desc.shape.len() as i32,
        dtype: desc.dtype.to_dl(),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: desc.byte_offset,
    }
}

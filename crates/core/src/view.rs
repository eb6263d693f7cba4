//! Borrowed, validated tensor views and typed access to their elements.
//!
//! Invariants: a `TensorView<'a>` is only built from a layout that
//! [`check_layout`] accepted, for memory its creator promised is readable for
//! `'a` over `[data + byte_lo, data + byte_hi)` (when the device is host
//! accessible) and that nobody writes while the view lives. A
//! `TensorViewMut<'a>` additionally holds the only access to that memory for
//! `'a`, is not flagged READ_ONLY, and no two of its logical elements share
//! memory. `data` already includes `byte_offset`. Typed accessors check dtype,
//! device, alignment and layout before they turn the pointer into references.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::mem::size_of;
use std::ops::Deref;

use dlpark::ffi::DLTensor;

use crate::Flags;
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::{Extent, Offsets, check_layout, contiguous_strides, is_contiguous, is_non_overlapping};

/// Strides of a view: borrowed from the producer, or computed (compact
/// row-major) when the producer gave NULL (boxed: that legacy case is rare,
/// and a small `TensorView` keeps every move on the call path cheap).
#[derive(Clone)]
pub(crate) enum Strides<'a> {
    Borrowed(&'a [i64]),
    Owned(Box<[i64]>),
}

impl Deref for Strides<'_> {
    type Target = [i64];
    fn deref(&self) -> &[i64] {
        match self {
            Strides::Borrowed(s) => s,
            Strides::Owned(s) => s,
        }
    }
}

/// A borrowed, validated, read-only view of a tensor.
#[derive(Clone)]
pub struct TensorView<'a> {
    data: *const u8,
    shape: &'a [i64],
    strides: Strides<'a>,
    dtype: DType,
    device: Device,
    flags: Flags,
    extent: Extent,
    _life: PhantomData<&'a [u8]>,
}

// SAFETY: a TensorView is a shared borrow of memory nobody writes while it lives,
// plus plain metadata: sending or sharing it across threads is like `&[u8]`.
unsafe impl Send for TensorView<'_> {}
// SAFETY: as above; only reads happen through a TensorView.
unsafe impl Sync for TensorView<'_> {}

impl fmt::Debug for TensorView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorView")
            .field("dtype", &self.dtype)
            .field("device", &self.device)
            .field("shape", &self.shape)
            .field("strides", &&*self.strides)
            .field("data", &self.data)
            .field("flags", &self.flags)
            .finish()
    }
}

fn slice_bounds_check(extent: &Extent, offset_bytes: usize, len_bytes: usize) -> Result<()> {
    if extent.numel == 0 {
        return Ok(());
    }
    let lo = offset_bytes as i128 + extent.byte_lo as i128;
    let hi = offset_bytes as i128 + extent.byte_hi as i128;
    if lo < 0 || hi > len_bytes as i128 {
        return Err(Error::InvalidArgument(format!("strided view reaches bytes [{lo}, {hi}) but the slice has {len_bytes} bytes")));
    }
    Ok(())
}

impl<'a> TensorView<'a> {
    /// Validates a layout and builds a view over it.
    ///
    /// # Safety
    /// If the layout is accepted and `device` is host accessible, the bytes
    /// `[data + byte_offset + byte_lo, data + byte_offset + byte_hi)` must be
    /// readable and not written for `'a`.
    pub unsafe fn from_raw_parts(
        data: *const u8,
        byte_offset: u64,
        shape: &'a [i64],
        strides: Option<&'a [i64]>,
        dtype: DType,
        device: Device,
        flags: Flags,
    ) -> Result<TensorView<'a>> {
        let padded = flags.contains(Flags::IS_SUBBYTE_TYPE_PADDED);
        let extent = check_layout(shape, strides, dtype, data as usize, byte_offset, padded)?;
        let strides = match strides {
            Some(s) => Strides::Borrowed(s),
            None => Strides::Owned(contiguous_strides(shape)?.into_vec().into_boxed_slice()),
        };
        // check_layout proved that data + byte_offset does not wrap when the tensor
        // has elements; for empty tensors the pointer is never dereferenced.
        // wrapping_add keeps this step free of UB either way.
        let data = data.wrapping_add(byte_offset as usize);
        Ok(TensorView { data, shape, strides, dtype, device, flags, extent, _life: PhantomData })
    }

    /// Builds a view from a layout that was already validated, without checking it again.
    ///
    /// # Safety
    /// `extent` must be exactly what [`check_layout`] returned for `shape`,
    /// `strides`, `dtype`, the IS_SUBBYTE_TYPE_PADDED bit of `flags`, the
    /// address `data` and byte offset 0; and the contract of
    /// [`TensorView::from_raw_parts`] must hold for `data` (byte offset 0).
    pub unsafe fn from_validated_parts(
        data: *const u8,
        shape: &'a [i64],
        strides: &'a [i64],
        dtype: DType,
        device: Device,
        flags: Flags,
        extent: Extent,
    ) -> TensorView<'a> {
        TensorView { data, shape, strides: Strides::Borrowed(strides), dtype, device, flags, extent, _life: PhantomData }
    }

    /// A read-only CPU view of `shape` whose every element is the one zero
    /// element of `dtype` (every stride 0): real memory that reads as zeros,
    /// for what needs shapes and dtypes but no values (the output shapes of
    /// a call being traced). Any single-lane dtype of at most 16 bytes.
    pub fn zeros_broadcast(dtype: DType, shape: &'a [i64]) -> Result<TensorView<'a>> {
        #[repr(C, align(64))]
        struct Zeros([u8; 64]);
        static ZEROS: Zeros = Zeros([0; 64]);
        static STRIDES: [i64; crate::layout::MAX_NDIM] = [0; crate::layout::MAX_NDIM];
        if dtype.bits() as usize * dtype.lanes() as usize > 8 * 16 {
            return Err(Error::InvalidArgument(format!("zeros_broadcast: {dtype} is wider than 16 bytes")));
        }
        let strides = STRIDES.get(..shape.len()).ok_or_else(|| Error::field("ndim", shape.len(), "more than dlbridge's limit"))?;
        // SAFETY: every element of the view is the first bytes of ZEROS (all
        // strides are 0, and the element fits its 64 aligned bytes), a static
        // that is never written; the view is READ_ONLY.
        unsafe { Self::from_raw_parts(ZEROS.0.as_ptr(), 0, shape, Some(strides), dtype, Device::CPU, Flags::READ_ONLY) }
    }

    /// A contiguous CPU view of a slice with the given shape (its product must equal the length).
    #[inline]
    pub fn from_slice<T: Element>(data: &'a [T], shape: &'a [i64]) -> Result<TensorView<'a>> {
        Self::from_slice_strided(data, shape, None, 0)
    }

    /// A strided CPU view of a slice: element `idx` is `data[offset + sum(idx[d] * strides[d])]`.
    /// Every element the view reaches must lie inside `data`. Views of shared
    /// slices carry the READ_ONLY flag.
    pub fn from_slice_strided<T: Element>(
        data: &'a [T],
        shape: &'a [i64],
        strides: Option<&'a [i64]>,
        offset: usize,
    ) -> Result<TensorView<'a>> {
        let offset_bytes =
            offset.checked_mul(size_of::<T>()).ok_or_else(|| Error::InvalidArgument(format!("offset {offset} overflows")))?;
        if strides.is_none() {
            let numel: Option<i64> = shape.iter().try_fold(1i64, |a, &n| a.checked_mul(n.max(0)));
            if numel.and_then(|n| usize::try_from(n).ok()).and_then(|n| n.checked_add(offset)) != Some(data.len()) {
                return Err(Error::Shape(format!("shape {shape:?} does not match a slice of {} elements (offset {offset})", data.len())));
            }
        }
        // SAFETY: the view is returned only if its whole byte range lies inside
        // `data` (checked right below, before any access), which is borrowed
        // immutably for 'a.
        let view = unsafe {
            Self::from_raw_parts(data.as_ptr().cast(), offset_bytes as u64, shape, strides, T::DTYPE, Device::CPU, Flags::READ_ONLY)
        }?;
        slice_bounds_check(&view.extent, offset_bytes, std::mem::size_of_val(data))?;
        Ok(view)
    }

    /// The shape.
    #[inline]
    pub fn shape(&self) -> &'a [i64] {
        self.shape
    }
    /// The strides, in elements (computed compact strides when the producer gave NULL).
    #[inline]
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }
    /// Number of dimensions.
    #[inline]
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    /// The dtype.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The device.
    #[inline]
    pub fn device(&self) -> Device {
        self.device
    }
    /// The DLPack flags the producer set (or READ_ONLY for shared-slice views).
    #[inline]
    pub fn flags(&self) -> Flags {
        self.flags
    }
    /// Whether writes are forbidden.
    #[inline]
    pub fn is_read_only(&self) -> bool {
        self.flags.contains(Flags::READ_ONLY)
    }
    /// Number of elements.
    #[inline]
    pub fn numel(&self) -> usize {
        self.extent.numel
    }
    /// Whether the tensor has no elements.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.extent.numel == 0
    }
    /// The bytes the tensor touches, relative to [`TensorView::data_ptr`].
    #[inline]
    pub fn extent(&self) -> Extent {
        self.extent
    }
    /// Address of element `[0, .., 0]` (byte_offset applied). May be NULL for empty tensors.
    #[inline]
    pub fn data_ptr(&self) -> *const c_void {
        self.data.cast()
    }
    /// Whether the memory is compact row-major.
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(self.shape, &self.strides)
    }
    /// Whether no two logical elements share memory.
    #[inline]
    pub fn is_non_overlapping(&self) -> bool {
        is_non_overlapping(self.shape, &self.strides)
    }

    /// A DLTensor describing this view (byte_offset 0, data at element `[0, ..]`).
    /// Its pointers borrow `self`: keep the view alive while the DLTensor is used.
    pub fn as_dltensor(&self) -> DLTensor {
        DLTensor {
            data: self.data as *mut c_void,
            device: self.device.to_dl(),
            ndim: self.shape.len() as i32,
            dtype: self.dtype.to_dl(),
            shape: self.shape.as_ptr() as *mut i64,
            strides: self.strides.as_ptr() as *mut i64,
            byte_offset: 0,
        }
    }

    /// The checks every typed access ([`TensorView::iter`],
    /// [`TensorView::as_slice`]) makes before it reads elements of type `T`:
    /// the dtype is `T`'s, the memory is host-accessible and `data` is aligned
    /// for `T`. `what` names the access in the error. A kernel that walks the
    /// layout itself calls this once, before any pointer use.
    #[inline]
    pub fn check_typed<T: Element>(&self, what: &str) -> Result<()> {
        if self.dtype != T::DTYPE {
            return Err(Error::DTypeMismatch { expected: T::DTYPE.to_string(), got: self.dtype }.context(what.to_owned()));
        }
        if !self.device.is_host_accessible() {
            return Err(Error::UnsupportedDevice { got: self.device, what: format!("{what} reads memory on the host") });
        }
        if self.extent.numel > 0 && !(self.data as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(Error::InvalidArgument(format!("{what}: data {:p} is not aligned for {}", self.data, T::DTYPE)));
        }
        Ok(())
    }

    /// The elements as a slice: needs the dtype of `T`, host memory and a
    /// contiguous layout.
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T]> {
        self.check_typed::<T>("as_slice")?;
        if !self.is_contiguous() {
            return Err(Error::NotContiguous { what: "as_slice".into(), shape: self.shape.to_vec(), strides: self.strides.to_vec() });
        }
        if self.extent.numel == 0 {
            return Ok(&[]);
        }
        // SAFETY: dtype == T::DTYPE (size and validity of every bit pattern by the
        // Element contract), host memory, alignment checked; the layout is
        // contiguous so the numel elements from `data` are exactly the validated
        // byte range, readable and unmodified for 'a (type invariant).
        Ok(unsafe { std::slice::from_raw_parts(self.data.cast::<T>(), self.extent.numel) })
    }

    /// The raw bytes of a contiguous host tensor (any dtype, including packed sub-byte types).
    pub fn as_bytes(&self) -> Result<&'a [u8]> {
        if !self.device.is_host_accessible() {
            return Err(Error::UnsupportedDevice { got: self.device, what: "as_bytes reads memory on the host".into() });
        }
        if !self.is_contiguous() {
            return Err(Error::NotContiguous { what: "as_bytes".into(), shape: self.shape.to_vec(), strides: self.strides.to_vec() });
        }
        if self.extent.numel == 0 {
            return Ok(&[]);
        }
        // SAFETY: host memory; contiguous, so [data, data + byte_hi) is the validated
        // range (byte_lo == 0), readable and unmodified for 'a.
        Ok(unsafe { std::slice::from_raw_parts(self.data, self.extent.byte_hi as usize) })
    }

    /// Every byte the tensor touches, from its lowest to its highest (any dtype,
    /// any strides, packed sub-byte types included), and the index in that
    /// slice of the first byte of element `[0, .., 0]`. Element offset `off`
    /// (in elements, as [`Offsets`] yields them) starts at bit
    /// `8 * index + off * dtype.storage_bits(padded)` of the slice. Empty for
    /// tensors without elements.
    pub fn span_bytes(&self) -> Result<(&'a [u8], usize)> {
        if !self.device.is_host_accessible() {
            return Err(Error::UnsupportedDevice { got: self.device, what: "span_bytes reads memory on the host".into() });
        }
        if self.extent.numel == 0 {
            return Ok((&[], 0));
        }
        // byte_lo <= 0 <= byte_hi for a tensor with elements (element [0, ..] is inside the extent).
        let start = self.data.wrapping_offset(self.extent.byte_lo);
        // SAFETY: [data + byte_lo, data + byte_hi) is the validated extent of host
        // memory, readable and not written for 'a (type invariant); check_layout
        // bounded its length by isize::MAX and proved it does not wrap.
        let bytes = unsafe { std::slice::from_raw_parts(start, self.extent.span()) };
        Ok((bytes, self.extent.byte_lo.unsigned_abs()))
    }

    /// Iterates the elements in row-major logical order, whatever the strides.
    #[inline]
    pub fn iter<T: Element>(&self) -> Result<Iter<'a, T>> {
        self.check_typed::<T>("iter")?;
        Ok(Iter { walk: Offsets::new(self.shape, &self.strides), data: self.data.cast(), _life: PhantomData })
    }

    /// Copies the elements out in row-major logical order. The allocation is
    /// fallible: a tensor too large to copy (a broadcast view of 2^46 elements,
    /// say) is an [`Error::OutOfMemory`], never an abort.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let mut out = try_vec_with_capacity::<T>(self.extent.numel, "a copy of a tensor's elements")?;
        match self.as_slice::<T>() {
            Ok(s) => out.extend_from_slice(s),
            Err(_) => out.extend(self.iter::<T>()?),
        }
        Ok(out)
    }
}

/// An empty `Vec` with room for `n` elements, or [`Error::OutOfMemory`] (never
/// an abort) when that much memory cannot be had.
pub fn try_vec_with_capacity<T>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        bytes: n as u128 * size_of::<T>() as u128,
        what: format!("{what} ({n} elements of {} bytes)", size_of::<T>()),
    })?;
    Ok(v)
}

/// Row-major iterator over the elements of a [`TensorView`].
pub struct Iter<'a, T> {
    walk: Offsets,
    data: *const T,
    _life: PhantomData<&'a [T]>,
}

impl<T> fmt::Debug for Iter<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Iter").field("remaining", &self.walk.len()).finish()
    }
}

impl<T: Element> Iterator for Iter<'_, T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        let off = self.walk.next()?;
        // SAFETY: `off` addresses a logical element, inside the validated extent
        // of host memory readable for 'a; dtype checked; read_unaligned needs no
        // alignment and every bit pattern is a valid T (Element contract).
        Some(unsafe { self.data.wrapping_offset(off).read_unaligned() })
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.walk.len(), Some(self.walk.len()))
    }
}
impl<T: Element> ExactSizeIterator for Iter<'_, T> {}

/// A borrowed, validated view of a tensor the holder may write.
pub struct TensorViewMut<'a> {
    view: TensorView<'a>,
    _mut: PhantomData<&'a mut [u8]>,
}

impl fmt::Debug for TensorViewMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TensorViewMut").field(&self.view).finish()
    }
}

impl<'a> TensorViewMut<'a> {
    /// Turns a view into a writable one: refused for READ_ONLY tensors and for
    /// layouts where two logical elements share memory (zero strides, overlaps).
    ///
    /// # Safety
    /// The caller must hold exclusive access to the view's memory for `'a`: no
    /// other reader or writer while the result lives.
    pub unsafe fn from_view(view: TensorView<'a>) -> Result<TensorViewMut<'a>> {
        if view.is_read_only() {
            return Err(Error::ReadOnly { what: "writable view".into() });
        }
        crate::layout::check_writable(view.shape, &view.strides)?;
        Ok(TensorViewMut { view, _mut: PhantomData })
    }

    /// A contiguous writable CPU view of a slice.
    #[inline]
    pub fn from_slice_mut<T: Element>(data: &'a mut [T], shape: &'a [i64]) -> Result<TensorViewMut<'a>> {
        Self::from_slice_strided_mut(data, shape, None, 0)
    }

    /// A strided writable CPU view of a slice; see [`TensorView::from_slice_strided`].
    pub fn from_slice_strided_mut<T: Element>(
        data: &'a mut [T],
        shape: &'a [i64],
        strides: Option<&'a [i64]>,
        offset: usize,
    ) -> Result<TensorViewMut<'a>> {
        let mut view = TensorView::from_slice_strided(&*data, shape, strides, offset)?;
        view.flags.remove(Flags::READ_ONLY);
        // SAFETY: `data` is borrowed mutably for 'a, so the view's memory (inside
        // `data`, checked by from_slice_strided) has no other user.
        unsafe { Self::from_view(view) }
    }

    /// A read-only view, borrowing this one. (Sound because `TensorView` is
    /// covariant: the reference's lifetime also bounds every slice read through it.)
    #[inline]
    pub fn as_view(&self) -> &TensorView<'_> {
        &self.view
    }
    /// The shape.
    #[inline]
    pub fn shape(&self) -> &[i64] {
        self.view.shape
    }
    /// The strides in elements.
    #[inline]
    pub fn strides(&self) -> &[i64] {
        &self.view.strides
    }
    /// The dtype.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.view.dtype
    }
    /// The device.
    #[inline]
    pub fn device(&self) -> Device {
        self.view.device
    }
    /// Number of elements.
    #[inline]
    pub fn numel(&self) -> usize {
        self.view.extent.numel
    }
    /// Whether the memory is compact row-major.
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        self.view.is_contiguous()
    }
    /// Address of element `[0, .., 0]`.
    #[inline]
    pub fn data_ptr_mut(&mut self) -> *mut c_void {
        self.view.data as *mut c_void
    }
    /// A DLTensor describing this view; see [`TensorView::as_dltensor`].
    #[inline]
    pub fn as_dltensor(&mut self) -> DLTensor {
        self.view.as_dltensor()
    }

    /// The elements as a mutable slice (dtype of `T`, host memory, contiguous).
    #[inline]
    pub fn as_slice_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        let s = self.view.as_slice::<T>()?;
        // SAFETY: same range as the shared slice just validated; this view holds
        // exclusive access for 'a and `&mut self` makes the slice unique.
        Ok(unsafe { std::slice::from_raw_parts_mut(s.as_ptr().cast_mut(), s.len()) })
    }

    /// Like [`TensorViewMut::as_slice_mut`], consuming the view for its whole lifetime.
    #[inline]
    pub fn into_slice_mut<T: Element>(self) -> Result<&'a mut [T]> {
        let s = self.view.as_slice::<T>()?;
        // SAFETY: as in as_slice_mut; `self` is consumed so nothing else can reach the memory.
        Ok(unsafe { std::slice::from_raw_parts_mut(s.as_ptr().cast_mut(), s.len()) })
    }

    /// Copies every element of `src` into this view (same dtype and shape, any
    /// strides on either side, host memory, whole-byte elements). Both contiguous:
    /// one `memmove`; otherwise element by element in row-major order.
    pub fn copy_from(&mut self, src: &TensorView<'_>) -> Result<()> {
        if src.dtype != self.view.dtype {
            return Err(Error::DTypeMismatch { expected: self.view.dtype.to_string(), got: src.dtype }.context("copy_from"));
        }
        if src.shape != self.view.shape {
            return Err(Error::Shape(format!("copy_from: source shape {:?}, destination shape {:?}", src.shape, self.view.shape)));
        }
        for d in [src.device, self.view.device] {
            if !d.is_host_accessible() {
                return Err(Error::UnsupportedDevice { got: d, what: "copy_from copies host memory".into() });
            }
        }
        let item = src.dtype.itemsize().filter(|_| !src.flags.contains(Flags::IS_SUBBYTE_TYPE_PADDED) || src.dtype.is_byte_sized());
        if src.is_contiguous() && self.view.is_contiguous() {
            let bytes = src.extent.byte_hi as usize;
            if src.extent.numel > 0 {
                // SAFETY: both ranges are validated host memory of `bytes` bytes (contiguous,
                // same dtype and shape); the destination is writable and exclusively ours;
                // `copy` tolerates overlap.
                unsafe { std::ptr::copy(src.data, self.view.data.cast_mut(), bytes) };
            }
            return Ok(());
        }
        let item =
            item.ok_or_else(|| Error::InvalidArgument(format!("copy_from: strided {} (sub-byte) tensors cannot be copied", src.dtype)))?;
        let (s, d) = (src.data, self.view.data.cast_mut());
        for (so, dof) in Offsets::new(src.shape, &src.strides).zip(Offsets::new(self.view.shape, &self.view.strides)) {
            // SAFETY: both offsets address elements of validated host layouts; the
            // destination is writable and exclusive; `copy` tolerates overlap.
            unsafe { std::ptr::copy(s.wrapping_offset(so * item as isize), d.wrapping_offset(dof * item as isize), item) };
        }
        Ok(())
    }

    /// [`TensorView::check_typed`] for this view.
    #[inline]
    pub fn check_typed<T: Element>(&self, what: &str) -> Result<()> {
        self.view.check_typed::<T>(what)
    }

    /// Iterates mutable references to the elements in row-major logical order.
    pub fn iter_mut<T: Element>(&mut self) -> Result<IterMut<'_, T>> {
        self.view.check_typed::<T>("iter_mut")?;
        Ok(IterMut {
            walk: Offsets::new(self.view.shape, &self.view.strides),
            data: self.view.data.cast::<T>().cast_mut(),
            _life: PhantomData,
        })
    }
}

/// Row-major iterator over mutable references to the elements of a [`TensorViewMut`].
pub struct IterMut<'a, T> {
    walk: Offsets,
    data: *mut T,
    _life: PhantomData<&'a mut [T]>,
}

impl<T> fmt::Debug for IterMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IterMut").field("remaining", &self.walk.len()).finish()
    }
}

impl<'a, T: Element> Iterator for IterMut<'a, T> {
    type Item = &'a mut T;
    fn next(&mut self) -> Option<&'a mut T> {
        let off = self.walk.next()?;
        // SAFETY: `off` addresses a logical element inside the validated extent;
        // alignment and dtype were checked in iter_mut; the layout is
        // non-overlapping (TensorViewMut invariant), so each element is yielded
        // exactly once and the references never alias.
        Some(unsafe { &mut *self.data.wrapping_offset(off) })
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.walk.len(), Some(self.walk.len()))
    }
}
impl<T: Element> ExactSizeIterator for IterMut<'_, T> {}

//! # dlbridge-array
//!
//! [`Array`], dlbridge's own array: owned, 64-byte aligned CPU memory of any
//! DLPack dtype, with a shape and strides in elements.
//!
//! | what | zero copy? |
//! |------|-----------|
//! | `transpose`, `permute`, `slice` (any step, negative too), `clone` | yes: views share memory |
//! | export: [`Array::into_managed`] / [`Array::to_managed`] | yes: the memory lives until the last consumer's deleter runs |
//! | import: [`Array::from_managed`] | yes: the foreign owner is kept alive by the Array |
//! | `zeros`, `from_vec`, `from_slice`, `arange`, `contiguous` | allocate (aligned, so they copy) |
//!
//! Dtypes: every DLPack dtype for storage and DLPack exchange; typed access
//! (`as_slice`, `to_vec`) for the [`Element`] types. Devices: CPU-accessible
//! memory only (CPU, CUDA pinned/managed imports).
//!
//! Mutation: [`Array::view_mut`] is granted only to a handle whose memory no
//! other `Array`, view or export shares (the storage's reference count is 1)
//! and which is not read-only, so safe Rust can never observe a data race.

#![deny(missing_docs)]

mod raw;

use std::fmt;
use std::sync::Arc;

use dlbridge_core::layout::{check_layout, contiguous_strides, is_contiguous};
use dlbridge_core::{
    DType, DTypeCode, Device, Element, Error, Flags, ManagedTensor, Result, TensorDesc, TensorView, TensorViewMut,
};
use smallvec::SmallVec;

pub use raw::ALIGN;
use raw::{AlignedBuf, Storage};

type Dims = SmallVec<[i64; 6]>;

/// An n-dimensional array of any DLPack dtype in CPU-accessible memory.
///
/// Cloning, transposing and slicing share memory; see the crate docs.
#[derive(Clone)]
pub struct Array {
    storage: Arc<Storage>,
    /// Address of element `[0, .., 0]`; every element the layout reaches lies in `storage`.
    data: *mut u8,
    shape: Dims,
    strides: Dims,
    dtype: DType,
    device: Device,
    flags: Flags,
}

// SAFETY: the storage is Send + Sync (plain bytes or a ManagedTensor, whose
// deleter DLPack makes callable from any thread) and `data` points into it;
// writes need `&mut self` plus a unique storage (see view_mut).
unsafe impl Send for Array {}
// SAFETY: `&Array` only gives read-only views.
unsafe impl Sync for Array {}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Array")
            .field("dtype", &self.dtype)
            .field("device", &self.device)
            .field("shape", &&self.shape[..])
            .field("strides", &&self.strides[..])
            .field("data", &self.data)
            .field("read_only", &self.is_read_only())
            .finish()
    }
}

fn numel_of(shape: &[i64]) -> Result<usize> {
    let mut n: usize = 1;
    for (d, &s) in shape.iter().enumerate() {
        let s = usize::try_from(s).map_err(|_| Error::Shape(format!("shape[{d}] = {s} must not be negative")))?;
        n = n.checked_mul(s).ok_or_else(|| Error::Overflow { what: format!("element count of shape {shape:?}") })?;
    }
    Ok(n)
}

fn storage_bytes(dtype: DType, numel: usize) -> Result<usize> {
    (numel as u128 * dtype.element_bits() as u128)
        .div_ceil(8)
        .try_into()
        .ok()
        .filter(|&b: &usize| b <= isize::MAX as usize)
        .ok_or_else(|| Error::Overflow { what: format!("{numel} elements of {dtype}") })
}

impl Array {
    /// A zero-filled, contiguous array.
    pub fn zeros(dtype: DType, shape: &[i64]) -> Result<Array> {
        let numel = numel_of(shape)?;
        let buf = AlignedBuf::zeroed(storage_bytes(dtype, numel)?)?;
        let data = buf.as_ptr();
        Ok(Array {
            storage: Arc::new(Storage::Owned(buf)),
            data,
            shape: shape.into(),
            strides: contiguous_strides(shape)?,
            dtype,
            device: Device::CPU,
            flags: Flags::empty(),
        })
    }

    /// A contiguous array holding a copy of `values` with the given shape.
    pub fn from_slice<T: Element>(values: &[T], shape: &[i64]) -> Result<Array> {
        let numel = numel_of(shape)?;
        if numel != values.len() {
            return Err(Error::Shape(format!("shape {shape:?} holds {numel} elements, got {}", values.len())));
        }
        let mut a = Array::zeros(T::DTYPE, shape)?;
        a.as_slice_mut::<T>()?.copy_from_slice(values);
        Ok(a)
    }

    /// Like [`Array::from_slice`], from a `Vec` (copied into aligned memory).
    #[inline]
    pub fn from_vec<T: Element>(values: Vec<T>, shape: &[i64]) -> Result<Array> {
        Array::from_slice(&values, shape)
    }

    /// `0, 1, .., n-1` as a 1-d array of any integer or float dtype.
    pub fn arange(n: i64, dtype: DType) -> Result<Array> {
        let mut a = Array::zeros(dtype, &[n])?;
        macro_rules! fill {
            ($t:ty, $conv:expr) => {{
                let conv = $conv;
                for (i, x) in a.as_slice_mut::<$t>()?.iter_mut().enumerate() {
                    *x = conv(i);
                }
            }};
        }
        match (dtype.code(), dtype.bits(), dtype.lanes()) {
            (_, _, l) if l != 1 => return Err(Error::InvalidArgument(format!("arange: {dtype} has {l} lanes"))),
            (DTypeCode::Int, 8, _) => fill!(i8, |i| i as i8),
            (DTypeCode::Int, 16, _) => fill!(i16, |i| i as i16),
            (DTypeCode::Int, 32, _) => fill!(i32, |i| i as i32),
            (DTypeCode::Int, 64, _) => fill!(i64, |i| i as i64),
            (DTypeCode::UInt, 8, _) => fill!(u8, |i| i as u8),
            (DTypeCode::UInt, 16, _) => fill!(u16, |i| i as u16),
            (DTypeCode::UInt, 32, _) => fill!(u32, |i| i as u32),
            (DTypeCode::UInt, 64, _) => fill!(u64, |i| i as u64),
            (DTypeCode::Float, 16, _) => fill!(dlbridge_core::half::f16, |i| dlbridge_core::half::f16::from_f64(i as f64)),
            (DTypeCode::Float, 32, _) => fill!(f32, |i| i as f32),
            (DTypeCode::Float, 64, _) => fill!(f64, |i| i as f64),
            (DTypeCode::BFloat, 16, _) => fill!(dlbridge_core::half::bf16, |i| dlbridge_core::half::bf16::from_f64(i as f64)),
            _ => return Err(Error::DTypeMismatch { expected: "an integer or float dtype".into(), got: dtype }.context("arange")),
        }
        Ok(a)
    }

    /// The dtype.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The device (always host accessible).
    #[inline]
    pub fn device(&self) -> Device {
        self.device
    }
    /// The shape.
    #[inline]
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }
    /// The strides, in elements.
    #[inline]
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }
    /// Number of dimensions.
    #[inline]
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements.
    #[inline]
    pub fn numel(&self) -> usize {
        self.shape.iter().map(|&n| n as usize).product()
    }
    /// Address of element `[0, .., 0]`.
    #[inline]
    pub fn data_ptr(&self) -> *const u8 {
        self.data
    }
    /// Whether the memory is compact row-major.
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(&self.shape, &self.strides)
    }
    /// Whether writes are refused (an imported READ_ONLY tensor, or marked so).
    #[inline]
    pub fn is_read_only(&self) -> bool {
        self.flags.contains(Flags::READ_ONLY)
    }
    /// Marks the array read-only: exports carry READ_ONLY and `view_mut` is refused.
    #[inline]
    pub fn set_read_only(&mut self) {
        self.flags.insert(Flags::READ_ONLY);
    }
    /// Whether another Array, view or export shares this array's memory.
    #[inline]
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.storage) > 1
    }

    /// A read-only view of the array.
    pub fn view(&self) -> TensorView<'_> {
        // SAFETY: the layout was validated when this Array was made (construction,
        // import, or a view operation that keeps every element inside the storage),
        // the storage lives as long as &self, and writes need a unique storage
        // and &mut self, which this shared borrow excludes.
        let view = unsafe {
            TensorView::from_raw_parts(
                self.data,
                0,
                &self.shape,
                Some(&self.strides),
                self.dtype,
                self.device,
                self.flags & (Flags::READ_ONLY | Flags::IS_SUBBYTE_TYPE_PADDED),
            )
        };
        view.expect("an Array's layout is validated when it is built")
    }

    /// A writable view. Refused for read-only arrays and while any other
    /// Array, view or export shares the memory.
    pub fn view_mut(&mut self) -> Result<TensorViewMut<'_>> {
        if self.is_read_only() {
            return Err(Error::ReadOnly { what: "Array::view_mut".into() });
        }
        if Arc::get_mut(&mut self.storage).is_none() {
            return Err(Error::Buffer(format!(
                "Array::view_mut: the memory is shared by {} handles (clones, views or DLPack exports); \
                 drop them or use contiguous() for a private copy",
                Arc::strong_count(&self.storage)
            )));
        }
        let view = self.view();
        // SAFETY: the storage is uniquely ours (checked above) and `&mut self`
        // keeps it so for the view's lifetime; not read-only (checked above).
        unsafe { TensorViewMut::from_view(view) }
    }

    /// The elements as a slice (dtype of `T`, contiguous).
    #[inline]
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.view().as_slice::<T>()
    }

    /// The elements as a mutable slice; see [`Array::view_mut`] for when this is granted.
    #[inline]
    pub fn as_slice_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        self.view_mut()?.into_slice_mut::<T>()
    }

    /// The elements in row-major logical order.
    #[inline]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.view().to_vec::<T>()
    }

    /// Swaps two dimensions (a view: shares memory).
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Array> {
        let n = self.ndim();
        if d0 >= n || d1 >= n {
            return Err(Error::InvalidArgument(format!("transpose({d0}, {d1}) of a {n}-d array")));
        }
        let mut out = self.clone();
        out.shape.swap(d0, d1);
        out.strides.swap(d0, d1);
        Ok(out)
    }

    /// The 2-d transpose (a view).
    #[inline]
    pub fn t(&self) -> Result<Array> {
        if self.ndim() != 2 {
            return Err(Error::InvalidArgument(format!("t() needs a 2-d array, got {} dims", self.ndim())));
        }
        self.transpose(0, 1)
    }

    /// Reorders the dimensions (a view): output dim `i` is input dim `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Array> {
        let n = self.ndim();
        let mut seen = vec![false; n];
        if perm.len() != n || perm.iter().any(|&p| p >= n || std::mem::replace(&mut seen[p], true)) {
            return Err(Error::InvalidArgument(format!("permute({perm:?}) is not a permutation of {n} dims")));
        }
        let mut out = self.clone();
        out.shape = perm.iter().map(|&p| self.shape[p]).collect();
        out.strides = perm.iter().map(|&p| self.strides[p]).collect();
        Ok(out)
    }

    /// Elements `start, start+step, ..` (before `end`) along `dim`, as a view.
    /// Python semantics: negative `start`/`end` count from the end, `step` may
    /// be negative (giving negative strides) but not zero; bounds are clamped.
    pub fn slice(&self, dim: usize, start: i64, end: i64, step: i64) -> Result<Array> {
        if dim >= self.ndim() {
            return Err(Error::InvalidArgument(format!("slice: dim {dim} of a {}-d array", self.ndim())));
        }
        if step == 0 {
            return Err(Error::InvalidArgument("slice: step must not be zero".into()));
        }
        if !self.dtype.is_byte_sized() {
            return Err(Error::InvalidArgument(format!("slice: {} elements are not byte addressable", self.dtype)));
        }
        let n = self.shape[dim];
        let clamp = |i: i64, lo: i64, hi: i64| {
            let i = if i < 0 { i.saturating_add(n) } else { i };
            i.clamp(lo, hi)
        };
        let (first, len) = if step > 0 {
            let (s, e) = (clamp(start, 0, n), clamp(end, 0, n));
            (s, if e > s { (e - s - 1) / step + 1 } else { 0 })
        } else {
            let (s, e) = (clamp(start, -1, n - 1), clamp(end, -1, n - 1));
            (s, if s > e { (s - e - 1) / (-step) + 1 } else { 0 })
        };
        let mut out = self.clone();
        out.shape[dim] = len;
        out.strides[dim] = self.strides[dim].checked_mul(step).ok_or_else(|| Error::Overflow { what: "slice stride".into() })?;
        if len > 0 {
            let item = self.dtype.itemsize().unwrap_or(1) as i64;
            let shift = first * self.strides[dim] * item; // inside the original extent: first < n
            out.data = self.data.wrapping_offset(shift as isize);
        }
        Ok(out)
    }

    /// A contiguous copy of the array (always a fresh, unshared allocation).
    #[inline]
    pub fn contiguous(&self) -> Result<Array> {
        let mut out = Array::zeros(self.dtype, &self.shape)?;
        out.flags = self.flags & Flags::IS_SUBBYTE_TYPE_PADDED;
        out.view_mut()?.copy_from(&self.view())?;
        Ok(out)
    }

    /// Exports the array as a DLPack tensor with zero copies. The memory lives
    /// until the consumer calls the deleter (and every other handle dropped).
    pub fn into_managed(self) -> Result<ManagedTensor> {
        let data = self.data.cast();
        let shape = self.shape.clone();
        let strides = self.strides.clone();
        let desc = TensorDesc {
            dtype: self.dtype,
            device: self.device,
            shape: &shape,
            strides: Some(&strides),
            byte_offset: 0,
            flags: self.flags,
        };
        // SAFETY: `data` addresses this array's validated layout inside its
        // storage, which the Array (the owner, moved into the export) keeps alive;
        // a consumer writing requires the export to be writable — the storage
        // may be shared with other Arrays, exactly as with any DLPack producer
        // whose tensors alias (see crate docs); READ_ONLY arrays export READ_ONLY.
        unsafe { ManagedTensor::export_owner(self, data, &desc) }
    }

    /// Exports a handle to the same memory (the array stays usable).
    #[inline]
    pub fn to_managed(&self) -> Result<ManagedTensor> {
        self.clone().into_managed()
    }

    /// Imports a DLPack tensor with zero copies: the Array keeps the foreign
    /// owner alive and the deleter runs when the last handle drops. The memory
    /// must be CPU accessible; READ_ONLY stays read-only.
    pub fn from_managed(tensor: ManagedTensor) -> Result<Array> {
        let device = tensor.device();
        if !device.is_host_accessible() {
            return Err(Error::UnsupportedDevice { got: device, what: "dlbridge Array holds CPU-accessible memory".into() });
        }
        let view = tensor.view();
        let (data, shape, strides, dtype, flags) =
            (view.data_ptr().cast_mut().cast::<u8>(), Dims::from(view.shape()), Dims::from(view.strides()), view.dtype(), tensor.flags());
        Ok(Array { storage: Arc::new(Storage::Foreign(tensor)), data, shape, strides, dtype, device, flags })
    }

    /// Checks an Array-internal layout (used by tests and debug assertions).
    #[doc(hidden)]
    #[inline]
    pub fn check(&self) -> Result<()> {
        check_layout(&self.shape, Some(&self.strides), self.dtype, self.data as usize, 0, self.flags.contains(Flags::IS_SUBBYTE_TYPE_PADDED))
            .map(drop)
    }
}

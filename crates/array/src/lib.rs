//! # dlbridge-array
//!
//! [`Array`], dlbridge's own array: owned, 64-byte aligned CPU memory of any
//! DLPack dtype, with a shape and strides in elements.
//!
//! | what | zero copy? |
//! |------|-----------|
//! | `transpose`, `permute`, `slice` (any step, negative too), `select`, `clone` | yes: views share memory |
//! | export: [`Array::into_managed`] / [`Array::to_managed`] | yes: the memory lives until the last consumer's deleter runs |
//! | import: [`Array::from_managed`] | yes: the foreign owner is kept alive by the Array |
//! | `zeros`, `from_vec`, `from_slice`, `from_bytes`, `arange`, `contiguous` | allocate (aligned, so they copy) |
//!
//! Every allocation is fallible: memory the system refuses is an
//! [`Error::OutOfMemory`] (Python `MemoryError`), never an abort. Constructors
//! refuse what the DLPack validator refuses — more than [`MAX_NDIM`] dims,
//! negative dims, an element count or byte size that overflows — before
//! anything is allocated.
//!
//! Dtypes: every DLPack dtype for storage and DLPack exchange; typed access
//! (`as_slice`, `to_vec`) for the [`Element`] types; [`Array::items`] reads
//! every single-lane dtype (float8/6/4, sub-byte integers, complex, bool) as
//! plain values. Devices: arrays made here are in host memory; an imported
//! tensor may be on any device (a CUDA tensor is held, viewed and exported
//! with zero copies, and host reads of it are errors naming the device).
//!
//! Mutation: [`Array::view_mut`] is granted only to a handle whose memory no
//! other `Array`, view or export shares (the storage's reference count is 1)
//! and which is not read-only, so safe Rust can never observe a data race.
//!
//! Unsafe code: the allocation lives in `raw`; this root allows it on four
//! items only, each relying on `Array`'s private field invariants: the
//! `Send`/`Sync` impls, [`Array::view`], [`Array::view_mut`] and
//! [`Array::into_managed`]. `unsafe_code` is denied everywhere else.

#![deny(missing_docs)]
#![deny(unsafe_code)]

mod item;
#[allow(unsafe_code)]
mod raw;

use std::fmt;
use std::sync::Arc;

use dlbridge_core::layout::{Extent, MAX_NDIM, check_layout, check_permutation, contiguous_strides, is_contiguous};
use dlbridge_core::{DType, DTypeCode, Device, Element, Error, Flags, ManagedTensor, Result, TensorDesc, TensorView, TensorViewMut};
use smallvec::SmallVec;

pub use item::{Item, Items};
pub use raw::ALIGN;
use raw::{AlignedBuf, Storage};

type Dims = SmallVec<[i64; 6]>;

/// An n-dimensional array of any DLPack dtype (host memory, or an imported device tensor).
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
    /// What `check_layout` returned for this layout at `data` (kept in step by
    /// every constructor and view operation), so `view()` need not re-validate.
    extent: Extent,
}

// SAFETY: the storage is Send + Sync (plain bytes or a ManagedTensor, whose
// deleter DLPack makes callable from any thread) and `data` points into it;
// writes need `&mut self` plus a unique storage (see view_mut).
#[allow(unsafe_code)]
unsafe impl Send for Array {}
// SAFETY: `&Array` only gives read-only views.
#[allow(unsafe_code)]
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

/// The element count of a shape an Array may have: at most [`MAX_NDIM`] dims,
/// none negative, the count representable (checked before anything is allocated).
fn numel_of(shape: &[i64]) -> Result<usize> {
    if shape.len() > MAX_NDIM {
        return Err(Error::Shape(format!("{} dims; dlbridge's limit is {MAX_NDIM}", shape.len())));
    }
    let mut n: usize = 1;
    for (d, &s) in shape.iter().enumerate() {
        let s = usize::try_from(s).map_err(|_| Error::Shape(format!("shape[{d}] = {s} must not be negative")))?;
        n = n.checked_mul(s).ok_or_else(|| Error::Overflow { what: format!("element count of shape {shape:?}") })?;
    }
    if n > isize::MAX as usize {
        return Err(Error::Overflow { what: format!("element count of shape {shape:?}") });
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
    ///
    /// Refused before anything is allocated: more than [`MAX_NDIM`] dims, a
    /// negative dim, an element count or byte size that overflows (Value
    /// errors). Memory the system cannot give is an [`Error::OutOfMemory`].
    pub fn zeros(dtype: DType, shape: &[i64]) -> Result<Array> {
        Array::filled(dtype, shape, |_| ())
    }

    /// A fresh contiguous array whose zeroed bytes `fill` may overwrite first.
    fn filled(dtype: DType, shape: &[i64], fill: impl FnOnce(&mut [u8])) -> Result<Array> {
        let numel = numel_of(shape)?;
        let bytes = storage_bytes(dtype, numel)?;
        let strides = contiguous_strides(shape)?;
        let mut buf = AlignedBuf::zeroed(bytes, || format!("a {dtype} array of shape {shape:?}"))?;
        fill(buf.bytes_mut(bytes));
        let data = buf.as_ptr();
        let extent = check_layout(shape, Some(&strides), dtype, data as usize, 0, false)?;
        Ok(Array {
            storage: Arc::new(Storage::Owned(buf)),
            data,
            shape: shape.into(),
            strides,
            dtype,
            device: Device::CPU,
            flags: Flags::empty(),
            extent,
        })
    }

    /// A contiguous array of any dtype holding a copy of `bytes`: the elements
    /// in row-major order, in native byte order, sub-byte types packed (so
    /// `bytes.len()` is `ceil(numel * bits * lanes / 8)`).
    pub fn from_bytes(dtype: DType, shape: &[i64], bytes: &[u8]) -> Result<Array> {
        let numel = numel_of(shape)?;
        let want = storage_bytes(dtype, numel)?;
        if bytes.len() != want {
            return Err(Error::Shape(format!("shape {shape:?} of {dtype} holds {want} bytes, got {}", bytes.len())));
        }
        Array::filled(dtype, shape, |dst| {
            if let Some(dst) = dst.get_mut(..bytes.len()) {
                dst.copy_from_slice(bytes); // same length: `dst` has exactly `want` bytes
            }
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
        if dtype.lanes() != 1 || !matches!(dtype.code(), DTypeCode::Int | DTypeCode::UInt | DTypeCode::Float | DTypeCode::BFloat) {
            return Err(Error::DTypeMismatch { expected: "an integer or float dtype".into(), got: dtype }.context("arange"));
        }
        Array::from_fn(dtype, &[n], |i| i as f64)
    }

    /// A contiguous array whose element `i` (row-major) holds `f(i)`, converted
    /// as Rust's `as` converts: integers truncate and saturate, bool is
    /// `f(i) != 0`, complex is `f(i) + 0i`. Any dtype with a Rust element type
    /// (the [`DType`] constants); others are a Type error naming the dtype.
    pub fn from_fn(dtype: DType, shape: &[i64], f: impl Fn(usize) -> f64) -> Result<Array> {
        use dlbridge_core::half::{bf16, f16};
        use dlbridge_core::num_complex::Complex;
        if dtype == DType::BOOL {
            // One byte per element, 0 or 1 (bool is no `Element`: written as bytes).
            return Array::filled(dtype, shape, |bytes| bytes.iter_mut().enumerate().for_each(|(i, b)| *b = u8::from(f(i) != 0.0)));
        }
        let mut a = Array::zeros(dtype, shape)?;
        macro_rules! fill {
            ($t:ty, $conv:expr) => {{
                let conv = $conv;
                a.as_slice_mut::<$t>()?.iter_mut().enumerate().for_each(|(i, x)| *x = conv(f(i)));
            }};
        }
        match dtype {
            DType::I8 => fill!(i8, |x| x as i8),
            DType::I16 => fill!(i16, |x| x as i16),
            DType::I32 => fill!(i32, |x| x as i32),
            DType::I64 => fill!(i64, |x| x as i64),
            DType::U8 => fill!(u8, |x| x as u8),
            DType::U16 => fill!(u16, |x| x as u16),
            DType::U32 => fill!(u32, |x| x as u32),
            DType::U64 => fill!(u64, |x| x as u64),
            DType::F16 => fill!(f16, f16::from_f64),
            DType::BF16 => fill!(bf16, bf16::from_f64),
            DType::F32 => fill!(f32, |x| x as f32),
            DType::F64 => fill!(f64, |x| x),
            DType::C64 => fill!(Complex<f32>, |x| Complex::new(x as f32, 0.0)),
            DType::C128 => fill!(Complex<f64>, |x| Complex::new(x, 0.0)),
            other => {
                return Err(Error::DTypeMismatch { expected: "a dtype with a Rust element type".into(), got: other }.context("from_fn"));
            }
        }
        Ok(a)
    }

    /// The dtype.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The device (host memory for arrays made here; an import's own device).
    #[inline]
    pub fn device(&self) -> Device {
        self.device
    }
    /// The shape.
    #[inline]
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }
    /// The strides, in elements (as DLPack and torch count them; the Python
    /// `Array.strides` is NumPy's, in bytes, and `Array.element_strides` these).
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
        self.extent.numel
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
    /// A read-only view of the array.
    #[allow(unsafe_code)]
    pub fn view(&self) -> TensorView<'_> {
        // SAFETY: `extent` is what check_layout returned for this very layout at
        // `data` (every constructor and view operation computes or carries it), so
        // the layout is validated; the storage lives as long as &self, and writes
        // need a unique storage and &mut self, which this shared borrow excludes.
        unsafe {
            TensorView::from_validated_parts(
                self.data,
                &self.shape,
                &self.strides,
                self.dtype,
                self.device,
                self.flags & (Flags::READ_ONLY | Flags::IS_SUBBYTE_TYPE_PADDED),
                self.extent,
            )
        }
    }

    /// A writable view. Refused for read-only arrays and while any other
    /// Array, view or export shares the memory.
    #[allow(unsafe_code)]
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

    /// The elements in row-major logical order (a fallible allocation).
    #[inline]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.view().to_vec::<T>()
    }

    /// Every element in row-major logical order as an [`Item`] (NumPy's `item()` of each), for any
    /// single-lane dtype: bool, integers of every width (sub-byte too), f16,
    /// bf16, f32, f64, complex, and the float8/6/4 families (decoded exactly to
    /// f64). Vector (multi-lane) and opaque-handle dtypes are a Type error
    /// naming the dtype.
    pub fn items(&self) -> Result<Items<'_>> {
        Items::new(&self.view())
    }

    /// Swaps two dimensions (a view: shares memory), as NumPy's `swapaxes` and
    /// torch's `transpose(d0, d1)`. (The Python `Array.transpose(*axes)` is
    /// NumPy's: a permutation, here [`Array::permute`].)
    pub fn swap_axes(&self, d0: usize, d1: usize) -> Result<Array> {
        let n = self.ndim();
        if d0 >= n || d1 >= n {
            return Err(Error::InvalidArgument(format!("swap_axes({d0}, {d1}) of a {n}-d array")));
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
        self.swap_axes(0, 1)
    }

    /// Reorders the dimensions (a view): output dim `i` is input dim `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Array> {
        check_permutation(perm, self.ndim())?;
        let mut out = self.clone();
        out.shape = perm.iter().map(|&p| self.shape[p]).collect();
        out.strides = perm.iter().map(|&p| self.strides[p]).collect();
        Ok(out)
    }

    /// The array broadcast to `shape` by NumPy's rule (a view: new leading
    /// dims and size-1 dims get stride 0). The view is read-only, as NumPy's
    /// `broadcast_to`: its elements alias each other.
    pub fn broadcast_to(&self, shape: &[i64]) -> Result<Array> {
        let n = self.ndim();
        let fail = || Error::InvalidArgument(format!("broadcast_to: shape {:?} does not broadcast to {shape:?}", self.shape));
        if shape.len() < n || shape.iter().any(|&d| d < 0) {
            return Err(fail());
        }
        let lead = shape.len() - n;
        let mut strides = SmallVec::from_elem(0, shape.len());
        for (i, (&have, &stride)) in self.shape.iter().zip(&self.strides).enumerate() {
            let want = shape[lead + i];
            strides[lead + i] = match have {
                _ if have == want => stride,
                1 => 0,
                _ => return Err(fail()),
            };
        }
        let mut out = self.clone();
        out.shape = shape.iter().copied().collect();
        out.strides = strides;
        out.extent = out.checked_extent()?;
        out.set_read_only();
        Ok(out)
    }

    /// Elements `start, start+step, ..` (before `end`) along `dim`, as a view.
    /// Python semantics: negative `start`/`end` count from the end, `step` may
    /// be negative (giving negative strides) but not zero; bounds are clamped.
    pub fn slice(&self, dim: usize, start: i64, end: i64, step: i64) -> Result<Array> {
        let (Some(&n), Some(&stride)) = (self.shape.get(dim), self.strides.get(dim)) else {
            return Err(Error::InvalidArgument(format!("slice: dim {dim} of a {}-d array", self.ndim())));
        };
        if step == 0 {
            return Err(Error::InvalidArgument("slice: step must not be zero".into()));
        }
        if !self.dtype.is_byte_sized() {
            return Err(Error::InvalidArgument(format!("slice: {} elements are not byte addressable", self.dtype)));
        }
        let clamp = |i: i64, lo: i64, hi: i64| {
            let i = if i < 0 { i.saturating_add(n) } else { i };
            i.clamp(lo, hi)
        };
        // |step| as u64: i64::MIN has no i64 negation. Distances are < 2^63 (0 <= s, e + 1 <= n).
        let count = |distance: i64| (distance as u64 - 1) / step.unsigned_abs() + 1;
        let (first, len) = if step > 0 {
            let (s, e) = (clamp(start, 0, n), clamp(end, 0, n));
            (s, if e > s { count(e - s) as i64 } else { 0 })
        } else {
            let (s, e) = (clamp(start, -1, n - 1), clamp(end, -1, n - 1));
            (s, if s > e { count(s - e) as i64 } else { 0 })
        };
        let overflow = || Error::Overflow { what: format!("slice({dim}, {start}, {end}, {step}) of shape {:?}", self.shape) };
        let mut out = self.clone();
        if let (Some(n_out), Some(s_out)) = (out.shape.get_mut(dim), out.strides.get_mut(dim)) {
            *n_out = len;
            *s_out = stride.checked_mul(step).ok_or_else(overflow)?;
        }
        if len > 0 {
            let item = self.dtype.itemsize().unwrap_or(1) as i64;
            // Inside the original extent (first < n), so it fits; checked anyway.
            let shift = first.checked_mul(stride).and_then(|x| x.checked_mul(item)).ok_or_else(overflow)?;
            out.data = self.data.wrapping_offset(shift as isize);
        }
        out.extent = out.checked_extent()?;
        Ok(out)
    }

    /// Element `index` along `dim`, with that dim dropped, as a view (NumPy's
    /// `a[.., index, ..]`): a negative `index` counts from the end; an index
    /// outside `-n..n` is an [`Error::InvalidArgument`].
    pub fn select(&self, dim: usize, index: i64) -> Result<Array> {
        let Some(&n) = self.shape.get(dim) else {
            return Err(Error::InvalidArgument(format!("select: dim {dim} of a {}-d array", self.ndim())));
        };
        // n >= 0, so `index + n` cannot overflow for a negative index.
        let i = if index < 0 { index + n } else { index };
        if !(0..n).contains(&i) {
            return Err(Error::InvalidArgument(format!("select: index {index} is out of bounds for dim {dim} of size {n}")));
        }
        let mut out = self.slice(dim, i, i + 1, 1)?;
        out.shape.remove(dim);
        out.strides.remove(dim);
        out.extent = out.checked_extent()?;
        Ok(out)
    }

    /// A contiguous copy of the array (always a fresh, unshared allocation in
    /// host memory; refused for memory the host cannot read).
    #[inline]
    pub fn contiguous(&self) -> Result<Array> {
        if !self.device.is_host_accessible() {
            return Err(Error::UnsupportedDevice { got: self.device, what: "Array::contiguous copies in host memory".into() });
        }
        let mut out = Array::zeros(self.dtype, &self.shape)?;
        out.flags = self.flags & Flags::IS_SUBBYTE_TYPE_PADDED;
        out.view_mut()?.copy_from(&self.view())?;
        Ok(out)
    }

    /// Exports the array as a DLPack tensor with zero copies. The memory lives
    /// until the consumer calls the deleter (and every other handle dropped).
    #[allow(unsafe_code)]
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
    /// owner alive and the deleter runs when the last handle drops; READ_ONLY
    /// stays read-only. Memory of any device is held (a CUDA tensor included):
    /// views, exports and kernel calls work on it, and everything that reads
    /// the elements on the host (`as_slice`, `to_vec`, `items`, `contiguous`)
    /// is an [`Error::UnsupportedDevice`] naming the device for memory the host
    /// cannot read.
    pub fn from_managed(tensor: ManagedTensor) -> Result<Array> {
        let device = tensor.device();
        let view = tensor.view();
        let (data, shape, strides, dtype, flags, extent) = (
            view.data_ptr().cast_mut().cast::<u8>(),
            Dims::from(view.shape()),
            Dims::from(view.strides()),
            view.dtype(),
            tensor.flags(),
            view.extent(),
        );
        Ok(Array { storage: Arc::new(Storage::Foreign(tensor)), data, shape, strides, dtype, device, flags, extent })
    }

    /// Checks an Array-internal layout (used by tests and debug assertions).
    #[doc(hidden)]
    #[inline]
    pub fn check(&self) -> Result<()> {
        let extent = self.checked_extent()?;
        if extent != self.extent {
            return Err(Error::InvalidArgument(format!("Array extent {:?} is stale: the layout spans {extent:?}", self.extent)));
        }
        Ok(())
    }

    fn checked_extent(&self) -> Result<Extent> {
        check_layout(
            &self.shape,
            Some(&self.strides),
            self.dtype,
            self.data as usize,
            0,
            self.flags.contains(Flags::IS_SUBBYTE_TYPE_PADDED),
        )
    }
}

//! Safe layout arithmetic: the checks every foreign DLTensor goes through.
//!
//! Nothing here dereferences a pointer: addresses are plain integers, so the
//! property tests can throw any shape, stride, offset and dtype at
//! [`check_layout`] and it answers `Ok` or an [`Error`], never a panic.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The most dimensions a tensor may have here. DLPack sets no limit; a
/// bound keeps a corrupt `ndim` from making us read gigabytes of "shape".
pub const MAX_NDIM: usize = 64;

/// Element offsets beyond +-2^100 can never describe addressable memory; bounding
/// them keeps the i128 arithmetic below free of overflow checks.
const OFFSET_LIMIT: i128 = 1 << 100;

/// One past the highest address a user-space tensor can touch: x86-64 with
/// five-level paging maps user memory below 2^56, AArch64 below 2^52. A layout
/// that reaches past it describes memory no process has, whatever its pointer.
pub const USER_SPACE_END: u64 = 1 << 57;

/// What [`check_layout`] learned about a tensor's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Number of logical elements (product of the shape).
    pub numel: usize,
    /// First byte the tensor touches, relative to `data + byte_offset` (<= 0 with negative strides).
    pub byte_lo: isize,
    /// One past the last byte the tensor touches, relative to `data + byte_offset`.
    /// `byte_lo == byte_hi == 0` for zero-size tensors.
    pub byte_hi: isize,
}

impl Extent {
    /// Bytes spanned by the tensor, from its lowest to its highest touched byte.
    #[inline]
    pub fn span(&self) -> usize {
        (self.byte_hi - self.byte_lo) as usize
    }
}

/// Compact row-major strides for `shape` (in elements), or an overflow error.
pub fn contiguous_strides(shape: &[i64]) -> Result<smallvec::SmallVec<[i64; 6]>> {
    let mut strides = smallvec::SmallVec::<[i64; 6]>::from_elem(0, shape.len());
    let mut acc: i64 = 1;
    for (d, &n) in shape.iter().enumerate().rev() {
        strides[d] = acc;
        acc = acc.checked_mul(n.max(1)).ok_or_else(|| Error::overflow("contiguous stride"))?;
    }
    Ok(strides)
}

/// Checks that `axes` is a permutation of `0..ndim` (the argument of a
/// permute: NumPy's `transpose`, torch's `permute`).
pub fn check_permutation(axes: &[usize], ndim: usize) -> Result<()> {
    let mut seen = [false; MAX_NDIM];
    if axes.len() != ndim || ndim > MAX_NDIM || axes.iter().any(|&a| a >= ndim || std::mem::replace(&mut seen[a], true)) {
        return Err(Error::InvalidArgument(format!("permute({axes:?}) is not a permutation of {ndim} dims")));
    }
    Ok(())
}

/// Validates a tensor's shape, strides, dtype and data address.
///
/// * every dim is `>= 0`; the element count and the byte extent are computed
///   without overflow;
/// * `strides == None` means compact row-major; any stride (zero, negative,
///   huge) is accepted when the resulting byte range is representable;
/// * `data_addr == 0` only for zero-size tensors; `data_addr + byte_offset`
///   must be aligned to the dtype's scalar width;
/// * the touched byte range must lie in user space: from address 0 up to
///   [`USER_SPACE_END`], without wrapping.
pub fn check_layout(
    shape: &[i64],
    strides: Option<&[i64]>,
    dtype: DType,
    data_addr: usize,
    byte_offset: u64,
    subbyte_padded: bool,
) -> Result<Extent> {
    let layout = Described { shape, strides, dtype, data_addr, byte_offset, subbyte_padded };
    match common_extent(&layout) {
        Some(extent) => Ok(extent),
        None => checked_extent(&layout),
    }
}

/// What [`check_layout`] checks, as the tensor describes it.
#[derive(Clone, Copy)]
struct Described<'a> {
    shape: &'a [i64],
    strides: Option<&'a [i64]>,
    dtype: DType,
    data_addr: usize,
    byte_offset: u64,
    subbyte_padded: bool,
}

/// [`check_layout`] for the common case, in checked 64-bit arithmetic (a
/// third of the instructions of the general i128 path): `Some` only for a
/// layout [`checked_extent`] accepts, with the same extent — every condition
/// it checks is checked here, and every overflow, empty or negative dim,
/// NULL address or misalignment gives `None`, leaving the answer (and the
/// error's wording) to it.
#[inline]
fn common_extent(layout: &Described<'_>) -> Option<Extent> {
    let Described { shape, strides, dtype, data_addr, byte_offset, subbyte_padded } = *layout;
    if shape.len() > MAX_NDIM {
        return None;
    }
    // Element counts and offsets relative to element [0, .., 0].
    let (mut numel, mut lo, mut hi) = (1i64, 0i64, 0i64);
    match strides {
        Some(strides) => {
            if strides.len() != shape.len() {
                return None;
            }
            for (&n, &stride) in shape.iter().zip(strides) {
                if n <= 0 {
                    return None;
                }
                numel = numel.checked_mul(n)?;
                let reach = (n - 1).checked_mul(stride)?;
                if reach < 0 {
                    lo = lo.checked_add(reach)?;
                } else {
                    hi = hi.checked_add(reach)?;
                }
            }
        }
        None => {
            for &n in shape {
                if n <= 0 {
                    return None;
                }
                numel = numel.checked_mul(n)?;
            }
            hi = numel - 1;
        }
    }
    let sbits = i64::from(dtype.storage_bits(subbyte_padded));
    // Floor division by 8 (arithmetic shifts), as the general path.
    let byte_lo = lo.checked_mul(sbits)? >> 3;
    let byte_hi = hi.checked_add(1)?.checked_mul(sbits)?.checked_add(7)? >> 3;
    let (byte_lo, byte_hi) = (isize::try_from(byte_lo).ok()?, isize::try_from(byte_hi).ok()?);
    byte_hi.checked_sub(byte_lo)?;
    let numel = usize::try_from(numel).ok().filter(|&n| n <= isize::MAX as usize)?;
    if data_addr == 0 {
        return None;
    }
    let start = u64::try_from(data_addr).ok()?.checked_add(byte_offset)?;
    start.checked_add_signed(byte_lo as i64)?;
    if start.checked_add_signed(byte_hi as i64)? > USER_SPACE_END {
        return None;
    }
    if start & (dtype.alignment() as u64 - 1) != 0 {
        return None;
    }
    Some(Extent { numel, byte_lo, byte_hi })
}

/// [`check_layout`] for any input: exact i128 arithmetic, and the errors.
#[cold]
fn checked_extent(layout: &Described<'_>) -> Result<Extent> {
    let Described { shape, strides, dtype, data_addr, byte_offset, subbyte_padded } = *layout;
    if shape.len() > MAX_NDIM {
        return Err(Error::field("ndim", shape.len(), format!("more than dlbridge's limit of {MAX_NDIM} dims")));
    }
    if let Some(s) = strides
        && s.len() != shape.len()
    {
        return Err(Error::field("strides", format!("{} entries", s.len()), format!("ndim is {}", shape.len())));
    }
    for (d, &n) in shape.iter().enumerate() {
        if n < 0 {
            return Err(Error::field(format!("shape[{d}]"), n, "dims must not be negative"));
        }
    }
    // A zero dim makes the tensor empty whatever the others are.
    let empty = shape.contains(&0);
    let mut numel: u64 = u64::from(!empty);
    if !empty {
        for &n in shape {
            numel = numel.checked_mul(n as u64).ok_or_else(|| Error::overflow(format!("element count of shape {shape:?}")))?;
        }
    }
    // Element offsets (relative to element [0, .., 0]) of the lowest and highest element.
    let (mut lo, mut hi): (i128, i128) = (0, 0);
    if numel > 0 {
        match strides {
            Some(strides) => {
                for (&n, &stride) in shape.iter().zip(strides) {
                    // |n - 1| < 2^63 and |stride| <= 2^63: the product fits i128, and
                    // the running sums are bounded by OFFSET_LIMIT after every term.
                    let reach = (n as i128 - 1) * stride as i128;
                    if reach < 0 {
                        lo += reach
                    } else {
                        hi += reach
                    }
                    if lo < -OFFSET_LIMIT || hi > OFFSET_LIMIT {
                        return Err(Error::overflow(format!("byte extent of shape {shape:?} strides {strides:?}")));
                    }
                }
            }
            None => hi = numel as i128 - 1,
        }
    }
    let numel: usize = usize::try_from(numel)
        .ok()
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| Error::overflow(format!("element count of shape {shape:?}")))?;
    let sbits = dtype.storage_bits(subbyte_padded) as i128;
    let extent_overflow = || Error::overflow(format!("byte extent of shape {shape:?} strides {strides:?}"));
    let (byte_lo, byte_hi) = if numel == 0 {
        (0i128, 0i128)
    } else {
        // |lo|, |hi| <= 2^100 and sbits < 2^24: no overflow (and no slow i128 checked multiply).
        let lo_bits = lo * sbits;
        let hi_bits = (hi + 1) * sbits + 7;
        (lo_bits >> 3, hi_bits >> 3) // arithmetic shift: floor division by 8, no i128 divide call
    };
    let span = byte_hi - byte_lo;
    if byte_lo < isize::MIN as i128 || byte_hi > isize::MAX as i128 || span > isize::MAX as i128 {
        return Err(extent_overflow());
    }
    if numel > 0 {
        if data_addr == 0 {
            return Err(Error::field("data", "NULL", format!("only zero-size tensors may have NULL data; this one has {numel} elements")));
        }
        let start = data_addr as u128 + byte_offset as u128;
        let first = start as i128 + byte_lo;
        let end = start as i128 + byte_hi;
        if first < 0 || end > i128::from(USER_SPACE_END) {
            return Err(Error::field(
                "byte_offset",
                byte_offset,
                format!(
                    "data {data_addr:#x} + byte_offset with strides {strides:?} reaches outside the user address space (bytes {first:#x} to {end:#x}; user memory ends below 2^57)"
                ),
            ));
        }
        let align = dtype.alignment();
        if start & (align as u128 - 1) != 0 {
            return Err(Error::field(
                "data",
                format!("{data_addr:#x} + byte_offset {byte_offset}"),
                format!("not aligned to {align} bytes as {dtype} requires"),
            ));
        }
    }
    Ok(Extent { numel, byte_lo: byte_lo as isize, byte_hi: byte_hi as isize })
}

/// Whether `strides` describe compact row-major memory for `shape`.
/// Size-1 dims may carry any stride; zero-size tensors are contiguous.
pub fn is_contiguous(shape: &[i64], strides: &[i64]) -> bool {
    strides.len() == shape.len() && compact(shape.iter().zip(strides).rev())
}

/// Whether `strides` describe compact column-major (Fortran) memory for
/// `shape`: the first dim varies fastest. Size-1 dims may carry any stride;
/// zero-size tensors are contiguous (the rule `PyBuffer_IsContiguous` uses).
pub fn is_f_contiguous(shape: &[i64], strides: &[i64]) -> bool {
    strides.len() == shape.len() && compact(shape.iter().zip(strides))
}

/// Whether `(dim, stride)` pairs, fastest-varying first, are compact memory.
fn compact<'a>(dims: impl Iterator<Item = (&'a i64, &'a i64)> + Clone) -> bool {
    if dims.clone().any(|(&n, _)| n == 0) {
        return true;
    }
    let mut expected: i64 = 1;
    for (&n, &s) in dims {
        if n != 1 {
            if s != expected {
                return false;
            }
            expected = match expected.checked_mul(n) {
                Some(e) => e,
                None => return false,
            };
        }
    }
    true
}

/// A layout a writable view may have: no two logical elements share memory
/// ([`is_non_overlapping`]); the error names the shape and strides.
pub fn check_writable(shape: &[i64], strides: &[i64]) -> Result<()> {
    if is_non_overlapping(shape, strides) {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!("writable view: shape {shape:?} strides {strides:?} map several elements to the same memory")))
}

/// Whether no two logical elements share memory (a sufficient test: after
/// sorting the dims by |stride|, each stride clears the span of the smaller ones).
pub fn is_non_overlapping(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    // Row-major contiguous over the dims of more than one element (the sorted test
    // below ignores the others too): non-overlapping, with no sort. This is every
    // Array and most tensors, and a writable view of one is checked on every call.
    let mut expect = 1i64;
    let contiguous = shape.len() == strides.len()
        && shape.iter().zip(strides).rev().filter(|(n, _)| **n > 1).all(|(&n, &s)| {
            let ok = s == expect;
            expect = expect.checked_mul(n).unwrap_or(0);
            ok && expect != 0
        });
    if contiguous {
        return true;
    }
    let mut dims: smallvec::SmallVec<[(i64, i64); 6]> =
        shape.iter().zip(strides).filter(|(n, _)| **n > 1).map(|(&n, &s)| (n, s.unsigned_abs().min(i64::MAX as u64) as i64)).collect();
    dims.sort_unstable_by_key(|&(_, s)| s);
    let mut span: i128 = 0; // max element offset reached by the dims seen so far
    for (n, s) in dims {
        if (s as i128) <= span {
            return false;
        }
        span += (n as i128 - 1) * s as i128;
    }
    true
}

/// The element offsets of a strided layout, in row-major logical order.
///
/// Safe arithmetic only (wrapping): for a layout `check_layout` accepted,
/// every offset it yields lies inside the validated extent.
#[derive(Debug, Clone)]
pub struct Offsets {
    shape: smallvec::SmallVec<[i64; 6]>,
    strides: smallvec::SmallVec<[i64; 6]>,
    index: smallvec::SmallVec<[i64; 6]>,
    offset: isize,
    remaining: usize,
}

impl Offsets {
    /// Offsets for `shape` and `strides` (same length; extra entries are ignored).
    pub fn new(shape: &[i64], strides: &[i64]) -> Offsets {
        let numel = if shape.iter().any(|&n| n <= 0) {
            0
        } else {
            shape.iter().try_fold(1usize, |a, &n| a.checked_mul(n as usize)).unwrap_or(usize::MAX)
        };
        let ndim = shape.len().min(strides.len());
        Offsets {
            shape: shape[..ndim].into(),
            strides: strides[..ndim].into(),
            index: smallvec::SmallVec::from_elem(0, ndim),
            offset: 0,
            remaining: if ndim == shape.len() { numel } else { 0 },
        }
    }
}

impl Iterator for Offsets {
    type Item = isize;
    fn next(&mut self) -> Option<isize> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let current = self.offset;
        for d in (0..self.shape.len()).rev() {
            self.index[d] += 1;
            self.offset = self.offset.wrapping_add(self.strides[d] as isize);
            if self.index[d] < self.shape[d] {
                break;
            }
            self.offset = self.offset.wrapping_sub((self.strides[d] as isize).wrapping_mul(self.index[d] as isize));
            self.index[d] = 0;
        }
        Some(current)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Offsets {}

/// How a batched-matrix kernel (a GEMM per batch index) addresses one
/// operand: element strides from a view's first element, one per batch dim
/// (0 where the operand is broadcast over it), then between rows and columns.
#[derive(Debug, Clone, Copy)]
pub struct MatrixLayout<'a> {
    /// One stride per batch dim.
    pub batch: &'a [i64],
    /// Between rows.
    pub rows: i64,
    /// Between columns.
    pub cols: i64,
}

impl MatrixLayout<'_> {
    /// The element offset of batch index `index` (one entry per batch dim).
    pub fn batch_offset(&self, index: &[i64]) -> i64 {
        index.iter().zip(self.batch).map(|(i, s)| i * s).sum()
    }

    /// Checks that every element this layout addresses, over the batch
    /// extents `batch` and a `rows x cols` matrix, lies within `view`'s memory
    /// (what a kernel that forms its own addresses checks before it runs).
    /// Nothing is addressed when an extent is 0.
    pub fn check_within(&self, view: &crate::TensorView<'_>, batch: &[i64], rows: i64, cols: i64, what: &str) -> Result<()> {
        if batch.len() != self.batch.len() || batch.iter().chain([&rows, &cols]).any(|e| *e < 0) {
            return Err(Error::InvalidArgument(format!("{what}: the layout does not match the sizes")));
        }
        if batch.contains(&0) || rows == 0 || cols == 0 {
            return Ok(());
        }
        let (mut lo, mut hi) = (0i128, 0i128);
        for (extent, stride) in batch.iter().copied().zip(self.batch.iter().copied()).chain([(rows, self.rows), (cols, self.cols)]) {
            let reach = i128::from(extent - 1) * i128::from(stride);
            if reach < 0 { lo += reach } else { hi += reach }
        }
        let size = view.dtype().itemsize().unwrap_or(1) as i128;
        let e = view.extent();
        if lo * size < e.byte_lo as i128 || (hi + 1) * size > e.byte_hi as i128 {
            return Err(Error::Runtime(format!("{what}: the strides given reach past the tensor's memory")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn described<'a>(shape: &'a [i64], strides: Option<&'a [i64]>, dtype: DType, data: usize, off: u64, padded: bool) -> Described<'a> {
        Described { shape, strides, dtype, data_addr: data, byte_offset: off, subbyte_padded: padded }
    }

    fn dim() -> impl Strategy<Value = i64> {
        prop_oneof![8 => -1i64..6, 1 => Just(0), 1 => any::<i64>(), 1 => Just(i64::MAX), 1 => Just(1 << 31)]
    }

    fn stride() -> impl Strategy<Value = i64> {
        prop_oneof![8 => -7i64..8, 1 => any::<i64>(), 1 => Just(i64::MIN), 1 => Just(i64::MAX), 1 => Just(1i64 << 60)]
    }

    fn addr() -> impl Strategy<Value = usize> {
        prop_oneof![4 => (0usize..1 << 20).prop_map(|a| a * 64), 1 => Just(0), 1 => any::<usize>(), 1 => Just(usize::MAX - 7)]
    }

    #[test]
    fn the_common_path_takes_ordinary_layouts() {
        let f32 = DType::F32;
        let e = common_extent(&described(&[4, 3], Some(&[3, 1]), f32, 0x1000, 0, false)).expect("taken");
        assert_eq!(e, Extent { numel: 12, byte_lo: 0, byte_hi: 48 });
        let e = common_extent(&described(&[4, 3], Some(&[-3, 0]), f32, 0x1000, 64, false)).expect("taken");
        assert_eq!(e, Extent { numel: 12, byte_lo: -36, byte_hi: 4 });
        assert_eq!(common_extent(&described(&[1024], None, f32, 0x1000, 0, false)).map(|e| e.byte_hi), Some(4096));
        // Left to the general path: an empty or negative dim, NULL data, misalignment.
        assert_eq!(common_extent(&described(&[0, 3], None, f32, 0x1000, 0, false)), None);
        assert_eq!(common_extent(&described(&[-1], None, f32, 0x1000, 0, false)), None);
        assert_eq!(common_extent(&described(&[2], None, f32, 0, 0, false)), None);
        assert_eq!(common_extent(&described(&[2], None, f32, 0x1002, 0, false)), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 20000, ..ProptestConfig::default() })]

        /// The common path answers only what the general path would, and the same.
        #[test]
        fn the_common_path_agrees_with_the_general_one(
            dims in prop::collection::vec((dim(), stride()), 0..5),
            null_strides in any::<bool>(),
            dtype in prop::sample::select(DType::all_scalar()),
            padded in any::<bool>(),
            data in addr(),
            byte_offset in prop_oneof![4 => 0u64..256, 1 => any::<u64>()],
        ) {
            let shape: Vec<i64> = dims.iter().map(|d| d.0).collect();
            let strides: Vec<i64> = dims.iter().map(|d| d.1).collect();
            let strides = (!null_strides).then_some(&strides[..]);
            let general = checked_extent(&described(&shape, strides, dtype, data, byte_offset, padded));
            match common_extent(&described(&shape, strides, dtype, data, byte_offset, padded)) {
                Some(e) => prop_assert_eq!(general.ok(), Some(e)),
                None => prop_assert_eq!(check_layout(&shape, strides, dtype, data, byte_offset, padded).ok(), general.ok()),
            }
        }
    }

    #[test]
    fn a_matrix_layout_is_checked_against_the_views_memory() {
        let data = [0f32; 12];
        let v = crate::TensorView::from_slice(&data, &[3, 4]).unwrap();
        let rows = MatrixLayout { batch: &[], rows: 4, cols: 1 };
        assert!(rows.check_within(&v, &[], 3, 4, "a").is_ok());
        // Transposed: 4 x 3 through strides (1, 4) reaches the same 12 elements.
        assert!(MatrixLayout { batch: &[], rows: 1, cols: 4 }.check_within(&v, &[], 4, 3, "t").is_ok());
        // One row too many, a batch stepping past the end, a negative stride from element 0.
        assert!(rows.check_within(&v, &[], 4, 4, "a").unwrap_err().to_string().contains("a: the strides given reach past"));
        assert!(MatrixLayout { batch: &[6], rows: 4, cols: 1 }.check_within(&v, &[2], 2, 4, "b").is_err());
        assert!(MatrixLayout { batch: &[], rows: -4, cols: 1 }.check_within(&v, &[], 2, 4, "n").is_err());
        // Nothing addressed: always fine; a layout of the wrong batch rank: refused.
        assert!(MatrixLayout { batch: &[1000], rows: 4, cols: 1 }.check_within(&v, &[0], 3, 4, "e").is_ok());
        assert!(rows.check_within(&v, &[1], 3, 4, "r").is_err());
    }
}

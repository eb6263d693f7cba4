//! Reading any element of any single-lane dtype as a plain value: booleans,
//! integers of every width (sub-byte ones too), IEEE and bfloat16 floats,
//! complex numbers and the float8/6/4 families, decoded to `f64` exactly.
//!
//! Safe code only: the bytes come from [`TensorView::span_bytes`] (the
//! validated extent) and every read goes through bounds-checked slice access.
//!
//! Sub-byte packing: element `i` occupies bits `[i * bits, (i + 1) * bits)` of
//! the little-endian bit stream starting at element `[0, ..]`'s byte (the
//! first element in the low bits of its byte, as PyTorch's `float4_e2m1fn_x2`
//! and ml_dtypes' packed int4 store them). With IS_SUBBYTE_TYPE_PADDED each
//! element sits in the low bits of its own byte.

use dlbridge_core::half::{bf16, f16};
use dlbridge_core::layout::Offsets;
use dlbridge_core::{DType, DTypeCode, Error, Flags, Result, TensorView};

/// One element as a plain value (NumPy's `item()`), widened to a type that
/// holds every value of its dtype exactly (f64 for the float8/6/4 families,
/// f16 and bf16 too).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Item {
    /// `bool` (any non-zero byte is true).
    Bool(bool),
    /// Signed integers of any width.
    Int(i64),
    /// Unsigned integers of any width.
    UInt(u64),
    /// Every real floating-point dtype.
    Float(f64),
    /// Complex dtypes: (real, imaginary).
    Complex(f64, f64),
}

/// How the float8/6/4 formats spell NaN and infinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Special {
    /// IEEE-like: all-ones exponent is infinity (mantissa 0) or NaN.
    Ieee,
    /// `fn`: finite, NaN only where exponent and mantissa are all ones.
    Fn,
    /// `fnuz`: finite, no negative zero; the negative-zero pattern is NaN.
    Fnuz,
    /// No NaN, no infinity (the float6/float4 `fn` formats).
    Finite,
}

/// A small float format: exponent bits, mantissa bits, bias, specials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mini {
    exp: u32,
    man: u32,
    bias: i32,
    special: Special,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decode {
    Bool,
    Int(u32),
    UInt(u32),
    F16,
    BF16,
    F32,
    F64,
    /// Complex of two floats of this many bits each (16, 32 or 64).
    Complex(u32),
    Mini(Mini),
    /// float8_e8m0fnu: an unsigned power of two, 0xFF is NaN.
    E8M0,
}

fn decoder(dtype: DType) -> Result<Decode> {
    let unsupported = || {
        Error::DTypeMismatch {
            expected: "a single-lane number or bool dtype (vector and opaque-handle dtypes have no Python scalar)".into(),
            got: dtype,
        }
        .context("reading elements as items")
    };
    if dtype.lanes() != 1 {
        return Err(unsupported());
    }
    let mini = |exp, man, bias, special| Decode::Mini(Mini { exp, man, bias, special });
    Ok(match (dtype.code(), dtype.bits()) {
        (DTypeCode::Bool, _) => Decode::Bool,
        (DTypeCode::Int, b) => Decode::Int(u32::from(b)),
        (DTypeCode::UInt, b) => Decode::UInt(u32::from(b)),
        (DTypeCode::Float, 16) => Decode::F16,
        (DTypeCode::Float, 32) => Decode::F32,
        (DTypeCode::Float, 64) => Decode::F64,
        (DTypeCode::BFloat, 16) => Decode::BF16,
        (DTypeCode::Complex, b @ (32 | 64 | 128)) => Decode::Complex(u32::from(b) / 2),
        (DTypeCode::Float8E3M4, 8) => mini(3, 4, 3, Special::Ieee),
        (DTypeCode::Float8E4M3, 8) => mini(4, 3, 7, Special::Ieee),
        (DTypeCode::Float8E4M3B11Fnuz, 8) => mini(4, 3, 11, Special::Fnuz),
        (DTypeCode::Float8E4M3Fn, 8) => mini(4, 3, 7, Special::Fn),
        (DTypeCode::Float8E4M3Fnuz, 8) => mini(4, 3, 8, Special::Fnuz),
        (DTypeCode::Float8E5M2, 8) => mini(5, 2, 15, Special::Ieee),
        (DTypeCode::Float8E5M2Fnuz, 8) => mini(5, 2, 16, Special::Fnuz),
        (DTypeCode::Float8E8M0Fnu, 8) => Decode::E8M0,
        (DTypeCode::Float6E2M3Fn, 6) => mini(2, 3, 1, Special::Finite),
        (DTypeCode::Float6E3M2Fn, 6) => mini(3, 2, 3, Special::Finite),
        (DTypeCode::Float4E2M1Fn, 4) => mini(2, 1, 1, Special::Finite),
        _ => return Err(unsupported()),
    })
}

fn decode_mini(raw: u64, f: Mini) -> f64 {
    let exp_max = (1u64 << f.exp) - 1;
    let man_max = (1u64 << f.man) - 1;
    let negative = (raw >> (f.exp + f.man)) & 1 == 1;
    let exp = (raw >> f.man) & exp_max;
    let man = raw & man_max;
    match f.special {
        Special::Ieee if exp == exp_max => {
            let v = if man == 0 { f64::INFINITY } else { f64::NAN };
            return if negative { -v } else { v };
        }
        Special::Fn if exp == exp_max && man == man_max => return f64::NAN,
        Special::Fnuz if negative && exp == 0 && man == 0 => return f64::NAN,
        _ => {}
    }
    let scale = 2f64.powi(f.man as i32);
    let v = if exp == 0 { man as f64 / scale * 2f64.powi(1 - f.bias) } else { (1.0 + man as f64 / scale) * 2f64.powi(exp as i32 - f.bias) };
    if negative { -v } else { v }
}

fn decode_real(raw: u64, bits: u32) -> f64 {
    match bits {
        16 => f16::from_bits(raw as u16).to_f64(),
        32 => f64::from(f32::from_bits(raw as u32)),
        _ => f64::from_bits(raw),
    }
}

/// The elements of a view in row-major logical order, as [`Item`]s.
/// Built by [`Array::items`](crate::Array::items).
#[derive(Debug, Clone)]
pub struct Items<'a> {
    bytes: &'a [u8],
    /// Bit of `bytes` where element `[0, ..]` starts.
    base_bit: i128,
    /// Bits between consecutive element offsets (the storage width).
    stride_bits: i128,
    /// Bits of one element's value.
    value_bits: u32,
    decode: Decode,
    walk: Offsets,
}

impl<'a> Items<'a> {
    /// The elements of `view` (see [`Array::items`](crate::Array::items)).
    pub fn new(view: &TensorView<'a>) -> Result<Items<'a>> {
        let dtype = view.dtype();
        let decode = decoder(dtype)?;
        let (bytes, index) = view.span_bytes()?;
        let padded = view.flags().contains(Flags::IS_SUBBYTE_TYPE_PADDED);
        Ok(Items {
            bytes,
            base_bit: index as i128 * 8,
            stride_bits: i128::from(dtype.storage_bits(padded)),
            value_bits: dtype.element_bits(),
            decode,
            walk: Offsets::new(view.shape(), view.strides()),
        })
    }

    fn outside(&self, bit: i128) -> Error {
        Error::InvalidArgument(format!("element at bit {bit} lies outside the {} validated bytes", self.bytes.len()))
    }

    /// `bits` bits (at most 64) starting at bit `bit` of the span.
    fn read(&self, bit: i128, bits: u32) -> Result<u64> {
        let start = usize::try_from(bit).map_err(|_| self.outside(bit))?;
        let (byte, shift) = (start / 8, start % 8);
        if shift == 0 && bits.is_multiple_of(8) {
            let n = (bits / 8) as usize;
            let src = byte.checked_add(n).and_then(|end| self.bytes.get(byte..end)).ok_or_else(|| self.outside(bit))?;
            let mut word = [0u8; 8];
            let dst = word.get_mut(..n).ok_or_else(|| self.outside(bit))?;
            dst.copy_from_slice(src);
            // Native byte order: the first `n` bytes of a native u64 are its low bytes on
            // little-endian machines and its high bytes on big-endian ones.
            return Ok(if cfg!(target_endian = "little") { u64::from_le_bytes(word) } else { u64::from_be_bytes(word) >> (64 - 8 * n) });
        }
        // Sub-byte: at most 8 bits, within two bytes of the little-endian bit stream.
        let lo = u64::from(*self.bytes.get(byte).ok_or_else(|| self.outside(bit))?);
        let hi = if shift as u32 + bits > 8 { u64::from(*self.bytes.get(byte + 1).ok_or_else(|| self.outside(bit))?) } else { 0 };
        Ok(((lo | hi << 8) >> shift) & ((1u64 << bits) - 1))
    }

    fn decode_at(&self, bit: i128) -> Result<Item> {
        let bits = self.value_bits;
        Ok(match self.decode {
            Decode::Bool => Item::Bool(self.read(bit, bits)? != 0),
            Decode::Int(b) => {
                let raw = self.read(bit, b)?;
                let shift = 64 - b;
                Item::Int(((raw << shift) as i64) >> shift)
            }
            Decode::UInt(b) => Item::UInt(self.read(bit, b)?),
            Decode::F16 => Item::Float(decode_real(self.read(bit, 16)?, 16)),
            Decode::BF16 => Item::Float(bf16::from_bits(self.read(bit, 16)? as u16).to_f64()),
            Decode::F32 => Item::Float(decode_real(self.read(bit, 32)?, 32)),
            Decode::F64 => Item::Float(decode_real(self.read(bit, 64)?, 64)),
            Decode::Complex(half) => {
                let re = decode_real(self.read(bit, half)?, half);
                let im = decode_real(self.read(bit + i128::from(half), half)?, half);
                Item::Complex(re, im)
            }
            Decode::Mini(f) => Item::Float(decode_mini(self.read(bit, bits)?, f)),
            Decode::E8M0 => {
                let raw = self.read(bit, 8)?;
                Item::Float(if raw == 0xFF { f64::NAN } else { 2f64.powi(raw as i32 - 127) })
            }
        })
    }
}

impl Iterator for Items<'_> {
    type Item = Result<Item>;
    fn next(&mut self) -> Option<Result<Item>> {
        let off = self.walk.next()?;
        let bit = self.base_bit + off as i128 * self.stride_bits;
        Some(self.decode_at(bit))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.walk.size_hint()
    }
}

impl ExactSizeIterator for Items<'_> {}

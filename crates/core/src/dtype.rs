//! DLPack data types: every DLPack 1.3 type code, with bits and lanes.

use std::fmt;
use std::str::FromStr;

use dlpark::ffi::{DLDataType, DLDataTypeCode};

use crate::error::{Error, Result};

/// The kind of scalar a [`DType`] holds: one per DLPack 1.3 `DLDataTypeCode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DTypeCode {
    /// Signed integer (code 0).
    Int = 0,
    /// Unsigned integer (code 1).
    UInt = 1,
    /// IEEE float (code 2).
    Float = 2,
    /// Opaque handle, reserved for testing (code 3).
    OpaqueHandle = 3,
    /// bfloat16 (code 4).
    BFloat = 4,
    /// Complex, compact struct of two floats (code 5).
    Complex = 5,
    /// Boolean, one byte per element (code 6).
    Bool = 6,
    /// float8_e3m4 (code 7).
    Float8E3M4 = 7,
    /// float8_e4m3 (code 8).
    Float8E4M3 = 8,
    /// float8_e4m3b11fnuz (code 9).
    Float8E4M3B11Fnuz = 9,
    /// float8_e4m3fn (code 10).
    Float8E4M3Fn = 10,
    /// float8_e4m3fnuz (code 11).
    Float8E4M3Fnuz = 11,
    /// float8_e5m2 (code 12).
    Float8E5M2 = 12,
    /// float8_e5m2fnuz (code 13).
    Float8E5M2Fnuz = 13,
    /// float8_e8m0fnu (code 14).
    Float8E8M0Fnu = 14,
    /// float6_e2m3fn (code 15), packed by default.
    Float6E2M3Fn = 15,
    /// float6_e3m2fn (code 16), packed by default.
    Float6E3M2Fn = 16,
    /// float4_e2m1fn (code 17), packed by default.
    Float4E2M1Fn = 17,
}

const ALL_CODES: [DTypeCode; 18] = [
    DTypeCode::Int,
    DTypeCode::UInt,
    DTypeCode::Float,
    DTypeCode::OpaqueHandle,
    DTypeCode::BFloat,
    DTypeCode::Complex,
    DTypeCode::Bool,
    DTypeCode::Float8E3M4,
    DTypeCode::Float8E4M3,
    DTypeCode::Float8E4M3B11Fnuz,
    DTypeCode::Float8E4M3Fn,
    DTypeCode::Float8E4M3Fnuz,
    DTypeCode::Float8E5M2,
    DTypeCode::Float8E5M2Fnuz,
    DTypeCode::Float8E8M0Fnu,
    DTypeCode::Float6E2M3Fn,
    DTypeCode::Float6E3M2Fn,
    DTypeCode::Float4E2M1Fn,
];

/// [`DTypeCode::allowed_bits`] of each code (indexed by its value), as sets
/// of 256 bits (widths 0-127, then 128-255).
const ALLOWED_BITS: [[u128; 2]; 18] = {
    let mut sets = [[0u128; 2]; 18];
    let mut c = 0;
    while c < ALL_CODES.len() {
        let code = ALL_CODES[c];
        let bits = code.allowed_bits();
        let mut b = 0;
        while b < bits.len() {
            sets[code as usize][(bits[b] >> 7) as usize] |= 1u128 << (bits[b] & 127);
            b += 1;
        }
        c += 1;
    }
    sets
};

impl DTypeCode {
    /// Maps a raw DLPack code; `None` for codes DLPack 1.3 does not define.
    pub const fn from_u8(code: u8) -> Option<DTypeCode> {
        if (code as usize) < ALL_CODES.len() { Some(ALL_CODES[code as usize]) } else { None }
    }

    /// The scalar widths (in bits) DLPack allows for this code, one lane.
    const fn allowed_bits(self) -> &'static [u8] {
        match self {
            DTypeCode::Int | DTypeCode::UInt => &[1, 2, 4, 8, 16, 32, 64],
            DTypeCode::Float => &[16, 32, 64],
            DTypeCode::OpaqueHandle => &[8, 16, 32, 64],
            DTypeCode::BFloat => &[16],
            DTypeCode::Complex => &[32, 64, 128],
            DTypeCode::Bool => &[8],
            DTypeCode::Float8E3M4
            | DTypeCode::Float8E4M3
            | DTypeCode::Float8E4M3B11Fnuz
            | DTypeCode::Float8E4M3Fn
            | DTypeCode::Float8E4M3Fnuz
            | DTypeCode::Float8E5M2
            | DTypeCode::Float8E5M2Fnuz
            | DTypeCode::Float8E8M0Fnu => &[8],
            DTypeCode::Float6E2M3Fn | DTypeCode::Float6E3M2Fn => &[6],
            DTypeCode::Float4E2M1Fn => &[4],
        }
    }

    /// Whether DLPack allows `bits` for this code: [`DTypeCode::allowed_bits`]
    /// as a bit set (one load and a shift where every foreign tensor is checked).
    #[inline]
    fn allows_bits(self, bits: u8) -> bool {
        (ALLOWED_BITS[self as usize][usize::from(bits >> 7)] >> (bits & 127)) & 1 == 1
    }

    /// The short name used in dtype strings (`f8_e4m3fn`, ...); `None` for the
    /// codes whose name depends on the width (int, uint, float, complex, ...).
    fn fixed_name(self) -> Option<&'static str> {
        Some(match self {
            DTypeCode::Bool => "bool",
            DTypeCode::BFloat => "bf16",
            DTypeCode::Float8E3M4 => "f8_e3m4",
            DTypeCode::Float8E4M3 => "f8_e4m3",
            DTypeCode::Float8E4M3B11Fnuz => "f8_e4m3b11fnuz",
            DTypeCode::Float8E4M3Fn => "f8_e4m3fn",
            DTypeCode::Float8E4M3Fnuz => "f8_e4m3fnuz",
            DTypeCode::Float8E5M2 => "f8_e5m2",
            DTypeCode::Float8E5M2Fnuz => "f8_e5m2fnuz",
            DTypeCode::Float8E8M0Fnu => "f8_e8m0fnu",
            DTypeCode::Float6E2M3Fn => "f6_e2m3fn",
            DTypeCode::Float6E3M2Fn => "f6_e3m2fn",
            DTypeCode::Float4E2M1Fn => "f4_e2m1fn",
            DTypeCode::Int | DTypeCode::UInt | DTypeCode::Float | DTypeCode::Complex | DTypeCode::OpaqueHandle => {
                return None;
            }
        })
    }
}

/// A validated DLPack data type: code, bits per lane, lanes.
///
/// Only combinations DLPack defines can be built: `DType::from_dl` rejects an
/// unknown code, a width the code does not allow, or zero lanes.
/// Displayed and parsed as `f32`, `i64`, `u8`, `bf16`, `c64`, `bool`,
/// `f8_e4m3fn`, `f4_e2m1fn`, with `xN` for `N` lanes (`f32x4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DType {
    code: DTypeCode,
    bits: u8,
    lanes: u16,
}

macro_rules! consts {
    ($($name:ident = $code:ident, $bits:expr;)*) => {
        $( #[doc = concat!("`", stringify!($name), "`")] pub const $name: DType = DType { code: DTypeCode::$code, bits: $bits, lanes: 1 }; )*
    };
}

/// Every dtype with a name in NumPy's spelling, the one NumPy, torch and CuPy
/// use (`float32`, `complex64`; `bfloat16` is torch's and ml_dtypes'): the one
/// table of these names that dlbridge's parsers, adapters and code generators
/// read (Python gets it as `dlbridge._dlbridge.dtype_names()`).
pub const NUMPY_NAMES: [(DType, &str); 15] = [
    (DType::BOOL, "bool"),
    (DType::I8, "int8"),
    (DType::I16, "int16"),
    (DType::I32, "int32"),
    (DType::I64, "int64"),
    (DType::U8, "uint8"),
    (DType::U16, "uint16"),
    (DType::U32, "uint32"),
    (DType::U64, "uint64"),
    (DType::F16, "float16"),
    (DType::BF16, "bfloat16"),
    (DType::F32, "float32"),
    (DType::F64, "float64"),
    (DType::C64, "complex64"),
    (DType::C128, "complex128"),
];

impl DType {
    /// The dtype's name in NumPy's spelling ([`NUMPY_NAMES`]), if it has one.
    pub fn numpy_name(self) -> Option<&'static str> {
        NUMPY_NAMES.iter().find(|(d, _)| *d == self).map(|&(_, n)| n)
    }

    /// The dtype a NumPy-spelled name denotes (exactly one of [`NUMPY_NAMES`]).
    pub fn from_numpy_name(name: &str) -> Option<DType> {
        NUMPY_NAMES.iter().find(|(_, n)| *n == name).map(|&(d, _)| d)
    }

    /// Whether NumPy itself has this dtype (bf16 needs ml_dtypes).
    pub fn in_numpy(self) -> bool {
        self != DType::BF16 && self.numpy_name().is_some()
    }

    consts! {
        I8 = Int, 8; I16 = Int, 16; I32 = Int, 32; I64 = Int, 64;
        U8 = UInt, 8; U16 = UInt, 16; U32 = UInt, 32; U64 = UInt, 64;
        F16 = Float, 16; F32 = Float, 32; F64 = Float, 64;
        BF16 = BFloat, 16; C64 = Complex, 64; C128 = Complex, 128; BOOL = Bool, 8;
        F8_E4M3FN = Float8E4M3Fn, 8; F8_E5M2 = Float8E5M2, 8; F4_E2M1FN = Float4E2M1Fn, 4;
    }

    /// Builds a dtype, checking the combination is one DLPack defines.
    #[inline]
    pub fn new(code: DTypeCode, bits: u8, lanes: u16) -> Result<DType> {
        let err = |reason: &str| Error::UnknownDType { code: code as u8, bits, lanes, reason: reason.to_owned() };
        if lanes == 0 {
            return Err(err("lanes must be at least 1"));
        }
        if !code.allows_bits(bits) {
            return Err(err(&format!("{code:?} allows bits {:?}", code.allowed_bits())));
        }
        // Sub-byte types are packed: vector lanes must still fill whole bits cleanly.
        Ok(DType { code, bits, lanes })
    }

    /// Validates a raw `DLDataType` from a foreign producer.
    #[inline]
    pub fn from_dl(dl: DLDataType) -> Result<DType> {
        let code = DTypeCode::from_u8(dl.code.0).ok_or_else(|| Error::UnknownDType {
            code: dl.code.0,
            bits: dl.bits,
            lanes: dl.lanes,
            reason: "type code not defined by DLPack 1.3".to_owned(),
        })?;
        DType::new(code, dl.bits, dl.lanes)
    }

    /// The raw DLPack descriptor.
    pub const fn to_dl(self) -> DLDataType {
        DLDataType { code: DLDataTypeCode(self.code as u8), bits: self.bits, lanes: self.lanes }
    }

    /// The type code.
    #[inline]
    pub const fn code(self) -> DTypeCode {
        self.code
    }
    /// Bits per lane.
    #[inline]
    pub const fn bits(self) -> u8 {
        self.bits
    }
    /// Number of lanes (1 for scalars).
    #[inline]
    pub const fn lanes(self) -> u16 {
        self.lanes
    }
    /// The same scalar type with `lanes` lanes.
    #[inline]
    pub fn with_lanes(self, lanes: u16) -> Result<DType> {
        DType::new(self.code, self.bits, lanes)
    }

    /// Bits of one element when packed (`bits * lanes`).
    #[inline]
    pub const fn element_bits(self) -> u32 {
        self.bits as u32 * self.lanes as u32
    }

    /// Whether one element is a whole number of bytes.
    #[inline]
    pub const fn is_byte_sized(self) -> bool {
        self.element_bits().is_multiple_of(8)
    }

    /// Bits one element occupies in memory: `bits * lanes`, or, for sub-byte
    /// types with the IS_SUBBYTE_TYPE_PADDED flag, rounded up to whole bytes.
    pub const fn storage_bits(self, subbyte_padded: bool) -> u32 {
        if subbyte_padded && !self.is_byte_sized() { self.element_bits().div_ceil(8) * 8 } else { self.element_bits() }
    }

    /// Size of one element in bytes, or `None` for packed sub-byte types.
    pub const fn itemsize(self) -> Option<usize> {
        if self.is_byte_sized() { Some((self.element_bits() / 8) as usize) } else { None }
    }

    /// The alignment, in bytes, that one element's data pointer needs: the
    /// width of one scalar component (half a complex), at least 1.
    pub const fn alignment(self) -> usize {
        let component_bits = match self.code {
            DTypeCode::Complex => self.bits as u32 / 2,
            _ => self.bits as u32,
        };
        if component_bits >= 8 { (component_bits / 8) as usize } else { 1 }
    }

    /// Whether this is a floating-point type (IEEE, bfloat or the float8/6/4 families).
    #[inline]
    pub const fn is_float(self) -> bool {
        !matches!(self.code, DTypeCode::Int | DTypeCode::UInt | DTypeCode::Bool | DTypeCode::Complex | DTypeCode::OpaqueHandle)
    }

    /// Every scalar (one-lane) dtype DLPack 1.3 defines, in code order.
    #[inline]
    pub fn all_scalar() -> Vec<DType> {
        ALL_CODES.iter().flat_map(|&code| code.allowed_bits().iter().map(move |&bits| DType { code, bits, lanes: 1 })).collect()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code.fixed_name() {
            Some(name) => f.write_str(name)?,
            None => {
                let prefix = match self.code {
                    DTypeCode::Int => "i",
                    DTypeCode::UInt => "u",
                    DTypeCode::Float => "f",
                    DTypeCode::Complex => "c",
                    _ => "handle",
                };
                write!(f, "{prefix}{}", self.bits)?;
            }
        }
        if self.lanes != 1 {
            write!(f, "x{}", self.lanes)?;
        }
        Ok(())
    }
}

impl FromStr for DType {
    type Err = Error;

    fn from_str(s: &str) -> Result<DType> {
        let bad = || Error::DTypeParse(s.to_owned());
        let text = s.trim();
        // Split off a lane suffix `xN` (`f32x4`, `boolx4`), never the `x` inside
        // a name (`complex64`, `complex128x2`): only an `x` after "complex".
        let name_x = text.starts_with("complex").then_some("complex".len() - 1);
        let lane_x = text.rfind('x').filter(|&pos| Some(pos) != name_x);
        let (base, lanes) = match lane_x {
            Some(pos) if pos > 0 && text[pos + 1..].chars().all(|c| c.is_ascii_digit()) && pos + 1 < text.len() => {
                let lanes: u16 = text[pos + 1..].parse().map_err(|_| bad())?;
                (&text[..pos], lanes)
            }
            _ => (text, 1),
        };
        if let Some(d) = DType::from_numpy_name(base) {
            return DType::new(d.code, d.bits, lanes).map_err(|_| bad());
        }
        let alias = match base {
            "half" => "f16",
            "float" => "f32",
            "double" => "f64",
            "float8_e4m3fn" => "f8_e4m3fn",
            "float8_e5m2" => "f8_e5m2",
            "float4_e2m1fn" => "f4_e2m1fn",
            other => other,
        };
        for &code in &ALL_CODES {
            if code.fixed_name() == Some(alias) {
                return DType::new(code, code.allowed_bits()[0], lanes).map_err(|_| bad());
            }
        }
        let (code, digits) = if let Some(rest) = alias.strip_prefix("handle") {
            (DTypeCode::OpaqueHandle, rest)
        } else {
            let mut chars = alias.chars();
            let code = match chars.next() {
                Some('i') => DTypeCode::Int,
                Some('u') => DTypeCode::UInt,
                Some('f') => DTypeCode::Float,
                Some('c') => DTypeCode::Complex,
                _ => return Err(bad()),
            };
            (code, chars.as_str())
        };
        if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        let bits: u8 = digits.parse().map_err(|_| bad())?;
        DType::new(code, bits, lanes).map_err(|_| bad())
    }
}

/// A Rust scalar type whose values are exactly one element of a DLPack dtype.
///
/// # Safety
/// Implementors must have the size and alignment of `DTYPE`'s element, and
/// every bit pattern of that size must be a valid value of `Self` (foreign
/// memory is reinterpreted as `Self` without checks). This is why `bool` is
/// not an `Element`: read DLPack booleans as `u8`.
#[allow(unsafe_code)]
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The dtype of one element.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        // SAFETY: primitive number types of exactly DTYPE's width; every bit pattern is valid.
        #[allow(unsafe_code)]
        unsafe impl Element for $t { const DTYPE: DType = DType::$d; }
    )*};
}
element!(i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64,
         f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => BF16,
         num_complex::Complex<f32> => C64, num_complex::Complex<f64> => C128);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bit_sets_allow_exactly_the_listed_widths() {
        for (value, &code) in ALL_CODES.iter().enumerate() {
            assert_eq!(code as usize, value, "ALL_CODES is indexed by code");
            for bits in 0..=u8::MAX {
                assert_eq!(code.allows_bits(bits), code.allowed_bits().contains(&bits), "{code:?} with {bits} bits");
            }
        }
        assert!(DTypeCode::Complex.allows_bits(128));
        assert!(!DTypeCode::Float.allows_bits(128 + 32));
    }
}

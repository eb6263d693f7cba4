//! One structured error type for all of dlbridge.
//!
//! Variants are grouped by concern (layout, types, devices, ownership,
//! kernels, lookup). Each maps to an [`ErrorKind`], which the Python layer
//! turns into an exception class and the C plugin ABI into an error code.

use std::fmt;

use crate::{DType, Device};

/// Coarse classification of an [`Error`], stable across releases.
///
/// | kind      | Python exception | C code |
/// |-----------|------------------|--------|
/// | `Type`    | `TypeError`      | 1      |
/// | `Value`   | `ValueError`     | 2      |
/// | `Buffer`  | `BufferError`    | 3      |
/// | `NotFound`| `KeyError`/`LookupError` | 4 |
/// | `Runtime` | `RuntimeError`   | 5      |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The wrong dtype (or a dtype that cannot be handled at all).
    Type,
    /// Wrong shape, rank, stride, flag or argument value.
    Value,
    /// Memory that cannot be exported or imported as asked (device, version, read-only).
    Buffer,
    /// A kernel, plugin, symbol or file that does not exist.
    NotFound,
    /// A kernel or plugin failed while running.
    Runtime,
    /// An allocation could not be satisfied (Python `MemoryError`).
    Memory,
    /// A file (a plugin library) that does not exist (Python `FileNotFoundError`).
    FileNotFound,
}

impl ErrorKind {
    /// The error code used by the C plugin ABI (0 is success).
    pub const fn code(self) -> i32 {
        match self {
            ErrorKind::Type => 1,
            ErrorKind::Value => 2,
            ErrorKind::Buffer => 3,
            ErrorKind::NotFound => 4,
            ErrorKind::Runtime => 5,
            ErrorKind::Memory => 6,
            ErrorKind::FileNotFound => 7,
        }
    }

    /// The inverse of [`ErrorKind::code`]; unknown codes are `Runtime`.
    pub const fn from_code(code: i32) -> ErrorKind {
        match code {
            1 => ErrorKind::Type,
            2 => ErrorKind::Value,
            3 => ErrorKind::Buffer,
            4 => ErrorKind::NotFound,
            6 => ErrorKind::Memory,
            7 => ErrorKind::FileNotFound,
            _ => ErrorKind::Runtime,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Type => "type error",
            ErrorKind::Value => "value error",
            ErrorKind::Buffer => "buffer error",
            ErrorKind::NotFound => "not found",
            ErrorKind::Runtime => "runtime error",
            ErrorKind::Memory => "out of memory",
            ErrorKind::FileNotFound => "file not found",
        })
    }
}

/// Every error dlbridge reports. Messages name the field or argument, what was
/// expected and what came.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- descriptor / layout -------------------------------------------------
    /// A DLTensor field holds a value that cannot describe a tensor.
    #[error("invalid DLTensor field `{field}` = {value}: {reason}")]
    InvalidField {
        /// The DLTensor field, e.g. `shape[1]` or `byte_offset`.
        field: String,
        /// The value found there.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A size or address computation would overflow.
    #[error("tensor too large: {what} overflows")]
    Overflow {
        /// What was being computed.
        what: String,
    },
    /// A kernel or accessor needs a compact row-major tensor.
    #[error("{what} needs a contiguous (compact row-major) tensor, got shape {shape:?} strides {strides:?}")]
    NotContiguous {
        /// Who needs contiguity.
        what: String,
        /// The tensor's shape.
        shape: Vec<i64>,
        /// The tensor's strides (elements).
        strides: Vec<i64>,
    },
    /// A shape that does not match what was expected.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// A plain invalid argument.
    #[error("{0}")]
    InvalidArgument(String),
    /// A tensor's rank or dims do not match a kernel signature (the text names both sides).
    #[error("{0}")]
    Mismatch(String),
    /// A kernel signature that does not parse or type-check.
    #[error("signature error at column {column}: {message}\n  {signature}\n  {caret}^", caret = " ".repeat(column.saturating_sub(1)))]
    Signature {
        /// The signature text.
        signature: String,
        /// 1-based column of the offending character.
        column: usize,
        /// What is wrong there.
        message: String,
    },

    // ---- types ---------------------------------------------------------------
    /// A dtype code/bits/lanes triple that DLPack does not define or we cannot interpret.
    #[error("unknown dtype: code {code}, bits {bits}, lanes {lanes}{}", if reason.is_empty() { String::new() } else { format!(" ({reason})") })]
    UnknownDType {
        /// DLDataType.code.
        code: u8,
        /// DLDataType.bits.
        bits: u8,
        /// DLDataType.lanes.
        lanes: u16,
        /// Why it was refused.
        reason: String,
    },
    /// A dtype string that does not parse.
    #[error("cannot parse dtype {0:?} (expected e.g. f32, i64, bf16, c64, bool, f8_e4m3fn, f32x4)")]
    DTypeParse(String),
    /// The dtype is known but not the one required.
    #[error("dtype mismatch: expected {expected}, got {got}")]
    DTypeMismatch {
        /// What was required.
        expected: String,
        /// What came.
        got: DType,
    },

    // ---- devices -------------------------------------------------------------
    /// A device type code that DLPack does not define.
    #[error("unknown device type code {code} (device_id {id})")]
    UnknownDevice {
        /// DLDevice.device_type.
        code: u32,
        /// DLDevice.device_id.
        id: i32,
    },
    /// A device that the operation cannot serve.
    #[error("unsupported device {got}: {what}")]
    UnsupportedDevice {
        /// The device that came.
        got: Device,
        /// What needed another device.
        what: String,
    },

    // ---- ownership / versions / flags -----------------------------------------
    /// A DLPack major version we do not implement. The deleter has been called.
    #[error("unsupported DLPack version {major}.{minor} (this build understands major version {supported}); the tensor was released")]
    UnsupportedVersion {
        /// The producer's major version.
        major: u32,
        /// The producer's minor version.
        minor: u32,
        /// The major version we implement.
        supported: u32,
    },
    /// A write into a tensor flagged READ_ONLY (or otherwise not writable).
    #[error("{what}: tensor is read-only")]
    ReadOnly {
        /// Who wanted to write.
        what: String,
    },
    /// Memory that cannot be handed out as asked.
    #[error("{0}")]
    Buffer(String),
    /// A null pointer where a valid one is required.
    #[error("null pointer: {0}")]
    NullPointer(String),
    /// An allocation the library tried to make failed (never an abort).
    #[error("out of memory: cannot allocate {bytes} bytes for {what}")]
    OutOfMemory {
        /// How many bytes were asked for.
        bytes: u128,
        /// What the memory was for.
        what: String,
    },

    // ---- lookup / kernels ----------------------------------------------------
    /// Something looked up by name that does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A file that does not exist (a plugin path).
    #[error("no such file: {}", path.display())]
    FileNotFound {
        /// The path asked for.
        path: std::path::PathBuf,
    },
    /// A kernel or plugin reported a failure while running.
    #[error("{0}")]
    Runtime(String),
    /// An error reported through a code (a plugin's return value, a C caller) with its message.
    #[error("{message}")]
    Coded {
        /// The kind the code maps to.
        kind: ErrorKind,
        /// The message that came with it.
        message: String,
    },

    /// An error about one argument or output of a kernel call, with the
    /// kernel and the slot as structure (`matmul: argument b: ...`).
    #[error("{kernel}: {slot}: {source}")]
    Argument {
        /// The kernel's name.
        kernel: String,
        /// The parameter or output.
        slot: Slot,
        /// What is wrong with it.
        #[source]
        source: Box<Error>,
    },
    /// A call whose arguments do not fit the kernel's parameter list (their
    /// number, `out=`); Python's `TypeError`.
    #[error("{message}")]
    Arity {
        /// The kernel's name.
        kernel: String,
        /// What was expected and what came.
        message: String,
    },

    /// Another error with the place it happened (kernel, path).
    #[error("{context}: {source}")]
    Context {
        /// Where: "matmul: argument b", a plugin path, ...
        context: String,
        /// What went wrong there.
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// The coarse kind, for Python exception classes and C error codes.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidField { .. }
            | Error::Overflow { .. }
            | Error::NotContiguous { .. }
            | Error::Shape(_)
            | Error::InvalidArgument(_)
            | Error::Mismatch(_)
            | Error::Signature { .. }
            | Error::NullPointer(_) => ErrorKind::Value,
            Error::UnknownDType { .. } | Error::DTypeParse(_) | Error::DTypeMismatch { .. } => ErrorKind::Type,
            Error::UnknownDevice { .. }
            | Error::UnsupportedDevice { .. }
            | Error::UnsupportedVersion { .. }
            | Error::ReadOnly { .. }
            | Error::Buffer(_) => ErrorKind::Buffer,
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::Arity { .. } => ErrorKind::Type,
            Error::OutOfMemory { .. } => ErrorKind::Memory,
            Error::FileNotFound { .. } => ErrorKind::FileNotFound,
            Error::Runtime(_) => ErrorKind::Runtime,
            Error::Coded { kind, .. } => *kind,
            Error::Context { source, .. } | Error::Argument { source, .. } => source.kind(),
        }
    }

    /// Wraps the error with where it happened. Contexts nest outermost first.
    pub fn context(self, context: impl Into<String>) -> Error {
        Error::Context { context: context.into(), source: Box::new(self) }
    }

    /// The error about argument or output `slot` of `kernel`.
    pub fn at(self, kernel: impl Into<String>, slot: Slot) -> Error {
        Error::Argument { kernel: kernel.into(), slot, source: Box::new(self) }
    }

    /// The kernel and slot an [`Error::Argument`] (possibly under contexts) is about.
    pub fn slot(&self) -> Option<(&str, &Slot)> {
        match self {
            Error::Argument { kernel, slot, .. } => Some((kernel, slot)),
            Error::Context { source, .. } => source.slot(),
            _ => None,
        }
    }

    /// The innermost error, below every [`Error::Context`] and [`Error::Argument`].
    pub fn root(&self) -> &Error {
        match self {
            Error::Context { source, .. } | Error::Argument { source, .. } => source.root(),
            other => other,
        }
    }

    pub(crate) fn field(field: impl Into<String>, value: impl fmt::Display, reason: impl Into<String>) -> Error {
        Error::InvalidField { field: field.into(), value: value.to_string(), reason: reason.into() }
    }

    pub(crate) fn overflow(what: impl Into<String>) -> Error {
        Error::Overflow { what: what.into() }
    }
}

/// One argument or output of a kernel call, as errors name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Slot {
    /// The parameter of this name (a tensor, `mut` tensor or scalar).
    Argument(String),
    /// The output of this name.
    Output(String),
}

impl Slot {
    /// The parameter's or output's name.
    pub fn name(&self) -> &str {
        match self {
            Slot::Argument(n) | Slot::Output(n) => n,
        }
    }
    /// Whether it is an output.
    pub fn is_output(&self) -> bool {
        matches!(self, Slot::Output(_))
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Slot::Argument(n) => write!(f, "argument {n}"),
            Slot::Output(n) => write!(f, "output {n}"),
        }
    }
}

/// Adds context to a `Result`'s error.
pub trait ResultExt<T> {
    /// Wraps the error, if any, with `context` (computed lazily).
    fn context_with<C: Into<String>>(self, context: impl FnOnce() -> C) -> Result<T>;
}

impl<T> ResultExt<T> for Result<T> {
    fn context_with<C: Into<String>>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| e.context(context()))
    }
}

/// `Result` with dlbridge's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

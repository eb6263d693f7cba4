//! # dlbridge-core
//!
//! The validated DLPack tensor view at the centre of dlbridge.
//!
//! * [`DType`] — every DLPack 1.3 type code with bits and lanes; parsed and
//!   displayed as `f32`, `bf16`, `c64`, `bool`, `f8_e4m3fn`, `f32x4`.
//! * [`Device`] — device type (a newtype, so unknown codes are representable
//!   and rejected cleanly) and id.
//! * [`TensorView`] / [`TensorViewMut`] — borrowed, validated views: byte
//!   offset applied, NULL strides read as compact row-major, element count and
//!   byte extent computed without overflow, alignment checked, zero and
//!   negative strides handled; typed access through `as_slice` and strided
//!   iterators.
//! * [`ManagedTensor`] — an owned `DLManagedTensorVersioned` (or legacy
//!   `DLManagedTensor`) whose deleter runs exactly once; also the builder that
//!   exports any Rust owner as DLPack with zero copies.
//! * [`Error`] / [`ErrorKind`] — one structured error type.
//!
//! The DLPack structs themselves come from [`dlpark::ffi`] (re-exported as
//! [`ffi`]); nothing here redefines them.
//!
//! ## The trust boundary
//! A foreign tensor's fields are untrusted until validated; only its deleter
//! is trusted. Unsafe code lives in three modules, each opening with its
//! invariants: `raw` (reading foreign DLTensors), `view` (turning validated
//! layouts into references) and `managed` (ownership of producer pointers and
//! export contexts). `layout` is the safe arithmetic they rely on. `testing`
//! (hand-made foreign tensors with counting deleters, for conformance checks and
//! tests) is test support. `dtype` allows unsafe on
//! two items only: the `unsafe trait Element` and its impls.
//! The compiler holds this: `unsafe_code` is denied everywhere else.

#![deny(unsafe_code)]

pub mod device;
pub mod dtype;
pub mod error;
pub mod layout;
#[allow(unsafe_code)]
pub mod managed;
#[allow(unsafe_code)]
pub mod raw;
#[allow(unsafe_code)]
pub mod testing;
#[allow(unsafe_code)]
pub mod view;

pub use device::{Device, DeviceType};
pub use dtype::{DType, DTypeCode, Element};
pub use error::{Error, ErrorKind, Result, ResultExt, Slot};
pub use managed::{DLPACK_MAJOR, DLPACK_MINOR, ManagedTensor, TensorDesc};
pub use view::{Iter, IterMut, TensorView, TensorViewMut};

/// DLPack flags (READ_ONLY, IS_COPIED, IS_SUBBYTE_TYPE_PADDED), from dlpark.
pub use dlpark::DlpackFlags as Flags;
/// The DLPack C structs, from dlpark.
pub use dlpark::ffi;
/// `half::f16` / `half::bf16`, the element types for 16-bit floats.
pub use half;
/// `num_complex::Complex`, the element type for complex dtypes.
pub use num_complex;

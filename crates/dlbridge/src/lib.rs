//! # dlbridge
//!
//! The facade: re-exports the public API of the dlbridge crates, and ships the
//! `dlbridge` command-line tool.
#![forbid(unsafe_code)]

pub use dlbridge_array::{self as array, Array};
pub use dlbridge_core::{
    self as core, DType, Device, DeviceType, Element, Error, ErrorKind, Flags, ManagedTensor, Result, TensorDesc,
    TensorView, TensorViewMut,
};

pub mod demo;

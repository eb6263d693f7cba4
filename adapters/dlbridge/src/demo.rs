//! The Rust demo: an Array goes out as DLPack and comes back with zero copies.

use std::fmt::Write;

use crate::{Array, DType, Result};

/// Runs the demo and returns its report. Fails if any pointer differs.
pub fn array_round_trip() -> Result<String> {
    let mut out = String::new();
    let a = Array::arange(12, DType::F32)?;
    let a = Array::from_vec(a.to_vec::<f32>()?, &[3, 4])?;
    let t = a.t()?; // a strided view: shares memory
    // A DLManagedTensorVersioned owning a handle to the Array's memory (zero copy).
    let exported = t.to_managed()?;
    let version = exported.version().unwrap_or((0, 0));
    // Re-import through the same validation a foreign tensor gets.
    let back = Array::from_managed(exported)?;
    let _ = writeln!(out, "dlbridge demo: Array -> DLPack {}.{} -> Array", version.0, version.1);
    let _ = writeln!(out, "  original : dtype {} shape {:?} strides {:?} data {:p}", a.dtype(), a.shape(), a.strides(), a.data_ptr());
    let _ = writeln!(out, "  transpose: dtype {} shape {:?} strides {:?} data {:p}", t.dtype(), t.shape(), t.strides(), t.data_ptr());
    let _ = writeln!(
        out,
        "  re-import: dtype {} shape {:?} strides {:?} data {:p}",
        back.dtype(),
        back.shape(),
        back.strides(),
        back.data_ptr()
    );
    let same = back.data_ptr() == a.data_ptr() && back.shape() == t.shape() && back.strides() == t.strides();
    let _ = writeln!(out, "  values   : {:?}", back.to_vec::<f32>()?);
    let _ = writeln!(out, "  zero copy: pointers equal = {same}");
    if !same {
        return Err(crate::Error::Runtime("demo: the re-imported array does not share memory".into()));
    }
    Ok(out)
}

//! Paths of the C example plugin and of the malformed plugins the loader's
//! tests use, compiled by this crate's build script from `example.c`.
#![forbid(unsafe_code)]

use std::path::PathBuf;

/// The directory holding the compiled plugins.
pub const DIR: &str = env!("DLBRIDGE_PLUGIN_C_DIR");

/// Path of `libdlbridge_plugin_<variant>.so`: `example_c`, `future_abi`,
/// `small_struct`, `bad_signature`, `no_symbol`, `duplicate`.
pub fn path(variant: &str) -> PathBuf {
    PathBuf::from(DIR).join(format!("libdlbridge_plugin_{variant}.so"))
}

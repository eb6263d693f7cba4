//! Paths of the C example plugin and of the malformed plugins the loader's
//! tests use, compiled by this crate's build script from `example.c`.
#![forbid(unsafe_code)]

use std::path::PathBuf;

/// The directory holding the compiled plugins.
pub const DIR: &str = env!("DLBRIDGE_PLUGIN_C_DIR");

/// Path of `libdlbridge_plugin_<variant>.so`: `example_c`, `future_abi`,
/// `small_struct`, `bad_signature`, `no_symbol`, `duplicate` (the example's
/// kernels under another plugin name), `duplicate_kernel` (`c_dot` declared
/// twice for the CPU), `cuda_add_then_conflict` (a CUDA `add` with the
/// built-in's signature, then a `sub` whose signature differs from the
/// built-in's), `cuda_stream_probe` (a CUDA kernel that reports the stream
/// and device it was called with), `huge_signature` (a 1 MiB signature), `huge_name` (a 1 MiB
/// plugin name).
pub fn path(variant: &str) -> PathBuf {
    PathBuf::from(DIR).join(format!("libdlbridge_plugin_{variant}.so"))
}

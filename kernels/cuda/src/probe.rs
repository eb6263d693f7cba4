//! Is there a CUDA driver and a device? Asked before anything touches cudarc's
//! driver bindings, which panic when libcuda cannot be loaded.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use crate::raw;

/// Why CUDA cannot be used in this process (the text a skipped test prints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

impl From<Unavailable> for dlbridge_core::Error {
    fn from(u: Unavailable) -> Self {
        dlbridge_core::Error::UnsupportedDevice {
            got: dlbridge_core::Device::cuda(0),
            what: format!("CUDA is not available here: {}", u.0),
        }
    }
}

/// What the driver reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverInfo {
    /// The driver's CUDA version, e.g. 12040 for 12.4.
    pub version: i32,
    /// How many CUDA devices it sees (at least one).
    pub devices: i32,
}

/// Runs a cudarc call that may panic (a library or symbol that does not load)
/// and turns a panic into an error message.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("a panic with no message");
        format!("{what}: {msg}")
    })
}

fn detect() -> Result<DriverInfo, Unavailable> {
    if !raw::driver_present() {
        return Err(Unavailable(
            "no CUDA driver: libcuda.so could not be loaded (no NVIDIA driver on this machine, or not on the loader's path)".into(),
        ));
    }
    let init = guarded("cuInit", cudarc::driver::result::init).map_err(Unavailable)?;
    if let Err(e) = init {
        return Err(Unavailable(format!("the CUDA driver is installed but cuInit failed: {e}")));
    }
    let version = guarded("cuDriverGetVersion", raw::driver_version).map_err(Unavailable)?.map_err(Unavailable)?;
    let devices = guarded("cuDeviceGetCount", cudarc::driver::result::device::get_count)
        .map_err(Unavailable)?
        .map_err(|e| Unavailable(format!("cuDeviceGetCount failed: {e}")))?;
    if devices < 1 {
        return Err(Unavailable(format!("the CUDA driver ({}) sees no device", version_text(version))));
    }
    Ok(DriverInfo { version, devices })
}

/// The driver and device count, detected once per process.
pub fn driver() -> Result<DriverInfo, Unavailable> {
    static INFO: OnceLock<Result<DriverInfo, Unavailable>> = OnceLock::new();
    INFO.get_or_init(detect).clone()
}

/// `None` when CUDA works here; otherwise why a GPU test is skipped.
pub fn skip_reason() -> Option<String> {
    driver().err().map(|u| u.0)
}

/// `12040` as `CUDA 12.4`.
pub fn version_text(v: i32) -> String {
    format!("CUDA {}.{}", v / 1000, (v % 1000) / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_numbers_read_as_cuda_versions() {
        assert_eq!(version_text(12040), "CUDA 12.4");
        assert_eq!(version_text(13000), "CUDA 13.0");
        assert_eq!(version_text(12090), "CUDA 12.9");
    }

    #[test]
    fn a_panic_inside_a_guarded_call_becomes_an_error_naming_the_call() {
        let e = guarded("cuFoo", || -> i32 { panic!("Missing symbol cuFoo") }).unwrap_err();
        assert_eq!(e, "cuFoo: Missing symbol cuFoo");
        assert_eq!(guarded("ok", || 3), Ok(3));
    }

    #[test]
    fn detection_gives_devices_or_a_reason_and_never_panics() {
        match driver() {
            Ok(info) => {
                assert!(info.devices >= 1);
                assert!(info.version >= 11000, "{info:?}");
            }
            Err(u) => {
                assert!(!u.0.is_empty());
                assert_eq!(skip_reason(), Some(u.0));
            }
        }
    }
}

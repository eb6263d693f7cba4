//! DLPack devices: a device type code (kept as a newtype so unknown codes are
//! representable) and an id.

use std::fmt;

use dlpark::ffi::{DLDevice, DLDeviceType};

use crate::error::{Error, Result};

/// A DLPack device type code. Any `u32` is representable; [`DeviceType::name`]
/// is `None` for codes DLPack 1.3 does not define and validation rejects them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceType(pub u32);

const NAMES: [(u32, &str); 16] = [
    (1, "cpu"),
    (2, "cuda"),
    (3, "cuda_host"),
    (4, "opencl"),
    (7, "vulkan"),
    (8, "metal"),
    (9, "vpi"),
    (10, "rocm"),
    (11, "rocm_host"),
    (12, "ext_dev"),
    (13, "cuda_managed"),
    (14, "oneapi"),
    (15, "webgpu"),
    (16, "hexagon"),
    (17, "maia"),
    (18, "trn"),
];

impl DeviceType {
    /// Host memory.
    pub const CPU: DeviceType = DeviceType(1);
    /// CUDA device memory.
    pub const CUDA: DeviceType = DeviceType(2);
    /// Pinned host memory (cudaMallocHost).
    pub const CUDA_HOST: DeviceType = DeviceType(3);
    /// ROCm device memory.
    pub const ROCM: DeviceType = DeviceType(10);
    /// Pinned host memory (hipMallocHost).
    pub const ROCM_HOST: DeviceType = DeviceType(11);
    /// CUDA managed (unified) memory.
    pub const CUDA_MANAGED: DeviceType = DeviceType(13);

    /// The lower-case name (`cpu`, `cuda`, ...), or `None` for an unknown code.
    #[inline]
    pub fn name(self) -> Option<&'static str> {
        NAMES.iter().find(|(c, _)| *c == self.0).map(|(_, n)| *n)
    }

    /// Whether DLPack 1.3 defines this code.
    #[inline]
    pub fn is_known(self) -> bool {
        self.name().is_some()
    }

    /// Whether the CPU can read this memory directly (CPU, pinned and managed memory).
    #[inline]
    pub fn is_host_accessible(self) -> bool {
        matches!(self, DeviceType::CPU | DeviceType::CUDA_HOST | DeviceType::ROCM_HOST | DeviceType::CUDA_MANAGED)
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "unknown({})", self.0),
        }
    }
}

/// A device: type and index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    /// The device type.
    pub kind: DeviceType,
    /// The device index (0 for CPU, pinned and managed memory).
    pub id: i32,
}

impl Device {
    /// The host CPU.
    pub const CPU: Device = Device { kind: DeviceType::CPU, id: 0 };

    /// A CUDA device.
    #[inline]
    pub const fn cuda(id: i32) -> Device {
        Device { kind: DeviceType::CUDA, id }
    }

    /// Validates a raw `DLDevice` from a foreign producer: the type code must
    /// be one DLPack 1.3 defines and the id must not be negative.
    pub fn from_dl(dl: DLDevice) -> Result<Device> {
        let kind = DeviceType(dl.device_type.0);
        if !kind.is_known() {
            return Err(Error::UnknownDevice { code: dl.device_type.0, id: dl.device_id });
        }
        if dl.device_id < 0 {
            return Err(Error::field("device.device_id", dl.device_id, "must not be negative"));
        }
        // DLPack: "device_id 0 for CPU" — there is one host; another id is a malformed tensor.
        if kind == DeviceType::CPU && dl.device_id != 0 {
            return Err(Error::field("device.device_id", dl.device_id, "must be 0 for the CPU"));
        }
        Ok(Device { kind, id: dl.device_id })
    }

    /// The raw DLPack descriptor.
    #[inline]
    pub const fn to_dl(self) -> DLDevice {
        DLDevice { device_type: DLDeviceType(self.kind.0), device_id: self.id }
    }

    /// Whether the CPU can read this memory directly.
    #[inline]
    pub fn is_host_accessible(self) -> bool {
        self.kind.is_host_accessible()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind == DeviceType::CPU && self.id == 0 { f.write_str("cpu") } else { write!(f, "{}:{}", self.kind, self.id) }
    }
}

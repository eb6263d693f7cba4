//! Functions compiled from generated CUDA C (dlbridge-compile's
//! `ElementwiseKernel` / `ReductionKernel` on `cuda` tensors): a small safe
//! API over NVRTC, the [`PtxCache`] and the driver.
//!
//! * [`Program`]: one CUDA C source with its NVRTC options. [`Program::ptx`]
//!   compiles it for an architecture without a GPU (a check of the source);
//!   [`Program::function`] compiles it for a device (a CUBIN for its exact
//!   architecture when NVRTC makes one, else PTX for its compute capability —
//!   the loading [`raw_kernel`](crate::raw_kernel) uses), loads it into the
//!   device's context once and returns a [`Function`].
//! * [`Function::launch`]: a launch with typed arguments ([`LaunchArg`]) on a
//!   stream handle (the registry call's stream; NULL is the legacy default
//!   stream), never synchronised.
//!
//! Compilation goes through [`PtxCache::global`] (memory and disk, keyed by
//! source, options and architecture), so a second process finds the image on
//! disk.
//!
//! What the device code does with the pointers it is given is the source's
//! responsibility, as for a raw kernel or a plugin's native code: the caller
//! passes device pointers of tensors the registry validated for the call, and
//! the generated code addresses only their elements.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use dlbridge_core::{Error, Result};

use crate::array::CudaDevice;
use crate::indexer::Indexer;
use crate::launch::Launch;
use crate::nvrtc::{Output, PtxCache};
use crate::raw;

/// One kernel parameter, as the C function declares it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LaunchArg {
    /// A device pointer (any `T*`).
    Ptr(u64),
    /// `long long`.
    I64(i64),
    /// `unsigned long long`.
    U64(u64),
    /// `int`.
    I32(i32),
    /// `unsigned int`.
    U32(u32),
    /// `double`.
    F64(f64),
    /// `float`.
    F32(f32),
    /// `DlbIndexer` (kernels/cuda/cu/dlbridge_common.cuh), by value.
    Indexer(Indexer),
}

/// A CUDA C source and its NVRTC options (the architecture is added per
/// device), loaded at most once per device.
#[derive(Debug)]
pub struct Program {
    source: String,
    name: String,
    options: Vec<String>,
    functions: Mutex<HashMap<(usize, String), cudarc::driver::CudaFunction>>,
    modules: Mutex<HashMap<usize, Arc<cudarc::driver::CudaModule>>>,
}

impl Program {
    /// A program: `name` is its file name in NVRTC's messages (`kernel.cu`),
    /// `options` NVRTC options other than `--gpu-architecture`.
    pub fn new(source: impl Into<String>, name: impl Into<String>, options: &[String]) -> Program {
        Program {
            source: source.into(),
            name: name.into(),
            options: options.to_vec(),
            functions: Mutex::default(),
            modules: Mutex::default(),
        }
    }

    /// The source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The options NVRTC gets for `arch` (`--gpu-architecture=...`): `arch` first.
    pub fn options_for(&self, arch: &str) -> Vec<String> {
        let mut o = Vec::with_capacity(self.options.len() + 1);
        o.push(arch.to_owned());
        o.extend(self.options.iter().cloned());
        o
    }

    /// The PTX for `arch` (`--gpu-architecture=compute_XY`, or `sm_XY`),
    /// compiled at most once per key; no GPU needed. A source that does not
    /// compile is an error carrying NVRTC's log.
    pub fn ptx(&self, arch: &str) -> Result<Arc<str>> {
        PtxCache::global().get_or_compile(&self.source, &self.name, &self.options_for(arch))
    }

    /// The CUBIN for `arch` (`--gpu-architecture=sm_XY`); no GPU needed.
    pub fn cubin(&self, arch: &str) -> Result<Arc<[u8]>> {
        PtxCache::global().get_or_compile_to(&self.source, &self.name, &self.options_for(arch), Output::Cubin)
    }

    /// The kernel `entry` on `dev`: the program compiled for the device and
    /// loaded into its context on first use (per device), then from memory.
    pub fn function(&self, dev: &Arc<CudaDevice>, entry: &str) -> Result<Function> {
        let key = (dev.ordinal(), entry.to_owned());
        if let Some(f) = self.functions.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(Function { f: f.clone(), device: dev.clone(), entry: entry.to_owned() });
        }
        let module = {
            let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
            match modules.get(&dev.ordinal()) {
                Some(m) => m.clone(),
                None => {
                    let m = dev.load(&self.name, |arch| self.cubin(arch), |arch| self.ptx(arch))?;
                    modules.insert(dev.ordinal(), m.clone());
                    m
                }
            }
        };
        let f = module
            .load_function(entry)
            .map_err(|e| Error::NotFound(format!("cuda:{}: {} has no kernel {entry:?}: {e}", dev.ordinal(), self.name)))?;
        self.functions.lock().unwrap_or_else(|p| p.into_inner()).insert(key, f.clone());
        Ok(Function { f, device: dev.clone(), entry: entry.to_owned() })
    }
}

/// A kernel loaded on one device.
#[derive(Debug, Clone)]
pub struct Function {
    f: cudarc::driver::CudaFunction,
    device: Arc<CudaDevice>,
    entry: String,
}

impl Function {
    /// The device it is loaded on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The kernel's name.
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// Launches the kernel with `args` (one per C parameter, in order, of
    /// exactly the C parameter's type) on `stream`, the device's context made
    /// current on this thread. Not synchronised: errors of the running kernel
    /// surface at the stream's next synchronisation.
    pub fn launch(&self, cfg: Launch, stream: *mut c_void, args: &[LaunchArg]) -> Result<()> {
        if !(1..=1024).contains(&cfg.block) || cfg.grid == 0 {
            return Err(Error::InvalidArgument(format!("{}: launch of {} blocks of {} threads", self.entry, cfg.grid, cfg.block)));
        }
        // Each argument's value lives in `values` for the whole launch; `params`
        // points at each value's payload (the parameter's C representation).
        let mut values: Vec<LaunchArg> = args.to_vec();
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| match v {
                LaunchArg::Ptr(x) | LaunchArg::U64(x) => (x as *mut u64).cast::<c_void>(),
                LaunchArg::I64(x) => (x as *mut i64).cast::<c_void>(),
                LaunchArg::I32(x) => (x as *mut i32).cast::<c_void>(),
                LaunchArg::U32(x) => (x as *mut u32).cast::<c_void>(),
                LaunchArg::F64(x) => (x as *mut f64).cast::<c_void>(),
                LaunchArg::F32(x) => (x as *mut f32).cast::<c_void>(),
                LaunchArg::Indexer(x) => (x as *mut Indexer).cast::<c_void>(),
            })
            .collect();
        self.device.bind()?;
        raw::launch(self.f.cu_function(), cfg, stream, &mut params)
            .map_err(|e| Error::Runtime(format!("{}: kernel launch failed: {e}", self.entry)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_put_the_architecture_first() {
        let p = Program::new("extern \"C\" __global__ void k() {}", "k.cu", &["--std=c++17".to_string()]);
        assert_eq!(p.options_for("--gpu-architecture=compute_75"), ["--gpu-architecture=compute_75", "--std=c++17"]);
        assert_eq!(p.source(), "extern \"C\" __global__ void k() {}");
    }

    #[test]
    fn a_program_compiles_to_ptx_without_a_gpu_or_says_why_not() {
        let p = Program::new("extern \"C\" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }", "twice.cu", &[]);
        match crate::nvrtc::nvrtc() {
            Ok(_) => assert!(p.ptx("--gpu-architecture=compute_75").unwrap().contains(".entry twice(")),
            Err(e) => eprintln!("skipped: {e}"),
        }
    }
}

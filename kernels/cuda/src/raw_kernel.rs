//! Kernels from CUDA C source at run time, in the spirit of CuPy's
//! `RawKernel`, but with a dlbridge signature: the signature checks every call
//! (dtypes, shapes, devices, read-only outputs) and lets the caller's
//! framework allocate the outputs, exactly as for a built-in kernel.
//!
//! The C function receives, in order: one pointer per tensor parameter (its
//! element 0; tensors must be contiguous), one value per scalar parameter
//! (`f64` as `double`, `i64` as `long long`, `bool` as `int`), one pointer per
//! output, and last `long long n`, the element count of the first output (of
//! the first tensor when there is no output). Each type variable of the
//! signature is a `typedef` of its C type for the call's dtype (`typedef float T;`),
//! so one source serves every dtype the signature allows: f32 `float`, f64
//! `double`, f16/bf16 `unsigned short` (the raw bits), i8..i64 and u8..u64 the
//! C integer types, bool `unsigned char`.
//!
//! Loading: a CUBIN for the GPU's exact architecture when NVRTC makes one,
//! else PTX (see [`CudaDevice`]'s loading).
//!
//! Launch: `block` threads a block (256 unless given) and `grid` blocks when
//! given, else `ceil(n / block)`; nothing is launched when `n == 0`. The
//! kernel runs on the call's stream. Compilation: NVRTC for the device's
//! compute capability, once per dtype combination, through the
//! [`PtxCache`] (memory and disk); the source is compiled once when the kernel
//! is made (for the device's architecture, or `compute_75` without a GPU), so
//! a source that does not compile is an error then, with NVRTC's log.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use dlbridge_core::{DType, DeviceType, Error, Result};
use dlbridge_registry::signature::{DTypeRef, ParamKind};
use dlbridge_registry::{Arg, Call, Impl, Kernel, KernelDef, KernelOpts, Registry, Scalar, Signature};

use crate::array::CudaDevice;
use crate::launch::{Launch, MAX_GRID_X};
use crate::nvrtc::{Output, PtxCache};
use crate::{probe, raw};

/// The architecture a source is checked against without a GPU.
pub const CHECK_ARCH: &str = "--gpu-architecture=compute_75";

/// How a raw kernel is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawLaunch {
    /// Threads per block (1..=1024).
    pub block: u32,
    /// Blocks; `None`: `ceil(n / block)`.
    pub grid: Option<u32>,
}

impl Default for RawLaunch {
    fn default() -> Self {
        RawLaunch { block: 256, grid: None }
    }
}

impl RawLaunch {
    /// The launch for `n` elements (`None`: nothing to do).
    pub fn for_elements(&self, n: u64) -> Option<Launch> {
        if n == 0 {
            return None;
        }
        let grid = match self.grid {
            Some(g) => g,
            None => n.div_ceil(u64::from(self.block)).min(MAX_GRID_X) as u32,
        };
        Some(Launch { grid, block: self.block, shared: 0 })
    }
}

/// The C type of a dtype in a raw kernel.
pub fn c_type(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 | DType::BF16 | DType::U16 => "unsigned short",
        DType::I8 => "signed char",
        DType::I16 => "short",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::U8 | DType::BOOL => "unsigned char",
        DType::U32 => "unsigned int",
        DType::U64 => "unsigned long long",
        _ => return None,
    })
}

#[derive(Debug)]
struct Source {
    text: String,
    entry: String,
    options: Vec<String>,
    launch: RawLaunch,
    type_vars: Vec<String>,
    functions: Mutex<HashMap<(usize, Vec<DType>), cudarc::driver::CudaFunction>>,
}

impl Source {
    fn new(text: &str, entry: &str, sig: &Signature, options: &[String], launch: RawLaunch) -> Source {
        Source {
            text: text.to_string(),
            entry: entry.to_string(),
            options: options.to_vec(),
            launch,
            type_vars: sig.type_vars.iter().map(|t| t.name.clone()).collect(),
            functions: Mutex::default(),
        }
    }

    /// The source with one `typedef` per type variable in front (a typedef, not a
    /// `-D` macro, which would also rewrite NVRTC's own headers' template
    /// parameters), line numbers kept as the user's.
    fn text_for(&self, dtypes: &[DType]) -> String {
        let mut t = String::new();
        for (name, d) in self.type_vars.iter().zip(dtypes) {
            t += &format!("typedef {} {name};\n", c_type(*d).unwrap_or("void"));
        }
        t += &format!("#line 1 \"{}.cu\"\n", self.entry);
        t + &self.text
    }

    fn options_for(&self, arch: &str) -> Vec<String> {
        let mut options = vec![arch.to_string()];
        options.extend(self.options.iter().cloned());
        options
    }

    fn ptx(&self, dtypes: &[DType], arch: &str) -> Result<Arc<str>> {
        PtxCache::global().get_or_compile(&self.text_for(dtypes), &format!("{}.cu", self.entry), &self.options_for(arch))
    }

    fn image(&self, dtypes: &[DType], arch: &str, output: Output) -> Result<Arc<[u8]>> {
        PtxCache::global().get_or_compile_to(&self.text_for(dtypes), &format!("{}.cu", self.entry), &self.options_for(arch), output)
    }

    fn function(&self, dev: &CudaDevice, dtypes: &[DType]) -> Result<cudarc::driver::CudaFunction> {
        let key = (dev.ordinal(), dtypes.to_vec());
        let mut map = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(&key) {
            return Ok(f.clone());
        }
        let module =
            dev.load(&format!("{}.cu", self.entry), |arch| self.image(dtypes, arch, Output::Cubin), |arch| self.ptx(dtypes, arch))?;
        let f = module.load_function(&self.entry).map_err(|e| {
            Error::NotFound(format!("the compiled source has no kernel named {:?} (is it `extern \"C\" __global__`?): {e}", self.entry))
        })?;
        map.insert(key, f.clone());
        Ok(f)
    }

    fn launch(&self, call: &mut Call<'_, '_>) -> Result<()> {
        let dtypes: Vec<DType> =
            (0..self.type_vars.len()).map(|i| call.dtype(i).ok_or_else(|| call.layout_bug())).collect::<Result<_>>()?;
        let stream = call.stream();
        let (args, outs) = call.split();
        let mut device = None;
        let mut n = None;
        // Every parameter as 8 bytes (a pointer, double, long long, or an int in the low half).
        let mut values: Vec<u64> = Vec::with_capacity(args.len() + outs.len() + 1);
        for a in args.iter_mut() {
            match a {
                Arg::Tensor(v) => {
                    device = device.or(Some(v.device()));
                    n = n.or(Some(v.numel()));
                    values.push(v.data_ptr() as usize as u64);
                }
                Arg::TensorMut(v) => {
                    device = device.or(Some(v.device()));
                    n = n.or(Some(v.numel()));
                    values.push(v.data_ptr_mut() as usize as u64);
                }
                Arg::Scalar(Scalar::F64(x)) => values.push(x.to_bits()),
                Arg::Scalar(Scalar::I64(x)) => values.push(*x as u64),
                Arg::Scalar(Scalar::Bool(b)) => values.push(u64::from(*b)),
            }
        }
        let mut first_out = None;
        for o in outs.iter_mut() {
            device = device.or(Some(o.device()));
            first_out = first_out.or(Some(o.numel()));
            values.push(o.data_ptr_mut() as usize as u64);
        }
        let n = first_out.or(n).unwrap_or(0) as u64;
        values.push(n);
        let device =
            device.ok_or_else(|| Error::InvalidArgument(format!("{}: a raw kernel needs a tensor to know its device", self.entry)))?;
        let ordinal = usize::try_from(device.id).map_err(|_| Error::InvalidArgument(format!("device id {}", device.id)))?;
        let Some(cfg) = self.launch.for_elements(n) else { return Ok(()) };
        let dev = CudaDevice::get(ordinal)?;
        let f = self.function(&dev, &dtypes)?;
        dev.bind()?;
        let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast::<c_void>()).collect();
        raw::launch(f.cu_function(), cfg, stream, &mut params)
            .map_err(|e| Error::Runtime(format!("{}: kernel launch failed: {e}", self.entry)))
    }
}

/// The first dtype each type variable allows: what a source is checked with.
fn first_dtypes(sig: &Signature) -> Vec<DType> {
    sig.type_vars.iter().map(|t| t.allowed[0]).collect()
}

fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_') && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// The names of the kernels a PTX module defines (its `.entry` directives).
fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.split(".entry")
        .skip(1)
        .filter_map(|rest| {
            let name: String = rest.trim_start().chars().take_while(|&c| c.is_ascii_alphanumeric() || c == '_' || c == '$').collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// A kernel from CUDA C source: `entry` is the `extern "C" __global__`
/// function's name, `signature` a dlbridge signature whose parameters and
/// outputs are the function's, in order (see the module docs). The result is
/// a [`Kernel`] with a `cuda` implementation only, not registered anywhere.
///
/// The registry checks every call's tensors against `signature`; what the
/// device code then does with them is the source's responsibility, as with a
/// plugin's native code: a source that reads or writes outside its tensors, or
/// whose C parameters differ from the signature, corrupts device memory.
pub fn raw_kernel(source: &str, entry: &str, signature: &str, options: &[String], launch: RawLaunch) -> Result<Arc<Kernel>> {
    if !is_identifier(entry) {
        return Err(Error::InvalidArgument(format!("RawKernel: name {entry:?} is not a C identifier")));
    }
    if !(1..=1024).contains(&launch.block) {
        return Err(Error::InvalidArgument(format!("RawKernel {entry}: block = {} threads (1 to 1024)", launch.block)));
    }
    if launch.grid == Some(0) {
        return Err(Error::InvalidArgument(format!("RawKernel {entry}: grid = 0 blocks")));
    }
    let sig = Signature::parse(signature)?;
    let check = |d: DType, what: &str| -> Result<()> {
        c_type(d)
            .map(|_| ())
            .ok_or_else(|| Error::InvalidArgument(format!("RawKernel {entry}: {what} has dtype {d}, which a raw CUDA kernel cannot take")))
    };
    for tv in &sig.type_vars {
        for &d in &tv.allowed {
            check(d, &format!("type variable {}", tv.name))?;
        }
    }
    for p in sig.params.iter().chain(&sig.outputs) {
        if let ParamKind::Tensor(t) = &p.kind
            && let DTypeRef::Concrete(d) = t.dtype
        {
            check(d, &p.name)?;
        }
    }
    let state = Arc::new(Source::new(source, entry, &sig, options, launch));
    // Compile now, for the first dtype of each type variable, so a broken source
    // fails here with NVRTC's log rather than at the first call.
    let first = first_dtypes(&sig);
    // The GPU's architecture when there is one (its context is made once, and
    // reused by the calls), else the oldest NVRTC 13 targets: a check of the source.
    let arch = match probe::driver().ok().and_then(|_| CudaDevice::get(0).ok()) {
        Some(dev) => dev.nvrtc_arch(),
        None => CHECK_ARCH.to_string(),
    };
    let ptx = state.ptx(&first, &arch)?;
    let entries = ptx_entries(&ptx);
    if !entries.iter().any(|e| e == entry) {
        let has =
            if entries.is_empty() { "none".to_string() } else { entries.iter().map(|e| format!("`{e}`")).collect::<Vec<_>>().join(", ") };
        return Err(Error::InvalidArgument(format!(
            "RawKernel {entry}: the compiled source has no kernel named {entry:?} (is it `extern \"C\" __global__`?); its kernels: {has}"
        )));
    }
    let run = state.clone();
    let def = KernelDef {
        signature: signature.to_string(),
        device: DeviceType::CUDA,
        imp: Impl::Dyn(Arc::new(move |call: &mut Call<'_, '_>| run.launch(call))),
        opts: KernelOpts { contiguous: true, ..KernelOpts::DEFAULT },
        origin: format!("dlbridge.cuda.RawKernel ({entry})"),
        doc: format!("CUDA C kernel {entry}, compiled with NVRTC"),
        identity: format!("CUDA source:\n{source}\noptions: {options:?}\nblock: {} grid: {:?}", launch.block, launch.grid),
    };
    Registry::new().register(def)
}

/// The PTX of a raw kernel's source for one architecture and the first dtype
/// of each type variable (what [`raw_kernel`] checks), e.g. to inspect it.
pub fn raw_kernel_ptx(source: &str, entry: &str, signature: &str, options: &[String], arch: &str) -> Result<Arc<str>> {
    let sig = Signature::parse(signature)?;
    let state = Source::new(source, entry, &sig, options, RawLaunch::default());
    state.ptx(&first_dtypes(&sig), arch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launches_cover_n_elements_or_use_the_given_grid() {
        let l = RawLaunch::default();
        assert_eq!(l.for_elements(0), None);
        assert_eq!(l.for_elements(1), Some(Launch { grid: 1, block: 256, shared: 0 }));
        assert_eq!(l.for_elements(257).unwrap().grid, 2);
        assert_eq!(RawLaunch { block: 128, grid: Some(7) }.for_elements(1 << 30), Some(Launch { grid: 7, block: 128, shared: 0 }));
        assert_eq!(l.for_elements(u64::MAX).unwrap().grid as u64, MAX_GRID_X);
    }

    #[test]
    fn every_dtype_with_a_c_type_and_only_those() {
        assert_eq!(c_type(DType::F32), Some("float"));
        assert_eq!(c_type(DType::BF16), Some("unsigned short"));
        assert_eq!(c_type(DType::C64), None);
    }

    #[test]
    fn bad_names_blocks_and_dtypes_are_refused_before_compiling() {
        let src = "extern \"C\" __global__ void k(const float* x, float* y, long long n) {}";
        let sig = "k(x: f32[N]) -> (y: f32[N])";
        let e = raw_kernel(src, "not an identifier", sig, &[], RawLaunch::default()).unwrap_err();
        assert!(e.to_string().contains("not a C identifier"), "{e}");
        let e = raw_kernel(src, "k", sig, &[], RawLaunch { block: 2048, grid: None }).unwrap_err();
        assert!(e.to_string().contains("block = 2048"), "{e}");
        let e = raw_kernel(src, "k", "k(x: c64[N]) -> (y: c64[N])", &[], RawLaunch::default()).unwrap_err();
        assert!(e.to_string().contains("c64"), "{e}");
        let e = raw_kernel(src, "k", "k(x: f32[N] -> (y: f32[N])", &[], RawLaunch::default()).unwrap_err();
        assert!(e.to_string().contains("signature"), "{e}");
    }
}

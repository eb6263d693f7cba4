//! CUDA devices (a context, a caching pool) and arrays in device memory,
//! exported through DLPack as kDLCUDA with zero copies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaContext;
use cudarc::driver::sys::{CUdevice_attribute, cudaError_enum};
use dlbridge_array::Array;
use dlbridge_core::{DType, Device, Error, Flags, ManagedTensor, Result, TensorDesc};

use crate::pool::{AllocFailure, Block, Pool, PoolStats, RawAlloc};
use crate::probe::{self, guarded};
use crate::{raw, stream};

/// `cuMemAlloc` / `cuMemFree` in one device's primary context.
#[derive(Debug)]
pub struct DriverAlloc {
    ctx: Arc<CudaContext>,
}

impl RawAlloc for DriverAlloc {
    fn alloc(&mut self, bytes: usize) -> std::result::Result<u64, AllocFailure> {
        self.ctx.bind_to_thread().map_err(|e| AllocFailure::Other(e.to_string()))?;
        raw::mem_alloc(bytes).map_err(|e| match e.0 {
            cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => AllocFailure::OutOfMemory,
            _ => AllocFailure::Other(e.to_string()),
        })
    }

    fn free(&mut self, ptr: u64) {
        // A failed free at this point (a context torn down at exit) leaves nothing to do.
        if self.ctx.bind_to_thread().is_ok() {
            let _ = raw::mem_free(ptr);
        }
    }
}

/// One CUDA device: its primary context and dlbridge's memory pool on it.
#[derive(Debug)]
pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    pool: Arc<Pool<DriverAlloc>>,
    sms: u32,
    capability: (i32, i32),
    functions: Mutex<HashMap<String, cudarc::driver::CudaFunction>>,
    cublas: Mutex<Option<raw::CublasHandle>>,
    stream_waits: std::sync::atomic::AtomicU64,
}

impl CudaDevice {
    /// The device with this ordinal (one per process, made on first use).
    pub fn get(ordinal: usize) -> Result<Arc<CudaDevice>> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
        let info = probe::driver()?;
        if ordinal >= info.devices as usize {
            return Err(Error::UnsupportedDevice {
                got: Device::cuda(ordinal as i32),
                what: format!("this machine has {} CUDA device(s)", info.devices),
            });
        }
        let mut map = DEVICES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = map.get(&ordinal) {
            return Ok(d.clone());
        }
        let err = |what: &str, e: String| Error::Runtime(format!("cuda:{ordinal}: {what}: {e}"));
        let ctx = guarded("CudaContext::new", || CudaContext::new(ordinal))
            .map_err(|e| err("context", e))?
            .map_err(|e| err("context", e.to_string()))?;
        let sms =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map_err(|e| err("SM count", e.to_string()))?;
        let capability = ctx.compute_capability().map_err(|e| err("compute capability", e.to_string()))?;
        let dev = Arc::new(CudaDevice {
            ordinal,
            pool: Pool::new(DriverAlloc { ctx: ctx.clone() }),
            ctx,
            sms: sms.max(1) as u32,
            capability,
            functions: Mutex::default(),
            cublas: Mutex::new(None),
            stream_waits: Default::default(),
        });
        map.insert(ordinal, dev.clone());
        Ok(dev)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// Multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sms
    }
    /// Compute capability (major, minor).
    pub fn capability(&self) -> (i32, i32) {
        self.capability
    }
    /// NVRTC's `--gpu-architecture` for this device (PTX for its compute capability).
    pub fn nvrtc_arch(&self) -> String {
        format!("--gpu-architecture=compute_{}{}", self.capability.0, self.capability.1)
    }
    /// The cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// NVRTC's `--gpu-architecture` for a CUBIN of exactly this device.
    pub fn cubin_arch(&self) -> String {
        format!("--gpu-architecture=sm_{}{}", self.capability.0, self.capability.1)
    }

    /// Loads the image of a program into this device's context: a CUBIN for
    /// this exact architecture when NVRTC makes one (no compilation by the
    /// driver, loadable by older drivers of NVRTC's major version), else PTX
    /// for its compute capability.
    pub(crate) fn load(
        &self,
        what: &str,
        cubin: impl FnOnce(&str) -> Result<Arc<[u8]>>,
        ptx: impl FnOnce(&str) -> Result<Arc<str>>,
    ) -> Result<Arc<cudarc::driver::CudaModule>> {
        let image = match cubin(&self.cubin_arch()) {
            Ok(bin) => cudarc::nvrtc::Ptx::from_binary(bin.to_vec()),
            Err(cubin_err) => {
                let text = ptx(&self.nvrtc_arch())
                    .map_err(|e| e.context(format!("(a CUBIN for {} failed too: {cubin_err})", self.cubin_arch())))?;
                cudarc::nvrtc::Ptx::from_src(text.to_string())
            }
        };
        self.ctx.load_module(image).map_err(|e| {
            Error::Runtime(format!(
                "cuda:{}: loading {what} (NVRTC {:?}, {}) failed: {e}; a driver older than NVRTC's CUDA version cannot load its code",
                self.ordinal,
                crate::nvrtc::nvrtc().map(|n| n.version).ok(),
                self.cubin_arch()
            ))
        })
    }

    /// The kernel `entry` of a built-in source, compiled (NVRTC, cached) and
    /// loaded into this device's context on first use.
    pub fn builtin_function(&self, source: &crate::builtins::Source, entry: &str) -> Result<cudarc::driver::CudaFunction> {
        let mut map = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(entry) {
            return Ok(f.clone());
        }
        let cache = crate::nvrtc::PtxCache::global();
        let module = self.load(source.name, |arch| source.cubin(cache, arch), |arch| source.ptx(cache, arch))?;
        for e in source.entry_points() {
            let f = module
                .load_function(&e)
                .map_err(|err| Error::Runtime(format!("cuda:{}: {} has no kernel {e}: {err}", self.ordinal, source.name)))?;
            map.insert(e, f);
        }
        map.get(entry).cloned().ok_or_else(|| Error::NotFound(format!("CUDA kernel {entry} in {}", source.name)))
    }

    /// Runs `f` with this device's cuBLAS handle (made on first use; libcublas
    /// found like NVRTC), its context current; one call at a time.
    pub(crate) fn with_cublas<T>(&self, f: impl FnOnce(&mut raw::CublasHandle) -> std::result::Result<T, String>) -> Result<T> {
        static CUBLAS: OnceLock<std::result::Result<(), String>> = OnceLock::new();
        CUBLAS
            .get_or_init(|| crate::nvrtc::find_cublas().map(drop).map_err(|u| u.0))
            .clone()
            .map_err(|e| Error::UnsupportedDevice { got: Device::cuda(self.ordinal as i32), what: format!("matmul needs cuBLAS: {e}") })?;
        self.bind()?;
        let mut h = self.cublas.lock().unwrap_or_else(|p| p.into_inner());
        if h.is_none() {
            *h = Some(
                guarded("cublasCreate", raw::CublasHandle::new)
                    .map_err(Error::Runtime)?
                    .map_err(|e| Error::Runtime(format!("cuda:{}: {e}", self.ordinal)))?,
            );
        }
        let handle = h.as_mut().ok_or_else(|| Error::Runtime("cuBLAS handle".into()))?;
        f(handle).map_err(|e| Error::Runtime(format!("cuda:{}: {e}", self.ordinal)))
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| Error::Runtime(format!("cuda:{}: {e}", self.ordinal)))
    }

    /// The pool's counts.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }
    /// Releases the pool's cached blocks to the driver.
    pub fn empty_cache(&self) {
        self.pool.empty_cache()
    }
    /// Marks the pool block holding device address `addr` as lent to another
    /// framework (it goes back to the driver, not the cache, when freed); false
    /// for memory the pool did not allocate.
    pub fn mark_lent(&self, addr: u64) -> bool {
        self.pool.mark_lent(addr)
    }

    /// Orders the work queued on stream `consumer` after the work queued so far
    /// on stream `producer` with an event (see [`stream`]); nothing when they are
    /// the same stream (0 and 1 both name the legacy default stream).
    pub fn stream_wait(&self, producer: u64, consumer: u64) -> Result<()> {
        let canon = |s: u64| if s == 0 { stream::LEGACY } else { s };
        if canon(producer) == canon(consumer) {
            return Ok(());
        }
        self.bind()?;
        raw::stream_wait(canon(producer), canon(consumer))
            .map_err(|e| Error::Runtime(format!("cuda:{}: ordering stream {consumer:#x} after {producer:#x}: {e}", self.ordinal)))?;
        self.stream_waits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    /// Pool memory for a kernel's intermediate results, ordered on `stream`
    /// (a launch's stream handle; NULL is the legacy default stream): when
    /// dropped it goes back to the pool's cache for that stream, so the next
    /// user there queues after the work queued with it, and nothing waits.
    pub fn workspace(&self, bytes: usize, stream: *mut std::ffi::c_void) -> Result<Block<DriverAlloc>> {
        let s = stream as usize as u64;
        self.pool.malloc(bytes, if s == 0 { stream::LEGACY } else { s })
    }

    /// How many times [`CudaDevice::stream_wait`] queued an event wait.
    pub fn stream_waits(&self) -> u64 {
        self.stream_waits.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// An array in CUDA device memory (compact row-major), from the device's pool.
#[derive(Debug)]
pub struct CudaArray {
    device: Arc<CudaDevice>,
    block: Block<DriverAlloc>,
    dtype: DType,
    shape: Vec<i64>,
}

fn nbytes(dtype: DType, shape: &[i64]) -> Result<usize> {
    let numel = shape.iter().try_fold(1u64, |a, &n| u64::try_from(n).ok().and_then(|n| a.checked_mul(n)));
    let numel = numel.ok_or_else(|| Error::Shape(format!("shape {shape:?} is not a list of non-negative sizes that fits in memory")))?;
    numel
        .checked_mul(u64::from(dtype.bits()) * u64::from(dtype.lanes()))
        .map(|bits| bits.div_ceil(8))
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| Error::Overflow { what: format!("the size of a {dtype} array of shape {shape:?}") })
}

impl CudaArray {
    /// Uninitialised device memory for a compact array, ordered on the legacy default stream.
    pub fn empty(device: &Arc<CudaDevice>, dtype: DType, shape: &[i64]) -> Result<CudaArray> {
        let bytes = nbytes(dtype, shape)?;
        let block = device.pool.malloc(bytes, stream::LEGACY)?;
        Ok(CudaArray { device: device.clone(), block, dtype, shape: shape.to_vec() })
    }

    /// A device copy of a host array (made compact first if it is strided).
    pub fn from_host(device: &Arc<CudaDevice>, host: &Array) -> Result<CudaArray> {
        let compact;
        let src = if host.is_contiguous() {
            host
        } else {
            compact = host.contiguous()?;
            &compact
        };
        let view = src.view();
        let bytes = view.as_bytes()?;
        let out = CudaArray::empty(device, src.dtype(), src.shape())?;
        device.ctx.bind_to_thread().map_err(|e| Error::Runtime(format!("cuda:{}: {e}", device.ordinal)))?;
        raw::copy_htod(out.block.ptr(), bytes).map_err(|e| Error::Runtime(format!("copy to cuda:{}: {e}", device.ordinal)))?;
        Ok(out)
    }

    /// A host copy.
    pub fn to_host(&self) -> Result<Array> {
        let n = nbytes(self.dtype, &self.shape)?;
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(n).map_err(|_| Error::OutOfMemory { bytes: n as u128, what: "a host copy of a CUDA array".into() })?;
        bytes.resize(n, 0u8);
        self.device.ctx.bind_to_thread().map_err(|e| Error::Runtime(format!("cuda:{}: {e}", self.device.ordinal)))?;
        raw::copy_dtoh(&mut bytes, self.block.ptr()).map_err(|e| Error::Runtime(format!("copy from cuda:{}: {e}", self.device.ordinal)))?;
        Array::from_bytes(self.dtype, &self.shape, &bytes)
    }

    /// The device address of element 0.
    pub fn device_ptr(&self) -> u64 {
        self.block.ptr()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }
    /// A read-only view (for registry calls; its memory is on the device).
    pub fn view(&self) -> Result<dlbridge_core::TensorView<'_>> {
        raw::device_view(self.block.ptr(), self.block.size(), &self.shape, None, self.dtype, self.device())
    }
    /// A read-only strided view of the array's memory (e.g. a transpose), checked
    /// to stay inside the array's block.
    pub fn view_strided<'a>(&'a self, shape: &'a [i64], strides: &'a [i64]) -> Result<dlbridge_core::TensorView<'a>> {
        raw::device_view(self.block.ptr(), self.block.size(), shape, Some(strides), self.dtype, self.device())
    }
    /// A writable view (for registry outputs).
    pub fn view_mut(&mut self) -> Result<dlbridge_core::TensorViewMut<'_>> {
        let device = self.device();
        raw::device_view_mut(self.block.ptr(), self.block.size(), &self.shape, self.dtype, device)
    }
    /// `cuda:N`.
    pub fn device(&self) -> Device {
        Device::cuda(self.device.ordinal as i32)
    }

    /// Exports the array as a versioned DLPack tensor (kDLCUDA, this device's
    /// id), with zero copies. The consumer's deleter frees the memory
    /// (`cuMemFree`, which waits for the device) rather than caching it: the
    /// consumer may have queued work on it on streams dlbridge cannot see.
    pub fn into_dlpack(self) -> Result<ManagedTensor> {
        let CudaArray { device, block, dtype, shape } = self;
        let lent = CudaArray { device, block: block.uncached(), dtype, shape };
        lent.export()
    }

    fn export(self) -> Result<ManagedTensor> {
        let (data, shape) = (self.block.ptr(), self.shape.clone());
        let desc =
            TensorDesc { dtype: self.dtype, device: self.device(), shape: &shape, strides: None, byte_offset: 0, flags: Flags::empty() };
        raw::export_device(self, data, &desc)
    }
}

/// The device of a `cuda:N` view.
fn device_of(view: &dlbridge_core::TensorView<'_>) -> Result<Arc<CudaDevice>> {
    let d = view.device();
    if d.kind != dlbridge_core::DeviceType::CUDA {
        return Err(Error::UnsupportedDevice { got: d, what: "a CUDA device array was expected".into() });
    }
    CudaDevice::get(usize::try_from(d.id).map_err(|_| Error::InvalidArgument(format!("cuda device id {}", d.id)))?)
}

/// The bytes a view spans, and where its element 0 is among them.
fn span_of(view: &dlbridge_core::TensorView<'_>) -> (u64, usize, usize) {
    let e = view.extent();
    let lo = view.data_ptr() as usize as u64 as i64 + e.byte_lo as i64;
    (lo as u64, (e.byte_hi - e.byte_lo) as usize, (-e.byte_lo) as usize)
}

/// Uninitialised pool memory for a compact array on `cuda:device_id`, as a
/// DLPack tensor (what `dlbridge.Array` allocates kernel outputs in). Ordered
/// on the legacy default stream; back to the pool's cache when freed, unless
/// marked lent ([`CudaDevice::mark_lent`]).
pub fn empty_pooled(device_id: i32, dtype: DType, shape: &[i64]) -> Result<ManagedTensor> {
    let ordinal = usize::try_from(device_id).map_err(|_| Error::InvalidArgument(format!("cuda device id {device_id}")))?;
    CudaArray::empty(&CudaDevice::get(ordinal)?, dtype, shape)?.export()
}

/// A compact device copy of a host array on `cuda:device_id` (pool memory,
/// as [`empty_pooled`]); synchronous.
pub fn copy_from_host(device_id: i32, host: &Array) -> Result<ManagedTensor> {
    let ordinal = usize::try_from(device_id).map_err(|_| Error::InvalidArgument(format!("cuda device id {device_id}")))?;
    CudaArray::from_host(&CudaDevice::get(ordinal)?, host)?.export()
}

/// A host copy of a CUDA view with the same layout (strides, negative ones
/// too): the bytes it spans are copied after the work queued on the legacy
/// default stream, and the call returns when they have arrived.
pub fn copy_to_host(view: &dlbridge_core::TensorView<'_>) -> Result<Array> {
    let dev = device_of(view)?;
    let (lo, len, offset) = span_of(view);
    let mut buf = Array::zeros(DType::U8, &[len as i64])?;
    if len > 0 {
        dev.bind()?;
        raw::copy_dtoh_at(buf.as_slice_mut::<u8>()?, lo).map_err(|e| Error::Runtime(format!("copy from cuda:{}: {e}", dev.ordinal)))?;
    }
    let desc = TensorDesc {
        dtype: view.dtype(),
        device: Device::CPU,
        shape: view.shape(),
        strides: Some(view.strides()),
        byte_offset: 0,
        flags: view.flags() & Flags::IS_SUBBYTE_TYPE_PADDED,
    };
    Array::from_managed(raw::export_host_span(buf, offset, &desc)?)
}

/// A device copy of a CUDA view on the same device, with the same layout
/// (pool memory, the span's bytes copied on the legacy default stream; the
/// copy is queued, not waited for).
pub fn copy_on_device(view: &dlbridge_core::TensorView<'_>) -> Result<ManagedTensor> {
    let dev = device_of(view)?;
    let (lo, len, offset) = span_of(view);
    let block = dev.pool.malloc(len, stream::LEGACY)?;
    if len > 0 {
        dev.bind()?;
        raw::copy_dtod(block.ptr(), lo, len, stream::LEGACY).map_err(|e| Error::Runtime(format!("copy on cuda:{}: {e}", dev.ordinal)))?;
    }
    let data = block.ptr() + offset as u64;
    let desc = TensorDesc {
        dtype: view.dtype(),
        device: view.device(),
        shape: view.shape(),
        strides: Some(view.strides()),
        byte_offset: 0,
        flags: view.flags() & Flags::IS_SUBBYTE_TYPE_PADDED,
    };
    raw::export_device(block, data, &desc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked_before_any_device_call() {
        assert_eq!(nbytes(DType::F32, &[4096, 1024]).unwrap(), 16 << 20);
        assert_eq!(nbytes(DType::F32, &[]).unwrap(), 4);
        assert_eq!(nbytes(DType::BOOL, &[3]).unwrap(), 3);
        assert!(nbytes(DType::F32, &[-1]).is_err());
        assert!(nbytes(DType::F64, &[i64::MAX, 4]).is_err());
    }
}

//! Every `unsafe` operation of dlbridge-cuda: loading the CUDA libraries,
//! raw driver calls, and handing device memory to DLPack.
//!
//! Invariants:
//! * cudarc's `dynamic-loading` bindings panic when a library or a symbol
//!   cannot be loaded. Nothing here calls a cudarc function before
//!   [`driver_present`] / [`nvrtc_present`] said the library loads, and every
//!   call that may still panic (a symbol missing from an older library) runs
//!   inside `catch_unwind` in the safe wrappers of the calling module.
//! * A library preloaded by path ([`preload`]) is never unloaded: it is kept
//!   in a process-wide list, so cudarc's later `dlopen` by name finds the same
//!   object (glibc matches an already loaded object by its soname) and every
//!   function pointer cudarc caches stays valid for the life of the process.
//! * Device pointers passed to the driver come from the driver's own
//!   allocator (`cuMemAlloc`), with the context that owns them current on the
//!   calling thread, and a freed pointer is never used again (the pool owns
//!   each block exactly once).

use std::path::Path;
use std::sync::Mutex;

use cudarc::driver::sys::CUdeviceptr;

/// Libraries loaded by path, kept for the life of the process.
static PRELOADED: Mutex<Vec<libloading::Library>> = Mutex::new(Vec::new());

/// Loads the shared library at `path` and keeps it loaded for good.
pub(crate) fn preload(path: &Path) -> Result<(), String> {
    // SAFETY: loading a library runs its initialisers. The candidates are
    // NVIDIA's own CUDA libraries (found by name in a CUDA installation or a
    // Python wheel, or named by the user through DLBRIDGE_NVRTC), whose
    // initialisers only set up the library itself.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("{}: {e}", path.display()))?;
    PRELOADED.lock().unwrap_or_else(|p| p.into_inner()).push(lib);
    Ok(())
}

/// Whether cudarc can load libcuda by any of its names.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries to `dlopen` libcuda by name (and closes it again).
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether cudarc can load libnvrtc by any of its names.
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: only tries to `dlopen` libnvrtc by name.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The driver's CUDA version (e.g. 12040 for 12.4). The driver library is loaded.
pub(crate) fn driver_version() -> Result<i32, String> {
    let mut v = 0i32;
    // SAFETY: writes one int through a valid pointer; libcuda is loadable (caller).
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if r == cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS { Ok(v) } else { Err(format!("cuDriverGetVersion: {r:?}")) }
}

/// `cuMemAlloc` of `bytes` in the context current on this thread.
pub(crate) fn mem_alloc(bytes: usize) -> Result<CUdeviceptr, cudarc::driver::DriverError> {
    // SAFETY: the caller made the owning context current; the result is a fresh
    // device allocation owned by the caller (the pool), freed once by `mem_free`.
    unsafe { cudarc::driver::result::malloc_sync(bytes) }
}

/// `cuMemFree` of a pointer from [`mem_alloc`] in the same (current) context.
pub(crate) fn mem_free(ptr: CUdeviceptr) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: `ptr` came from `mem_alloc` in the current context and is freed
    // exactly once (the pool removes it from its books first).
    unsafe { cudarc::driver::result::free_sync(ptr) }
}

/// Copies host bytes to device memory (synchronous).
pub(crate) fn copy_htod(dst: CUdeviceptr, src: &[u8]) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: `dst` is a live device allocation of at least `src.len()` bytes
    // (a pool block the caller holds), its context current.
    unsafe { cudarc::driver::result::memcpy_htod_sync(dst, src) }
}

/// Copies device bytes to host memory (synchronous).
pub(crate) fn copy_dtoh(dst: &mut [u8], src: CUdeviceptr) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: `src` is a live device allocation of at least `dst.len()` bytes
    // (a pool block the caller holds), its context current.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(dst, src) }
}

/// Orders the work queued on `consumer` after the work queued so far on
/// `producer`: an event recorded on one, waited on by the other (never a
/// device-wide synchronisation). Stream handles as DLPack gives them (1: the
/// legacy default stream, 2: the per-thread one, else a `CUstream`).
pub(crate) fn stream_wait(producer: u64, consumer: u64) -> Result<(), cudarc::driver::DriverError> {
    use cudarc::driver::result::{event, stream};
    use cudarc::driver::sys::{CUevent_flags, CUevent_wait_flags, CUstream};
    let ev = event::create(CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
    // SAFETY: the caller made the streams' context current; both handles are
    // streams of that context that the caller (the array's producer, the
    // consumer that named it) keeps alive for the call; `ev` was just created.
    let queued = unsafe {
        event::record(ev, producer as usize as CUstream)
            .and_then(|()| stream::wait_event(consumer as usize as CUstream, ev, CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT))
    };
    // SAFETY: `ev` is destroyed exactly once; destroying an event whose wait is
    // queued is allowed (the driver frees it once the wait has been satisfied).
    let destroyed = unsafe { event::destroy(ev) };
    queued.and(destroyed)
}

/// Copies `bytes` bytes between device allocations, queued on `stream`.
pub(crate) fn copy_dtod(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: u64) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: `src..src+bytes` lies in a live allocation the caller holds (a
    // validated view's byte span) and `dst..dst+bytes` in a fresh pool block of
    // at least `bytes` bytes; their context is current; the copy is ordered on
    // `stream`, the stream both are ordered on.
    unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream as usize as cudarc::driver::sys::CUstream) }
}

/// Copies device bytes at `src` into `dst`, ordered after the work queued on
/// the legacy default stream, and returns when they have arrived.
pub(crate) fn copy_dtoh_at(dst: &mut [u8], src: CUdeviceptr) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: `src..src+dst.len()` lies in a live device allocation the caller
    // holds (a validated view's byte span), its context current.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(dst, src) }
}

/// A host tensor with `desc`'s layout whose element 0 is at byte `offset` of
/// `buf`'s memory (a byte buffer from `Array::zeros`, 64-byte aligned), which
/// the export keeps alive.
pub(crate) fn export_host_span(
    buf: dlbridge_array::Array,
    offset: usize,
    desc: &dlbridge_core::TensorDesc<'_>,
) -> dlbridge_core::Result<dlbridge_core::ManagedTensor> {
    let data = buf.data_ptr().wrapping_add(offset).cast_mut().cast::<std::ffi::c_void>();
    // SAFETY: `buf` is a contiguous u8 array holding the copied byte span of a
    // view whose element 0 was `offset` bytes into the span, so `desc`'s layout
    // at `data` stays inside `buf` (ManagedTensor::export_owner validates the
    // layout again); `buf` is moved into the export, which keeps it alive; it is
    // unshared (just made), so the consumer may write it.
    unsafe { dlbridge_core::ManagedTensor::export_owner(buf, data, desc) }
}

/// Exports device memory owned by `owner` as a DLPack tensor (kDLCUDA).
pub(crate) fn export_device<O: Send + 'static>(
    owner: O,
    data: CUdeviceptr,
    desc: &dlbridge_core::TensorDesc<'_>,
) -> dlbridge_core::Result<dlbridge_core::ManagedTensor> {
    // SAFETY: `owner` holds the device allocation at `data` (a pool block sized
    // for the layout `desc` describes) and keeps it alive until the consumer's
    // deleter drops the owner; the array gave up its own handle (moved in).
    unsafe { dlbridge_core::ManagedTensor::export_owner(owner, data as usize as *mut std::ffi::c_void, desc) }
}

/// The device-side layout of a tensor passed to a kernel by value.
// SAFETY: `Indexer` is `#[repr(C)]` plain data (integers only) with the layout
// of `DlbIndexer` in kernels/cuda/cu/dlbridge_common.cuh (size and offsets are
// asserted in `indexer`'s tests).
unsafe impl cudarc::driver::DeviceRepr for crate::indexer::Indexer {}

/// NVRTC's version (major, minor). libnvrtc is loadable (caller).
pub(crate) fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: writes two ints through valid pointers.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS { Ok((major, minor)) } else { Err(format!("nvrtcVersion: {r:?}")) }
}

/// `cuLaunchKernel` of `f` on `stream` (NULL: the legacy default stream).
/// `params` holds one pointer per kernel parameter, to a value of exactly the
/// parameter's C type, alive for the call.
pub(crate) fn launch(
    f: cudarc::driver::sys::CUfunction,
    cfg: crate::launch::Launch,
    stream: *mut std::ffi::c_void,
    params: &mut [*mut std::ffi::c_void],
) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: `f` is a function of a module loaded in the context current on
    // this thread (the caller bound it); every entry of `params` points to a
    // live value of the parameter's size (8 bytes, or a DlbIndexer) for the
    // call. For the built-in kernels (`kernels`, `matmul`) the parameter lists
    // are those of kernels/cuda/cu, the device pointers are validated views the
    // caller holds for the call (the registry's binding checked dtype, shape,
    // strides, writability and overlap), and the kernels address only elements
    // inside them (checked on the host by kernels/cuda/cu/host_test.cpp). A
    // `raw_kernel` runs the user's own device code: like a plugin's native code
    // it is trusted to match its signature and stay inside its tensors (the
    // registry can check the tensors, not what the code does with them). A
    // `generated` function (dlbridge-compile's kernels from source) gets the
    // parameter list its generator wrote (`LaunchArg`s of exactly those C
    // types) and validated views; the generated code addresses elements through
    // their indexers and bounds-checks `raw` indices, and the user's operation
    // text inside it is trusted as a raw kernel's is.
    unsafe { cudarc::driver::result::launch_kernel(f, (cfg.grid, 1, 1), (cfg.block, 1, 1), cfg.shared, stream.cast(), params) }
}

/// A view of a device array's memory (the device never dereferences it on the host).
pub(crate) fn device_view<'a>(
    ptr: CUdeviceptr,
    size: usize,
    shape: &'a [i64],
    strides: Option<&'a [i64]>,
    dtype: dlbridge_core::DType,
    device: dlbridge_core::Device,
) -> dlbridge_core::Result<dlbridge_core::TensorView<'a>> {
    // SAFETY: the device is not host accessible, so the view's bytes are never
    // read on the host; `ptr` is a live block of `size` bytes held by the array
    // the view borrows from, and the layout is checked to lie inside it below
    // before the view is returned.
    let view = unsafe {
        dlbridge_core::TensorView::from_raw_parts(
            ptr as usize as *const u8,
            0,
            shape,
            strides,
            dtype,
            device,
            dlbridge_core::Flags::empty(),
        )
    }?;
    let e = view.extent();
    if e.byte_lo < 0 || e.byte_hi as usize > size {
        return Err(dlbridge_core::Error::InvalidArgument(format!(
            "a view of shape {shape:?} and strides {strides:?} reaches bytes {}..{} of a {size}-byte device array",
            e.byte_lo, e.byte_hi
        )));
    }
    Ok(view)
}

/// A writable view of a device array's memory.
pub(crate) fn device_view_mut<'a>(
    ptr: CUdeviceptr,
    size: usize,
    shape: &'a [i64],
    dtype: dlbridge_core::DType,
    device: dlbridge_core::Device,
) -> dlbridge_core::Result<dlbridge_core::TensorViewMut<'a>> {
    let view = device_view(ptr, size, shape, None, dtype, device)?;
    // SAFETY: the caller holds the array mutably for 'a (`CudaArray::view_mut`
    // takes `&mut self`), so this is the only view of its memory, and a compact
    // layout does not overlap itself.
    unsafe { dlbridge_core::TensorViewMut::from_view(view) }
}

/// Whether cudarc can load libcublas by any of its names.
pub(crate) fn cublas_present() -> bool {
    // SAFETY: only tries to `dlopen` libcublas by name.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// A cuBLAS handle for the device whose context is current on this thread.
pub(crate) struct CublasHandle(cudarc::cublas::sys::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread, one call at a time: the
// owner (`CudaDevice`) keeps it behind a mutex.
unsafe impl Send for CublasHandle {}

impl std::fmt::Debug for CublasHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CublasHandle({:p})", self.0)
    }
}

impl CublasHandle {
    /// `cublasCreate` in the current context (libcublas loads: the caller checked).
    pub(crate) fn new() -> Result<CublasHandle, String> {
        cudarc::cublas::result::create_handle().map(CublasHandle).map_err(|e| format!("cublasCreate: {e:?}"))
    }

    /// `C = op(A) op(B)` (column-major), on `stream`, for f32 (`double == false`) or f64.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm(
        &mut self,
        double: bool,
        g: &crate::gemm::Gemm,
        ptrs: [CUdeviceptr; 2],
        c: CUdeviceptr,
        stream: *mut std::ffi::c_void,
    ) -> Result<(), String> {
        use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let op = |o: crate::gemm::Op| if o == crate::gemm::Op::N { CUBLAS_OP_N } else { CUBLAS_OP_T };
        let (a, b) = (ptrs[g.a.0], ptrs[g.b.0]);
        // SAFETY: the handle is live and used by one thread at a time (the caller
        // holds its mutex); `stream` is the caller's stream on this handle's
        // device (NULL: the legacy default stream). The device pointers are
        // validated views the registry lends for the call, whose layouts
        // `matmul::plan` turned into these dimensions and leading dimensions
        // (each operand's elements lie inside its view); alpha and beta are host
        // scalars alive for the call (cuBLAS's default pointer mode is host).
        unsafe {
            cudarc::cublas::result::set_stream(self.0, stream.cast()).map_err(|e| format!("cublasSetStream: {e:?}"))?;
            // One call, in f64 or f32: C = 1 * op(A) op(B) + 0 * C.
            macro_rules! gemm {
                ($f:path, $t:ty) => {{
                    let (alpha, beta): ($t, $t) = (1.0, 0.0);
                    let (a, b, c) = (a as usize as *const $t, b as usize as *const $t, c as usize as *mut $t);
                    $f(self.0, op(g.a.1), op(g.b.1), g.m, g.n, g.k, &alpha, a, g.a.2, b, g.b.2, &beta, c, g.ldc)
                }};
            }
            if double { gemm!(cudarc::cublas::result::dgemm, f64) } else { gemm!(cudarc::cublas::result::sgemm, f32) }
        }
        .map_err(|e| format!("cublas{}gemm: {e:?}", if double { "D" } else { "S" }))
    }
}

impl Drop for CublasHandle {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once, here.
        let _ = unsafe { cudarc::cublas::result::destroy_handle(self.0) };
    }
}

/// What NVRTC made of a program, or why not.
pub(crate) enum Compiled {
    /// The image: PTX text (without its NUL) or a CUBIN, and NVRTC's log (ptxas's
    /// report with `--ptxas-options=-v`).
    Image(Vec<u8>, String),
    /// `nvrtcCompileProgram` failed: its result and the program log.
    Failed(String, String),
    /// Anything else (creating the program, reading the image), with a message.
    Error(String),
}

/// Compiles `source` with NVRTC (libnvrtc is loaded: the caller checked) and
/// returns the PTX, or the CUBIN when `cubin` (which needs an `sm_XY` target).
pub(crate) fn nvrtc_compile(source: &std::ffi::CStr, name: &std::ffi::CStr, options: &[std::ffi::CString], cubin: bool) -> Compiled {
    use cudarc::nvrtc::sys;
    let prog = match cudarc::nvrtc::result::create_program(source, Some(name)) {
        Ok(p) => p,
        Err(e) => return Compiled::Error(format!("nvrtcCreateProgram: {e:?}")),
    };
    let opts: Vec<*const std::ffi::c_char> = options.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: `prog` was just created and is destroyed once, below; `source`,
    // `name` and the option strings outlive it (borrowed for this whole call);
    // every size/buffer pair passed to NVRTC is a Vec sized by NVRTC's own
    // *Size call before the matching read.
    unsafe {
        let rc = sys::nvrtcCompileProgram(prog, opts.len() as i32, opts.as_ptr());
        let mut size = 0usize;
        let mut log = Vec::new();
        if sys::nvrtcGetProgramLogSize(prog, &mut size) == sys::nvrtcResult::NVRTC_SUCCESS {
            log = vec![0u8; size];
            if sys::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast()) != sys::nvrtcResult::NVRTC_SUCCESS {
                log.clear();
            }
        }
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let log = String::from_utf8_lossy(&log[..end]).into_owned();
        let out = if rc != sys::nvrtcResult::NVRTC_SUCCESS {
            Compiled::Failed(format!("{rc:?}"), log)
        } else {
            let mut size = 0usize;
            let (size_rc, what) =
                if cubin { (sys::nvrtcGetCUBINSize(prog, &mut size), "CUBIN") } else { (sys::nvrtcGetPTXSize(prog, &mut size), "PTX") };
            if size_rc != sys::nvrtcResult::NVRTC_SUCCESS {
                Compiled::Error(format!("nvrtcGet{what}Size: {size_rc:?}"))
            } else {
                let mut image = vec![0u8; size];
                let rc = if cubin {
                    sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast())
                } else {
                    sys::nvrtcGetPTX(prog, image.as_mut_ptr().cast())
                };
                if rc != sys::nvrtcResult::NVRTC_SUCCESS {
                    Compiled::Error(format!("nvrtcGet{what}: {rc:?}"))
                } else {
                    if !cubin {
                        // PTX comes NUL-terminated.
                        while image.last() == Some(&0) {
                            image.pop();
                        }
                    }
                    Compiled::Image(image, log)
                }
            }
        };
        let _ = cudarc::nvrtc::result::destroy_program(prog);
        out
    }
}

//! `dlbridge.Array` in CUDA memory: streams, copies between devices, and
//! device memory for outputs.
//!
//! The one rule: **a CUDA `dlbridge.Array`'s pending work is ordered on the
//! legacy default stream** (handle 1; NULL is the same stream). Everything
//! that moves work on or off another stream keeps it so, with an event
//! (record on one stream, `cuStreamWaitEvent` on the other), never a
//! device-wide synchronisation:
//!
//! * import: `from_dlpack` of a torch CUDA tensor through torch's exchange API
//!   (whose calls do not synchronise) orders torch's current stream before the
//!   legacy stream; through `__dlpack__`, dlbridge passes no stream, which the
//!   standard defines as the legacy default stream, so the producer orders it;
//! * export: `__dlpack__(stream=s)` orders the legacy stream before `s`
//!   (`None` means the legacy stream itself, `-1` no ordering); the memory, if
//!   dlbridge's pool allocated it, is marked lent, so it goes back to the
//!   driver rather than the pool's cache when freed (the consumer may still
//!   have work queued on it on streams dlbridge cannot see);
//! * kernels: a call runs on the current stream of its first tensor's
//!   framework (NULL, the legacy stream, for a `dlbridge.Array`); when that is
//!   another stream and a CUDA `dlbridge.Array` takes part, the legacy stream
//!   is ordered before the call and the call before the legacy stream.
//!
//! Copies (`to_device`, `__dlpack__(dl_device=..., copy=...)`, `tolist`) are
//! synchronous between host and device and queued on the legacy stream on the
//! device; device copies keep the source's layout (its byte span is copied).

use dlbridge_array::Array;
use dlbridge_core::{Device, DeviceType, Error, ManagedTensor};
use dlbridge_cuda::stream::LEGACY;
use dlbridge_cuda::{CudaDevice, array as cuda_array};
use dlbridge_registry::OutputSpec;
use dlbridge_registry::binding::Allocator;
use dlpark::python::{CudaStreamRequest, ExportRequest};
use pyo3::prelude::*;

use crate::errors::IntoPy;

/// The device object of a `cuda:N` device.
pub fn device(d: Device) -> dlbridge_core::Result<std::sync::Arc<CudaDevice>> {
    if d.kind != DeviceType::CUDA {
        return Err(Error::UnsupportedDevice { got: d, what: "a CUDA device was expected".into() });
    }
    CudaDevice::get(usize::try_from(d.id).map_err(|_| Error::InvalidArgument(format!("cuda device id {}", d.id)))?)
}

/// Whether memory on `d` is CUDA device memory (not host-accessible).
pub fn is_cuda(d: Device) -> bool {
    d.kind == DeviceType::CUDA
}

/// The consumer's stream of a `__dlpack__` request on a CUDA array (`None`: no ordering).
pub fn consumer_stream(request: &ExportRequest<'_>) -> PyResult<Option<u64>> {
    Ok(match request.cuda_stream()? {
        CudaStreamRequest::Omitted | CudaStreamRequest::LegacyDefault => Some(LEGACY),
        CudaStreamRequest::PerThreadDefault => Some(dlbridge_cuda::stream::PER_THREAD),
        CudaStreamRequest::NoSync => None,
        CudaStreamRequest::Pointer(p) => Some(p as u64),
    })
}

/// Before a zero-copy export of a CUDA array: the consumer's stream waits for
/// the legacy stream, and pool memory is marked lent.
pub fn prepare_export(array: &Array, request: &ExportRequest<'_>) -> PyResult<()> {
    let consumer = consumer_stream(request)?;
    let dev = device(array.device()).py_err()?;
    dev.mark_lent(array.data_ptr() as usize as u64);
    if let Some(c) = consumer {
        dev.stream_wait(LEGACY, c).py_err()?;
    }
    Ok(())
}

/// After importing a CUDA tensor whose producer's work is queued on `stream`
/// (its current stream; NULL or 1 is the legacy stream): the legacy stream waits for it.
pub fn after_import(d: Device, stream: u64) -> PyResult<()> {
    if !is_cuda(d) || stream == 0 || stream == LEGACY {
        return Ok(());
    }
    device(d).py_err()?.stream_wait(stream, LEGACY).py_err()
}

/// A copy of `array` on `to`: host <-> CUDA (synchronous), or on its own CUDA
/// device (same layout, queued on the legacy stream); host -> host is a
/// contiguous copy. Anything else is a BufferError naming both devices.
pub fn copy_to(array: &Array, to: Device) -> PyResult<Array> {
    let from = array.device();
    let copied = match (is_cuda(from), is_cuda(to)) {
        (false, false) if from.is_host_accessible() && to == Device::CPU => array.contiguous(),
        (true, false) if to == Device::CPU => cuda_array::copy_to_host(&array.view()),
        (false, true) if from.is_host_accessible() => {
            // A strided host array arrives compact, in logical order.
            cuda_array::copy_from_host(to.id, array).and_then(Array::from_managed)
        }
        (true, true) if from == to => cuda_array::copy_on_device(&array.view()).and_then(Array::from_managed),
        _ => {
            return Err(pyo3::exceptions::PyBufferError::new_err(format!("dlbridge cannot copy an array on {from} to {to}")));
        }
    };
    copied.py_err()
}

/// A compact copy on the array's own device (the host's `contiguous`, or on CUDA).
pub fn contiguous(array: &Array) -> PyResult<Array> {
    if !is_cuda(array.device()) {
        return array.contiguous().py_err();
    }
    if array.is_contiguous() {
        return copy_to(array, array.device());
    }
    // No gather kernel for every dtype: through the host (correct, not fast).
    let host = cuda_array::copy_to_host(&array.view()).and_then(|h| h.contiguous()).py_err()?;
    copy_to(&host, array.device())
}

/// Outputs as `dlbridge.Array`s on the spec's device: zeroed host memory, or
/// uninitialised memory from the CUDA device's pool.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceArrays;

impl<E: From<Error>> Allocator<E> for DeviceArrays {
    type Tensor = Array;
    fn allocate(&mut self, spec: &OutputSpec) -> Result<Array, E> {
        if is_cuda(spec.device) {
            if spec.is_row_major() {
                return Ok(allocate_cuda(spec.device, spec.dtype, &spec.shape)?);
            }
            return Ok(allocate_cuda(spec.device, spec.dtype, &spec.memory_shape())?.permute(&spec.axes())?);
        }
        dlbridge_registry::binding::ArrayAllocator.allocate(spec)
    }
}

/// Uninitialised pool memory on a CUDA device, as an Array.
pub fn allocate_cuda(d: Device, dtype: dlbridge_core::DType, shape: &[i64]) -> dlbridge_core::Result<Array> {
    Array::from_managed(cuda_array::empty_pooled(d.id, dtype, shape)?)
}

/// The same, as a DLPack tensor (the exchange API's allocator).
pub fn allocate_cuda_managed(d: Device, dtype: dlbridge_core::DType, shape: &[i64]) -> dlbridge_core::Result<ManagedTensor> {
    cuda_array::empty_pooled(d.id, dtype, shape)
}

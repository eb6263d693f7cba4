//! Test support: hand-made "foreign" DLPack tensors with any field values, and
//! deleters that count their calls.
//!
//! Invariants: a [`ForeignTensor`] owns its DLPack struct, shape, strides and
//! data buffer itself; the deleter it installs only increments a counter (it
//! never frees), so a consumer that called it twice is *detected* (count 2)
//! instead of causing a double free. The memory is freed when the
//! `ForeignTensor` drops, which the tests do after their assertions; the
//! consumer must be done with the pointer by then.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};

use crate::Flags;

/// Counts deleter calls.
#[derive(Debug, Default, Clone)]
pub struct DropCounter(Arc<AtomicUsize>);

impl DropCounter {
    /// A counter at zero.
    pub fn new() -> DropCounter {
        DropCounter::default()
    }
    /// How many times the deleter ran.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
    fn as_ctx(&self) -> *mut c_void {
        Arc::as_ptr(&self.0).cast_mut().cast()
    }
}

/// Raw fields for a hand-made DLPack tensor. Every field can be set to any
/// value, including invalid ones; `data` defaults to a zeroed, 64-byte aligned
/// buffer of `buffer_bytes` bytes.
#[derive(Debug, Clone)]
pub struct Fields {
    /// DLPack version (versioned struct only).
    pub version: (u32, u32),
    /// Raw flags bits (versioned struct only).
    pub flags: u64,
    /// Raw dtype (code, bits, lanes).
    pub dtype: (u8, u8, u16),
    /// Raw device (type code, id).
    pub device: (u32, i32),
    /// `ndim` as given (need not match `shape.len()`).
    pub ndim: i32,
    /// Shape array (`None`: NULL pointer).
    pub shape: Option<Vec<i64>>,
    /// Strides array (`None`: NULL pointer).
    pub strides: Option<Vec<i64>>,
    /// byte_offset.
    pub byte_offset: u64,
    /// Size of the owned data buffer.
    pub buffer_bytes: usize,
    /// Use this address as `data` instead of the owned buffer (e.g. 0 for NULL).
    pub data_override: Option<usize>,
}

impl Fields {
    /// A valid, contiguous f32 CPU tensor of the given shape.
    pub fn f32(shape: &[i64]) -> Fields {
        let numel: i64 = shape.iter().product();
        Fields {
            version: (1, 3),
            flags: 0,
            dtype: (2, 32, 1),
            device: (1, 0),
            ndim: shape.len() as i32,
            shape: Some(shape.to_vec()),
            strides: None,
            byte_offset: 0,
            buffer_bytes: (numel.max(0) as usize) * 4,
            data_override: None,
        }
    }
}

/// A hand-made DLPack tensor, owning everything it points to.
#[derive(Debug)]
pub struct ForeignTensor {
    versioned: Box<DLManagedTensorVersioned>,
    legacy: Box<DLManagedTensor>,
    _shape: Option<Vec<i64>>,
    _strides: Option<Vec<i64>>,
    buffer: Vec<u64>,
    counter: DropCounter,
}

unsafe extern "C" fn count_versioned(p: *mut DLManagedTensorVersioned) {
    // SAFETY: `p` is a ForeignTensor's versioned struct, alive until the
    // ForeignTensor drops; manager_ctx points to its counter's AtomicUsize.
    unsafe { (*(*p).manager_ctx.cast::<AtomicUsize>()).fetch_add(1, Ordering::SeqCst) };
}

unsafe extern "C" fn count_legacy(p: *mut DLManagedTensor) {
    // SAFETY: as in count_versioned, for the legacy struct.
    unsafe { (*(*p).manager_ctx.cast::<AtomicUsize>()).fetch_add(1, Ordering::SeqCst) };
}

impl ForeignTensor {
    /// Builds the tensor from raw fields.
    pub fn new(fields: &Fields) -> ForeignTensor {
        let mut buffer = vec![0u64; fields.buffer_bytes.div_ceil(8).max(1)];
        let mut shape = fields.shape.clone();
        let mut strides = fields.strides.clone();
        let data = match fields.data_override {
            Some(addr) => addr as *mut c_void,
            None => buffer.as_mut_ptr().cast(),
        };
        let counter = DropCounter::new();
        let dl_tensor = DLTensor {
            data,
            device: DLDevice { device_type: DLDeviceType(fields.device.0), device_id: fields.device.1 },
            ndim: fields.ndim,
            dtype: DLDataType { code: DLDataTypeCode(fields.dtype.0), bits: fields.dtype.1, lanes: fields.dtype.2 },
            shape: shape.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            strides: strides.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset: fields.byte_offset,
        };
        let versioned = Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: fields.version.0, minor: fields.version.1 },
            manager_ctx: counter.as_ctx(),
            deleter: Some(count_versioned),
            flags: Flags::from_bits_retain(fields.flags),
            dl_tensor,
        });
        let legacy = Box::new(DLManagedTensor { dl_tensor, manager_ctx: counter.as_ctx(), deleter: Some(count_legacy) });
        ForeignTensor { versioned, legacy, _shape: shape, _strides: strides, buffer, counter }
    }

    /// The versioned struct. Hand it to a consumer at most once per test.
    pub fn versioned_ptr(&mut self) -> *mut DLManagedTensorVersioned {
        &mut *self.versioned
    }
    /// The legacy struct (same fields, no version or flags).
    pub fn legacy_ptr(&mut self) -> *mut DLManagedTensor {
        &mut *self.legacy
    }
    /// Removes the deleter (DLPack allows NULL).
    pub fn without_deleter(mut self) -> ForeignTensor {
        self.versioned.deleter = None;
        self.legacy.deleter = None;
        self
    }
    /// How often the deleter ran.
    pub fn deleter_calls(&self) -> usize {
        self.counter.count()
    }
    /// The owned data buffer's address.
    pub fn buffer_addr(&self) -> usize {
        self.buffer.as_ptr() as usize
    }
    /// The owned data buffer, to fill in values.
    pub fn buffer_mut(&mut self) -> &mut [u8] {
        let len = self.buffer.len() * 8;
        // SAFETY: a Vec<u64> viewed as bytes: same allocation, u8 has no alignment
        // needs, and every byte pattern is a valid u64 and u8.
        unsafe { std::slice::from_raw_parts_mut(self.buffer.as_mut_ptr().cast::<u8>(), len) }
    }
}

/// A global allocator that counts allocations made on the current thread, for
/// tests that prove a path does not allocate. Install it in a test binary:
///
/// ```text
/// #[global_allocator]
/// static ALLOC: dlbridge_core::testing::CountingAllocator = dlbridge_core::testing::CountingAllocator;
/// ```
#[derive(Debug)]
pub struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl CountingAllocator {
    /// Allocations made so far on this thread.
    pub fn count() -> usize {
        ALLOCATIONS.with(|c| c.get())
    }
}

// SAFETY: forwards every request to the system allocator unchanged; only counts.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

/// `n` deterministic values in [-4, 4) from `seed` (xorshift64): inputs that
/// make every kernel do real work (gelu, softmax), the same on every run.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        })
        .collect()
}

//! The memory behind an [`Array`](crate::Array): a 64-byte aligned heap
//! buffer, or a foreign DLPack tensor kept alive by its `ManagedTensor`.
//!
//! Invariants: an `AlignedBuf` owns `layout.size()` bytes at `ptr`, allocated
//! zeroed with `layout` (size >= 1, align 64) and freed once, in `Drop`. An
//! allocation the system refuses is an [`Error::OutOfMemory`], never an abort
//! (`handle_alloc_error` is not called). A
//! `Storage` never moves or resizes its bytes while it lives, so pointers into
//! it stay valid for as long as an `Arc<Storage>` is held.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

use dlbridge_core::{Error, ManagedTensor, Result};

/// Alignment of every buffer an Array allocates.
pub const ALIGN: usize = 64;

/// An owned, zero-initialised, 64-byte aligned byte buffer.
#[derive(Debug)]
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: AlignedBuf uniquely owns plain bytes; nothing is thread-bound.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out the base pointer; no interior mutation here.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `bytes` zeroed bytes (at least one is allocated), or
    /// [`Error::OutOfMemory`] when the system refuses; `what` names the use in
    /// that error.
    pub(crate) fn zeroed(bytes: usize, what: impl FnOnce() -> String) -> Result<AlignedBuf> {
        let layout =
            Layout::from_size_align(bytes.max(1), ALIGN).map_err(|_| Error::Overflow { what: format!("allocation of {bytes} bytes") })?;
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(Error::OutOfMemory { bytes: layout.size() as u128, what: what() });
        };
        Ok(AlignedBuf { ptr, layout })
    }

    /// The first `len` bytes (at most the allocated size), to fill before the
    /// buffer is shared.
    pub(crate) fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        let len = len.min(self.layout.size());
        // SAFETY: `ptr` owns `layout.size()` initialised (zeroed) bytes and `len`
        // does not exceed it; `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), len) }
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout, freed only here.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// What keeps an Array's bytes alive.
#[derive(Debug)]
pub(crate) enum Storage {
    /// Memory this crate allocated (never read: Array keeps its own data pointer).
    Owned(#[allow(dead_code)] AlignedBuf),
    /// A foreign tensor imported with zero copies; its deleter runs when the last Array using it drops.
    /// Never read: held so the producer's deleter runs only when the last Array drops.
    Foreign(#[allow(dead_code)] ManagedTensor),
}

//! A caching pool for device memory, as CuPy's `MemoryPool` and torch's
//! caching allocator do it: a block given back is kept, and the next request
//! of the same rounded size on the same stream gets it again without a call
//! to `cuMemAlloc` (which synchronises the device and costs microseconds).
//!
//! Rules:
//! * sizes are rounded up to a multiple of [`ROUND`] bytes (a zero-byte
//!   request gets [`ROUND`] bytes, so every live block has its own address);
//! * a freed block is reused only on the stream it was last used on: work
//!   queued there before the free still runs before the new owner's work, so
//!   no event or synchronisation is needed (another stream's request allocates);
//! * when the driver reports out of memory, every cached block is released
//!   and the request is tried once more; if it still fails the error says how
//!   much was asked for, in use and cached — never an abort;
//! * blocks are released to the driver by [`Pool::empty_cache`] and when the
//!   pool is dropped (live blocks keep the pool alive);
//! * a block handed to another framework (a DLPack export) is not cached when
//!   that framework releases it: its work may be queued on streams dlbridge does
//!   not know, so it goes back to the driver (`cuMemFree` waits for the device)
//!   ([`Block::uncached`], or [`Pool::mark_lent`] for a block whose owner
//!   stays in dlbridge while a consumer borrows it, as `dlbridge.Array`'s
//!   `__dlpack__` does).
//!
//! The bookkeeping is generic over [`RawAlloc`], so it is tested here without a
//! device, with an allocator that counts its calls.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

/// Sizes are multiples of this many bytes.
pub const ROUND: usize = 512;

/// What a raw allocation failure was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocFailure {
    /// The device is out of memory (the pool may release its cache and retry).
    OutOfMemory,
    /// Anything else, with the driver's message.
    Other(String),
}

/// The allocator under the pool (the driver's `cuMemAlloc` / `cuMemFree`).
pub trait RawAlloc: Send {
    /// A fresh allocation of exactly `bytes` bytes (a device address).
    fn alloc(&mut self, bytes: usize) -> Result<u64, AllocFailure>;
    /// Gives back an allocation from [`RawAlloc::alloc`] (exactly once).
    fn free(&mut self, ptr: u64);
}

/// Counts of what the pool did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Calls to the raw allocator that succeeded.
    pub raw_allocs: u64,
    /// Calls to the raw free.
    pub raw_frees: u64,
    /// Requests served from the cache.
    pub hits: u64,
    /// Bytes in blocks handed out and not given back.
    pub bytes_in_use: usize,
    /// Bytes in cached blocks.
    pub bytes_cached: usize,
}

#[derive(Debug)]
struct Books<A> {
    raw: A,
    /// Cached blocks by (stream, rounded size).
    free: HashMap<(u64, usize), Vec<u64>>,
    /// Blocks handed out: address -> rounded size.
    live: BTreeMap<u64, usize>,
    /// Live blocks lent to another framework: freed to the driver, not cached.
    lent: HashSet<u64>,
    stats: PoolStats,
}

impl<A: RawAlloc> Books<A> {
    fn release_cache(&mut self) {
        for ((_, size), ptrs) in self.free.drain() {
            for p in ptrs {
                self.raw.free(p);
                self.stats.raw_frees += 1;
                self.stats.bytes_cached -= size;
            }
        }
    }
}

/// A caching pool over one raw allocator (one device).
#[derive(Debug)]
pub struct Pool<A: RawAlloc> {
    books: Mutex<Books<A>>,
}

/// A block of the pool: given back to the pool's cache when dropped.
#[derive(Debug)]
pub struct Block<A: RawAlloc> {
    pool: Arc<Pool<A>>,
    ptr: u64,
    size: usize,
    stream: u64,
    cached: bool,
}

/// `bytes` rounded up to the pool's granularity (`None` on overflow).
pub fn rounded(bytes: usize) -> Option<usize> {
    bytes.max(1).checked_next_multiple_of(ROUND)
}

impl<A: RawAlloc> Pool<A> {
    /// A pool over `raw`.
    pub fn new(raw: A) -> Arc<Pool<A>> {
        Arc::new(Pool {
            books: Mutex::new(Books {
                raw,
                free: HashMap::new(),
                live: BTreeMap::new(),
                lent: HashSet::new(),
                stats: PoolStats::default(),
            }),
        })
    }

    fn books(&self) -> MutexGuard<'_, Books<A>> {
        // The books stay consistent across a panic in a raw call (each update is
        // made after the call returns), so a poisoned lock is still usable.
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A block of at least `bytes` bytes for work on `stream`.
    pub fn malloc(self: &Arc<Self>, bytes: usize, stream: u64) -> dlbridge_core::Result<Block<A>> {
        let size =
            rounded(bytes).ok_or_else(|| dlbridge_core::Error::Overflow { what: format!("a device allocation of {bytes} bytes") })?;
        let mut b = self.books();
        if let Some(ptr) = b.free.get_mut(&(stream, size)).and_then(Vec::pop) {
            b.stats.hits += 1;
            b.stats.bytes_cached -= size;
            b.stats.bytes_in_use += size;
            b.live.insert(ptr, size);
            return Ok(Block { pool: self.clone(), ptr, size, stream, cached: true });
        }
        let first = b.raw.alloc(size);
        let got = match first {
            Err(AllocFailure::OutOfMemory) if b.stats.bytes_cached > 0 => {
                b.release_cache();
                b.raw.alloc(size)
            }
            other => other,
        };
        match got {
            Ok(ptr) => {
                b.stats.raw_allocs += 1;
                b.stats.bytes_in_use += size;
                b.live.insert(ptr, size);
                Ok(Block { pool: self.clone(), ptr, size, stream, cached: true })
            }
            Err(AllocFailure::OutOfMemory) => Err(dlbridge_core::Error::OutOfMemory {
                bytes: size as u128,
                what: format!("a CUDA device buffer ({} bytes in use by dlbridge's pool, its cache released)", b.stats.bytes_in_use),
            }),
            Err(AllocFailure::Other(msg)) => Err(dlbridge_core::Error::Runtime(format!("cuMemAlloc of {size} bytes failed: {msg}"))),
        }
    }

    /// Releases every cached block to the raw allocator.
    pub fn empty_cache(&self) {
        self.books().release_cache();
    }

    /// Counts so far.
    pub fn stats(&self) -> PoolStats {
        self.books().stats
    }

    /// Marks the live block holding `addr` as lent to another framework: when
    /// it is freed it goes back to the driver, not the cache. False when no live
    /// block of this pool holds `addr` (memory dlbridge did not allocate).
    pub fn mark_lent(&self, addr: u64) -> bool {
        let mut b = self.books();
        let Some((&ptr, &size)) = b.live.range(..=addr).next_back() else { return false };
        if addr >= ptr + size as u64 {
            return false;
        }
        b.lent.insert(ptr);
        true
    }

    fn release(&self, ptr: u64, size: usize) {
        let mut b = self.books();
        b.live.remove(&ptr);
        b.lent.remove(&ptr);
        b.raw.free(ptr);
        b.stats.raw_frees += 1;
        b.stats.bytes_in_use -= size;
    }

    fn give_back(&self, ptr: u64, size: usize, stream: u64) {
        let mut b = self.books();
        b.live.remove(&ptr);
        if b.lent.remove(&ptr) {
            b.raw.free(ptr);
            b.stats.raw_frees += 1;
            b.stats.bytes_in_use -= size;
            return;
        }
        b.stats.bytes_in_use -= size;
        b.stats.bytes_cached += size;
        b.free.entry((stream, size)).or_default().push(ptr);
    }
}

impl<A: RawAlloc> Drop for Pool<A> {
    fn drop(&mut self) {
        self.books().release_cache();
    }
}

impl<A: RawAlloc> Block<A> {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// The usable size in bytes (the rounded size).
    pub fn size(&self) -> usize {
        self.size
    }
    /// The stream the block is ordered on.
    pub fn stream(&self) -> u64 {
        self.stream
    }
    /// Marks the block to go back to the driver, not the cache, when dropped
    /// (memory lent to another framework, whose streams dlbridge cannot order).
    pub fn uncached(mut self) -> Block<A> {
        self.cached = false;
        self
    }
    /// Moves the block to another stream's ordering. The caller must have
    /// ordered the old stream's pending work on it before `stream`'s (an event).
    pub fn set_stream(&mut self, stream: u64) {
        self.stream = stream;
    }
}

impl<A: RawAlloc> Drop for Block<A> {
    fn drop(&mut self) {
        if self.cached {
            self.pool.give_back(self.ptr, self.size, self.stream);
        } else {
            self.pool.release(self.ptr, self.size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Hands out fake addresses, counts calls, can run out of memory.
    #[derive(Debug, Default)]
    struct Fake {
        next: u64,
        live: HashSet<u64>,
        capacity: Option<usize>,
        used: usize,
        sizes: HashMap<u64, usize>,
    }

    impl RawAlloc for Fake {
        fn alloc(&mut self, bytes: usize) -> Result<u64, AllocFailure> {
            if self.capacity.is_some_and(|c| self.used + bytes > c) {
                return Err(AllocFailure::OutOfMemory);
            }
            self.next += 1 << 20;
            self.live.insert(self.next);
            self.sizes.insert(self.next, bytes);
            self.used += bytes;
            Ok(self.next)
        }
        fn free(&mut self, ptr: u64) {
            assert!(self.live.remove(&ptr), "double free of {ptr:#x}");
            self.used -= self.sizes.remove(&ptr).unwrap();
        }
    }

    #[test]
    fn sizes_round_up_to_512_bytes_and_zero_gets_a_block() {
        assert_eq!(rounded(0), Some(512));
        assert_eq!(rounded(1), Some(512));
        assert_eq!(rounded(512), Some(512));
        assert_eq!(rounded(513), Some(1024));
        assert_eq!(rounded(usize::MAX), None);
        let pool = Pool::new(Fake::default());
        assert!(matches!(pool.malloc(usize::MAX - 3, 0), Err(dlbridge_core::Error::Overflow { .. })));
    }

    #[test]
    fn repeated_calls_of_the_same_shapes_hit_the_driver_once() {
        let pool = Pool::new(Fake::default());
        for _ in 0..100 {
            let a = pool.malloc(4096 * 4, 7).unwrap();
            let b = pool.malloc(4096 * 4, 7).unwrap();
            let c = pool.malloc(100, 7).unwrap();
            assert_ne!(a.ptr(), b.ptr());
            drop((a, b, c));
        }
        let s = pool.stats();
        assert_eq!(s.raw_allocs, 3, "{s:?}");
        assert_eq!(s.hits, 297);
        assert_eq!(s.bytes_in_use, 0);
        assert_eq!(s.bytes_cached, 2 * 16384 + 512);
    }

    #[test]
    fn a_block_is_reused_only_on_its_own_stream() {
        let pool = Pool::new(Fake::default());
        let a = pool.malloc(1000, 1).unwrap();
        let pa = a.ptr();
        drop(a);
        let b = pool.malloc(1000, 2).unwrap();
        assert_ne!(b.ptr(), pa, "another stream's cached block was handed out");
        let c = pool.malloc(1000, 1).unwrap();
        assert_eq!(c.ptr(), pa);
        assert_eq!(pool.stats().raw_allocs, 2);
    }

    #[test]
    fn out_of_memory_releases_the_cache_and_retries_once() {
        let pool = Pool::new(Fake { capacity: Some(4096), ..Fake::default() });
        drop(pool.malloc(2048, 0).unwrap());
        drop(pool.malloc(1024, 0).unwrap());
        assert_eq!(pool.stats().bytes_cached, 3072);
        // 2048 more does not fit beside the cache: the cache goes, the request succeeds.
        let big = pool.malloc(3072, 0).unwrap();
        let s = pool.stats();
        assert_eq!((s.bytes_cached, s.raw_frees, s.bytes_in_use), (0, 2, 3072));
        // Still too much: a clear error, the live block untouched.
        let e = pool.malloc(2048, 0).unwrap_err();
        assert!(matches!(e, dlbridge_core::Error::OutOfMemory { bytes: 2048, .. }), "{e}");
        assert!(e.to_string().contains("3072 bytes in use"), "{e}");
        drop(big);
    }

    #[test]
    fn a_block_lent_to_another_framework_goes_back_to_the_driver() {
        let pool = Pool::new(Fake::default());
        let lent = pool.malloc(1000, 1).unwrap().uncached();
        let p = lent.ptr();
        drop(lent);
        let s = pool.stats();
        assert_eq!((s.raw_frees, s.bytes_cached, s.bytes_in_use), (1, 0, 0));
        assert_ne!(pool.malloc(1000, 1).unwrap().ptr(), p, "a lent block was reused from the cache");
    }

    #[test]
    fn a_block_marked_lent_by_any_address_inside_it_is_not_cached() {
        let pool = Pool::new(Fake::default());
        let kept = pool.malloc(2000, 1).unwrap();
        let lent = pool.malloc(2000, 1).unwrap();
        let p = lent.ptr();
        assert!(pool.mark_lent(p + 1500), "an address inside the block (a view's element 0)");
        assert!(!pool.mark_lent(p + 2048), "one past the block");
        assert!(!pool.mark_lent(1 << 60), "memory the pool never gave out");
        drop(lent);
        drop(kept);
        let s = pool.stats();
        assert_eq!((s.raw_frees, s.bytes_cached, s.bytes_in_use), (1, 2048, 0));
        let again = pool.malloc(2000, 1).unwrap();
        assert_ne!(again.ptr(), p, "the lent block came back from the cache");
        assert_eq!(pool.stats().hits, 1);
        assert!(pool.books().lent.is_empty() && pool.books().live.len() == 1);
    }

    #[test]
    fn every_block_is_freed_exactly_once_when_the_pool_goes() {
        let pool = Pool::new(Fake::default());
        let keep = pool.malloc(10, 0).unwrap();
        drop(pool.malloc(10, 0).unwrap());
        drop(pool.malloc(600, 3).unwrap());
        pool.empty_cache();
        assert_eq!(pool.stats().raw_frees, 2);
        drop(pool); // the live block keeps the pool
        assert_eq!(keep.size(), 512);
        let p = keep.pool.clone();
        drop(keep);
        assert_eq!(p.stats().bytes_cached, 512);
        let books = p.books();
        assert_eq!(books.raw.live.len(), 1);
        drop(books);
        drop(p); // the Fake asserts no double free; the last block is released here
    }
}

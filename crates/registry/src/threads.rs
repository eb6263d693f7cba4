//! How many threads a kernel may use.
//!
//! One number, read by the kernels' parallel loops through [`num_threads`]:
//!
//! * the process-wide setting: [`set_num_threads`], else the environment
//!   variable `DLBRIDGE_NUM_THREADS` (read once), else the cores available
//!   to the process (`std::thread::available_parallelism`);
//! * narrowed for the duration of one call by the adapter that makes it
//!   ([`with_num_threads`], or [`with_num_threads_from`] for a count asked
//!   only when a kernel is large enough to split): dlbridge-tch runs kernels
//!   with torch's intra-op thread count, so a registry kernel called between
//!   torch operations uses no more cores than torch itself would.
//!
//! One thread means the kernel runs on the calling thread and starts no other.
//! Built-in CPU kernels parallelise only above a size threshold (a small
//! tensor is never split), on a pool of dlbridge's own, never rayon's global
//! pool; idle workers sleep (see `kernels/cpu`'s `threads` module).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The process-wide thread count; 0 until first read or set.
static GLOBAL: AtomicUsize = AtomicUsize::new(0);

/// The narrower count of the call running on a thread.
#[derive(Debug, Clone, Copy)]
enum Scoped {
    None,
    Count(usize),
    From(fn() -> usize),
}

thread_local! {
    static SCOPED: Cell<Scoped> = const { Cell::new(Scoped::None) };
}

/// `DLBRIDGE_NUM_THREADS` if it is a positive integer, else the available cores.
fn from_env() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::env::var("DLBRIDGE_NUM_THREADS").ok().and_then(|v| v.trim().parse::<usize>().ok()).filter(|&n| n > 0).unwrap_or(cores)
}

/// The process-wide thread count (see the module docs).
pub fn global_num_threads() -> usize {
    match GLOBAL.load(Ordering::Relaxed) {
        0 => {
            let n = from_env();
            // A concurrent set_num_threads wins: only 0 is replaced.
            match GLOBAL.compare_exchange(0, n, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => n,
                Err(set) => set,
            }
        }
        n => n,
    }
}

/// Sets the process-wide thread count (0 is taken as 1).
pub fn set_num_threads(n: usize) {
    GLOBAL.store(n.max(1), Ordering::Relaxed);
}

/// The threads a kernel running on this thread may use: the process-wide
/// count, or the narrower one of the call in progress ([`with_num_threads`]).
/// Always at least 1.
pub fn num_threads() -> usize {
    let global = global_num_threads();
    match SCOPED.with(Cell::get) {
        Scoped::None => global,
        Scoped::Count(n) => n.clamp(1, global),
        Scoped::From(source) => source().clamp(1, global),
    }
}

fn scoped<R>(limit: Scoped, f: impl FnOnce() -> R) -> R {
    struct Restore(Scoped);
    impl Drop for Restore {
        fn drop(&mut self) {
            SCOPED.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SCOPED.with(|s| s.replace(limit)));
    f()
}

/// Runs `f` with kernels on this thread limited to `n` threads (0 is taken as
/// 1; never more than the process-wide count). Nests; the previous limit comes
/// back when `f` returns or panics.
pub fn with_num_threads<R>(n: usize, f: impl FnOnce() -> R) -> R {
    scoped(Scoped::Count(n), f)
}

/// [`with_num_threads`] with the count `source` gives, asked each time a
/// kernel consults [`num_threads`] (only kernels large enough to split do):
/// a small call pays nothing for it.
#[inline]
pub fn with_num_threads_from<R>(source: fn() -> usize, f: impl FnOnce() -> R) -> R {
    scoped(Scoped::From(source), f)
}

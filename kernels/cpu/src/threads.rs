//! Where the kernels' parallel loops run.
//!
//! On a rayon pool of dlbridge's own — never rayon's global pool, which the
//! host program or another library may size, fill or block — with as many
//! threads as [`dlbridge_registry::threads::num_threads`] allows for the call
//! in progress (`DLBRIDGE_NUM_THREADS`, narrowed per call by the adapter:
//! dlbridge-tch passes torch's intra-op thread count). A budget of one thread
//! runs the loop on the caller's thread and starts no pool at all.
//!
//! One pool per budget, built on first use and kept (a budget is a small
//! number: the cores, or what torch was told); the caller waits while the
//! pool works, so a loop uses exactly its budget of cores. Idle workers spin
//! only briefly before they sleep (rayon's idle loop), so nothing keeps a core
//! busy between calls.

use std::sync::OnceLock;

use rayon::prelude::*;

/// Budgets above this share the largest pool.
const MAX_POOLS: usize = 64;

static POOLS: [OnceLock<Option<rayon::ThreadPool>>; MAX_POOLS] = [const { OnceLock::new() }; MAX_POOLS];

/// The threads the current call may use (at least 1).
#[inline]
pub fn budget() -> usize {
    dlbridge_registry::threads::num_threads().clamp(1, MAX_POOLS)
}

/// The pool for `n` threads (n >= 2), built on first use; None if the
/// system refused to start its threads (the loop then runs on the caller).
fn pool(n: usize) -> Option<&'static rayon::ThreadPool> {
    POOLS[n - 1]
        .get_or_init(|| rayon::ThreadPoolBuilder::new().num_threads(n).thread_name(move |i| format!("dlbridge-{n}.{i}")).build().ok())
        .as_ref()
}

/// The pool for the current call's budget of threads; None for a budget of
/// one (the caller then runs its loop sequentially, on its own thread).
#[inline]
pub fn pool_for_call() -> Option<&'static rayon::ThreadPool> {
    match budget() {
        1 => None,
        n => pool(n),
    }
}

/// `f(0) .. f(parts - 1)`, split across the current call's budget of threads.
pub fn for_each_part(parts: usize, f: impl Fn(usize) + Sync + Send) {
    match pool_for_call() {
        Some(p) if parts > 1 => p.install(|| (0..parts).into_par_iter().for_each(f)),
        _ => (0..parts).for_each(f),
    }
}

/// `map` over `x` in chunks of `chunk` elements, the results combined with
/// `op` (from `identity`), across the current call's budget of threads.
pub fn map_reduce_chunks<T: Sync, A: Send>(
    x: &[T],
    chunk: usize,
    map: impl Fn(&[T]) -> A + Sync + Send,
    identity: impl Fn() -> A + Sync + Send,
    op: impl Fn(A, A) -> A + Sync + Send,
) -> A {
    match pool_for_call() {
        Some(p) if x.len() > chunk => p.install(|| x.par_chunks(chunk).map(map).reduce(identity, op)),
        _ => x.chunks(chunk.max(1)).map(map).fold(identity(), op),
    }
}

//! Where the kernels' parallel loops run.
//!
//! On a rayon pool of dlbridge's own — never rayon's global pool, which the
//! host program or another library may size, fill or block — with as many
//! threads as [`dlbridge_registry::threads::num_threads`] allows for the call
//! in progress (`DLBRIDGE_NUM_THREADS`, narrowed per call by the adapter:
//! dlbridge-tch passes torch's intra-op thread count). A budget of one thread
//! runs the loop on the caller's thread and starts no pool at all.
//!
//! Elementwise maps and row loops ([`for_each_part`]) run statically on a
//! team of `n - 1` helper threads (`dlbridge-N.i`) plus the caller, as OpenMP
//! runs torch's loops; `gemm` and chunked reductions run on a rayon pool of
//! `n` threads (`dlbridge-rayon-N.i`) while the caller waits. One team and one
//! pool per budget, built on first use and kept (a budget is a small number:
//! the cores, or what torch was told), so a loop uses exactly its budget of
//! cores. Idle helpers spin for `team::SPIN` (30 us) and rayon's workers
//! briefly before they sleep, so nothing keeps a core busy between calls. A
//! loop inside a part of another runs serially on that part's thread (the
//! budget is spent on the outer loop, as OpenMP does with nested regions).

use std::sync::OnceLock;

use dlbridge_registry::threads::with_num_threads;
use rayon::prelude::*;

use crate::team::Team;

/// Budgets above this share the largest pool.
const MAX_POOLS: usize = 64;

static POOLS: [OnceLock<Option<(rayon::ThreadPool, u32)>>; MAX_POOLS] = [const { OnceLock::new() }; MAX_POOLS];

/// The threads the current call may use (at least 1).
#[inline]
pub fn budget() -> usize {
    dlbridge_registry::threads::num_threads().clamp(1, MAX_POOLS)
}

/// The pool for `n` threads (n >= 2), built on first use; None if the
/// system refused to start its threads, or in a child forked after the pool
/// started (whose threads the child does not have): the loop then runs on the caller.
fn pool(n: usize) -> Option<&'static rayon::ThreadPool> {
    POOLS[n - 1]
        .get_or_init(|| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(n).thread_name(move |i| format!("dlbridge-rayon-{n}.{i}")).build().ok();
            pool.map(|p| (p, std::process::id()))
        })
        .as_ref()
        .filter(|(_, pid)| *pid == std::process::id())
        .map(|(p, _)| p)
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
///
/// Statically, as OpenMP's static schedule (torch's `at::parallel_for`): the
/// caller runs the first contiguous share of the parts and helper thread `i`
/// of the budget's team the `i`-th, on every call, so each core finds in its
/// own caches the share of a tensor it touched in the last call; the helpers
/// spin for a moment between loops (then sleep), so back-to-back kernels do
/// not wait for a thread to wake (see `team`). When the team is busy (another
/// thread is running a loop on it), the parts go to the budget's rayon pool;
/// in a child forked after the threads started, they run on the caller.
///
/// A loop inside a part (a nested loop) runs on the thread of that part, as
/// nested regions do under OpenMP and `at::parallel_for`: the call's budget is
/// spent on the outer loop, never multiplied.
pub fn for_each_part(parts: usize, f: impl Fn(usize) + Sync + Send) {
    let n = budget();
    if n == 1 || parts < 2 {
        return (0..parts).for_each(f);
    }
    let f = |p: usize| with_num_threads(1, || f(p));
    let share = |i: usize| (parts * i / n..parts * (i + 1) / n).for_each(&f);
    if let Some(t) = team(n)
        && t.run(&share).is_ok()
    {
        return;
    }
    match pool(n) {
        Some(p) => p.install(|| (0..parts).into_par_iter().for_each(f)),
        None => (0..parts).for_each(f),
    }
}

static TEAMS: [OnceLock<Option<Team>>; MAX_POOLS] = [const { OnceLock::new() }; MAX_POOLS];

/// The team for a budget of `n` threads (n >= 2): `n - 1` helpers, built on first use.
fn team(n: usize) -> Option<&'static Team> {
    TEAMS[n - 1].get_or_init(|| Team::new(n - 1)).as_ref()
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
        Some(p) if x.len() > chunk => p.install(|| x.par_chunks(chunk).map(|c| with_num_threads(1, || map(c))).reduce(identity, op)),
        _ => x.chunks(chunk.max(1)).map(map).fold(identity(), op),
    }
}

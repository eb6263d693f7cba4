//! When Python code may have run: views borrowed from Python objects are valid
//! only until then.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts the moments at which Python code may have run (ours or, through a
/// released GIL, another thread's): see [`Lent`](crate::import::Lent). Every adapter step that
/// calls into Python or allocates Python objects calls [`python_may_run`]
/// first.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// Records that Python code may run from now on: every borrowed DLTensor
/// taken before is stale.
#[inline]
pub(crate) fn python_may_run() {
    EPOCH.fetch_add(1, Ordering::Relaxed);
}

#[inline]
pub(crate) fn epoch() -> u64 {
    EPOCH.load(Ordering::Relaxed)
}

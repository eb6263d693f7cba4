//! A team of helper threads for static parallel loops, as OpenMP runs them
//! (torch's `at::parallel_for`): for a budget of `n` threads, `n - 1` helpers
//! kept for the process, the caller itself taking share 0; helper `i` always
//! takes share `i`, so a memory-bound loop finds in each core's caches the
//! share of a tensor that core touched in the last call; a helper spins for
//! [`SPIN`] after a loop before it sleeps, so back-to-back loops start without
//! waking a thread, and an idle process uses no CPU.
//!
//! Invariants (the module's unsafe code rests on them):
//! * A job is posted by one caller at a time ([`Team::busy`]), and the caller
//!   does not return (not even by unwinding: [`Wait`]'s drop) before every
//!   helper has counted itself out of that job in [`State::remaining`].
//! * A helper reads the job only after it saw the job's generation, and
//!   counts itself out after its last use of the job. So the job's borrowed
//!   closure, whose lifetime [`Team::run`] erases, outlives every use of it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::time::{Duration, Instant};

/// How long an idle helper spins for the next loop before it sleeps.
pub(crate) const SPIN: Duration = Duration::from_micros(30);

/// A share of a loop: `job(i)` runs share `i`.
type Job = &'static (dyn Fn(usize) + Sync);

struct State {
    /// Bumped when a job is posted.
    generation: AtomicU64,
    /// The posted job (lifetime erased: see the module's invariants).
    job: Mutex<Option<Job>>,
    /// Helpers that have not yet finished the posted job.
    remaining: AtomicUsize,
    /// A helper's share panicked (the caller panics in turn).
    panicked: AtomicBool,
    /// Helpers asleep (or about to be), and what wakes them.
    sleeping: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
}

/// `helpers` threads that run shares `1..=helpers` of a loop whose share 0
/// the caller runs.
pub(crate) struct Team {
    state: Arc<State>,
    helpers: usize,
    busy: Mutex<()>,
    /// The process that started the helpers: a forked child has none of them.
    pid: u32,
}

impl Team {
    /// Starts `helpers` threads named `dlbridge-{n}.{i}` (`n = helpers + 1`,
    /// `i` from 1); None if the system refused one (those started then sleep
    /// for good: nothing posts to them).
    pub(crate) fn new(helpers: usize) -> Option<Team> {
        let state = Arc::new(State {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            remaining: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        });
        for i in 1..=helpers {
            let s = state.clone();
            std::thread::Builder::new().name(format!("dlbridge-{}.{i}", helpers + 1)).spawn(move || helper(&s, i)).ok()?;
        }
        Some(Team { state, helpers, busy: Mutex::new(()), pid: std::process::id() })
    }

    /// Runs `share(0)` on this thread and `share(1..=helpers)` on the helpers,
    /// and returns when all are done. Err(()) (nothing run) if another thread
    /// is running a loop on this team. A panicking share panics here, after
    /// every share has finished.
    pub(crate) fn run(&self, share: &(dyn Fn(usize) + Sync)) -> Result<(), ()> {
        // After fork() the child has this Team but not its threads: nothing would run the shares.
        if self.pid != std::process::id() {
            return Err(());
        }
        let _busy = match self.busy.try_lock() {
            Ok(g) => g,
            Err(TryLockError::WouldBlock) => return Err(()),
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
        };
        let s = &*self.state;
        // SAFETY: only the lifetime is erased. The reference is used by the
        // helpers of this one job (the caller holds `busy`), each of which
        // counts itself out of `remaining` after its last use, and `Wait`
        // keeps this call from returning or unwinding before the count is 0;
        // the job is cleared before `busy` is released.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(share) };
        // From here on, leaving this function (even by unwinding) waits for the helpers.
        let wait = Wait(s);
        // A loop whose own share 0 panicked unwound past the check below: start clean.
        s.panicked.store(false, Ordering::SeqCst);
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        s.remaining.store(self.helpers, Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        share(0);
        drop(wait);
        if s.panicked.swap(false, Ordering::SeqCst) {
            panic!("a share of a parallel loop panicked on a dlbridge helper thread");
        }
        Ok(())
    }
}

/// Waits, on drop, until every helper has finished the posted job, then clears it.
struct Wait<'s>(&'s State);

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let s = self.0;
        let mut spins = 0u32;
        while s.remaining.load(Ordering::Acquire) != 0 {
            // A helper that lost its core: give it ours rather than spin against it.
            if spins < 1 << 14 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

fn helper(s: &State, i: usize) {
    let mut seen = 0u64;
    loop {
        // Spin for the next job, then sleep until one is posted.
        let start = Instant::now();
        let mut spins = 0u32;
        while s.generation.load(Ordering::Acquire) == seen {
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) || start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let mut g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.sleeping.fetch_add(1, Ordering::SeqCst);
            while s.generation.load(Ordering::SeqCst) == seen {
                g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.sleeping.fetch_sub(1, Ordering::SeqCst);
        }
        seen = s.generation.load(Ordering::Acquire);
        // Counts this helper out when dropped, whatever happens below (even a
        // panic payload whose own drop panics, which ends this thread).
        let _out = CountOut(s);
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = job
            && catch_unwind(AssertUnwindSafe(|| job(i))).is_err()
        {
            s.panicked.store(true, Ordering::SeqCst);
        }
    }
}

/// The last use of the job by a helper: from its drop on, the caller may return.
struct CountOut<'s>(&'s State);

impl Drop for CountOut<'_> {
    fn drop(&mut self) {
        self.0.remaining.fetch_sub(1, Ordering::Release);
    }
}

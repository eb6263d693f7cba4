//! A team of helper threads for static parallel loops, as OpenMP runs them
//! (torch's `at::parallel_for`): for a budget of `n` threads, `n - 1` helpers
//! kept for the process, the caller itself taking share 0; helper `i` always
//! takes share `i`, so a memory-bound loop finds in each core's caches the
//! share of a tensor that core touched in the last call; a helper spins for
//! [`SPIN`] after a loop before it sleeps, so back-to-back loops start without
//! waking a thread, and an idle process uses no CPU. The caller, done with its
//! own share, spins for the helpers, then yields its core to them until
//! [`WAIT_YIELD`] has passed, and then sleeps until the last one wakes it: a
//! helper that lost its core for long (another process, or torch's own
//! threads, on it) costs the caller no CPU, while the usual short wait — a
//! helper just woken from its sleep — is not lengthened by a wake-up.
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

/// How long a caller done with its share spins for the helpers before it
/// yields its core to them (shares are equal: helpers that were spinning
/// finish within this).
pub(crate) const WAIT_SPIN: Duration = Duration::from_micros(100);

/// How long a caller waits for the helpers, spinning and then yielding, before
/// it sleeps. A helper asleep when the loop was posted takes tens to hundreds
/// of microseconds to run (the tch MLP example ran 10% slower at two threads
/// with a caller that slept after [`WAIT_SPIN`]); one that lost its core for
/// longer than this is waited for asleep.
pub(crate) const WAIT_YIELD: Duration = Duration::from_millis(2);

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
    /// The caller asleep in [`Wait`] (set and cleared under `sleep`), and what
    /// wakes it: the helper that counts `remaining` down to 0.
    caller_waiting: AtomicBool,
    done: Condvar,
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
            caller_waiting: AtomicBool::new(false),
            done: Condvar::new(),
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
        let start = Instant::now();
        let (mut spins, mut yielding) = (0u32, false);
        while s.remaining.load(Ordering::Acquire) != 0 {
            if !yielding {
                spins = spins.wrapping_add(1);
                if !spins.is_multiple_of(64) || start.elapsed() < WAIT_SPIN {
                    std::hint::spin_loop();
                    continue;
                }
                yielding = true;
            }
            if start.elapsed() < WAIT_YIELD {
                std::thread::yield_now();
                continue;
            }
            // A helper still at work (or that lost its core): sleep, freeing this
            // core, until the last helper out wakes us. No lost wake-up: the flag
            // is set before `remaining` is read again, both SeqCst, and a helper
            // that saw it notifies under the same lock (see `CountOut`).
            let mut g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.caller_waiting.store(true, Ordering::SeqCst);
            while s.remaining.load(Ordering::SeqCst) != 0 {
                g = s.done.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.caller_waiting.store(false, Ordering::SeqCst);
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

/// The last use of the job by a helper: from its drop on, the caller may
/// return (the helper's `&State` is its own `Arc`'s, alive after that). The
/// last helper out wakes a caller asleep in [`Wait`].
struct CountOut<'s>(&'s State);

impl Drop for CountOut<'_> {
    fn drop(&mut self) {
        let s = self.0;
        if s.remaining.fetch_sub(1, Ordering::SeqCst) == 1 && s.caller_waiting.load(Ordering::SeqCst) {
            let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.done.notify_one();
        }
    }
}

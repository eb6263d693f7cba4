//! The team that runs the kernels' static parallel loops (`for_each_part`):
//! each share on the same thread every call, panics carried to the caller,
//! loops from several threads at once, idle helpers asleep. Its own test
//! binary: every test raises the process-wide count to 8 and uses a budget no
//! other test here uses, so no test finds its team busy with another's loop.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use dlbridge_cpu::threads::{budget, for_each_part};
use dlbridge_registry::threads::{set_num_threads, with_num_threads};

/// Runs `f` on a new thread called `name`, with a budget of `n` threads.
fn on_thread(name: &str, n: usize, f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            set_num_threads(8);
            with_num_threads(n, || {
                assert_eq!(budget(), n);
                f()
            })
        })
        .unwrap()
        .join()
        .unwrap();
}

/// Which thread ran each part.
fn owners(parts: usize) -> Vec<String> {
    let seen = Mutex::new(vec![String::new(); parts]);
    for_each_part(parts, |p| {
        seen.lock().unwrap()[p] = std::thread::current().name().unwrap_or("unnamed").to_owned();
    });
    seen.into_inner().unwrap()
}

#[test]
fn every_call_gives_each_thread_the_same_contiguous_share() {
    on_thread("caller6", 6, || {
        let first = owners(12);
        // Static, as OpenMP's schedule: the caller the first share, helper i the i-th.
        let want: Vec<String> = (0..12).map(|p| if p < 2 { "caller6".to_owned() } else { format!("dlbridge-6.{}", p / 2) }).collect();
        assert_eq!(first, want);
        for _ in 0..20 {
            assert_eq!(owners(12), first);
        }
    });
}

fn panic_text(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| e.downcast_ref::<String>().cloned()).unwrap_or_default()
}

#[test]
fn a_panicking_share_panics_in_the_caller_after_every_share_ends_and_the_team_lives_on() {
    on_thread("caller3", 3, || {
        // A helper's share.
        let e = std::panic::catch_unwind(|| for_each_part(6, |p| assert!(p != 5, "share of part 5 fails"))).unwrap_err();
        assert!(panic_text(&*e).contains("panicked on a dlbridge helper thread"), "{}", panic_text(&*e));
        // The caller's own share: the helpers' parts still run to their end before it unwinds.
        let done = AtomicUsize::new(0);
        let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for_each_part(6, |p| {
                assert!(p != 0, "part 0 fails");
                std::thread::sleep(std::time::Duration::from_millis(20));
                done.fetch_add(1, Ordering::SeqCst);
            })
        }))
        .unwrap_err();
        assert!(panic_text(&*e).contains("part 0 fails"));
        assert_eq!(done.load(Ordering::SeqCst), 4, "the helpers' parts 2..6 ran to their end");
        // Both at once (the caller's share unwinds past the helper's report):
        // the next loop still runs clean, not with a stale helper panic.
        let r = std::panic::catch_unwind(|| for_each_part(6, |p| assert!(p != 0 && p != 5, "part {p} fails")));
        assert!(r.is_err());
        for_each_part(6, |_| {});
        // And the team still works.
        let sum = AtomicU64::new(0);
        for_each_part(10, |p| {
            sum.fetch_add(p as u64, Ordering::SeqCst);
        });
        assert_eq!(sum.into_inner(), 45);
    });
}

#[test]
fn loops_from_several_threads_at_once_all_complete() {
    // One team per budget runs one loop at a time; the others take the budget's rayon pool.
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                set_num_threads(8);
                with_num_threads(2, || {
                    for round in 0..50u64 {
                        let sum = AtomicU64::new(0);
                        for_each_part(16, |p| {
                            sum.fetch_add(p as u64 + round + t, Ordering::SeqCst);
                        });
                        assert_eq!(sum.into_inner(), 120 + 16 * (round + t));
                    }
                })
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// utime + stime, in clock ticks, of this process's threads named `name`.
#[cfg(target_os = "linux")]
fn cpu_ticks_of(name: &str) -> Option<u64> {
    let mut total = None;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        // After `pid (comm) `: state is field 0 here; utime and stime are fields 11 and 12.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        total = Some(total.unwrap_or(0) + f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?);
    }
    total
}

#[cfg(target_os = "linux")]
#[test]
fn idle_helpers_sleep_and_use_no_cpu() {
    on_thread("caller5", 5, || {
        for _ in 0..20 {
            let sum = AtomicU64::new(0);
            for_each_part(10, |p| {
                let s: u64 = (0..100_000u64).map(|i| std::hint::black_box(i * p as u64)).sum();
                sum.fetch_add(s, Ordering::SeqCst);
            });
            assert!(sum.into_inner() > 0);
        }
    });
    let before = cpu_ticks_of("dlbridge-5.1").expect("the budget-5 team's first helper");
    // Past the helpers' spin (30 us), their CPU time stops growing.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let after = cpu_ticks_of("dlbridge-5.1").unwrap();
    assert!(after - before <= 1, "an idle helper used {} ticks in 0.5 s", after - before);
}

#[cfg(target_os = "linux")]
#[test]
fn a_caller_waiting_for_a_slow_helper_sleeps_instead_of_spinning() {
    on_thread("caller4", 4, || {
        let before = cpu_ticks_of("caller4").expect("this thread");
        let done = AtomicUsize::new(0);
        let t0 = std::time::Instant::now();
        // The caller's share is empty work; helper 3's takes 400 ms (a helper
        // that lost its core looks the same from the caller).
        for_each_part(4, |p| {
            if p == 3 {
                std::thread::sleep(std::time::Duration::from_millis(400));
            }
            done.fetch_add(1, Ordering::SeqCst);
        });
        assert!(t0.elapsed() >= std::time::Duration::from_millis(400));
        assert_eq!(done.load(Ordering::SeqCst), 4, "the caller returned after every share");
        let used = cpu_ticks_of("caller4").unwrap() - before;
        assert!(used <= 5, "the waiting caller used {used} ticks in 0.4 s");
        // And it wakes for the next loops as before.
        for round in 0..50u64 {
            let sum = AtomicU64::new(0);
            for_each_part(8, |p| {
                sum.fetch_add(p as u64 + round, Ordering::SeqCst);
            });
            assert_eq!(sum.into_inner(), 28 + 8 * round);
        }
    });
}

#[test]
fn a_loop_inside_a_share_runs_on_that_shares_thread_and_the_budget_comes_back() {
    on_thread("caller7", 7, || {
        let nested = Mutex::new(Vec::new());
        let budgets = Mutex::new(Vec::new());
        for_each_part(7, |_| {
            let outer = std::thread::current().name().unwrap_or("unnamed").to_owned();
            budgets.lock().unwrap().push(budget());
            for_each_part(4, |_| {
                nested.lock().unwrap().push((outer.clone(), std::thread::current().name().unwrap_or("unnamed").to_owned()));
            });
        });
        // Not the process-wide 8 on the helpers: the budget of 7 was spent on the outer loop.
        assert_eq!(budgets.into_inner().unwrap(), vec![1; 7]);
        let nested = nested.into_inner().unwrap();
        assert_eq!(nested.len(), 28);
        assert!(nested.iter().all(|(outer, inner)| outer == inner), "{nested:?}");
        assert_eq!(budget(), 7);
    });
}

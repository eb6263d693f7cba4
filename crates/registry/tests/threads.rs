//! The thread budget kernels read: process-wide, narrowed per call, restored
//! after it (even when the call panics), asked lazily when it comes from a
//! source. (Its own test binary: these tests change the process-wide count.)

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use dlbridge_registry::threads::{global_num_threads, num_threads, set_num_threads, with_num_threads, with_num_threads_from};

/// The tests below change the process-wide count one at a time.
static GLOBAL: Mutex<()> = Mutex::new(());

/// Runs `f` with the process-wide count set to `count`, alone, then restores it.
fn with_global(count: usize, f: impl FnOnce()) {
    let _g = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    let before = global_num_threads();
    set_num_threads(count);
    f();
    set_num_threads(before);
}

#[test]
fn the_process_wide_count_is_the_budget_outside_a_call() {
    with_global(3, || {
        assert_eq!(num_threads(), 3);
        set_num_threads(0);
        assert_eq!(num_threads(), 1, "0 is taken as 1");
    });
}

#[test]
fn a_call_narrows_the_budget_never_widens_it_and_restores_it() {
    with_global(4, || {
        with_num_threads(2, || {
            assert_eq!(num_threads(), 2);
            with_num_threads(8, || assert_eq!(num_threads(), 4, "never more than the process-wide count"));
            with_num_threads(0, || assert_eq!(num_threads(), 1));
            assert_eq!(num_threads(), 2, "the outer limit is back");
        });
        assert_eq!(num_threads(), 4);
        let panicked = std::panic::catch_unwind(|| with_num_threads(1, || panic!("kernel panicked")));
        assert!(panicked.is_err());
        assert_eq!(num_threads(), 4, "restored after a panic");
    });
}

#[test]
fn the_limit_of_a_call_is_local_to_its_thread() {
    with_global(4, || {
        with_num_threads(1, || {
            assert_eq!(num_threads(), 1);
            assert_eq!(std::thread::spawn(num_threads).join().unwrap(), 4);
        });
    });
}

static ASKED: AtomicUsize = AtomicUsize::new(0);

fn three() -> usize {
    ASKED.fetch_add(1, Ordering::SeqCst);
    3
}

#[test]
fn a_count_from_a_source_is_asked_only_when_a_kernel_reads_it() {
    with_global(8, || {
        let asked = ASKED.load(Ordering::SeqCst);
        with_num_threads_from(three, || {
            assert_eq!(ASKED.load(Ordering::SeqCst), asked, "not asked by entering the call");
            assert_eq!(num_threads(), 3);
            assert_eq!(ASKED.load(Ordering::SeqCst), asked + 1);
        });
        set_num_threads(2);
        with_num_threads_from(three, || assert_eq!(num_threads(), 2, "capped by the process-wide count"));
    });
}

#[test]
fn the_environment_sets_the_process_wide_count() {
    // A fresh process reads DLBRIDGE_NUM_THREADS once, at first use.
    let exe = std::env::current_exe().unwrap();
    for (value, want) in [("3", "3"), ("0", "cores"), ("lots", "cores")] {
        let out = std::process::Command::new(&exe)
            .args(["--exact", "child_prints_the_process_wide_count", "--ignored", "--nocapture", "--test-threads=1"])
            .env("DLBRIDGE_NUM_THREADS", value)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()).to_string();
        let want = if want == "cores" { cores.as_str() } else { want };
        assert!(text.contains(&format!("count={want};")), "DLBRIDGE_NUM_THREADS={value}: {text}");
    }
}

#[test]
#[ignore = "run in a child process by the_environment_sets_the_process_wide_count"]
fn child_prints_the_process_wide_count() {
    println!("count={};", global_num_threads());
}

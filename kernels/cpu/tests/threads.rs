//! Where the kernels' parallel loops run: on the caller's thread for a budget
//! of one, else on a pool of dlbridge's own with the budget's threads (never
//! rayon's global pool); results do not depend on the budget.

use std::collections::BTreeSet;
use std::sync::Mutex;

use dlbridge_array::Array;
use dlbridge_core::DType;
use dlbridge_cpu::threads::{budget, for_each_part, map_reduce_chunks};
use dlbridge_registry::threads::{set_num_threads, with_num_threads};
use dlbridge_registry::{Arg, Registry};

/// Names of the threads that ran each part.
fn threads_used(parts: usize) -> BTreeSet<String> {
    let seen = Mutex::new(BTreeSet::new());
    for_each_part(parts, |_| {
        // Long enough that the pool's threads all pick up parts.
        std::thread::sleep(std::time::Duration::from_millis(2));
        seen.lock().unwrap().insert(std::thread::current().name().unwrap_or("unnamed").to_owned());
    });
    seen.into_inner().unwrap()
}

#[test]
fn a_budget_of_one_runs_every_part_on_the_calling_thread() {
    std::thread::Builder::new()
        .name("caller".into())
        .spawn(|| {
            with_num_threads(1, || {
                assert_eq!(budget(), 1);
                assert_eq!(threads_used(16), BTreeSet::from(["caller".to_owned()]));
            })
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn a_larger_budget_runs_on_the_caller_and_a_team_of_that_size() {
    std::thread::Builder::new()
        .name("caller3".into())
        .spawn(|| {
            set_num_threads(4);
            with_num_threads(3, || {
                assert_eq!(budget(), 3);
                let want = BTreeSet::from(["caller3".to_owned(), "dlbridge-3.1".to_owned(), "dlbridge-3.2".to_owned()]);
                assert_eq!(threads_used(64), want);
            });
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn chunked_reductions_give_the_same_result_at_every_budget() {
    let x: Vec<u64> = (0..100_000).collect();
    let want: u64 = x.iter().sum();
    for n in [1, 2, 3] {
        let got = with_num_threads(n, || map_reduce_chunks(&x, 1000, |c| c.iter().sum::<u64>(), || 0, |a, b| a + b));
        assert_eq!(got, want, "budget {n}");
    }
}

#[test]
fn kernels_large_enough_to_split_agree_at_every_budget() {
    dlbridge_cpu::link();
    let reg = Registry::global();
    let (n, k) = (300i64, 400i64);
    let a = Array::from_vec((0..n * k).map(|i| (i % 7) as f32 - 3.0).collect(), &[n, k]).unwrap();
    let b = Array::from_vec((0..k * n).map(|i| (i % 5) as f32 * 0.5).collect(), &[k, n]).unwrap();
    let run = |name: &str, ins: &[&Array], shape: &[i64]| {
        let mut out = Array::zeros(DType::F32, shape).unwrap();
        {
            let mut args: Vec<Arg<'_>> = ins.iter().map(|a| Arg::Tensor(a.view())).collect();
            reg.get(name).unwrap().call(&mut args, &mut [out.view_mut().unwrap()]).unwrap();
        }
        out.to_vec::<f32>().unwrap()
    };
    let results: Vec<_> = [1, 2]
        .into_iter()
        .map(|t| with_num_threads(t, || (run("matmul", &[&a, &b], &[n, n]), run("add", &[&a, &a], &[n, k]), run("sum_all", &[&a], &[]))))
        .collect();
    assert_eq!(results[0], results[1]);
}

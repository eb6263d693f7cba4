//! Helpers the test binaries of this crate share.

use std::sync::Arc;

use dlbridge_array::Array;
use dlbridge_core::DType;
use dlbridge_registry::{Arg, Kernel};

/// `kernel(x) -> y` on the i32 `x = [0, 1, .., n - 1]` from `threads`
/// threads at once (concurrent first calls): each thread's `y`.
pub fn call_from_threads(kernel: &Arc<Kernel>, n: i32, threads: usize) -> Vec<Vec<i32>> {
    let x = Arc::new(Array::from_slice(&(0..n).collect::<Vec<i32>>(), &[i64::from(n)]).unwrap());
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (kernel, x) = (kernel.clone(), x.clone());
            std::thread::spawn(move || {
                let mut y = Array::zeros(DType::I32, &[i64::from(n)]).unwrap();
                kernel.call(&mut [Arg::Tensor(x.view())], &mut [y.view_mut().unwrap()]).unwrap();
                y.to_vec::<i32>().unwrap()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

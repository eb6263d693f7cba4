//! Helpers the test binaries of this crate share.

use std::sync::Arc;

use dlbridge_array::Array;
use dlbridge_core::DType;
use dlbridge_registry::{Arg, Kernel};

/// Calls `kernel` on `inputs`, outputs allocated from its signature.
#[allow(dead_code)] // each test binary uses its share of these helpers
pub fn run(kernel: &Kernel, inputs: &[&Array]) -> dlbridge_core::Result<Vec<Array>> {
    let mut args: Vec<Arg<'_>> = inputs.iter().map(|a| Arg::Tensor(a.view())).collect();
    let specs = kernel.prepare_outputs(&args)?;
    let mut outs: Vec<Array> = specs.iter().map(|s| Array::zeros(s.dtype, &s.shape).unwrap()).collect();
    {
        let mut views: Vec<_> = outs.iter_mut().map(|a| a.view_mut().unwrap()).collect();
        kernel.call(&mut args, &mut views)?;
    }
    Ok(outs)
}

/// `n` values in [-5, 5] times `scale`, deterministic and irregular.
#[allow(dead_code)]
pub fn seq(n: usize, scale: f64) -> Vec<f64> {
    (0..n).map(|i| ((i * 37 % 101) as f64 - 50.0) * scale).collect()
}

/// Asserts `got` is `want` within `tol` relative (plus `tol` absolute).
#[allow(dead_code)]
pub fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "element {i}: got {g}, want {w}");
    }
}

/// Defines and registers the first definition of `lang` in `reg`.
#[allow(dead_code)]
pub fn define_one(reg: &dlbridge_registry::Registry, lang: &str) -> (dlbridge_compile::tc::TcKernel, Arc<Kernel>) {
    let d = dlbridge_compile::tc::define_in(reg, lang).unwrap().remove(0);
    (d.kernel, d.registered)
}

/// `kernel(x) -> y` on the i32 `x = [0, 1, .., n - 1]` from `threads`
/// threads at once (concurrent first calls): each thread's `y`.
#[allow(dead_code)]
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

//! Loading the Rust example plugin (this crate's cdylib) and running its kernels.

use std::path::PathBuf;

use dlbridge_array::Array;
use dlbridge_core::{DType, ErrorKind};
use dlbridge_registry::{Arg, Registry};

/// The cdylib cargo built for this package, next to the test binary's directory.
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps, deps.parent().unwrap()] {
        let p = dir.join("libdlbridge_plugin_rust.so");
        if p.exists() {
            return p;
        }
    }
    panic!("libdlbridge_plugin_rust.so not found near {}", exe.display());
}

#[test]
fn rust_plugin_loads_and_runs_on_strided_arrays() {
    let reg = Registry::new();
    let info = reg.load_plugin(cdylib()).unwrap();
    assert_eq!(info.name, "example-rust");
    assert_eq!(info.kernels.len(), 4);
    assert_eq!(info.kernels[0].doc, "y = alpha * x (Rust plugin, any strides)");
    assert_eq!(info.kernels[3].doc, "");
    let x = Array::from_slice(&[1.0f64, 2.0, 3.0, 4.0], &[2, 2]).unwrap().t().unwrap();
    let mut y = Array::zeros(DType::F64, &[2, 2]).unwrap();
    reg.call("rust_scale", &mut [Arg::f64(3.0), Arg::Tensor(x.view())], &mut [y.view_mut().unwrap()]).unwrap();
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![3.0, 9.0, 6.0, 12.0]);
    let xf = Array::from_slice(&[1.5f32], &[1]).unwrap();
    let mut yf = Array::zeros(DType::F32, &[1]).unwrap();
    reg.call("rust_scale", &mut [Arg::f64(2.0), Arg::Tensor(xf.view())], &mut [yf.view_mut().unwrap()]).unwrap();
    assert_eq!(yf.to_vec::<f32>().unwrap(), vec![3.0]);
    let v = Array::from_slice(&[1i64, 5, 7, 2], &[4]).unwrap();
    let mut n = Array::zeros(DType::I64, &[]).unwrap();
    reg.call("rust_count", &mut [Arg::i64(2), Arg::Tensor(v.view())], &mut [n.view_mut().unwrap()]).unwrap();
    assert_eq!(n.to_vec::<i64>().unwrap(), vec![2]);
}

#[test]
fn a_panicking_rust_plugin_kernel_returns_an_error_and_the_process_lives_on() {
    let reg = Registry::new();
    reg.load_plugin(cdylib()).unwrap();
    let x = Array::zeros(DType::F32, &[3]).unwrap();
    for _ in 0..3 {
        let e = reg.call("rust_panic", &mut [Arg::Tensor(x.view())], &mut []).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Runtime);
        assert_eq!(e.to_string(), "rust_panic: kernel panicked: this kernel always panics (plugin example-rust)");
    }
}

#[test]
fn a_rust_plugin_kernel_error_keeps_its_kind_and_message() {
    let reg = Registry::new();
    reg.load_plugin(cdylib()).unwrap();
    let x = Array::zeros(DType::F32, &[3]).unwrap();
    let e = reg.call("rust_fail", &mut [Arg::Tensor(x.view())], &mut []).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value);
    assert_eq!(e.to_string(), "rust_fail: rust_fail refuses 1 tensors on principle (plugin example-rust)");
}

//! Loading the C example plugin, running its kernels, and refusing malformed plugins.

use dlbridge_array::Array;
use dlbridge_core::{DType, ErrorKind};
use dlbridge_plugin_c::path;
use dlbridge_registry::{Arg, Registry};

#[test]
fn c_plugin_loads_and_its_kernels_run_on_arrays() {
    let reg = Registry::new();
    let info = reg.load_plugin(path("example_c")).unwrap();
    assert_eq!((info.name.as_str(), info.version.as_str(), info.abi_version), ("example-c", "1.0.0", 1));
    let sigs: Vec<&str> = info.kernels.iter().map(|k| k.signature.as_str()).collect();
    assert_eq!(sigs, ["c_saxpy(alpha: f64, x: f32[N], y: mut f32[N])", "c_dot(a: f64[N], b: f64[N]) -> (out: f64[])", "c_sqrt(x: f32[N]) -> (y: f32[N])"]);

    // c_saxpy on a strided x (every other element) and a reversed y.
    let xs = Array::from_slice(&[1.0f32, 99.0, 2.0, 99.0, 3.0, 99.0], &[6]).unwrap();
    let x = xs.slice(0, 0, 6, 2).unwrap();
    let base = Array::from_slice(&[10.0f32, 20.0, 30.0], &[3]).unwrap();
    let mut y = base.slice(0, -1, -4, -1).unwrap();
    drop(base);
    reg.call("c_saxpy", &mut [Arg::F64(2.0), Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![32.0, 24.0, 16.0]);

    let a = Array::from_slice(&[1.0f64, 2.0, 3.0], &[3]).unwrap();
    let b = Array::from_slice(&[4.0f64, 5.0, 6.0], &[3]).unwrap();
    let mut out = Array::zeros(DType::F64, &[]).unwrap();
    reg.call("c_dot", &mut [Arg::Tensor(a.view()), Arg::Tensor(b.view())], &mut [out.view_mut().unwrap()]).unwrap();
    assert_eq!(out.to_vec::<f64>().unwrap(), vec![32.0]);
}

#[test]
fn a_plugin_kernel_error_reaches_the_caller_with_its_message() {
    let reg = Registry::new();
    reg.load_plugin(path("example_c")).unwrap();
    let x = Array::from_slice(&[4.0f32, -1.0], &[2]).unwrap();
    let mut y = Array::zeros(DType::F32, &[2]).unwrap();
    let e = reg.call("c_sqrt", &mut [Arg::Tensor(x.view())], &mut [y.view_mut().unwrap()]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value);
    assert_eq!(e.to_string(), "c_sqrt: negative input -1 at index 1 (plugin example-c)");
}

#[test]
fn contiguous_only_plugin_kernels_refuse_strided_tensors() {
    let reg = Registry::new();
    reg.load_plugin(path("example_c")).unwrap();
    let x = Array::from_slice(&[4.0f32, 0.0, 9.0, 0.0], &[4]).unwrap().slice(0, 0, 4, 2).unwrap();
    let mut y = Array::zeros(DType::F32, &[2]).unwrap();
    let e = reg.call("c_sqrt", &mut [Arg::Tensor(x.view())], &mut [y.view_mut().unwrap()]).unwrap_err();
    assert!(e.to_string().contains("needs contiguous tensors"), "{e}");
    let xc = x.contiguous().unwrap();
    reg.call("c_sqrt", &mut [Arg::Tensor(xc.view())], &mut [y.view_mut().unwrap()]).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
}

#[test]
fn loading_the_same_library_twice_is_harmless() {
    let reg = Registry::new();
    let first = reg.load_plugin(path("example_c")).unwrap();
    let second = reg.load_plugin(path("example_c")).unwrap();
    assert_eq!(first, second);
    assert_eq!(reg.list().len(), 3);
    assert_eq!(reg.plugins().len(), 1);
}

#[test]
fn two_plugins_with_the_same_kernel_name_are_an_error_and_roll_back() {
    let reg = Registry::new();
    reg.load_plugin(path("example_c")).unwrap();
    let e = reg.load_plugin(path("duplicate")).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("libdlbridge_plugin_duplicate.so"), "{text}");
    assert!(text.contains("registered twice: by plugin example-c"), "{text}");
    assert_eq!(reg.list().len(), 3, "nothing of the second plugin stays registered");
    assert_eq!(reg.plugins().len(), 1);
    // The first plugin's kernels still work.
    let a = Array::from_slice(&[1.0f64], &[1]).unwrap();
    let mut out = Array::zeros(DType::F64, &[]).unwrap();
    reg.call("c_dot", &mut [Arg::Tensor(a.view()), Arg::Tensor(a.view())], &mut [out.view_mut().unwrap()]).unwrap();
}

fn load_err(variant: &str) -> String {
    let reg = Registry::new();
    let e = reg.load_plugin(path(variant)).unwrap_err().to_string();
    assert!(e.contains(&format!("libdlbridge_plugin_{variant}.so")), "error names the path: {e}");
    assert!(reg.list().is_empty());
    e
}

#[test]
fn an_abi_version_from_the_future_is_refused() {
    let e = load_err("future_abi");
    assert!(e.contains("ABI version 7") && e.contains("from the future"), "{e}");
}

#[test]
fn a_table_smaller_than_v1_is_refused() {
    let e = load_err("small_struct");
    assert!(e.contains("struct_size 8 is smaller than the v1 table"), "{e}");
}

#[test]
fn a_signature_that_does_not_parse_is_refused_with_its_column() {
    let e = load_err("bad_signature");
    assert!(e.contains("kernels[0]: signature error at column"), "{e}");
}

#[test]
fn a_library_without_the_symbol_is_refused() {
    let e = load_err("no_symbol");
    assert!(e.contains("no `dlbridge_plugin` symbol"), "{e}");
}

#[test]
fn a_file_that_is_not_a_shared_library_is_refused() {
    let dir = std::env::temp_dir().join(format!("dlbridge-notlib-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("libnot_a_plugin.so");
    std::fs::write(&file, b"this is text, not ELF").unwrap();
    let e = Registry::new().load_plugin(&file).unwrap_err().to_string();
    assert!(e.contains("libnot_a_plugin.so") && e.contains("not a loadable shared library"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_file_is_not_found() {
    let e = Registry::new().load_plugin("/nonexistent/libnothing.so").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("/nonexistent/libnothing.so"), "{e}");
}

#[test]
fn kernels_keep_their_library_loaded_after_the_registry_is_gone() {
    let reg = Registry::new();
    reg.load_plugin(path("example_c")).unwrap();
    let k = reg.get("c_dot").unwrap();
    drop(reg);
    let a = Array::from_slice(&[2.0f64, 3.0], &[2]).unwrap();
    let mut out = Array::zeros(DType::F64, &[]).unwrap();
    k.call(&mut [Arg::Tensor(a.view()), Arg::Tensor(a.view())], &mut [out.view_mut().unwrap()]).unwrap();
    assert_eq!(out.to_vec::<f64>().unwrap(), vec![13.0]);
}

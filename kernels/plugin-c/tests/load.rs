//! Loading the C example plugin, running its kernels, and refusing malformed plugins.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlbridge_array::Array;
use dlbridge_core::{DType, DeviceType, Error, ErrorKind, ManagedTensor};
use dlbridge_plugin_c::path;
use dlbridge_registry::{Arg, Kernel, Plugin, Registry};

#[test]
fn c_plugin_loads_and_its_kernels_run_on_arrays() {
    let reg = Registry::new();
    let info = reg.load_plugin(path("example_c")).unwrap();
    assert_eq!((info.name.as_str(), info.version.as_str(), info.abi_version), ("example-c", "1.0.0", 1));
    let sigs: Vec<&str> = info.kernels.iter().map(|k| k.signature.as_str()).collect();
    assert_eq!(
        sigs,
        [
            "c_saxpy(alpha: f64, x: f32[N], y: mut f32[N])",
            "c_dot(a: f64[N], b: f64[N]) -> (out: f64[])",
            "c_sqrt(x: f32[N]) -> (y: f32[N])"
        ]
    );

    // c_saxpy on a strided x (every other element) and a reversed y.
    let xs = Array::from_slice(&[1.0f32, 99.0, 2.0, 99.0, 3.0, 99.0], &[6]).unwrap();
    let x = xs.slice(0, 0, 6, 2).unwrap();
    let base = Array::from_slice(&[10.0f32, 20.0, 30.0], &[3]).unwrap();
    let mut y = base.slice(0, -1, -4, -1).unwrap();
    drop(base);
    reg.call("c_saxpy", &mut [Arg::f64(2.0), Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap();
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
    assert!(e.to_string().contains("c_sqrt: argument x: this kernel needs a contiguous"), "{e}");
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

/// Hostile plugins (the crate's build script makes them), each refused with its reason.
#[test]
fn malformed_plugin_tables_are_refused_with_their_reason() {
    for (variant, reasons) in [
        ("future_abi", &["ABI version 7 (", "the plugin is from the future"][..]),
        ("small_struct", &["struct_size 8 is smaller than the v1 table"]),
        ("bad_signature", &["kernels[0]: signature error at column"]),
        ("no_symbol", &["no `dlbridge_plugin` symbol"]),
    ] {
        let e = load_err(variant);
        assert!(reasons.iter().all(|r| e.contains(r)), "{variant}: {e}");
    }
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
fn a_missing_file_is_file_not_found() {
    let e = Registry::new().load_plugin("/nonexistent/libnothing.so").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FileNotFound);
    assert!(matches!(e.root(), Error::FileNotFound { path } if path == Path::new("/nonexistent/libnothing.so")), "{e:?}");
    assert!(e.to_string().contains("/nonexistent/libnothing.so"), "{e}");
    let e = Plugin::open("/nonexistent/libnothing.so").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FileNotFound);
}

#[test]
fn a_dlopen_failure_keeps_the_loaders_reason() {
    let dir = std::env::temp_dir().join(format!("dlbridge-badelf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("libbad_elf.so");
    // Long enough to hold an ELF header, so the loader's complaint is about its magic.
    std::fs::write(&file, vec![b'x'; 4096]).unwrap();
    let e = Registry::new().load_plugin(&file).unwrap_err().to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(e.contains("not a loadable shared library"), "{e}");
    // libloading's own Display is only "dlopen failed"; the reason is in its source.
    assert!(e.contains("invalid ELF header"), "the dlerror text is kept: {e}");
}

/// Each kernel's signature with its devices and origins.
type Described = Vec<(String, Vec<(DeviceType, String)>)>;

/// The kernel list, and what it says, to compare before and after.
fn snapshot(reg: &Registry) -> (Vec<Arc<Kernel>>, Described) {
    let list = reg.list();
    let described = list.iter().map(|k| (k.signature_text().to_owned(), k.origins().map(|(d, o)| (d, o.to_owned())).collect())).collect();
    (list, described)
}

#[test]
fn a_failed_load_leaves_the_builtin_kernels_exactly_as_they_were() {
    dlbridge_cpu::link();
    let reg = Registry::with_builtins();
    assert!(reg.problems().is_empty(), "{:?}", reg.problems());
    let add = reg.get("add").unwrap();
    assert_eq!(add.devices().collect::<Vec<_>>(), [DeviceType::CPU]);
    let (list_before, described_before) = snapshot(&reg);

    // Its first kernel would extend the built-in `add` with CUDA; its second
    // conflicts with the built-in `sub`.
    let e = reg.load_plugin(path("cuda_add_then_conflict")).unwrap_err().to_string();
    assert!(e.contains("already registered with signature"), "{e}");

    let add_after = reg.get("add").unwrap();
    assert!(Arc::ptr_eq(&add, &add_after), "the built-in add is the same kernel: {add_after:?}");
    assert_eq!(add_after.devices().collect::<Vec<_>>(), [DeviceType::CPU]);
    let (list_after, described_after) = snapshot(&reg);
    assert_eq!(described_after, described_before);
    assert_eq!(list_after.len(), list_before.len());
    assert!(list_before.iter().zip(&list_after).all(|(a, b)| Arc::ptr_eq(a, b)), "every kernel is the same Arc");
    assert!(reg.plugins().is_empty());
    assert!(e.contains("kernels[1] (sub): kernel sub is already registered"), "the error names the kernel that failed: {e}");

    // And it still runs.
    let a = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let mut out = Array::zeros(DType::F32, &[2]).unwrap();
    reg.call("add", &mut [Arg::Tensor(a.view()), Arg::Tensor(a.view())], &mut [out.view_mut().unwrap()]).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
}

#[test]
fn a_plugin_can_extend_a_kernel_with_a_new_device_when_nothing_conflicts() {
    // Without the built-ins, the same plugin loads: its own kernels are consistent.
    let reg = Registry::new();
    let info = reg.load_plugin(path("cuda_add_then_conflict")).unwrap();
    assert_eq!(info.kernels.len(), 2);
    assert_eq!(reg.get("add").unwrap().devices().collect::<Vec<_>>(), [DeviceType::CUDA]);
}

#[test]
fn a_kernel_declared_twice_in_one_plugin_is_refused_before_registration() {
    let e = Plugin::open(path("duplicate_kernel")).unwrap_err().to_string();
    assert!(e.contains("kernels[3]") && e.contains("kernel c_dot on cpu is registered twice"), "{e}");
    load_err("duplicate_kernel");
}

/// Loads (or opens) a variant that must be refused, timing it.
fn refused_fast(what: &str, f: impl FnOnce() -> dlbridge_core::Result<()>) -> String {
    let start = Instant::now();
    let e = f().unwrap_err().to_string();
    let took = start.elapsed();
    eprintln!("{what}: refused in {took:?} with a {}-byte message", e.len());
    assert!(took < Duration::from_secs(2), "{what} took {took:?}");
    assert!(e.len() < 1024, "{what}: the message is bounded ({} bytes): {}", e.len(), &e[..e.len().min(2000)]);
    e
}

#[test]
fn a_one_megabyte_signature_is_refused_fast_by_load_and_by_open() {
    let e = refused_fast("load_plugin(huge_signature)", || Registry::new().load_plugin(path("huge_signature")).map(drop));
    assert!(e.contains("`kernels[0].signature` is longer than 4096 bytes") && e.contains("it starts `c_huge(x0: f32[N]"), "{e}");
    let e = refused_fast("Plugin::open(huge_signature)", || Plugin::open(path("huge_signature")).map(drop));
    assert!(e.contains("`kernels[0].signature` is longer than 4096 bytes"), "{e}");
}

#[test]
fn a_one_megabyte_plugin_name_is_refused_fast() {
    let e = refused_fast("load_plugin(huge_name)", || Registry::new().load_plugin(path("huge_name")).map(drop));
    assert!(e.contains("`name` is longer than 128 bytes"), "{e}");
    refused_fast("Plugin::open(huge_name)", || Plugin::open(path("huge_name")).map(drop));
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

#[test]
fn a_cuda_plugin_kernel_gets_the_callers_stream_and_device() {
    use dlbridge_core::testing::{Fields, ForeignTensor};
    let reg = Registry::new();
    reg.load_plugin(path("cuda_stream_probe")).unwrap();
    let k = reg.get("stream_probe").unwrap();
    assert_eq!(k.devices().collect::<Vec<_>>(), [DeviceType::CUDA]);
    // Device memory on cuda:1 at an address nobody reads (the probe only reports).
    let make = |addr: usize| {
        let mut f = Fields::f32(&[4]);
        f.device = (2, 1);
        f.data_override = Some(addr);
        Box::leak(Box::new(ForeignTensor::new(&f)))
    };
    let (x, y) = (make(0x7f00_0000_0000), make(0x7f00_0001_0000));
    // SAFETY: well-formed hand-made tensors, alive for the test (leaked), never read on the host.
    let (x, mut y) = unsafe {
        (ManagedTensor::from_raw_versioned(x.versioned_ptr()).unwrap(), ManagedTensor::from_raw_versioned(y.versioned_ptr()).unwrap())
    };
    let stream = 0xdead_b000usize as *mut std::ffi::c_void;
    let e = k.call_on_stream(&mut [Arg::Tensor(x.view().clone())], &mut [y.view_mut().unwrap()], stream).unwrap_err().to_string();
    assert!(e.contains("stream_probe: stream 0xdeadb000, 2 tensors, device 2:1"), "{e}");
    // No stream given: NULL (the legacy default stream).
    let e = k.call(&mut [Arg::Tensor(x.view().clone())], &mut [y.view_mut().unwrap()]).unwrap_err().to_string();
    assert!(e.contains("stream (nil)") || e.contains("stream 0x0"), "{e}");
}

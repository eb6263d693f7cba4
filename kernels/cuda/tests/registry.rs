//! The `cuda` implementations in the registry: registered beside the CPU
//! ones under the same signatures, chosen by the tensors' device, with clear
//! errors for mixed devices, uncovered dtypes and a machine without CUDA.
//! Device tensors here are hand-made DLPack tensors naming kDLCUDA memory that
//! no one dereferences on this machine.

use dlbridge_array::Array;
use dlbridge_core::testing::{Fields, ForeignTensor};
use dlbridge_core::{DeviceType, ErrorKind, ManagedTensor};
use dlbridge_registry::{Arg, Registry};

fn linked() -> &'static Registry {
    dlbridge_cpu::link();
    dlbridge_cuda::link();
    Registry::global()
}

/// A kDLCUDA tensor of `dtype` (code, bits) on cuda:0 at an address nobody reads.
fn fake_cuda(shape: &[i64], dtype: (u8, u8)) -> ManagedTensor {
    let mut f = Fields::f32(shape);
    f.device = (2, 0);
    f.dtype = (dtype.0, dtype.1, 1);
    f.data_override = Some(0x7f00_0000_0000);
    let t = Box::leak(Box::new(ForeignTensor::new(&f)));
    // SAFETY: a well-formed hand-made tensor that lives for the whole test
    // (leaked); its memory is "device" memory and is never read on the host.
    unsafe { ManagedTensor::from_raw_versioned(t.versioned_ptr()) }.unwrap()
}

#[test]
fn every_builtin_cuda_kernel_is_registered_beside_its_cpu_kernel() {
    let reg = linked();
    for name in ["add", "mul", "relu", "gelu", "softmax", "sum", "mean", "sum_all", "mean_all", "matmul"] {
        let k = reg.get(name).unwrap();
        let devices: Vec<DeviceType> = k.devices().collect();
        assert!(devices.contains(&DeviceType::CPU) && devices.contains(&DeviceType::CUDA), "{name}: {devices:?}");
    }
    // Kernels without a CUDA implementation stay CPU-only.
    assert_eq!(reg.get("sub").unwrap().devices().collect::<Vec<_>>(), [DeviceType::CPU]);
}

#[test]
fn tensors_on_two_devices_are_an_error_naming_both() {
    let reg = linked();
    let host = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let dev = fake_cuda(&[3], (2, 32));
    let mut out = Array::zeros(dlbridge_core::DType::F32, &[3]).unwrap();
    let e = reg
        .get("add")
        .unwrap()
        .call(&mut [Arg::Tensor(host.view()), Arg::Tensor(dev.view().clone())], &mut [out.view_mut().unwrap()])
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("cpu") && msg.contains("cuda"), "{msg}");
    assert_eq!(out.to_vec::<f32>().unwrap(), [0.0; 3], "nothing may be written");
}

#[test]
fn an_integer_dtype_on_cuda_is_a_type_error_naming_what_cuda_covers() {
    let reg = linked();
    let (a, b) = (fake_cuda(&[3], (0, 32)), fake_cuda(&[3], (0, 32)));
    let mut o = fake_cuda(&[3], (0, 32));
    let out = o.view_mut().unwrap();
    let e = reg.get("add").unwrap().call(&mut [Arg::Tensor(a.view().clone()), Arg::Tensor(b.view().clone())], &mut [out]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Type, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("cuda") && msg.contains("i32") && msg.contains("bf16"), "{msg}");
}

#[test]
fn without_a_driver_a_cuda_call_is_an_error_that_says_why() {
    if dlbridge_cuda::skip_reason().is_none() {
        eprintln!("not for a GPU machine: this test checks the error where there is no CUDA driver");
        return;
    }
    let reg = linked();
    let (a, b) = (fake_cuda(&[3], (2, 32)), fake_cuda(&[3], (2, 32)));
    let mut o = fake_cuda(&[3], (2, 32));
    let out = o.view_mut().unwrap();
    let e = reg.get("add").unwrap().call(&mut [Arg::Tensor(a.view().clone()), Arg::Tensor(b.view().clone())], &mut [out]).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("CUDA is not available here") && msg.contains("no CUDA driver"), "{msg}");
}

#[test]
fn cublas_loads_from_the_nvidia_wheels_without_a_gpu() {
    match dlbridge_cuda::matmul::find_cublas() {
        Ok(path) => eprintln!("libcublas: {path:?}"),
        Err(e) => eprintln!("skipped: {e}"),
    }
    // Where NVRTC came from a wheel, cuBLAS is in the same folder (torch's CUDA wheels carry both).
    if let Ok(n) = dlbridge_cuda::nvrtc::nvrtc()
        && let Some(dir) = n.path.as_ref().and_then(|p| p.parent())
        && std::fs::read_dir(dir).unwrap().flatten().any(|e| e.file_name().to_string_lossy().starts_with("libcublas.so"))
    {
        assert!(dlbridge_cuda::matmul::find_cublas().is_ok(), "{:?}", dlbridge_cuda::matmul::find_cublas());
    }
}

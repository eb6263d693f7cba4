//! `raw_kernel`: CUDA C from source with a dlbridge signature. Compilation and
//! its errors run here (NVRTC); launches need a GPU (skipped with the reason).

use dlbridge_array::Array;
use dlbridge_core::{DType, DeviceType};
use dlbridge_cuda::raw_kernel::{CHECK_ARCH, RawLaunch, raw_kernel, raw_kernel_ptx};
use dlbridge_cuda::{CudaArray, CudaDevice};
use dlbridge_registry::Arg;

const SCALE: &str = r#"
extern "C" __global__ void scale(const T* x, double alpha, T* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = (T)(alpha * (double)x[i]);
}
"#;
const SCALE_SIG: &str = "scale<T: f32|f64>(x: T[N], alpha: f64) -> (y: T[N])";

use dlbridge_cuda::nvrtc::available_or_skip as nvrtc_or_skip;

#[test]
fn a_raw_kernel_is_a_cuda_only_kernel_with_its_signature() {
    if !nvrtc_or_skip() {
        return;
    }
    let k = raw_kernel(SCALE, "scale", SCALE_SIG, &[], RawLaunch::default()).unwrap();
    assert_eq!(k.name(), "scale");
    assert_eq!(k.devices().collect::<Vec<_>>(), [DeviceType::CUDA]);
    // On host arrays it is a device error, nothing written.
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let mut y = Array::zeros(DType::F32, &[2]).unwrap();
    let e = k.call(&mut [Arg::Tensor(x.view()), Arg::f64(2.0)], &mut [y.view_mut().unwrap()]).unwrap_err();
    assert!(e.to_string().contains("cuda"), "{e}");
    assert_eq!(y.to_vec::<f32>().unwrap(), [0.0, 0.0]);
}

#[test]
fn each_type_variable_is_a_typedef_of_the_c_type() {
    if !nvrtc_or_skip() {
        return;
    }
    let ptx = raw_kernel_ptx(SCALE, "scale", SCALE_SIG, &[], CHECK_ARCH).unwrap();
    assert!(ptx.contains(".entry scale(") && ptx.contains(".f32"), "f32 is the first dtype of T");
    let ptx64 = raw_kernel_ptx(SCALE, "scale", "scale<T: f64>(x: T[N], alpha: f64) -> (y: T[N])", &[], CHECK_ARCH).unwrap();
    assert!(ptx64.contains("ld.global.f64"), "T=double loads f64");
}

#[test]
fn a_source_that_does_not_compile_fails_when_made_with_nvrtcs_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let bad = SCALE.replace("alpha *", "alpha * undefined_thing *");
    let e = raw_kernel(&bad, "scale", SCALE_SIG, &[], RawLaunch::default()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("undefined_thing") && msg.contains("scale.cu"), "{msg}");
    // A source without a T where the signature has one: compiles (T is defined), runs only on a GPU.
    let e = raw_kernel(SCALE, "scale", SCALE_SIG, &["--bogus-option".into()], RawLaunch::default()).unwrap_err();
    assert!(e.to_string().contains("bogus"), "{e}");
}

#[test]
fn a_raw_kernel_runs_on_device_arrays() {
    if let Some(reason) = dlbridge_cuda::skip_reason() {
        eprintln!("skipped: {reason}");
        return;
    }
    let dev = CudaDevice::get(0).unwrap();
    let k = raw_kernel(SCALE, "scale", SCALE_SIG, &[], RawLaunch::default()).unwrap();
    for n in [1usize, 1000, 100_000] {
        let host: Vec<f64> = (0..n).map(|i| i as f64 - 7.5).collect();
        let x = CudaArray::from_host(&dev, &Array::from_slice(&host, &[n as i64]).unwrap()).unwrap();
        let mut y = CudaArray::empty(&dev, DType::F64, &[n as i64]).unwrap();
        k.call(&mut [Arg::Tensor(x.view().unwrap()), Arg::f64(-3.0)], &mut [y.view_mut().unwrap()]).unwrap();
        let got = y.to_host().unwrap().to_vec::<f64>().unwrap();
        assert_eq!(got, host.iter().map(|v| v * -3.0).collect::<Vec<_>>());
    }
}

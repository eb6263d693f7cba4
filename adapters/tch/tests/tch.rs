//! tch <-> DLPack with zero copies, deleter timing, and registry kernels on tch tensors.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dlbridge_array::Array;
use dlbridge_core::{DType, ErrorKind, ManagedTensor, TensorDesc};
use dlbridge_registry::{Call, Impl, KernelDef, KernelOpts, Registry};
use dlbridge_tch::{Scalar, call, call_into, from_dlpack, kind_of, to_dlpack};
use tch::{Device, Kind, Tensor};

fn registry() -> &'static Registry {
    dlbridge_cpu::link();
    Registry::global()
}

#[test]
fn tch_to_dlpack_is_zero_copy_and_outlives_the_tensor() {
    let t = Tensor::arange(12, (Kind::Float, Device::Cpu)).reshape([3, 4]);
    let m = to_dlpack(&t).unwrap();
    assert_eq!(m.view().data_ptr() as usize, t.data_ptr() as usize);
    assert_eq!(m.shape(), &[3, 4]);
    assert_eq!(m.strides(), &[4, 1]);
    drop(t);
    assert_eq!(m.view().as_slice::<f32>().unwrap()[11], 11.0, "storage kept alive by the DLPack owner");
}

#[test]
fn strides_and_storage_offset_survive_the_export() {
    let base = Tensor::arange(20, (Kind::Double, Device::Cpu)).reshape([4, 5]);
    let v = base.narrow(1, 1, 3).transpose(0, 1); // [3, 4], strides [1, 5], offset 1
    let m = to_dlpack(&v).unwrap();
    assert_eq!(m.shape(), &[3, 4]);
    assert_eq!(m.strides(), &[1, 5]);
    assert_eq!(m.view().data_ptr() as usize, base.data_ptr() as usize + 8);
    let vals: Vec<f64> = m.view().to_vec().unwrap();
    assert_eq!(vals[..4], [1.0, 6.0, 11.0, 16.0]);
}

struct CountOnDrop(Arc<AtomicUsize>, #[allow(dead_code)] Vec<f32>);
impl Drop for CountOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn dlpack_to_tch_is_zero_copy_and_the_deleter_runs_when_torch_frees_the_storage() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut data = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let ptr = data.as_mut_ptr();
    let owner = CountOnDrop(drops.clone(), data);
    // SAFETY: the Vec inside the owner holds 6 f32s and does not move with it.
    let m = unsafe { ManagedTensor::export_owner(owner, ptr.cast(), &TensorDesc::contiguous(DType::F32, &[2, 3])) }.unwrap();
    let t = from_dlpack(m).unwrap();
    assert_eq!(t.data_ptr() as usize, ptr as usize);
    assert_eq!(t.size(), [2, 3]);
    let view = t.narrow(1, 0, 2); // shares the storage
    drop(t);
    assert_eq!(drops.load(Ordering::SeqCst), 0, "a view still holds the storage");
    assert_eq!(view.sum(Kind::Float).double_value(&[]), 1.0 + 2.0 + 4.0 + 5.0);
    drop(view);
    assert_eq!(drops.load(Ordering::SeqCst), 1, "deleter ran exactly once, when torch freed the storage");
}

#[test]
fn arrays_and_tch_tensors_share_memory_both_ways() {
    let a = Array::from_slice(&[1.0f64, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let t = from_dlpack(a.t().unwrap().to_managed().unwrap()).unwrap();
    assert_eq!(t.data_ptr() as usize, a.data_ptr() as usize);
    assert_eq!(t.stride(), [1, 2]);
    assert_eq!(Vec::<f64>::try_from(t.flatten(0, -1)).unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
    let back = Array::from_managed(to_dlpack(&t).unwrap()).unwrap();
    assert_eq!(back.data_ptr(), a.data_ptr());
}

#[test]
fn every_kind_dlpack_expresses_round_trips() {
    let mut kinds = Vec::new();
    for name in ["f16", "bf16", "f32", "f64", "i8", "u8", "i16", "i32", "i64", "bool", "c64", "c128"] {
        // torch's own tensor of the kind the adapter names: its export must be `dtype`.
        let dtype: DType = name.parse().unwrap();
        let kind = kind_of(dtype).unwrap();
        assert!(!kinds.contains(&kind), "{dtype}: {kind:?} twice");
        kinds.push(kind);
        let t = Tensor::zeros([2, 3], (kind, Device::Cpu));
        let m = to_dlpack(&t).unwrap();
        assert_eq!(m.dtype(), dtype, "{kind:?}");
        let back = from_dlpack(m).unwrap();
        assert_eq!(back.kind(), kind);
        assert_eq!(back.data_ptr(), t.data_ptr());
    }
    for (kind, name) in [(Kind::Float8e4m3fn, "f8_e4m3fn"), (Kind::Float8e5m2, "f8_e5m2")] {
        let t = Tensor::zeros([4], (Kind::Float, Device::Cpu)).to_kind(kind);
        assert_eq!(to_dlpack(&t).unwrap().dtype().to_string(), name);
    }
}

#[test]
fn a_kernel_is_a_function_of_tch_tensors_with_scalars_in_the_same_list() {
    dlbridge_cpu::link();
    let x = Tensor::randn([8, 5], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([5, 3], (Kind::Float, Device::Cpu));
    let gelu = dlbridge_tch::kernel("gelu").unwrap();
    let y = gelu.call1(&x).unwrap();
    assert!(y.allclose(&x.gelu("none"), 1e-6, 1e-6, false));
    let h = dlbridge_tch::kernel("matmul").unwrap().call1((&x, &w)).unwrap();
    assert!(h.allclose(&x.matmul(&w), 1e-5, 1e-5, false));
    // axpy(alpha: f64, x: T[N], y: mut T[N]): a scalar first, an integer literal for it, y written in place.
    let (v, acc) = (Tensor::ones([4], (Kind::Float, Device::Cpu)), Tensor::zeros([4], (Kind::Float, Device::Cpu)));
    let acc_ptr = acc.data_ptr();
    dlbridge_tch::kernel("axpy").unwrap().call0((3i64, &v, &acc)).unwrap();
    assert_eq!(Vec::<f32>::try_from(&acc).unwrap(), [3.0; 4]);
    assert_eq!(acc.data_ptr(), acc_ptr, "written in place");
    // Mistakes name the kernel and the argument; `?` makes them tch errors too.
    let axpy = dlbridge_tch::kernel("axpy").unwrap();
    let e = axpy.call0((&v, &v, &acc)).unwrap_err().to_string();
    assert!(e.contains("axpy: argument alpha: expected a f64 scalar, got a tensor of shape [4]"), "{e}");
    let e = axpy.call0((2.0, &v)).unwrap_err().to_string();
    assert!(e.contains("axpy takes 3 arguments (alpha, x, y), got 2"), "{e}");
    let e = gelu.call0(&x).unwrap_err().to_string();
    assert!(e.contains("gelu: call0 is for kernels without outputs; this one has 1"), "{e}");
    let as_tch = || -> Result<Tensor, tch::TchError> { Ok(gelu.call1((&x, &x))?) };
    assert!(matches!(as_tch(), Err(tch::TchError::Torch(m)) if m.contains("gelu takes 1 arguments (x), got 2")));
    let e = dlbridge_tch::kernel("no_such_kernel").unwrap_err().to_string();
    assert!(e.contains("no kernel named `no_such_kernel`"), "{e}");
}

#[test]
fn kernels_run_on_tch_tensors_with_outputs_allocated_by_tch() {
    let reg = registry();
    let a = Tensor::randn([5, 7], (Kind::Float, Device::Cpu));
    let b = Tensor::randn([7, 3], (Kind::Float, Device::Cpu));
    let out = call(&reg.get("matmul").unwrap(), &[&a, &b], &[]).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].size(), [5, 3]);
    let diff = (&out[0] - a.matmul(&b)).abs().max().double_value(&[]);
    assert!(diff < 1e-5, "{diff}");
    // A strided (transposed) input and a zero-stride (expanded) one.
    let bias = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).expand([5, 3], false);
    let sum = call(&reg.get("add").unwrap(), &[&out[0], &bias], &[]).unwrap();
    assert!((&sum[0] - (&out[0] + &bias)).abs().max().double_value(&[]) < 1e-6);
}

#[test]
fn elementwise_outputs_allocated_by_tch_follow_the_inputs_layout_as_torch_does() {
    let reg = registry();
    let x = Tensor::randn([4, 6], (Kind::Float, Device::Cpu)).tr(); // [6, 4], strides [1, 6]
    let y = call(&reg.get("add").unwrap(), &[&x, &x], &[]).unwrap().remove(0);
    let want = &x + &x;
    assert_eq!(y.stride(), want.stride());
    assert_eq!(y.stride(), [1, 6]);
    assert!(y.equal(&want));
    let p = Tensor::randn([2, 3, 5], (Kind::Float, Device::Cpu)).permute([2, 0, 1]);
    let y = call(&reg.get("relu").unwrap(), &[&p], &[]).unwrap().remove(0);
    assert_eq!(y.stride(), p.relu().stride());
    assert!(y.equal(&p.relu()));
    // softmax's output is shaped like its input, so it follows it too (torch's own
    // softmax is row-major; the values are the same); matmul's is row-major.
    let s = call(&reg.get("softmax").unwrap(), &[&x], &[]).unwrap().remove(0);
    assert_eq!(s.stride(), [1, 6]);
    let want = x.softmax(-1, Kind::Float);
    assert!((&s - &want).abs().max().double_value(&[]) < 1e-6);
    let m = call(&reg.get("matmul").unwrap(), &[&x, &x.tr()], &[]).unwrap().remove(0);
    assert_eq!(m.stride(), [6, 1]);
}

#[test]
fn mut_params_and_given_outputs_are_written_in_place() {
    let reg = registry();
    let x = Tensor::from_slice(&[1.0f64, 2.0, 3.0]);
    let y = Tensor::from_slice(&[10.0f64, 10.0, 10.0]);
    let ptr = y.data_ptr();
    call(&reg.get("axpy").unwrap(), &[&x, &y], &[Scalar::F64(2.0)]).unwrap();
    assert_eq!(Vec::<f64>::try_from(&y).unwrap(), vec![12.0, 14.0, 16.0]);
    assert_eq!(y.data_ptr(), ptr);
    let out = Tensor::zeros([3], (Kind::Double, Device::Cpu));
    call_into(&reg.get("mul").unwrap(), &[&x, &x], &[], &[&out]).unwrap();
    assert_eq!(Vec::<f64>::try_from(&out).unwrap(), vec![1.0, 4.0, 9.0]);
}

#[test]
fn tensors_that_require_grad_are_refused() {
    let reg = registry();
    let a = Tensor::ones([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let e = call(&reg.get("relu").unwrap(), &[&a], &[]).unwrap_err();
    assert!(e.to_string().contains("relu: argument x: the tensor requires grad"), "{e}");
    assert!(to_dlpack(&a).is_err());
    assert!(call(&reg.get("relu").unwrap(), &[&a.detach()], &[]).is_ok());
}

#[test]
fn every_tensor_of_a_call_is_lent_at_once_and_a_refusal_names_its_slot() {
    let reg = registry();
    let add = reg.get("add").unwrap();
    let x = Tensor::ones([2], (Kind::Float, Device::Cpu));
    let grad = Tensor::zeros([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let e = call_into(&add, &[&x, &x], &[], &[&grad]).unwrap_err();
    assert!(e.to_string().starts_with("add: output out: the tensor requires grad"), "{e}");
    let q = Tensor::ones([2], (Kind::Float, Device::Cpu)).quantize_per_tensor(0.1, 0, Kind::QUInt8);
    let e = call(&add, &[&x, &q], &[]).unwrap_err();
    assert!(e.to_string().starts_with("add: argument b: ") && e.to_string().contains("quantized"), "{e}");
    let s = Tensor::eye(2, (Kind::Float, Device::Cpu)).to_sparse_sparse_dim(2);
    let e = call(&add, &[&s, &x], &[]).unwrap_err();
    assert!(e.to_string().starts_with("add: argument a: ") && e.to_string().contains("sparse"), "{e}");
    assert_eq!(e.kind(), ErrorKind::Buffer);
    // Refused tensors were neither read nor written; a valid call still runs.
    let out = Tensor::zeros([2], (Kind::Float, Device::Cpu));
    call_into(&add, &[&x, &x], &[], &[&out]).unwrap();
    assert_eq!(Vec::<f32>::try_from(&out).unwrap(), vec![2.0, 2.0]);
}

#[test]
fn the_tch_adapter_binds_one_tensor_at_a_time_as_call_into_does() {
    let reg = registry();
    let mul = reg.get("mul").unwrap();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
    let (a, b) = (Tensor::zeros([3], (Kind::Float, Device::Cpu)), Tensor::zeros([3], (Kind::Float, Device::Cpu)));
    call_into(&mul, &[&x, &x], &[], &[&a]).unwrap();
    let mut binding = mul.bind(&mut dlbridge_tch::Tch, dlbridge_registry::Args::split([&x, &x], &[], Some([&b]))).unwrap();
    binding.run(&mut dlbridge_tch::TchAllocator, std::ptr::null_mut()).unwrap();
    assert_eq!(Vec::<f32>::try_from(&a).unwrap(), vec![1.0, 4.0, 9.0]);
    assert!(a.equal(&b));
    let grad = Tensor::zeros([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let e = mul.bind(&mut dlbridge_tch::Tch, dlbridge_registry::Args::split([&x, &grad], &[], None::<[&Tensor; 0]>)).unwrap_err();
    assert!(e.to_string().starts_with("mul: argument b: the tensor requires grad"), "{e}");
}

#[test]
fn registry_kernels_called_from_tch_follow_torchs_thread_count() {
    use dlbridge_registry::threads::{global_num_threads, num_threads};
    let before = tch::get_num_threads();
    for n in [1, 2, 3] {
        tch::set_num_threads(n);
        let want = (n as usize).min(global_num_threads());
        assert_eq!(dlbridge_tch::with_torch_threads(num_threads), want, "torch at {n} threads");
    }
    tch::set_num_threads(before);
    // And the results do not depend on it (a kernel large enough to split).
    let reg = registry();
    let x = Tensor::randn([300, 400], (Kind::Float, Device::Cpu));
    let outs: Vec<Tensor> = [1, 2]
        .into_iter()
        .map(|n| {
            tch::set_num_threads(n);
            call(&reg.get("softmax").unwrap(), &[&x], &[]).unwrap().remove(0)
        })
        .collect();
    tch::set_num_threads(before);
    assert!(outs[0].equal(&outs[1]));
}

#[test]
fn quantized_and_sparse_tensors_are_refused() {
    let q = Tensor::ones([4], (Kind::Float, Device::Cpu)).quantize_per_tensor(0.1, 0, Kind::QUInt8);
    let e = to_dlpack(&q).unwrap_err();
    assert!(e.to_string().contains("quantized"), "{e}");
    let s = Tensor::eye(3, (Kind::Float, Device::Cpu)).to_sparse_sparse_dim(2);
    let e = to_dlpack(&s).unwrap_err();
    assert!(e.to_string().contains("sparse"), "{e}");
    assert_eq!(e.kind(), ErrorKind::Buffer);
}

#[test]
fn read_only_dlpack_tensors_are_refused_by_tch() {
    let m = ManagedTensor::from_arc(Arc::from(vec![1.0f32, 2.0]), &[2]).unwrap();
    let e = from_dlpack(m).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Buffer);
}

#[test]
fn a_device_the_kernel_does_not_serve_is_an_error() {
    let reg = Registry::new();
    reg.register(KernelDef {
        signature: "gpu_only(x: f32[N]) -> (y: f32[N])".into(),
        device: dlbridge_core::DeviceType::CUDA,
        imp: Impl::Dyn(Arc::new(|_: &mut Call<'_, '_>| Ok(()))),
        opts: KernelOpts::DEFAULT,
        origin: "test".into(),
        doc: String::new(),
        identity: String::new(),
    })
    .unwrap();
    let x = Tensor::ones([2], (Kind::Float, Device::Cpu));
    let e = call(&reg.get("gpu_only").unwrap(), &[&x], &[]).unwrap_err();
    assert_eq!(e.to_string(), "unsupported device cpu: gpu_only runs on cuda");
}

#[test]
fn wrong_argument_counts_are_errors() {
    let reg = registry();
    let x = Tensor::ones([2], (Kind::Float, Device::Cpu));
    let e = call(&reg.get("axpy").unwrap(), &[&x, &x], &[]).unwrap_err();
    assert_eq!(e.to_string(), "axpy: expected 2 tensors and 1 scalars, got 2 and 0");
    let e = call(&reg.get("axpy").unwrap(), &[&x, &x], &[Scalar::I64(1)]).unwrap_err();
    assert!(e.to_string().contains("expected a f64 scalar"), "{e}");
}

#[test]
#[cfg_attr(not(feature = "cuda-tests"), ignore = "needs a CUDA device: run with --features cuda-tests on a GPU machine")]
fn cuda_tensors_round_trip_with_zero_copies() {
    assert!(tch::Cuda::is_available(), "cuda-tests enabled but torch sees no CUDA device");
    let t = Tensor::ones([3], (Kind::Float, Device::Cuda(0)));
    let m = to_dlpack(&t).unwrap();
    assert_eq!(m.device(), dlbridge_core::Device::cuda(0));
    let back = from_dlpack(m).unwrap();
    assert_eq!(back.data_ptr(), t.data_ptr());
}

/// The registry with the CUDA implementations of the built-in kernels linked in.
fn registry_with_cuda() -> &'static Registry {
    dlbridge::registry()
}

fn cuda_or_skip() -> bool {
    if !tch::Cuda::is_available() {
        eprintln!("skipped: torch sees no CUDA device (tch::Cuda::is_available() is false)");
        return false;
    }
    if let Some(reason) = dlbridge::cuda::skip_reason() {
        eprintln!("skipped: {reason}");
        return false;
    }
    true
}

#[test]
fn registry_kernels_run_on_cuda_tensors_on_torchs_stream_with_zero_copies() {
    if !cuda_or_skip() {
        return;
    }
    let reg = registry_with_cuda();
    let x = Tensor::randn([300, 64], (Kind::Float, Device::Cuda(0)));
    let y = call(&reg.get("add").unwrap(), &[&x, &x], &[]).unwrap().remove(0);
    assert_eq!(y.device(), Device::Cuda(0));
    assert!(y.allclose(&(&x * 2.0), 0.0, 0.0, false));
    // Destination passing into a torch CUDA tensor: written in place, no copy.
    let out = x.empty_like();
    let ptr = out.data_ptr();
    call_into(&reg.get("relu").unwrap(), &[&x], &[], &[&out]).unwrap();
    assert_eq!(out.data_ptr(), ptr);
    assert!(out.allclose(&x.relu(), 0.0, 0.0, false));
    // A transposed operand, and the result read back through torch.
    let s = call(&reg.get("softmax").unwrap(), &[&x.tr().contiguous()], &[]).unwrap().remove(0);
    assert!(s.allclose(&x.tr().softmax(-1, Kind::Float), 1e-5, 1e-6, false));
}

#[test]
fn a_cpu_and_a_cuda_tch_tensor_are_refused() {
    if !cuda_or_skip() {
        return;
    }
    let reg = registry_with_cuda();
    let (a, b) = (Tensor::ones([3], (Kind::Float, Device::Cpu)), Tensor::ones([3], (Kind::Float, Device::Cuda(0))));
    let e = call(&reg.get("add").unwrap(), &[&a, &b], &[]).unwrap_err().to_string();
    assert!(e.contains("cpu") && e.contains("cuda"), "{e}");
}

#[test]
fn a_tensor_comprehension_is_a_function_of_tch_tensors() {
    let defs = dlbridge::compile::tc::define_in(
        dlbridge::registry(),
        "def tch_fcrelu(float(B,M) I, float(N,M) W1, float(N) B1) -> (O1) {\n  O1(b, n) +=! I(b, m) * W1(n, m)\n  O1(b, n) = O1(b, n) + B1(n)\n  O1(b, n) = fmax(O1(b, n), 0)\n}",
    )
    .unwrap();
    let name = defs[0].registered.name().to_owned();
    let fc = dlbridge_tch::kernel(&name).unwrap();
    let (x, w, b) = (
        Tensor::randn([4, 6], (Kind::Float, Device::Cpu)),
        Tensor::randn([5, 6], (Kind::Float, Device::Cpu)),
        Tensor::randn([5], (Kind::Float, Device::Cpu)),
    );
    let y = fc.call1((&x, &w, &b)).unwrap();
    let want = x.matmul(&w.tr()).g_add(&b).relu();
    assert_eq!(y.size(), vec![4, 5]);
    assert!(y.allclose(&want, 1e-5, 1e-5, false));
}

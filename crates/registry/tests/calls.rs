//! Every call is checked against its signature before the kernel runs; a
//! mismatch names the kernel, the argument, what was expected and what came,
//! and nothing is written.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dlbridge_array::Array;
use dlbridge_core::testing::{Fields, ForeignTensor};
use dlbridge_core::{DType, DeviceType, ErrorKind, ManagedTensor, TensorViewMut};
use dlbridge_registry::{Arg, Call, Impl, KernelDef, KernelOpts, Registry};

/// Registers `sig` with an implementation that counts its runs and writes 1s into every output.
fn counting(reg: &Registry, sig: &str, opts: KernelOpts) -> Arc<AtomicUsize> {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    reg.register(KernelDef {
        signature: sig.into(),
        device: DeviceType::CPU,
        imp: Impl::Dyn(Arc::new(move |call: &mut Call<'_, '_>| {
            r.fetch_add(1, Ordering::SeqCst);
            let (_, outs) = call.split();
            for o in outs.iter_mut() {
                if o.dtype() == DType::F32 {
                    o.iter_mut::<f32>()?.for_each(|v| *v = 1.0);
                }
            }
            Ok(())
        })),
        opts,
        origin: "test".into(),
        doc: String::new(),
        identity: String::new(),
    })
    .unwrap();
    runs
}

fn zeros(shape: &[i64]) -> Array {
    Array::zeros(DType::F32, shape).unwrap()
}

#[test]
fn dim_mismatch_names_kernel_argument_symbol_and_binder() {
    let reg = Registry::new();
    let runs = counting(&reg, "matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])", KernelOpts::DEFAULT);
    let (a, b, mut c) = (zeros(&[2, 3]), zeros(&[4, 5]), zeros(&[2, 5]));
    let k = reg.get("matmul").unwrap();
    let e = k.call(&mut [Arg::Tensor(a.view()), Arg::Tensor(b.view())], &mut [c.view_mut().unwrap()]).unwrap_err();
    assert_eq!(e.to_string(), "matmul: argument b: dim K = 3 (bound by a) but got 4");
    assert_eq!(e.kind(), ErrorKind::Value);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(c.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0), "nothing written");
}

#[test]
fn wrong_dtype_is_a_type_error_naming_the_allowed_set() {
    let reg = Registry::new();
    counting(&reg, "matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])", KernelOpts::DEFAULT);
    let a = Array::zeros(DType::I32, &[2, 2]).unwrap();
    let b = zeros(&[2, 2]);
    let k = reg.get("matmul").unwrap();
    let e = k.prepare_outputs(&[Arg::Tensor(a.view()), Arg::Tensor(b.view())]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Type);
    assert_eq!(e.to_string(), "matmul: argument a: dtype mismatch: expected T (one of f32, f64), got i32");
    let a = Array::zeros(DType::F64, &[2, 2]).unwrap();
    let e = k.prepare_outputs(&[Arg::Tensor(a.view()), Arg::Tensor(b.view())]).unwrap_err();
    assert_eq!(e.to_string(), "matmul: argument b: dtype mismatch: expected T = f64 (bound by a), got f32");
}

#[test]
fn wrong_rank_and_fixed_dims_are_refused() {
    let reg = Registry::new();
    counting(&reg, "rgb(img: u8[H, W, 3]) -> (gray: u8[H, W])", KernelOpts::DEFAULT);
    let k = reg.get("rgb").unwrap();
    let a = Array::zeros(DType::U8, &[4, 4]).unwrap();
    let e = k.prepare_outputs(&[Arg::Tensor(a.view())]).unwrap_err();
    assert_eq!(e.to_string(), "rgb: argument img: expected 3 dims [H, W, 3] but got 2 dims [4, 4]");
    let a = Array::zeros(DType::U8, &[4, 4, 4]).unwrap();
    let e = k.prepare_outputs(&[Arg::Tensor(a.view())]).unwrap_err();
    assert_eq!(e.to_string(), "rgb: argument img: dim 2 must be 3 but got 4");
}

#[test]
fn rest_groups_bind_as_a_whole() {
    let reg = Registry::new();
    counting(&reg, "add<T: f32>(a: T[...S], b: T[...S]) -> (out: T[...S])", KernelOpts::ELEMENTWISE);
    let k = reg.get("add").unwrap();
    let (a, b) = (zeros(&[2, 3, 4]), zeros(&[2, 3, 5]));
    let e = k.prepare_outputs(&[Arg::Tensor(a.view()), Arg::Tensor(b.view())]).unwrap_err();
    assert_eq!(e.to_string(), "add: argument b: ...S = [2, 3, 4] (bound by a) but got [2, 3, 5]");
    let specs = k.prepare_outputs(&[Arg::Tensor(a.view()), Arg::Tensor(a.view())]).unwrap();
    assert_eq!(specs[0].shape.as_slice(), &[2, 3, 4]);
    let s = zeros(&[]);
    let specs = k.prepare_outputs(&[Arg::Tensor(s.view()), Arg::Tensor(s.view())]).unwrap();
    assert!(specs[0].shape.is_empty(), "0-d tensors bind an empty group");
}

#[test]
fn prepare_outputs_gives_shape_dtype_and_device() {
    let reg = Registry::new();
    counting(&reg, "softmax<T: f32|f64>(x: T[...B, N]) -> (y: T[...B, N], lse: f64[...B])", KernelOpts::DEFAULT);
    let x = Array::zeros(DType::F32, &[2, 3, 7]).unwrap();
    let specs = reg.get("softmax").unwrap().prepare_outputs(&[Arg::Tensor(x.view())]).unwrap();
    assert_eq!(specs.len(), 2);
    assert_eq!((specs[0].shape.as_slice(), specs[0].dtype), (&[2i64, 3, 7][..], DType::F32));
    assert_eq!((specs[1].shape.as_slice(), specs[1].dtype), (&[2i64, 3][..], DType::F64));
    assert_eq!(specs[1].device, dlbridge_core::Device::CPU);
    assert_eq!(specs[1].to_string(), "lse: f64[2, 3] on cpu");
    let e = reg.get("softmax").unwrap().prepare_outputs(&[Arg::Tensor(zeros(&[]).view())]).unwrap_err();
    assert!(e.to_string().contains("expected at least 1 dims"), "{e}");
}

#[test]
fn outputs_are_checked_too() {
    let reg = Registry::new();
    let runs = counting(&reg, "relu<T: f32>(x: T[...S]) -> (y: T[...S])", KernelOpts::ELEMENTWISE);
    let x = zeros(&[3]);
    let mut y = zeros(&[4]);
    let e = reg.call("relu", &mut [Arg::Tensor(x.view())], &mut [y.view_mut().unwrap()]).unwrap_err();
    assert_eq!(e.to_string(), "relu: output y: ...S = [3] (bound by x) but got [4]");
    let mut y64 = Array::zeros(DType::F64, &[3]).unwrap();
    let e = reg.call("relu", &mut [Arg::Tensor(x.view())], &mut [y64.view_mut().unwrap()]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Type);
    let e = reg.call("relu", &mut [Arg::Tensor(x.view())], &mut []).unwrap_err();
    assert_eq!(e.to_string(), "relu: expected 1 outputs (y) but got 0");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[test]
fn argument_count_and_kinds_are_checked() {
    let reg = Registry::new();
    counting(&reg, "axpy<T: f32>(alpha: f64, x: T[N], y: mut T[N])", KernelOpts::DEFAULT);
    let k = reg.get("axpy").unwrap();
    let x = zeros(&[3]);
    let mut y = zeros(&[3]);
    let e = k.call(&mut [Arg::f64(1.0), Arg::Tensor(x.view())], &mut []).unwrap_err();
    assert_eq!(e.to_string(), "axpy: expected 3 arguments (alpha, x, y) but got 2");
    let e = k.call(&mut [Arg::i64(1), Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap_err();
    assert_eq!(e.to_string(), "axpy: argument alpha: expected a f64 scalar but got i64 1");
    let e = k.call(&mut [Arg::f64(1.0), Arg::f64(2.0), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap_err();
    assert_eq!(e.to_string(), "axpy: argument x: expected a tensor [N] but got f64 2");
}

#[test]
fn read_only_tensor_in_a_mut_slot_is_refused_and_not_written() {
    let reg = Registry::new();
    let runs = counting(&reg, "axpy<T: f32>(alpha: f64, x: T[N], y: mut T[N])", KernelOpts::DEFAULT);
    let k = reg.get("axpy").unwrap();
    let x = zeros(&[3]);
    let y = zeros(&[3]);
    // A read-only view passed where the kernel writes.
    let e = k.call(&mut [Arg::f64(1.0), Arg::Tensor(x.view()), Arg::Tensor(y.view())], &mut []).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Buffer);
    assert!(e.to_string().starts_with("axpy: argument y:"), "{e}");
    assert!(e.to_string().contains("read-only"), "{e}");
    // A READ_ONLY foreign tensor cannot even become a writable view.
    let mut foreign = ForeignTensor::new(&Fields { flags: 1, ..Fields::f32(&[3]) });
    // SAFETY: the ForeignTensor outlives the ManagedTensor.
    let mut t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    assert!(t.view_mut().is_err());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A hand-made CPU view of `shape` elements of `dtype` at `ptr`: several may
/// alias one buffer, as the Python layer's views of aliasing tensors do.
///
/// # Safety
/// `ptr` addresses `shape`'s elements of `dtype`, alive while the view is used.
unsafe fn raw_view<'a>(ptr: *const u8, shape: &'a [i64], dtype: DType) -> dlbridge_core::TensorView<'a> {
    let (device, flags) = (dlbridge_core::Device::CPU, dlbridge_core::Flags::empty());
    // SAFETY: the caller's contract.
    unsafe { dlbridge_core::TensorView::from_raw_parts(ptr.cast(), 0, shape, None, dtype, device, flags) }.unwrap()
}

#[test]
fn an_output_over_an_input_of_another_width_is_refused_as_overlapping() {
    let reg = Registry::new();
    let runs = counting(&reg, "widen(x: f32[...S]) -> (y: f64[...S])", KernelOpts::ELEMENTWISE);
    counting(&reg, "same(x: f32[...S]) -> (y: i32[...S])", KernelOpts::ELEMENTWISE);
    let mut buf = vec![0f64; 4];
    let ptr = buf.as_mut_ptr().cast::<u8>();
    let shape = [4i64];
    // Same address, shape and element strides; f32 input, f64 output: the output's
    // bytes cover twice the input's, so writing y[0] overwrites x[0] and x[1].
    // SAFETY: `buf` (32 bytes) holds 4 elements of either width and lives for the
    // test; the registry refuses the overlapping call before any write.
    let view = |dtype: DType| unsafe { raw_view(ptr, &shape, dtype) };
    // SAFETY: as above.
    let view_mut = |dtype: DType| unsafe { TensorViewMut::from_view(view(dtype)) }.unwrap();
    let widen = reg.get("widen").unwrap();
    let e = widen.call(&mut [Arg::Tensor(view(DType::F32))], &mut [view_mut(DType::F64)]).unwrap_err();
    assert_eq!(e.to_string(), "widen: output y: overlaps argument x in memory (only an output that is exactly an input is allowed)");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    // The same bytes under another dtype of the same width are exactly the input.
    let same = reg.get("same").unwrap();
    same.call(&mut [Arg::Tensor(view(DType::F32))], &mut [view_mut(DType::I32)]).unwrap();
}

#[test]
fn overlapping_output_is_refused_unless_exactly_an_input_of_an_elementwise_kernel() {
    let reg = Registry::new();
    let runs = counting(&reg, "add<T: f32>(a: T[...S], b: T[...S]) -> (out: T[...S])", KernelOpts::ELEMENTWISE);
    counting(&reg, "mm<T: f32>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])", KernelOpts::DEFAULT);
    let mut buf = vec![0f32; 8];
    let shape = [4i64];
    let ptr = buf.as_mut_ptr();
    // Views made by hand over one buffer (as the Python layer would from aliasing tensors).
    // SAFETY: `buf` lives for the test; the registry refuses the call before any
    // write when views overlap, and only the exact-alias case is written.
    let view = |off: usize| unsafe { raw_view(ptr.add(off).cast(), &shape, DType::F32) };
    let view_mut = |off: usize| {
        // SAFETY: as above.
        unsafe { TensorViewMut::from_view(view(off)) }.unwrap()
    };
    let add = reg.get("add").unwrap();
    let e = add.call(&mut [Arg::Tensor(view(0)), Arg::Tensor(view(4))], &mut [view_mut(2)]).unwrap_err();
    assert_eq!(e.to_string(), "add: output out: overlaps argument a in memory (only an output that is exactly an input is allowed)");
    // The kernel and the slot are structure, not text.
    assert_eq!(e.slot(), Some(("add", &dlbridge_core::Slot::Output("out".into()))));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    add.call(&mut [Arg::Tensor(view(0)), Arg::Tensor(view(4))], &mut [view_mut(0)]).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "exact alias: runs in place");
    let sq = [2i64, 2];
    // SAFETY: as above.
    let m = |off: usize| unsafe { raw_view(ptr.add(off).cast(), &sq, DType::F32) };
    // SAFETY: as above.
    let mm_out = unsafe { TensorViewMut::from_view(m(0)) }.unwrap();
    let e = reg.get("mm").unwrap().call(&mut [Arg::Tensor(m(0)), Arg::Tensor(m(4))], &mut [mm_out]).unwrap_err();
    assert!(e.to_string().contains("does not allow aliasing"), "{e}");
    drop(buf);
}

#[test]
fn contiguous_kernels_refuse_strided_tensors_clearly() {
    let reg = Registry::new();
    let runs = counting(&reg, "scan(x: f32[N, M]) -> (y: f32[N, M])", KernelOpts { contiguous: true, ..KernelOpts::DEFAULT });
    let x = zeros(&[3, 2]).t().unwrap();
    let k = reg.get("scan").unwrap();
    let mut y = zeros(&[2, 3]);
    let e = k.call(&mut [Arg::Tensor(x.view())], &mut [y.view_mut().unwrap()]).unwrap_err();
    assert!(e.to_string().starts_with("scan: argument x: this kernel needs a contiguous"), "{e}");
    assert_eq!(e.slot(), Some(("scan", &dlbridge_core::Slot::Argument("x".into()))));
    assert!(matches!(e.root(), dlbridge_core::Error::NotContiguous { .. }), "{e:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let xc = x.contiguous().unwrap();
    k.call(&mut [Arg::Tensor(xc.view())], &mut [y.view_mut().unwrap()]).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn device_the_kernel_does_not_serve_is_refused() {
    let reg = Registry::new();
    counting(&reg, "relu(x: f32[N]) -> (y: f32[N])", KernelOpts::DEFAULT);
    let mut foreign = ForeignTensor::new(&Fields { device: (2, 0), ..Fields::f32(&[3]) });
    // SAFETY: the ForeignTensor outlives the ManagedTensor; CUDA memory is never read here.
    let t = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned_ptr()) }.unwrap();
    let mut f2 = ForeignTensor::new(&Fields { device: (2, 0), ..Fields::f32(&[3]) });
    // SAFETY: as above.
    let mut o = unsafe { ManagedTensor::from_raw_versioned(f2.versioned_ptr()) }.unwrap();
    let e = reg.call("relu", &mut [Arg::Tensor(t.view().clone())], &mut [o.view_mut().unwrap()]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Buffer);
    assert_eq!(e.to_string(), "unsupported device cuda:0: relu runs on cpu");
    // Mixed devices are refused at the argument that differs.
    let cpu = zeros(&[3]);
    let mut y = zeros(&[3]);
    let e = reg.call("relu", &mut [Arg::Tensor(t.view().clone())], &mut [y.view_mut().unwrap()]).unwrap_err();
    assert!(e.to_string().starts_with("relu: output y: unsupported device cpu: x is on cuda:0"), "{e}");
    drop(cpu);
}

#[test]
fn duplicates_are_errors_and_new_devices_extend_a_kernel() {
    let reg = Registry::new();
    counting(&reg, "k(x: f32[N]) -> (y: f32[N])", KernelOpts::DEFAULT);
    let def = |sig: &str, dev: DeviceType| KernelDef {
        signature: sig.into(),
        device: dev,
        imp: Impl::Dyn(Arc::new(|_: &mut Call<'_, '_>| Ok(()))),
        opts: KernelOpts::DEFAULT,
        origin: "second".into(),
        doc: String::new(),
        identity: String::new(),
    };
    let e = reg.register(def("k(x: f32[N]) -> (y: f32[N])", DeviceType::CPU)).unwrap_err();
    assert_eq!(e.to_string(), "kernel k on cpu is registered twice: by test and by second");
    let e = reg.register(def("k(x: f64[N]) -> (y: f64[N])", DeviceType::CUDA)).unwrap_err();
    assert!(e.to_string().contains("already registered with signature"), "{e}");
    let k = reg.register(def("k(x: f32[N]) -> (y: f32[N])", DeviceType::CUDA)).unwrap();
    assert_eq!(k.devices().collect::<Vec<_>>(), vec![DeviceType::CPU, DeviceType::CUDA]);
    assert_eq!(reg.list().len(), 1);
}

#[test]
fn unknown_kernel_is_not_found_with_suggestions() {
    let reg = Registry::new();
    counting(&reg, "matmul(a: f32[M, K], b: f32[K, N]) -> (c: f32[M, N])", KernelOpts::DEFAULT);
    let e = reg.get("matmu").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("did you mean matmul"), "{e}");
}

#[test]
fn a_panicking_kernel_becomes_an_error() {
    let reg = Registry::new();
    reg.register(KernelDef::cpu("boom(x: f32[N])", |_: &mut Call<'_, '_>| panic!("kaboom"))).unwrap();
    let x = zeros(&[1]);
    let e = reg.call("boom", &mut [Arg::Tensor(x.view())], &mut []).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Runtime);
    assert_eq!(e.to_string(), "boom: kernel panicked: kaboom");
}

#[test]
fn kernel_errors_carry_the_kernel_name() {
    let reg = Registry::new();
    reg.register(KernelDef::cpu("fails(x: f32[N])", |_: &mut Call<'_, '_>| Err(dlbridge_core::Error::Runtime("out of cheese".into()))))
        .unwrap();
    let x = zeros(&[1]);
    let e = reg.call("fails", &mut [Arg::Tensor(x.view())], &mut []).unwrap_err();
    assert_eq!(e.to_string(), "fails: out of cheese");
}

#[test]
fn registry_and_kernels_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Registry>();
    check::<dlbridge_registry::Kernel>();
    check::<Arc<dlbridge_registry::Kernel>>();
}

#[test]
fn dim_expressions_shape_outputs_and_check_given_ones() {
    let reg = Registry::new();
    let runs = counting(&reg, "valid<T: f32>(x: T[H], w: T[KH], g: T[(H - KH + 1)]) -> (y: T[(H - KH + 1)])", KernelOpts::DEFAULT);
    let k = reg.get("valid").unwrap();
    let (x, w, g) = (zeros(&[7]), zeros(&[3]), zeros(&[5]));
    let specs = k.prepare_outputs(&[Arg::Tensor(x.view()), Arg::Tensor(w.view()), Arg::Tensor(g.view())]).unwrap();
    assert_eq!(&specs[0].shape[..], &[5]);
    // An input of the wrong computed size, and an output given with one.
    let bad = zeros(&[4]);
    let e = k.prepare_outputs(&[Arg::Tensor(x.view()), Arg::Tensor(w.view()), Arg::Tensor(bad.view())]).unwrap_err();
    assert_eq!(e.to_string(), "valid: argument g: dim 0 must be (H - KH + 1) = 5 but got 4");
    let mut y = zeros(&[6]);
    let e = k.call(&mut [Arg::Tensor(x.view()), Arg::Tensor(w.view()), Arg::Tensor(g.view())], &mut [y.view_mut().unwrap()]).unwrap_err();
    assert_eq!(e.to_string(), "valid: output y: dim 0 must be (H - KH + 1) = 5 but got 6");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // A kernel larger than the input: the output's size is named with the sizes it came from.
    counting(&reg, "valid2<T: f32>(x: T[H], w: T[KH]) -> (y: T[(H - KH + 1)])", KernelOpts::DEFAULT);
    let small = zeros(&[1]);
    let e = reg.get("valid2").unwrap().prepare_outputs(&[Arg::Tensor(small.view()), Arg::Tensor(w.view())]).unwrap_err();
    assert_eq!(e.to_string(), "valid2: output y: dim (H - KH + 1) is -1, below 0 with H = 1, KH = 3: the inputs are too small for it");
}

mod traced {
    //! A call known by layout only (`Kernel::check_meta`): its answers against a
    //! table written by hand from each signature's meaning.
    use dlbridge_core::{DType, Device, DeviceType};
    use dlbridge_registry::{Call, DimOp, DimOrigin, KernelDef, KernelOpts, MetaArg, Registry, TensorMeta};

    fn t<'a>(shape: &'a [i64], strides: &'a [i64]) -> MetaArg<'a> {
        MetaArg::Tensor(TensorMeta { shape, strides, dtype: DType::F32, device: Device::CPU })
    }

    fn kernel(sig: &str, opts: KernelOpts) -> std::sync::Arc<dlbridge_registry::Kernel> {
        let reg = Registry::new();
        reg.register(KernelDef { opts, ..KernelDef::cpu(sig, |_: &mut Call<'_, '_>| Ok(())) }).unwrap()
    }

    fn input(arg: usize, axis: usize) -> DimOrigin {
        DimOrigin::Input { arg, axis }
    }

    #[test]
    fn output_dims_name_the_argument_dims_they_come_from() {
        let k = kernel("mm(a: f32[M, K], b: f32[K, N]) -> (c: f32[M, N])", KernelOpts::DEFAULT);
        let out = k.check_meta(&[t(&[3, 4], &[4, 1]), t(&[4, 5], &[5, 1])]).unwrap();
        assert_eq!(out[0].spec.shape.as_slice(), &[3, 5]);
        assert_eq!(out[0].dims.as_slice(), &[input(0, 0), input(1, 1)]);
        let e = k.check_meta(&[t(&[3, 4], &[4, 1]), t(&[5, 2], &[2, 1])]).unwrap_err().to_string();
        assert_eq!(e, "mm: argument b: dim K = 4 (bound by a) but got 5");

        // A group after a fixed dim: its dims are the argument's, shifted.
        let k = kernel("red(x: f32[2, ...B, N]) -> (y: f32[...B])", KernelOpts::DEFAULT);
        let out = k.check_meta(&[t(&[2, 6, 7, 3], &[126, 21, 3, 1])]).unwrap();
        assert_eq!(out[0].dims.as_slice(), &[input(0, 1), input(0, 2)]);

        // A dim expression: arithmetic on the argument dims of its symbols.
        let k = kernel("conv(x: f32[H], w: f32[K]) -> (y: f32[(H - K + 1)])", KernelOpts::DEFAULT);
        let out = k.check_meta(&[t(&[9], &[1]), t(&[4], &[1])]).unwrap();
        assert_eq!(out[0].spec.shape.as_slice(), &[6]);
        let want = DimOrigin::Op(
            DimOp::Add,
            Box::new(DimOrigin::Op(DimOp::Sub, Box::new(input(0, 0)), Box::new(input(1, 0)))),
            Box::new(DimOrigin::Fixed(1)),
        );
        assert_eq!(out[0].dims.as_slice(), &[want]);
        let e = k.check_meta(&[t(&[2], &[1]), t(&[4], &[1])]).unwrap_err().to_string();
        assert!(e.contains("dim (H - K + 1) is -1, below 0 with H = 2, K = 4"), "{e}");
    }

    #[test]
    fn a_broadcast_dim_comes_from_the_first_argument_that_has_its_size() {
        let k = kernel("add(x: f32[*S], y: f32[*S]) -> (z: f32[*S])", KernelOpts::ELEMENTWISE);
        // [3, 1] with [4]: NumPy's [3, 4], the 3 from x, the 4 from y.
        let out = k.check_meta(&[t(&[3, 1], &[1, 1]), t(&[4], &[1])]).unwrap();
        assert_eq!(out[0].spec.shape.as_slice(), &[3, 4]);
        assert_eq!(out[0].dims.as_slice(), &[input(0, 0), input(1, 0)]);
        // [1] with [2, 1]: [2, 1], the 2 from y, the 1 a fixed 1.
        let out = k.check_meta(&[t(&[1], &[1]), t(&[2, 1], &[1, 1])]).unwrap();
        assert_eq!(out[0].dims.as_slice(), &[input(1, 0), DimOrigin::Fixed(1)]);
        let e = k.check_meta(&[t(&[3], &[1]), t(&[4], &[1])]).unwrap_err().to_string();
        assert!(e.contains("add: argument y: shape [4] does not broadcast with [3]"), "{e}");
    }

    #[test]
    fn outputs_follow_the_inputs_memory_order_from_the_strides_given() {
        let k = kernel("relu(x: f32[...S]) -> (y: f32[...S])", KernelOpts::ELEMENTWISE);
        // x is a transpose: (4, 3) with strides (1, 4), dim 1 outermost.
        let out = k.check_meta(&[t(&[4, 3], &[1, 4])]).unwrap();
        assert_eq!(out[0].spec.order.as_slice(), &[1, 0]);
        assert_eq!(out[0].spec.strides().as_slice(), &[1, 4]);
        let out = k.check_meta(&[t(&[4, 3], &[3, 1])]).unwrap();
        assert!(out[0].spec.order.is_empty());
        // A kernel that allocates row-major outputs does so whatever the inputs.
        let k = kernel("copy(x: f32[...S]) -> (y: f32[...S])", KernelOpts { row_major_outputs: true, ..KernelOpts::DEFAULT });
        assert!(k.check_meta(&[t(&[4, 3], &[1, 4])]).unwrap()[0].spec.order.is_empty());
    }

    #[test]
    fn layouts_devices_and_shape_rules_are_checked_as_a_call_checks_them() {
        let k = kernel("axpy(x: f32[N], y: mut f32[N])", KernelOpts::DEFAULT);
        let e = k.check_meta(&[t(&[3], &[1]), t(&[3], &[0])]).unwrap_err().to_string();
        assert_eq!(e, "axpy: argument y: writable view: shape [3] strides [0] map several elements to the same memory");
        assert!(k.check_meta(&[t(&[3], &[0]), t(&[3], &[2])]).unwrap().is_empty());
        let cuda =
            MetaArg::Tensor(TensorMeta { shape: &[3], strides: &[1], dtype: DType::F32, device: Device { kind: DeviceType::CUDA, id: 0 } });
        let e = k.check_meta(&[t(&[3], &[1]), cuda]).unwrap_err().to_string();
        assert!(e.contains("argument y") && e.contains("x is on cpu; all tensors must share one device"), "{e}");

        let k = kernel("dense(x: f32[N]) -> (y: f32[N])", KernelOpts { contiguous: true, ..KernelOpts::DEFAULT });
        let e = k.check_meta(&[t(&[3], &[2])]).unwrap_err().to_string();
        assert!(e.starts_with("dense: argument x:") && e.contains("contiguous"), "{e}");

        let k = kernel("rsum(x: f32[...S], y: mut f32[...O])", KernelOpts { kept_leading_dims: true, ..KernelOpts::DEFAULT });
        assert!(k.check_meta(&[t(&[2, 3], &[3, 1]), t(&[2], &[1])]).is_ok());
        let e = k.check_meta(&[t(&[2, 3], &[3, 1]), t(&[3], &[1])]).unwrap_err().to_string();
        assert_eq!(
            e,
            "rsum: output `y` has shape [3]; it must be the kept (leading) dims of the input shape [2, 3], the reduced axes last"
        );
    }
}

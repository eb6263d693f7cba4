//! ElementwiseKernel / ReductionKernel on a real GPU: the CUDA implementation
//! runs on device memory and agrees with the CPU backend (bit for bit for
//! elementwise kernels, within rounding for float reductions), with
//! broadcast, strided and transposed operands, raw arguments, in-place
//! writes and empty tensors. Without a CUDA driver and device each test
//! prints `skipped: <reason>` and returns.

use std::sync::Arc;

use dlbridge_array::Array;
use dlbridge_compile::{ElementwiseKernel, ElementwiseOptions, Reduction, ReductionKernel};
use dlbridge_core::{DType, ErrorKind};
use dlbridge_cuda::{CudaArray, CudaDevice};
use dlbridge_registry::{Arg, Kernel, Registry};

fn device_or_skip() -> Option<Arc<CudaDevice>> {
    if let Some(reason) = dlbridge_cuda::skip_reason() {
        eprintln!("skipped: {reason}");
        return None;
    }
    Some(CudaDevice::get(0).expect("a device the driver reports"))
}

/// Deterministic values of every dtype (small, so integer products do not overflow).
fn values(dtype: DType, shape: &[i64], seed: u64) -> Array {
    let n: i64 = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let raw: Vec<i64> = (0..n).map(|_| (next() % 23) as i64 - 11).collect();
    match dtype {
        DType::F32 => Array::from_slice(&raw.iter().map(|&v| v as f32 * 0.37).collect::<Vec<_>>(), shape),
        DType::F64 => Array::from_slice(&raw.iter().map(|&v| v as f64 * 0.37).collect::<Vec<_>>(), shape),
        DType::I32 => Array::from_slice(&raw.iter().map(|&v| v as i32).collect::<Vec<_>>(), shape),
        DType::I64 => Array::from_slice(&raw.clone(), shape),
        DType::U8 => Array::from_slice(&raw.iter().map(|&v| (v + 11) as u8).collect::<Vec<_>>(), shape),
        DType::I8 => Array::from_slice(&raw.iter().map(|&v| v as i8).collect::<Vec<_>>(), shape),
        DType::U64 => Array::from_slice(&raw.iter().map(|&v| (v + 11) as u64).collect::<Vec<_>>(), shape),
        DType::BOOL => Array::from_bytes(DType::BOOL, shape, &raw.iter().map(|&v| u8::from(v > 0)).collect::<Vec<_>>()),
        other => panic!("{other}"),
    }
    .unwrap()
}

fn bytes(a: &Array) -> Vec<u8> {
    a.view().as_bytes().unwrap().to_vec()
}

/// Runs `kernel` on host arrays (CPU) and on their device copies (CUDA) and
/// returns both outputs. Reductions take their outputs as `mut` arguments.
fn both(dev: &Arc<CudaDevice>, kernel: &Kernel, inputs: &[&Array], outs: &[(DType, &[i64])]) -> (Vec<Array>, Vec<Array>) {
    let as_args = kernel.signature().outputs.is_empty();
    let mut cpu: Vec<Array> = outs.iter().map(|(d, s)| Array::zeros(*d, s).unwrap()).collect();
    {
        let mut args: Vec<Arg<'_>> = inputs.iter().map(|a| Arg::Tensor(a.view())).collect();
        let mut o: Vec<_> = cpu.iter_mut().map(|a| a.view_mut().unwrap()).collect();
        if as_args {
            args.extend(o.drain(..).map(Arg::TensorMut));
        }
        kernel.call(&mut args, &mut o).unwrap();
    }
    let dins: Vec<CudaArray> = inputs.iter().map(|a| CudaArray::from_host(dev, a).unwrap()).collect();
    let mut douts: Vec<CudaArray> = outs.iter().map(|(d, s)| CudaArray::empty(dev, *d, s).unwrap()).collect();
    {
        let mut args: Vec<Arg<'_>> = dins.iter().map(|a| Arg::Tensor(a.view().unwrap())).collect();
        let mut o: Vec<_> = douts.iter_mut().map(|a| a.view_mut().unwrap()).collect();
        if as_args {
            args.extend(o.drain(..).map(Arg::TensorMut));
        }
        kernel.call(&mut args, &mut o).unwrap();
    }
    (cpu, douts.iter().map(|a| a.to_host().unwrap()).collect())
}

#[test]
fn squared_diff_matches_the_cpu_bit_for_bit_for_every_dtype_with_broadcasting() {
    let Some(dev) = device_or_skip() else { return };
    let reg = Registry::new();
    let k = ElementwiseKernel::new("T x, T y", "T z", "z = (x - y) * (x - y)", "gpu_squared_diff", ElementwiseOptions::default()).unwrap();
    let kernel = k.register(&reg).unwrap();
    for dtype in [DType::F32, DType::F64, DType::I32, DType::I64, DType::U8, DType::I8, DType::U64, DType::BOOL] {
        for (xs, ys, zs) in [
            (&[1000][..], &[1000][..], &[1000][..]),
            (&[4, 5], &[5], &[4, 5]),
            (&[3, 1, 7], &[1, 6, 7], &[3, 6, 7]),
            (&[], &[2, 3], &[2, 3]),
            (&[0, 3], &[3], &[0, 3]),
        ] {
            let (x, y) = (values(dtype, xs, 1), values(dtype, ys, 2));
            let (cpu, gpu) = both(&dev, &kernel, &[&x, &y], &[(dtype, zs)]);
            assert_eq!(bytes(&cpu[0]), bytes(&gpu[0]), "{dtype} {xs:?} {ys:?}");
        }
    }
    assert_eq!(k.cuda_specialisations(), 8);
    // float32-only spelling of CuPy's example.
    let k32 = ElementwiseKernel::new("float32 x, float32 y", "float32 z", "z = (x - y) * (x - y)", "gpu_sq32", Default::default()).unwrap();
    let kernel = k32.register(&reg).unwrap();
    let (x, y) = (values(DType::F32, &[257, 3], 3), values(DType::F32, &[257, 3], 4));
    let (cpu, gpu) = both(&dev, &kernel, &[&x, &y], &[(DType::F32, &[257, 3])]);
    assert_eq!(bytes(&cpu[0]), bytes(&gpu[0]));
}

#[test]
fn strided_and_transposed_operands_are_addressed_like_the_cpu() {
    let Some(dev) = device_or_skip() else { return };
    let reg = Registry::new();
    let k = ElementwiseKernel::new("T x, T y", "T z, float64 w", "z = x * 2 - y; w = (double)x + i", "gpu_strided", Default::default())
        .unwrap();
    let kernel = k.register(&reg).unwrap();
    // x: a [6, 5] array viewed transposed as [5, 6]; y: every other column of a [5, 12] array.
    let xbase = values(DType::F32, &[6, 5], 5);
    let ybase = values(DType::F32, &[5, 12], 6);
    let xt = xbase.t().unwrap();
    let ys = ybase.view_strided_copy_for_test();
    let mut cpu_z = Array::zeros(DType::F32, &[5, 6]).unwrap();
    let mut cpu_w = Array::zeros(DType::F64, &[5, 6]).unwrap();
    kernel
        .call(&mut [Arg::Tensor(xt.view()), Arg::Tensor(ys.view())], &mut [cpu_z.view_mut().unwrap(), cpu_w.view_mut().unwrap()])
        .unwrap();
    let dx = CudaArray::from_host(&dev, &xbase).unwrap();
    let dy = CudaArray::from_host(&dev, &ybase).unwrap();
    let mut dz = CudaArray::empty(&dev, DType::F32, &[5, 6]).unwrap();
    let mut dw = CudaArray::empty(&dev, DType::F64, &[5, 6]).unwrap();
    let (xshape, xstrides) = ([5i64, 6], [1i64, 5]);
    let (yshape, ystrides) = ([5i64, 6], [12i64, 2]);
    kernel
        .call(
            &mut [Arg::Tensor(dx.view_strided(&xshape, &xstrides).unwrap()), Arg::Tensor(dy.view_strided(&yshape, &ystrides).unwrap())],
            &mut [dz.view_mut().unwrap(), dw.view_mut().unwrap()],
        )
        .unwrap();
    assert_eq!(bytes(&cpu_z), bytes(&dz.to_host().unwrap()));
    assert_eq!(bytes(&cpu_w), bytes(&dw.to_host().unwrap()));
}

/// Every other column of a [5, 12] array, as a host view the CPU backend takes.
trait EveryOther {
    fn view_strided_copy_for_test(&self) -> Array;
}
impl EveryOther for Array {
    fn view_strided_copy_for_test(&self) -> Array {
        let v: Vec<f32> = self.to_vec::<f32>().unwrap();
        let picked: Vec<f32> = (0..5).flat_map(|r| (0..6).map(move |c| (r, c))).map(|(r, c)| v[r * 12 + c * 2]).collect();
        Array::from_slice(&picked, &[5, 6]).unwrap()
    }
}

#[test]
fn raw_arguments_ind_size_loop_prep_and_in_place_writes_match_the_cpu() {
    let Some(dev) = device_or_skip() else { return };
    let reg = Registry::new();
    let rev =
        ElementwiseKernel::new("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "gpu_add_reverse", Default::default()).unwrap();
    let kernel = rev.register(&reg).unwrap();
    for dtype in [DType::F32, DType::I64] {
        let (x, y) = (values(dtype, &[3, 70], 7), values(dtype, &[210], 8));
        let (cpu, gpu) = both(&dev, &kernel, &[&x, &y], &[(dtype, &[3, 70])]);
        assert_eq!(bytes(&cpu[0]), bytes(&gpu[0]), "{dtype}");
    }
    let opts = ElementwiseOptions {
        preamble: "__device__ double twice(double v) { return v + v; }".into(),
        loop_prep: "double bias = twice(0.5);".into(),
        after_loop: "(void)bias;".into(),
    };
    let k =
        ElementwiseKernel::new("T x, raw T table", "float64 z", "z = x * bias + table[i % table.size()] + n", "gpu_prep", opts).unwrap();
    let kernel = k.register(&reg).unwrap();
    let (x, t) = (values(DType::F64, &[1000], 9), values(DType::F64, &[2, 7], 10));
    let (cpu, gpu) = both(&dev, &kernel, &[&x, &t], &[(DType::F64, &[1000])]);
    assert_eq!(bytes(&cpu[0]), bytes(&gpu[0]));
    // In place: a `mut` input written, no outputs.
    let k = ElementwiseKernel::new("mut T x, T y", "", "x = x * y + 1", "gpu_in_place", Default::default()).unwrap();
    let kernel = k.register(&reg).unwrap();
    let (x, y) = (values(DType::I32, &[4, 9], 11), values(DType::I32, &[9], 12));
    let mut hx = values(DType::I32, &[4, 9], 11);
    kernel.call(&mut [Arg::TensorMut(hx.view_mut().unwrap()), Arg::Tensor(y.view())], &mut []).unwrap();
    let mut dx = CudaArray::from_host(&dev, &x).unwrap();
    let dy = CudaArray::from_host(&dev, &y).unwrap();
    kernel.call(&mut [Arg::TensorMut(dx.view_mut().unwrap()), Arg::Tensor(dy.view().unwrap())], &mut []).unwrap();
    assert_eq!(bytes(&hx), bytes(&dx.to_host().unwrap()));
}

fn close(a: &[f64], b: &[f64], rel: f64) {
    assert_eq!(a.len(), b.len());
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= rel * x.abs().max(y.abs()).max(1e-30), "element {k}: {x} vs {y}");
    }
}

fn as_f64(a: &Array) -> Vec<f64> {
    match a.dtype() {
        DType::F32 => a.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect(),
        DType::F64 => a.to_vec::<f64>().unwrap(),
        DType::I32 => a.to_vec::<i32>().unwrap().into_iter().map(f64::from).collect(),
        DType::I64 => a.to_vec::<i64>().unwrap().into_iter().map(|v| v as f64).collect(),
        other => panic!("{other}"),
    }
}

#[test]
fn l2norm_and_a_reduction_without_identity_match_the_cpu() {
    let Some(dev) = device_or_skip() else { return };
    let reg = Registry::new();
    let l2 = ReductionKernel::new(Reduction::new("T x", "T y", "x * x", "a + b", "y = sqrt(a)", Some("0"), "gpu_l2norm")).unwrap();
    let l2k = l2.register(&reg).unwrap();
    let mx = ReductionKernel::new(Reduction::new("T x", "T y", "x", "max(a, b)", "y = a", None, "gpu_max")).unwrap();
    let mxk = mx.register(&reg).unwrap();
    for (shape, ny) in
        [(&[7, 1000][..], 1usize), (&[3, 4, 5][..], 1), (&[2, 3, 4][..], 2), (&[100_000][..], 0), (&[5, 1][..], 1), (&[64, 3][..], 1)]
    {
        let out: Vec<i64> = shape[..ny].to_vec();
        for dtype in [DType::F32, DType::F64] {
            let x = values(dtype, shape, 13);
            let (cpu, gpu) = both(&dev, &l2k, &[&x], &[(dtype, &out)]);
            let rel = if dtype == DType::F32 { 1e-5 } else { 1e-13 };
            close(&as_f64(&cpu[0]), &as_f64(&gpu[0]), rel);
            let (cpu, gpu) = both(&dev, &mxk, &[&x], &[(dtype, &out)]);
            assert_eq!(bytes(&cpu[0]), bytes(&gpu[0]), "max {dtype} {shape:?}");
        }
        for dtype in [DType::I32, DType::I64] {
            let x = values(dtype, shape, 14);
            let (cpu, gpu) = both(&dev, &mxk, &[&x], &[(dtype, &out)]);
            assert_eq!(bytes(&cpu[0]), bytes(&gpu[0]), "max {dtype} {shape:?}");
        }
    }
    // The same reduction launched twice gives the same bits.
    let x = values(DType::F32, &[3, 50_000], 15);
    let (_, a) = both(&dev, &l2k, &[&x], &[(DType::F32, &[3])]);
    let (_, b) = both(&dev, &l2k, &[&x], &[(DType::F32, &[3])]);
    assert_eq!(bytes(&a[0]), bytes(&b[0]));
}

#[test]
fn reductions_of_transposed_inputs_with_two_outputs_and_a_reduce_type_match_the_cpu() {
    let Some(dev) = device_or_skip() else { return };
    let reg = Registry::new();
    let k = ReductionKernel::new(Reduction {
        reduce_type: Some("float64"),
        ..Reduction::new("T x, T y", "float64 s, T mean", "(double)x * y", "a + b", "s = a; mean = (T)(a / _J)", Some("0"), "gpu_dot")
    })
    .unwrap();
    let kernel = k.register(&reg).unwrap();
    // Reduce over axis 0 of [40, 6] arrays: the inputs viewed transposed as [6, 40].
    let (xb, yb) = (values(DType::F32, &[40, 6], 16), values(DType::F32, &[40, 6], 17));
    let (xt, yt) = (xb.t().unwrap(), yb.t().unwrap());
    let mut cs = Array::zeros(DType::F64, &[6]).unwrap();
    let mut cm = Array::zeros(DType::F32, &[6]).unwrap();
    kernel
        .call(
            &mut [
                Arg::Tensor(xt.view()),
                Arg::Tensor(yt.view()),
                Arg::TensorMut(cs.view_mut().unwrap()),
                Arg::TensorMut(cm.view_mut().unwrap()),
            ],
            &mut [],
        )
        .unwrap();
    let (dx, dy) = (CudaArray::from_host(&dev, &xb).unwrap(), CudaArray::from_host(&dev, &yb).unwrap());
    let mut ds = CudaArray::empty(&dev, DType::F64, &[6]).unwrap();
    let mut dm = CudaArray::empty(&dev, DType::F32, &[6]).unwrap();
    let (shape, strides) = ([6i64, 40], [1i64, 6]);
    kernel
        .call(
            &mut [
                Arg::Tensor(dx.view_strided(&shape, &strides).unwrap()),
                Arg::Tensor(dy.view_strided(&shape, &strides).unwrap()),
                Arg::TensorMut(ds.view_mut().unwrap()),
                Arg::TensorMut(dm.view_mut().unwrap()),
            ],
            &mut [],
        )
        .unwrap();
    close(&as_f64(&cs), &as_f64(&ds.to_host().unwrap()), 1e-13);
    close(&as_f64(&cm), &as_f64(&dm.to_host().unwrap()), 1e-6);
}

#[test]
fn empty_tensors_launch_nothing_and_an_empty_reduction_needs_an_identity() {
    let Some(dev) = device_or_skip() else { return };
    let reg = Registry::new();
    let sum = ReductionKernel::new(Reduction::new("T x", "T y", "x", "a + b", "y = a", Some("0"), "gpu_sum0")).unwrap();
    let sumk = sum.register(&reg).unwrap();
    let x = values(DType::F32, &[3, 0], 1);
    let (cpu, gpu) = both(&dev, &sumk, &[&x], &[(DType::F32, &[3])]);
    assert_eq!(gpu[0].to_vec::<f32>().unwrap(), vec![0.0; 3]);
    assert_eq!(bytes(&cpu[0]), bytes(&gpu[0]));
    let x = values(DType::F32, &[0, 4], 1);
    let (_, gpu) = both(&dev, &sumk, &[&x], &[(DType::F32, &[0])]);
    assert_eq!(gpu[0].to_vec::<f32>().unwrap().len(), 0);
    let mx = ReductionKernel::new(Reduction::new("T x", "T y", "x", "max(a, b)", "y = a", None, "gpu_max0")).unwrap();
    let mxk = mx.register(&reg).unwrap();
    let dx = CudaArray::from_host(&dev, &values(DType::F32, &[3, 0], 1)).unwrap();
    let mut dy = CudaArray::empty(&dev, DType::F32, &[3]).unwrap();
    let e = mxk.call(&mut [Arg::Tensor(dx.view().unwrap()), Arg::TensorMut(dy.view_mut().unwrap())], &mut []).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value);
    assert!(e.to_string().contains("the reduction is over zero elements and the kernel has no identity"), "{e}");
}

#[test]
fn a_compile_error_on_the_device_is_explained_and_each_specialisation_compiles_once() {
    let Some(dev) = device_or_skip() else { return };
    let reg = Registry::new();
    let k = ElementwiseKernel::new("T x", "T z", "z = x +\n  nope;", "gpu_broken", Default::default()).unwrap();
    let kernel = k.register(&reg).unwrap();
    let dx = CudaArray::from_host(&dev, &values(DType::F32, &[4], 1)).unwrap();
    let mut dz = CudaArray::empty(&dev, DType::F32, &[4]).unwrap();
    let e = kernel.call(&mut [Arg::Tensor(dx.view().unwrap())], &mut [dz.view_mut().unwrap()]).unwrap_err();
    assert!(e.to_string().contains("operation line 2: error: identifier \"nope\" is undefined"), "{e}");
    assert_eq!(k.cuda_specialisations(), 0);
    let k = ElementwiseKernel::new("T x", "T z", "z = -x", "gpu_neg", Default::default()).unwrap();
    let kernel = k.register(&reg).unwrap();
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let (kernel, dev) = (kernel.clone(), dev.clone());
            std::thread::spawn(move || {
                let dx = CudaArray::from_host(&dev, &values(DType::F64, &[33], 2)).unwrap();
                let mut dz = CudaArray::empty(&dev, DType::F64, &[33]).unwrap();
                kernel.call(&mut [Arg::Tensor(dx.view().unwrap())], &mut [dz.view_mut().unwrap()]).unwrap();
                dz.to_host().unwrap().to_vec::<f64>().unwrap()
            })
        })
        .collect();
    let want: Vec<f64> = values(DType::F64, &[33], 2).to_vec::<f64>().unwrap().iter().map(|v| -v).collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), want);
    }
    assert_eq!(k.cuda_specialisations(), 1);
}

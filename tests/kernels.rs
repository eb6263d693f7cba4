//! The built-in CPU kernels against naive references: contiguous, strided,
//! negative strides, in place, the parallel path, every dtype family.

use dlbridge::half::{bf16, f16};
use dlbridge::{Array, ArrayArg, DType, ErrorKind, call, call_into, get_kernel};
use proptest::prelude::*;

fn arr(v: &[f32], shape: &[i64]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919) % 1000) as f32 * scale - 3.0).collect()
}

fn run(name: &str, args: &mut [ArrayArg<'_>]) -> Vec<Array> {
    call(&get_kernel(name).unwrap(), args).unwrap()
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y}");
    }
}

/// The facade's registry holds every built-in of the crates it links (the
/// CPU crate's own test names them), and no registration of one is refused.
#[test]
fn builtins_register_without_problems() {
    let reg = dlbridge::registry();
    assert!(reg.problems().is_empty(), "{:?}", reg.problems());
    for k in reg.list() {
        assert!(k.devices().any(|d| d == dlbridge::DeviceType::CPU), "{} has no CPU implementation", k.name());
    }
    assert!(reg.list().len() >= 15, "{} kernels", reg.list().len());
}

#[test]
fn binary_ops_match_the_reference_small_and_parallel() {
    for n in [7usize, 200_003] {
        let (x, y) = (ramp(n, 0.01), ramp(n, 0.003).iter().map(|v| v + 5.0).collect::<Vec<_>>());
        let (a, b) = (arr(&x, &[n as i64]), arr(&y, &[n as i64]));
        type Op = fn(f32, f32) -> f32;
        let cases: [(&str, Op); 5] =
            [("add", |a, b| a + b), ("sub", |a, b| a - b), ("mul", |a, b| a * b), ("div", |a, b| a / b), ("maximum", f32::max)];
        for (name, f) in cases {
            let out = run(name, &mut [ArrayArg::In(&a), ArrayArg::In(&b)]);
            let expect: Vec<f32> = x.iter().zip(&y).map(|(&p, &q)| f(p, q)).collect();
            assert_eq!(out[0].to_vec::<f32>().unwrap(), expect, "{name} n={n}");
        }
    }
}

#[test]
fn strided_and_negative_stride_inputs_are_read_in_logical_order() {
    let a = arr(&ramp(12, 1.0), &[3, 4]);
    let b = arr(&ramp(12, 0.5), &[4, 3]);
    let at = a.t().unwrap(); // [4, 3], strides [1, 4]
    let br = b.slice(0, -1, -5, -1).unwrap(); // rows reversed, negative stride
    let out = run("add", &mut [ArrayArg::In(&at), ArrayArg::In(&br)]);
    let expect: Vec<f32> = at.to_vec::<f32>().unwrap().iter().zip(br.to_vec::<f32>().unwrap()).map(|(p, q)| p + q).collect();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), expect);
    // A strided output is written in logical order too.
    let mut base = Array::zeros(DType::F32, &[3, 4]).unwrap();
    let mut dst = base.t().unwrap();
    drop(base);
    call_into(&get_kernel("add").unwrap(), &mut [ArrayArg::In(&at), ArrayArg::In(&br)], &mut [&mut dst]).unwrap();
    assert_eq!(dst.to_vec::<f32>().unwrap(), expect);
    base = dst.t().unwrap();
    assert!(base.is_contiguous());
}

#[test]
fn output_may_be_exactly_an_input() {
    let k = get_kernel("mul").unwrap();
    let mut a = arr(&[1.0, 2.0, 3.0], &[3]);
    let b = arr(&[2.0, 2.0, 2.0], &[3]);
    let a_view = a.view();
    let a_ptr = a_view.data_ptr();
    // View `a` as both an input and the output (what `mul(x, y, out=x)` does).
    // SAFETY: the registry allows only this exact alias; the kernel computes in place.
    let out = unsafe { dlbridge::TensorViewMut::from_view(a_view.clone()) }.unwrap();
    k.call(&mut [dlbridge::Arg::Tensor(a_view), dlbridge::Arg::Tensor(b.view())], &mut [out]).unwrap();
    assert_eq!(a.as_slice::<f32>().unwrap(), &[2.0, 4.0, 6.0]);
    assert_eq!(a.data_ptr() as *const std::ffi::c_void, a_ptr);
    assert!(a.view_mut().is_ok());
}

#[test]
fn integer_ops_wrap_and_division_by_zero_is_an_error() {
    let a = Array::from_slice(&[i32::MAX, 7, -7], &[3]).unwrap();
    let b = Array::from_slice(&[1i32, 2, 0], &[3]).unwrap();
    let out = run("add", &mut [ArrayArg::In(&a), ArrayArg::In(&b)]);
    assert_eq!(out[0].to_vec::<i32>().unwrap(), vec![i32::MIN, 9, -7]);
    let e = call(&get_kernel("div").unwrap(), &mut [ArrayArg::In(&a), ArrayArg::In(&b)]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value);
    assert!(e.to_string().contains("division by zero"), "{e}");
    assert_eq!(e.to_string().matches("div:").count(), 1, "the kernel is named once: {e}");
    let m = Array::from_slice(&[i64::MIN], &[1]).unwrap();
    let neg1 = Array::from_slice(&[-1i64], &[1]).unwrap();
    let out = run("div", &mut [ArrayArg::In(&m), ArrayArg::In(&neg1)]);
    assert_eq!(out[0].to_vec::<i64>().unwrap(), vec![i64::MIN], "wraps, no panic");
}

#[test]
fn half_precision_elementwise_and_softmax() {
    let xs = [0.5f32, -1.25, 3.0, 100.0];
    let h = Array::from_slice(&xs.map(f16::from_f32), &[4]).unwrap();
    let out = run("add", &mut [ArrayArg::In(&h), ArrayArg::In(&h)]);
    assert_eq!(out[0].to_vec::<f16>().unwrap(), xs.map(|v| f16::from_f32(2.0 * v)).to_vec());
    let b = Array::from_slice(&xs.map(bf16::from_f32), &[2, 2]).unwrap();
    let out = run("softmax", &mut [ArrayArg::In(&b)]);
    let got: Vec<f32> = out[0].to_vec::<bf16>().unwrap().iter().map(|v| v.to_f32()).collect();
    let e = |a: f32, b: f32| (1.0 / (1.0 + (b - a).exp()), 1.0 / (1.0 + (a - b).exp()));
    let (p, q) = e(0.5, -1.25);
    let (r, s) = e(3.0, 100.0);
    close(&got, &[p, q, r, s], 1e-2);
    let out = run("relu", &mut [ArrayArg::In(&b)]);
    assert_eq!(out[0].to_vec::<bf16>().unwrap()[1], bf16::ZERO);
}

#[test]
fn relu_and_gelu_match_the_reference() {
    let x = ramp(1000, 0.006);
    let a = arr(&x, &[10, 100]);
    let relu = run("relu", &mut [ArrayArg::In(&a)]);
    assert_eq!(relu[0].to_vec::<f32>().unwrap(), x.iter().map(|v| v.max(0.0)).collect::<Vec<_>>());
    let gelu = run("gelu", &mut [ArrayArg::In(&a)]);
    let expect: Vec<f32> = x.iter().map(|&v| (0.5 * v as f64 * (1.0 + libm_erf(v as f64 / 2f64.sqrt()))) as f32).collect();
    close(&gelu[0].to_vec::<f32>().unwrap(), &expect, 1e-6);
    // Known values: gelu(1) = 0.841344746, gelu(-1) = -0.158655254.
    let g = run("gelu", &mut [ArrayArg::In(&Array::from_slice(&[1.0f64, -1.0], &[2]).unwrap())]);
    let g = g[0].to_vec::<f64>().unwrap();
    assert!((g[0] - 0.841_344_746_068_543).abs() < 1e-12 && (g[1] + 0.158_655_253_931_457).abs() < 1e-12, "{g:?}");
}

/// gelu on bf16, over every bf16 value, gives the f32 gelu of the widened value
/// rounded to bf16 (the kernel narrows a block at a time with AVX512-BF16 where
/// the CPU has it, element by element elsewhere: the bits must be the same).
#[test]
fn gelu_bf16_rounds_the_f32_gelu_of_every_value() {
    let x: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    let a = Array::from_slice(&x, &[256, 256]).unwrap();
    let f32_gelu = run("gelu", &mut [ArrayArg::In(&Array::from_vec(x.iter().map(|v| v.to_f32()).collect(), &[256, 256]).unwrap())]);
    let expect: Vec<u16> = f32_gelu[0].to_vec::<f32>().unwrap().iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    let got: Vec<u16> = run("gelu", &mut [ArrayArg::In(&a)])[0].to_vec::<bf16>().unwrap().iter().map(|v| v.to_bits()).collect();
    let nan = |b: u16| b & 0x7f80 == 0x7f80 && b & 0x7f != 0;
    for (i, (&g, &e)) in got.iter().zip(&expect).enumerate() {
        assert!(g == e || (nan(g) && nan(e)), "gelu(bf16 {:#06x}) = {g:#06x}, expected {e:#06x}", x[i].to_bits());
    }
}

fn libm_erf(x: f64) -> f64 {
    // Abramowitz-Stegun 7.1.26 is too coarse for 1e-6; integrate instead (Simpson, 2000 steps).
    let n = 2000;
    let h = x / n as f64;
    let f = |t: f64| (-t * t).exp();
    let mut s = f(0.0) + f(x);
    for i in 1..n {
        s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn axpy_writes_in_place_and_refuses_shared_arrays() {
    let x = arr(&[1.0, 2.0, 3.0], &[3]);
    let mut y = arr(&[10.0, 20.0, 30.0], &[3]);
    let k = get_kernel("axpy").unwrap();
    let ptr = y.data_ptr();
    call(&k, &mut [ArrayArg::f64(0.5), ArrayArg::In(&x), ArrayArg::Mut(&mut y)]).unwrap();
    assert_eq!(y.as_slice::<f32>().unwrap(), &[10.5, 21.0, 31.5]);
    assert_eq!(y.data_ptr(), ptr);
    let alias = y.clone();
    let e = call(&k, &mut [ArrayArg::f64(0.5), ArrayArg::In(&x), ArrayArg::Mut(&mut y)]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Buffer);
    assert_eq!(alias.as_slice::<f32>().unwrap(), &[10.5, 21.0, 31.5], "nothing written");
}

#[test]
fn reductions_over_the_last_dim_and_everything() {
    let x = ramp(6 * 1000, 0.01);
    let a = arr(&x, &[2, 3, 1000]);
    let sums = run("sum", &mut [ArrayArg::In(&a)]);
    assert_eq!(sums[0].shape(), &[2, 3]);
    let expect: Vec<f32> = x.chunks(1000).map(|r| r.iter().map(|&v| v as f64).sum::<f64>() as f32).collect();
    close(&sums[0].to_vec::<f32>().unwrap(), &expect, 1e-6);
    let means = run("mean", &mut [ArrayArg::In(&a)]);
    close(&means[0].to_vec::<f32>().unwrap(), &expect.iter().map(|s| s / 1000.0).collect::<Vec<_>>(), 1e-6);
    let total = run("sum_all", &mut [ArrayArg::In(&a)]);
    assert_eq!(total[0].shape(), &[] as &[i64]);
    close(&total[0].to_vec::<f32>().unwrap(), &[expect.iter().map(|&v| v as f64).sum::<f64>() as f32], 1e-6);
    // Over a transposed (strided) input.
    let t = arr(&x[..12], &[3, 4]).t().unwrap();
    let s = run("sum", &mut [ArrayArg::In(&t)]);
    let expect: Vec<f32> = (0..4).map(|j| (0..3).map(|i| x[i * 4 + j]).sum()).collect();
    close(&s[0].to_vec::<f32>().unwrap(), &expect, 1e-6);
    // Integers, and an empty last dim.
    let i = Array::from_slice(&[1i64, 2, 3, 4], &[2, 2]).unwrap();
    assert_eq!(run("sum", &mut [ArrayArg::In(&i)])[0].to_vec::<i64>().unwrap(), vec![3, 7]);
    let e = Array::zeros(DType::F64, &[3, 0]).unwrap();
    assert_eq!(run("sum", &mut [ArrayArg::In(&e)])[0].to_vec::<f64>().unwrap(), vec![0.0; 3]);
    assert!(run("mean", &mut [ArrayArg::In(&e)])[0].to_vec::<f64>().unwrap().iter().all(|v| v.is_nan()));
    let big = arr(&vec![1.0; 300_000], &[300_000]);
    assert_eq!(run("sum_all", &mut [ArrayArg::In(&big)])[0].to_vec::<f32>().unwrap(), vec![300_000.0]);
    assert_eq!(run("mean_all", &mut [ArrayArg::In(&big)])[0].to_vec::<f32>().unwrap(), vec![1.0]);
}

#[test]
fn softmax_is_numerically_stable_and_normalised() {
    let x = [1000.0f32, 1001.0, 1002.0, -1e30, 0.0, 1e-3];
    let a = arr(&x, &[2, 3]);
    let y = run("softmax", &mut [ArrayArg::In(&a)])[0].to_vec::<f32>().unwrap();
    let e = [(-2f64).exp(), (-1f64).exp(), 1.0];
    let s: f64 = e.iter().sum();
    close(&y[..3], &e.map(|v| (v / s) as f32), 1e-6);
    assert!(y.iter().all(|v| v.is_finite()));
    for n in [1usize, 3, 1000, 70_001] {
        let x = ramp(4 * n, 0.05);
        let a = arr(&x, &[4, n as i64]);
        let y = run("softmax", &mut [ArrayArg::In(&a)])[0].to_vec::<f32>().unwrap();
        for (row, xr) in y.chunks(n).zip(x.chunks(n)) {
            let total: f64 = row.iter().map(|&v| v as f64).sum();
            assert!((total - 1.0).abs() < 1e-4, "n={n}: row sums to {total}");
            let m = xr.iter().cloned().fold(f32::MIN, f32::max);
            let z: f64 = xr.iter().map(|&v| ((v - m) as f64).exp()).sum();
            close(row, &xr.iter().map(|&v| (((v - m) as f64).exp() / z) as f32).collect::<Vec<_>>(), 1e-5);
        }
    }
}

fn naive_matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

#[test]
fn matmul_matches_the_naive_product_on_any_strides() {
    for (m, k, n) in [(1, 1, 1), (3, 5, 2), (64, 33, 17), (130, 70, 90)] {
        let av: Vec<f64> = (0..m * k).map(|i| (i % 13) as f64 - 6.0).collect();
        let bv: Vec<f64> = (0..k * n).map(|i| (i % 7) as f64 * 0.5).collect();
        let expect = naive_matmul(&av, &bv, m, k, n);
        let a = Array::from_slice(&av, &[m as i64, k as i64]).unwrap();
        let b = Array::from_slice(&bv, &[k as i64, n as i64]).unwrap();
        let c = run("matmul", &mut [ArrayArg::In(&a), ArrayArg::In(&b)]);
        assert_eq!(c[0].shape(), &[m as i64, n as i64]);
        assert_eq!(c[0].to_vec::<f64>().unwrap(), expect, "{m}x{k}x{n}");
        // Transposed storage for both operands: same product.
        let at = a.t().unwrap().contiguous().unwrap().t().unwrap();
        let bt = b.t().unwrap().contiguous().unwrap().t().unwrap();
        let c = run("matmul", &mut [ArrayArg::In(&at), ArrayArg::In(&bt)]);
        assert_eq!(c[0].to_vec::<f64>().unwrap(), expect, "transposed {m}x{k}x{n}");
    }
    // Negative strides: reversed rows of a.
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let ar = a.slice(0, -1, -3, -1).unwrap();
    let eye = Array::from_slice(&[1.0f32, 0.0, 0.0, 1.0], &[2, 2]).unwrap();
    let c = run("matmul", &mut [ArrayArg::In(&ar), ArrayArg::In(&eye)]);
    assert_eq!(c[0].to_vec::<f32>().unwrap(), vec![3.0, 4.0, 1.0, 2.0]);
    // K = 0 gives zeros, M = 0 an empty result.
    let z = run(
        "matmul",
        &mut [ArrayArg::In(&Array::zeros(DType::F32, &[2, 0]).unwrap()), ArrayArg::In(&Array::zeros(DType::F32, &[0, 3]).unwrap())],
    );
    assert_eq!(z[0].to_vec::<f32>().unwrap(), vec![0.0; 6]);
}

#[test]
fn matmul_refuses_an_output_overlapping_its_inputs() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let v = a.view();
    // SAFETY: the registry refuses the call before anything is written.
    let out = unsafe { dlbridge::TensorViewMut::from_view(v.clone()) }.unwrap();
    let e = get_kernel("matmul").unwrap().call(&mut [dlbridge::Arg::Tensor(v.clone()), dlbridge::Arg::Tensor(v)], &mut [out]).unwrap_err();
    assert!(e.to_string().contains("overlaps"), "{e}");
    assert_eq!(a.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn copy_makes_any_layout_contiguous_for_every_dtype() {
    for name in ["f32", "f64", "f16", "bf16", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool", "c64", "c128"] {
        let dtype: DType = name.parse().unwrap();
        let a = Array::zeros(dtype, &[3, 4]).unwrap();
        let t = a.t().unwrap();
        let c = run("copy", &mut [ArrayArg::In(&t)]);
        assert!(c[0].is_contiguous(), "{name}");
        assert_eq!(c[0].shape(), &[4, 3]);
        assert_eq!(c[0].dtype(), dtype);
    }
    let a = Array::arange(6, DType::I16).unwrap();
    let r = a.slice(0, -1, -7, -2).unwrap();
    assert_eq!(run("copy", &mut [ArrayArg::In(&r)])[0].to_vec::<i16>().unwrap(), vec![5, 3, 1]);
}

/// Row-major strides (in elements) of `shape`.
fn row_major(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

#[test]
fn elementwise_outputs_follow_the_inputs_memory_order_as_numpy_and_torch_do() {
    let base = arr(&ramp(24, 1.0), &[4, 6]);
    let t = base.t().unwrap(); // [6, 4], strides [1, 6]
    let c = t.contiguous().unwrap(); // the same values, row-major
    let tv = t.to_vec::<f32>().unwrap();
    // One transposed input: the output has its strides, and the right values.
    let y = run("relu", &mut [ArrayArg::In(&t)]).remove(0);
    assert_eq!((y.shape(), y.strides()), (t.shape(), t.strides()));
    assert_eq!(y.to_vec::<f32>().unwrap(), tv.iter().map(|v| v.max(0.0)).collect::<Vec<_>>());
    // Both transposed: the same; `add(x.t(), x.t())` is a pass over memory in order.
    let y = run("add", &mut [ArrayArg::In(&t), ArrayArg::In(&t)]).remove(0);
    assert_eq!(y.strides(), t.strides());
    assert_eq!(y.to_vec::<f32>().unwrap(), tv.iter().map(|v| v + v).collect::<Vec<_>>());
    // Mixed layouts: the first input decides (torch's rule).
    let y = run("add", &mut [ArrayArg::In(&c), ArrayArg::In(&t)]).remove(0);
    assert_eq!(y.strides(), row_major(&[6, 4]));
    assert_eq!(y.to_vec::<f32>().unwrap(), tv.iter().map(|v| v + v).collect::<Vec<_>>());
    let y = run("sub", &mut [ArrayArg::In(&t), ArrayArg::In(&c)]).remove(0);
    assert_eq!(y.strides(), t.strides());
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0; 24]);
    // Three dims, permuted: [3, 4, 5] -> [5, 3, 4], strides [1, 20, 5].
    let p = arr(&ramp(60, 1.0), &[3, 4, 5]).permute(&[2, 0, 1]).unwrap();
    let y = run("gelu", &mut [ArrayArg::In(&p)]).remove(0);
    assert_eq!((y.shape(), y.strides()), (&[5i64, 3, 4][..], &[1i64, 20, 5][..]));
    let g = run("gelu", &mut [ArrayArg::In(&p.contiguous().unwrap())]).remove(0);
    assert_eq!(y.to_vec::<f32>().unwrap(), g.to_vec::<f32>().unwrap());
    // A negative stride orders by its size (NumPy's order='K'), the output's own strides positive.
    let f = t.slice(0, -1, -7, -1).unwrap(); // [6, 4], strides [-1, 6]
    let y = run("relu", &mut [ArrayArg::In(&f)]).remove(0);
    assert_eq!(y.strides(), t.strides());
    assert_eq!(y.to_vec::<f32>().unwrap(), f.to_vec::<f32>().unwrap().iter().map(|v| v.max(0.0)).collect::<Vec<_>>());
    // An output shaped like its input (softmax's `[...B, N]`) follows it too, with the
    // values of the contiguous case; `copy`, whose job is a contiguous copy, is row-major;
    // matmul's output, shaped like no input, is row-major.
    let y = run("softmax", &mut [ArrayArg::In(&t)]).remove(0);
    assert_eq!(y.strides(), t.strides());
    let want = run("softmax", &mut [ArrayArg::In(&c)]).remove(0);
    assert_eq!(want.strides(), row_major(&[6, 4]));
    for (g, w) in y.to_vec::<f32>().unwrap().iter().zip(want.to_vec::<f32>().unwrap()) {
        assert!((g - w).abs() <= 1e-6 * w.abs().max(1e-30), "{g} vs {w}");
    }
    let y = run("copy", &mut [ArrayArg::In(&t)]).remove(0);
    assert_eq!(y.strides(), row_major(&[6, 4]));
    let y = run("matmul", &mut [ArrayArg::In(&t), ArrayArg::In(&base)]).remove(0);
    assert_eq!(y.strides(), row_major(&[6, 6]));
    // What an adapter is told to allocate.
    let add = get_kernel("add").unwrap();
    let spec = add.prepare_outputs(&[dlbridge::Arg::Tensor(p.view()), dlbridge::Arg::Tensor(p.view())]).unwrap().remove(0);
    assert_eq!(spec.order.as_slice(), &[1, 2, 0]);
    assert_eq!(spec.memory_shape().as_slice(), &[3, 4, 5]);
    assert_eq!(spec.axes().as_slice(), &[2, 0, 1]);
    assert_eq!(spec.strides().as_slice(), &[1, 20, 5]);
    assert!(spec.to_string().ends_with("(memory order [1, 2, 0])"), "{spec}");
    let spec = add.prepare_outputs(&[dlbridge::Arg::Tensor(c.view()), dlbridge::Arg::Tensor(c.view())]).unwrap().remove(0);
    assert!(spec.is_row_major() && spec.axes().as_slice() == [0, 1] && spec.strides().as_slice() == [4, 1]);
}

#[test]
fn size_one_dims_count_as_torch_counts_them() {
    // A [3, 1] column and a transposed [1, 3]: both contiguous but for their
    // size-1 dims, so the output is row-major (torch: strides (1, 1)).
    let col = arr(&[1.0, 2.0, 3.0], &[3, 1]);
    let t = arr(&[10.0, 20.0, 30.0], &[1, 3]).t().unwrap(); // [3, 1], strides [1, 3]
    let y = run("add", &mut [ArrayArg::In(&col), ArrayArg::In(&t)]).remove(0);
    assert_eq!(y.strides(), &[1, 1]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![11.0, 22.0, 33.0]);
    // [1, 3, 2] permuted to [2, 1, 3], strides [1, 6, 2]: the output keeps them (torch: (1, 6, 2)).
    let x = arr(&ramp(6, 1.0), &[1, 3, 2]).permute(&[2, 0, 1]).unwrap();
    let y = run("relu", &mut [ArrayArg::In(&x)]).remove(0);
    assert_eq!(y.strides(), &[1, 6, 2]);
    assert_eq!(y.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap().iter().map(|v| v.max(0.0)).collect::<Vec<_>>());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn an_elementwise_output_takes_the_strides_of_any_dense_permuted_input(
        shape in proptest::collection::vec(2i64..5, 2..5), seed in any::<u64>(),
    ) {
        // A random permutation of a contiguous base: every dim > 1, so the
        // order is fully told and the output's strides are the input's own.
        let n = shape.len();
        let mut perm: Vec<usize> = (0..n).collect();
        let mut r = seed;
        for i in (1..n).rev() {
            r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            perm.swap(i, (r >> 33) as usize % (i + 1));
        }
        let numel = shape.iter().product::<i64>() as usize;
        let x = arr(&ramp(numel, 0.01), &shape).permute(&perm).unwrap();
        let y = run("relu", &mut [ArrayArg::In(&x)]).remove(0);
        prop_assert_eq!(y.shape(), x.shape());
        prop_assert_eq!(y.strides(), x.strides());
        let expect: Vec<f32> = x.to_vec::<f32>().unwrap().iter().map(|v| v.max(0.0)).collect();
        prop_assert_eq!(y.to_vec::<f32>().unwrap(), expect);
    }

    #[test]
    fn add_on_random_views_matches_elementwise_reference(
        rows in 1i64..9, cols in 1i64..9, ta in any::<bool>(), rb in any::<bool>(), step in 1i64..3,
    ) {
        let base_a = Array::arange(rows * cols * step, DType::F64).unwrap();
        let base_a = Array::from_vec(base_a.to_vec::<f64>().unwrap(), &[rows, cols * step]).unwrap();
        let a = base_a.slice(1, 0, cols * step, step).unwrap();
        let a = if ta { a.t().unwrap().contiguous().unwrap().t().unwrap() } else { a };
        let b = Array::from_vec((0..rows * cols).map(|v| v as f64 * 0.25).collect(), &[rows, cols]).unwrap();
        let b = if rb { b.slice(0, -1, -(rows + 1), -1).unwrap() } else { b };
        let out = run("add", &mut [ArrayArg::In(&a), ArrayArg::In(&b)]);
        let expect: Vec<f64> = a.to_vec::<f64>().unwrap().iter().zip(b.to_vec::<f64>().unwrap()).map(|(x, y)| x + y).collect();
        prop_assert_eq!(out[0].to_vec::<f64>().unwrap(), expect);
    }
}

#[test]
fn softmax_of_a_transposed_input_treats_nan_and_infinities_as_the_contiguous_case_does() {
    // Logical [8, 5] rows of x.t(): row 0 holds a NaN, row 1 +inf, row 2 is all
    // -inf, row 3 has one -inf among finite values, the others are finite.
    let mut v = ramp(40, 0.01);
    let at = |r: usize, k: usize| k * 8 + r; // element (r, k) of the transpose of a [5, 8]
    v[at(0, 2)] = f32::NAN;
    v[at(1, 4)] = f32::INFINITY;
    for k in 0..5 {
        v[at(2, k)] = f32::NEG_INFINITY;
    }
    v[at(3, 1)] = f32::NEG_INFINITY;
    let t = arr(&v, &[5, 8]).t().unwrap();
    let y = run("softmax", &mut [ArrayArg::In(&t)]).remove(0);
    assert_eq!(y.strides(), t.strides(), "the output follows the input");
    let want = run("softmax", &mut [ArrayArg::In(&t.contiguous().unwrap())]).remove(0).to_vec::<f32>().unwrap();
    let got = y.to_vec::<f32>().unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.is_nan(), w.is_nan(), "element {i}: {g} vs {w}");
        assert!(g.is_nan() || (g - w).abs() <= 1e-6, "element {i}: {g} vs {w}");
    }
    assert!(got[..15].iter().all(|v| v.is_nan()), "rows 0-2 are NaN: {:?}", &got[..15]);
    assert_eq!(got[16], 0.0, "e^-inf is 0");
    assert!(got[15..].iter().all(|v| !v.is_nan()));
}

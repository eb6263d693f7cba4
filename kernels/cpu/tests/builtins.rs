//! Every built-in kernel registers: a registration that the registry rejects
//! (a signature that does not parse, a dtype the implementation's family cannot
//! serve) fails this test instead of vanishing into `Registry::problems()`.

use dlbridge_core::DType;
use dlbridge_registry::Registry;

#[test]
fn every_builtin_kernel_registers_with_the_dtypes_its_signature_names() {
    dlbridge_cpu::link();
    let reg = Registry::global();
    assert!(reg.problems().is_empty(), "rejected built-ins: {:#?}", reg.problems());
    let names: Vec<String> = reg.list().iter().map(|k| k.name().to_owned()).collect();
    for expected in
        ["add", "sub", "mul", "div", "maximum", "relu", "gelu", "axpy", "sum", "mean", "sum_all", "mean_all", "softmax", "matmul", "copy"]
    {
        assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
    }
    // The table is the signature's type variable: add runs on every dtype it names.
    let add = reg.get("add").unwrap();
    let allowed = &add.signature().type_vars[0].allowed;
    for d in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64] {
        assert!(allowed.contains(&d), "{d}");
    }
}

/// axpy reads `y` before writing it, whatever its strides: a strided `y` (steps
/// of 2 and 3 — a matrix column —, a reversed view) longer than one gather block.
#[test]
fn axpy_updates_a_strided_y_from_its_current_values() {
    use dlbridge_array::Array;
    use dlbridge_registry::Arg;
    dlbridge_cpu::link();
    let axpy = Registry::global().get("axpy").unwrap();
    let n = 600usize;
    let x = Array::from_vec((0..n).map(|i| i as f32).collect(), &[n as i64]).unwrap();
    let base: Vec<f32> = (0..3 * n).map(|i| 1000.0 + i as f32).collect();
    // (view of `base` as y, which element of `base` y[i] is)
    type Pick = fn(usize, usize) -> usize;
    let cases: [(&str, Pick); 3] = [("step 2", |i, _| 2 * i), ("step 3 from 1", |i, _| 3 * i + 1), ("reversed", |i, n| n - 1 - i)];
    for (what, pick) in cases {
        let full = Array::from_vec(base.clone(), &[3 * n as i64]).unwrap();
        let mut y = match what {
            "step 2" => full.slice(0, 0, 2 * n as i64, 2).unwrap(),
            "step 3 from 1" => full.slice(0, 1, 3 * n as i64, 3).unwrap(),
            _ => full.slice(0, n as i64 - 1, -(3 * n as i64) - 1, -1).unwrap(),
        };
        drop(full);
        axpy.call(&mut [Arg::f64(2.0), Arg::Tensor(x.view()), Arg::TensorMut(y.view_mut().unwrap())], &mut []).unwrap();
        let got = y.to_vec::<f32>().unwrap();
        for (i, g) in got.iter().enumerate() {
            assert_eq!(*g, base[pick(i, n)] + 2.0 * i as f32, "{what}: y[{i}]");
        }
    }
}

//! Every built-in kernel registers: a registration that the registry rejects
//! (a signature that does not parse, a dtype the implementation's family cannot
//! serve) fails this test instead of vanishing into `Registry::problems()`.

use dlbridge_core::DType;
use dlbridge_registry::Registry;

#[test]
fn every_builtin_kernel_registers_with_the_dtypes_its_signature_names() {
    dlbridge_kernels_cpu::link();
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

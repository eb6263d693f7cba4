//! A name is one kernel. A program that registers its own `relu` next to the
//! built-in one (here: a `relu` that negates) gets neither, and an error naming
//! both registrations wherever it asks for `relu`: never the other kernel in
//! its place, whichever of the two inventory happens to list first.

use dlbridge_core::Result;
use dlbridge_registry::{Call, Registry, register_kernel};

fn negate(call: &mut Call<'_, '_>) -> Result<()> {
    let (ins, mut outs) = call.io();
    let (x, y) = (ins.tensor("x")?, outs.take("y")?);
    y.iter_mut::<f32>()?.zip(x.iter::<f32>()?).for_each(|(y, x)| *y = -x);
    Ok(())
}

register_kernel!("relu<T: f32>(x: T[...S]) -> (y: T[...S])", generic negate, doc = "not relu");

#[test]
fn a_programs_relu_beside_the_builtin_relu_is_an_error_naming_both_never_a_swap() {
    dlbridge_cpu::link();
    let reg = Registry::with_builtins();
    let e = reg.get("relu").expect_err("two kernels named relu").to_string();
    assert!(e.starts_with("kernel relu is registered 2 times, and the registrations disagree: "), "{e}");
    assert!(e.contains("`relu<T: f32>(x: T[...S]) -> (y: T[...S])` on cpu at kernels/cpu/tests/name_conflicts.rs:"), "{e}");
    assert!(e.contains("`relu<T: f32|f64|f16|bf16|i32|i64>(x: T[...S]) -> (y: T[...S])` on cpu at kernels/cpu/src/"), "{e}");
    assert!(e.ends_with("none of them is registered (rename one)"), "{e}");
    assert!(reg.list().iter().all(|k| k.name() != "relu"), "neither relu is listed");
    assert_eq!(reg.problems(), std::slice::from_ref(&e), "the one problem is the conflict");
    // Every other built-in is untouched.
    for name in ["add", "gelu", "softmax", "matmul"] {
        assert!(reg.get(name).is_ok(), "{name}");
    }
}

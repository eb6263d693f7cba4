//! A registration the registry refuses is never found later as a missing
//! kernel: looking its name up says why it was refused, and the process said
//! so on first use of the global registry.

use dlbridge_core::Result;
use dlbridge_registry::{Call, Registry, register_kernel};

fn negate<T: dlbridge_core::Element + std::ops::Neg<Output = T>>(call: &mut Call<'_, '_>) -> Result<()> {
    let (ins, mut outs) = call.io();
    let (x, y) = (ins.tensor("x")?, outs.take("y")?);
    y.iter_mut::<T>()?.zip(x.iter::<T>()?).for_each(|(y, x)| *y = -x);
    Ok(())
}

dlbridge_registry::dtype_resolver!(only_f32: f32);

// A typo in the signature the compiler cannot see (an unclosed bracket it can:
// register_kernel! refuses to compile that): no dtype is called `f33`.
register_kernel!("neg_typo<T: f33>(x: T[N]) -> (y: T[N])", generic negate::<f32>);
// A dtype the resolver lacks: the signature allows f64, `only_f32` cannot make it.
register_kernel!("neg_uncovered<T: f32|f64>(x: T[N]) -> (y: T[N])", each only_f32!(negate));

#[test]
fn looking_up_a_refused_registration_says_why() {
    dlbridge_cpu::link();
    let reg = Registry::with_builtins();
    let typo = reg.get("neg_typo").expect_err("refused").to_string();
    assert!(typo.starts_with("kernel `neg_typo` was not registered: kernels/cpu/tests/rejected.rs:"), "{typo}");
    assert!(typo.contains("signature error"), "{typo}");
    let uncovered = reg.get("neg_uncovered").expect_err("refused").to_string();
    assert!(uncovered.starts_with("kernel `neg_uncovered` was not registered: kernels/cpu/tests/rejected.rs:"), "{uncovered}");
    assert!(uncovered.contains("f64"), "names the dtype no dispatch arm covers: {uncovered}");
    assert_eq!(reg.problems().len(), 2, "{:?}", reg.problems());
    // A name nobody registered points at the problems.
    let missing = reg.get("neg_nobody").expect_err("unknown").to_string();
    assert!(missing.contains("Registry::problems() lists 2 rejected registrations"), "{missing}");
    assert!(reg.get("relu").is_ok(), "the built-ins are untouched");
}

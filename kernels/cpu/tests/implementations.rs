//! A device's implementation of a kernel another registration declares: the
//! registration names the kernel only, and takes the declaration's signature
//! and options. Here a ROCm `gelu` joins the built-in CPU `gelu`, and an
//! implementation of a kernel nobody declares is refused with a problem that
//! names it.

use dlbridge_core::{DeviceType, Result};
use dlbridge_registry::{Call, Registry, register_kernel};

fn unreachable_kernel(_call: &mut Call<'_, '_>) -> Result<()> {
    Err(dlbridge_core::Error::Runtime("never called: no ROCm tensor exists here".into()))
}

register_kernel!("gelu", dispatch { F32 => unreachable_kernel }, device = DeviceType::ROCM, doc = "gelu on ROCm");
register_kernel!("no_such_kernel", dispatch { F32 => unreachable_kernel }, device = DeviceType::ROCM);

#[test]
fn an_implementation_by_name_joins_the_declared_kernel_with_its_signature() {
    dlbridge_cpu::link();
    let reg = Registry::with_builtins();
    let gelu = reg.get("gelu").unwrap();
    assert_eq!(gelu.devices().collect::<Vec<_>>(), [DeviceType::CPU, DeviceType::ROCM]);
    assert_eq!(gelu.signature_text(), "gelu<T: f32|f64|f16|bf16>(x: T[...S]) -> (y: T[...S])");
    assert_eq!(gelu.opts(), dlbridge_registry::KernelOpts::ELEMENTWISE, "the declaration's options");
    let rocm = gelu.origins().find(|(d, _)| *d == DeviceType::ROCM).unwrap().1.to_owned();
    assert!(rocm.contains("kernels/cpu/tests/implementations.rs:"), "{rocm}");
}

#[test]
fn an_implementation_of_an_undeclared_kernel_is_a_problem_naming_it() {
    dlbridge_cpu::link();
    let reg = Registry::with_builtins();
    assert!(reg.get("no_such_kernel").is_err());
    let problems = reg.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("kernels/cpu/tests/implementations.rs:"), "{}", problems[0]);
    assert!(
        problems[0]
            .ends_with("a rocm implementation of `no_such_kernel`, but no registration declares `no_such_kernel` with its signature"),
        "{}",
        problems[0]
    );
}

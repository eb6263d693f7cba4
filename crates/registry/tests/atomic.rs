//! Every change to a registry is all or nothing: a registration that fails
//! leaves it exactly as it was (the same kernels, the same `Arc`s).

use std::sync::Arc;

use dlbridge_core::{DeviceType, Result};
use dlbridge_registry::{Call, Impl, Kernel, KernelDef, KernelOpts, Registry, register_kernel};

fn noop(_: &mut Call<'_, '_>) -> Result<()> {
    Ok(())
}

fn def(sig: &str, device: DeviceType, origin: &str) -> KernelDef {
    KernelDef {
        signature: sig.into(),
        device,
        imp: Impl::Generic(noop),
        opts: KernelOpts::DEFAULT,
        origin: origin.into(),
        doc: String::new(),
        identity: String::new(),
    }
}

fn same_kernels(a: &[Arc<Kernel>], b: &[Arc<Kernel>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

#[test]
fn register_all_applies_nothing_when_a_later_definition_fails() {
    let reg = Registry::new();
    let k = reg.register(def("k(x: f32[N]) -> (y: f32[N])", DeviceType::CPU, "first")).unwrap();
    let before = reg.list();
    let e = reg
        .register_all([
            // Would extend `k` with CUDA ...
            def("k(x: f32[N]) -> (y: f32[N])", DeviceType::CUDA, "second"),
            // ... and add `j` ...
            def("j(x: f32[N])", DeviceType::CPU, "second"),
            // ... but this one conflicts with `k`.
            def("k(x: f64[N]) -> (y: f64[N])", DeviceType::ROCM, "second"),
        ])
        .unwrap_err();
    assert!(e.to_string().starts_with("definition 2: kernel k is already registered with signature"), "{e}");
    assert!(same_kernels(&before, &reg.list()));
    assert!(Arc::ptr_eq(&k, &reg.get("k").unwrap()));
    assert_eq!(k.devices().collect::<Vec<_>>(), [DeviceType::CPU]);
    assert!(reg.get("j").is_err());
}

#[test]
fn register_all_sees_its_own_earlier_definitions() {
    let reg = Registry::new();
    let ks = reg.register_all([def("k(x: f32[N])", DeviceType::CPU, "a"), def("k(x: f32[N])", DeviceType::CUDA, "a")]).unwrap();
    assert_eq!(ks.len(), 2);
    assert!(Arc::ptr_eq(&ks[0], &ks[1]), "both definitions name the one committed kernel");
    assert_eq!(reg.get("k").unwrap().devices().collect::<Vec<_>>(), [DeviceType::CPU, DeviceType::CUDA]);
    // The same device twice in one list is refused, and nothing is applied.
    let e = reg.register_all([def("m(x: f32[N])", DeviceType::CPU, "b"), def("m(x: f32[N])", DeviceType::CPU, "c")]).unwrap_err();
    assert!(e.to_string().contains("kernel m on cpu is registered twice: by b and by c"), "{e}");
    assert!(reg.get("m").is_err());
}

#[test]
fn a_failed_register_changes_nothing() {
    let reg = Registry::new();
    reg.register(def("k(x: f32[N])", DeviceType::CPU, "a")).unwrap();
    let before = reg.list();
    assert!(reg.register(def("k(x: f32[N])", DeviceType::CPU, "b")).is_err());
    assert!(reg.register(def("k(x: f32[N", DeviceType::CUDA, "b")).is_err());
    assert!(same_kernels(&before, &reg.list()));
}

// Built-ins for the next test: `atomic_ok` on the CPU, a CUDA implementation of
// it with a dtype its signature does not allow, and one whose signature does not parse
// (an unknown dtype: an unclosed bracket would not compile).
register_kernel!("atomic_ok<T: f32|f64>(x: T[N]) -> (y: T[N])", generic noop);
register_kernel!("atomic_ok<T: f32|f64>(x: T[N]) -> (y: T[N])", dispatch { F32 => noop, F16 => noop }, device = DeviceType::CUDA);
register_kernel!("atomic_bad(x: f33[N])", generic noop);

#[test]
fn a_builtin_that_fails_to_register_is_a_problem_and_leaves_no_trace() {
    let reg = Registry::with_builtins();
    let ok = reg.get("atomic_ok").unwrap();
    assert_eq!(ok.devices().collect::<Vec<_>>(), [DeviceType::CPU], "the rejected CUDA implementation is not half-applied");
    assert!(reg.get("atomic_bad").is_err());
    let problems = reg.problems();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems.iter().any(|p| p.contains("atomic.rs") && p.contains("implementation for f16, which T does not allow")),
        "{problems:?}"
    );
    assert!(problems.iter().any(|p| p.contains("atomic.rs") && p.contains("signature error")), "{problems:?}");
}

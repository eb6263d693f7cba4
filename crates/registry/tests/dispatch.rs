//! Dispatch tables come from the signature: an `each` resolver is expanded over
//! the type variable's dtypes when the kernel registers (a dtype it cannot
//! serve fails the registration loudly), a per-device table may cover a subset,
//! and a call with an uncovered dtype is a type error naming device and dtype.

use dlbridge_array::Array;
use dlbridge_core::{DType, DeviceType, ErrorKind, Result};
use dlbridge_registry::{Arg, Call, Impl, KernelDef, KernelFn, KernelOpts, Registry};

fn fill<T: dlbridge_core::Element + From<u8>>(call: &mut Call<'_, '_>) -> Result<()> {
    let (ins, mut outs) = call.io();
    let n = ins.tensor("x")?.numel() as u8;
    outs.take("y")?.iter_mut::<T>()?.for_each(|v| *v = T::from(n));
    Ok(())
}

dlbridge_registry::dtype_resolver!(two_floats: f32, f64);

fn def(sig: &str, imp: Impl) -> KernelDef {
    KernelDef {
        signature: sig.into(),
        device: DeviceType::CPU,
        imp,
        opts: KernelOpts::DEFAULT,
        origin: "test".into(),
        doc: String::new(),
        identity: String::new(),
    }
}

fn run(reg: &Registry, name: &str, dtype: DType) -> Result<Array> {
    let x = Array::zeros(dtype, &[3])?;
    let mut y = Array::zeros(dtype, &[3])?;
    reg.get(name)?.call(&mut [Arg::Tensor(x.view())], &mut [y.view_mut()?])?;
    Ok(y)
}

#[test]
fn an_each_resolver_derives_the_table_from_the_signature() {
    let reg = Registry::new();
    reg.register(def("fill<T: f32|f64>(x: T[N]) -> (y: T[N])", Impl::Each(two_floats!(fill)))).unwrap();
    assert_eq!(run(&reg, "fill", DType::F32).unwrap().to_vec::<f32>().unwrap(), [3.0; 3]);
    assert_eq!(run(&reg, "fill", DType::F64).unwrap().to_vec::<f64>().unwrap(), [3.0; 3]);
}

#[test]
fn a_signature_dtype_the_resolver_cannot_serve_fails_the_registration() {
    let reg = Registry::new();
    let e = reg.register(def("fill<T: f32|f64|i32>(x: T[N]) -> (y: T[N])", Impl::Each(two_floats!(fill)))).unwrap_err();
    assert!(e.to_string().contains("the signature allows T = i32, but the cpu implementation has no i32 instantiation"), "{e}");
    assert!(reg.get("fill").is_err(), "nothing registered");
}

#[test]
fn a_device_may_cover_a_subset_and_an_uncovered_dtype_is_a_type_error_naming_device_and_dtype() {
    let reg = Registry::new();
    let only_f32: [(DType, KernelFn); 1] = [(DType::F32, fill::<f32>)];
    reg.register(def("fill<T: f32|f64>(x: T[N]) -> (y: T[N])", Impl::PerDType(only_f32[..].into()))).unwrap();
    assert_eq!(run(&reg, "fill", DType::F32).unwrap().to_vec::<f32>().unwrap(), [3.0; 3]);
    let e = run(&reg, "fill", DType::F64).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Type);
    assert!(e.to_string().starts_with("fill: no cpu implementation for f64: "), "{e}");
    assert!(e.to_string().contains("covers (f32)"), "{e}");
}

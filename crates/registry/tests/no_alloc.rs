//! The hot path of a call (bind, check, dispatch) does no heap allocation.

use dlbridge_array::Array;
use dlbridge_core::{DType, DeviceType, Result};
use dlbridge_registry::{Arg, Call, Impl, KernelDef, KernelOpts, Registry};

#[global_allocator]
static GLOBAL: dlbridge_core::testing::CountingAllocator = dlbridge_core::testing::CountingAllocator;

fn allocations() -> usize {
    dlbridge_core::testing::CountingAllocator::count()
}

fn add_f32(call: &mut Call<'_, '_>) -> Result<()> {
    let name = call.kernel_name();
    let (args, outs) = call.split();
    let ([Arg::Tensor(a), Arg::Tensor(b)], [c]) = (&*args, outs) else { return Err(dlbridge_registry::call::layout_bug(name)) };
    let (a, b) = (a.as_slice::<f32>()?, b.as_slice::<f32>()?);
    for ((o, x), y) in c.as_slice_mut::<f32>()?.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
    Ok(())
}

static ADD: [(DType, dlbridge_registry::KernelFn); 2] = [(DType::F32, add_f32), (DType::F64, add_f32)];

#[test]
fn a_checked_call_on_three_tiny_arrays_does_not_allocate() {
    let reg = Registry::new();
    reg.register(KernelDef {
        signature: "add<T: f32|f64>(a: T[...S], b: T[...S]) -> (out: T[...S])".into(),
        device: DeviceType::CPU,
        imp: Impl::PerDType(ADD[..].into()),
        opts: KernelOpts::ELEMENTWISE,
        origin: "test".into(),
        doc: String::new(),
        identity: String::new(),
    })
    .unwrap();
    let k = reg.get("add").unwrap();
    let a = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let b = Array::from_slice(&[10.0f32, 20.0], &[2]).unwrap();
    let mut c = Array::zeros(DType::F32, &[2]).unwrap();
    let before = allocations();
    for _ in 0..100 {
        let mut args = [Arg::Tensor(a.view()), Arg::Tensor(b.view())];
        let mut outs = [c.view_mut().unwrap()];
        k.call(&mut args, &mut outs).unwrap();
    }
    let during = allocations() - before;
    assert_eq!(during, 0, "{during} heap allocations in 100 calls");
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![11.0, 22.0]);
}

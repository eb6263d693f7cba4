//! The built-in `add` called through the registry allocates nothing per call.

use dlbridge::{Arg, Array, DType, get_kernel};

#[global_allocator]
static GLOBAL: dlbridge_core::testing::CountingAllocator = dlbridge_core::testing::CountingAllocator;

#[test]
fn builtin_add_on_tiny_arrays_does_not_allocate() {
    let k = get_kernel("add").unwrap();
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    let b = Array::from_slice(&[2.0f32], &[1]).unwrap();
    let mut c = Array::zeros(DType::F32, &[1]).unwrap();
    let before = dlbridge_core::testing::CountingAllocator::count();
    for _ in 0..1000 {
        k.call(&mut [Arg::Tensor(a.view()), Arg::Tensor(b.view())], &mut [c.view_mut().unwrap()]).unwrap();
    }
    assert_eq!(dlbridge_core::testing::CountingAllocator::count() - before, 0);
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![3.0]);
}

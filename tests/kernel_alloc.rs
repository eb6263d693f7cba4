//! The built-in `add` called through the registry allocates nothing per call.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use dlbridge::{Arg, Array, DType, get_kernel};

struct Counting;
thread_local! {
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every request to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn builtin_add_on_tiny_arrays_does_not_allocate() {
    let k = get_kernel("add").unwrap();
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    let b = Array::from_slice(&[2.0f32], &[1]).unwrap();
    let mut c = Array::zeros(DType::F32, &[1]).unwrap();
    let before = COUNT.with(|c| c.get());
    for _ in 0..1000 {
        k.call(&mut [Arg::Tensor(a.view()), Arg::Tensor(b.view())], &mut [c.view_mut().unwrap()]).unwrap();
    }
    assert_eq!(COUNT.with(|c| c.get()) - before, 0);
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![3.0]);
}

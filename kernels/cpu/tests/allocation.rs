//! Scratch buffers sized by a kernel's inputs are allocated fallibly: a
//! broadcast (zero-stride) input of 2^46 elements is an OutOfMemory error,
//! never an abort (or, for the last-dim reductions, needs no scratch at all).

use dlbridge_array::Array;
use dlbridge_core::{DType, ErrorKind, TensorView};
use dlbridge_registry::{Arg, Registry};

fn call(name: &str, x: TensorView<'_>, out: &mut Array) -> dlbridge_core::Result<()> {
    dlbridge_cpu::link();
    let kernel = Registry::global().get(name)?;
    kernel.call(&mut [Arg::Tensor(x)], &mut [out.view_mut()?])
}

#[test]
fn sum_all_of_a_broadcast_input_of_2_pow_46_elements_is_out_of_memory() {
    let one = [1.0f32];
    let shape = [1i64 << 46];
    let x = TensorView::from_slice_strided(&one, &shape, Some(&[0]), 0).unwrap();
    assert_eq!(x.numel(), 1 << 46);
    for name in ["sum_all", "mean_all"] {
        let mut out = Array::zeros(DType::F32, &[]).unwrap();
        let e = call(name, x.clone(), &mut out).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Memory, "{name}: {e}");
    }
}

#[test]
fn sum_over_the_last_dim_of_a_broadcast_matrix_needs_no_scratch_and_reads_each_row_once() {
    // 2^46 logical elements: rows of stride 0 are one value repeated, summed as
    // value * n (no gathered copy, no N reads per row).
    let one = [1.0f64];
    let shape = [1i64 << 23, 1 << 23];
    let x = TensorView::from_slice_strided(&one, &shape, Some(&[0, 0]), 0).unwrap();
    for name in ["sum", "mean"] {
        let mut out = Array::zeros(DType::F64, &[1 << 23]).unwrap();
        call(name, x.clone(), &mut out).unwrap();
        let want = if name == "sum" { (1u64 << 23) as f64 } else { 1.0 };
        assert!(out.to_vec::<f64>().unwrap().iter().all(|&v| v == want), "{name}");
    }
}

#[test]
fn small_broadcast_inputs_still_reduce_into_any_output_layout() {
    let one = [2.0f32];
    let shape = [3i64, 4];
    let x = TensorView::from_slice_strided(&one, &shape, Some(&[0, 0]), 0).unwrap();
    let mut out = Array::zeros(DType::F32, &[3]).unwrap();
    call("sum", x.clone(), &mut out).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![8.0; 3]);
    // Strided outputs go through the staged (fallibly allocated) paths.
    let mut every_other = Array::zeros(DType::F32, &[6]).unwrap().slice(0, 0, 6, 2).unwrap();
    call("sum", x.clone(), &mut every_other).unwrap();
    assert_eq!(every_other.to_vec::<f32>().unwrap(), vec![8.0; 3]);
    let mut transposed = Array::zeros(DType::F32, &[4, 3]).unwrap().t().unwrap();
    assert!(!transposed.is_contiguous());
    call("softmax", x, &mut transposed).unwrap();
    assert_eq!(transposed.to_vec::<f32>().unwrap(), vec![0.25; 12]);
}

//! Device memory on a real GPU: host round trips, DLPack export with zero
//! copies, the pool's reuse under the driver. Without a CUDA driver and
//! device each test prints `skipped: <reason>` and returns.

use dlbridge_array::Array;
use dlbridge_core::{DType, Device};
use dlbridge_cuda::{CudaArray, CudaDevice};

fn device_or_skip() -> Option<std::sync::Arc<CudaDevice>> {
    if let Some(reason) = dlbridge_cuda::skip_reason() {
        eprintln!("skipped: {reason}");
        return None;
    }
    Some(CudaDevice::get(0).expect("a device the driver reports"))
}

/// [`device_or_skip`], and the global registry with the built-in CPU and CUDA
/// kernels linked in.
fn device_and_builtins_or_skip() -> Option<(std::sync::Arc<CudaDevice>, &'static dlbridge_registry::Registry)> {
    let dev = device_or_skip()?;
    dlbridge_cpu::link();
    dlbridge_cuda::link();
    Some((dev, dlbridge_registry::Registry::global()))
}

#[test]
fn host_arrays_round_trip_through_device_memory() {
    let Some(dev) = device_or_skip() else { return };
    let host = Array::from_slice(&[1.0f32, -2.5, 3.0, f32::NAN, 0.0, 7.0], &[2, 3]).unwrap();
    let d = CudaArray::from_host(&dev, &host).unwrap();
    assert_eq!(d.device(), Device::cuda(0));
    let back = d.to_host().unwrap();
    let (a, b) = (host.to_vec::<f32>().unwrap(), back.to_vec::<f32>().unwrap());
    assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    // A transposed host array arrives compact, in logical order.
    let t = CudaArray::from_host(&dev, &host.t().unwrap()).unwrap();
    assert_eq!(t.shape(), &[3, 2]);
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(t.to_host().unwrap().to_vec::<f32>().unwrap()), bits(host.t().unwrap().to_vec::<f32>().unwrap()));
}

#[test]
fn copies_of_strided_device_views_keep_their_layout_and_values() {
    let Some(_dev) = device_or_skip() else { return };
    let host = Array::from_vec((0..24).map(f64::from).collect::<Vec<_>>(), &[4, 6]).unwrap();
    let m = dlbridge_cuda::array::copy_from_host(0, &host).unwrap();
    let d = Array::from_managed(m).unwrap();
    assert_eq!(d.device(), Device::cuda(0));
    // A reversed, stepped, transposed view: its byte span is copied, its strides kept.
    let v = d.slice(0, -1, i64::MIN, -2).unwrap().t().unwrap();
    let want = host.slice(0, -1, i64::MIN, -2).unwrap().t().unwrap().to_vec::<f64>().unwrap();
    let h = dlbridge_cuda::array::copy_to_host(&v.view()).unwrap();
    assert_eq!((h.shape(), h.strides()), (v.shape(), v.strides()));
    assert_eq!(h.to_vec::<f64>().unwrap(), want);
    let c = Array::from_managed(dlbridge_cuda::array::copy_on_device(&v.view()).unwrap()).unwrap();
    assert_ne!(c.data_ptr(), v.data_ptr());
    assert_eq!(dlbridge_cuda::array::copy_to_host(&c.view()).unwrap().to_vec::<f64>().unwrap(), want);
}

#[test]
fn stream_waits_are_queued_only_across_streams() {
    let Some(dev) = device_or_skip() else { return };
    let before = dev.stream_waits();
    dev.stream_wait(0, 1).unwrap(); // NULL and 1 are both the legacy default stream
    dev.stream_wait(1, 1).unwrap();
    assert_eq!(dev.stream_waits(), before);
    dev.stream_wait(1, 2).unwrap(); // legacy -> per-thread default stream
    assert_eq!(dev.stream_waits(), before + 1);
}

#[test]
fn a_pool_block_marked_lent_is_freed_to_the_driver() {
    let Some(dev) = device_or_skip() else { return };
    let m = dlbridge_cuda::array::empty_pooled(0, DType::F32, &[300, 301]).unwrap();
    let ptr = m.view().data_ptr() as u64;
    assert!(dev.mark_lent(ptr + 1000));
    let before = dev.pool_stats();
    drop(m);
    let after = dev.pool_stats();
    assert_eq!((after.raw_frees, after.bytes_cached), (before.raw_frees + 1, before.bytes_cached));
}

#[test]
fn dlpack_export_is_kdlcuda_with_the_same_device_pointer() {
    let Some(dev) = device_or_skip() else { return };
    let a = CudaArray::empty(&dev, DType::F32, &[4, 5]).unwrap();
    let ptr = a.device_ptr();
    let m = a.into_dlpack().unwrap();
    assert_eq!(m.device(), Device::cuda(0));
    assert_eq!(m.view().data_ptr() as u64, ptr, "exported with a copy");
    assert_eq!(m.shape(), &[4, 5]);
    let before = dev.pool_stats();
    drop(m); // the deleter frees the block (not cached: the consumer's streams are unknown)
    let after = dev.pool_stats();
    assert_eq!(after.bytes_in_use, before.bytes_in_use - 512);
    assert_eq!((after.raw_frees, after.bytes_cached), (before.raw_frees + 1, before.bytes_cached));
}

#[test]
fn repeated_allocations_of_one_shape_call_cumemalloc_once() {
    let Some(dev) = device_or_skip() else { return };
    let start = dev.pool_stats();
    for _ in 0..50 {
        let a = CudaArray::empty(&dev, DType::F32, &[1000, 1000]).unwrap();
        drop(a);
    }
    let s = dev.pool_stats();
    assert!(s.raw_allocs - start.raw_allocs <= 1, "{s:?}");
    assert!(s.hits - start.hits >= 49, "{s:?}");
}

/// Values in [-4, 4), deterministic.
fn values(n: usize) -> Vec<f32> {
    dlbridge_core::testing::values(n, 0x2545_f491_4f6c_dd1d)
}

fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: {g} vs {w}");
    }
}

#[test]
fn builtin_cuda_kernels_match_the_cpu_kernels_on_every_layout() {
    let Some((dev, reg)) = device_and_builtins_or_skip() else { return };
    let (r, c) = (64i64, 300i64);
    let a = Array::from_vec(values((r * c) as usize), &[r, c]).unwrap();
    let b = Array::from_vec(values((r * c) as usize + 7)[7..].to_vec(), &[r, c]).unwrap();
    let (da, db) = (CudaArray::from_host(&dev, &a).unwrap(), CudaArray::from_host(&dev, &b).unwrap());
    // b transposed on both sides: a (c, r) array read with strides (1, c).
    let bt_host = b.t().unwrap().contiguous().unwrap();
    let dbt = CudaArray::from_host(&dev, &bt_host).unwrap();
    let (shape, tstrides) = ([r, c], [1i64, r]);
    for name in ["add", "mul"] {
        let k = reg.get(name).unwrap();
        let mut want = Array::zeros(DType::F32, &[r, c]).unwrap();
        k.call(&mut [dlbridge_registry::Arg::Tensor(a.view()), dlbridge_registry::Arg::Tensor(b.view())], &mut [want.view_mut().unwrap()])
            .unwrap();
        for (layout, bv) in [("contiguous", db.view().unwrap()), ("transposed", dbt.view_strided(&shape, &tstrides).unwrap())] {
            let mut out = CudaArray::empty(&dev, DType::F32, &[r, c]).unwrap();
            k.call(
                &mut [dlbridge_registry::Arg::Tensor(da.view().unwrap()), dlbridge_registry::Arg::Tensor(bv)],
                &mut [out.view_mut().unwrap()],
            )
            .unwrap();
            close(&out.to_host().unwrap().to_vec::<f32>().unwrap(), &want.to_vec::<f32>().unwrap(), 0.0, &format!("{name} {layout}"));
        }
    }
    for (name, tol) in [("relu", 0.0), ("gelu", 1e-6), ("softmax", 1e-6)] {
        let k = reg.get(name).unwrap();
        let mut want = Array::zeros(DType::F32, &[r, c]).unwrap();
        k.call(&mut [dlbridge_registry::Arg::Tensor(a.view())], &mut [want.view_mut().unwrap()]).unwrap();
        let mut out = CudaArray::empty(&dev, DType::F32, &[r, c]).unwrap();
        k.call(&mut [dlbridge_registry::Arg::Tensor(da.view().unwrap())], &mut [out.view_mut().unwrap()]).unwrap();
        close(&out.to_host().unwrap().to_vec::<f32>().unwrap(), &want.to_vec::<f32>().unwrap(), tol, name);
    }
    let k = reg.get("sum").unwrap();
    let mut want = Array::zeros(DType::F32, &[r]).unwrap();
    k.call(&mut [dlbridge_registry::Arg::Tensor(a.view())], &mut [want.view_mut().unwrap()]).unwrap();
    let mut out = CudaArray::empty(&dev, DType::F32, &[r]).unwrap();
    k.call(&mut [dlbridge_registry::Arg::Tensor(da.view().unwrap())], &mut [out.view_mut().unwrap()]).unwrap();
    close(&out.to_host().unwrap().to_vec::<f32>().unwrap(), &want.to_vec::<f32>().unwrap(), 1e-5, "sum");
}

#[test]
fn row_reductions_match_the_cpu_kernels_in_every_launch_shape() {
    let Some((dev, reg)) = device_and_builtins_or_skip() else { return };
    // A warp a row, a block a row, rows split into pieces (few long rows), one long row.
    for (r, c) in [(300i64, 100i64), (50, 3000), (3, 200_000), (1, 1 << 21)] {
        let a = Array::from_vec(values((r * c) as usize), &[r, c]).unwrap();
        let da = CudaArray::from_host(&dev, &a).unwrap();
        for (name, shape, tol) in [
            ("softmax", vec![r, c], 1e-5f32),
            ("sum", vec![r], 1e-4),
            ("mean", vec![r], 1e-5),
            ("sum_all", vec![], 1e-4),
            ("mean_all", vec![], 1e-5),
        ] {
            let k = reg.get(name).unwrap();
            let mut want = Array::zeros(DType::F32, &shape).unwrap();
            k.call(&mut [dlbridge_registry::Arg::Tensor(a.view())], &mut [want.view_mut().unwrap()]).unwrap();
            let mut out = CudaArray::empty(&dev, DType::F32, &shape).unwrap();
            k.call(&mut [dlbridge_registry::Arg::Tensor(da.view().unwrap())], &mut [out.view_mut().unwrap()]).unwrap();
            // Sums relative to the magnitude they add up (values in [-4, 4)).
            let scale = if name.starts_with("sum") { (c as f32).sqrt() * 4.0 } else { 1.0 };
            let got: Vec<f32> = out.to_host().unwrap().to_vec::<f32>().unwrap().iter().map(|v| v / scale).collect();
            let want: Vec<f32> = want.to_vec::<f32>().unwrap().iter().map(|v| v / scale).collect();
            close(&got, &want, tol, &format!("{name} {r}x{c}"));
        }
    }
}

#[test]
fn a_strided_view_outside_the_array_is_refused() {
    let Some(dev) = device_or_skip() else { return };
    let a = CudaArray::empty(&dev, DType::F32, &[4, 4]).unwrap();
    let e = a.view_strided(&[4, 4], &[200, 1]).unwrap_err();
    assert!(e.to_string().contains("device array"), "{e}");
}

#[test]
fn matmul_through_cublas_matches_the_cpu_on_transposed_operands() {
    let Some((dev, reg)) = device_and_builtins_or_skip() else { return };
    let k = reg.get("matmul").unwrap();
    let (m, kk, n) = (37i64, 53i64, 29i64);
    let a = Array::from_vec(values((m * kk) as usize), &[m, kk]).unwrap();
    let b = Array::from_vec(values((kk * n) as usize + 3)[3..].to_vec(), &[kk, n]).unwrap();
    let mut want = Array::zeros(DType::F32, &[m, n]).unwrap();
    k.call(&mut [dlbridge_registry::Arg::Tensor(a.view()), dlbridge_registry::Arg::Tensor(b.view())], &mut [want.view_mut().unwrap()])
        .unwrap();
    let da = CudaArray::from_host(&dev, &a).unwrap();
    // b stored transposed (column-major): cuBLAS reads it with op T.
    let dbt = CudaArray::from_host(&dev, &b.t().unwrap().contiguous().unwrap()).unwrap();
    let (bshape, bstrides) = ([kk, n], [1i64, kk]);
    for bv in [CudaArray::from_host(&dev, &b).unwrap(), dbt] {
        let view = if bv.shape() == [kk, n] { bv.view().unwrap() } else { bv.view_strided(&bshape, &bstrides).unwrap() };
        let mut out = CudaArray::empty(&dev, DType::F32, &[m, n]).unwrap();
        k.call(
            &mut [dlbridge_registry::Arg::Tensor(da.view().unwrap()), dlbridge_registry::Arg::Tensor(view)],
            &mut [out.view_mut().unwrap()],
        )
        .unwrap();
        close(&out.to_host().unwrap().to_vec::<f32>().unwrap(), &want.to_vec::<f32>().unwrap(), 1e-4, "matmul");
    }
}

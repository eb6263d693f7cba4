//! The built-in CUDA kernels as registry implementations for `cuda` tensors:
//! add, mul, relu, gelu (any layouts); softmax, sum and mean over the last
//! dim; sum and mean of every element (long rows in few rows, and a sum of
//! everything, in two passes through a workspace from the device's pool);
//! f32, f64, f16 and bf16 (the signatures are the CPU kernels', so a call
//! picks the implementation by its tensors' device; i32/i64 on CUDA is a type
//! error naming what each device covers).
//!
//! Each kernel is compiled from `kernels/cuda/cu` by NVRTC on first use (for the
//! device's compute capability, cached in memory and on disk), loaded into the
//! device's context once, and launched on the caller's stream (the registry
//! call's stream handle; NULL is the legacy default stream), never synchronised.

use std::ffi::c_void;

use dlbridge_core::DeviceType;
use dlbridge_core::{DType, Error, Result, TensorView, TensorViewMut};
use dlbridge_registry::{Arg, Call, register_kernel};

use crate::array::CudaDevice;
use crate::builtins;
use crate::indexer::Indexer;
use crate::launch::{self, Launch};
use crate::raw;

fn suffix(dtype: DType) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        other => return Err(Error::DTypeMismatch { expected: "f32, f64, f16 or bf16 on CUDA".into(), got: other }),
    })
}

/// The device and compiled function of `op` for `dtype`, the device's context current.
fn function(op: &str, dtype: DType, device_id: i32) -> Result<(std::sync::Arc<CudaDevice>, cudarc::driver::CudaFunction)> {
    let entry = format!("dlbridge_{op}_{}", suffix(dtype)?);
    let source = builtins::source_of(op).ok_or_else(|| Error::NotFound(format!("CUDA source of {op}")))?;
    let ordinal = usize::try_from(device_id).map_err(|_| Error::InvalidArgument(format!("cuda device id {device_id}")))?;
    let dev = CudaDevice::get(ordinal)?;
    let f = dev.builtin_function(source, &entry)?;
    dev.bind()?;
    Ok((dev, f))
}

fn ptr_of(v: &TensorView<'_>) -> u64 {
    v.data_ptr() as usize as u64
}

fn run(f: &cudarc::driver::CudaFunction, cfg: Option<Launch>, stream: *mut c_void, params: &mut [*mut c_void], what: &str) -> Result<()> {
    let Some(cfg) = cfg else { return Ok(()) };
    raw::launch(f.cu_function(), cfg, stream, params).map_err(|e| Error::Runtime(format!("{what}: kernel launch failed: {e}")))
}

/// Pointers to each kernel parameter, in order (each a local that outlives the launch).
macro_rules! params {
    ($($v:ident),+ $(,)?) => {
        [$((&raw mut $v).cast::<c_void>()),+]
    };
}

/// The call's dtype, stream, name, input views and output view.
struct Parts<'c, 'a> {
    dtype: DType,
    stream: *mut c_void,
    name: &'c str,
    ins: Vec<&'c TensorView<'a>>,
    out: &'c mut TensorViewMut<'a>,
}

fn parts<'c, 'a>(call: &'c mut Call<'_, 'a>) -> Result<Parts<'c, 'a>> {
    let dtype = call.dtype(0).ok_or_else(|| call.layout_bug())?;
    let (stream, name) = (call.stream(), call.kernel_name());
    let bug = call.layout_bug();
    let (args, outs) = call.split();
    let mut ins = Vec::with_capacity(args.len());
    for a in args.iter() {
        match a {
            Arg::Tensor(v) => ins.push(v),
            _ => return Err(bug),
        }
    }
    let out = outs.first_mut().ok_or(bug)?;
    Ok(Parts { dtype, stream, name, ins, out })
}

fn elementwise(op: &'static str, call: &mut Call<'_, '_>) -> Result<()> {
    let Parts { dtype, stream, name, ins, out } = parts(call)?;
    let shape = out.shape().to_vec();
    let (dev, f) = function(op, dtype, out.device().id)?;
    let mut io = Indexer::new(&shape, out.strides())?;
    let ix: Vec<Indexer> = ins.iter().map(|v| Indexer::new(&shape, v.strides())).collect::<Result<_>>()?;
    let mut contiguous = i32::from(io.is_contiguous() && ix.iter().all(Indexer::is_contiguous));
    let mut n = out.numel() as i64;
    let cfg = launch::elementwise(n as u64, dev.sm_count());
    let mut o = out.data_ptr_mut() as usize as u64;
    match (ins.as_slice(), ix.as_slice()) {
        ([a, b], [ia, ib]) => {
            let (mut a, mut ia, mut b, mut ib) = (ptr_of(a), *ia, ptr_of(b), *ib);
            let mut params = params![a, ia, b, ib, o, io, n, contiguous];
            run(&f, cfg, stream, &mut params, name)
        }
        ([x], [ixx]) => {
            let (mut x, mut ixx) = (ptr_of(x), *ixx);
            let mut params = params![x, ixx, o, io, n, contiguous];
            run(&f, cfg, stream, &mut params, name)
        }
        _ => Err(Error::InvalidArgument(format!("{name}: {} tensor inputs", ins.len()))),
    }
}

/// Rows of a last-dim operation: the batch indexer and the last dim's stride.
fn rows_of(shape: &[i64], strides: &[i64]) -> Result<(Indexer, i64)> {
    let k = shape.len().checked_sub(1).ok_or_else(|| Error::Shape("a last-dim kernel needs at least one dim".into()))?;
    Ok((Indexer::new(&shape[..k], &strides[..k])?, strides[k]))
}

/// The one input of a last-dim kernel, its row count and its row length.
fn last_dim<'c, 'a>(name: &str, ins: &[&'c TensorView<'a>]) -> Result<(&'c TensorView<'a>, i64, i64)> {
    let &[x] = ins else { return Err(Error::InvalidArgument(format!("{name}: one input expected"))) };
    let shape = x.shape();
    let cols = *shape.last().ok_or_else(|| Error::Shape(format!("{name}: a 0-d input")))?;
    Ok((x, shape[..shape.len() - 1].iter().product::<i64>(), cols))
}

/// Bytes of one partial result of `dtype` (its accumulator: f64 for f64, else f32).
fn acc_bytes(dtype: DType) -> usize {
    if dtype == DType::F64 { 8 } else { 4 }
}

/// The accumulator dtype of `dtype`'s kernels (what a workspace holds).
fn acc_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 { DType::F64 } else { DType::F32 }
}

fn softmax(call: &mut Call<'_, '_>) -> Result<()> {
    let Parts { dtype, stream, name, ins, out } = parts(call)?;
    let (x, mut rows, mut cols) = last_dim(name, &ins)?;
    let shape = x.shape();
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let (dev, f) = function("softmax", dtype, out.device().id)?;
    let (mut xrows, mut xcol) = rows_of(shape, x.strides())?;
    let (mut yrows, mut ycol) = rows_of(out.shape(), out.strides())?;
    let Some(plan) = launch::rows_within(rows as u64, cols as u64, dev.sm_count(), launch::SOFTMAX_MAX_BLOCK) else { return Ok(()) };
    let mut warp_rows = i32::from(plan.warp_rows);
    let (mut xp, mut yp) = (ptr_of(x), out.data_ptr_mut() as usize as u64);
    if plan.splits == 1 {
        let mut params = params![xp, xrows, xcol, yp, yrows, ycol, rows, cols, warp_rows];
        return run(&f, Some(plan.launch), stream, &mut params, name);
    }
    // Split rows: (max, sum) per piece, then every piece merges its row's and writes.
    let (mut splits, mut chunk) = (plan.splits as i64, plan.chunk as i64);
    let ws = dev.workspace(rows as usize * plan.splits as usize * 2 * acc_bytes(dtype), stream)?;
    let mut wp = ws.ptr();
    let (_, partial) = function("softmax_partial", dtype, out.device().id)?;
    let mut params = params![xp, xrows, xcol, wp, rows, cols, splits, chunk, warp_rows];
    run(&partial, Some(plan.launch), stream, &mut params, name)?;
    let (_, finish) = function("softmax_finish", dtype, out.device().id)?;
    let mut params = params![xp, xrows, xcol, yp, yrows, ycol, wp, rows, cols, splits, chunk, warp_rows];
    run(&finish, Some(plan.launch), stream, &mut params, name)
}

/// `y[r] = scale * sum(partial[r * count .. (r + 1) * count])` for `rows`
/// rows of acc-typed partial results at device address `wp`; a single long
/// row is first cut down by a split pass of its own.
#[allow(clippy::too_many_arguments)]
fn finish_sum(
    dev: &CudaDevice,
    dtype: DType,
    stream: *mut c_void,
    name: &str,
    wp: u64,
    rows: i64,
    count: i64,
    y: u64,
    yrows: Indexer,
    scale: f64,
) -> Result<()> {
    let device = dev.ordinal() as i32;
    let Some(plan) = launch::rows(rows as u64, count as u64, dev.sm_count()) else { return Ok(()) };
    let (mut wp, mut rows, mut count, mut y, mut yrows, mut scale) = (wp, rows, count, y, yrows, scale);
    let ws;
    if plan.splits > 1 {
        // Partial sums of the partial sums (the accumulator's own kernel), then their sum.
        let (_, partial) = function("sum_partial", acc_dtype(dtype), device)?;
        ws = dev.workspace(rows as usize * plan.splits as usize * acc_bytes(dtype), stream)?;
        let (mut xrows, mut xcol, mut cols) = (Indexer::new(&[rows], &[count])?, 1i64, count);
        let (mut out, mut splits, mut chunk, mut warp_rows) = (ws.ptr(), plan.splits as i64, plan.chunk as i64, i32::from(plan.warp_rows));
        let mut params = params![wp, xrows, xcol, out, rows, cols, splits, chunk, warp_rows];
        run(&partial, Some(plan.launch), stream, &mut params, name)?;
        (wp, count) = (ws.ptr(), plan.splits as i64);
    }
    let plan = launch::rows(rows as u64, count as u64, dev.sm_count()).map(|p| (p.launch, p.warp_rows));
    let Some((cfg, warp)) = plan else { return Ok(()) };
    let mut warp_rows = i32::from(warp);
    let (_, finish) = function("sum_finish", dtype, device)?;
    let mut params = params![wp, y, yrows, rows, count, warp_rows, scale];
    run(&finish, Some(cfg), stream, &mut params, name)
}

/// A sum (`mean`: times 1 / the count) over the last dim of each row, or
/// (`all`) over every element into a 0-d output.
fn sum_like(call: &mut Call<'_, '_>, all: bool, mean: bool) -> Result<()> {
    let Parts { dtype, stream, name, ins, out } = parts(call)?;
    let &[x] = ins.as_slice() else { return Err(Error::InvalidArgument(format!("{name}: one input expected"))) };
    let device = out.device().id;
    let (dev, f) = function("sum", dtype, device)?;
    let mut yp = out.data_ptr_mut() as usize as u64;
    let mut yrows = Indexer::new(out.shape(), out.strides())?;
    // Rows and columns: the last dim for a last-dim sum; for a sum of every
    // element, the input's dims merged where contiguous, the last one as columns
    // (no dim left: a single element).
    let (mut xrows, mut xcol, mut rows, mut cols) = if all {
        let merged = Indexer::new(x.shape(), x.strides())?;
        let nd = merged.ndim as usize;
        if nd == 0 {
            (Indexer::default(), 1, 1, 1)
        } else {
            let (shape, strides) = (&merged.shape[..nd], &merged.strides[..nd]);
            let (xrows, xcol) = rows_of(shape, strides)?;
            (xrows, xcol, shape[..nd - 1].iter().product(), shape[nd - 1])
        }
    } else {
        let (_, rows, cols) = last_dim(name, &ins)?;
        let (xrows, xcol) = rows_of(x.shape(), x.strides())?;
        (xrows, xcol, rows, cols)
    };
    let count = if all { x.shape().iter().product::<i64>() } else { cols };
    let mut scale = if mean { 1.0 / count as f64 } else { 1.0 };
    if all && rows == 0 {
        // Nothing to add: 0 (NaN for a mean), written by the finishing pass.
        return finish_sum(&dev, dtype, stream, name, 0, 1, 0, yp, yrows, scale);
    }
    let Some(plan) = launch::rows(rows as u64, cols as u64, dev.sm_count()) else { return Ok(()) };
    let mut warp_rows = i32::from(plan.warp_rows);
    let mut xp = ptr_of(x);
    if plan.splits == 1 && !(all && rows > 1) {
        let mut params = params![xp, xrows, xcol, yp, yrows, rows, cols, warp_rows, scale];
        return run(&f, Some(plan.launch), stream, &mut params, name);
    }
    // Partial sums per piece (per row for a sum of every element), then their sums.
    let (mut splits, mut chunk) = (plan.splits as i64, plan.chunk as i64);
    let ws = dev.workspace(rows as usize * plan.splits as usize * acc_bytes(dtype), stream)?;
    let mut wp = ws.ptr();
    let (_, partial) = function("sum_partial", dtype, device)?;
    let mut params = params![xp, xrows, xcol, wp, rows, cols, splits, chunk, warp_rows];
    run(&partial, Some(plan.launch), stream, &mut params, name)?;
    // One row of every partial sum for a sum of everything, else a row of pieces per row.
    let (out_rows, per_row) = if all { (1, rows * splits) } else { (rows, splits) };
    finish_sum(&dev, dtype, stream, name, wp, out_rows, per_row, yp, yrows, scale)
}

fn sum(call: &mut Call<'_, '_>) -> Result<()> {
    sum_like(call, false, false)
}

fn mean(call: &mut Call<'_, '_>) -> Result<()> {
    sum_like(call, false, true)
}

fn sum_all(call: &mut Call<'_, '_>) -> Result<()> {
    sum_like(call, true, false)
}

fn mean_all(call: &mut Call<'_, '_>) -> Result<()> {
    sum_like(call, true, true)
}

/// The elementwise kernels: one function each, named as its `.cu` kernel.
macro_rules! elementwise_kernels {
    ($($name:ident),+) => {$(
        fn $name(call: &mut Call<'_, '_>) -> Result<()> {
            elementwise(stringify!($name), call)
        }
    )+};
}
elementwise_kernels!(add, mul, relu, gelu);

// The CUDA implementations of the CPU kernels of these names (kernels/cpu
// declares their signatures and options).
register_kernel!("add", dispatch { F32 => add, F64 => add, F16 => add, BF16 => add }, device = DeviceType::CUDA, doc = "elementwise a + b");
register_kernel!("mul", dispatch { F32 => mul, F64 => mul, F16 => mul, BF16 => mul }, device = DeviceType::CUDA, doc = "elementwise a * b");
register_kernel!("relu", dispatch { F32 => relu, F64 => relu, F16 => relu, BF16 => relu }, device = DeviceType::CUDA, doc = "max(x, 0), NaN-propagating");
register_kernel!("gelu", dispatch { F32 => gelu, F64 => gelu, F16 => gelu, BF16 => gelu }, device = DeviceType::CUDA, doc = "x * Phi(x) with the exact erf");
register_kernel!("softmax", dispatch { F32 => softmax, F64 => softmax, F16 => softmax, BF16 => softmax }, device = DeviceType::CUDA, doc = "softmax over the last dim");
register_kernel!("sum", dispatch { F32 => sum, F64 => sum, F16 => sum, BF16 => sum }, device = DeviceType::CUDA, doc = "sum over the last dim");
register_kernel!("mean", dispatch { F32 => mean, F64 => mean, F16 => mean, BF16 => mean }, device = DeviceType::CUDA, doc = "mean over the last dim (NaN for an empty dim)");
register_kernel!("sum_all", dispatch { F32 => sum_all, F64 => sum_all, F16 => sum_all, BF16 => sum_all }, device = DeviceType::CUDA, doc = "sum of every element, as a 0-d tensor");
register_kernel!("mean_all", dispatch { F32 => mean_all, F64 => mean_all, F16 => mean_all, BF16 => mean_all }, device = DeviceType::CUDA, doc = "mean of every element, as a 0-d tensor");

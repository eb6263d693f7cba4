//! The built-in CUDA kernels as registry implementations for `cuda` tensors:
//! add, mul, relu, gelu (any layouts), softmax and sum over the last dim;
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
    let plan = launch::rows(rows as u64, cols as u64, dev.sm_count());
    let mut warp_rows = i32::from(plan.is_some_and(|p| p.warp_rows));
    let (mut xp, mut yp) = (ptr_of(x), out.data_ptr_mut() as usize as u64);
    let mut params = params![xp, xrows, xcol, yp, yrows, ycol, rows, cols, warp_rows];
    run(&f, plan.map(|p| p.launch), stream, &mut params, name)
}

fn sum(call: &mut Call<'_, '_>) -> Result<()> {
    let Parts { dtype, stream, name, ins, out } = parts(call)?;
    let (x, mut rows, mut cols) = last_dim(name, &ins)?;
    let shape = x.shape();
    if rows == 0 {
        return Ok(());
    }
    let (dev, f) = function("sum", dtype, out.device().id)?;
    let (mut xrows, mut xcol) = rows_of(shape, x.strides())?;
    let mut yrows = Indexer::new(out.shape(), out.strides())?;
    let plan = launch::rows(rows as u64, cols as u64, dev.sm_count());
    let mut warp_rows = i32::from(plan.is_some_and(|p| p.warp_rows));
    let (mut xp, mut yp) = (ptr_of(x), out.data_ptr_mut() as usize as u64);
    let mut params = params![xp, xrows, xcol, yp, yrows, rows, cols, warp_rows];
    run(&f, plan.map(|p| p.launch), stream, &mut params, name)
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

//! # dlbridge-tch
//!
//! PyTorch tensors in Rust (`tch`) and dlbridge, both ways with zero copies.
//!
//! | what | zero copy | how |
//! |------|-----------|-----|
//! | `tch::Tensor` -> [`ManagedTensor`] ([`to_dlpack`]) | yes | `at::toDLPackVersioned`: torch keeps the storage alive until the DLPack deleter runs |
//! | [`ManagedTensor`] -> `tch::Tensor` ([`from_dlpack`]) | yes | `at::fromDLPackVersioned`: the deleter runs when torch frees the storage |
//! | kernel arguments ([`call`], [`call_into`]) | yes | `at::toDLPackNonOwning`: borrowed views, no allocation; every tensor of a call lent in one shim call |
//! | kernel outputs ([`call`]) | allocated by tch (`Tensor::empty`) on the inputs' device | |
//!
//! [`kernel`] makes a registry kernel a function of tch tensors:
//! `dlbridge_tch::kernel("gelu")?.call1(&x)?` is a `tch::Tensor`, with tensors
//! and scalars in one argument list (`.call1((&x, 0.5))`) and errors that `?`
//! turns into `tch::TchError` or `dlbridge::Error`.
//!
//! Dtypes: every tch `Kind` DLPack expresses (f16, bf16, f32, f64, i8, u8,
//! i16, i32, i64, bool, complex32/64/128, float8 kinds); quantized kinds are
//! refused. Devices: CPU and CUDA device types (CUDA tensors need a CUDA build
//! of torch and a kernel registered for CUDA). Tensors that require grad are
//! refused (call `detach()`: dlbridge kernels do not record gradients); sparse
//! tensors are refused by torch's DLPack export and reported as errors.
//!
//! Threads: a registry kernel called through [`call`] or [`call_into`] uses at
//! most torch's intra-op thread count (`tch::get_num_threads`, asked only
//! when the kernel is large enough to split; [`with_torch_threads`]), never
//! more than `DLBRIDGE_NUM_THREADS`.
//!
//! The C++ shim (`shim.cpp`) is compiled by `build.rs` against the torch that
//! torch-sys links (`LIBTORCH_USE_PYTORCH=1` with torch==2.13.0), and the
//! library directory is put on the rpath. Unsafe code lives in `raw`.
#![deny(unsafe_code)]

mod func;
#[allow(unsafe_code)]
mod raw;

pub use func::{Arg, ArgList, Args, KernelError, KernelResult, TchKernel, kernel};

use dlbridge_core::{DType, Device, Error, Flags, ManagedTensor, Result, Slot, TensorView, TensorViewMut};
use dlbridge_registry::binding::{Adapter, Allocator, Job, Operand};
use dlbridge_registry::signature::ScalarKind;
use dlbridge_registry::{Kernel, OutputSpec};
use tch::{Kind, Tensor};

/// The libtorch directory this crate was built against.
pub const LIBTORCH_DIR: &str = env!("DLBRIDGE_TCH_LIBTORCH");

/// A scalar argument of [`call`] (the registry's).
pub use dlbridge_registry::Scalar;

/// The tch kind of a dtype, for allocating outputs.
pub fn kind_of(dtype: DType) -> Result<Kind> {
    Ok(match dtype {
        DType::F16 => Kind::Half,
        DType::BF16 => Kind::BFloat16,
        DType::F32 => Kind::Float,
        DType::F64 => Kind::Double,
        DType::I8 => Kind::Int8,
        DType::U8 => Kind::Uint8,
        DType::I16 => Kind::Int16,
        DType::I32 => Kind::Int,
        DType::I64 => Kind::Int64,
        DType::BOOL => Kind::Bool,
        DType::C64 => Kind::ComplexFloat,
        DType::C128 => Kind::ComplexDouble,
        other => return Err(Error::DTypeMismatch { expected: "a dtype tch can allocate".into(), got: other }),
    })
}

fn device_of(d: Device) -> Result<tch::Device> {
    match d.kind {
        dlbridge_core::DeviceType::CPU => Ok(tch::Device::Cpu),
        dlbridge_core::DeviceType::CUDA => Ok(tch::Device::Cuda(d.id as usize)),
        _ => Err(Error::UnsupportedDevice { got: d, what: "tch allocates on cpu or cuda".into() }),
    }
}

fn check_exportable(t: &Tensor, what: &str) -> Result<()> {
    if t.requires_grad() {
        return Err(Error::InvalidArgument(format!(
            "{what}: the tensor requires grad; call detach() first (dlbridge kernels do not record gradients)"
        )));
    }
    if t.is_sparse() {
        return Err(Error::Buffer(format!("{what}: sparse tensors have no DLPack form")));
    }
    if matches!(t.kind(), Kind::QInt8 | Kind::QUInt8 | Kind::QInt32) {
        return Err(Error::DTypeMismatch { expected: "a non-quantized kind".into(), got: DType::U8 }
            .context(format!("{what}: quantized tensor ({:?})", t.kind())));
    }
    Ok(())
}

/// Exports a tch tensor as DLPack with zero copies (torch keeps the storage
/// alive until the DLPack deleter runs).
pub fn to_dlpack(t: &Tensor) -> Result<ManagedTensor> {
    check_exportable(t, "to_dlpack")?;
    raw::to_managed(t)
}

/// Imports a DLPack tensor into tch with zero copies; the DLPack deleter runs
/// when torch frees the storage. Refused (cleanly, and the tensor released): a
/// READ_ONLY tensor (tch tensors are writable) and negative strides (torch
/// would abort the process on them).
pub fn from_dlpack(m: ManagedTensor) -> Result<Tensor> {
    // torch aborts the process (an exception thrown past a noexcept frame inside
    // at::fromDLPack) on negative strides: refuse them cleanly before it sees them.
    if let Some(d) = m.shape().iter().zip(m.strides()).position(|(&n, &s)| n > 1 && s < 0) {
        return Err(Error::InvalidArgument(format!(
            "from_dlpack: torch tensors cannot have negative strides (dim {d} has stride {}); copy the tensor to a contiguous one first",
            m.strides()[d]
        )));
    }
    if m.is_read_only() {
        return Err(Error::ReadOnly { what: "from_dlpack: tch tensors are writable, so a READ_ONLY DLPack tensor".into() });
    }
    // Everything torch could throw on is refused here, while we still own the
    // tensor (its deleter then runs on drop): torch leaks a DLPack tensor it
    // fails to import.
    let dtype = m.dtype();
    let torch_has = kind_of(dtype).is_ok() || ["f8_e4m3fn", "f8_e5m2", "f8_e4m3fnuz", "f8_e5m2fnuz"].contains(&dtype.to_string().as_str());
    if !torch_has || m.is_subbyte_padded() {
        return Err(Error::DTypeMismatch { expected: "a dtype torch has".into(), got: dtype }.context("from_dlpack"));
    }
    device_of(m.device()).map_err(|e| e.context("from_dlpack"))?;
    raw::from_managed(m)
}

/// Runs `kernel` on tch tensors: `tensors` are the signature's tensor
/// parameters in order (`mut` ones are written in place), `scalars` its
/// scalars in order. Outputs are allocated with tch on the inputs' device from
/// the shapes the signature gives, and returned.
pub fn call(kernel: &Kernel, tensors: &[&Tensor], scalars: &[Scalar]) -> Result<Vec<Tensor>> {
    let mut lending = raw::Lending::new(tensors, &[]);
    let lent = lending.lend();
    let ins = (0..lent.len()).map(|i| (lent, i));
    let none = None::<[(&raw::Lending<'_>, usize); 0]>;
    let stream = lent.stream()?;
    let mut binding = kernel.binding();
    kernel.bind_into(&mut Lent, dlbridge_registry::Args::split(ins, scalars, none), &mut binding)?;
    let outs = binding.run_with(&mut TchAllocator, stream, run_with_torch_threads)?;
    Ok(outs.into_iter().map(|o| o.0).collect())
}

/// Like [`call`], writing into the given output tensors instead (destination-passing style).
pub fn call_into(kernel: &Kernel, tensors: &[&Tensor], scalars: &[Scalar], outputs: &[&Tensor]) -> Result<()> {
    // Every tensor lent in one shim call, checked (as the binding layer binds
    // each one) in the same order and with the same errors as [`Tch`].
    let mut lending = raw::Lending::new(tensors, outputs);
    let lent = lending.lend();
    let (ins, outs) = ((0..tensors.len()).map(|i| (lent, i)), (tensors.len()..lent.len()).map(|i| (lent, i)));
    let stream = lent.stream()?;
    let mut binding = kernel.binding();
    kernel.bind_into(&mut Lent, dlbridge_registry::Args::split(ins, scalars, Some(outs)), &mut binding)?;
    binding.run_with(&mut TchAllocator, stream, run_with_torch_threads).map(drop)
}

/// Runs a kernel call under [`with_torch_threads`].
fn run_with_torch_threads(job: Job<'_>) -> Result<()> {
    with_torch_threads(|| job.run())
}

/// Runs `f` (a kernel call) with registry kernels limited to torch's intra-op
/// thread count (`tch::get_num_threads`, never more than `DLBRIDGE_NUM_THREADS`):
/// between torch operations a kernel uses no more cores than torch would.
/// Torch is asked only when a kernel is large enough to split.
#[inline]
pub fn with_torch_threads<R>(f: impl FnOnce() -> R) -> R {
    dlbridge_registry::threads::with_num_threads_from(torch_threads, f)
}

/// Torch's intra-op thread count (at least 1).
pub fn torch_threads() -> usize {
    usize::try_from(tch::get_num_threads()).unwrap_or(1).max(1)
}

/// The binding layer's [`Adapter`] for tch tensors, one at a time ([`call`]
/// and [`call_into`] lend all of a call's tensors at once, then bind them the
/// same way).
#[derive(Debug, Clone, Copy, Default)]
pub struct Tch;

/// A tch tensor bound to a kernel argument: its view, taken once when bound
/// (the binding layer calls no tch code between binding and the kernel's end).
#[derive(Debug)]
pub struct TchOperand<'t> {
    view: TensorView<'t>,
}

impl Operand for TchOperand<'_> {
    #[inline]
    fn view(&self) -> Result<TensorView<'_>> {
        Ok(self.view.clone())
    }
    #[inline]
    fn view_mut(&mut self) -> Result<TensorViewMut<'_>> {
        // Asked only of tensors bound writable (`mut` parameters, outputs).
        raw::writable(self.view.clone())
    }
}

fn no_scalar(tensor: &Tensor, kind: ScalarKind) -> Error {
    Error::InvalidArgument(format!("expected a {kind} scalar but got a tensor of shape {:?}", tensor.size()))
}

impl Adapter for Tch {
    type Value<'t> = &'t Tensor;
    type Tensor<'t> = TchOperand<'t>;
    type Error = Error;

    fn tensor<'t>(&mut self, tensor: Self::Value<'t>, _writable: bool) -> Result<Self::Tensor<'t>> {
        // The shim refuses grad-requiring, sparse and quantized tensors.
        Ok(TchOperand { view: raw::borrow(tensor, Flags::empty())? })
    }
    fn scalar(&mut self, tensor: &Tensor, kind: ScalarKind) -> Result<Scalar> {
        Err(no_scalar(tensor, kind))
    }
    fn locate(&mut self, error: Error, kernel: &str, slot: Slot) -> Error {
        error.at(kernel, slot)
    }
}

/// [`Tch`] for tensors already lent, all at once, by [`raw::Lending`]: a
/// value is tensor `i` of a lending. Binding checks the shim's verdict on it;
/// its view is validated when the call takes it (the binding layer takes each
/// operand's view once, right before the kernel runs), straight into place.
#[derive(Debug, Clone, Copy, Default)]
struct Lent;

/// Tensor `i` of a lending, bound to a kernel argument.
#[derive(Debug)]
struct LentOperand<'t> {
    lent: &'t raw::Lending<'t>,
    i: usize,
}

impl Operand for LentOperand<'_> {
    #[inline]
    fn view(&self) -> Result<TensorView<'_>> {
        self.lent.view(self.i)
    }
    #[inline]
    fn view_mut(&mut self) -> Result<TensorViewMut<'_>> {
        // Asked only of tensors bound writable (`mut` parameters, outputs).
        raw::writable(self.lent.view(self.i)?)
    }
}

impl Adapter for Lent {
    type Value<'t> = (&'t raw::Lending<'t>, usize);
    type Tensor<'t> = LentOperand<'t>;
    type Error = Error;

    #[inline]
    fn tensor<'t>(&mut self, (lent, i): Self::Value<'t>, _writable: bool) -> Result<Self::Tensor<'t>> {
        // The shim refused grad-requiring, sparse and quantized tensors.
        lent.check(i)?;
        Ok(LentOperand { lent, i })
    }
    fn scalar(&mut self, (lent, i): Self::Value<'_>, kind: ScalarKind) -> Result<Scalar> {
        Err(no_scalar(lent.tensor(i), kind))
    }
    fn locate(&mut self, error: Error, kernel: &str, slot: Slot) -> Error {
        error.at(kernel, slot)
    }
}

/// Allocates outputs with `Tensor::f_empty` on the inputs' device.
#[derive(Debug, Clone, Copy, Default)]
pub struct TchAllocator;

/// A tensor [`TchAllocator`] allocated.
#[derive(Debug)]
pub struct TchOutput(pub Tensor);

impl Operand for TchOutput {
    fn view(&self) -> Result<TensorView<'_>> {
        raw::borrow(&self.0, Flags::empty())
    }
    fn view_mut(&mut self) -> Result<TensorViewMut<'_>> {
        raw::borrow_mut(&self.0)
    }
}

impl Allocator<Error> for TchAllocator {
    type Tensor = TchOutput;
    fn allocate(&mut self, s: &OutputSpec) -> Result<TchOutput> {
        let fail = |e: tch::TchError| Error::Runtime(format!("allocating {s}: {e}"));
        let options = (kind_of(s.dtype)?, device_of(s.device)?);
        if s.is_row_major() {
            return Ok(TchOutput(Tensor::f_empty(&s.shape[..], options).map_err(fail)?));
        }
        // In the inputs' memory order: row-major in that order, then permuted.
        let axes: Vec<i64> = s.axes().iter().map(|&a| a as i64).collect();
        let t = Tensor::f_empty(&s.memory_shape()[..], options).and_then(|t| t.f_permute(&axes[..])).map_err(fail)?;
        Ok(TchOutput(t))
    }
}

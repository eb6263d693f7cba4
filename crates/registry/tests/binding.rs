//! The binding layer from the outside: a framework the registry has never
//! seen ("Toy": `Vec<f32>` tensors with a read-only flag and its own
//! allocator) plugs in by implementing three small traits, and gets
//! positional calls, destination-passing, `out=`, split tensor/scalar lists,
//! structured errors and outputs in its own memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dlbridge_core::{DType, Device, DeviceType, Error, ErrorKind, Flags, Result, Slot, TensorView, TensorViewMut};
use dlbridge_registry::binding::{Adapter, Allocator, Args, Operand, Scalar};
use dlbridge_registry::signature::ScalarKind;
use dlbridge_registry::{Call, Impl, KernelDef, KernelOpts, OutputSpec, Registry};

/// The toy framework's tensor: 1-d f32 in a Vec.
#[derive(Debug)]
struct Toy {
    data: Vec<f32>,
    shape: [i64; 1],
    read_only: bool,
}

impl Toy {
    fn new(v: &[f32]) -> Toy {
        Toy { data: v.to_vec(), shape: [v.len() as i64], read_only: false }
    }
}

impl Operand for &mut Toy {
    fn view(&self) -> Result<TensorView<'_>> {
        let flags = if self.read_only { Flags::READ_ONLY } else { Flags::empty() };
        // SAFETY: `data` holds shape[0] f32s, compact, alive and not written for the borrow of self.
        unsafe { TensorView::from_raw_parts(self.data.as_ptr().cast(), 0, &self.shape, None, DType::F32, Device::CPU, flags) }
    }
    fn view_mut(&mut self) -> Result<TensorViewMut<'_>> {
        let view = self.view()?;
        // SAFETY: `&mut self` is the only handle to `data` for the view's lifetime; from_view refuses READ_ONLY.
        unsafe { TensorViewMut::from_view(view) }
    }
}

/// An argument as a toy caller writes it.
enum ToyArg<'a> {
    T(&'a mut Toy),
    Num(f64),
    Int(i64),
}

struct ToyAdapter;

impl Adapter for ToyAdapter {
    type Value<'a> = ToyArg<'a>;
    type Tensor<'a> = &'a mut Toy;
    type Error = Error;
    fn tensor<'a>(&mut self, v: Self::Value<'a>, writable: bool) -> Result<Self::Tensor<'a>> {
        match v {
            ToyArg::T(t) if writable && t.read_only => {
                Err(Error::ReadOnly { what: "toy: this argument is written, and the tensor".into() })
            }
            ToyArg::T(t) => Ok(t),
            _ => Err(Error::InvalidArgument("toy: expected a tensor".into())),
        }
    }
    fn scalar(&mut self, v: ToyArg<'_>, kind: ScalarKind) -> Result<Scalar> {
        match (v, kind) {
            (ToyArg::Num(x), ScalarKind::F64) => Ok(Scalar::F64(x)),
            (ToyArg::Int(x), ScalarKind::I64) => Ok(Scalar::I64(x)),
            // A deliberately wrong conversion: the binding layer must catch it.
            (ToyArg::Int(x), ScalarKind::F64) if x < 0 => Ok(Scalar::I64(x)),
            _ => Err(Error::InvalidArgument(format!("toy: expected a {kind} scalar"))),
        }
    }
    fn locate(&mut self, e: Error, kernel: &str, slot: Slot) -> Error {
        e.at(kernel, slot)
    }
}

/// Allocates toy tensors, counting and remembering their buffers.
#[derive(Default)]
struct ToyAllocator {
    made: Vec<usize>,
}

/// An output the toy allocator made (owned).
#[derive(Debug)]
struct Owned(Toy);

impl Operand for Owned {
    fn view(&self) -> Result<TensorView<'_>> {
        // SAFETY: as for &mut Toy.
        unsafe { TensorView::from_raw_parts(self.0.data.as_ptr().cast(), 0, &self.0.shape, None, DType::F32, Device::CPU, Flags::empty()) }
    }
    fn view_mut(&mut self) -> Result<TensorViewMut<'_>> {
        let view = self.view()?;
        // SAFETY: `&mut self` owns the buffer exclusively.
        unsafe { TensorViewMut::from_view(view) }
    }
}

impl Allocator<Error> for ToyAllocator {
    type Tensor = Owned;
    fn allocate(&mut self, spec: &OutputSpec) -> Result<Owned> {
        assert_eq!(spec.dtype, DType::F32);
        let t = Toy { data: vec![f32::NAN; spec.shape[0] as usize], shape: [spec.shape[0]], read_only: false };
        self.made.push(t.data.as_ptr() as usize);
        Ok(Owned(t))
    }
}

/// Registers `body` under `signature`, counting its runs in `runs`.
fn counted(reg: &Registry, runs: &Arc<AtomicUsize>, signature: &str, opts: KernelOpts, body: fn(&mut Call<'_, '_>) -> Result<()>) {
    let r = runs.clone();
    let imp = Impl::Dyn(Arc::new(move |call: &mut Call<'_, '_>| {
        r.fetch_add(1, Ordering::SeqCst);
        body(call)
    }));
    let def = KernelDef {
        signature: signature.into(),
        device: DeviceType::CPU,
        imp,
        opts,
        origin: "test".into(),
        doc: String::new(),
        identity: String::new(),
    };
    reg.register(def).unwrap();
}

/// `add2(a, b) -> c`, `axpy(alpha, x, mut y)` and `swap_in(x, mut y) -> old`, counting their runs.
fn registry() -> (Registry, Arc<AtomicUsize>) {
    let reg = Registry::new();
    let runs = Arc::new(AtomicUsize::new(0));
    counted(&reg, &runs, "add2(a: f32[N], b: f32[N]) -> (c: f32[N])", KernelOpts::ELEMENTWISE, |call| {
        let (ins, mut outs) = call.io();
        let (a, b) = (ins.tensor("a")?.to_vec::<f32>()?, ins.tensor("b")?.to_vec::<f32>()?);
        for ((c, x), y) in outs.take("c")?.iter_mut::<f32>()?.zip(a).zip(b) {
            *c = x + y;
        }
        Ok(())
    });
    counted(&reg, &runs, "axpy(alpha: f64, x: f32[N], y: mut f32[N])", KernelOpts::DEFAULT, |call| {
        let (ins, mut outs) = call.io();
        let (alpha, x) = (ins.f64("alpha")? as f32, ins.tensor("x")?.to_vec::<f32>()?);
        for (y, x) in outs.take("y")?.iter_mut::<f32>()?.zip(x) {
            *y += alpha * x;
        }
        Ok(())
    });
    counted(&reg, &runs, "swap_in(x: f32[N], y: mut f32[N]) -> (old: f32[N])", KernelOpts::DEFAULT, |call| {
        let (ins, mut outs) = call.io();
        let x = ins.tensor("x")?.to_vec::<f32>()?;
        let y = outs.take("y")?;
        let before = y.as_view().to_vec::<f32>()?;
        y.iter_mut::<f32>()?.zip(&x).for_each(|(y, x)| *y = *x);
        outs.take("old")?.iter_mut::<f32>()?.zip(before).for_each(|(o, b)| *o = b);
        Ok(())
    });
    (reg, runs)
}

#[test]
fn a_kernel_with_a_mut_parameter_and_outputs_gets_its_outputs_allocated() {
    let (reg, runs) = registry();
    let k = reg.get("swap_in").unwrap();
    let (mut x, mut y) = (Toy::new(&[1.0, 2.0]), Toy::new(&[7.0, 8.0]));
    let mut alloc = ToyAllocator::default();
    let mut call = k.bind(&mut ToyAdapter, Args::positional([ToyArg::T(&mut x), ToyArg::T(&mut y)])).unwrap();
    assert_eq!(call.output_specs().unwrap().len(), 1);
    let outs = call.run(&mut alloc, std::ptr::null_mut()).unwrap();
    drop(call);
    assert_eq!((outs[0].0.data.clone(), y.data.clone()), (vec![7.0, 8.0], vec![1.0, 2.0]));
    assert_eq!((alloc.made.len(), runs.load(Ordering::SeqCst)), (1, 1));
}

#[test]
fn outputs_are_allocated_by_the_callers_framework_once_each_and_written_in_place() {
    let (reg, runs) = registry();
    let k = reg.get("add2").unwrap();
    let (mut a, mut b) = (Toy::new(&[1.0, 2.0]), Toy::new(&[10.0, 20.0]));
    let mut alloc = ToyAllocator::default();
    let mut call = k.bind(&mut ToyAdapter, Args::positional([ToyArg::T(&mut a), ToyArg::T(&mut b)])).unwrap();
    assert!(call.given_outputs().is_none());
    let outs = call.run(&mut alloc, std::ptr::null_mut()).unwrap();
    assert_eq!(alloc.made.len(), 1, "one allocation per output");
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].0.data.as_ptr() as usize, alloc.made[0], "the kernel wrote into the allocator's own buffer");
    assert_eq!(outs[0].0.data, vec![11.0, 22.0]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn destination_passing_and_out_write_the_callers_tensor_and_allocate_nothing() {
    let (reg, runs) = registry();
    let k = reg.get("add2").unwrap();
    let (mut a, mut b, mut c) = (Toy::new(&[1.0, 2.0]), Toy::new(&[10.0, 20.0]), Toy::new(&[0.0, 0.0]));
    let before = c.data.as_ptr();
    let mut alloc = ToyAllocator::default();
    // Positional, with the output appended.
    let mut call = k.bind(&mut ToyAdapter, Args::positional([ToyArg::T(&mut a), ToyArg::T(&mut b), ToyArg::T(&mut c)])).unwrap();
    assert_eq!(call.given_outputs().map(<[_]>::len), Some(1));
    assert!(call.run(&mut alloc, std::ptr::null_mut()).unwrap().is_empty());
    drop(call);
    assert_eq!((c.data.as_ptr(), c.data.clone()), (before, vec![11.0, 22.0]));
    // out=
    let mut call = k.bind(&mut ToyAdapter, Args::with_out([ToyArg::T(&mut a), ToyArg::T(&mut c)], [ToyArg::T(&mut b)])).unwrap();
    call.run(&mut alloc, std::ptr::null_mut()).unwrap();
    drop(call);
    assert_eq!(b.data, vec![12.0, 24.0]);
    assert!(alloc.made.is_empty());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[test]
fn a_binding_filled_in_place_runs_like_a_returned_one_and_only_an_empty_one_of_its_kernel_is_filled() {
    let (reg, runs) = registry();
    let (k, other) = (reg.get("add2").unwrap(), reg.get("axpy").unwrap());
    let (mut a, mut b, mut c) = (Toy::new(&[1.0, 2.0]), Toy::new(&[10.0, 20.0]), Toy::new(&[0.0, 0.0]));
    let mut alloc = ToyAllocator::default();
    let mut call = k.binding();
    k.bind_into(&mut ToyAdapter, Args::positional([ToyArg::T(&mut a), ToyArg::T(&mut b)]), &mut call).unwrap();
    let outs = call.run(&mut alloc, std::ptr::null_mut()).unwrap();
    drop(call);
    assert_eq!(outs[0].0.data, vec![11.0, 22.0]);
    // out=, in place: the caller's tensor is written, nothing allocated.
    let mut call = k.binding();
    k.bind_into(&mut ToyAdapter, Args::with_out([ToyArg::T(&mut a), ToyArg::T(&mut b)], [ToyArg::T(&mut c)]), &mut call).unwrap();
    assert!(call.run(&mut alloc, std::ptr::null_mut()).unwrap().is_empty());
    drop(call);
    assert_eq!((c.data.clone(), alloc.made.len(), runs.load(Ordering::SeqCst)), (vec![11.0, 22.0], 1, 2));

    // A binding already filled, or another kernel's, is refused, never appended to.
    let (mut x, mut y) = (Toy::new(&[1.0]), Toy::new(&[2.0]));
    let mut call = k.binding();
    k.bind_into(&mut ToyAdapter, Args::positional([ToyArg::T(&mut a), ToyArg::T(&mut b)]), &mut call).unwrap();
    let e = k.bind_into(&mut ToyAdapter, Args::positional([ToyArg::T(&mut x), ToyArg::T(&mut y)]), &mut call).unwrap_err();
    assert!(e.to_string().contains("not its own empty one"), "{e}");
    drop(call);
    let (mut x, mut y) = (Toy::new(&[1.0]), Toy::new(&[2.0]));
    let (mut p, mut q) = (Toy::new(&[1.0]), Toy::new(&[2.0]));
    let mut foreign = other.binding();
    let e = k.bind_into(&mut ToyAdapter, Args::positional([ToyArg::T(&mut x), ToyArg::T(&mut y)]), &mut foreign).unwrap_err();
    assert!(e.to_string().contains("add2() was bound into a binding that is not its own empty one"), "{e}");
    let e = k
        .bind_into(&mut ToyAdapter, Args::with_out([ToyArg::T(&mut p), ToyArg::T(&mut q)], [ToyArg::T(&mut c)]), &mut foreign)
        .unwrap_err();
    assert!(e.to_string().contains("not its own empty one"), "{e}");
    drop(foreign);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "no refused binding ran");
}

#[test]
fn arity_errors_are_type_errors_that_list_the_parameters() {
    let (reg, _) = registry();
    let k = reg.get("add2").unwrap();
    let mut a = Toy::new(&[1.0]);
    let e = k.bind(&mut ToyAdapter, Args::positional([ToyArg::T(&mut a)])).unwrap_err();
    assert!(matches!(e, Error::Arity { ref kernel, .. } if kernel == "add2"), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::Type);
    assert_eq!(e.to_string(), "add2() takes 2 arguments (a, b), or 3 with the outputs (c) appended but 1 was given");
    let (mut a, mut b) = (Toy::new(&[1.0]), Toy::new(&[1.0]));
    let e = k.bind(&mut ToyAdapter, Args::with_out([ToyArg::T(&mut a), ToyArg::T(&mut b)], std::iter::empty())).unwrap_err();
    assert_eq!(e.to_string(), "add2(): out= needs 1 tensor, got 0");
    let axpy = reg.get("axpy").unwrap();
    let (mut x, mut y) = (Toy::new(&[1.0]), Toy::new(&[1.0]));
    let e = axpy
        .bind(&mut ToyAdapter, Args::with_out([ToyArg::Num(1.0), ToyArg::T(&mut x), ToyArg::T(&mut y)], std::iter::empty()))
        .unwrap_err();
    assert_eq!(e.to_string(), "axpy() has no outputs; out= is not accepted");
    let e = axpy.bind(&mut ToyAdapter, Args::split([ToyArg::T(&mut x)], &[], None::<[ToyArg<'_>; 0]>)).unwrap_err();
    assert_eq!(e.to_string(), "axpy: expected 2 tensors and 1 scalars, got 1 and 0");
}

#[test]
fn argument_errors_carry_kernel_and_slot_as_structure() {
    let (reg, runs) = registry();
    let axpy = reg.get("axpy").unwrap();
    let (mut x, mut y) = (Toy::new(&[1.0, 2.0]), Toy::new(&[5.0, 5.0]));
    // The adapter's own refusal, located by the binding layer.
    let e = axpy.bind(&mut ToyAdapter, Args::positional([ToyArg::Int(3), ToyArg::T(&mut x), ToyArg::T(&mut y)])).unwrap_err();
    assert_eq!(e.slot(), Some(("axpy", &Slot::Argument("alpha".into()))));
    assert_eq!(e.to_string(), "axpy: argument alpha: toy: expected a f64 scalar");
    // An adapter that converts to the wrong kind is caught, not trusted.
    let e = axpy.bind(&mut ToyAdapter, Args::positional([ToyArg::Int(-1), ToyArg::T(&mut x), ToyArg::T(&mut y)])).unwrap_err();
    assert_eq!(e.to_string(), "axpy: argument alpha: expected a f64 scalar, got i64 -1");
    // A read-only tensor in a `mut` slot: refused at bind time, nothing written.
    y.read_only = true;
    let e = axpy.bind(&mut ToyAdapter, Args::positional([ToyArg::Num(2.0), ToyArg::T(&mut x), ToyArg::T(&mut y)])).unwrap_err();
    assert_eq!(e.slot(), Some(("axpy", &Slot::Argument("y".into()))));
    assert_eq!(e.kind(), ErrorKind::Buffer);
    assert_eq!(y.data, vec![5.0, 5.0]);
    // Split lists: tensors and scalars apart.
    y.read_only = false;
    let mut call = axpy
        .bind(&mut ToyAdapter, Args::split([ToyArg::T(&mut x), ToyArg::T(&mut y)], &[Scalar::F64(2.0)], None::<[ToyArg<'_>; 0]>))
        .unwrap();
    call.run(&mut ToyAllocator::default(), std::ptr::null_mut()).unwrap();
    drop(call);
    assert_eq!(y.data, vec![7.0, 9.0]);
    let e = axpy
        .bind(&mut ToyAdapter, Args::split([ToyArg::T(&mut x), ToyArg::T(&mut y)], &[Scalar::Bool(true)], None::<[ToyArg<'_>; 0]>))
        .unwrap_err();
    assert_eq!(e.to_string(), "axpy: argument alpha: expected a f64 scalar, got bool true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn a_call_that_fails_its_checks_allocates_nothing_and_runs_nothing() {
    let (reg, runs) = registry();
    let k = reg.get("add2").unwrap();
    let (mut a, mut b) = (Toy::new(&[1.0, 2.0, 3.0]), Toy::new(&[1.0, 2.0]));
    let mut alloc = ToyAllocator::default();
    let mut call = k.bind(&mut ToyAdapter, Args::positional([ToyArg::T(&mut a), ToyArg::T(&mut b)])).unwrap();
    let e = call.run(&mut alloc, std::ptr::null_mut()).unwrap_err();
    assert_eq!(e.to_string(), "add2: argument b: dim N = 3 (bound by a) but got 2");
    assert_eq!(e.slot(), Some(("add2", &Slot::Argument("b".into()))));
    assert!(alloc.made.is_empty());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // A given output of the wrong size is named as an output.
    let (mut a, mut b, mut c) = (Toy::new(&[1.0, 2.0]), Toy::new(&[1.0, 2.0]), Toy::new(&[0.0]));
    let mut call = k.bind(&mut ToyAdapter, Args::positional([ToyArg::T(&mut a), ToyArg::T(&mut b), ToyArg::T(&mut c)])).unwrap();
    let e = call.run(&mut alloc, std::ptr::null_mut()).unwrap_err();
    assert_eq!(e.slot(), Some(("add2", &Slot::Output("c".into()))));
    drop(call);
    assert_eq!(c.data, vec![0.0]);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

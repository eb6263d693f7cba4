//! The one binding layer: framework arguments become kernel arguments here.
//!
//! Every adapter — Python objects, tch tensors, [`Array`]s — calls kernels
//! through [`Kernel::bind`] and [`Binding::run`]:
//!
//! 1. **bind**: the caller's values are matched to the signature's parameters
//!    and outputs, given in one of the [`Args`] forms: positionally, with the
//!    outputs optionally appended (destination-passing style, as TVM); with
//!    `out=`; or as tensors and scalars in two lists (tch). Each tensor is imported by the framework's
//!    [`Adapter`] (asked for a writable tensor for `mut` parameters and
//!    outputs), each scalar converted to the parameter's kind. Errors carry
//!    the kernel and the argument as structure ([`Error::Argument`],
//!    [`Adapter::locate`]), attached here, once.
//! 2. **run**: the outputs the caller did not give are allocated by an
//!    [`Allocator`] — the caller's own framework — from the shapes the
//!    signature derives (Tensor Comprehensions' prepareOutputs); then every
//!    operand's view is taken, the registry checks them all (dtypes, shapes,
//!    devices, read-only, overlap, contiguity) and the implementation for
//!    their device runs.
//!
//! Adding a framework is implementing [`Operand`] for its tensors, [`Adapter`]
//! for its arguments and [`Allocator`] for its outputs: nothing here changes.
//!
//! **Guarantee adapters may rely on**: the binding layer calls no adapter or
//! allocator code while it holds a view from [`Operand::view`] or
//! [`Operand::view_mut`]. Views are taken after the last allocation and live
//! until the implementation returns, so an adapter whose views borrow
//! structures the framework may change when its own code runs (a Python
//! object's metadata, say) knows that none of that code runs meanwhile.

use std::ffi::c_void;
use std::marker::PhantomData;

use dlbridge_array::Array;
use dlbridge_core::{Error, ManagedTensor, Result, Slot, TensorView, TensorViewMut};
use smallvec::SmallVec;

use crate::arg::Arg;
use crate::kernel::Kernel;
/// The scalar an [`Adapter`] converts a framework's value to.
pub use crate::signature::Scalar;
use crate::signature::{ParamKind, ScalarKind};
use crate::solution::OutputSpec;

/// Values of an adapter's framework given in a list whose length is known
/// (an array, a `Vec`, an exact-size iterator): a call's arguments or outputs.
pub trait ValueList<'a, A: Adapter + ?Sized>: IntoIterator<Item = A::Value<'a>, IntoIter: ExactSizeIterator> {}

impl<'a, A: Adapter + ?Sized, T: IntoIterator<Item = A::Value<'a>, IntoIter: ExactSizeIterator>> ValueList<'a, A> for T {}

/// A framework's tensor, imported for one call.
pub trait Operand {
    /// A view for reading.
    fn view(&self) -> Result<TensorView<'_>>;
    /// A view the kernel writes. Asked only of operands the adapter imported
    /// writable (`mut` parameters, outputs) and of allocated outputs. The
    /// registry refuses every overlap between a written view and any other
    /// view of the call before the implementation runs.
    fn view_mut(&mut self) -> Result<TensorViewMut<'_>>;
}

/// How one framework's arguments become operands and scalars.
pub trait Adapter {
    /// One argument as the framework's caller passes it, borrowed for `'a`.
    type Value<'a>;
    /// An imported tensor, borrowing what its value borrowed.
    type Tensor<'a>: Operand;
    /// The framework's error type (a Python exception, say).
    type Error: From<Error>;
    /// Imports a tensor argument. `writable`: the kernel writes it (a `mut`
    /// parameter or an output): refuse memory the framework does not let us write.
    fn tensor<'a>(&mut self, value: Self::Value<'a>, writable: bool) -> Result<Self::Tensor<'a>, Self::Error>;
    /// Converts a scalar argument to `kind` (refusing, not rounding, what does not fit).
    fn scalar(&mut self, value: Self::Value<'_>, kind: ScalarKind) -> Result<Scalar, Self::Error>;
    /// Attaches the kernel and the argument to an error this adapter raised
    /// while importing or converting it.
    fn locate(&mut self, error: Self::Error, kernel: &str, slot: Slot) -> Self::Error;
}

/// Allocates outputs with a framework's own allocator.
pub trait Allocator<E> {
    /// The tensors it allocates.
    type Tensor: Operand;
    /// A new tensor of `spec`'s shape, dtype and device (contents unspecified),
    /// laid out in `spec.order` where the framework can (see [`OutputSpec::order`]).
    fn allocate(&mut self, spec: &OutputSpec) -> Result<Self::Tensor, E>;

    /// The error of a failed [`Allocator::allocate`] for output `output` of
    /// `kernel`, located there (as [`Adapter::locate`] does for arguments).
    /// The default leaves it as it is.
    fn locate(&mut self, e: E, kernel: &str, output: &str) -> E {
        let _ = (kernel, output);
        e
    }

    /// How errors name it (`the allocator registered for cupy.ndarray`).
    fn describe(&self) -> String {
        "the allocator".into()
    }

    /// Whether every tensor it returns is new memory by construction (an
    /// allocator of the framework's own, never one a user supplies): the
    /// call then skips checking that outputs overlap nothing.
    fn returns_new_memory(&self) -> bool {
        false
    }
}

/// One bound argument: the value of one parameter.
#[derive(Debug)]
pub enum Value<T> {
    /// A tensor parameter (`mut` ones were imported writable).
    Tensor(T),
    /// A scalar parameter.
    Scalar(Scalar),
}

/// The bound arguments of one call (inline up to 4: a call moves its binding
/// around, and most kernels take at most 4 parameters).
type Values<T> = SmallVec<[Value<T>; 4]>;

/// The outputs a caller gave (most kernels have one).
pub type Given<T> = SmallVec<[T; 1]>;

/// How a caller gives a kernel its values, in one of the three forms that
/// frameworks' call syntaxes take; [`Kernel::bind`] takes any of them.
///
/// ```text
/// Args::positional([a, b])          f(a, b), or f(a, b, out) with the outputs appended
/// Args::with_out([a, b], [out])     f(a, b, out=out)
/// Args::split([a, b], &[2.0], None) tensors and scalars in two lists (tch), outputs optional
/// ```
#[derive(Debug)]
pub struct Args<'s, I, O> {
    form: Form<'s, I, O>,
}

#[derive(Debug)]
enum Form<'s, I, O> {
    Positional(I),
    Out(I, O),
    Split(I, &'s [Scalar], Option<O>),
}

impl<I: IntoIterator> Args<'static, I, std::iter::Empty<I::Item>> {
    /// One value per parameter in signature order, optionally followed by one
    /// per output (destination-passing style, as TVM's packed functions).
    #[inline(always)]
    pub fn positional(values: I) -> Self {
        Args { form: Form::Positional(values) }
    }
}

impl<I, O> Args<'static, I, O> {
    /// One value per parameter in signature order, and the outputs given apart (`out=`).
    #[inline(always)]
    pub fn with_out(values: I, outputs: O) -> Self {
        Args { form: Form::Out(values, outputs) }
    }
}

impl<'s, I, O> Args<'s, I, O> {
    /// The tensors and the scalars in two lists, each in signature order, and
    /// optionally the outputs.
    #[inline(always)]
    pub fn split(tensors: I, scalars: &'s [Scalar], outputs: Option<O>) -> Self {
        Args { form: Form::Split(tensors, scalars, outputs) }
    }
}

/// A call's arguments bound to a kernel's parameters, ready to [`run`](Binding::run).
#[derive(Debug)]
pub struct Binding<'k, T, E> {
    kernel: &'k Kernel,
    args: Values<T>,
    /// Outputs given by the caller (destination-passing calls, `out=`): the
    /// first one inline, so such a call allocates nothing.
    given: Option<Given<T>>,
    _error: PhantomData<fn() -> E>,
}

/// The kernel call, handed to a runner (e.g. one that releases Python's GIL around it).
pub struct Job<'j> {
    f: &'j mut (dyn FnMut() -> Result<()> + Send + 'j),
}

impl std::fmt::Debug for Job<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

impl Job<'_> {
    /// Runs the checks and the implementation.
    pub fn run(self) -> Result<()> {
        (self.f)()
    }
}

fn names(params: &[crate::signature::Param]) -> String {
    params.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ")
}

impl Kernel {
    fn arity(&self, message: String) -> Error {
        Error::Arity { kernel: self.name().to_owned(), message }
    }

    /// `name() takes ...` for a positional call with `given` values.
    #[cold]
    fn positional_arity(&self, given: usize) -> Error {
        let sig = self.signature();
        let (np, no) = (sig.params.len(), sig.outputs.len());
        self.arity(format!(
            "{}() takes {np} argument{} ({}){} but {given} {} given",
            sig.name,
            if np == 1 { "" } else { "s" },
            names(&sig.params),
            if no == 0 { String::new() } else { format!(", or {} with the outputs ({}) appended", np + no, names(&sig.outputs)) },
            if given == 1 { "was" } else { "were" }
        ))
    }

    /// A binding to fill must be this kernel's, and empty.
    #[inline(always)]
    fn check_empty<T, E>(&self, binding: &Binding<'_, T, E>) -> Result<()> {
        if !std::ptr::eq(binding.kernel, self) || !binding.args.is_empty() || binding.given.is_some() {
            return Err(Error::Runtime(format!(
                "internal error: {}() was bound into a binding that is not its own empty one",
                self.name()
            )));
        }
        Ok(())
    }

    /// Binds a call's values, given in any of the [`Args`] forms: the first
    /// half of a call from a framework ([`Binding::run`] is the second).
    #[inline(always)]
    pub fn bind<'a, A: Adapter, I: ValueList<'a, A>, O: ValueList<'a, A>>(
        &self,
        adapter: &mut A,
        args: Args<'_, I, O>,
    ) -> Result<Binding<'_, A::Tensor<'a>, A::Error>, A::Error> {
        let mut binding = Binding::new(self);
        self.bind_into(adapter, args, &mut binding)?;
        Ok(binding)
    }

    /// An empty binding of this kernel, for [`Kernel::bind_into`]: a caller
    /// that keeps the binding in one place fills it there (a binding holds its
    /// operands inline, several hundred bytes, which every move copies).
    #[inline(always)]
    pub fn binding<T, E>(&self) -> Binding<'_, T, E> {
        Binding::new(self)
    }

    /// [`Kernel::bind`], into an empty `binding` of this kernel (from [`Kernel::binding`]).
    #[inline(always)]
    pub fn bind_into<'a, A: Adapter, I: ValueList<'a, A>, O: ValueList<'a, A>>(
        &self,
        adapter: &mut A,
        args: Args<'_, I, O>,
        binding: &mut Binding<'_, A::Tensor<'a>, A::Error>,
    ) -> Result<(), A::Error> {
        self.check_empty(binding)?;
        match args.form {
            Form::Positional(values) => self.bind_positional(adapter, values, binding),
            Form::Out(values, outputs) => self.bind_out(adapter, values, outputs, binding),
            Form::Split(tensors, scalars, outputs) => self.bind_split(adapter, tensors, scalars, outputs, binding),
        }
    }

    #[inline(always)]
    fn bind_positional<'a, A: Adapter, I: ValueList<'a, A>>(
        &self,
        adapter: &mut A,
        values: I,
        binding: &mut Binding<'_, A::Tensor<'a>, A::Error>,
    ) -> Result<(), A::Error> {
        let mut values = values.into_iter();
        let sig = self.signature();
        let (np, no) = (sig.params.len(), sig.outputs.len());
        let n = values.len();
        let given = if n == np {
            false
        } else if no > 0 && n == np + no {
            true
        } else {
            return Err(self.positional_arity(n).into());
        };
        self.bind_params(adapter, values.by_ref().take(np), None, &mut binding.args)?;
        if given {
            self.bind_outputs(adapter, values, binding.given.insert(Given::new()))?;
        }
        Ok(())
    }

    #[inline(always)]
    fn bind_out<'a, A: Adapter, I: ValueList<'a, A>, O: ValueList<'a, A>>(
        &self,
        adapter: &mut A,
        values: I,
        outputs: O,
        binding: &mut Binding<'_, A::Tensor<'a>, A::Error>,
    ) -> Result<(), A::Error> {
        let (values, outputs) = (values.into_iter(), outputs.into_iter());
        let sig = self.signature();
        let (np, no) = (sig.params.len(), sig.outputs.len());
        if no > 0 && values.len() == np + no {
            return Err(self
                .arity(format!("{}(): the outputs are given twice, appended to the arguments and with out=; give them once", sig.name))
                .into());
        }
        if values.len() != np {
            return Err(self.positional_arity(values.len()).into());
        }
        if no == 0 {
            return Err(self.arity(format!("{}() has no outputs; out= is not accepted", sig.name)).into());
        }
        if outputs.len() != no {
            return Err(self
                .arity(format!("{}(): out= needs {no} tensor{}, got {}", sig.name, if no == 1 { "" } else { "s" }, outputs.len()))
                .into());
        }
        self.bind_params(adapter, values, None, &mut binding.args)?;
        self.bind_outputs(adapter, outputs, binding.given.insert(Given::new()))
    }

    #[inline(always)]
    fn bind_split<'a, A: Adapter, I: ValueList<'a, A>, O: ValueList<'a, A>>(
        &self,
        adapter: &mut A,
        tensors: I,
        scalars: &[Scalar],
        outputs: Option<O>,
        binding: &mut Binding<'_, A::Tensor<'a>, A::Error>,
    ) -> Result<(), A::Error> {
        let tensors = tensors.into_iter();
        let sig = self.signature();
        let nt = sig.params.iter().filter(|p| p.tensor().is_some()).count();
        let ns = sig.params.len() - nt;
        if tensors.len() != nt || scalars.len() != ns {
            return Err(self
                .arity(format!("{}: expected {nt} tensors and {ns} scalars, got {} and {}", sig.name, tensors.len(), scalars.len()))
                .into());
        }
        let outputs = outputs.map(IntoIterator::into_iter);
        if let Some(o) = &outputs
            && o.len() != sig.outputs.len()
        {
            return Err(self
                .arity(format!("{}: expected {} outputs ({}) but got {}", sig.name, sig.outputs.len(), names(&sig.outputs), o.len()))
                .into());
        }
        self.bind_params(adapter, tensors, Some(scalars), &mut binding.args)?;
        match outputs {
            Some(o) => self.bind_outputs(adapter, o, binding.given.insert(Given::new())),
            None => Ok(()),
        }
    }

    /// Imports or converts each parameter's value. With `scalars`, `values`
    /// holds the tensors only and scalar parameters take from `scalars`.
    #[inline(always)]
    fn bind_params<'a, A: Adapter>(
        &self,
        adapter: &mut A,
        mut values: impl Iterator<Item = A::Value<'a>>,
        scalars: Option<&[Scalar]>,
        bound: &mut Values<A::Tensor<'a>>,
    ) -> Result<(), A::Error> {
        let sig = self.signature();
        let split = scalars.is_some();
        let mut scalars = scalars.unwrap_or_default().iter();
        for p in &sig.params {
            let slot = || Slot::Argument(p.name.clone());
            let v = match &p.kind {
                ParamKind::Tensor(t) => {
                    let value = values.next().ok_or_else(|| self.positional_arity(0))?;
                    Value::Tensor(adapter.tensor(value, t.mutable).map_err(|e| adapter.locate(e, &sig.name, slot()))?)
                }
                ParamKind::Scalar(kind) => {
                    let s = if split {
                        *scalars.next().ok_or_else(|| self.positional_arity(0))?
                    } else {
                        let value = values.next().ok_or_else(|| self.positional_arity(0))?;
                        adapter.scalar(value, *kind).map_err(|e| adapter.locate(e, &sig.name, slot()))?
                    };
                    if s.kind() != *kind {
                        return Err(Error::InvalidArgument(format!("expected a {kind} scalar, got {s}"))
                            .at(sig.name.clone(), slot())
                            .into());
                    }
                    Value::Scalar(s)
                }
            };
            bound.push(v);
        }
        Ok(())
    }

    #[inline(always)]
    fn bind_outputs<'a, A: Adapter>(
        &self,
        adapter: &mut A,
        values: impl Iterator<Item = A::Value<'a>>,
        outs: &mut Given<A::Tensor<'a>>,
    ) -> Result<(), A::Error> {
        let sig = self.signature();
        for (p, value) in sig.outputs.iter().zip(values) {
            outs.push(adapter.tensor(value, true).map_err(|e| adapter.locate(e, &sig.name, Slot::Output(p.name.clone())))?);
        }
        Ok(())
    }
}

impl<'k, T, E> Binding<'k, T, E> {
    /// Nothing bound yet.
    #[inline(always)]
    fn new(kernel: &'k Kernel) -> Self {
        Binding { kernel, args: SmallVec::new(), given: None, _error: PhantomData }
    }
}

impl<'k, T: Operand, E: From<Error>> Binding<'k, T, E> {
    /// The kernel this call runs.
    pub fn kernel(&self) -> &'k Kernel {
        self.kernel
    }

    /// The tensor operands: parameters in signature order, then the outputs the caller gave.
    pub fn operands(&self) -> impl Iterator<Item = &T> {
        let params = self.args.iter().filter_map(|v| match v {
            Value::Tensor(t) => Some(t),
            Value::Scalar(_) => None,
        });
        params.chain(self.given.iter().flatten())
    }

    /// [`Binding::operands`], mutably (an adapter may re-import one, e.g. to own it).
    pub fn operands_mut(&mut self) -> impl Iterator<Item = &mut T> {
        let params = self.args.iter_mut().filter_map(|v| match v {
            Value::Tensor(t) => Some(t),
            Value::Scalar(_) => None,
        });
        params.chain(self.given.iter_mut().flatten())
    }

    /// The outputs the caller gave (None: [`Binding::run`] allocates them).
    pub fn given_outputs(&self) -> Option<&[T]> {
        self.given.as_deref()
    }

    /// The outputs the caller gave, taken out (after [`Binding::run`]).
    pub fn take_given_outputs(&mut self) -> Option<Given<T>> {
        self.given.take()
    }

    /// Shape, dtype and device of every output for the bound inputs.
    pub fn output_specs(&self) -> Result<SmallVec<[OutputSpec; 2]>, E> {
        let name = self.kernel.name();
        let sig = self.kernel.signature();
        let mut views: SmallVec<[Arg<'_>; 8]> = SmallVec::new();
        for (p, v) in sig.params.iter().zip(&self.args) {
            views.push(match v {
                Value::Scalar(s) => Arg::Scalar(*s),
                Value::Tensor(t) => Arg::Tensor(t.view().map_err(|e| e.at(name, Slot::Argument(p.name.clone())))?),
            });
        }
        Ok(self.kernel.prepare_outputs(&views)?)
    }

    /// Allocates the outputs the caller did not give with `alloc`, checks
    /// everything and runs the kernel on `stream` (NULL on the CPU). Returns
    /// the allocated outputs (none when the caller gave them).
    #[inline(always)]
    pub fn run<A: Allocator<E>>(&mut self, alloc: &mut A, stream: *mut c_void) -> Result<SmallVec<[A::Tensor; 2]>, E> {
        self.run_with(alloc, stream, |job| job.run())
    }

    /// [`Binding::run`], with `runner` calling [`Job::run`] — around which it
    /// may, say, release Python's GIL.
    #[inline(always)]
    pub fn run_with<A, R>(&mut self, alloc: &mut A, stream: *mut c_void, runner: R) -> Result<SmallVec<[A::Tensor; 2]>, E>
    where
        A: Allocator<E>,
        R: FnOnce(Job<'_>) -> Result<()>,
    {
        let kernel = self.kernel;
        if let Some(given) = &mut self.given {
            run_on(kernel, &mut self.args, given, false, stream, runner)?;
            return Ok(SmallVec::new());
        }
        let mut allocated: SmallVec<[A::Tensor; 2]> = SmallVec::new();
        if !kernel.signature().outputs.is_empty() {
            for spec in self.output_specs()?.iter() {
                match alloc.allocate(spec) {
                    Ok(t) => allocated.push(t),
                    Err(e) => return Err(alloc.locate(e, kernel.name(), &spec.name)),
                }
            }
        }
        // A new output shares memory with nothing: an allocator that hands back
        // an input's memory (or another output's) would have the kernel
        // overwrite what it reads.
        if !alloc.returns_new_memory()
            && let Some((j, slot)) = fresh_overlap(kernel, &self.args, &allocated)?
        {
            let output = &kernel.signature().outputs[j].name;
            let e = Error::InvalidArgument(format!(
                "{} returned memory that overlaps {slot}; an allocator must return new memory",
                alloc.describe()
            ));
            return Err(alloc.locate(e.into(), kernel.name(), output));
        }
        run_on(kernel, &mut self.args, &mut allocated, true, stream, runner)?;
        Ok(allocated)
    }
}

/// Copies (host memory, contiguous) of the read-only arguments that share
/// memory with a tensor the call writes, by parameter index; none in the
/// usual case, where nothing overlaps.
fn copies_of_overlapping_inputs<T: Operand, O: Operand>(
    kernel: &Kernel,
    params: &Values<T>,
    outs: &[O],
    outputs_fresh: bool,
) -> Result<SmallVec<[(usize, Array); 2]>> {
    if outputs_fresh && !kernel.signature().params.iter().any(|p| p.tensor().is_some_and(|t| t.mutable)) {
        return Ok(SmallVec::new());
    }
    let mut args: SmallVec<[Arg<'_>; 8]> = SmallVec::new();
    for v in params.iter() {
        args.push(match v {
            Value::Scalar(s) => Arg::Scalar(*s),
            Value::Tensor(t) => Arg::Tensor(t.view()?),
        });
    }
    let views: SmallVec<[TensorView<'_>; 2]> = outs.iter().map(Operand::view).collect::<Result<_>>()?;
    let Some(plan) = kernel.inputs_to_copy(&args, &views, outputs_fresh) else { return Ok(SmallVec::new()) };
    let mut copies = SmallVec::new();
    for i in plan {
        if let Arg::Tensor(v) = &args[i] {
            let mut copy = Array::zeros(v.dtype(), v.shape())?;
            copy.view_mut()?.copy_from(v)?;
            copies.push((i, copy));
        }
    }
    Ok(copies)
}

/// The first allocated output that overlaps an argument or an earlier
/// output: its index and the slot it overlaps.
fn fresh_overlap<T: Operand, O: Operand>(kernel: &Kernel, params: &Values<T>, outs: &[O]) -> Result<Option<(usize, Slot)>> {
    let sig = kernel.signature();
    for (j, o) in outs.iter().enumerate() {
        let w = o.view()?;
        for (p, v) in sig.params.iter().zip(params.iter()) {
            if let Value::Tensor(t) = v
                && crate::kernel::views_overlap(&w, &t.view()?)
            {
                return Ok(Some((j, Slot::Argument(p.name.clone()))));
            }
        }
        for (k, other) in outs[..j].iter().enumerate() {
            if crate::kernel::views_overlap(&w, &other.view()?) {
                return Ok(Some((j, Slot::Output(sig.outputs[k].name.clone()))));
            }
        }
    }
    Ok(None)
}

/// Takes every operand's view (no adapter or allocator code runs from here
/// until they are dropped) and hands the checked kernel call to `runner`.
#[inline(always)]
fn run_on<T: Operand, O: Operand, E: From<Error>, R>(
    kernel: &Kernel,
    params: &mut Values<T>,
    outs: &mut [O],
    outputs_fresh: bool,
    stream: *mut c_void,
    runner: R,
) -> Result<(), E>
where
    R: FnOnce(Job<'_>) -> Result<()>,
{
    let (name, sig) = (kernel.name(), kernel.signature());
    // Inputs that share memory with what the call writes are read from copies
    // (`Kernel::inputs_to_copy`), made before any view the kernel gets.
    let copies = copies_of_overlapping_inputs(kernel, params, outs, outputs_fresh).map_err(E::from)?;
    // Each view goes from the operand straight into its slot (a view is
    // ~100 bytes; every extra move of one just written costs a stall).
    let mut args: SmallVec<[Arg<'_>; 8]> = SmallVec::new();
    for (i, (p, v)) in sig.params.iter().zip(params.iter_mut()).enumerate() {
        if let Some((_, copy)) = copies.iter().find(|(k, _)| *k == i) {
            args.push(Arg::Tensor(copy.view()));
            continue;
        }
        match v {
            Value::Scalar(s) => args.push(Arg::Scalar(*s)),
            Value::Tensor(t) => {
                if p.tensor().is_some_and(|t| t.mutable) {
                    match t.view_mut() {
                        Ok(view) => args.push(Arg::TensorMut(view)),
                        Err(e) => return Err(e.at(name, Slot::Argument(p.name.clone())).into()),
                    }
                } else {
                    match t.view() {
                        Ok(view) => args.push(Arg::Tensor(view)),
                        Err(e) => return Err(e.at(name, Slot::Argument(p.name.clone())).into()),
                    }
                }
            }
        }
    }
    let mut views: SmallVec<[TensorViewMut<'_>; 2]> = SmallVec::new();
    for (p, t) in sig.outputs.iter().zip(outs.iter_mut()) {
        match t.view_mut() {
            Ok(view) => views.push(view),
            Err(e) => return Err(e.at(name, Slot::Output(p.name.clone())).into()),
        }
    }
    // Raw pointers are not Send; the stream handle crosses as an address.
    let stream = stream as usize;
    runner(Job { f: &mut || kernel.call_on_stream(&mut args, &mut views, stream as *mut c_void) })?;
    Ok(())
}

/// The project's own [`Array`] is an operand: writable when unshared.
impl Operand for Array {
    fn view(&self) -> Result<TensorView<'_>> {
        Ok(Array::view(self))
    }
    fn view_mut(&mut self) -> Result<TensorViewMut<'_>> {
        Array::view_mut(self)
    }
}

/// An owning DLPack tensor is an operand: writable unless flagged READ_ONLY.
impl Operand for ManagedTensor {
    fn view(&self) -> Result<TensorView<'_>> {
        Ok(ManagedTensor::view(self).clone())
    }
    fn view_mut(&mut self) -> Result<TensorViewMut<'_>> {
        ManagedTensor::view_mut(self)
    }
}

/// Allocates outputs as [`Array`]s in host memory (zeroed), in the spec's memory order.
#[derive(Debug, Clone, Copy, Default)]
pub struct ArrayAllocator;

impl<E: From<Error>> Allocator<E> for ArrayAllocator {
    type Tensor = Array;
    fn returns_new_memory(&self) -> bool {
        true
    }
    fn allocate(&mut self, spec: &OutputSpec) -> Result<Array, E> {
        if !spec.device.is_host_accessible() {
            return Err(Error::UnsupportedDevice {
                got: spec.device,
                what: format!("cannot allocate {spec}: an Array lives in host memory"),
            }
            .into());
        }
        if spec.is_row_major() {
            return Ok(Array::zeros(spec.dtype, &spec.shape)?);
        }
        Ok(Array::zeros(spec.dtype, &spec.memory_shape())?.permute(&spec.axes())?)
    }
}

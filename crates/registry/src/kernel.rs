//! Kernels: a checked signature plus one implementation per device.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use dlbridge_core::{DType, DeviceType, Error, Result, Slot, TensorViewMut};
use smallvec::SmallVec;

use crate::arg::Arg;
use crate::call::{Call, layout_bug};
use crate::meta::{MetaArg, MetaOutput, StandIns};
use crate::signature::{MAX_EXCERPT, Signature, clip};
use crate::solution::{
    OutputSpec, Plan, Solution, check_call, check_kept_leading, dim_origins, output_specs, output_specs_strided, solve_for_specs, solve_on,
};

/// Most bytes of an origin (`plugin NAME VERSION (PATH)`) an error message quotes.
const ORIGIN_EXCERPT: usize = 2 * MAX_EXCERPT;

/// A kernel implementation compiled into the binary.
pub type KernelFn = fn(&mut Call<'_, '_>) -> Result<()>;

/// A kernel implementation registered at run time (plugins, CUDA kernels).
pub type DynKernelFn = Arc<dyn Fn(&mut Call<'_, '_>) -> Result<()> + Send + Sync>;

/// How a kernel is implemented on one device.
#[derive(Clone)]
pub enum Impl {
    /// One function for every dtype; it reads the bound dtypes from the [`Call`].
    Generic(KernelFn),
    /// One function per dtype of the first type variable. An implementation for
    /// a device may cover a subset of the signature's dtypes (a CUDA kernel for
    /// f32 only); a call with another dtype on that device is a type error.
    PerDType(Arc<[(DType, KernelFn)]>),
    /// A resolver instantiating one generic function per dtype: turned into a
    /// [`Impl::PerDType`] table for every dtype the signature allows when the
    /// kernel is registered (one it cannot resolve fails the registration).
    Each(fn(DType) -> Option<KernelFn>),
    /// A run-time registered implementation (e.g. a plugin entry point).
    Dyn(DynKernelFn),
}

impl fmt::Debug for Impl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Impl::Generic(_) => f.write_str("Generic"),
            Impl::PerDType(list) => f.debug_list().entries(list.iter().map(|(d, _)| d)).finish(),
            Impl::Each(_) => f.write_str("Each"),
            Impl::Dyn(_) => f.write_str("Dyn"),
        }
    }
}

/// Per-kernel options beyond the signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KernelOpts {
    /// An output may be exactly an input (same memory, shape and strides): the
    /// kernel then works in place. Any other overlap is always refused.
    pub alias_outputs: bool,
    /// Every tensor must be contiguous; a strided one is refused (not copied).
    pub contiguous: bool,
    /// Outputs the caller did not give are allocated row-major, whatever the
    /// inputs' layout (a kernel whose job is a contiguous copy). Otherwise an
    /// output shaped like inputs follows their memory order ([`OutputSpec::order`](crate::OutputSpec::order)).
    pub row_major_outputs: bool,
    /// Each output element is computed from the inputs' elements at its own
    /// position only (no index, size, or read at another position): a batch
    /// of calls may be made as one call on the stacked tensors (`jax.vmap`).
    pub per_element: bool,
    /// Each `mut` tensor argument receives a reduction of the inputs over
    /// their trailing dims: its shape must be the leading dims of the first
    /// read-only tensor argument's (ReductionKernel's outputs). Checked before
    /// the implementation runs, and by [`Kernel::check_meta`].
    pub kept_leading_dims: bool,
}

impl KernelOpts {
    /// No aliasing, any strides.
    pub const DEFAULT: KernelOpts =
        KernelOpts { alias_outputs: false, contiguous: false, row_major_outputs: false, per_element: false, kept_leading_dims: false };
    /// Outputs may be exactly an input (elementwise kernels).
    pub const ELEMENTWISE: KernelOpts = KernelOpts { alias_outputs: true, ..KernelOpts::DEFAULT };

    /// Whether outputs shaped like inputs follow their memory order.
    #[inline]
    pub fn outputs_follow_inputs(&self) -> bool {
        !self.contiguous && !self.row_major_outputs
    }
}

/// A registered kernel: its signature, options and implementations per device.
pub struct Kernel {
    sig: Signature,
    plan: Plan,
    text: String,
    opts: KernelOpts,
    impls: SmallVec<[(DeviceType, Impl, String); 1]>,
    doc: String,
    identity: String,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel").field("signature", &self.text).field("devices", &self.devices().collect::<Vec<_>>()).finish()
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Everything needed to register a kernel at run time.
#[derive(Debug, Clone)]
pub struct KernelDef {
    /// The signature text.
    pub signature: String,
    /// The device the implementation runs on.
    pub device: DeviceType,
    /// The implementation.
    pub imp: Impl,
    /// Options.
    pub opts: KernelOpts,
    /// Where it comes from (`built-in (file:line)`, a plugin path, ...).
    pub origin: String,
    /// One-line description.
    pub doc: String,
    /// What defines the kernel beyond its signature: its source text, its
    /// definition, its plugin file's digest; empty for a built-in (whose
    /// origin says which). Part of [`Kernel::digest`].
    pub identity: String,
}

impl KernelDef {
    /// A CPU kernel implemented by a closure, with default options, origin
    /// `run time` and no description; set other fields with struct update
    /// syntax (`KernelDef { opts: KernelOpts::ELEMENTWISE, ..KernelDef::cpu(sig, f) }`).
    pub fn cpu(signature: impl Into<String>, f: impl Fn(&mut Call<'_, '_>) -> Result<()> + Send + Sync + 'static) -> KernelDef {
        KernelDef {
            signature: signature.into(),
            device: DeviceType::CPU,
            imp: Impl::Dyn(Arc::new(f)),
            opts: KernelOpts::DEFAULT,
            origin: "run time".into(),
            doc: String::new(),
            identity: String::new(),
        }
    }
}

impl Kernel {
    /// A kernel with one implementation, from its parsed signature.
    pub(crate) fn from_parsed(sig: Signature, def: KernelDef) -> Result<Kernel> {
        let text = sig.to_string();
        let imp = resolve_impl(&sig, def.device, def.imp)?;
        let plan = Plan::new(&sig);
        Ok(Kernel {
            sig,
            plan,
            text,
            opts: def.opts,
            impls: smallvec::smallvec![(def.device, imp, def.origin)],
            doc: def.doc,
            identity: def.identity,
        })
    }

    /// This kernel plus an implementation for another device (`sig` is the
    /// parsed `def.signature`). `self` is not changed: the caller swaps the
    /// result in.
    pub(crate) fn with_impl_parsed(&self, sig: Signature, def: KernelDef) -> Result<Kernel> {
        if sig != self.sig || def.opts != self.opts {
            let first = self.impls.first().map_or("", |(_, _, o)| o.as_str());
            return Err(Error::InvalidArgument(format!(
                "kernel {} is already registered with signature `{}`{} by {}; {} declares `{}`{}",
                self.sig.name,
                clip(&self.text, MAX_EXCERPT),
                if self.opts == def.opts { String::new() } else { format!(" and options {:?}", self.opts) },
                clip(first, ORIGIN_EXCERPT),
                clip(&def.origin, ORIGIN_EXCERPT),
                clip(&sig.to_string(), MAX_EXCERPT),
                if self.opts == def.opts { String::new() } else { format!(" with options {:?}", def.opts) },
            )));
        }
        if let Some((_, _, origin)) = self.impls.iter().find(|(d, _, _)| *d == def.device) {
            return Err(Error::InvalidArgument(format!(
                "kernel {} on {} is registered twice: by {} and by {}",
                self.sig.name,
                def.device,
                clip(origin, ORIGIN_EXCERPT),
                clip(&def.origin, ORIGIN_EXCERPT)
            )));
        }
        let imp = resolve_impl(&sig, def.device, def.imp)?;
        let mut impls = self.impls.clone();
        impls.push((def.device, imp, def.origin));
        Ok(Kernel {
            sig: self.sig.clone(),
            plan: self.plan.clone(),
            text: self.text.clone(),
            opts: self.opts,
            impls,
            doc: self.doc.clone(),
            identity: if self.identity.is_empty() { def.identity } else { self.identity.clone() },
        })
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.sig.name
    }
    /// The parsed signature.
    pub fn signature(&self) -> &Signature {
        &self.sig
    }
    /// The canonical signature text.
    pub fn signature_text(&self) -> &str {
        &self.text
    }
    /// Options.
    pub fn opts(&self) -> KernelOpts {
        self.opts
    }
    /// One-line description.
    pub fn doc(&self) -> &str {
        &self.doc
    }
    /// The devices it runs on.
    pub fn devices(&self) -> impl Iterator<Item = DeviceType> + '_ {
        self.impls.iter().map(|(d, _, _)| *d)
    }
    /// Where each implementation comes from.
    pub fn origins(&self) -> impl Iterator<Item = (DeviceType, &str)> + '_ {
        self.impls.iter().map(|(d, _, o)| (*d, o.as_str()))
    }

    /// What defines it beyond its signature ([`KernelDef::identity`]).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// A digest of what the kernel is: its signature, options, origins and
    /// identity (32 hex digits of SHA-256). Two kernels with the same digest
    /// compute the same thing; a program built for one (an exported XLA
    /// custom call) checks it runs that one.
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        let origins: Vec<String> = self.impls.iter().map(|(d, _, o)| format!("{d}: {o}")).collect();
        for part in [self.text.as_str(), &format!("{:?}", self.opts), &origins.join("\n"), &self.identity] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    /// Shapes, dtypes and devices of the outputs for these inputs: what an
    /// adapter needs to allocate them with its own framework.
    pub fn prepare_outputs(&self, args: &[Arg<'_>]) -> Result<SmallVec<[OutputSpec; 2]>> {
        let b = solve_for_specs(&self.sig, args)?;
        output_specs(&self.sig, &b, args, self.opts.outputs_follow_inputs())
    }

    /// The checks of a call on arguments known by layout only (a traced
    /// call's), and its outputs: what [`Kernel::call`] would check before
    /// running (the signature, a writable argument's layout, contiguity when
    /// the kernel asks, its shape rule; not aliasing, which needs addresses),
    /// with the same errors, and what it would allocate, with the origin of
    /// every output dim. See [`crate::meta`].
    pub fn check_meta(&self, args: &[MetaArg<'_>]) -> Result<SmallVec<[MetaOutput; 2]>> {
        let stand = StandIns::new(&self.sig.name, &self.sig.params, args)?;
        let mut b = Solution::default();
        solve_on(&self.sig, &stand.args, false, Some(&stand.devices), &mut b)?;
        for (i, (p, a)) in self.sig.params.iter().zip(args).enumerate() {
            let (Some(t), MetaArg::Tensor(m)) = (p.tensor(), a) else { continue };
            if t.mutable {
                dlbridge_core::layout::check_writable(m.shape, m.strides).map_err(|e| e.at(self.sig.name.clone(), self.slot(i)))?;
            }
            if self.opts.contiguous && !dlbridge_core::layout::is_contiguous(m.shape, m.strides) {
                return Err(Error::NotContiguous { what: "this kernel".into(), shape: m.shape.to_vec(), strides: m.strides.to_vec() }
                    .at(self.sig.name.clone(), self.slot(i)));
            }
        }
        if self.opts.kept_leading_dims {
            check_kept_leading(&self.sig, &stand.args)?;
        }
        let specs = output_specs_strided(&self.sig, &b, &stand.args, self.opts.outputs_follow_inputs(), Some(&stand.strides))?;
        let mut outs = SmallVec::new();
        for (spec, p) in specs.into_iter().zip(self.sig.outputs.iter().filter(|p| p.tensor().is_some())) {
            let dims = p.tensor().map_or(&[][..], |t| &t.dims[..]);
            outs.push(MetaOutput { dims: dim_origins(&self.sig, &b, &stand.args, dims)?, spec });
        }
        Ok(outs)
    }

    /// Checks every argument and output against the signature, then runs the
    /// implementation for the tensors' device. Nothing is written when a check fails.
    pub fn call<'a>(&self, args: &mut [Arg<'a>], outs: &mut [TensorViewMut<'a>]) -> Result<()> {
        self.call_on_stream(args, outs, std::ptr::null_mut())
    }

    /// [`Kernel::call`] with a stream handle for device kernels.
    pub fn call_on_stream<'a>(&self, args: &mut [Arg<'a>], outs: &mut [TensorViewMut<'a>], stream: *mut c_void) -> Result<()> {
        let mut b = Solution::default();
        check_call(&self.sig, &self.plan, args, outs, &mut b)?;
        self.check_layouts(args, outs)?;
        if self.opts.kept_leading_dims {
            check_kept_leading(&self.sig, args)?;
        }
        let device = b.device().map_or(DeviceType::CPU, |d| d.kind);
        let Some((_, imp, _)) = self.impls.iter().find(|(d, _, _)| *d == device) else {
            return Err(self.no_device(&b));
        };
        let run = match imp {
            Impl::Generic(f) => *f,
            Impl::PerDType(list) => {
                let Some(d) = b.dtype(0) else { return Err(layout_bug(&self.sig.name)) };
                match list.iter().find(|(ld, _)| *ld == d) {
                    Some((_, f)) => *f,
                    None => return Err(self.uncovered(device, d, list)),
                }
            }
            // Registration turns every resolver into a PerDType table (resolve_impl).
            Impl::Each(_) => return Err(layout_bug(&self.sig.name)),
            Impl::Dyn(f) => {
                let mut call = Call { args, outs, solution: &b, stream, kernel: &self.sig.name, sig: &self.sig };
                return guard(&self.sig.name, || f(&mut call));
            }
        };
        let mut call = Call { args, outs, solution: &b, stream, kernel: &self.sig.name, sig: &self.sig };
        guard(&self.sig.name, || run(&mut call))
    }

    /// The error for tensors on a device this kernel has no implementation for.
    #[cold]
    #[inline(never)]
    fn no_device(&self, b: &Solution) -> Error {
        let served: Vec<String> = self.devices().map(|d| d.to_string()).collect();
        Error::UnsupportedDevice {
            got: b.device().unwrap_or(dlbridge_core::Device::CPU),
            what: format!("{} runs on {}", self.sig.name, served.join(", ")),
        }
    }

    /// The type error for a dtype the signature allows but this device's
    /// implementation does not cover: it names the device, the dtype and what
    /// each device serves.
    #[cold]
    #[inline(never)]
    fn uncovered(&self, device: DeviceType, d: DType, covered: &[(DType, KernelFn)]) -> Error {
        let list = |l: &[(DType, KernelFn)]| l.iter().map(|(d, _)| d.to_string()).collect::<Vec<_>>().join(", ");
        let others: Vec<String> = self
            .impls
            .iter()
            .filter(|(dev, _, _)| *dev != device)
            .map(|(dev, imp, _)| match imp {
                Impl::PerDType(l) => format!("{dev}: {}", list(l)),
                _ => format!("{dev}: all"),
            })
            .collect();
        Error::DTypeMismatch {
            expected: format!(
                "a dtype the {device} implementation covers ({}){}",
                list(covered),
                if others.is_empty() { String::new() } else { format!("; other devices: {}", others.join("; ")) }
            ),
            got: d,
        }
        .context(format!("{}: no {device} implementation for {d}", self.sig.name))
    }

    /// Contiguity (when required) and aliasing between writable tensors and the rest.
    ///
    /// The tensors are taken in slot order (the tensor arguments, then the
    /// outputs); each written one (an output, or a `mut` parameter) is compared
    /// with every other. No list is built: a call has a few tensors, and this
    /// runs on every call.
    #[inline]
    fn check_layouts(&self, args: &[Arg<'_>], outs: &[TensorViewMut<'_>]) -> Result<()> {
        let n = self.sig.params.len();
        if self.opts.contiguous {
            for (i, v, _) in self.tensors(args, outs) {
                if !v.is_contiguous() {
                    return Err(self.not_contiguous(i, v));
                }
            }
        }
        if self.plan.has_mut {
            return self.check_overlaps(args, outs);
        }
        // No `mut` parameter: the outputs are the only written tensors.
        for (j, o) in outs.iter().enumerate() {
            let w = Region::new(o.as_view());
            if w.is_empty() {
                continue;
            }
            for (i, a) in args.iter().enumerate() {
                let v = match a {
                    Arg::Tensor(v) => v,
                    Arg::TensorMut(v) => v.as_view(),
                    _ => continue,
                };
                if w.overlaps(&Region::new(v)) && !(self.opts.alias_outputs && w.is_exactly(v)) {
                    return Err(self.overlap(n + j, i));
                }
            }
            for (k, other) in outs.iter().enumerate() {
                if k != j && w.overlaps(&Region::new(other.as_view())) {
                    return Err(self.overlap(n + j, n + k));
                }
            }
        }
        Ok(())
    }

    /// Aliasing between every written tensor (outputs and `mut` parameters)
    /// and every other tensor of the call.
    fn check_overlaps(&self, args: &[Arg<'_>], outs: &[TensorViewMut<'_>]) -> Result<()> {
        let n = self.sig.params.len();
        for (x, w, writable) in self.tensors(args, outs) {
            let w = Region::new(w);
            if !writable || w.is_empty() {
                continue;
            }
            for (y, other, other_writable) in self.tensors(args, outs) {
                if x == y || !w.overlaps(&Region::new(other)) {
                    continue;
                }
                if !(w.is_exactly(other) && self.opts.alias_outputs && x >= n && !other_writable) {
                    return Err(self.overlap(x, y));
                }
            }
        }
        Ok(())
    }

    /// The read-only tensor arguments that share memory with a tensor the
    /// call writes (an output, a `mut` parameter) in any way but the one an
    /// elementwise kernel allows (an output that is exactly an input): they
    /// are read from a copy, as CuPy copies overlapping inputs, so the call
    /// gives what it gives out of place. `args` are read views of every
    /// argument, `outs` of the outputs; `outputs_fresh` says the outputs were
    /// just allocated (then only `mut` parameters can overlap). `None` when no
    /// copy is needed, or when one cannot help (two written tensors overlap,
    /// or the input is memory the host cannot copy): the layout checks then
    /// refuse the call as before.
    pub fn inputs_to_copy(
        &self,
        args: &[Arg<'_>],
        outs: &[dlbridge_core::TensorView<'_>],
        outputs_fresh: bool,
    ) -> Option<SmallVec<[usize; 4]>> {
        if outputs_fresh && !self.plan.has_mut {
            return None;
        }
        let n = self.sig.params.len();
        fn view<'v>(a: &'v Arg<'_>) -> Option<&'v dlbridge_core::TensorView<'v>> {
            match a {
                Arg::Tensor(v) => Some(v),
                Arg::TensorMut(v) => Some(v.as_view()),
                Arg::Scalar(_) => None,
            }
        }
        let mutable = |i: usize| self.sig.params.get(i).and_then(|p| p.tensor()).is_some_and(|t| t.mutable);
        // The written tensors: `mut` arguments, then the outputs (slot, view).
        let mut written: SmallVec<[(usize, &dlbridge_core::TensorView<'_>); 4]> = SmallVec::new();
        for (i, a) in args.iter().enumerate() {
            if mutable(i)
                && let Some(v) = view(a)
            {
                written.push((i, v));
            }
        }
        written.extend(outs.iter().enumerate().map(|(j, o)| (n + j, o)));
        let mut plan = SmallVec::new();
        for (i, a) in args.iter().enumerate() {
            if mutable(i) {
                continue;
            }
            let Some(v) = view(a) else { continue };
            let r = Region::new(v);
            let clash = written.iter().any(|&(slot, w)| {
                let wr = Region::new(w);
                wr.overlaps(&r) && !(self.opts.alias_outputs && slot >= n && wr.is_exactly(v))
            });
            if clash {
                if !v.device().is_host_accessible() {
                    return None;
                }
                plan.push(i);
            }
        }
        (!plan.is_empty()).then_some(plan)
    }

    /// Every tensor of a call in slot order: (slot, view, written by the kernel).
    #[inline(always)]
    fn tensors<'s>(
        &'s self,
        args: &'s [Arg<'_>],
        outs: &'s [TensorViewMut<'_>],
    ) -> impl Iterator<Item = (usize, &'s dlbridge_core::TensorView<'s>, bool)> + 's {
        let n = self.sig.params.len();
        let params = args.iter().zip(&self.sig.params).enumerate().filter_map(|(i, (a, p))| match a {
            Arg::Tensor(v) => Some((i, v, false)),
            Arg::TensorMut(v) => Some((i, v.as_view(), p.tensor().is_some_and(|t| t.mutable))),
            _ => None,
        });
        params.chain(outs.iter().enumerate().map(move |(j, o)| (n + j, o.as_view(), true)))
    }

    fn slot(&self, i: usize) -> Slot {
        let n = self.sig.params.len();
        if i < n { Slot::Argument(self.sig.params[i].name.clone()) } else { Slot::Output(self.sig.outputs[i - n].name.clone()) }
    }

    #[cold]
    #[inline(never)]
    fn not_contiguous(&self, i: usize, v: &dlbridge_core::TensorView<'_>) -> Error {
        Error::NotContiguous { what: "this kernel".into(), shape: v.shape().to_vec(), strides: v.strides().to_vec() }
            .at(self.sig.name.clone(), self.slot(i))
    }

    #[cold]
    #[inline(never)]
    fn overlap(&self, written: usize, other: usize) -> Error {
        Error::InvalidArgument(format!(
            "overlaps {} in memory{}",
            self.slot(other),
            if self.opts.alias_outputs {
                " (only an output that is exactly an input is allowed)"
            } else {
                " (this kernel does not allow aliasing)"
            }
        ))
        .at(self.sig.name.clone(), self.slot(written))
    }
}

/// The bytes one tensor of a call touches, as the layout checks see them.
struct Region<'v> {
    ptr: usize,
    lo: isize,
    hi: isize,
    view: &'v dlbridge_core::TensorView<'v>,
}

impl<'v> Region<'v> {
    #[inline(always)]
    fn new(v: &'v dlbridge_core::TensorView<'v>) -> Region<'v> {
        let e = v.extent();
        Region { ptr: v.data_ptr() as usize, lo: e.byte_lo, hi: e.byte_hi, view: v }
    }

    /// Whether it touches no byte (no element).
    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.hi == self.lo
    }

    /// Whether `v` is the same tensor, byte for byte: same first element, shape,
    /// strides and element width (so the same byte strides and extent). An
    /// element-wise kernel then reads each element before it writes it; a wider
    /// or narrower dtype over the same address would write elements not yet read.
    #[inline(always)]
    fn is_exactly(&self, v: &dlbridge_core::TensorView<'_>) -> bool {
        self.view.data_ptr() == v.data_ptr()
            && self.view.dtype().element_bits() == v.dtype().element_bits()
            && self.view.shape() == v.shape()
            && self.view.strides() == v.strides()
    }

    #[inline(always)]
    fn overlaps(&self, o: &Region<'_>) -> bool {
        if self.hi == self.lo || o.hi == o.lo {
            return false;
        }
        let (a0, a1) = (self.ptr as i128 + self.lo as i128, self.ptr as i128 + self.hi as i128);
        let (b0, b1) = (o.ptr as i128 + o.lo as i128, o.ptr as i128 + o.hi as i128);
        a0 < b1 && b0 < a1
    }
}

/// Whether two tensors share any byte of memory.
pub fn views_overlap(a: &dlbridge_core::TensorView<'_>, b: &dlbridge_core::TensorView<'_>) -> bool {
    let (ea, eb) = (a.extent(), b.extent());
    if ea.byte_hi == ea.byte_lo || eb.byte_hi == eb.byte_lo {
        return false;
    }
    let (pa, pb) = (a.data_ptr() as usize as i128, b.data_ptr() as usize as i128);
    let (a0, a1) = (pa + ea.byte_lo as i128, pa + ea.byte_hi as i128);
    let (b0, b1) = (pb + eb.byte_lo as i128, pb + eb.byte_hi as i128);
    a0 < b1 && b0 < a1
}

/// The message of a caught panic (`&str` or `String` payloads; anything else is "unknown panic").
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

fn guard(name: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e @ (Error::Context { .. } | Error::Argument { .. }))) => Err(e),
        // A message that names the kernel already (plugins' own errors, e.g.
        // generated kernels' `name: ...`) is not prefixed twice.
        Ok(Err(e)) if e.to_string().strip_prefix(name).is_some_and(|rest| rest.starts_with(": ")) => Err(e),
        Ok(Err(e)) => Err(e.context(name.to_owned())),
        Err(panic) => Err(Error::Runtime(format!("{name}: kernel panicked: {}", panic_message(panic.as_ref())))),
    }
}

/// Checks a per-dtype implementation against the signature and derives the
/// table of a resolver: a table may cover a non-empty subset of the first type
/// variable's dtypes (and nothing outside it); a resolver must cover all of them.
fn resolve_impl(sig: &Signature, device: DeviceType, imp: Impl) -> Result<Impl> {
    let tv = || {
        sig.type_vars
            .first()
            .ok_or_else(|| Error::InvalidArgument(format!("{}: per-dtype implementations need a type variable in the signature", sig.name)))
    };
    match imp {
        Impl::Each(resolve) => {
            let tv = tv()?;
            let mut table = Vec::with_capacity(tv.allowed.len());
            for &d in &tv.allowed {
                match resolve(d) {
                    Some(f) => table.push((d, f)),
                    None => {
                        return Err(Error::InvalidArgument(format!(
                            "{}: the signature allows {} = {d}, but the {device} implementation has no {d} instantiation \
                             (remove {d} from the signature, or add its Rust type to the resolver's family)",
                            sig.name, tv.name
                        )));
                    }
                }
            }
            Ok(Impl::PerDType(table.into()))
        }
        Impl::PerDType(list) => {
            let tv = tv()?;
            if list.is_empty() {
                return Err(Error::InvalidArgument(format!("{}: the {device} implementation covers no dtype", sig.name)));
            }
            for (d, _) in list.iter() {
                if !tv.allowed.contains(d) {
                    return Err(Error::InvalidArgument(format!("{}: implementation for {d}, which {} does not allow", sig.name, tv.name)));
                }
            }
            Ok(Impl::PerDType(list))
        }
        other => Ok(other),
    }
}

/// Kernels staged over a map without changing it. [`Staging::add`] builds the
/// kernel a definition creates or extends (looking at what was staged before
/// it, then at the map); [`Staging::into_changes`] gives the new kernels by
/// name, to be inserted into the map in one step.
#[derive(Debug)]
pub(crate) struct Staging<'m> {
    base: &'m BTreeMap<String, Arc<Kernel>>,
    staged: BTreeMap<String, Arc<Kernel>>,
}

impl<'m> Staging<'m> {
    pub(crate) fn new(base: &'m BTreeMap<String, Arc<Kernel>>) -> Staging<'m> {
        Staging { base, staged: BTreeMap::new() }
    }

    /// Stages one definition: parses and type-checks its signature and builds
    /// the new kernel, or the existing one extended by a new device.
    pub(crate) fn add(&mut self, def: KernelDef) -> Result<Arc<Kernel>> {
        let sig = Signature::parse(&def.signature)?;
        let kernel = match self.staged.get(&sig.name).or_else(|| self.base.get(&sig.name)) {
            Some(existing) => existing.with_impl_parsed(sig, def)?,
            None => Kernel::from_parsed(sig, def)?,
        };
        let kernel = Arc::new(kernel);
        self.staged.insert(kernel.name().to_owned(), kernel.clone());
        Ok(kernel)
    }

    /// The kernels to insert (replacing the ones of the same name).
    pub(crate) fn into_changes(self) -> BTreeMap<String, Arc<Kernel>> {
        self.staged
    }
}

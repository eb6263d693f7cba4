//! [`ElementwiseKernel`]: CuPy's `ElementwiseKernel` on dlbridge's registry.
//!
//! ```no_run
//! use dlbridge_compile::ElementwiseKernel;
//! let k = ElementwiseKernel::new("T x, T y", "T z", "z = (x - y) * (x - y)", "squared_diff", Default::default())?;
//! let kernel = k.register(dlbridge_registry::Registry::global())?; // callable like any kernel
//! # Ok::<(), dlbridge_core::Error>(())
//! ```
//!
//! The parameters become a signature (`squared_diff<T: ...>(x: T[*S], y:
//! T[*S]) -> (z: T[*S])`): the registry checks every call, binds the type
//! variables and broadcasts the shapes before any code runs; outputs are
//! allocated by the caller's framework. The first call with a combination of
//! dtypes generates C++ for it, compiles it (or finds it in the disk cache)
//! into a plugin library and loads it through the plugin loader; later calls
//! go straight to it. Concurrent first calls compile once.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use dlbridge_core::{DType, DeviceType, Error, Result};
use dlbridge_registry::{Call, DynKernelFn, Impl, Kernel, KernelDef, KernelOpts, Plugin, Registry, Signature};

use crate::cache::LibraryCache;
use crate::params::ElementwiseSpec;

/// The origin every kernel compiled from source carries (and by which a later
/// kernel of the same name may replace it).
pub const ORIGIN_PREFIX: &str = "compiled from source by dlbridge-compile";

/// The optional parts of an elementwise kernel, as CuPy names them.
#[derive(Debug, Clone, Default)]
pub struct ElementwiseOptions {
    /// Code at file scope before the kernel (helper functions, constants).
    pub preamble: String,
    /// Code run once before the loop (per thread).
    pub loop_prep: String,
    /// Code run once after the loop (per thread).
    pub after_loop: String,
}

/// A kernel compiled from an elementwise operation, one specialisation per
/// combination of dtypes, built on first use.
#[derive(Clone)]
pub struct ElementwiseKernel {
    spec: Arc<ElementwiseSpec>,
    signature: String,
    specs: Arc<Specialisations>,
    cuda_specs: Arc<crate::cuda::CudaSpecialisations>,
}

impl std::fmt::Debug for ElementwiseKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElementwiseKernel").field("signature", &self.signature).finish()
    }
}

impl ElementwiseKernel {
    /// Parses and checks the parameters and derives the signature; nothing is
    /// compiled until a call needs it.
    pub fn new(in_params: &str, out_params: &str, operation: &str, name: &str, opts: ElementwiseOptions) -> Result<ElementwiseKernel> {
        let spec = ElementwiseSpec::new(in_params, out_params, operation, name, &opts.preamble, &opts.loop_prep, &opts.after_loop)?;
        let signature = spec.signature();
        // The derived signature must be one the registry accepts (a bug here, not the user's).
        Signature::parse(&signature)
            .map_err(|e| Error::Runtime(format!("ElementwiseKernel {name}: derived signature `{signature}`: {e}")))?;
        Ok(ElementwiseKernel {
            spec: Arc::new(spec),
            signature,
            specs: Arc::new(Specialisations::default()),
            cuda_specs: Arc::new(Specialisations::default()),
        })
    }

    /// The registry signature derived from the parameters.
    pub fn signature(&self) -> &str {
        &self.signature
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// How many CPU specialisations this kernel has built or loaded so far.
    pub fn specialisations(&self) -> usize {
        self.specs.built()
    }

    /// How many CUDA specialisations (dtypes and device) it has compiled and loaded so far.
    pub fn cuda_specialisations(&self) -> usize {
        self.cuda_specs.built()
    }

    /// The definitions [`register`](Self::register) registers: the CPU one
    /// ([`def`](Self::def)) and the CUDA one ([`cuda_def`](Self::cuda_def)),
    /// with the same signature.
    pub fn defs(&self) -> Vec<KernelDef> {
        vec![self.def(), self.cuda_def()]
    }

    /// The CUDA definition: CUDA C generated for the call's dtypes, compiled
    /// with NVRTC for the call's device on first use (see [`crate::cuda`]).
    pub fn cuda_def(&self) -> KernelDef {
        let imp = crate::cuda::cuda_impl(crate::cuda::Plan::Elementwise(self.spec.clone()), self.cuda_specs.clone());
        KernelDef { device: DeviceType::CUDA, imp, ..self.def() }
    }

    /// The CPU definition: a CPU implementation that builds the
    /// specialisation for the call's dtypes on first use.
    pub fn def(&self) -> KernelDef {
        let spec = self.spec.clone();
        let imp = specialising(&self.spec.name, self.spec.type_vars(), self.specs.clone(), move |bind| build(&spec, bind));
        let raw = self.spec.inputs.iter().any(|p| p.raw);
        KernelDef {
            signature: self.signature.clone(),
            device: DeviceType::CPU,
            imp,
            // An output may be exactly an input (in place, `k(x, y, x)`), unless
            // a raw input can be read at any index.
            opts: KernelOpts { alias_outputs: !raw, ..KernelOpts::DEFAULT },
            origin: format!("{ORIGIN_PREFIX} (ElementwiseKernel)"),
            doc: format!("ElementwiseKernel: {}", one_line(&self.spec.operation)),
        }
    }

    /// Registers the kernel under its name, on the CPU and on CUDA
    /// ([`defs`](Self::defs)), replacing an earlier kernel compiled from
    /// source under that name (any other kernel of that name is a conflict),
    /// and returns it.
    pub fn register(&self, registry: &Registry) -> Result<Arc<Kernel>> {
        registry.register_replacing(self.defs(), replaceable)
    }
}

/// Whether a registered kernel may be replaced by a kernel compiled from
/// source of the same name: every implementation of it was compiled from
/// source (an `ElementwiseKernel`, a `ReductionKernel`, a function of
/// `dlbridge.load_inline`); a built-in or a plugin's kernel never is.
pub(crate) fn replaceable(k: &Kernel) -> bool {
    k.origins().all(|(_, o)| o.starts_with(ORIGIN_PREFIX) || o.starts_with(crate::inline::ORIGIN))
}

/// The operation on one line (for docs), cut to 100 characters.
fn one_line(s: &str) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > 100 { format!("{}…", flat.chars().take(100).collect::<String>()) } else { flat }
}

/// Generates, compiles (or finds) and loads the specialisation for `bind`.
fn build(spec: &ElementwiseSpec, bind: &[(char, DType)]) -> Result<DynKernelFn> {
    let source = crate::cpu::elementwise_cpp(spec, bind)?;
    let expected = spec.specialised_signature(bind)?;
    let user = [
        ("operation", spec.operation.as_str()),
        ("preamble", spec.preamble.as_str()),
        ("loop_prep", spec.loop_prep.as_str()),
        ("after_loop", spec.after_loop.as_str()),
    ];
    build_library("ElementwiseKernel", &spec.name, bind, &source, &expected, &user)
}

/// A CPU implementation that builds (once) and runs the specialisation for
/// the call's bound type variables `vars` (in signature order).
pub(crate) fn specialising(
    name: &str,
    vars: Vec<char>,
    specs: Arc<Specialisations>,
    build: impl Fn(&[(char, DType)]) -> Result<DynKernelFn> + Send + Sync + 'static,
) -> Impl {
    let name = name.to_owned();
    Impl::Dyn(Arc::new(move |call: &mut Call<'_, '_>| -> Result<()> {
        let mut dtypes = Vec::with_capacity(vars.len());
        for (i, v) in vars.iter().enumerate() {
            dtypes.push(call.dtype(i).ok_or_else(|| Error::Runtime(format!("{name}: type variable {v} is not bound")))?);
        }
        let f = specs.get(&dtypes, || build(&vars.iter().copied().zip(dtypes.iter().copied()).collect::<Vec<_>>()))?;
        f(call)
    }))
}

/// The library of one specialisation from the cache, compiled if need be;
/// `kind` and `name` name it in errors, `user` maps `#line` names to texts.
pub(crate) fn build_library(
    kind: &str,
    name: &str,
    bind: &[(char, DType)],
    source: &str,
    expected: &str,
    user: &[(&str, &str)],
) -> Result<DynKernelFn> {
    let dtypes_text = bind.iter().map(|(v, d)| format!("{v}={d}")).collect::<Vec<_>>().join(",");
    let what = if dtypes_text.is_empty() { format!("{kind} {name}") } else { format!("{kind} {name} ({dtypes_text})") };
    LibraryCache::global().get_or_build(source, &dtypes_text, &what, user, |path| load_one(path, expected))
}

/// Opens a compiled library through the plugin loader and takes its one
/// kernel, checking it is the expected specialisation.
pub(crate) fn load_one(path: &Path, expected: &str) -> Result<DynKernelFn> {
    let (info, defs) = Plugin::open(path)?.into_defs();
    let want = Signature::parse(expected)?.to_string();
    match defs.into_iter().next() {
        Some(KernelDef { imp: Impl::Dyn(f), signature, .. }) if info.kernels.len() == 1 && signature == want => Ok(f),
        _ => Err(Error::Runtime(format!("{}: not the library of `{want}`", path.display()))),
    }
}

/// The specialisations of one kernel, by dtypes. Each slot has a lock of its
/// own: threads calling with the same new dtypes wait for one compilation;
/// other dtypes are not held up.
pub(crate) struct Specialisations<K = Vec<DType>, V = DynKernelFn> {
    slots: Mutex<HashMap<K, Slot<V>>>,
}

impl<K, V> Default for Specialisations<K, V> {
    fn default() -> Self {
        Specialisations { slots: Mutex::new(HashMap::new()) }
    }
}

/// One specialisation: built once, under its own lock.
type Slot<V> = Arc<Mutex<Option<V>>>;

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Specialisations<K, V> {
    /// How many are built.
    pub(crate) fn built(&self) -> usize {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).values().filter(|s| s.lock().is_ok_and(|s| s.is_some())).count()
    }

    pub(crate) fn get<Q>(&self, key: &Q, build: impl FnOnce() -> Result<V>) -> Result<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            match slots.get(key) {
                Some(s) => s.clone(),
                None => slots.entry(key.to_owned()).or_default().clone(),
            }
        };
        let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = &*s {
            return Ok(f.clone());
        }
        let f = build()?;
        *s = Some(f.clone());
        Ok(f)
    }
}

//! [`SourceKernel`]: what an [`ElementwiseKernel`](crate::ElementwiseKernel)
//! and a [`ReductionKernel`](crate::ReductionKernel) are — a checked spec, the
//! signature it makes, and the specialisations built so far on the CPU and on
//! CUDA — registered as one kernel with an implementation per device.

use std::sync::Arc;

use dlbridge_core::{DType, DeviceType, Error, Result};
use dlbridge_registry::{DynKernelFn, Kernel, KernelDef, KernelOpts, Registry, Signature};

use crate::builder::specialise::{ORIGIN_PREFIX, Specialisations, replaceable, specialising};
use crate::launch::{CudaSpecialisations, Launcher, cuda_impl};
use crate::spec::Spec;

/// Generates, compiles (or finds) and loads a spec's CPU specialisation for the bound dtypes.
pub(crate) type BuildFn<S> = fn(&S, &[(char, DType)]) -> Result<DynKernelFn>;

/// A kernel compiled from source (`S`: [`ElementwiseSpec`](crate::spec::ElementwiseSpec)
/// or [`ReductionSpec`](crate::spec::ReductionSpec)), one specialisation per
/// combination of dtypes (and CUDA device), built on first use.
pub struct SourceKernel<S> {
    spec: Arc<S>,
    signature: String,
    opts: KernelOpts,
    doc: String,
    build: BuildFn<S>,
    launcher: Arc<dyn Launcher>,
    specs: Arc<Specialisations>,
    cuda_specs: Arc<CudaSpecialisations>,
    /// What the files its texts include said when it was made.
    included: Option<String>,
}

impl<S> Clone for SourceKernel<S> {
    fn clone(&self) -> Self {
        SourceKernel {
            spec: self.spec.clone(),
            signature: self.signature.clone(),
            opts: self.opts,
            doc: self.doc.clone(),
            build: self.build,
            launcher: self.launcher.clone(),
            specs: self.specs.clone(),
            cuda_specs: self.cuda_specs.clone(),
            included: self.included.clone(),
        }
    }
}

impl<S: Spec> std::fmt::Debug for SourceKernel<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(S::KIND).field("signature", &self.signature).finish()
    }
}

impl<S: Spec + Send + Sync + 'static> SourceKernel<S> {
    /// The kernel of a checked spec: `build` makes its CPU specialisations;
    /// nothing is compiled until a call needs it.
    pub(crate) fn from_spec(spec: S, build: BuildFn<S>, opts: KernelOpts, doc: String) -> Result<Self>
    where
        S: Launcher,
    {
        let signature = spec.signature();
        // The derived signature must be one the registry accepts (a bug here, not the user's).
        Signature::parse(&signature)
            .map_err(|e| Error::Runtime(format!("{} {}: derived signature `{signature}`: {e}", S::KIND, spec.name())))?;
        let included = crate::builder::cache::included_digest(&spec.texts(), &[]);
        let spec = Arc::new(spec);
        Ok(SourceKernel {
            launcher: spec.clone(),
            spec,
            signature,
            opts,
            doc,
            build,
            specs: Arc::new(Specialisations::default()),
            cuda_specs: Arc::new(Specialisations::default()),
            included,
        })
    }

    /// The checked parameters and texts.
    pub fn spec(&self) -> &S {
        &self.spec
    }

    /// The registry signature derived from the parameters.
    pub fn signature(&self) -> &str {
        &self.signature
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        self.spec.name()
    }

    /// How many CPU specialisations it has built or loaded so far.
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
    /// with NVRTC for the call's device on first use (see `cuda.rs`).
    pub fn cuda_def(&self) -> KernelDef {
        let imp = cuda_impl(S::KIND, self.name().to_owned(), self.spec.type_vars(), self.launcher.clone(), self.cuda_specs.clone());
        KernelDef { device: DeviceType::CUDA, imp, ..self.def() }
    }

    /// What defines it beyond its signature: its kind, every text it was
    /// made from and, when they include files, what those said when it was
    /// made (part of the registry's [`Kernel::digest`](dlbridge_registry::Kernel::digest)).
    pub fn identity(&self) -> String {
        let mut out = String::from(S::KIND);
        for (field, text) in self.spec.texts() {
            out.push_str(&format!("\n{field} ({} bytes):\n{text}", text.len()));
        }
        if let Some(included) = &self.included {
            out.push_str(&format!("\n{included}"));
        }
        out
    }

    /// The CPU definition: the specialisation for the call's dtypes, built
    /// on first use.
    pub fn def(&self) -> KernelDef {
        let (spec, build) = (self.spec.clone(), self.build);
        let imp = specialising(self.name(), self.spec.type_vars(), self.specs.clone(), move |bind| build(&spec, bind));
        KernelDef {
            signature: self.signature.clone(),
            device: DeviceType::CPU,
            imp,
            opts: self.opts,
            origin: format!("{ORIGIN_PREFIX} ({})", S::KIND),
            doc: self.doc.clone(),
            identity: self.identity(),
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

/// The name to register a kernel from source labelled `label` under, where
/// a kernel's name is only a label (as in CuPy): `label` itself when it is
/// free or held by an earlier kernel from source (which the new one
/// replaces), else the first such `label_2`, `label_3`, ... A built-in or
/// plugin kernel of that name is never replaced, and stays reachable by it.
///
/// A name taken for another label is not usable: a kernel labelled
/// `matmul` and registered as `matmul_2` (a built-in holds `matmul`) is
/// never replaced by one labelled `matmul_2`, nor the other way round.
pub fn registry_name(registry: &Registry, label: &str) -> String {
    choose_name(registry, label, label)
}

/// The name to register a kernel the library derives under (a definition's
/// backward): `base` where that is free or was chosen for `label` before,
/// else `base_2`, ... `label` is the deriving kernel's own (no user's label
/// equals it), so a derived kernel never replaces a kernel a user named
/// `base`, and a user's kernel labelled `base` never replaces it.
pub fn derived_registry_name(registry: &Registry, base: &str, label: &str) -> String {
    choose_name(registry, base, label)
}

/// (registry, name) -> the label the name was chosen for.
type Labels = std::collections::HashMap<(usize, String), String>;

fn labels() -> std::sync::MutexGuard<'static, Labels> {
    static LABELS: std::sync::OnceLock<std::sync::Mutex<Labels>> = std::sync::OnceLock::new();
    LABELS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// Records that `name` is taken by a kernel registered under exactly that
/// name (a `load_inline` function's), so that no label's kernel, derived
/// ones included, replaces it later.
pub fn claim_name(registry: &Registry, name: &str) {
    labels().insert((std::ptr::from_ref(registry) as usize, name.to_owned()), name.to_owned());
}

fn choose_name(registry: &Registry, base: &str, label: &str) -> String {
    let mut labels = labels();
    let at = std::ptr::from_ref(registry) as usize;
    // A name is usable when it was chosen for this label (or for none, and
    // is free or holds a kernel from source under its own name), even if
    // what it was chosen for is not registered yet (the definitions of one
    // text are all named before any is registered).
    let usable = |name: &str| match (labels.get(&(at, name.to_owned())), registry.get(name).ok()) {
        (Some(chosen_for), held) => chosen_for == label && held.is_none_or(|k| replaceable(&k)),
        (None, None) => true,
        (None, Some(k)) => name == label && replaceable(&k),
    };
    let name = if usable(base) {
        base.to_owned()
    } else {
        (2u32..).map(|k| format!("{base}_{k}")).find(|n| usable(n)).unwrap_or_else(|| base.to_owned())
    };
    labels.insert((at, name.clone()), label.to_owned());
    name
}

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

use std::sync::Arc;

use dlbridge_core::{DType, DeviceType, Error, Result};
use dlbridge_registry::{DynKernelFn, Kernel, KernelDef, KernelOpts, Registry, Signature};

use crate::params::{ElementwiseSpec, Spec};
pub use crate::specialise::ORIGIN_PREFIX;
use crate::specialise::{Specialisations, build_library, replaceable, specialising};

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

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

use dlbridge_core::{DType, Result};
use dlbridge_registry::{DynKernelFn, KernelOpts};

use crate::builder::specialise::build_library;
use crate::source_kernel::SourceKernel;
use crate::spec::{ElementwiseOptions, ElementwiseSpec};

/// A kernel compiled from an elementwise operation, one specialisation per
/// combination of dtypes, built on first use.
pub type ElementwiseKernel = SourceKernel<ElementwiseSpec>;

impl SourceKernel<ElementwiseSpec> {
    /// Parses and checks the parameters and derives the signature; nothing is
    /// compiled until a call needs it.
    pub fn new(in_params: &str, out_params: &str, operation: &str, name: &str, opts: ElementwiseOptions) -> Result<ElementwiseKernel> {
        let spec = ElementwiseSpec::new(in_params, out_params, operation, name, &opts.preamble, &opts.loop_prep, &opts.after_loop)?;
        // An output may be exactly an input (in place, `k(x, y, x)`), unless
        // a raw input can be read at any index.
        let opts =
            KernelOpts { alias_outputs: !spec.inputs.iter().any(|p| p.raw), per_element: !spec.reads_position(), ..KernelOpts::DEFAULT };
        let doc = format!("ElementwiseKernel: {}", one_line(&spec.operation));
        SourceKernel::from_spec(spec, build, opts, doc)
    }
}

/// The operation on one line (for docs), cut to 100 characters.
fn one_line(s: &str) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > 100 { format!("{}…", flat.chars().take(100).collect::<String>()) } else { flat }
}

/// Generates, compiles (or finds) and loads the specialisation for `bind`.
fn build(spec: &ElementwiseSpec, bind: &[(char, DType)]) -> Result<DynKernelFn> {
    build_library(spec, bind, &crate::codegen::cpu::elementwise_cpp(spec, bind)?)
}

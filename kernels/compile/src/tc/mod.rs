//! Tensor Comprehensions' language: `def`s of tensor comprehensions become
//! registry kernels.
//!
//! ```no_run
//! let defs = dlbridge_compile::tc::define(
//!     "def matmul(float(M,N) A, float(N,K) B) -> (output) {\n  output(i, j) +=! A(i, kk) * B(kk, j)\n}",
//! )?;
//! let kernel = defs[0].register(dlbridge_registry::Registry::global())?;
//! # Ok::<(), dlbridge_core::Error>(())
//! ```
//!
//! A definition's signature comes from its text: size symbols are symbolic
//! dims, every floating parameter (`float`, `double`, `half`, ...) shares the
//! type variable `T` (f32, f64, f16 or bf16: the caller's tensors choose, and
//! f16/bf16 compute in f32), integer and bool parameters keep their types,
//! and each output's shape is inferred from its statement's index ranges
//! (see `check.rs`), e.g. `conv(I: T[N, C, H, W], W1: T[M, C, KH, KW]) ->
//! (O: T[N, M, (H - KH + 1), (W - KW + 1)])`. The registry checks every call
//! against it and allocates the outputs in the caller's framework.
//!
//! The first call per dtype generates C++ (`cpu.rs`, with `emit.rs`),
//! compiles it with the system compiler into a plugin (the disk cache, as for
//! CuPy's kernels) and loads it; on CUDA it generates CUDA C (`cuda.rs`). A
//! definition that is one contraction of two tensors (matmul, batch matmul,
//! tensordot, a fully connected layer) runs as a GEMM instead
//! (`contraction.rs`).
//!
//! This folder: the definition's spec ([`TcSpec`], here), the front end
//! (`parse.rs`, `check.rs` with the size algebra of `size.rs`), the derived
//! backward (`grad.rs`, checked definition to checked definition) and the
//! two emitters named by backend. It uses the crate's shared code generation
//! (`codegen/`) and building (`builder/`), never the CuPy kinds.

mod check;
mod contraction;
mod cpu;
mod cuda;
mod emit;
mod grad;
mod parse;
mod size;

use std::sync::Arc;

use dlbridge_core::{DType, Result};
use dlbridge_registry::{Kernel, KernelOpts, Registry};

pub use check::BUILTINS;
use check::{Checked, OutType};
use parse::ElemType;

use cpu::build;
pub use cpu::cpp_source;

use crate::params::{Param as CParam, ParamType, check_bind, dtype_text};
use crate::source_kernel::SourceKernel;
use crate::spec::Spec;

/// The dtypes the floating type `T` may take.
pub const FLOAT_DTYPES: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];

/// One checked definition, ready to generate code for.
#[derive(Debug, Clone)]
pub struct TcSpec {
    checked: Arc<Checked>,
    /// The name it is registered under (its `def` name, or `name_2`, ...
    /// when a built-in holds that name).
    name: String,
    inputs: Vec<CParam>,
    outputs: Vec<CParam>,
    /// The GEMMs it is, when it is one contraction of two tensors.
    contraction: Option<Arc<contraction::Contraction>>,
}

/// A definition compiled on first use, one specialisation per dtype.
pub type TcKernel = SourceKernel<TcSpec>;

impl TcSpec {
    /// The definition's own name (`def NAME`).
    pub fn def_name(&self) -> &str {
        &self.checked.name
    }
    /// The definition's text.
    pub fn text(&self) -> &str {
        &self.checked.text
    }
    /// Its statements' texts.
    pub fn statements(&self) -> Vec<&str> {
        self.checked.stmts.iter().map(|s| s.text.as_str()).collect()
    }
}

/// A parameter's type: a fixed dtype, or (`None`) the floating type: `T`,
/// or f32 in a definition without floating parameters.
fn param_type(has_float: bool, fixed: Option<DType>) -> ParamType {
    match fixed {
        Some(d) => ParamType::Concrete(d),
        None if has_float => ParamType::Var('T'),
        None => ParamType::Concrete(DType::F32),
    }
}

impl TcSpec {
    fn new(checked: Checked, name: String) -> TcSpec {
        let param = |name: &str, fixed: Option<DType>| CParam {
            name: name.to_owned(),
            ty: param_type(checked.has_float, fixed),
            raw: true,
            mutable: false,
        };
        let fixed_in = |t: ElemType| if let ElemType::Fixed(d) = t { Some(d) } else { None };
        let fixed_out = |t: OutType| if let OutType::Fixed(d) = t { Some(d) } else { None };
        let inputs = checked.params.iter().map(|p| param(&p.name, fixed_in(p.ty))).collect();
        let outputs = checked.outputs.iter().map(|o| param(&o.name, fixed_out(o.ty))).collect();
        let contraction = contraction::Contraction::of(&checked).map(Arc::new);
        TcSpec { checked: Arc::new(checked), name, inputs, outputs, contraction }
    }

    fn dims_text(&self, dims: &[size::Size]) -> String {
        let parts: Vec<String> = dims.iter().map(|d| d.dim_text(&|s| s.to_owned())).collect();
        format!("[{}]", parts.join(", "))
    }
}

impl Spec for TcSpec {
    const KIND: &'static str = "tc.define";

    fn name(&self) -> &str {
        &self.name
    }
    fn params(&self) -> (&[CParam], &[CParam]) {
        (&self.inputs, &self.outputs)
    }
    fn preamble(&self) -> &str {
        ""
    }
    fn texts(&self) -> Vec<(&'static str, &str)> {
        vec![("definition", &self.checked.text)]
    }

    /// `name<T: f32|f64|f16|bf16>(A: T[M, N], B: T[N, K]) -> (output: T[M, K])`.
    fn render(&self, generics: &str, bind: Option<&[(char, DType)]>) -> Result<String> {
        let c = &self.checked;
        let mut ins = Vec::new();
        for (p, cp) in c.params.iter().zip(&self.inputs) {
            ins.push(format!("{}: {}{}", p.name, dtype_text(cp.ty, bind)?, self.dims_text(&p.dims)));
        }
        let mut outs = Vec::new();
        for (o, cp) in c.outputs.iter().zip(&self.outputs) {
            outs.push(format!("{}: {}{}", o.name, dtype_text(cp.ty, bind)?, self.dims_text(&o.dims)));
        }
        Ok(format!("{}{generics}({}) -> ({})", self.name, ins.join(", "), outs.join(", ")))
    }

    fn signature(&self) -> String {
        let generics = if self.checked.has_float {
            let ds: Vec<String> = FLOAT_DTYPES.iter().map(|d| d.to_string()).collect();
            format!("<T: {}>", ds.join("|"))
        } else {
            String::new()
        };
        self.render(&generics, None).unwrap_or_default()
    }

    fn check_bind(&self, bind: &[(char, DType)]) -> Result<()> {
        check_bind(Self::KIND, self.name(), &self.type_vars(), bind)
    }
}

/// The CUDA C of one specialisation (see `cuda.rs`).
pub fn cuda_source(spec: &TcSpec, bind: &[(char, DType)]) -> Result<crate::codegen::cuda::CudaSource> {
    cuda::source(spec, bind)
}

/// The size symbols' values in order, and each launch (statement number, threads).
pub type CudaPlan = (Vec<i64>, Vec<(i32, u64)>);

/// What a CUDA call launches for tensors of these shapes (see `internals::tc_cuda_plan`).
pub(crate) fn cuda_plan(spec: &TcSpec, shapes: &[&[i64]]) -> Result<CudaPlan> {
    let p = cuda::plan(&spec.checked, &spec.name, shapes)?;
    Ok((p.symbols, p.launches))
}

/// The type floating values are computed in: `double` for f64, else `float`
/// (f16 and bf16 compute in f32).
pub(crate) fn acc_ctype(bind: &[(char, DType)]) -> &'static str {
    match bind.iter().find(|(v, _)| *v == 'T').map(|(_, d)| *d) {
        Some(DType::F64) => "double",
        _ => "float",
    }
}

/// Parses and checks every `def` of `lang`; each becomes a kernel named as
/// its `def` (nothing is registered or compiled yet).
pub fn define(lang: &str) -> Result<Vec<TcKernel>> {
    define_named(lang, &|n| n.to_owned())
}

/// As [`define`], with `name_of` choosing each definition's registry name
/// from its `def` name.
pub fn define_named(lang: &str, name_of: &dyn Fn(&str) -> String) -> Result<Vec<TcKernel>> {
    let defs = parse::parse(lang)?;
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for d in &defs {
        if !seen.insert(d.name.clone()) {
            return Err(parse::error_at(lang, d.pos, format!("`def {}` is defined twice", d.name)));
        }
        let checked = check::check(d, lang)?;
        let spec = TcSpec::new(checked, name_of(&d.name));
        let doc = format!("tc.define: {}", crate::codegen::summary(&spec.statements().join("; ")));
        out.push(SourceKernel::from_spec(spec, build, KernelOpts::DEFAULT, doc)?);
    }
    Ok(out)
}

/// The derived backward of a definition (see `grad.rs`): a definition named
/// `<name>_backward` taking the inputs and `grad_<output>` per output, whose
/// first outputs are `grad_<input>` per floating input (the rest are
/// scratch); `Err` says why there is none.
pub fn backward(kernel: &TcKernel) -> std::result::Result<TcKernel, String> {
    backward_named(kernel, &format!("{}_backward", kernel.spec().name))
}

/// As [`backward`], named `name`.
pub fn backward_named(kernel: &TcKernel, name: &str) -> std::result::Result<TcKernel, String> {
    let spec = kernel.spec();
    let checked = grad::derive(&spec.checked)?;
    let spec = TcSpec::new(checked, name.to_owned());
    let doc = format!("the derived backward of {}", kernel.name());
    SourceKernel::from_spec(spec, build, KernelOpts::DEFAULT, doc).map_err(|e| e.to_string())
}

/// A definition registered: its kernel, the registry's entry, and its derived
/// backward's (registered as `<name>_backward`, or `<name>_backward_2`, ...
/// where a kernel that is not this definition's backward holds that name),
/// or why it has none.
#[derive(Debug)]
pub struct Defined {
    pub kernel: TcKernel,
    pub registered: Arc<Kernel>,
    pub backward: std::result::Result<Arc<Kernel>, String>,
}

/// Defines and registers every `def` of `lang` in `registry`, each under its
/// own name where that is free or held by an earlier kernel from source, else
/// `name_2`, ... (a built-in keeps its name), with its derived backward.
pub fn define_in(registry: &Registry, lang: &str) -> Result<Vec<Defined>> {
    let kernels = define_named(lang, &|n| crate::source_kernel::registry_name(registry, n))?;
    kernels
        .into_iter()
        .map(|k| {
            let registered = k.register(registry)?;
            // The backward's name is chosen for its definition, not as a
            // user's label: it never replaces a user's `<name>_backward`.
            let name = k.name();
            let base = format!("{name}_backward");
            let backward_name = crate::source_kernel::derived_registry_name(registry, &base, &format!("{base} (derived from {name})"));
            let backward = backward_named(&k, &backward_name).and_then(|b| b.register(registry).map_err(|e| e.to_string()));
            Ok(Defined { kernel: k, registered, backward })
        })
        .collect()
}

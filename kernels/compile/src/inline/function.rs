//! One function of an inline library: its tensors, its size arguments, its
//! C prototype and the generated CPU entry point that unpacks a call's
//! DLTensors and calls it.

use dlbridge_core::DType;
use dlbridge_cuda::raw_kernel::c_type;
use dlbridge_registry::Signature;
use dlbridge_registry::signature::{DTypeRef, ParamKind, ScalarKind};

use crate::codegen::{Src, c_string};

/// One tensor of a function, in slot order (tensor parameters, then outputs).
#[derive(Debug, Clone)]
pub(super) struct TensorSlot {
    pub(super) name: String,
    pub(super) dtype: DTypeRef,
    pub(super) mutable: bool,
    pub(super) output: bool,
}

/// Where a size argument's value comes from: dims of tensor `slot`.
#[derive(Debug, Clone)]
pub(super) struct SizeArg {
    /// `N`, `...B`.
    pub(super) name: String,
    pub(super) slot: usize,
    /// Position in the tensor's dims list, its length and where its `...` group is.
    pub(super) pos: usize,
    pub(super) len: usize,
    pub(super) rest_at: Option<usize>,
    /// A `...` group: the product of its dims.
    pub(super) group: bool,
}

impl SizeArg {
    /// The value for a tensor of shape `shape` (which the registry matched against the signature).
    pub(super) fn value(&self, shape: &[i64]) -> i64 {
        let nd = shape.len();
        if self.group {
            let end = nd.saturating_sub(self.len - self.pos - 1);
            return shape.get(self.pos..end).map_or(1, |s| s.iter().product());
        }
        let at = match self.rest_at {
            Some(r) if self.pos > r => nd.saturating_sub(self.len - self.pos),
            _ => self.pos,
        };
        shape.get(at).copied().unwrap_or(0)
    }

    /// The C++ expression of the value, for the DLTensor `_t[slot]`.
    pub(super) fn cpp(&self) -> String {
        let t = format!("_t[{}]", self.slot);
        if self.group {
            return format!("dlbridge_inline::group({t}, {}, {})", self.pos, self.len - self.pos - 1);
        }
        match self.rest_at {
            Some(r) if self.pos > r => format!("static_cast<long long>({t}->shape[{t}->ndim - {}])", self.len - self.pos),
            _ => format!("static_cast<long long>({t}->shape[{}])", self.pos),
        }
    }
}

/// One function of the library.
#[derive(Debug)]
pub(super) struct Function {
    pub(super) sig: Signature,
    pub(super) text: String,
    /// The library type variable of each of its type variables.
    pub(super) vars: Vec<usize>,
    pub(super) tensors: Vec<TensorSlot>,
    pub(super) scalars: Vec<(String, ScalarKind)>,
    pub(super) sizes: Vec<SizeArg>,
    pub(super) cpu: bool,
    pub(super) cuda: bool,
    /// Takes each tensor's strides after the sizes, and any layout.
    pub(super) strided: bool,
}

impl Function {
    pub(super) fn name(&self) -> &str {
        &self.sig.name
    }

    /// The C type of a tensor's element: the type variable's name, or the dtype's C type.
    pub(super) fn elem(&self, d: DTypeRef) -> String {
        match d {
            DTypeRef::Var(i) => self.sig.type_vars[i].name.clone(),
            DTypeRef::Concrete(d) => c_type(d).unwrap_or("void").to_owned(),
        }
    }

    /// The dtype of a tensor under the library binding `lib`.
    pub(super) fn dtype(&self, d: DTypeRef, lib: &[DType]) -> DType {
        match d {
            DTypeRef::Var(i) => lib[self.vars[i]],
            DTypeRef::Concrete(d) => d,
        }
    }

    /// The C parameters `(type, name)` in calling-convention order.
    pub(super) fn c_params(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        for t in self.tensors.iter().filter(|t| !t.output) {
            let c = if t.mutable { "" } else { "const " };
            p.push((format!("{c}{}*", self.elem(t.dtype)), t.name.clone()));
        }
        for (name, k) in &self.scalars {
            p.push((scalar_c_type(*k).to_owned(), name.clone()));
        }
        for t in self.tensors.iter().filter(|t| t.output) {
            p.push((format!("{}*", self.elem(t.dtype)), t.name.clone()));
        }
        for s in &self.sizes {
            p.push(("long long".to_owned(), s.name.trim_start_matches("...").to_owned()));
        }
        if self.strided {
            for t in &self.tensors {
                p.push(("const long long*".to_owned(), format!("{}_strides", t.name)));
            }
        }
        p
    }

    /// `void f(const T* x, T* y, double a, long long N)`, with `qualifier` in front.
    pub(super) fn prototype(&self, qualifier: &str, named: bool) -> String {
        let params: Vec<String> = self.c_params().into_iter().map(|(t, n)| if named { format!("{t} {n}") } else { t }).collect();
        let params = if params.is_empty() { "void".to_owned() } else { params.join(", ") };
        format!("{qualifier}void {}({params})", self.name())
    }

    /// Its signature with every type variable replaced by its dtype under `lib`.
    pub(super) fn specialised(&self, lib: &[DType]) -> String {
        let mut sig = self.sig.clone();
        for p in sig.params.iter_mut().chain(sig.outputs.iter_mut()) {
            if let ParamKind::Tensor(t) = &mut p.kind
                && let DTypeRef::Var(i) = t.dtype
            {
                t.dtype = DTypeRef::Concrete(lib[self.vars[i]]);
            }
        }
        sig.type_vars.clear();
        sig.to_string()
    }
}

pub(super) fn scalar_c_type(k: ScalarKind) -> &'static str {
    match k {
        ScalarKind::F64 => "double",
        ScalarKind::I64 => "long long",
        ScalarKind::Bool => "int",
    }
}

/// One CPU entry point: checks, unpacks, calls function `k`.
pub(super) fn cpu_entry(src: &mut Src, k: usize, f: &Function, lib: &[DType]) {
    let nt = f.tensors.len();
    let names: Vec<String> = f.tensors.iter().map(|t| c_string(&t.name)).collect();
    let types: Vec<String> = f
        .tensors
        .iter()
        .map(|t| {
            let d = f.dtype(t.dtype, lib);
            format!("{{{}, {}, {}}}", d.code() as u8, d.bits(), d.lanes())
        })
        .collect();
    src.line(&format!(
        "int32_t dlbridge_entry_{k}(DLTensor* const* _t, int32_t _nt, const DLBridgeScalar* _s, int32_t _ns, void* _stream, char* _err, size_t _err_len) {{"
    ));
    src.line(&format!("  static const char kKernel[] = {};", c_string(f.name())));
    src.line("  (void)_s;");
    src.line("  (void)_stream;");
    src.line("  try {");
    if nt > 0 {
        src.line(&format!("    static const char* const kNames[] = {{{}}};", names.join(", ")));
        src.line(&format!("    static const DLDataType kTypes[] = {{{}}};", types.join(", ")));
        src.line(&format!(
            "    if (int32_t rc = dlbridge_inline::check(kKernel, _t, _nt, {nt}, kNames, kTypes, _err, _err_len, {})) return rc;",
            f.strided
        ));
    } else {
        src.line("    if (_nt != 0) return dlbridge_inline::fail(_err, _err_len, DLBRIDGE_ERR_VALUE, \"%s: called with %d tensors, expected none\", kKernel, static_cast<int>(_nt));");
    }
    src.line(&format!(
        "    if (_ns != {0} || ({0} > 0 && _s == nullptr)) return dlbridge_inline::fail(_err, _err_len, DLBRIDGE_ERR_VALUE, \"%s: called with %d scalars, expected {0}\", kKernel, static_cast<int>(_ns));",
        f.scalars.len()
    ));
    let mut args = Vec::new();
    for (slot, t) in f.tensors.iter().enumerate().filter(|(_, t)| !t.output) {
        let c = if t.mutable { "" } else { "const " };
        args.push(format!("static_cast<{c}{}*>(dlbridge_inline::data(_t[{slot}]))", f.elem(t.dtype)));
    }
    for (i, (_, kind)) in f.scalars.iter().enumerate() {
        args.push(match kind {
            ScalarKind::F64 => format!("_s[{i}].f64"),
            ScalarKind::I64 => format!("static_cast<long long>(_s[{i}].i64)"),
            ScalarKind::Bool => format!("static_cast<int>(_s[{i}].boolean != 0)"),
        });
    }
    for (slot, t) in f.tensors.iter().enumerate().filter(|(_, t)| t.output) {
        args.push(format!("static_cast<{}*>(dlbridge_inline::data(_t[{slot}]))", f.elem(t.dtype)));
    }
    for s in &f.sizes {
        args.push(s.cpp());
    }
    if f.strided {
        for slot in 0..nt {
            // Room for any tensor's dims (the registry refuses more).
            src.line(&format!("    long long _st{slot}[{}];", dlbridge_core::layout::MAX_NDIM));
            args.push(format!("dlbridge_inline::strides(_t[{slot}], _st{slot})"));
        }
    }
    // The caller's floating-point environment, whatever the function does to it.
    src.line("    const dlbridge_divguard::FloatEnv _fenv;");
    // What the function throws is taken, and released, under the division check.
    src.line(&format!("    if (std::exception_ptr _e = dlbridge_divguard::captured([&] {{ ::{}({}); }})) {{", f.name(), args.join(", ")));
    src.line("      return dlbridge_errors::from_exception_ptr(kKernel, \"function\", std::move(_e), _err, _err_len);");
    src.line("    }");
    src.line("    return DLBRIDGE_OK;");
    src.line("  } catch (...) {");
    src.line("    return dlbridge_inline::from_exception(kKernel, _err, _err_len);");
    src.line("  }");
    src.line("}");
}

//! The CPU backend: C++17 generated from a kernel specification.
//!
//! One specialisation (one binding of the type placeholders) is one complete
//! translation unit that, compiled with `c++ -O3 -std=c++17 -shared -fPIC
//! -pthread`, is a dlbridge plugin through the existing C ABI: the plugin
//! header is pasted in (no `-I` needed), and `dlbridge_plugin()` returns a
//! table with one CPU kernel whose signature is the specialised signature.
//!
//! # What a kernel body sees (CuPy's semantics)
//! * `typedef <ctype> T;` for every bound placeholder (f16/bf16 are the
//!   `float16`/`bfloat16` of `crate::codegen::halfs`, computed in float; c64/c128 are
//!   `std::complex`, mixing with real values as CuPy's `thrust::complex`
//!   does); CUDA spellings compile
//!   (`__device__`, `__host__`, `__global__`, `__forceinline__`); `<cmath>`,
//!   `<cstdint>`, `<algorithm>`, `<complex>` are included and
//!   using-declarations make `<cmath>`'s functions, `min`, `max`, `swap`,
//!   `complex` and its functions and `numeric_limits` work unqualified (not
//!   `using namespace std`: a preamble's `clamp` or `gcd` is not ambiguous);
//!   CUDA's `rsqrt`/`rsqrtf`, `max`/`min` (fmax/fmin on floats, also of two
//!   different arithmetic types), and `atomicAdd`/`atomicMax`/`atomicMin`/`atomicExch`/
//!   `atomicCAS` (for raw outputs written from many threads) are defined; the
//!   user's `preamble` follows at file scope.
//! * Elementwise: `i` (the flat C-order index over the broadcast shape),
//!   `const T& x` per non-raw input (`T&` when `mut`), `T& z` per output, a
//!   `dlbridge::Raw<T>` per raw input (`r[k]` with a flat C-order index into
//!   `r`'s own shape, bounds-checked, any strides; `r.size()`, `r.ndim()`,
//!   `r.shape()[d]`), `_ind.size()` and `n` (the broadcast size; a parameter
//!   named `n` takes that name over). `loop_prep`
//!   runs once per thread before its part of the loop, `after_loop` once after.
//! * Reduction: `map_expr` sees the inputs' elements (`const T& x`), `_i` (the
//!   flat index of the output element), `_j` and `_J` (the reduced element's
//!   flat index and the reduced count); `reduce_expr` sees `a` and `b`;
//!   `post_map_expr` sees `a`, the outputs (`T& y`), `_i` and `_J` (so a mean
//!   is `y = a / _J`); both see CuPy's `_in_ind` and `_out_ind` (`.size()`:
//!   the input's and the output's element counts); `_type_reduce` is the
//!   reduce type.
//!
//! # How it runs
//! Elementwise: non-raw operands are broadcast (right-aligned; a missing dim
//! or a dim of size 1 gets stride 0), dims of size 1 are dropped and
//! adjacent dims merged where every operand allows it. When that leaves one
//! dim with unit strides everywhere the loop is a plain `p[j]` loop the
//! compiler vectorises; otherwise an inner loop over the last dim with each
//! operand's stride and a multi-index counter for the outer dims (no division
//! per element). Reductions: the caller has permuted the reduced axes of
//! every input to its last dims; the outputs hold the kept dims, so the
//! number of reduced dims is `x.ndim - y.ndim`.
//!
//! Above 2^16 elements (of work) the range is split into contiguous chunks,
//! as many as the call's thread budget allows
//! ([`dlbridge_registry::threads::num_threads`]), run on dlbridge's threads:
//! the entry point receives a `dlbridge_cpu::ffi::CpuContext` in place of its
//! stream, and starts no thread of its own. Without one (NULL: the library
//! called as a plain plugin) the calling thread does everything. A
//! reduction with few outputs and many reduced elements splits each output's
//! reduction into per-thread partials combined with `reduce_expr`.
//!
//! Every exception (the body's, a raw index out of
//! range) becomes `DLBRIDGE_ERR_RUNTIME` with its `what()` in the error buffer
//! (`DLBRIDGE_ERR_MEMORY` for `std::bad_alloc`): none escapes the entry point.
//!
//! # Diagnostics
//! Each piece of user text is preceded by `#line 1 "operation"` (or
//! `"preamble"`, `"loop_prep"`, `"after_loop"`, `"map_expr"`,
//! `"reduce_expr"`, `"post_map_expr"`, `"identity"`, `"reduce_type"`) and
//! followed by `#line N "dlbridge_generated.cpp"` (N the true next line), so
//! the compiler reports `operation:1:5: error: ...` for the user's mistakes
//! and `dlbridge_generated.cpp:N` for the rest.

use dlbridge_core::{DType, Result};

pub(crate) use crate::codegen::Src;
use crate::codegen::{Backend, CLOSE_GENERATED, Head, OPEN_GENERATED, c_string, head, reduction_helpers, summary};
use crate::params::{Param, bound_dtype, cpu_ctype};
use crate::spec::{ElementwiseSpec, ReductionSpec};

/// The file name diagnostics use for generated (non-user) lines.
pub const GENERATED_FILE: &str = "dlbridge_generated.cpp";

/// Elements (units of work) below which a kernel never starts a thread; each
/// thread gets at least half as many.
pub const PARALLEL_THRESHOLD: usize = 1 << 16;

/// Integer division or modulo by zero in user code: an error, not a SIGFPE that
/// kills the process. With `DIVGUARD_FLAGS` (when the compiler takes them) every
/// integer `/` and `%` whose divisor is not a known non-zero constant is checked
/// (`-fsanitize=integer-divide-by-zero`, no recovery, no sanitizer runtime
/// linked), and a zero divisor calls the handler defined here, which jumps back
/// to the innermost `guarded` call of its thread; that call throws, and the
/// entry point turns the exception into an error like any other. Locals with
/// destructors between the `guarded` call and the division are not destroyed
/// (their memory may leak; a kernel body rarely has any, a `load_inline` function
/// may: a skipped `std::lock_guard` leaves its mutex locked). `INT_MIN / -1` is
/// not checked (it still traps), nor is a division in threads the user's own
/// code starts (OpenMP, std::thread): there the check traps (SIGILL).
pub(crate) const DIVGUARD: &str = crate::codegen::headers::DIVGUARD_H;

/// The CPU backend's head: the plugin header and C++ runtime.
const CPU: Backend = Backend {
    label: "",
    file: GENERATED_FILE,
    ctype: cpu_ctype,
    runtime: |src| {
        src.line(&format!("#define DLBRIDGE_PARALLEL_MIN {PARALLEL_THRESHOLD}"));
        src.push(&crate::codegen::headers::expand("dlbridge_compile/cpu_runtime.h"));
    },
    marked: true,
};

/// `(code, bits, lanes)` of the DLDataType the tensor must have.
fn dl_type(d: DType) -> String {
    format!("{{{}, {}, {}}}", d.code() as u8, d.bits(), d.lanes())
}

/// The plugin table with one CPU kernel, at the end of the generated
/// namespace ([`OPEN_GENERATED`]), which it closes; then the entry point
/// outside it.
pub(crate) fn plugin_table(src: &mut Src, name: &str, signature: &str, flags: &str, doc: &str) {
    src.line("");
    src.line("// ---- the plugin table ----");
    src.line("static const DLBridgeKernel dlbridge_kernels[] = {");
    src.line(&format!("    {{{}, 1, {flags}, dlbridge_entry, {}}},", c_string(signature), c_string(doc)));
    src.line("};");
    src.line("static const DLBridgePlugin dlbridge_plugin_table = {");
    src.line("    DLBRIDGE_PLUGIN_ABI_VERSION, static_cast<uint32_t>(sizeof(DLBridgePlugin)),");
    src.line(&format!(
        "    {}, {}, static_cast<uint32_t>(sizeof(DLBridgeKernel)), 1, dlbridge_kernels,",
        c_string(&format!("dlbridge-compile:{name}")),
        c_string(env!("CARGO_PKG_VERSION"))
    ));
    src.line("};");
    CLOSE_GENERATED.lines().for_each(|l| src.line(l));
    src.line("extern \"C\" __attribute__((visibility(\"default\"))) const ::DLBridgePlugin* dlbridge_plugin(void) {");
    // Not `&`: a unary `&` on a class may call an `operator&` a preamble declares.
    src.line("  return __builtin_addressof(dlbridge_kernel::dlbridge_plugin_table);");
    src.line("}");
}
/// The opening of `dlbridge_entry`, the same for every kind of kernel: its
/// signature, the kernel's name, and the checks of the scalars and tensors
/// the host passes (inside the `try` the caller closes).
/// The end of the entry point: success, or the exception as an error code
/// and message.
pub(crate) fn entry_epilogue(src: &mut Src) {
    src.line("    return DLBRIDGE_OK;");
    src.line("  } catch (...) {");
    // Kept past the handler: the exception's `what()` and destructor run
    // under the division guard there.
    src.line("    _exc = std::current_exception();");
    src.line("  }");
    src.line("  return dlbridge::detail::from_exception(kKernel, std::move(_exc), _err, _err_len);");
    src.line("}");
}

pub(crate) fn entry_prologue(src: &mut Src, name: &str, all: &[&Param], bind: &[(char, DType)]) -> Result<()> {
    let kernel_lit = c_string(name);
    src.line("int32_t dlbridge_entry(DLTensor* const* _t, int32_t _nt, const DLBridgeScalar* _s, int32_t _ns, void* _stream,");
    src.line("                       char* _err, size_t _err_len) {");
    src.line(&format!("  static const char kKernel[] = {kernel_lit};"));
    src.line("  (void)_s;");
    src.line("  const dlbridge::detail::ContextScope _context(_stream);");
    src.line("  std::exception_ptr _exc;");
    src.line("  try {");
    tensor_tables(src, all, bind)?;
    src.line("    if (_ns != 0) return dlbridge::detail::fail(_err, _err_len, DLBRIDGE_ERR_VALUE, \"%s: called with %d scalars, expected none\", kKernel, static_cast<int>(_ns));");
    src.line(&format!(
        "    if (int32_t rc = dlbridge::detail::check_tensors(kKernel, _t, _nt, {}, kNames, kTypes, _err, _err_len)) return rc;",
        all.len()
    ));
    Ok(())
}

/// Names and DLDataTypes of every tensor, in call order, as C++ arrays.
fn tensor_tables(src: &mut Src, params: &[&Param], bind: &[(char, DType)]) -> Result<()> {
    let names: Vec<String> = params.iter().map(|p| c_string(&p.name)).collect();
    let types: Vec<String> = params.iter().map(|p| bound_dtype(p.ty, bind).map(dl_type)).collect::<Result<_>>()?;
    src.line(&format!("    static const char* const kNames[] = {{{}}};", names.join(", ")));
    src.line(&format!("    static const DLDataType kTypes[] = {{{}}};", types.join(", ")));
    Ok(())
}

/// The complete C++ source of one specialisation of an elementwise kernel:
/// a plugin with one CPU kernel whose signature is
/// [`ElementwiseSpec::specialised_signature`].
///
/// Errors: a binding that does not cover exactly the placeholders (Value), a
/// dtype the CPU backend has no C++ type for (Type).
pub fn elementwise_cpp(spec: &ElementwiseSpec, bind: &[(char, DType)]) -> Result<String> {
    let Head { mut src, signature, all, ctypes } = head(&CPU, spec, bind, "the loop")?;
    let (name, n_in) = (&spec.name, spec.inputs.len());
    // Non-raw operands (inputs, then outputs): (tensor index, written?).
    let ops: Vec<(usize, bool)> = all.iter().enumerate().filter(|(_, p)| !p.raw).map(|(t, p)| (t, t >= n_in || p.mutable)).collect();
    let k = ops.len();
    OPEN_GENERATED.lines().for_each(|l| src.line(l));
    src.line(&format!("constexpr int dlbridge_kOperands = {k};  // non-raw inputs, then outputs"));
    src.line("using dlbridge_Walk = dlbridge::detail::Walk<dlbridge_kOperands>;");
    src.line("");
    src.line("template <bool dlbridge_kUnit>");
    src.line(
        "void dlbridge_chunk(const dlbridge_Walk& _w, void* const* const _data, DLTensor* const* const _t, const dlbridge::Indexer& _ind,",
    );
    src.line("                    const ptrdiff_t _begin, const ptrdiff_t _end) {");
    src.line("  (void)_t;");
    if !all.iter().any(|p| p.name == "n") {
        // CuPy has no `n`; a parameter of that name takes it over.
        src.line("  const ptrdiff_t n = _ind.size();");
        src.line("  (void)n;");
    }
    for (t, p) in all.iter().enumerate().filter(|(_, p)| p.raw) {
        let ct = &ctypes[t];
        let elem = if p.mutable || t >= n_in { ct.clone() } else { format!("const {ct}") };
        src.line(&format!("  const dlbridge::Raw<{elem}> {}(_t[{t}], {});", p.name, c_string(&p.name)));
    }
    if !spec.loop_prep.is_empty() {
        src.user("loop_prep", &spec.loop_prep, ";");
    }
    // From here on the generated code names only what no text can declare
    // (names under `_` and `dlbridge`, `::`-qualified names, keywords):
    // `loop_prep` may declare any other name in this block.
    // The operation is a function of its own, called once per element: a
    // `return` in it ends that element only (as on CUDA). It captures what
    // `loop_prep` declares, and so also the chunk's parameters (all `const`).
    // Inputs come by value, read before anything is
    // written: an output that is exactly an input (`y = x + 1; y = y * x`
    // in place) still reads the old value. Outputs and `mut` inputs come by
    // reference.
    let body_params: String = ops
        .iter()
        .map(|&(t, _)| {
            let p = all[t];
            if t < n_in && !p.mutable { format!(", const {} {}", ctypes[t], p.name) } else { format!(", {}& {}", ctypes[t], p.name) }
        })
        .collect();
    src.line(&format!("  const auto dlbridge_body = [&](const ::std::ptrdiff_t i{body_params}) {{"));
    src.line("    (void)i;");
    // `do { } while (0)`: a `break` or `continue` at the top level of the
    // operation ends this element.
    src.line("    do {");
    src.user("operation", &spec.operation, "; } while (0);");
    src.line("  };");
    src.line("  _w.for_runs(_begin, _end, [&](::std::ptrdiff_t _i0, ::std::ptrdiff_t _len, const ::std::ptrdiff_t* _off) {");
    for (o, &(t, _)) in ops.iter().enumerate() {
        let p = all[t];
        let ct = &ctypes[t];
        let qual = if t < n_in && !p.mutable { "const " } else { "" };
        // `__restrict__`: the registry refuses every overlap but an output
        // that is exactly an input (read into a value before the element is
        // written), so the compiler may vectorise without runtime alias checks
        // (which it does not do around calls to vector math functions).
        src.line(&format!("    {qual}{ct}* __restrict__ const _q{o} = static_cast<{qual}{ct}*>(_data[{o}]) + _off[{o}];"));
        src.line(&format!("    const ::std::ptrdiff_t _s{o} = _w.inner({o});"));
        src.line(&format!("    (void)_s{o};"));
    }
    let args: String = (0..ops.len()).map(|o| format!(", _q{o}[dlbridge_kUnit ? _j : _j * _s{o}]")).collect();
    src.line("    for (::std::ptrdiff_t _j = 0; _j < _len; ++_j) {");
    src.line(&format!("      dlbridge_body(_i0 + _j{args});"));
    src.line("    }");
    src.line("  });");
    if !spec.after_loop.is_empty() {
        src.user("after_loop", &spec.after_loop, ";");
    }
    src.line("}");
    src.line("");

    entry_prologue(&mut src, name, &all, bind)?;
    let op_list: Vec<String> = ops.iter().map(|(t, _)| t.to_string()).collect();
    let exact: Vec<&str> = ops.iter().map(|&(_, w)| if w { "true" } else { "false" }).collect();
    src.line(&format!("    static const int kOps[] = {{{}}};", op_list.join(", ")));
    src.line(&format!("    static const bool kExact[] = {{{}}};", exact.join(", ")));
    src.line("    int64_t shape[dlbridge::detail::kMaxDims];");
    src.line("    int nd = 0;");
    src.line("    int64_t strides[dlbridge_kOperands][dlbridge::detail::kMaxDims];");
    src.line("    if (int32_t rc = dlbridge::detail::broadcast(kKernel, _t, kNames, kOps, kExact, dlbridge_kOperands, shape, &nd, strides, _err, _err_len)) return rc;");
    src.line("    dlbridge_Walk w;");
    src.line("    w.init(nd, shape, strides);");
    src.line("    if (w.size == 0) return DLBRIDGE_OK;");
    src.line("    void* data[dlbridge_kOperands];");
    src.line("    for (int k = 0; k < dlbridge_kOperands; ++k) data[k] = dlbridge::detail::base_of(_t[kOps[k]]);");
    src.line("    const dlbridge::Indexer ind(w.size, nd, shape);");
    src.line("    dlbridge::detail::parallel_chunks(w.size, dlbridge::detail::chunks_for(w.size, 1), [&](int, ptrdiff_t b, ptrdiff_t e) {");
    src.line("      if (w.unit) {");
    src.line("        dlbridge_chunk<true>(w, data, _t, ind, b, e);");
    src.line("      } else {");
    src.line("        dlbridge_chunk<false>(w, data, _t, ind, b, e);");
    src.line("      }");
    src.line("    });");
    entry_epilogue(&mut src);
    // Aliasing an output with an input is only safe when every element reads
    // its own position: not with raw inputs.
    let flags = if spec.inputs.iter().any(|p| p.raw) { "0" } else { "DLBRIDGE_KERNEL_ALIAS_OUTPUTS" };
    let doc = format!("ElementwiseKernel: {}", summary(&spec.operation));
    plugin_table(&mut src, name, &signature, flags, &doc);
    Ok(src.text)
}

/// The complete C++ source of one specialisation of a reduction kernel: a
/// plugin with one CPU kernel whose signature is
/// [`ReductionSpec::specialised_signature`] (`name(x: f32[...S], y: mut
/// f32[...O])`).
///
/// The caller passes every input with its reduced axes last and the outputs
/// with the kept dims only (`y.shape == x.shape[..y.ndim]`); the kernel
/// checks that. Errors as for [`elementwise_cpp`].
pub fn reduction_cpp(spec: &ReductionSpec, bind: &[(char, DType)]) -> Result<String> {
    let Head { mut src, signature, all, ctypes } = head(&CPU, spec, bind, "the reduction")?;
    let (name, n_in, n_out) = (&spec.name, spec.inputs.len(), spec.outputs.len());
    reduction_helpers(&mut src, spec, &ctypes, "inline", cpu_ctype, true)?;
    src.line("");
    src.line(&format!("constexpr int dlbridge_kIn = {n_in};"));
    src.line(&format!("constexpr int dlbridge_kOut = {n_out};"));
    src.line("struct dlbridge_Ctx {");
    src.line("  dlbridge::detail::Walk<dlbridge_kIn + dlbridge_kOut> kept;  // over the outputs' elements");
    src.line("  dlbridge::detail::Walk<dlbridge_kIn> red;                   // over one output's reduced elements");
    src.line("  void* data[dlbridge_kIn + dlbridge_kOut];");
    src.line("};");
    src.line("");
    // The mapped value of reduced element `j0 + _t` of output `_i`, for
    // inputs at element offsets `_q<k>[...]`.
    let map_args = |index: &dyn Fn(usize) -> String| -> String { (0..n_in).map(index).collect::<Vec<_>>().join(", ") };
    src.line("/// The reduction of output element `_i` (input offsets `_base`) over the");
    src.line("/// reduced elements [_jb, _je), _jb < _je, starting from the first one.");
    src.line("template <bool dlbridge_kUnit>");
    src.line("_type_reduce dlbridge_fold(const dlbridge_Ctx& _c, const ptrdiff_t* _base, ptrdiff_t _i, ptrdiff_t _jb, ptrdiff_t _je) {");
    src.line("  const ptrdiff_t _J = _c.red.size;");
    src.line("  ptrdiff_t _first[dlbridge_kIn];");
    src.line("  _c.red.offsets(_jb, _first);");
    let args = map_args(&|t| format!("static_cast<const {}*>(_c.data[{t}])[_base[{t}] + _first[{t}]]", ctypes[t]));
    src.line(&format!("  _type_reduce _acc = dlbridge_map({args}, _i, _jb, _J, _c.kept.size);"));
    src.line("  _c.red.for_runs(_jb + 1, _je, [&](ptrdiff_t _j0, ptrdiff_t _len, const ptrdiff_t* _off) {");
    for (t, ct) in ctypes.iter().enumerate().take(n_in) {
        src.line(&format!("    const {ct}* const _q{t} = static_cast<const {ct}*>(_c.data[{t}]) + _base[{t}] + _off[{t}];"));
        src.line(&format!("    const ptrdiff_t _s{t} = _c.red.inner({t});"));
        src.line(&format!("    (void)_s{t};"));
    }
    let args = map_args(&|t| format!("_q{t}[dlbridge_kUnit ? _u : _u * _s{t}]"));
    src.line("    for (ptrdiff_t _u = 0; _u < _len; ++_u) {");
    src.line(&format!("      _acc = dlbridge_reduce(_acc, dlbridge_map({args}, _i, _j0 + _u, _J, _c.kept.size));"));
    src.line("    }");
    src.line("  });");
    src.line("  return _acc;");
    src.line("}");
    src.line("");
    src.line("/// The same over [_jb, _je) (empty only with an identity), in blocks of");
    src.line("/// dlbridge_kBlock whose partial results are combined in order: far less");
    src.line("/// rounding error than one long chain (reduce_expr is associative).");
    src.line("constexpr ptrdiff_t dlbridge_kBlock = 1024;");
    src.line(
        "_type_reduce dlbridge_fold_any(const dlbridge_Ctx& _c, const ptrdiff_t* _base, ptrdiff_t _i, ptrdiff_t _jb, ptrdiff_t _je) {",
    );
    src.line("  auto block = [&](ptrdiff_t b, ptrdiff_t e) {");
    src.line("    return _c.red.unit ? dlbridge_fold<true>(_c, _base, _i, b, e) : dlbridge_fold<false>(_c, _base, _i, b, e);");
    src.line("  };");
    if spec.identity.is_some() {
        src.line("  _type_reduce _acc = dlbridge_identity();");
    } else {
        src.line("  ptrdiff_t _mid = std::min(_je, _jb + dlbridge_kBlock);");
        src.line("  _type_reduce _acc = block(_jb, _mid);");
        src.line("  _jb = _mid;");
    }
    src.line("  for (ptrdiff_t b = _jb; b < _je; b += dlbridge_kBlock) {");
    src.line("    _acc = dlbridge_reduce(_acc, block(b, std::min(_je, b + dlbridge_kBlock)));");
    src.line("  }");
    src.line("  return _acc;");
    src.line("}");
    src.line("");
    src.line("/// Writes output element `_i` (operand offsets `_off`) from the reduced value.");
    src.line("void dlbridge_store(const dlbridge_Ctx& _c, const ptrdiff_t* _off, ptrdiff_t _i, const _type_reduce& _acc) {");
    let outs: Vec<String> = (0..n_out)
        .map(|m| {
            let k = n_in + m;
            format!("static_cast<{}*>(_c.data[{k}])[_off[{k}]]", ctypes[k])
        })
        .collect();
    src.line(&format!("  dlbridge_post_map(_acc, {}, _i, _c.red.size, _c.kept.size);", outs.join(", ")));
    src.line("}");
    src.line("");

    entry_prologue(&mut src, name, &all, bind)?;
    src.line("    const DLTensor* x = _t[0];");
    src.line("    const DLTensor* y = _t[dlbridge_kIn];");
    src.line("    const int nx = x->ndim, ny = y->ndim;");
    src.line("    for (int k = 1; k < dlbridge_kIn; ++k) {");
    src.line("      bool same = _t[k]->ndim == nx;");
    src.line("      for (int d = 0; same && d < nx; ++d) same = _t[k]->shape[d] == x->shape[d];");
    src.line("      if (!same) {");
    src.line("        const dlbridge::detail::ShapeText a(_t[k]->ndim, _t[k]->shape), b(nx, x->shape);");
    src.line("        return dlbridge::detail::fail(_err, _err_len, DLBRIDGE_ERR_VALUE, \"%s: input `%s` has shape %s, but `%s` has %s\", kKernel, kNames[k], a.text, kNames[0], b.text);");
    src.line("      }");
    src.line("    }");
    src.line("    for (int m = 0; m < dlbridge_kOut; ++m) {");
    src.line("      const DLTensor* o = _t[dlbridge_kIn + m];");
    src.line("      bool ok = o->ndim == ny && ny <= nx;");
    src.line("      for (int d = 0; ok && d < ny; ++d) ok = o->shape[d] == x->shape[d];");
    src.line("      if (!ok) {");
    src.line("        const dlbridge::detail::ShapeText a(o->ndim, o->shape), b(nx, x->shape);");
    src.line("        return dlbridge::detail::fail(_err, _err_len, DLBRIDGE_ERR_VALUE,");
    src.line("                    \"%s: output `%s` has shape %s; it must be the kept (leading) dims of the input shape %s, the reduced axes last\",");
    src.line("                    kKernel, kNames[dlbridge_kIn + m], a.text, b.text);");
    src.line("      }");
    src.line("    }");
    src.line("    dlbridge_Ctx c;");
    src.line("    {");
    src.line("      int64_t kept[dlbridge_kIn + dlbridge_kOut][dlbridge::detail::kMaxDims];");
    src.line("      int64_t red[dlbridge_kIn][dlbridge::detail::kMaxDims];");
    src.line("      for (int k = 0; k < dlbridge_kIn + dlbridge_kOut; ++k) {");
    src.line("        for (int d = 0; d < ny; ++d) kept[k][d] = _t[k]->strides[d];");
    src.line("      }");
    src.line("      for (int k = 0; k < dlbridge_kIn; ++k) {");
    src.line("        for (int d = ny; d < nx; ++d) red[k][d - ny] = _t[k]->strides[d];");
    src.line("      }");
    src.line("      c.kept.init(ny, x->shape, kept);");
    src.line("      c.red.init(nx - ny, x->shape + ny, red);");
    src.line("    }");
    src.line("    for (int k = 0; k < dlbridge_kIn + dlbridge_kOut; ++k) c.data[k] = dlbridge::detail::base_of(_t[k]);");
    src.line("    const ptrdiff_t M = c.kept.size, J = c.red.size;");
    src.line("    if (M == 0) return DLBRIDGE_OK;");
    if spec.identity.is_none() {
        src.line("    if (J == 0) {");
        src.line("      return dlbridge::detail::fail(_err, _err_len, DLBRIDGE_ERR_VALUE,");
        src.line("                  \"%s: the reduction is over zero elements and the kernel has no identity to start from\", kKernel);");
        src.line("    }");
    }
    src.line("    const int by_outputs = dlbridge::detail::chunks_for(M, J), by_partials = dlbridge::detail::chunks_for(J, 1);");
    src.line("    if (by_outputs >= dlbridge::detail::num_threads() || by_partials <= by_outputs || M > 64) {");
    src.line("      dlbridge::detail::parallel_chunks(M, by_outputs, [&](int, ptrdiff_t b, ptrdiff_t e) {");
    src.line("        c.kept.for_runs(b, e, [&](ptrdiff_t i0, ptrdiff_t len, const ptrdiff_t* off) {");
    src.line("          ptrdiff_t at[dlbridge_kIn + dlbridge_kOut];");
    src.line("          for (ptrdiff_t u = 0; u < len; ++u) {");
    src.line("            for (int k = 0; k < dlbridge_kIn + dlbridge_kOut; ++k) at[k] = off[k] + u * c.kept.inner(k);");
    src.line("            dlbridge_store(c, at, i0 + u, dlbridge_fold_any(c, at, i0 + u, 0, J));");
    src.line("          }");
    src.line("        });");
    src.line("      });");
    src.line("    } else {");
    src.line("      // Few outputs, long reductions: each one split into per-thread partials,");
    src.line("      // combined in order with reduce_expr (associative, as CuPy requires).");
    src.line("      // Guarded whole, on the calling thread: reduce_expr, post_map_expr and");
    src.line("      // the partials' destructors (a reduce_type's own code) run here.");
    src.line("      dlbridge_divguard::guarded([&] {");
    src.line("        std::vector<std::optional<_type_reduce>> parts(static_cast<size_t>(by_partials));");
    src.line("        ptrdiff_t at[dlbridge_kIn + dlbridge_kOut];");
    src.line("        for (ptrdiff_t o = 0; o < M; ++o) {");
    src.line("          c.kept.offsets(o, at);");
    src.line("          dlbridge::detail::parallel_chunks(J, by_partials, [&](int part, ptrdiff_t b, ptrdiff_t e) {");
    src.line("            parts[static_cast<size_t>(part)] = dlbridge_fold_any(c, at, o, b, e);");
    src.line("          });");
    src.line("          _type_reduce acc = *parts[0];");
    src.line("          for (size_t p = 1; p < parts.size(); ++p) acc = dlbridge_reduce(acc, *parts[p]);");
    src.line("          dlbridge_store(c, at, o, acc);");
    src.line("        }");
    src.line("      });");
    src.line("    }");
    entry_epilogue(&mut src);
    let doc = format!(
        "ReductionKernel: map {} | reduce {} | post {}",
        summary(&spec.map_expr),
        summary(&spec.reduce_expr),
        summary(&spec.post_map_expr)
    );
    plugin_table(&mut src, name, &signature, "0", &doc);
    Ok(src.text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_directives_point_at_the_true_next_line() {
        let spec = ElementwiseSpec::new("T x", "T z", "z = x;\n// two", "k", "int helper() { return 1; }", "", "").unwrap();
        let src = elementwise_cpp(&spec, &[('T', DType::F32)]).unwrap();
        let lines: Vec<&str> = src.lines().collect();
        let mut resyncs = 0;
        for (at, l) in lines.iter().enumerate() {
            if let Some(rest) = l.strip_prefix("#line ")
                && rest.ends_with(&format!("\"{GENERATED_FILE}\""))
            {
                let n: usize = rest.split(' ').next().unwrap().parse().unwrap();
                assert_eq!(n, at + 2, "line {}: {l}", at + 1);
                resyncs += 1;
            }
        }
        assert!(resyncs >= 3, "{resyncs}");
        assert!(src.contains("#line 1 \"operation\"\nz = x;\n// two\n#pragma dlbridge_fragment "));
        assert!(src.contains(" end operation\n; } while (0);\n"));
        assert!(src.contains("#line 1 \"preamble\"\nint helper() { return 1; }\n#pragma dlbridge_fragment "));
    }

    #[test]
    fn string_literals_are_escaped() {
        assert_eq!(c_string("a\"b\\c??=\n\u{e9}"), "\"a\\\"b\\\\c\\?\\?=\\012\\303\\251\"");
    }

    #[test]
    fn unsupported_dtypes_are_type_errors_naming_the_placeholder_or_parameter() {
        let spec = ElementwiseSpec::new("T x", "T z", "z = x", "k", "", "", "").unwrap();
        let f32x4 = DType::new(dlbridge_core::DTypeCode::Float, 32, 4).unwrap();
        let e = elementwise_cpp(&spec, &[('T', f32x4)]).unwrap_err();
        assert_eq!(e.kind(), dlbridge_core::ErrorKind::Type);
        assert!(
            e.to_string().starts_with(&format!(
                "ElementwiseKernel `k`: type placeholder `T`: dtype {f32x4} is not supported by the CPU backend (yet)"
            )),
            "{e}"
        );
        for (d, ct) in
            [(DType::F16, "float16"), (DType::BF16, "bfloat16"), (DType::C64, "std::complex<float>"), (DType::C128, "std::complex<double>")]
        {
            let src = elementwise_cpp(&spec, &[('T', d)]).unwrap();
            assert!(src.contains(&format!("typedef {ct} T;")), "{d}");
        }
        let e = elementwise_cpp(&ElementwiseSpec::new("T x", "T z", "z = x", "k", "", "", "").unwrap(), &[]).unwrap_err();
        assert_eq!(e.to_string(), "ElementwiseKernel `k`: type placeholder `T` is not bound");
    }

    #[test]
    fn the_table_carries_the_specialised_signature_and_flags() {
        let spec = ElementwiseSpec::new("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse", "", "", "").unwrap();
        let src = elementwise_cpp(&spec, &[('T', DType::I32)]).unwrap();
        assert!(src.contains("{\"add_reverse(x: i32[*S], y: i32[...R0]) -> (z: i32[*S])\", 1, 0, dlbridge_entry,"), "raw: no aliasing");
        assert!(src.contains("\"dlbridge-compile:add_reverse\""));
        assert!(src.contains("typedef int32_t T;"));
        let spec = ElementwiseSpec::new("T x", "T z", "z = x", "copy", "", "", "").unwrap();
        let src = elementwise_cpp(&spec, &[('T', DType::F64)]).unwrap();
        assert!(src.contains("1, DLBRIDGE_KERNEL_ALIAS_OUTPUTS, dlbridge_entry,"));
    }
}

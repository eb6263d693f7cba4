//! The CUDA backend: CUDA C generated from the same kernel specification as
//! the [CPU backend](crate::codegen::cpu), compiled with NVRTC, run on the call's
//! stream — what CuPy does with an `ElementwiseKernel` or `ReductionKernel`.
//!
//! [`ElementwiseKernel::register`](crate::ElementwiseKernel::register) and
//! [`ReductionKernel::register`](crate::ReductionKernel::register) register a
//! `cuda` implementation next to the CPU one (same signature), so the
//! registry picks by the tensors' device. The first call with a combination
//! of dtypes on a device generates the source ([`elementwise_source`],
//! [`reduction_source`]), compiles it (a CUBIN for the device's exact
//! architecture, else PTX; through `dlbridge_cuda`'s NVRTC cache in memory
//! and on disk), loads it, and keeps the function; concurrent first calls
//! compile once. Without a CUDA driver and device a call on `cuda` tensors
//! is an error saying why.
//!
//! # What a kernel body sees
//! As on the CPU, with CUDA's spellings native: `typedef <ctype> T;` per
//! bound placeholder (bool `bool`, i8..u64 `int8_t`..`uint64_t` (declared by
//! the generated code; NVRTC has no system headers), f16 `float16`, bf16
//! `bfloat16`, f32 `float`, f64 `double`); CUDA's math functions (`sqrt`, `exp`, `min`, `max`, ...) as
//! NVRTC provides them (no `std::`); `CUDART_INF_F`, `CUDART_NAN_F`,
//! `CUDART_INF`, `CUDART_NAN`; the `preamble` at file scope, compiled with
//! `-default-device` (a helper without `__device__` is a device function).
//! * Elementwise: `i` (the flat C-order index over the broadcast shape),
//!   `n` and `_ind.size()` (the broadcast size), `_ind.ndim()`,
//!   `_ind.shape()[d]`, `const T& x` per non-raw input (`T&` when `mut`),
//!   `T& z` per output, and per raw input an object indexed with a flat
//!   C-order index into its own shape (`r[k]`, any strides; `r.size()`,
//!   `r.ndim()`, `r.shape()[d]`, at most 8 dims). `loop_prep` runs once per
//!   thread before its grid-stride loop, `after_loop` once after it.
//! * Reduction: `map_expr` sees `const T& x` per input, `_i`, `_j`, `_J`, `_in_ind`, `_out_ind`;
//!   `reduce_expr` sees `a` and `b`; `post_map_expr` sees `a`, `T& y` per
//!   output, `_i`, `_J`; `_type_reduce` is the reduce type.
//!
//! # How it runs
//! Elementwise: every non-raw operand is described by a `DlbIndexer`
//! (`dlbridge_cuda::builtins::COMMON`): the broadcast shape with its strides
//! (0 where it repeats), its contiguous dims merged, at most 8 dims after
//! merging. When every operand is contiguous the loop addresses `p[i]`
//! directly; otherwise each element's offsets are computed from `i`. One
//! grid-stride loop, 256 threads a block, enough blocks to fill the device.
//! Reductions: the reduced axes are the inputs' last dims (as on the CPU);
//! the launch follows the shapes and the layout ([`reduction_launch`]): a
//! warp per output for up to 1024 reduced elements, a block (up to 512
//! threads) beyond; when adjacent outputs are closer in memory than adjacent
//! reduced elements (a reduction along a leading axis), or the reductions are
//! short, the outputs go along a warp's lanes and the reduced elements along
//! the block's warps, so that loads stay coalesced; when the outputs are too
//! few to fill the device (a reduction to a scalar), each output's elements
//! are cut into pieces whose partial results a second kernel combines (a
//! scratch buffer from the device's pool, ordered on the call's stream; not
//! for a `reduce_type` spelled as C++ rather than a dtype, whose size the
//! host does not know). Each thread folds its share, then warp shuffles and
//! shared memory combine the shares; the order of the operations depends
//! only on the shapes, the layout and the device's SM count: a launch is
//! deterministic.
//!
//! # Differences from the CPU backend
//! * A raw index out of range is not an error (a kernel cannot report one
//!   without synchronising): reads give an unspecified value and writes go
//!   to a scratch word, never outside the array.
//! * complex dtypes are a Type error naming the dtype (NVRTC has no
//!   `std::complex`); f16 and bf16 are the CPU's `float16`/`bfloat16`
//!   (crate::codegen::halfs), converted bit by bit.
//! * At most 8 dims per operand after merging contiguous dims (8 per raw
//!   input, unmerged).
//!
//! # Diagnostics
//! As on the CPU: each piece of user text is preceded by `#line 1
//! "operation"` (or `"preamble"`, `"map_expr"`, ...), generated lines are
//! `dlbridge_generated.cu`, and NVRTC's `operation(2): error: ...` becomes
//! `operation line 2: error: ...` with the user's line.

use dlbridge_core::{DType, Error, ErrorKind, Result};
use dlbridge_cuda::generated::Program;

use crate::codegen::{Backend, Head, Src, head, reduction_helpers};
use crate::params::CPU_DTYPES;
use crate::spec::{ElementwiseSpec, ReductionSpec, Spec};

/// The file name NVRTC's messages use for generated (non-user) lines.
pub const GENERATED_FILE: &str = "dlbridge_generated.cu";

/// The CUDA backend's head: the CUDA runtime.
pub(crate) const CUDA: Backend = Backend {
    label: " (CUDA)",
    file: GENERATED_FILE,
    ctype: cuda_ctype,
    runtime: |src| src.push(&crate::codegen::headers::expand("dlbridge_compile/cuda_runtime.cuh")),
    marked: false,
};

/// The dtypes the CUDA backend supports: the CPU backend's but complex (NVRTC
/// has no `std::complex`).
pub const CUDA_DTYPES: &[DType] = CPU_DTYPES.split_at(CPU_DTYPES.len() - 2).0; // CPU_DTYPES ends with c64, c128

/// NVRTC options of every generated source (the architecture comes first, per device).
pub const OPTIONS: &[&str] = &["--std=c++17", "-default-device"];

/// Elements a thread of a contiguous elementwise kernel takes per step (its
/// inputs read in one aligned load each).
pub const VECTOR: usize = 4;

/// Threads a block of a reduction, at most (shared memory holds one partial value per thread).
pub const MAX_REDUCTION_BLOCK: u32 = 512;

/// The CUDA C type of one element (`f32` → `float`, `f16` → `float16`);
/// complex dtypes are a Type error naming the dtype.
pub fn cuda_ctype(d: DType) -> Result<&'static str> {
    crate::params::element_ctype(d, "CUDA", CUDA_DTYPES)
}

/// One specialisation's CUDA C, ready for NVRTC, with what maps its
/// diagnostics back to the user's text.
#[derive(Debug, Clone)]
pub struct CudaSource {
    /// The complete source.
    pub text: String,
    /// The `extern "C" __global__` function's name (`dlbridge_<name>`).
    pub entry: String,
    /// `ElementwiseKernel k (T=f32)`: how errors name the specialisation.
    pub what: String,
    /// (`#line` label, user text) of every piece of user text.
    pub user: Vec<(String, String)>,
}

impl CudaSource {
    pub(crate) fn new<S: Spec>(src: Src, entry: String, spec: &S, bind: &[(char, DType)]) -> CudaSource {
        let user = spec.texts().into_iter().map(|(a, b)| (a.to_owned(), b.to_owned())).collect();
        CudaSource { text: src.text, entry, what: spec.what(bind), user }
    }

    /// The NVRTC program of this source.
    pub fn program(&self) -> Program {
        let options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
        Program::new(self.text.clone(), "kernel.cu", &options)
    }

    /// Its PTX for `arch` (`--gpu-architecture=compute_75`, `sm_90`, ...); no
    /// GPU needed. A compile error is explained against the user's text.
    pub fn ptx(&self, arch: &str) -> Result<std::sync::Arc<str>> {
        self.program().ptx(arch).map_err(|e| self.explain(e))
    }

    /// NVRTC's rejection as the CPU backend's, pointing into the user's text;
    /// any other error unchanged.
    pub fn explain(&self, e: Error) -> Error {
        let text = e.to_string();
        if !text.contains("NVRTC could not compile") {
            return e;
        }
        let user: Vec<(&str, &str)> = self.user.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let version =
            dlbridge_cuda::nvrtc::nvrtc().map(|n| format!("NVRTC {}.{}", n.version.0, n.version.1)).unwrap_or_else(|_| "NVRTC".into());
        Error::Coded { kind: ErrorKind::Value, message: explain(&self.what, &version, &text, &user) }
    }
}

/// NVRTC's diagnostics about the user's text (`operation(2): error: ...`,
/// followed by the line and a caret) as `operation line 2: error: ...` with
/// the user's line and NVRTC's caret, each once, then NVRTC's own output
/// (capped).
pub fn explain(what: &str, version: &str, diag: &str, user: &[(&str, &str)]) -> String {
    let mut msg = format!("{what}: {version} rejected the kernel");
    let lines: Vec<&str> = diag.lines().collect();
    let mut seen: Vec<String> = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let Some((file, rest)) = line.trim_start().split_once('(') else { continue };
        let Some(text) = user.iter().find(|(f, _)| *f == file).map(|(_, t)| *t) else { continue };
        let Some((l, m)) = rest.split_once("): ") else { continue };
        let Ok(l) = l.parse::<usize>() else { continue };
        if !(m.starts_with("error") || m.starts_with("catastrophic error")) {
            continue;
        }
        let head = format!("{file} line {l}: {m}");
        if seen.contains(&head) {
            continue;
        }
        seen.push(head.clone());
        msg.push_str("\n  ");
        msg.push_str(&head);
        if m.contains("must be a modifiable lvalue") || m.contains("read-only") {
            msg.push_str(" (inputs are read-only: declare the parameter `mut` to write it in place)");
        }
        if let Some(src) = text.lines().nth(l.saturating_sub(1)) {
            msg.push_str(&format!("\n    {src}"));
            // NVRTC quotes the line and puts a caret under the column.
            let caret = lines.get(at + 2).filter(|c| c.trim() == "^" && lines.get(at + 1).is_some_and(|q| q.trim() == src.trim()));
            if let (Some(c), Some(q)) = (caret, lines.get(at + 1)) {
                let indent = q.len() - q.trim_start().len();
                let col = c.find('^').unwrap_or(0).saturating_sub(indent);
                let lead = src.len() - src.trim_start().len();
                msg.push_str(&format!("\n    {}^", " ".repeat(col + lead)));
            }
        }
    }
    crate::builder::toolchain::finish_explanation(&mut msg, !seen.is_empty(), "NVRTC output", &lines);
    msg
}

/// `ptrdiff_t`, `size_t` and the `<stdint.h>` names, which NVRTC does not
/// provide without the toolkit's headers (every generated CUDA source starts so).
pub(crate) fn stdint_typedefs(src: &mut Src) {
    src.push(crate::codegen::headers::text("dlbridge_compile/nvrtc_stdint.cuh"));
}

/// The CUDA C of one specialisation of an elementwise kernel.
///
/// The function `dlbridge_<name>` takes, per tensor in call order (inputs,
/// then outputs), its element-0 pointer and a `DlbIndexer` (over the
/// broadcast shape for non-raw operands; a raw input's own shape and strides,
/// then `long long` size and `int` contiguous); then the `DlbIndexer` of the
/// broadcast shape, `long long` size, `int` "every operand contiguous" and
/// `int` "every read-only input aligned to [`VECTOR`] elements" (then each
/// thread takes [`VECTOR`] elements a step, its inputs read in one load each).
///
/// Errors: a binding that does not cover exactly the placeholders (Value), a
/// dtype the CUDA backend has no type for (Type).
pub fn elementwise_source(spec: &ElementwiseSpec, bind: &[(char, DType)]) -> Result<CudaSource> {
    let Head { mut src, all, ctypes, .. } = head(&CUDA, spec, bind, "the loop")?;
    let (name, n_in) = (&spec.name, spec.inputs.len());
    let qual = |t: usize| if t < n_in && !all[t].mutable { "const " } else { "" };
    let mut params = Vec::new();
    let mut args = Vec::new();
    for (t, p) in all.iter().enumerate() {
        let q = qual(t);
        let ct = &ctypes[t];
        params.push(format!("{q}{ct}* _p{t}"));
        params.push(format!("const DlbIndexer& _x{t}"));
        args.push(format!("_p{t}"));
        args.push(format!("_x{t}"));
        if p.raw {
            params.push(format!("long long _n{t}"));
            params.push(format!("int _c{t}"));
            args.push(format!("_n{t}"));
            args.push(format!("_c{t}"));
        }
    }
    // Inputs read through a register copy in the vector loop (not raw, not written).
    let vec_inputs: Vec<usize> = (0..n_in).filter(|&t| !all[t].raw && !all[t].mutable).collect();
    src.line("template <typename E>");
    src.line(&format!("struct alignas(sizeof(E) * {VECTOR}) dlbridge_Vec {{"));
    src.line(&format!("  E e[{VECTOR}];"));
    src.line("};");
    src.line("template <bool dlbridge_kContig>");
    src.line(&format!(
        "__device__ __forceinline__ void dlbridge_run({}, const DlbIndexer& _indx, long long _size, int _vec) {{",
        params.join(", ")
    ));
    src.line("  const dlbridge::Indexer _ind(_indx, _size);");
    if !all.iter().any(|p| p.name == "n") {
        // CuPy has no `n`; a parameter of that name takes it over.
        src.line("  const ptrdiff_t n = _size;");
        src.line("  (void)n;");
    }
    src.line("  (void)_ind;");
    for (t, p) in all.iter().enumerate().filter(|(_, p)| p.raw) {
        let elem = format!("{}{}", qual(t), ctypes[t]);
        src.line(&format!("  const dlbridge::Raw<{elem}> {}(_p{t}, _x{t}, _n{t}, _c{t});", p.name));
    }
    if !spec.loop_prep.is_empty() {
        src.user("loop_prep", &spec.loop_prep, ";");
    }
    // From here on the generated code names only what no text can declare
    // (names under `_` and `dlbridge`, `::`-qualified names, keywords and
    // CUDA's built-in variables): `loop_prep` may declare any other name.
    // The operation once, as a function of the element's index and operands (the
    // vector loop and the element loop both call it; loop_prep's names are captured).
    let non_raw: Vec<usize> = (0..all.len()).filter(|&t| !all[t].raw).collect();
    // Inputs by value, read before anything is written (an output that is
    // exactly an input still reads the old value); outputs and `mut` inputs
    // by reference.
    let body_params: Vec<String> = non_raw
        .iter()
        .map(|&t| {
            if t < n_in && !all[t].mutable {
                format!("const {} {}", ctypes[t], all[t].name)
            } else {
                format!("{}{}& {}", qual(t), ctypes[t], all[t].name)
            }
        })
        .collect();
    src.line(&format!("  const auto _body = [&](::ptrdiff_t i{}) {{", body_params.iter().map(|p| format!(", {p}")).collect::<String>()));
    src.line("    (void)i;");
    // As on the CPU: a top-level `break` or `continue` ends this element only.
    src.line("    do {");
    src.user("operation", &spec.operation, "; } while (0);");
    src.line("  };");
    src.line("  const ::ptrdiff_t _first = static_cast< ::ptrdiff_t>(blockIdx.x) * blockDim.x + threadIdx.x;");
    src.line("  const ::ptrdiff_t _stride = static_cast< ::ptrdiff_t>(gridDim.x) * blockDim.x;");
    src.line("  ::ptrdiff_t _done = 0;");
    src.line("  if (dlbridge_kContig && _vec) {");
    src.line(&format!(
        "    // {VECTOR} elements a thread and step: the inputs in one aligned load each (16 bytes of 4-byte elements), the rest by reference."
    ));
    src.line(&format!("    const ::ptrdiff_t _nv = _size / {VECTOR};"));
    src.line("    for (::ptrdiff_t _q = _first; _q < _nv; _q += _stride) {");
    for &t in &vec_inputs {
        src.line(&format!("      const dlbridge_Vec<{0}> _v{t} = reinterpret_cast<const dlbridge_Vec<{0}>*>(_p{t})[_q];", ctypes[t]));
    }
    src.line("#pragma unroll");
    src.line(&format!("      for (int _k = 0; _k < {VECTOR}; ++_k) {{"));
    src.line(&format!("        const ::ptrdiff_t _i = _q * {VECTOR} + _k;"));
    let vargs: Vec<String> =
        non_raw.iter().map(|&t| if vec_inputs.contains(&t) { format!("_v{t}.e[_k]") } else { format!("_p{t}[_i]") }).collect();
    src.line(&format!("        _body(_i{});", vargs.iter().map(|a| format!(", {a}")).collect::<String>()));
    src.line("      }");
    src.line("    }");
    src.line(&format!("    _done = _nv * {VECTOR};"));
    src.line("  }");
    src.line("  for (::ptrdiff_t i = _done + _first; i < _size; i += _stride) {");
    let sargs: Vec<String> = non_raw.iter().map(|&t| format!("_p{t}[dlbridge_kContig ? i : dlbridge_offset(_x{t}, i)]")).collect();
    src.line(&format!("    _body(i{});", sargs.iter().map(|a| format!(", {a}")).collect::<String>()));
    src.line("  }");
    if !spec.after_loop.is_empty() {
        src.user("after_loop", &spec.after_loop, ";");
    }
    src.line("}");
    src.line("");
    let entry = format!("dlbridge_{name}");
    let kparams: Vec<String> = params.iter().map(|p| p.replace("const DlbIndexer&", "DlbIndexer")).collect();
    src.line(&format!(
        "extern \"C\" __global__ void {entry}({}, DlbIndexer _indx, long long _size, int _contig, int _vec) {{",
        kparams.join(", ")
    ));
    src.line(&format!("  if (_contig) dlbridge_run<true>({}, _indx, _size, _vec);", args.join(", ")));
    src.line(&format!("  else dlbridge_run<false>({}, _indx, _size, 0);", args.join(", ")));
    src.line("}");
    Ok(CudaSource::new(src, entry, spec, bind))
}

/// The reduction's accumulator: a value being reduced and whether there is
/// one yet (always, with an identity), folded, merged, and combined across a
/// warp (shuffles of any reduce type, 32 bits at a time; the lower lane's
/// value goes first) and a block.
fn accumulator(src: &mut Src, has_identity: bool) {
    src.line(&format!("constexpr unsigned dlbridge_kMaxBlock = {MAX_REDUCTION_BLOCK};"));
    src.line("struct dlbridge_Acc {");
    src.line("  _type_reduce v;");
    src.line("  bool has;");
    src.line("};");
    src.line("__device__ __forceinline__ dlbridge_Acc dlbridge_none() {");
    src.line("  dlbridge_Acc a;");
    if has_identity {
        src.line("  a.v = dlbridge_identity();");
        src.line("  a.has = true;");
    } else {
        src.line("  a.has = false;");
    }
    src.line("  return a;");
    src.line("}");
    src.line("__device__ __forceinline__ void dlbridge_fold(dlbridge_Acc& a, const _type_reduce& v) {");
    if has_identity {
        src.line("  a.v = dlbridge_reduce(a.v, v);");
    } else {
        src.line("  a.v = a.has ? dlbridge_reduce(a.v, v) : v;");
        src.line("  a.has = true;");
    }
    src.line("}");
    src.line("__device__ __forceinline__ dlbridge_Acc dlbridge_merge(const dlbridge_Acc& a, const dlbridge_Acc& b) {");
    if !has_identity {
        src.line("  if (!b.has) return a;");
        src.line("  if (!a.has) return b;");
    }
    src.line("  dlbridge_Acc r;");
    src.line("  r.v = dlbridge_reduce(a.v, b.v);");
    src.line("  r.has = true;");
    src.line("  return r;");
    src.line("}");
    src.line("__device__ __forceinline__ dlbridge_Acc dlbridge_warp_reduce(dlbridge_Acc a) {");
    src.line("  constexpr int W = (sizeof(dlbridge_Acc) + 3) / 4;");
    src.line("#pragma unroll");
    src.line("  for (int o = 16; o > 0; o >>= 1) {");
    src.line("    unsigned w[W];");
    src.line("    memcpy(w, &a, sizeof a);");
    src.line("#pragma unroll");
    src.line("    for (int k = 0; k < W; ++k) w[k] = __shfl_xor_sync(0xffffffffu, w[k], o);");
    src.line("    dlbridge_Acc b;");
    src.line("    memcpy(&b, w, sizeof b);");
    src.line("    a = (threadIdx.x & o) ? dlbridge_merge(b, a) : dlbridge_merge(a, b);");
    src.line("  }");
    src.line("  return a;");
    src.line("}");
    src.line("// The block's value in every thread (every thread must call it; `s` holds 32 values).");
    src.line("__device__ __forceinline__ dlbridge_Acc dlbridge_block_reduce(dlbridge_Acc a, dlbridge_Acc* s) {");
    src.line("  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31u) >> 5;");
    src.line("  a = dlbridge_warp_reduce(a);");
    src.line("  __syncthreads();");
    src.line("  if (lane == 0) s[warp] = a;");
    src.line("  __syncthreads();");
    src.line("  a = lane < nwarps ? s[lane] : dlbridge_none();");
    src.line("  return dlbridge_warp_reduce(a);");
    src.line("}");
}

/// The CUDA C of one specialisation of a reduction kernel.
///
/// The function `dlbridge_<name>` takes, per input, its element-0 pointer,
/// the `DlbIndexer` of its kept dims (over the outputs' shape) and of its
/// reduced dims; per output, its pointer and `DlbIndexer`; then a pointer to
/// the partial results of split reductions, `long long` outputs `M`, `long
/// long` reduced count `J`, `int` "every input's reduced dims contiguous",
/// `int` layout, `long long` splits, `long long` chunk (see
/// [`reduction_launch`]). With more than one split it writes each piece's
/// partial result, and `dlbridge_<name>_finish` (the partial results, then
/// the outputs as above, `M`, `J`, splits; a warp per output) combines each
/// output's pieces and runs `post_map_expr`.
pub fn reduction_source(spec: &ReductionSpec, bind: &[(char, DType)]) -> Result<CudaSource> {
    let Head { mut src, ctypes, .. } = head(&CUDA, spec, bind, "the reduction")?;
    let (name, n_in, n_out) = (&spec.name, spec.inputs.len(), spec.outputs.len());
    reduction_helpers(&mut src, spec, &ctypes, "__device__ __forceinline__", cuda_ctype, false)?;
    src.line("");
    let mut params = Vec::new();
    let mut args = Vec::new();
    for (t, ct) in ctypes.iter().enumerate().take(n_in) {
        params.push(format!("const {ct}* _p{t}, const DlbIndexer& _k{t}, const DlbIndexer& _r{t}"));
        args.push(format!("_p{t}, _k{t}, _r{t}"));
    }
    let mut out_params = Vec::new();
    let mut out_args = Vec::new();
    for m in 0..n_out {
        let t = n_in + m;
        out_params.push(format!("{}* _p{t}, const DlbIndexer& _k{t}", ctypes[t]));
        out_args.push(format!("_p{t}, _k{t}"));
    }
    params.extend(out_params.iter().cloned());
    args.extend(out_args.iter().cloned());
    accumulator(&mut src, spec.identity.is_some());
    src.line("");
    let outs: Vec<String> = (0..n_out).map(|m| format!("_p{0}[dlbridge_offset(_k{0}, _o)]", n_in + m)).collect();
    src.line("// Output _o's value of piece _q: its result, or its partial result when the reduction is split.");
    src.line(&format!(
        "__device__ __forceinline__ void dlbridge_emit(const dlbridge_Acc& _a, {}, dlbridge_Acc* _partial, long long _o, long long _q, long long _splits, long long _M, long long _J) {{",
        out_params.join(", ")
    ));
    src.line("  if (_splits > 1) {");
    src.line("    _partial[_o * _splits + _q] = _a;");
    src.line("    return;");
    src.line("  }");
    src.line(&format!("  dlbridge_post_map(_a.v, {}, _o, _J, _M);", outs.join(", ")));
    src.line("}");
    src.line("");
    let bases = |src: &mut Src, indent: &str| {
        for (t, ct) in ctypes.iter().enumerate().take(n_in) {
            src.line(&format!("{indent}const {ct}* const _b{t} = _p{t} + dlbridge_offset(_k{t}, _o);"));
        }
    };
    let margs: Vec<String> = (0..n_in).map(|t| format!("_b{t}[dlbridge_kContig ? _j : dlbridge_offset(_r{t}, _j)]")).collect();
    let map_call = format!("dlbridge_fold(_acc, dlbridge_map({}, _o, _j, _J, _M));", margs.join(", "));
    src.line("template <bool dlbridge_kContig>");
    src.line(&format!(
        "__device__ __forceinline__ void dlbridge_run({}, dlbridge_Acc* _partial, long long _M, long long _J, int _layout, long long _splits, long long _chunk) {{",
        params.join(", ")
    ));
    src.line("  __shared__ __align__(16) unsigned char _sbuf[dlbridge_kMaxBlock * sizeof(dlbridge_Acc)];");
    src.line("  dlbridge_Acc* const _s = reinterpret_cast<dlbridge_Acc*>(_sbuf);");
    src.line("  if (_layout == 2) {");
    src.line("    // Outputs along the lanes (adjacent outputs adjacent in memory), the reduced elements along the warps.");
    src.line("    const unsigned _tx = threadIdx.x & 31u, _ty = threadIdx.x >> 5, _by = blockDim.x >> 5;");
    src.line("    const long long _units = (_M + 31) / 32 * _splits;");
    src.line("    for (long long _u = blockIdx.x; _u < _units; _u += gridDim.x) {");
    src.line("      const long long _ob = _u / _splits, _q = _u - _ob * _splits, _o = _ob * 32 + _tx;");
    src.line("      const long long _j1 = min(_J, (_q + 1) * _chunk);");
    src.line("      dlbridge_Acc _acc = dlbridge_none();");
    src.line("      if (_o < _M) {");
    bases(&mut src, "        ");
    src.line("        for (long long _j = _q * _chunk + _ty; _j < _j1; _j += _by) {");
    src.line(&format!("          {map_call}"));
    src.line("        }");
    src.line("      }");
    src.line("      __syncthreads();  // the previous unit is done with _s");
    src.line("      _s[threadIdx.x] = _acc;");
    src.line("      __syncthreads();");
    src.line("      for (unsigned _w = _by / 2; _w > 0; _w >>= 1) {");
    src.line("        if (_ty < _w) _s[threadIdx.x] = dlbridge_merge(_s[threadIdx.x], _s[threadIdx.x + 32 * _w]);");
    src.line("        __syncthreads();");
    src.line("      }");
    src.line(&format!(
        "      if (_ty == 0 && _o < _M) dlbridge_emit(_s[_tx], {}, _partial, _o, _q, _splits, _M, _J);",
        out_args.join(", ")
    ));
    src.line("    }");
    src.line("    return;");
    src.line("  }");
    src.line("  // A warp (layout 0) or the block (layout 1) per piece of an output, the reduced elements along its threads.");
    src.line("  const DlbRowGroup _g = dlb_row_group(_layout == 0);");
    src.line("  const long long _units = _M * _splits;");
    src.line("  for (long long _u = _g.first; _u < _units; _u += _g.step) {");
    src.line("    const long long _o = _u / _splits, _q = _u - _o * _splits;");
    src.line("    const long long _j1 = min(_J, (_q + 1) * _chunk);");
    bases(&mut src, "    ");
    src.line("    dlbridge_Acc _acc = dlbridge_none();");
    src.line("    for (long long _j = _q * _chunk + _g.tid; _j < _j1; _j += _g.n) {");
    src.line(&format!("      {map_call}"));
    src.line("    }");
    src.line("    _acc = _g.warp ? dlbridge_warp_reduce(_acc) : dlbridge_block_reduce(_acc, _s);");
    src.line(&format!("    if (_g.tid == 0) dlbridge_emit(_acc, {}, _partial, _o, _q, _splits, _M, _J);", out_args.join(", ")));
    src.line("  }");
    src.line("}");
    src.line("");
    let entry = format!("dlbridge_{name}");
    let by_value = |v: &[String]| -> Vec<String> { v.iter().map(|p| p.replace("const DlbIndexer&", "DlbIndexer")).collect() };
    src.line(&format!(
        "extern \"C\" __global__ void __launch_bounds__({MAX_REDUCTION_BLOCK}) {entry}({}, dlbridge_Acc* _partial, long long _M, long long _J, int _contig, int _layout, long long _splits, long long _chunk) {{",
        by_value(&params).join(", ")
    ));
    let tail = "_partial, _M, _J, _layout, _splits, _chunk";
    src.line(&format!("  if (_contig) dlbridge_run<true>({}, {tail});", args.join(", ")));
    src.line(&format!("  else dlbridge_run<false>({}, {tail});", args.join(", ")));
    src.line("}");
    src.line("");
    src.line("// The second pass of a split reduction: a warp per output combines its pieces, in order.");
    src.line(&format!(
        "extern \"C\" __global__ void __launch_bounds__({MAX_REDUCTION_BLOCK}) {entry}_finish(const dlbridge_Acc* _partial, {}, long long _M, long long _J, long long _splits) {{",
        by_value(&out_params).join(", ")
    ));
    src.line("  const DlbRowGroup _g = dlb_row_group(1);");
    src.line("  for (long long _o = _g.first; _o < _M; _o += _g.step) {");
    src.line("    dlbridge_Acc _acc = dlbridge_none();");
    src.line("    for (long long _q = _g.tid; _q < _splits; _q += 32) _acc = dlbridge_merge(_acc, _partial[_o * _splits + _q]);");
    src.line("    _acc = dlbridge_warp_reduce(_acc);");
    src.line(&format!("    if (_g.tid == 0) dlbridge_post_map(_acc.v, {}, _o, _J, _M);", outs.join(", ")));
    src.line("  }");
    src.line("}");
    Ok(CudaSource::new(src, entry, spec, bind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvrtc_diagnostics_point_into_the_users_text_once() {
        let diag = "NVRTC could not compile kernel.cu (NVRTC_ERROR_COMPILATION, options []):\n\
                    operation(2): error: identifier \"q\" is undefined\n  z = t * q;\n          ^\n\n\
                    operation(2): error: identifier \"q\" is undefined\n  z = t * q;\n          ^\n\
                    dlbridge_generated.cu(300): warning: unused\n";
        let m = explain("ElementwiseKernel k (T=f32)", "NVRTC 13.0", diag, &[("operation", "float t = x;\nz = t * q;")]);
        assert!(m.starts_with("ElementwiseKernel k (T=f32): NVRTC 13.0 rejected the kernel\n"), "{m}");
        assert!(m.contains("\n  operation line 2: error: identifier \"q\" is undefined\n    z = t * q;\n            ^\n"), "{m}");
        assert_eq!(m.matches("operation line 2").count(), 1, "{m}");
        let m = explain("k", "NVRTC", "dlbridge_generated.cu(3): error: x\n", &[("operation", "z = x")]);
        assert!(m.contains("no diagnostic points into the kernel's own text"), "{m}");
    }
}

//! The CUDA backend: CUDA C generated from the same kernel specification as
//! the [CPU backend](crate::cpu), compiled with NVRTC, run on the call's
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
//! one block per output element (grid-stride over the outputs), each thread
//! folding the reduced elements `j ≡ threadIdx.x (mod blockDim.x)`, then a
//! shared-memory tree; the block size (a power of two from 32 to 512) and
//! so the order of the operations depend only on the shapes: a launch is
//! deterministic.
//!
//! # Differences from the CPU backend
//! * A raw index out of range is not an error (a kernel cannot report one
//!   without synchronising): reads give an unspecified value and writes go
//!   to a scratch word, never outside the array.
//! * complex dtypes are a Type error naming the dtype (NVRTC has no
//!   `std::complex`); f16 and bf16 are the CPU's `float16`/`bfloat16`
//!   (crate::halfs), converted bit by bit.
//! * At most 8 dims per operand after merging contiguous dims (8 per raw
//!   input, unmerged).
//!
//! # Diagnostics
//! As on the CPU: each piece of user text is preceded by `#line 1
//! "operation"` (or `"preamble"`, `"map_expr"`, ...), generated lines are
//! `dlbridge_generated.cu`, and NVRTC's `operation(2): error: ...` becomes
//! `operation line 2: error: ...` with the user's line.

use std::sync::Arc;

use dlbridge_core::{DType, Device, DeviceType, Error, ErrorKind, Result, TensorView};
use dlbridge_cuda::CudaDevice;
use dlbridge_cuda::generated::{Function, LaunchArg, Program};
use dlbridge_cuda::indexer::{Indexer, MAX_DIMS};
use dlbridge_cuda::launch::{self, Launch};
use dlbridge_registry::{Arg, Call, DynKernelFn, Impl};

use crate::codegen::{Backend, Head, Src, head, reduction_helpers};
use crate::params::{CPU_DTYPES, ElementwiseSpec, Param, ReductionSpec, Spec};
use crate::specialise::Specialisations;

/// The file name NVRTC's messages use for generated (non-user) lines.
pub const GENERATED_FILE: &str = "dlbridge_generated.cu";

/// The CUDA backend's head: the CUDA runtime.
pub(crate) const CUDA: Backend = Backend {
    label: " (CUDA)",
    file: GENERATED_FILE,
    ctype: cuda_ctype,
    runtime: |src| src.push(&crate::headers::expand("dlbridge_compile/cuda_runtime.cuh")),
};

/// The dtypes the CUDA backend supports: the CPU backend's but complex (NVRTC
/// has no `std::complex`).
pub const CUDA_DTYPES: &[DType] = CPU_DTYPES.split_at(CPU_DTYPES.len() - 2).0; // CPU_DTYPES ends with c64, c128

/// NVRTC options of every generated source (the architecture comes first, per device).
pub const OPTIONS: &[&str] = &["--std=c++17", "-default-device"];

/// Threads a block of a reduction, at most (the shared-memory tree holds one value per thread).
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
    #[cfg(feature = "internals")]
    pub fn ptx(&self, arch: &str) -> Result<Arc<str>> {
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
    crate::toolchain::finish_explanation(&mut msg, !seen.is_empty(), "NVRTC output", &lines);
    msg
}

/// `ptrdiff_t`, `size_t` and the `<stdint.h>` names, which NVRTC does not
/// provide without the toolkit's headers (every generated CUDA source starts so).
pub(crate) fn stdint_typedefs(src: &mut Src) {
    src.push(crate::headers::text("dlbridge_compile/nvrtc_stdint.cuh"));
}

/// The CUDA C of one specialisation of an elementwise kernel.
///
/// The function `dlbridge_<name>` takes, per tensor in call order (inputs,
/// then outputs), its element-0 pointer and a `DlbIndexer` (over the
/// broadcast shape for non-raw operands; a raw input's own shape and strides,
/// then `long long` size and `int` contiguous); then the `DlbIndexer` of the
/// broadcast shape, `long long` size and `int` "every operand contiguous".
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
    src.line("template <bool dlbridge_kContig>");
    src.line(&format!("__device__ __forceinline__ void dlbridge_run({}, const DlbIndexer& _indx, long long _size) {{", params.join(", ")));
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
    src.line("  for (ptrdiff_t i = static_cast<ptrdiff_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < _size;");
    src.line("       i += static_cast<ptrdiff_t>(gridDim.x) * blockDim.x) {");
    for (t, p) in all.iter().enumerate().filter(|(_, p)| !p.raw) {
        src.line(&format!("    {}{}& {} = _p{t}[dlbridge_kContig ? i : dlbridge_offset(_x{t}, i)];", qual(t), ctypes[t], p.name));
    }
    // As on the CPU: a top-level `break` or `continue` ends this element only.
    src.line("    do {");
    src.user("operation", &spec.operation, "; } while (0);");
    src.line("  }");
    if !spec.after_loop.is_empty() {
        src.user("after_loop", &spec.after_loop, ";");
    }
    src.line("}");
    src.line("");
    let entry = format!("dlbridge_{name}");
    let kparams: Vec<String> = params.iter().map(|p| p.replace("const DlbIndexer&", "DlbIndexer")).collect();
    src.line(&format!("extern \"C\" __global__ void {entry}({}, DlbIndexer _indx, long long _size, int _contig) {{", kparams.join(", ")));
    src.line(&format!("  if (_contig) dlbridge_run<true>({}, _indx, _size);", args.join(", ")));
    src.line(&format!("  else dlbridge_run<false>({}, _indx, _size);", args.join(", ")));
    src.line("}");
    Ok(CudaSource::new(src, entry, spec, bind))
}

/// The CUDA C of one specialisation of a reduction kernel.
///
/// The function `dlbridge_<name>` takes, per input, its element-0 pointer,
/// the `DlbIndexer` of its kept dims (over the outputs' shape) and of its
/// reduced dims; per output, its pointer and `DlbIndexer`; then `long long`
/// outputs `M`, `long long` reduced count `J`, `int` "every input's reduced
/// dims contiguous". Launched with one block (a power of two of threads,
/// 32..=[`MAX_REDUCTION_BLOCK`]) per output element, grid-stride.
pub fn reduction_source(spec: &ReductionSpec, bind: &[(char, DType)]) -> Result<CudaSource> {
    let Head { mut src, ctypes, .. } = head(&CUDA, spec, bind, "the reduction")?;
    let (name, n_in, n_out) = (&spec.name, spec.inputs.len(), spec.outputs.len());
    reduction_helpers(&mut src, spec, &ctypes, "__device__ __forceinline__", cuda_ctype, false)?;
    src.line("");
    let has_identity = spec.identity.is_some();
    let mut params = Vec::new();
    let mut args = Vec::new();
    for (t, ct) in ctypes.iter().enumerate().take(n_in) {
        params.push(format!("const {ct}* _p{t}, const DlbIndexer& _k{t}, const DlbIndexer& _r{t}"));
        args.push(format!("_p{t}, _k{t}, _r{t}"));
    }
    for m in 0..n_out {
        let t = n_in + m;
        params.push(format!("{}* _p{t}, const DlbIndexer& _k{t}", ctypes[t]));
        args.push(format!("_p{t}, _k{t}"));
    }
    src.line(&format!("constexpr unsigned dlbridge_kMaxBlock = {MAX_REDUCTION_BLOCK};"));
    src.line("template <bool dlbridge_kContig>");
    src.line(&format!("__device__ __forceinline__ void dlbridge_run({}, long long _M, long long _J) {{", params.join(", ")));
    src.line("  __shared__ __align__(16) unsigned char _sbuf[dlbridge_kMaxBlock * sizeof(_type_reduce)];");
    src.line("  _type_reduce* const _s = reinterpret_cast<_type_reduce*>(_sbuf);");
    // Without an identity a value may be missing: `_has` and `_sh` say which are there.
    let pick =
        |src: &mut Src, with: &[&str], without: &[&str]| (if has_identity { with } else { without }).iter().for_each(|l| src.line(l));
    pick(&mut src, &[], &["  __shared__ bool _sh[dlbridge_kMaxBlock];"]);
    src.line("  const unsigned _t = threadIdx.x;");
    src.line("  for (long long _o = blockIdx.x; _o < _M; _o += gridDim.x) {");
    for (t, ct) in ctypes.iter().enumerate().take(n_in) {
        src.line(&format!("    const {ct}* const _b{t} = _p{t} + dlbridge_offset(_k{t}, _o);"));
    }
    pick(&mut src, &["    _type_reduce _acc = dlbridge_identity();"], &["    _type_reduce _acc;", "    bool _has = false;"]);
    src.line("    for (long long _j = _t; _j < _J; _j += blockDim.x) {");
    let margs: Vec<String> = (0..n_in).map(|t| format!("_b{t}[dlbridge_kContig ? _j : dlbridge_offset(_r{t}, _j)]")).collect();
    src.line(&format!("      const _type_reduce _v = dlbridge_map({}, _o, _j, _J, _M);", margs.join(", ")));
    pick(
        &mut src,
        &["      _acc = dlbridge_reduce(_acc, _v);"],
        &["      _acc = _has ? dlbridge_reduce(_acc, _v) : _v;", "      _has = true;"],
    );
    src.line("    }");
    src.line("    _s[_t] = _acc;");
    pick(&mut src, &[], &["    _sh[_t] = _has;"]);
    src.line("    __syncthreads();");
    src.line("    for (unsigned _w = blockDim.x / 2; _w > 0; _w >>= 1) {");
    src.line("      if (_t < _w) {");
    pick(
        &mut src,
        &["        _s[_t] = dlbridge_reduce(_s[_t], _s[_t + _w]);"],
        &[
            "        if (_sh[_t + _w]) {",
            "          _s[_t] = _sh[_t] ? dlbridge_reduce(_s[_t], _s[_t + _w]) : _s[_t + _w];",
            "          _sh[_t] = true;",
            "        }",
        ],
    );
    src.line("      }");
    src.line("      __syncthreads();");
    src.line("    }");
    src.line("    if (_t == 0) {");
    let outs: Vec<String> = (0..n_out).map(|m| format!("_p{0}[dlbridge_offset(_k{0}, _o)]", n_in + m)).collect();
    src.line(&format!("      dlbridge_post_map(_s[0], {}, _o, _J, _M);", outs.join(", ")));
    src.line("    }");
    src.line("    __syncthreads();");
    src.line("  }");
    src.line("}");
    src.line("");
    let entry = format!("dlbridge_{name}");
    let kparams: Vec<String> = params.iter().map(|p| p.replace("const DlbIndexer&", "DlbIndexer")).collect();
    src.line(&format!(
        "extern \"C\" __global__ void __launch_bounds__({MAX_REDUCTION_BLOCK}) {entry}({}, long long _M, long long _J, int _contig) {{",
        kparams.join(", ")
    ));
    src.line(&format!("  if (_contig) dlbridge_run<true>({}, _M, _J);", args.join(", ")));
    src.line(&format!("  else dlbridge_run<false>({}, _M, _J);", args.join(", ")));
    src.line("}");
    Ok(CudaSource::new(src, entry, spec, bind))
}

// ---------------------------------------------------------------------------
// Host side: the registry implementation.
// ---------------------------------------------------------------------------

/// The specialisations of one kernel on CUDA, by dtypes and device ordinal.
pub(crate) type CudaSpecialisations = Specialisations<(Vec<DType>, usize)>;

/// How one kind of kernel from source is generated and launched on CUDA.
pub(crate) trait Launcher: Send + Sync {
    /// The CUDA C of the specialisation for `bind`.
    fn source(&self, bind: &[(char, DType)]) -> Result<CudaSource>;
    /// Launches a compiled specialisation on the call's tensors.
    fn run(&self, f: &Function, call: &mut Call<'_, '_>) -> Result<()>;
}

impl Launcher for ElementwiseSpec {
    fn source(&self, bind: &[(char, DType)]) -> Result<CudaSource> {
        elementwise_source(self, bind)
    }
    fn run(&self, f: &Function, call: &mut Call<'_, '_>) -> Result<()> {
        run_elementwise(self, f, call)
    }
}

impl Launcher for ReductionSpec {
    fn source(&self, bind: &[(char, DType)]) -> Result<CudaSource> {
        reduction_source(self, bind)
    }
    fn run(&self, f: &Function, call: &mut Call<'_, '_>) -> Result<()> {
        run_reduction(self, f, call)
    }
}

/// The `cuda` implementation of a kernel compiled from source: the
/// specialisation for the call's dtypes and device is generated, compiled and
/// loaded on first use (once, under its own lock), then launched on the
/// call's stream.
pub(crate) fn cuda_impl(
    kind: &'static str,
    name: String,
    vars: Vec<char>,
    launcher: Arc<dyn Launcher>,
    specs: Arc<CudaSpecialisations>,
) -> Impl {
    Impl::Dyn(Arc::new(move |call: &mut Call<'_, '_>| -> Result<()> {
        let name = name.as_str();
        let device = call_device(call).ok_or_else(|| Error::InvalidArgument(format!("{kind} {name}: no tensor argument")))?;
        dlbridge_cuda::probe::driver().map_err(|u| Error::UnsupportedDevice {
            got: device,
            what: format!("{kind} {name} on {device}: CUDA is not available here: {u}"),
        })?;
        let ordinal = usize::try_from(device.id).map_err(|_| Error::InvalidArgument(format!("{kind} {name}: device {device}")))?;
        let mut dtypes = Vec::with_capacity(vars.len());
        for (i, v) in vars.iter().enumerate() {
            dtypes.push(call.dtype(i).ok_or_else(|| Error::Runtime(format!("{name}: type variable {v} is not bound")))?);
        }
        let key = (dtypes, ordinal);
        let f = specs.get(&key, || {
            let bind: Vec<(char, DType)> = vars.iter().copied().zip(key.0.iter().copied()).collect();
            let source = launcher.source(&bind)?;
            let dev = CudaDevice::get(ordinal)?;
            let function = source.program().function(&dev, &source.entry).map_err(|e| source.explain(e))?;
            let launcher = launcher.clone();
            Ok(Arc::new(move |call: &mut Call<'_, '_>| launcher.run(&function, call)) as DynKernelFn)
        })?;
        f(call)
    }))
}

/// The device of the call's first tensor.
fn call_device(call: &mut Call<'_, '_>) -> Option<Device> {
    let (args, outs) = call.split();
    args.iter().find_map(|a| a.tensor_meta().map(|(_, _, d)| d)).or_else(|| outs.first().map(|o| o.device()))
}

/// One tensor of a call: pointer, shape, strides (elements), device.
pub(crate) struct Operand<'c> {
    pub(crate) ptr: u64,
    pub(crate) shape: &'c [i64],
    pub(crate) strides: &'c [i64],
    pub(crate) device: Device,
}

fn operand<'c>(v: &'c TensorView<'_>) -> Operand<'c> {
    Operand { ptr: v.data_ptr() as usize as u64, shape: v.shape(), strides: v.strides(), device: v.device() }
}

/// Every tensor of the call in signature order (arguments, then outputs).
pub(crate) fn operands<'c>(call: &'c mut Call<'_, '_>) -> Result<Vec<Operand<'c>>> {
    let bug = call.layout_bug();
    let (args, outs) = call.split();
    let mut ops = Vec::with_capacity(args.len() + outs.len());
    for a in args.iter_mut() {
        match a {
            Arg::Tensor(v) => ops.push(operand(v)),
            Arg::TensorMut(v) => {
                let ptr = v.data_ptr_mut() as usize as u64;
                let v = v.as_view();
                ops.push(Operand { ptr, ..operand(v) });
            }
            _ => return Err(bug),
        }
    }
    for o in outs.iter_mut() {
        let ptr = o.data_ptr_mut() as usize as u64;
        let v = o.as_view();
        ops.push(Operand { ptr, ..operand(v) });
    }
    Ok(ops)
}

fn shape_text(s: &[i64]) -> String {
    let t: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", t.join(", "))
}

/// All operands on the one CUDA device of the function.
pub(crate) fn check_devices(name: &str, names: &[&str], ops: &[Operand<'_>], f: &Function) -> Result<()> {
    for (o, n) in ops.iter().zip(names) {
        if o.device.kind != DeviceType::CUDA || o.device.id as usize != f.device().ordinal() {
            return Err(Error::UnsupportedDevice {
                got: o.device,
                what: format!("{name}: `{n}` is on {}, the kernel runs on cuda:{}", o.device, f.device().ordinal()),
            });
        }
    }
    Ok(())
}

/// The `DlbIndexer` of a shape without merging (for `_ind` and raw inputs):
/// more than 8 dims fold the leading ones into the first.
pub(crate) fn unmerged(shape: &[i64], strides: Option<&[i64]>) -> Indexer {
    let mut ix = Indexer::default();
    let nd = shape.len();
    let lead = nd.saturating_sub(MAX_DIMS);
    for d in 0..nd.min(MAX_DIMS) {
        let src = lead + d;
        ix.shape[d] = if d == 0 { shape[..=src].iter().product() } else { shape[src] };
        ix.strides[d] = strides.map_or(0, |s| s[src]);
    }
    ix.ndim = nd.min(MAX_DIMS) as i32;
    ix
}

/// The call's tensors (arguments, then outputs): as many as the kernel has
/// (`names`), on the device `f` was loaded for.
/// Returns, in call order, the parameters, their names and the operands.
#[allow(clippy::type_complexity)]
fn checked_operands<'s, 'c, S: Spec>(
    spec: &'s S,
    f: &Function,
    call: &'c mut Call<'_, '_>,
) -> Result<(Vec<&'s Param>, Vec<&'s str>, Vec<Operand<'c>>)> {
    let (name, (inputs, outputs)) = (spec.name(), spec.params());
    let all: Vec<&Param> = inputs.iter().chain(outputs).collect();
    let names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
    let ops = operands(call)?;
    if ops.len() != names.len() {
        return Err(Error::InvalidArgument(format!("{name}: called with {} tensors, expected {}", ops.len(), names.len())));
    }
    check_devices(name, &names, &ops, f)?;
    Ok((all, names, ops))
}

fn run_elementwise(spec: &ElementwiseSpec, f: &Function, call: &mut Call<'_, '_>) -> Result<()> {
    let (name, stream, n_in) = (spec.name.as_str(), call.stream(), spec.inputs.len());
    let (all, names, ops) = checked_operands(spec, f, call)?;
    // Broadcast the non-raw operands (as the CPU backend does, with its messages).
    let non_raw: Vec<usize> = (0..all.len()).filter(|&t| !all[t].raw).collect();
    let nd = non_raw.iter().map(|&t| ops[t].shape.len()).max().unwrap_or(0);
    let mut shape = vec![1i64; nd];
    for &t in &non_raw {
        let x = &ops[t];
        let lead = nd - x.shape.len();
        for (d, &s) in x.shape.iter().enumerate() {
            let b = &mut shape[lead + d];
            if s == *b || s == 1 {
                continue;
            }
            if *b == 1 {
                *b = s;
                continue;
            }
            return Err(Error::InvalidArgument(format!(
                "{name}: `{}` of shape {} does not broadcast with {}",
                names[t],
                shape_text(x.shape),
                shape_text(&shape)
            )));
        }
    }
    let size: i64 = shape.iter().product();
    let mut args = Vec::with_capacity(2 * all.len() + 3);
    let mut contiguous = true;
    for (t, x) in ops.iter().enumerate() {
        if all[t].raw {
            let n: i64 = x.shape.iter().product();
            if x.shape.len() > MAX_DIMS {
                return Err(Error::InvalidArgument(format!(
                    "{name}: raw argument `{}` has {} dims; the CUDA backend takes raw arguments of at most {MAX_DIMS} dims",
                    names[t],
                    x.shape.len()
                )));
            }
            let ix = unmerged(x.shape, Some(x.strides));
            let merged = Indexer::new(x.shape, x.strides)?;
            args.extend([
                LaunchArg::Ptr(x.ptr),
                LaunchArg::Indexer(ix),
                LaunchArg::I64(n),
                LaunchArg::I32(i32::from(merged.is_contiguous())),
            ]);
            continue;
        }
        let written = t >= n_in || all[t].mutable;
        if written && x.shape != shape.as_slice() {
            return Err(Error::InvalidArgument(format!(
                "{name}: `{}` has shape {}, but it is written and must have the broadcast shape {}",
                names[t],
                shape_text(x.shape),
                shape_text(&shape)
            )));
        }
        let lead = nd - x.shape.len();
        let strides: Vec<i64> = (0..nd).map(|d| if d < lead || x.shape[d - lead] == 1 { 0 } else { x.strides[d - lead] }).collect();
        let ix = Indexer::new(&shape, &strides).map_err(|e| e.context(format!("{name}: `{}`", names[t])))?;
        contiguous &= ix.is_contiguous();
        args.extend([LaunchArg::Ptr(x.ptr), LaunchArg::Indexer(ix)]);
    }
    let Some(cfg) = launch::elementwise(size as u64, f.device().sm_count()) else { return Ok(()) };
    args.extend([LaunchArg::Indexer(unmerged(&shape, None)), LaunchArg::I64(size), LaunchArg::I32(i32::from(contiguous))]);
    f.launch(cfg, stream, &args)
}

/// The block of a reduction over `j` elements: a power of two, 32..=512.
pub fn reduction_block(j: u64) -> u32 {
    j.clamp(32, u64::from(MAX_REDUCTION_BLOCK)).next_power_of_two().min(u64::from(MAX_REDUCTION_BLOCK)) as u32
}

fn run_reduction(spec: &ReductionSpec, f: &Function, call: &mut Call<'_, '_>) -> Result<()> {
    let (name, stream, n_in) = (spec.name.as_str(), call.stream(), spec.inputs.len());
    let (all, names, ops) = checked_operands(spec, f, call)?;
    let x = &ops[0];
    for k in 1..n_in {
        if ops[k].shape != x.shape {
            return Err(Error::InvalidArgument(format!(
                "{name}: input `{}` has shape {}, but `{}` has {}",
                names[k],
                shape_text(ops[k].shape),
                names[0],
                shape_text(x.shape)
            )));
        }
    }
    let ny = ops[n_in].shape.len();
    for m in 0..spec.outputs.len() {
        let o = &ops[n_in + m];
        if !(o.shape.len() == ny && ny <= x.shape.len() && o.shape == &x.shape[..ny]) {
            return Err(Error::InvalidArgument(format!(
                "{name}: output `{}` has shape {}; it must be the kept (leading) dims of the input shape {}, the reduced axes last",
                names[n_in + m],
                shape_text(o.shape),
                shape_text(x.shape)
            )));
        }
    }
    let (kept, red) = x.shape.split_at(ny);
    let m_count: i64 = kept.iter().product();
    let j_count: i64 = red.iter().product();
    if m_count == 0 {
        return Ok(());
    }
    if j_count == 0 && spec.identity.is_none() {
        return Err(Error::InvalidArgument(format!(
            "{name}: the reduction is over zero elements and the kernel has no identity to start from"
        )));
    }
    let mut args = Vec::with_capacity(3 * all.len() + 3);
    let mut contiguous = true;
    for (t, o) in ops.iter().enumerate() {
        let ctx = |e: Error| e.context(format!("{name}: `{}`", names[t]));
        let k = Indexer::new(kept, &o.strides[..ny]).map_err(ctx)?;
        args.extend([LaunchArg::Ptr(o.ptr), LaunchArg::Indexer(k)]);
        if t < n_in {
            let r = Indexer::new(red, &o.strides[ny..]).map_err(ctx)?;
            contiguous &= r.is_contiguous();
            args.push(LaunchArg::Indexer(r));
        }
    }
    args.extend([LaunchArg::I64(m_count), LaunchArg::I64(j_count), LaunchArg::I32(i32::from(contiguous))]);
    let fill = u64::from(f.device().sm_count()) * u64::from(launch::BLOCKS_PER_SM);
    let grid = (m_count as u64).min(fill).min(launch::MAX_GRID_X) as u32;
    let cfg = Launch { grid, block: reduction_block(j_count as u64), shared: 0 };
    f.launch(cfg, stream, &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduction_blocks_are_powers_of_two_up_to_512() {
        assert_eq!(reduction_block(0), 32);
        assert_eq!(reduction_block(1), 32);
        assert_eq!(reduction_block(33), 64);
        assert_eq!(reduction_block(512), 512);
        assert_eq!(reduction_block(1 << 40), 512);
    }

    #[test]
    fn unmerged_indexers_keep_the_shape_and_fold_beyond_eight_dims() {
        let ix = unmerged(&[2, 3], Some(&[1, 2]));
        assert_eq!((ix.ndim, &ix.shape[..2], &ix.strides[..2]), (2, &[2, 3][..], &[1, 2][..]));
        let ix = unmerged(&[2; 10], None);
        assert_eq!((ix.ndim, ix.shape[0], ix.shape[1]), (8, 8, 2));
    }

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

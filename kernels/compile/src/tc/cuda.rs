//! A definition on CUDA: CUDA C compiled with NVRTC, one `__global__`
//! function whose first argument picks the statement; each statement is one
//! launch on the call's stream (in order, so a statement sees the ones before
//! it), one thread per output element in a grid-stride loop, the reduction
//! indices looping inside the thread; a derived gradient's scatter runs a
//! thread per iteration, adding atomically (so the order of its additions,
//! and the last bits of a sum, may differ from run to run). Every access is checked against its
//! tensor's sizes on the host before anything is launched (a kernel cannot
//! report an error without synchronising).

use dlbridge_core::{DType, Error, Result};
use dlbridge_cuda::generated::{Function, LaunchArg};
use dlbridge_cuda::indexer::MAX_DIMS;
use dlbridge_cuda::launch;
use dlbridge_registry::Call;

use super::check::{Checked, TensorRef};
use super::contraction::Contraction;
use super::emit::{self, Names};
use super::{TcSpec, acc_ctype};
use crate::codegen::cuda::{CUDA, CudaSource};
use crate::codegen::{Head, head};
use crate::launch::{Launcher, check_devices, operands, unmerged};
use crate::spec::Spec;

/// The statement number that zeroes output `o` (`ZERO + o`).
const ZERO: i32 = 1 << 20;

/// The CUDA C of one specialisation.
pub fn source(spec: &TcSpec, bind: &[(char, DType)]) -> Result<CudaSource> {
    let Head { mut src, ctypes, .. } = head(&CUDA, spec, bind, "the statements")?;
    let c = &spec.checked;
    emit::helpers(&mut src, &emit::CUDA, acc_ctype(bind));
    let entry = format!("dlbridge_tc_{}", spec.name);
    let n = Names { c };
    let mut params = vec!["int stmt".to_owned()];
    let n_params = c.params.len();
    for (t, ct) in ctypes.iter().enumerate() {
        let r = if t < n_params { TensorRef::Param(t) } else { TensorRef::Output(t - n_params) };
        let qual = if t < n_params { "const " } else { "" };
        params.push(format!("{qual}{ct}* __restrict__ {}", n.tensor(r)));
        params.push(format!("DlbIndexer ix_{}", c.tensor_name(r)));
    }
    for (s, ..) in &c.symbols {
        params.push(format!("long long s_{s}"));
    }
    src.line(&format!("extern \"C\" __global__ void {entry}({}) {{", params.join(", ")));
    for t in 0..n_params + c.outputs.len() {
        let r = if t < n_params { TensorRef::Param(t) } else { TensorRef::Output(t - n_params) };
        for d in 0..c.rank(r) {
            let name = c.tensor_name(r);
            src.line(&format!("  const int64_t {} = ix_{name}.strides[{d}]; (void){};", n.stride(r, d), n.stride(r, d)));
            src.line(&format!("  const int64_t {} = ix_{name}.shape[{d}]; (void){};", n.shape(r, d), n.shape(r, d)));
        }
    }
    src.line("  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;");
    src.line("  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;");
    src.line("  switch (stmt) {");
    for (k, s) in c.stmts.iter().enumerate() {
        src.line(&format!("  case {k}: {{  // {}", emit::comment_text(&s.text)));
        emit::range_lines(&mut src, s, "    ");
        // A thread per output element; a gradient's scatter, a thread per iteration.
        let par = parallel_indices(s);
        let ext: Vec<String> = par.iter().map(|v| format!("(hi_{v} - lo_{v})")).collect();
        let count = if ext.is_empty() { "1".to_owned() } else { ext.join(" * ") };
        src.line(&format!("    const long long n_out = {count};"));
        src.line("    for (long long q = first; q < n_out; q += step) {");
        emit::unflatten(&mut src, par, "long long", "      ");
        emit::element(&mut src, &n, s, &ctypes, "      ", true);
        src.line("    }");
        src.line("    break;");
        src.line("  }");
    }
    for (o, out) in c.outputs.iter().enumerate() {
        let r = TensorRef::Output(o);
        let rank = out.dims.len();
        src.line(&format!("  case {}: {{  // zero {}", ZERO + o as i32, out.name));
        let count: Vec<String> = (0..rank).map(|d| n.shape(r, d)).collect();
        let count = if count.is_empty() { "1".to_owned() } else { count.join(" * ") };
        src.line(&format!("    for (long long q = first; q < {count}; q += step) {{"));
        src.line("      long long r = q, off = 0;");
        for d in (0..rank).rev() {
            src.line(&format!("      off += (r % {}) * {};", n.shape(r, d), n.stride(r, d)));
            src.line(&format!("      r /= {};", n.shape(r, d)));
        }
        src.line(&format!("      {}[off] = {}(0);", n.tensor(r), ctypes[n_params + o]));
        src.line("    }");
        src.line("    break;");
        src.line("  }");
    }
    src.line("  default: break;");
    src.line("  }");
    src.line("}");
    Ok(CudaSource::new(src, entry, spec, bind))
}

/// The indices a statement's threads take: its output's, or every index of a
/// gradient's scatter (each iteration adds atomically).
fn parallel_indices(s: &super::check::Statement) -> &[String] {
    if s.scatter.is_some() { &s.reduced } else { &s.lhs }
}

impl Launcher for TcSpec {
    fn source(&self, bind: &[(char, DType)]) -> Result<CudaSource> {
        source(self, bind)
    }
    fn run(&self, f: &[Function], call: &mut Call<'_, '_>) -> Result<()> {
        run(self, &f[0], call)
    }
}

fn run(spec: &TcSpec, f: &Function, call: &mut Call<'_, '_>) -> Result<()> {
    let c = &spec.checked;
    if let Some(plan) = &spec.contraction
        && !plan.gathers()
        && matches!(call.dtype(0), Some(DType::F32 | DType::F64))
        && cublas(spec, plan, f, call)?
    {
        return Ok(());
    }
    let stream = call.stream();
    let (inputs, outputs) = spec.params();
    let names: Vec<&str> = inputs.iter().chain(outputs).map(|p| p.name.as_str()).collect();
    let ops = operands(call)?;
    if ops.len() != names.len() {
        return Err(Error::InvalidArgument(format!("{}: called with {} tensors, expected {}", spec.name, ops.len(), names.len())));
    }
    check_devices(&spec.name, &names, &ops, f)?;
    let shapes: Vec<&[i64]> = ops.iter().map(|o| o.shape).collect();
    let plan = plan(c, &spec.name, &shapes)?;
    let mut args = vec![LaunchArg::I32(0)];
    for (o, name) in ops.iter().zip(&names) {
        if o.shape.len() > MAX_DIMS {
            return Err(Error::InvalidArgument(format!(
                "{}: `{name}` has {} dims; definitions on CUDA take tensors of at most {MAX_DIMS} dims",
                spec.name,
                o.shape.len()
            )));
        }
        args.push(LaunchArg::Ptr(o.ptr));
        args.push(LaunchArg::Indexer(unmerged(o.shape, Some(o.strides))));
    }
    for v in &plan.symbols {
        args.push(LaunchArg::I64(*v));
    }
    let sms = f.device().sm_count();
    for (stmt, count) in plan.launches {
        let Some(cfg) = launch::elementwise(count, sms) else { continue };
        args[0] = LaunchArg::I32(stmt);
        f.launch(cfg, stream, &args)?;
    }
    Ok(())
}

/// A contraction through cuBLAS (as the built-in `matmul` on CUDA), one
/// GEMM per batch element on the call's stream; `Ok(false)` when the
/// operands' layouts do not merge or cuBLAS cannot read them (then the
/// generated loops run).
fn cublas(spec: &TcSpec, plan: &Contraction, f: &Function, call: &mut Call<'_, '_>) -> Result<bool> {
    let stream = call.stream();
    {
        let (inputs, outputs) = spec.params();
        let names: Vec<&str> = inputs.iter().chain(outputs).map(|p| p.name.as_str()).collect();
        let ops = operands(call)?;
        check_devices(&spec.name, &names, &ops, f)?;
    }
    let (ins, mut outs) = call.io();
    let (x, y) = (ins.tensor(&plan.x)?, ins.tensor(&plan.y)?);
    let o = outs.take(&plan.out)?;
    let Some(p) = plan.plan((x.shape(), x.strides()), (y.shape(), y.strides()), (o.shape(), o.strides())) else { return Ok(false) };
    let layout = |k: usize, (rows, cols): (i64, i64)| dlbridge_cuda::matmul::Layout { batch: &p.batch_strides[k], rows, cols };
    let (la, lb, lc) = (layout(0, p.a), layout(1, p.b), layout(2, p.c));
    dlbridge_cuda::matmul::strided_gemm(&p.batch, (p.m, p.n, p.k), x, la, y, lb, o, lc, stream)
}

/// What one call runs: the size symbols' values and, in order, each launch
/// (statement number, elements).
pub(crate) struct Plan {
    pub(crate) symbols: Vec<i64>,
    pub(crate) launches: Vec<(i32, u64)>,
}

/// The symbols' values from the tensors' shapes, every access checked
/// against its tensor's sizes over this call's index ranges, and the
/// launches.
pub(crate) fn plan(c: &Checked, name: &str, shapes: &[&[i64]]) -> Result<Plan> {
    let symbols: Vec<i64> = c.symbols.iter().map(|(_, p, d)| shapes[*p][*d]).collect();
    let sym = |s: &str| c.symbols.iter().position(|(n, ..)| n == s).map(|i| symbols[i]);
    let zero = emit::zero_before(c);
    let mut launches = Vec::new();
    let n_params = c.params.len();
    for (k, s) in c.stmts.iter().enumerate() {
        let mut ranges = std::collections::BTreeMap::new();
        for (v, (lo, hi)) in &s.ranges {
            let (Some(lo), Some(hi)) = (lo.eval(&sym), hi.eval(&sym)) else {
                return Err(Error::InvalidArgument(format!("{name}: in `{}`: the range of `{v}` overflows", s.text)));
            };
            ranges.insert(v.clone(), (lo, hi));
        }
        let live = |vars: &[String]| vars.iter().all(|v| ranges[v].1 > ranges[v].0);
        let live_out = live(&s.lhs);
        let live_all = live_out && live(&s.reduced);
        for (ai, a) in s.accesses.iter().enumerate() {
            let is_lhs = ai + 1 == s.accesses.len() && s.scatter.is_none();
            if !(if is_lhs { live_out } else { live_all }) {
                continue;
            }
            let t = match a.tensor {
                TensorRef::Param(i) => i,
                TensorRef::Output(i) => n_params + i,
            };
            for (d, ix) in a.index.iter().enumerate() {
                let k0 = ix.konst.eval(&sym).unwrap_or(0);
                let (mut mn, mut mx) = (k0, k0);
                for (v, coef) in &ix.vars {
                    let (lo, hi) = ranges[v];
                    let (a, b) = (coef * lo, coef * (hi - 1));
                    mn += a.min(b);
                    mx += a.max(b);
                }
                let size = shapes[t][d];
                if mn < 0 || mx >= size {
                    let at = if mn < 0 { mn } else { mx };
                    return Err(Error::InvalidArgument(format!(
                        "{name}: in `{}`: {} reaches index {at} along dim {d}, which has size {size}",
                        s.text, a.text
                    )));
                }
            }
        }
        if zero[k] {
            let n: i64 = shapes[n_params + s.out].iter().product();
            launches.push((ZERO + s.out as i32, n as u64));
        }
        if live_out && (s.scatter.is_none() || live_all) {
            let n: i64 = parallel_indices(s).iter().map(|v| ranges[v].1 - ranges[v].0).product();
            launches.push((k as i32, n as u64));
        }
    }
    Ok(Plan { symbols, launches })
}

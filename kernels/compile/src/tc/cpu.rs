//! The CPU emitter: C++ for the system compiler, one plugin per dtype, or a
//! GEMM (`contraction.rs`) for a definition that is one contraction.
//!
//! Each statement's output indices are split into chunks over dlbridge's
//! threads; its reduction indices run inside, accumulating into a local (f32
//! for f16/bf16 tensors) that the compiler vectorises (`omp simd` reduction)
//! over the innermost one; statements over the same indices are fused, and a
//! reduction along a unit-stride row runs a row at a time.

use dlbridge_core::{DType, Result};
use dlbridge_registry::DynKernelFn;

use super::check::Affine;
use super::check::{Checked, Statement, TensorRef};
use super::emit::{
    self, Names, acc_type, combine, comment_text, element, range_lines, reduction, statement_checks, statement_prologue, zero_before,
};
use super::parse::Op;
use super::{TcSpec, acc_ctype, contraction};
use crate::builder::specialise::build_library;
use crate::codegen::cpu::{entry_epilogue, entry_prologue, plugin_table};
use crate::codegen::{Backend, Head, Src, head};

/// The CPU backend's head for a definition.
const CPU: Backend = Backend {
    label: "",
    file: crate::codegen::cpu::GENERATED_FILE,
    ctype: crate::params::cpu_ctype,
    runtime: |src| {
        src.line(&format!("#define DLBRIDGE_PARALLEL_MIN {}", crate::codegen::cpu::PARALLEL_THRESHOLD));
        src.push(&crate::codegen::headers::expand("dlbridge_compile/cpu_runtime.h"));
    },
    marked: true,
};

/// Elements of a row the row-at-a-time reduction accumulates at once.
const ROW_TILE: usize = 128;

/// The complete C++ source of one specialisation.
pub fn cpp_source(spec: &TcSpec, bind: &[(char, DType)]) -> Result<String> {
    let Head { mut src, signature, all, ctypes } = head(&CPU, spec, bind, "the statements")?;
    let c = &spec.checked;
    crate::codegen::OPEN_GENERATED.lines().for_each(|l| src.line(l));
    emit::helpers(&mut src, &emit::CPU, acc_ctype(bind));
    src.push(CHECK_CPP);
    src.line("");
    entry_prologue(&mut src, &spec.name, &all, bind)?;
    src.line("    (void)kTypes;");
    emit::tensor_locals(&mut src, &emit::Names { c }, &ctypes, "    ");
    cpu_statements(&mut src, c, &ctypes);
    entry_epilogue(&mut src);
    let doc = format!("tc.define: {}", crate::codegen::summary(&c.stmts.iter().map(|s| s.text.as_str()).collect::<Vec<_>>().join("; ")));
    plugin_table(&mut src, &spec.name, &signature, "0", &doc);
    Ok(src.text)
}

pub(super) fn build(spec: &TcSpec, bind: &[(char, DType)]) -> Result<DynKernelFn> {
    if let Some(f) = contraction::cpu_kernel(spec, bind)? {
        return Ok(f);
    }
    build_library(spec, bind, &cpp_source(spec, bind)?)
}

/// The CPU code of every statement, in order, inside the entry point.
fn cpu_statements(src: &mut Src, c: &Checked, ctypes: &[String]) {
    let n = Names { c };
    let zero = zero_before(c);
    let mut skip = 0;
    for (k, s) in c.stmts.iter().enumerate() {
        if skip > 0 {
            skip -= 1;
            continue;
        }
        let group = fusible(c, k, &zero);
        if group > 1 {
            fused(src, &n, &c.stmts[k..k + group], k, ctypes, zero[k]);
            skip = group - 1;
            continue;
        }
        src.line(&format!("    // statement {}: {}", k + 1, comment_text(&s.text)));
        src.line("    {");
        statement_prologue(src, &n, s);
        let out = TensorRef::Output(s.out);
        // An output whose first statement leaves some elements unwritten
        // (an index range not starting at 0) is zero there.
        if zero[k] {
            zero_fill(src, &n, out);
        }
        src.line("    if (live_out) {");
        let lhs = &s.lhs;
        let ext = |v: &String| format!("(hi_{v} - lo_{v})");
        let work: Vec<String> = s.reduced.iter().map(ext).collect();
        let work = if work.is_empty() { "1".to_owned() } else { work.join(" * ") };
        if lhs.is_empty() {
            src.line("      const bool dlbridge_tc_live = live_all; (void)dlbridge_tc_live;");
            element(src, &n, s, ctypes, "      ", false);
        } else {
            // Chunks over the outer output indices; the last one is a loop of its own.
            let (outer, inner) = if lhs.len() == 1 { (&lhs[..], None) } else { (&lhs[..lhs.len() - 1], lhs.last()) };
            let count: Vec<String> = outer.iter().map(ext).collect();
            src.line(&format!("      const ptrdiff_t n_outer = {};", count.join(" * ")));
            let inner_ext = inner.map_or("1".to_owned(), ext);
            parallel_outer(src, outer, &format!("{inner_ext} * {work}"));
            match inner {
                Some(v) if row_mode(s) => unit_stride_versions(src, &n, std::slice::from_ref(s), v, &mut |src| row(src, &n, s, ctypes, v)),
                Some(v) => {
                    let simd = simd_ok(s);
                    unit_stride_versions(src, &n, std::slice::from_ref(s), v, &mut |src| {
                        if simd {
                            src.line("          DLBRIDGE_TC_SIMD_PLAIN");
                        }
                        src.line(&format!("          for (int64_t v_{v} = lo_{v}; v_{v} < hi_{v}; ++v_{v}) {{"));
                        element(src, &n, s, ctypes, "            ", false);
                        src.line("          }");
                    });
                }
                None => element(src, &n, s, ctypes, "          ", false),
            }
            src.line("        }");
            src.line("      });");
        }
        src.line("    }");
        src.line("    }");
    }
}

/// The innermost loop (over `v`) twice: where every stride that `v`
/// multiplies is 1 (contiguous tensors), with those strides the constant 1,
/// so the compiler vectorises with plain loads; else as it is.
fn unit_stride_versions(src: &mut Src, n: &Names<'_>, stmts: &[Statement], v: &str, body: &mut dyn FnMut(&mut Src)) {
    let mut strides: Vec<String> = Vec::new();
    for a in stmts.iter().flat_map(|s| &s.accesses) {
        for (d, ix) in a.index.iter().enumerate() {
            let st = n.stride(a.tensor, d);
            if ix.vars.contains_key(v) && !strides.contains(&st) {
                strides.push(st);
            }
        }
    }
    if strides.is_empty() {
        body(src);
        return;
    }
    let cond: Vec<String> = strides.iter().map(|st| format!("{st} == 1")).collect();
    src.line(&format!("          if ({}) {{", cond.join(" && ")));
    let ones: Vec<String> = strides.iter().map(|st| format!("{st} = 1")).collect();
    src.line(&format!("          const int64_t {};", ones.join(", ")));
    body(src);
    src.line("          } else {");
    body(src);
    src.line("          }");
}

/// How many statements from `k` on run in one loop nest, element by
/// element: consecutive `=` statements over the same output indices and
/// ranges, where every read of an output any of them writes is of the
/// element being computed (so no element depends on another's order).
fn fusible(c: &Checked, k: usize, zero: &[bool]) -> usize {
    let first = &c.stmts[k];
    let plain_elementwise = |s: &Statement| s.op == Op::Assign && s.scatter.is_none() && s.reduced.is_empty() && !s.lhs.is_empty();
    if !plain_elementwise(first) {
        return 1;
    }
    let mut end = k + 1;
    while end < c.stmts.len() {
        let s = &c.stmts[end];
        if !plain_elementwise(s) || zero[end] || s.lhs != first.lhs || s.lhs.iter().any(|v| s.ranges[v] != first.ranges[v]) {
            break;
        }
        end += 1;
    }
    // Shrink until every read of a written output is of the own element.
    while end > k + 1 {
        let group = &c.stmts[k..end];
        let written: Vec<TensorRef> = group.iter().map(|s| TensorRef::Output(s.out)).collect();
        let own = |a: &super::check::Access| {
            a.index.len() == first.lhs.len()
                && a.index
                    .iter()
                    .zip(&first.lhs)
                    .all(|(ix, v)| ix.konst == Default::default() && ix.vars.len() == 1 && ix.vars.get(v) == Some(&1))
        };
        if group.iter().all(|s| s.accesses.iter().filter(|a| written.contains(&a.tensor)).all(own)) {
            return end - k;
        }
        end -= 1;
    }
    1
}

/// Statements [`fusible`] found, in one loop nest: per element, each
/// statement in order.
fn fused(src: &mut Src, n: &Names<'_>, group: &[Statement], k: usize, ctypes: &[String], zero_first: bool) {
    let first = &group[0];
    for (j, s) in group.iter().enumerate() {
        src.line(&format!("    // statement {} (fused): {}", k + j + 1, comment_text(&s.text)));
    }
    src.line("    {");
    range_lines(src, first, "    ");
    for s in group {
        src.line("    {");
        statement_checks(src, n, s);
        src.line("    }");
    }
    if zero_first {
        zero_fill(src, n, TensorRef::Output(first.out));
    }
    let lhs = &first.lhs;
    let ext = |v: &String| format!("(hi_{v} - lo_{v})");
    src.line(&format!("    if ({}) {{", lhs.iter().map(|v| format!("hi_{v} > lo_{v}")).collect::<Vec<_>>().join(" && ")));
    let (outer, inner) = if lhs.len() == 1 { (&lhs[..], None) } else { (&lhs[..lhs.len() - 1], lhs.last()) };
    let count: Vec<String> = outer.iter().map(ext).collect();
    src.line(&format!("      const ptrdiff_t n_outer = {};", count.join(" * ")));
    let inner_ext = inner.map_or("1".to_owned(), ext);
    parallel_outer(src, outer, &format!("{inner_ext} * {}", group.len()));
    match inner {
        Some(v) => unit_stride_versions(src, n, group, v, &mut |src| {
            src.line("          DLBRIDGE_TC_SIMD_PLAIN");
            src.line(&format!("          for (int64_t v_{v} = lo_{v}; v_{v} < hi_{v}; ++v_{v}) {{"));
            for s in group {
                element(src, n, s, ctypes, "            ", false);
            }
            src.line("          }");
        }),
        None => {
            for s in group {
                element(src, n, s, ctypes, "          ", false);
            }
        }
    }
    src.line("        }");
    src.line("      });");
    src.line("    }");
    src.line("    }");
}

/// Whether a reduction runs a row of outputs at a time (the reduction loops
/// outside, the last output index inside, vectorised over it) rather than
/// one output element at a time (the reduction innermost): when the last
/// output index is at least as often the last index of the accesses (the
/// contiguous one, in row-major tensors) as the last reduction index is.
/// A convolution's `w` and a matmul's `j` are; a row sum's reduced `d` is.
fn row_mode(s: &Statement) -> bool {
    let (Some(v), Some(r)) = (s.lhs.last(), s.reduced.last()) else { return false };
    if s.op == Op::Assign || s.scatter.is_some() || s.lhs.len() < 2 {
        return false;
    }
    let last_has = |var: &String| s.accesses.iter().filter(|a| a.index.last().is_some_and(|ix| ix.vars.get(var) == Some(&1))).count();
    last_has(v) >= last_has(r)
}

/// Whether an elementwise statement's innermost loop may run its iterations
/// in SIMD lanes: it reads the output it writes only at the element it
/// writes, so no iteration reads what another writes.
fn simd_ok(s: &Statement) -> bool {
    if s.op != Op::Assign || s.scatter.is_some() {
        return false;
    }
    let written = s.accesses.last().map(|a| a.tensor);
    let at_own = |a: &super::check::Access| {
        a.index.iter().zip(&s.lhs).all(|(ix, v)| ix.konst == Default::default() && ix.vars.len() == 1 && ix.vars.get(v) == Some(&1))
            && a.index.len() == s.lhs.len()
    };
    s.accesses.iter().filter(|a| Some(a.tensor) == written).all(at_own)
}

/// A row of a reduction's outputs (the last output index `v`, in tiles):
/// accumulators for the tile, the reduction loops outside, the tile's
/// elements inside (one SIMD loop per reduction point).
fn row(src: &mut Src, n: &Names<'_>, s: &Statement, ctypes: &[String], v: &str) {
    let out = TensorRef::Output(s.out);
    let out_ct = &ctypes[n.c.params.len() + s.out];
    let lhs_index: Vec<Affine> =
        s.lhs.iter().map(|x| Affine { vars: std::collections::BTreeMap::from([(x.clone(), 1)]), konst: Default::default() }).collect();
    let place = format!("{}[{}]", n.tensor(out), n.offset(out, &lhs_index));
    let acc_ty = acc_type(n, s, ctypes);
    let (identity, _) = reduction(s.op, &acc_ty);
    let start = if s.init { identity } else { format!("static_cast<{acc_ty}>({place})") };
    let value = n.expr(&s.rhs);
    src.line(&format!("          for (int64_t w0 = lo_{v}; w0 < hi_{v}; w0 += {ROW_TILE}) {{"));
    src.line(&format!("            const int64_t w1 = w0 + {ROW_TILE} < hi_{v} ? w0 + {ROW_TILE} : hi_{v};"));
    src.line(&format!("            {acc_ty} acc[{ROW_TILE}];"));
    src.line(&format!("            for (int64_t v_{v} = w0; v_{v} < w1; ++v_{v}) acc[v_{v} - w0] = {start};"));
    let mut ind = "            ".to_owned();
    for r in &s.reduced {
        src.line(&format!("{ind}for (int64_t v_{r} = lo_{r}; v_{r} < hi_{r}; ++v_{r}) {{"));
        ind.push_str("  ");
    }
    src.line(&format!("{ind}DLBRIDGE_TC_SIMD_PLAIN"));
    src.line(&format!("{ind}for (int64_t v_{v} = w0; v_{v} < w1; ++v_{v}) {{"));
    src.line(&format!("{ind}  {acc_ty}& a = acc[v_{v} - w0];"));
    src.line(&format!("{ind}  a = {};", combine(s.op, "a", &format!("static_cast<{acc_ty}>({value})"))));
    src.line(&format!("{ind}}}"));
    for _ in &s.reduced {
        ind.truncate(ind.len() - 2);
        src.line(&format!("{ind}}}"));
    }
    src.line(&format!("            for (int64_t v_{v} = w0; v_{v} < w1; ++v_{v}) {place} = static_cast<{out_ct}>(acc[v_{v} - w0]);"));
    src.line("          }");
}

/// Opens the parallel loop over the outer output indices `outer` (chunks of
/// their flattened range on dlbridge's threads, each element's indices
/// decoded from its flat index), `cost` the work per element; the caller
/// closes it with `}` and `});`.
fn parallel_outer(src: &mut Src, outer: &[String], cost: &str) {
    src.line(&format!("      const ptrdiff_t cost = {cost};"));
    src.line("      dlbridge::detail::parallel_chunks(n_outer, dlbridge::detail::chunks_for(n_outer, cost), [&](int, ptrdiff_t b, ptrdiff_t e) {");
    src.line("        for (ptrdiff_t q = b; q < e; ++q) {");
    emit::unflatten(src, outer, "ptrdiff_t", "          ");
}

fn zero_fill(src: &mut Src, n: &Names<'_>, out: TensorRef) {
    let rank = n.c.rank(out);
    let mut ind = "    ".to_owned();
    src.line(&format!("{ind}{{"));
    for d in 0..rank {
        src.line(&format!("{ind}  for (int64_t z{d} = 0; z{d} < {}; ++z{d}) {{", n.shape(out, d)));
        ind.push_str("  ");
    }
    let off: Vec<String> = (0..rank).map(|d| format!("z{d} * {}", n.stride(out, d))).collect();
    let off = if off.is_empty() { "0".to_owned() } else { off.join(" + ") };
    let elem = format!("{}[{off}]", n.tensor(out));
    src.line(&format!("{ind}  {elem} = decltype(+{elem})(0);"));
    for _ in 0..rank {
        src.line(&format!("{ind}}}"));
        ind.truncate(ind.len() - 2);
    }
    src.line(&format!("{ind}}}"));
}

/// The check every access makes before its statement runs.
const CHECK_CPP: &str = r#"[[noreturn]] inline void dlbridge_tc_oob(const char* kernel, const char* stmt, const char* access, int d, int64_t at, int64_t size) {
  char buf[768];
  (void)kernel;  // the host names the kernel
  std::snprintf(buf, sizeof buf, "in `%s`: %s reaches index %lld along dim %d, which has size %lld",
                stmt, access, static_cast<long long>(at), d, static_cast<long long>(size));
  throw std::runtime_error(buf);
}
inline void dlbridge_tc_check(const char* kernel, const char* stmt, const char* access, int d, int64_t lo, int64_t hi, int64_t size) {
  if (lo < 0) dlbridge_tc_oob(kernel, stmt, access, d, lo, size);
  if (hi >= size) dlbridge_tc_oob(kernel, stmt, access, d, hi, size);
}
inline void dlbridge_tc_strides(const DLTensor* t, int64_t* s) {
  if (t->strides != nullptr) {
    for (int d = 0; d < t->ndim; ++d) s[d] = t->strides[d];
    return;
  }
  int64_t acc = 1;
  for (int d = t->ndim - 1; d >= 0; --d) {
    s[d] = acc;
    acc *= t->shape[d];
  }
}
#if defined(_OPENMP) || defined(DLBRIDGE_LIBMVEC)
#define DLBRIDGE_TC_PRAGMA(x) _Pragma(#x)
#define DLBRIDGE_TC_SIMD(op, acc) DLBRIDGE_TC_PRAGMA(omp simd reduction(op : acc))
#define DLBRIDGE_TC_SIMD_PLAIN DLBRIDGE_TC_PRAGMA(omp simd)
#else
#define DLBRIDGE_TC_SIMD(op, acc)
#define DLBRIDGE_TC_SIMD_PLAIN
#endif
"#;

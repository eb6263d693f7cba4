//! A definition that is one contraction of two tensors — `O(...) +=! X(...) *
//! Y(...)` with plain indices (matmul, batch matmul, tensordot, a fully
//! connected layer), or with one operand read through affine indices (a
//! convolution's `I(n, c, h + kh, w + kw)`, gathered first into a dense
//! tensor indexed by its indices: im2col) — runs as GEMMs (the `gemm` crate, as the built-in
//! `matmul`): its indices split into batch (in O, X and Y), M (O and X), N
//! (O and Y) and K (X and Y) groups; each of M, N, K is merged into one
//! dim per operand when the operand's strides allow (row-major within the
//! group, in the output's order for M and N, X's for K), which transposes
//! cost nothing: `W1(n, m)` in a fully connected layer is read through its
//! strides. A call whose layouts do not merge, or whose dtype gemm does not
//! take (f16, bf16), runs the generated loops instead.

use std::sync::{Arc, Mutex};

use dlbridge_array::Array;
use dlbridge_core::{DType, Error, Result};
use dlbridge_cpu::{GemmScalar, Layout, strided_gemm};
use dlbridge_registry::{Arg, Call, DynKernelFn, Kernel, Registry};

use super::TcSpec;
use super::check::{Checked, TensorRef};
use super::parse::{Bin, ElemType, Expr, Op};
use super::size::Size;

/// The roles of a contraction's indices.
#[derive(Debug, Clone)]
pub(crate) struct Contraction {
    pub(crate) out: String,
    pub(crate) x: String,
    pub(crate) y: String,
    /// Each operand's indices, dim by dim.
    x_vars: Vec<String>,
    y_vars: Vec<String>,
    out_vars: Vec<String>,
    batch: Vec<String>,
    m: Vec<String>,
    n: Vec<String>,
    k: Vec<String>,
    /// The definition that gathers the operand read with affine indices
    /// (`I(n, c, h + kh, w + kw)`) into a dense tensor indexed by its indices
    /// (`x_vars` or `y_vars`), and which operand it is.
    gather: Option<(Side, String)>,
}

/// An operand of the contraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    X,
    Y,
}

fn plain_vars(args: &[Expr], symbols: &[String]) -> Option<Vec<String>> {
    let vars: Vec<String> = args
        .iter()
        .map(|a| match a {
            Expr::Name(v, _) if !symbols.contains(v) => Some(v.clone()),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let mut seen = vars.clone();
    seen.sort();
    seen.dedup();
    (seen.len() == vars.len()).then_some(vars)
}

/// The index names an expression uses (sizes too; the caller drops them).
fn index_names(e: &Expr, out: &mut Vec<String>) {
    match e {
        Expr::Name(n, _) => out.push(n.clone()),
        Expr::Unary(_, a) => index_names(a, out),
        Expr::Binary(_, a, b) => {
            index_names(a, out);
            index_names(b, out);
        }
        _ => {}
    }
}

/// TC's name of a parameter's type.
fn type_name(ty: ElemType) -> &'static str {
    match ty {
        ElemType::Float => "float",
        ElemType::Fixed(d) => match d {
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            _ => "bool",
        },
    }
}

/// The definition that gathers `tensor(args)` into `G(vars)` over the
/// statement's ranges (each from 0); `None` where a range does not start at
/// 0 or its bound is not expressible in a `where` clause.
fn gather_text(
    c: &Checked,
    tensor: &str,
    args: &[Expr],
    vars: &[String],
    ranges: &std::collections::BTreeMap<String, (Size, Size)>,
) -> Option<String> {
    let name = |s: &str| s.to_owned();
    let params: Vec<String> = c
        .params
        .iter()
        .map(|p| {
            let dims: Vec<String> = p.dims.iter().map(|d| d.text(&name)).collect();
            if dims.is_empty() {
                format!("{} {}", type_name(p.ty), p.name)
            } else {
                format!("{}({}) {}", type_name(p.ty), dims.join(", "), p.name)
            }
        })
        .collect();
    let mut wheres = Vec::new();
    for v in vars {
        let (lo, hi) = ranges.get(v)?;
        if *lo != Size::c(0) || hi.text(&name).contains("min(") || hi.text(&name).contains("max(") {
            return None;
        }
        wheres.push(format!("{v} in 0:{}", hi.text(&name)));
    }
    let index: Vec<String> = args.iter().map(Expr::text).collect();
    Some(format!(
        "def gather({}) -> (dlbridge_gathered) {{\n  dlbridge_gathered({}) = {tensor}({}) where {}\n}}",
        params.join(", "),
        vars.join(", "),
        index.join(", "),
        wheres.join(", ")
    ))
}

impl Contraction {
    /// The contraction `c` is, if it is one.
    pub(crate) fn of(c: &Checked) -> Option<Contraction> {
        let [s] = &c.stmts[..] else { return None };
        if s.op != Op::Add || !s.init || s.scatter.is_some() {
            return None;
        }
        let symbols: Vec<String> = c.symbols.iter().map(|(s, ..)| s.clone()).collect();
        let Expr::Binary(Bin::Mul, a, b) = &s.rhs else { return None };
        let (Expr::Call(x, xa, _), Expr::Call(y, ya, _)) = (&**a, &**b) else { return None };
        let param = |n: &str| c.params.iter().position(|p| p.name == n && p.ty == ElemType::Float);
        let (px, py) = (param(x)?, param(y)?);
        let (xp, yp) = (plain_vars(xa, &symbols), plain_vars(ya, &symbols));
        let gathered = match (&xp, &yp) {
            (Some(_), Some(_)) => None,
            (None, Some(_)) => Some(Side::X),
            (Some(_), None) => Some(Side::Y),
            (None, None) => return None,
        };
        // The indices each access uses (all of them, for an affine one).
        let uses = |args: &[Expr]| -> Vec<String> {
            let mut out: Vec<String> = Vec::new();
            for a in args {
                let mut names = Vec::new();
                index_names(a, &mut names);
                for n in names {
                    if !symbols.contains(&n) && !out.contains(&n) {
                        out.push(n);
                    }
                }
            }
            out
        };
        let (x_used, y_used) = (xp.clone().unwrap_or_else(|| uses(xa)), yp.clone().unwrap_or_else(|| uses(ya)));
        let out_vars = s.lhs.clone();
        let (mut batch, mut m, mut n, mut k) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for v in s.lhs.iter().chain(&s.reduced) {
            let (o, ix, iy) = (out_vars.contains(v), x_used.contains(v), y_used.contains(v));
            match (o, ix, iy) {
                (true, true, true) => batch.push(v.clone()),
                (true, true, false) => m.push(v.clone()),
                (true, false, true) => n.push(v.clone()),
                (false, true, true) => k.push(v.clone()),
                _ => return None,
            }
        }
        // Every index runs over whole dims (no `where` narrowing it, no two
        // sizes meeting in one index).
        let full = |t: TensorRef, vars: &[String]| {
            vars.iter().enumerate().all(|(d, v)| s.ranges.get(v).is_some_and(|(lo, hi)| *lo == Size::c(0) && *hi == c.dim(t, d)))
        };
        if xp.as_ref().is_some_and(|v| !full(TensorRef::Param(px), v))
            || yp.as_ref().is_some_and(|v| !full(TensorRef::Param(py), v))
            || !full(TensorRef::Output(s.out), &out_vars)
        {
            return None;
        }
        // K in the plain operand's order (X's when both are plain); a gathered
        // operand is laid out [batch, K, M or N] to match.
        let order_of = |vars: &[String], v: &String| vars.iter().position(|x| x == v);
        match (&xp, &yp) {
            (Some(xv), _) => k.sort_by_key(|v| order_of(xv, v)),
            (None, Some(yv)) => k.sort_by_key(|v| order_of(yv, v)),
            (None, None) => return None,
        }
        // A gathered operand's layout: batch, its free indices that come
        // before the other operand's in the output (a convolution's `n`,
        // looped over as a batch: one image's block stays together), the
        // reduced ones, then the rest of its free ones.
        let gathered_layout = |side: Side| -> Vec<String> {
            let (free, other) = if side == Side::X { (&m, &n) } else { (&n, &m) };
            let first_other = other.iter().filter_map(|v| out_vars.iter().position(|o| o == v)).min().unwrap_or(usize::MAX);
            let before = |v: &&String| out_vars.iter().position(|o| o == *v).is_some_and(|p| p < first_other);
            let lead: Vec<String> = free.iter().filter(before).cloned().collect();
            let tail: Vec<String> = free.iter().filter(|v| !before(v)).cloned().collect();
            batch.iter().chain(&lead).chain(&k).chain(&tail).cloned().collect()
        };
        let gather = gathered.map(|side| -> Option<(Side, String)> {
            let (tensor, args) = if side == Side::X { (x, xa) } else { (y, ya) };
            Some((side, gather_text(c, tensor, args, &gathered_layout(side), &s.ranges)?))
        });
        let gather = match gather {
            Some(Some(g)) => Some(g),
            Some(None) => return None,
            None => None,
        };
        let layout = |side: Side, plain: Option<Vec<String>>| match plain {
            Some(v) => v,
            None => gathered_layout(side),
        };
        let (x_vars, y_vars) = (layout(Side::X, xp), layout(Side::Y, yp));
        Some(Contraction {
            out: c.outputs[s.out].name.clone(),
            x: x.clone(),
            y: y.clone(),
            x_vars,
            y_vars,
            out_vars,
            batch,
            m,
            n,
            k,
            gather,
        })
    }
}

/// The (extent, stride) of index group `group` in an operand indexed by
/// `vars` with `shape` and `strides`, merged into one dim; `None` when the
/// strides do not allow it. Indices of extent 1 drop out.
fn merged(group: &[String], vars: &[String], shape: &[i64], strides: &[i64]) -> Option<(i64, i64)> {
    let mut dims: Vec<(i64, i64)> = Vec::new();
    for v in group {
        let d = vars.iter().position(|x| x == v)?;
        if shape[d] != 1 {
            dims.push((shape[d], strides[d]));
        }
    }
    let Some(&(_, stride)) = dims.last() else { return Some((1, 0)) };
    // Each dim's stride is the next one's times its extent (row-major).
    for w in dims.windows(2) {
        let ((_, s_out), (e_in, s_in)) = (w[0], w[1]);
        if s_out != s_in * e_in {
            return None;
        }
    }
    let extent = dims.iter().map(|(e, _)| e).product();
    Some((extent, stride))
}

impl Contraction {
    /// Runs the call as GEMMs (after gathering an operand read with affine
    /// indices); `Ok(false)` when its layouts do not merge.
    fn run<T: dlbridge_core::Element + GemmScalar>(
        &self,
        call: &mut Call<'_, '_>,
        gather: Option<&Kernel>,
        params: &[String],
        scratch: &Mutex<Option<Array>>,
    ) -> Result<bool> {
        let (ins, mut outs) = call.io();
        let mut gathered = None;
        if let Some(g) = gather {
            let mut args: Vec<Arg<'_>> = params.iter().map(|p| ins.tensor(p).map(|v| Arg::Tensor(v.clone()))).collect::<Result<_>>()?;
            let spec = g.prepare_outputs(&args)?;
            // The last call's buffer when it fits (the gather writes all of it),
            // else a new one; a concurrent call makes its own.
            let kept = scratch.lock().ok().and_then(|mut s| s.take());
            let mut dense = match kept {
                Some(a) if a.shape() == &spec[0].shape[..] && a.dtype() == spec[0].dtype => a,
                _ => Array::zeros(spec[0].dtype, &spec[0].shape)?,
            };
            g.call(&mut args, &mut [dense.view_mut()?])?;
            gathered = Some(dense);
        }
        let side = self.gather.as_ref().map(|(s, _)| *s);
        let gx = gathered.as_ref().filter(|_| side == Some(Side::X)).map(Array::view);
        let gy = gathered.as_ref().filter(|_| side == Some(Side::Y)).map(Array::view);
        let x = match &gx {
            Some(v) => v,
            None => ins.tensor(&self.x)?,
        };
        let y = match &gy {
            Some(v) => v,
            None => ins.tensor(&self.y)?,
        };
        let o = outs.take(&self.out)?;
        let Some(p) = self.plan((x.shape(), x.strides()), (y.shape(), y.strides()), (o.shape(), o.strides())) else { return Ok(false) };
        let la = Layout { batch: &p.batch_strides[0], rows: p.a.0, cols: p.a.1 };
        let lb = Layout { batch: &p.batch_strides[1], rows: p.b.0, cols: p.b.1 };
        let lc = Layout { batch: &p.batch_strides[2], rows: p.c.0, cols: p.c.1 };
        let dims = (p.m as usize, p.n as usize, p.k as usize);
        strided_gemm::<T>(&p.batch, dims, x, la, y, lb, o, lc)?;
        if let (Some(dense), Ok(mut slot)) = (gathered, scratch.lock()) {
            *slot = Some(dense);
        }
        Ok(true)
    }

    /// The GEMMs of operands with these (shape, strides): `None` when a group
    /// does not merge in an operand it indexes, or the contraction is empty.
    pub(crate) fn plan(&self, x: (&[i64], &[i64]), y: (&[i64], &[i64]), o: (&[i64], &[i64])) -> Option<GemmPlan> {
        // A free group that does not merge gives up its outermost index to
        // the batch (a loop), until it merges or has one left.
        let (mut batch, mut m, mut n) = (self.batch.clone(), self.m.clone(), self.n.clone());
        loop {
            match self.try_plan(&batch, &m, &n, x, y, o) {
                Ok(p) => return p,
                Err(0) if m.len() > 1 => batch.push(m.remove(0)),
                Err(1) if n.len() > 1 => batch.push(n.remove(0)),
                Err(_) => return None,
            }
        }
    }

    /// The plan with these groups; `Err(g)` when group `g` (0 M, 1 N, 2 K)
    /// does not merge in an operand it indexes.
    #[allow(clippy::type_complexity)]
    fn try_plan(
        &self,
        batch_vars: &[String],
        m_vars: &[String],
        n_vars: &[String],
        x: (&[i64], &[i64]),
        y: (&[i64], &[i64]),
        o: (&[i64], &[i64]),
    ) -> std::result::Result<Option<GemmPlan>, usize> {
        let ops = [(&self.x_vars, x), (&self.y_vars, y), (&self.out_vars, o)];
        let mut groups = [[(1i64, 0i64); 3]; 3];
        for (gi, g) in [m_vars, n_vars, &self.k].into_iter().enumerate() {
            for (oi, (vars, (shape, strides))) in ops.iter().enumerate() {
                if g.iter().all(|v| vars.contains(v)) {
                    groups[gi][oi] = merged(g, vars, shape, strides).ok_or(gi)?;
                }
            }
        }
        let [gm, gn, gk] = groups;
        let (m, n, k) = (gm[2].0, gn[2].0, gk[0].0);
        if k == 0 {
            return Ok(None); // the loops write the identity
        }
        let stride_of = |vars: &[String], strides: &[i64], v: &String| vars.iter().position(|x| x == v).map_or(0, |d| strides[d]);
        let extent = |v: &String| match self.out_vars.iter().position(|x| x == v) {
            Some(d) => o.0[d],
            None => self.x_vars.iter().position(|x| x == v).map_or(1, |d| x.0[d]),
        };
        let batch: Vec<i64> = batch_vars.iter().map(extent).collect();
        let batch_strides = [
            batch_vars.iter().map(|v| stride_of(&self.x_vars, x.1, v)).collect(),
            batch_vars.iter().map(|v| stride_of(&self.y_vars, y.1, v)).collect(),
            batch_vars.iter().map(|v| stride_of(&self.out_vars, o.1, v)).collect(),
        ];
        Ok(Some(GemmPlan { batch, batch_strides, m, n, k, a: (gm[0].1, gk[0].1), b: (gk[1].1, gn[1].1), c: (gm[2].1, gn[2].1) }))
    }

    /// Whether an operand is gathered first (then the GPU runs the loops).
    pub(crate) fn gathers(&self) -> bool {
        self.gather.is_some()
    }
}

/// The GEMMs of one call: `c[β] = a[β] · b[β]` for every batch index β.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GemmPlan {
    /// Batch extents, and each operand's (a, b, c) strides over them.
    pub(crate) batch: Vec<i64>,
    pub(crate) batch_strides: [Vec<i64>; 3],
    pub(crate) m: i64,
    pub(crate) n: i64,
    pub(crate) k: i64,
    /// (row stride, column stride) of a (m x k), b (k x n) and c (m x n).
    pub(crate) a: (i64, i64),
    pub(crate) b: (i64, i64),
    pub(crate) c: (i64, i64),
}

/// The GEMM kernel of a contraction for `bind` (the generated loops where a
/// call's layouts do not merge), `None` for any other definition or dtype.
pub(crate) fn cpu_kernel(spec: &TcSpec, bind: &[(char, DType)]) -> Result<Option<DynKernelFn>> {
    let Some(plan) = spec.contraction.clone() else { return Ok(None) };
    let dtype = bind.iter().find(|(v, _)| *v == 'T').map(|(_, d)| *d);
    if !matches!(dtype, Some(DType::F32 | DType::F64)) {
        return Ok(None);
    }
    // The gather is a definition of its own, in a registry of its own.
    let gather = match &plan.gather {
        Some((_, text)) => {
            let registry = Registry::new();
            let mut defs = super::define_named(text, &|_| format!("{}_gather", spec.name))?;
            Some((defs.remove(0).register(&registry)?, registry))
        }
        None => None,
    };
    let params: Vec<String> = spec.checked.params.iter().map(|p| p.name.clone()).collect();
    let loops: Arc<Mutex<Option<DynKernelFn>>> = Arc::default();
    let scratch: Mutex<Option<Array>> = Mutex::new(None);
    let (spec, bind) = (spec.clone(), bind.to_vec());
    Ok(Some(Arc::new(move |call: &mut Call<'_, '_>| -> Result<()> {
        let g = gather.as_ref().map(|(k, _)| &**k);
        let done = match dtype {
            Some(DType::F64) => plan.run::<f64>(call, g, &params, &scratch)?,
            _ => plan.run::<f32>(call, g, &params, &scratch)?,
        };
        if done {
            return Ok(());
        }
        let f = {
            let mut slot = loops.lock().map_err(|_| Error::Runtime(format!("{}: a thread panicked while compiling", spec.name)))?;
            match &*slot {
                Some(f) => f.clone(),
                None => {
                    let f = crate::builder::specialise::build_library(&spec, &bind, &super::cpp_source(&spec, &bind)?)?;
                    *slot = Some(f.clone());
                    f
                }
            }
        };
        f(call)
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn a_convolution_gathers_its_input_and_loops_over_images() {
        let text =
            "def conv(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) { O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * W1(m, c, kh, kw) }";
        let c = super::super::check::check(&super::super::parse::parse(text).unwrap()[0], text).unwrap();
        let k = Contraction::of(&c).unwrap();
        let (side, gather) = k.gather.clone().unwrap();
        assert_eq!(side, Side::X);
        assert!(gather.contains("dlbridge_gathered(n, c, kh, kw, h, w) = I(n, c, h + kh, w + kw)"), "{gather}");
        // N=2, C=3, OH=4, OW=5, KH=KW=3, M=6: the gathered [2, 3, 3, 3, 4, 5], W1 [6, 3, 3, 3], O [2, 6, 4, 5].
        let g = ([2, 3, 3, 3, 4, 5], [540, 180, 60, 20, 5, 1]);
        let w = ([6, 3, 3, 3], [27, 9, 3, 1]);
        let o = ([2, 6, 4, 5], [120, 20, 5, 1]);
        let p = k.plan((&g.0, &g.1), (&w.0, &w.1), (&o.0, &o.1)).unwrap();
        assert_eq!((p.batch.clone(), p.m, p.n, p.k), (vec![2], 20, 6, 27));
        assert_eq!(p.batch_strides, [vec![540], vec![0], vec![120]]);
        assert_eq!((p.a, p.b, p.c), ((1, 20), (1, 27), (1, 20)));
    }

    #[test]
    fn groups_merge_where_strides_are_row_major() {
        // O(b, m1, m2): m1, m2 merge in a contiguous [2, 3, 4].
        assert_eq!(merged(&s(&["m1", "m2"]), &s(&["b", "m1", "m2"]), &[2, 3, 4], &[12, 4, 1]), Some((12, 1)));
        // Transposed: they do not.
        assert_eq!(merged(&s(&["m1", "m2"]), &s(&["b", "m2", "m1"]), &[2, 4, 3], &[12, 3, 1]), None);
        // A size-1 dim drops out; an empty group is one element.
        assert_eq!(merged(&s(&["a", "c"]), &s(&["a", "c"]), &[1, 5], &[99, 2]), Some((5, 2)));
        assert_eq!(merged(&[], &s(&["a"]), &[5], &[1]), Some((1, 0)));
    }
}

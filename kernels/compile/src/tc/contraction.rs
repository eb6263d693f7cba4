//! A definition that is one contraction of two tensors — `O(...) +=! X(...) *
//! Y(...)` with plain indices (matmul, batch matmul, tensordot, a fully
//! connected layer) — runs as GEMMs (the `gemm` crate, as the built-in
//! `matmul`): its indices split into batch (in O, X and Y), M (O and X), N
//! (O and Y) and K (X and Y) groups; each of M, N, K is merged into one
//! dim per operand when the operand's strides allow (row-major within the
//! group, in the output's order for M and N, X's for K), which transposes
//! cost nothing: `W1(n, m)` in a fully connected layer is read through its
//! strides. A call whose layouts do not merge, or whose dtype gemm does not
//! take (f16, bf16), runs the generated loops instead.

use std::sync::{Arc, Mutex};

use dlbridge_core::{DType, Error, Result};
use dlbridge_cpu::{GemmScalar, Layout, strided_gemm};
use dlbridge_registry::{Call, DynKernelFn};

use super::TcSpec;
use super::check::{Checked, TensorRef};
use super::parse::{Bin, ElemType, Expr, Op};
use super::size::Size;

/// The roles of a contraction's indices.
#[derive(Debug, Clone)]
pub(crate) struct Contraction {
    out: String,
    x: String,
    y: String,
    /// Each operand's indices, dim by dim.
    x_vars: Vec<String>,
    y_vars: Vec<String>,
    out_vars: Vec<String>,
    batch: Vec<String>,
    m: Vec<String>,
    n: Vec<String>,
    k: Vec<String>,
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
        let (x_vars, y_vars) = (plain_vars(xa, &symbols)?, plain_vars(ya, &symbols)?);
        let out_vars = s.lhs.clone();
        let (mut batch, mut m, mut n, mut k) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for v in s.lhs.iter().chain(&s.reduced) {
            let (o, ix, iy) = (out_vars.contains(v), x_vars.contains(v), y_vars.contains(v));
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
        if !full(TensorRef::Param(px), &x_vars) || !full(TensorRef::Param(py), &y_vars) || !full(TensorRef::Output(s.out), &out_vars) {
            return None;
        }
        // K in X's order.
        k.sort_by_key(|v| x_vars.iter().position(|x| x == v));
        Some(Contraction { out: c.outputs[s.out].name.clone(), x: x.clone(), y: y.clone(), x_vars, y_vars, out_vars, batch, m, n, k })
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
    /// Runs the call as GEMMs; `Ok(false)` when its layouts do not merge.
    fn run<T: dlbridge_core::Element + GemmScalar>(&self, call: &mut Call<'_, '_>) -> Result<bool> {
        let (ins, mut outs) = call.io();
        let (x, y) = (ins.tensor(&self.x)?, ins.tensor(&self.y)?);
        let o = outs.take(&self.out)?;
        let (o_shape, o_strides) = (o.shape().to_vec(), o.strides().to_vec());
        let group = |g: &[String]| -> Option<[(i64, i64); 3]> {
            Some([
                merged(g, &self.x_vars, x.shape(), x.strides()).unwrap_or((1, 0)),
                merged(g, &self.y_vars, y.shape(), y.strides()).unwrap_or((1, 0)),
                merged(g, &self.out_vars, &o_shape, &o_strides).unwrap_or((1, 0)),
            ])
        };
        // Each group must merge in every operand it indexes.
        let ok = |g: &[String], vars: &[String], shape: &[i64], strides: &[i64]| {
            !g.iter().all(|v| vars.contains(v)) || merged(g, vars, shape, strides).is_some()
        };
        for g in [&self.m, &self.n, &self.k] {
            if !ok(g, &self.x_vars, x.shape(), x.strides())
                || !ok(g, &self.y_vars, y.shape(), y.strides())
                || !ok(g, &self.out_vars, &o_shape, &o_strides)
            {
                return Ok(false);
            }
        }
        let (Some(gm), Some(gn), Some(gk)) = (group(&self.m), group(&self.n), group(&self.k)) else { return Ok(false) };
        let (m, n, k) = (gm[2].0, gn[2].0, gk[0].0);
        if k == 0 {
            return Ok(false); // the loops write the identity
        }
        let stride_of = |vars: &[String], strides: &[i64], v: &String| vars.iter().position(|x| x == v).map_or(0, |d| strides[d]);
        let batch: Vec<i64> = self.batch.iter().map(|v| o_shape[self.out_vars.iter().position(|x| x == v).unwrap_or(0)]).collect();
        let bx: Vec<i64> = self.batch.iter().map(|v| stride_of(&self.x_vars, x.strides(), v)).collect();
        let by: Vec<i64> = self.batch.iter().map(|v| stride_of(&self.y_vars, y.strides(), v)).collect();
        let bo: Vec<i64> = self.batch.iter().map(|v| stride_of(&self.out_vars, &o_strides, v)).collect();
        let dims = (m as usize, n as usize, k as usize);
        let la = Layout { batch: &bx, rows: gm[0].1, cols: gk[0].1 };
        let lb = Layout { batch: &by, rows: gk[1].1, cols: gn[1].1 };
        let lc = Layout { batch: &bo, rows: gm[2].1, cols: gn[2].1 };
        strided_gemm::<T>(&batch, dims, x, la, y, lb, o, lc)?;
        Ok(true)
    }
}

/// The GEMM kernel of a contraction for `bind` (the generated loops where a
/// call's layouts do not merge), `None` for any other definition or dtype.
pub(crate) fn cpu_kernel(spec: &TcSpec, bind: &[(char, DType)]) -> Result<Option<DynKernelFn>> {
    let Some(plan) = Contraction::of(&spec.checked) else { return Ok(None) };
    let dtype = bind.iter().find(|(v, _)| *v == 'T').map(|(_, d)| *d);
    if !matches!(dtype, Some(DType::F32 | DType::F64)) {
        return Ok(None);
    }
    let loops: Arc<Mutex<Option<DynKernelFn>>> = Arc::default();
    let (spec, bind) = (spec.clone(), bind.to_vec());
    Ok(Some(Arc::new(move |call: &mut Call<'_, '_>| -> Result<()> {
        let done = match dtype {
            Some(DType::F64) => plan.run::<f64>(call)?,
            _ => plan.run::<f32>(call)?,
        };
        if done {
            return Ok(());
        }
        let f = {
            let mut slot = loops.lock().map_err(|_| Error::Runtime(format!("{}: a thread panicked while compiling", spec.name)))?;
            match &*slot {
                Some(f) => f.clone(),
                None => {
                    let f = crate::specialise::build_library(&spec, &bind, &super::cpp_source(&spec, &bind)?)?;
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

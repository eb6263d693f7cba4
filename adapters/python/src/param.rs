//! `dlbridge.Param`: one input or output of a kernel's signature, for introspection.

use dlbridge_registry::signature::ParamKind;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// One dim of a `dlbridge.Param`: a fixed size, a symbol (`M`) or a group (`...B`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ParamDim {
    Fixed(i64),
    Named(String),
}

/// An input or output of a kernel's signature, as `Kernel.params` and
/// `Kernel.outputs` list them.
#[pyclass(name = "Param", module = "dlbridge", frozen, eq, hash)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyParam {
    name: String,
    tensor: bool,
    dtype: String,
    dtypes: Vec<String>,
    dims: Option<Vec<ParamDim>>,
    mutable: bool,
    text: String,
}

impl PyParam {
    pub(crate) fn of(sig: &dlbridge_registry::Signature, p: &dlbridge_registry::signature::Param) -> PyParam {
        use dlbridge_registry::signature::{DTypeRef, Dim};
        match &p.kind {
            ParamKind::Scalar(s) => {
                let s = s.to_string();
                PyParam {
                    name: p.name.clone(),
                    tensor: false,
                    dtype: s.clone(),
                    dtypes: vec![s.clone()],
                    dims: None,
                    mutable: false,
                    text: s,
                }
            }
            ParamKind::Tensor(t) => {
                let (dtype, dtypes) = match t.dtype {
                    DTypeRef::Concrete(d) => (d.to_string(), vec![d.to_string()]),
                    DTypeRef::Var(i) => {
                        let tv = &sig.type_vars[i];
                        (tv.name.clone(), tv.allowed.iter().map(|d| d.to_string()).collect())
                    }
                };
                let dims = t
                    .dims
                    .iter()
                    .map(|d| match *d {
                        Dim::Fixed(n) => ParamDim::Fixed(n),
                        Dim::Sym(i) => ParamDim::Named(sig.symbols[i].clone()),
                        Dim::Rest(i) => ParamDim::Named(sig.fmt_rest(i)),
                        Dim::Expr(i) => ParamDim::Named(sig.fmt_expr(i)),
                    })
                    .collect();
                let text = format!("{}{dtype}{}", if t.mutable { "mut " } else { "" }, sig.fmt_dims(&t.dims));
                PyParam { name: p.name.clone(), tensor: true, dtype, dtypes, dims: Some(dims), mutable: t.mutable, text }
            }
        }
    }
}

#[pymethods]
impl PyParam {
    /// Its name in the signature.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }
    /// `"tensor"` or `"scalar"`.
    #[getter]
    fn kind(&self) -> &'static str {
        if self.tensor { "tensor" } else { "scalar" }
    }
    /// A tensor's dtype as written: a concrete dtype (`f32`) or a type
    /// variable (`T`, see `dtypes`); a scalar's type (`f64`, `i64`, `bool`).
    #[getter]
    fn dtype(&self) -> &str {
        &self.dtype
    }
    /// The dtypes it accepts: the type variable's allowed set, or the one dtype.
    #[getter]
    fn dtypes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.dtypes)
    }
    /// A tensor's dims as written, `int` for a fixed size and `str` for a
    /// symbol (`"M"`) or a group of any number of dims (`"...B"`); None for a scalar.
    #[getter]
    fn dims<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(dims) = &self.dims else { return Ok(None) };
        let items: Vec<Bound<'py, PyAny>> = dims
            .iter()
            .map(|d| match d {
                ParamDim::Fixed(n) => pyo3::types::PyInt::new(py, *n).into_any(),
                ParamDim::Named(s) => pyo3::types::PyString::new(py, s).into_any(),
            })
            .collect();
        PyTuple::new(py, items).map(Some)
    }
    /// Whether the kernel writes this input in place (`mut`).
    #[getter]
    fn mutable(&self) -> bool {
        self.mutable
    }
    /// The type as the signature writes it: `T[M, K]`, `mut f32[N]`, `f64`.
    #[getter]
    fn annotation(&self) -> &str {
        &self.text
    }

    /// `name: type`, as in the signature.
    fn __str__(&self) -> String {
        format!("{}: {}", self.name, self.text)
    }

    fn __repr__(&self) -> String {
        let quoted = |v: &[String]| v.iter().map(|s| format!("'{s}'")).collect::<Vec<_>>();
        let dtypes = quoted(&self.dtypes);
        let dims = match &self.dims {
            None => "None".to_owned(),
            Some(d) => {
                let parts: Vec<String> = d
                    .iter()
                    .map(|d| match d {
                        ParamDim::Fixed(n) => n.to_string(),
                        ParamDim::Named(s) => format!("'{s}'"),
                    })
                    .collect();
                if parts.len() == 1 { format!("({},)", parts[0]) } else { format!("({})", parts.join(", ")) }
            }
        };
        format!(
            "dlbridge.Param(name='{}', kind='{}', dtype='{}', dtypes=({}{}), dims={dims}, mutable={})",
            self.name,
            self.kind(),
            self.dtype,
            dtypes.join(", "),
            if dtypes.len() == 1 { "," } else { "" },
            if self.mutable { "True" } else { "False" }
        )
    }
}

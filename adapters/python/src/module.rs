//! The `dlbridge._dlbridge` module: its functions and classes (no unsafe code).

use crate::errors::IntoPy;
use crate::{PyArray, PyKernel, import};
use pyo3::prelude::*;

/// Makes calls whose first tensor argument is an `array_type` (a type, or a
/// `"module.Name"` string looked up only once that module is imported) return
/// that framework's arrays: `allocate(shape, dtype, device)` returns a new,
/// writable, row-major array (`dtype` NumPy's name where it has one,
/// `device` a DLPack `(device_type, device_id)` pair), or None for a
/// `dlbridge.Array`; `finish(array)` makes what the caller gets from what the
/// kernel wrote (for immutable arrays: a zero-copy import); `stream(device)`
/// returns the framework's current CUDA stream, which the kernel runs on.
/// The latest registration for a type (or a base class) wins.
#[pyfunction]
#[pyo3(signature = (array_type, allocate=None, *, finish=None, stream=None))]
fn register_allocator(
    array_type: &Bound<'_, PyAny>,
    allocate: Option<Bound<'_, PyAny>>,
    finish: Option<Bound<'_, PyAny>>,
    stream: Option<Bound<'_, PyAny>>,
) -> PyResult<()> {
    crate::frameworks::register(array_type, allocate, finish, stream)
}

/// A new writable array in `like`'s framework, on its device (before the
/// framework's `finish`: see `_hand_over`), for `kernel`'s `output`; memory
/// that overlaps any of `inputs` (name, array) is refused.
#[pyfunction]
fn _empty_like<'py>(
    like: &Bound<'py, PyAny>,
    shape: Vec<i64>,
    dtype: &str,
    kernel: &str,
    output: &str,
    inputs: Vec<(String, Bound<'py, PyAny>)>,
) -> PyResult<Bound<'py, PyAny>> {
    crate::alloc::empty_like(like, shape, dtype, kernel, output, &inputs)
}

/// What a caller in `like`'s framework gets for `out`, made by `_empty_like`.
#[pyfunction]
fn _hand_over<'py>(like: &Bound<'py, PyAny>, out: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    crate::alloc::hand_over(like, out)
}

/// The address of dlbridge's XLA FFI handler for `platform` (`"cpu"` or
/// `"cuda"`), for `jax.ffi.register_ffi_target` (see `dlbridge.jax`).
#[pyfunction]
fn xla_ffi_handler(platform: &str) -> PyResult<usize> {
    let platform = match platform {
        "cpu" => dlbridge_xla::Platform::Cpu,
        "cuda" => dlbridge_xla::Platform::Cuda,
        other => return Err(pyo3::exceptions::PyValueError::new_err(format!("xla_ffi_handler: no platform {other:?} (cpu or cuda)"))),
    };
    // The registry the handler looks kernels up in holds the built-ins.
    dlbridge::registry();
    Ok(dlbridge_xla::handler(platform) as usize)
}

/// Every registered kernel, sorted by name.
#[pyfunction]
fn list_kernels() -> Vec<PyKernel> {
    dlbridge::registry().list().into_iter().map(PyKernel::new).collect()
}

/// The kernel registered under `name` (KeyError if there is none).
#[pyfunction]
fn get_kernel(name: &str) -> PyResult<PyKernel> {
    dlbridge::get_kernel(name).map(PyKernel::new).py_err()
}

/// A loaded plugin library, as `load_plugin` returns it.
#[pyclass(name = "Plugin", module = "dlbridge", frozen)]
#[derive(Debug)]
struct PyPlugin {
    /// The plugin's name.
    #[pyo3(get)]
    name: String,
    /// The plugin's version.
    #[pyo3(get)]
    version: String,
    /// The plugin ABI version it was built for.
    #[pyo3(get)]
    abi: u32,
    /// Canonical path of the library.
    #[pyo3(get)]
    path: String,
    kernels: Vec<Py<PyKernel>>,
    kernel_names: Vec<String>,
}

#[pymethods]
impl PyPlugin {
    /// Its kernels, as registered (a kernel the plugin adds a device to is the
    /// whole kernel, with every device).
    #[getter]
    fn kernels(&self, py: Python<'_>) -> Vec<Py<PyKernel>> {
        self.kernels.iter().map(|k| k.clone_ref(py)).collect()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let names: Vec<String> = self.kernel_names.iter().map(|k| format!("'{k}'")).collect();
        let path = pyo3::types::PyString::new(py, &self.path).repr().map(|r| r.to_string()).unwrap_or_default();
        format!(
            "dlbridge.Plugin(name='{}', version='{}', abi={}, path={path}, kernels=[{}])",
            self.name,
            self.version,
            self.abi,
            names.join(", ")
        )
    }
}

/// Loads a plugin shared library (once: loading it again returns the same
/// description); its kernels are then in `list_kernels` / `get_kernel`.
#[pyfunction]
fn load_plugin(py: Python<'_>, path: std::path::PathBuf) -> PyResult<PyPlugin> {
    let info = dlbridge::load_plugin(&path).py_err()?;
    let (mut kernels, mut kernel_names) = (Vec::with_capacity(info.kernels.len()), Vec::with_capacity(info.kernels.len()));
    for k in &info.kernels {
        let name = dlbridge::Signature::parse(&k.signature).map(|s| s.name).py_err()?;
        if !kernel_names.contains(&name) {
            kernels.push(Py::new(py, PyKernel::new(dlbridge::get_kernel(&name).py_err()?))?);
            kernel_names.push(name);
        }
    }
    let path = info.path.to_string_lossy().into_owned();
    Ok(PyPlugin { name: info.name, version: info.version, abi: info.abi_version, path, kernels, kernel_names })
}

/// `from_dlpack(x, /, *, device=None, copy=None)`: any DLPack producer (or
/// capsule) as a `dlbridge.Array` (host or CUDA memory), as the array API
/// standard defines it: zero copy unless `copy=True` (always a new, writable
/// array) or `device` is elsewhere (a copy); `copy=False` never copies and
/// raises ValueError where only a copy would work.
#[pyfunction]
#[pyo3(signature = (x, /, *, device=None, copy=None))]
fn from_dlpack(x: &Bound<'_, PyAny>, device: Option<&Bound<'_, PyAny>>, copy: Option<bool>) -> PyResult<PyArray> {
    import::from_dlpack(x, device, copy).map(PyArray::new)
}

/// Wraps a buffer-protocol object (bytes, bytearray, memoryview, array.array,
/// NumPy) as a `dlbridge.Array`, zero copy; read-only buffers stay read-only.
#[pyfunction]
fn asarray(obj: &Bound<'_, PyAny>) -> PyResult<PyArray> {
    import::buffer_to_array(obj).map(PyArray::new)
}

/// A shape argument: an int or a sequence of ints. More than `MAX_NDIM` dims
/// and dims that do not fit in 64 bits are ValueErrors, before any is converted
/// or anything allocated (negative dims are refused by `Array::zeros`).
fn shape_arg(shape: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
    use pyo3::types::{PyInt, PyString};
    const MAX_NDIM: usize = dlbridge::core::layout::MAX_NDIM;
    if shape.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err("shape must be an int or a sequence of ints, not str"));
    }
    let dims: Vec<Bound<'_, PyAny>> = if shape.is_instance_of::<PyInt>() { vec![shape.clone()] } else { shape.extract()? };
    if dims.len() > MAX_NDIM {
        return Err(PyValueError::new_err(format!("shape has {} dims; dlbridge's limit is {MAX_NDIM}", dims.len())));
    }
    dims.iter()
        .enumerate()
        .map(|(d, n)| {
            n.extract::<i64>().map_err(|e| {
                if e.is_instance_of::<PyOverflowError>(n.py()) {
                    PyValueError::new_err(format!("shape[{d}] = {n} does not fit in 64 bits"))
                } else {
                    e
                }
            })
        })
        .collect()
}

/// A dtype name, dlbridge's or NumPy's. (`DType::from_str` reads the `x64` of
/// `complex64` as a lane count, so NumPy's complex names are mapped here.)
fn dtype_name(name: &str) -> PyResult<dlbridge::DType> {
    name.parse().py_err()
}

/// dlbridge's dtype names and their NumPy spellings (`{"f32": "float32", ...}`):
/// the one table, for the Python modules that map dtypes.
#[pyfunction]
fn dtype_names() -> std::collections::BTreeMap<String, &'static str> {
    dlbridge::core::dtype::NUMPY_NAMES.iter().map(|(d, n)| (d.to_string(), *n)).collect()
}

/// A dtype argument: a name, dlbridge's (`f32`, `bf16`) or NumPy's and
/// torch's (`float32`, `bfloat16`, `int64`, `bool`, `complex64`); a NumPy dtype
/// or scalar type (`np.float32`, `np.dtype("int16")`); a torch dtype
/// (`torch.float16`); Python's `float`, `int`, `bool`, `complex` (f64, i64,
/// bool, c128, as NumPy reads them); None for the default, f32.
fn dtype_arg(d: Option<&Bound<'_, PyAny>>) -> PyResult<dlbridge::DType> {
    use pyo3::exceptions::PyTypeError;
    use pyo3::types::{PyBool, PyComplex, PyFloat, PyInt, PyString, PyType};
    let Some(d) = d.filter(|d| !d.is_none()) else { return Ok(dlbridge::DType::F32) };
    if let Ok(s) = d.cast::<PyString>() {
        return dtype_name(s.to_str()?);
    }
    let py = d.py();
    if let Ok(t) = d.cast::<PyType>() {
        let builtin = [
            (py.get_type::<PyBool>(), "bool"),
            (py.get_type::<PyInt>(), "i64"),
            (py.get_type::<PyFloat>(), "f64"),
            (py.get_type::<PyComplex>(), "c128"),
        ];
        if let Some((_, name)) = builtin.iter().find(|(b, _)| t.is(b)) {
            return name.parse().py_err();
        }
    }
    // NumPy dtypes and scalar types: numpy.dtype(d).name. NumPy is imported
    // only if it already is (a NumPy object implies it).
    let modules = py.import("sys")?.getattr("modules")?;
    if let Ok(np) = modules.get_item("numpy") {
        let generic = np.getattr("generic")?;
        let is_numpy = d.is_instance(&np.getattr("dtype")?)? || d.cast::<PyType>().is_ok_and(|t| t.is_subclass(&generic).unwrap_or(false));
        if is_numpy {
            return dtype_name(&np.getattr("dtype")?.call1((d,))?.getattr("name")?.extract::<String>()?);
        }
    }
    // torch dtypes: str() is `torch.float32`.
    if d.get_type().module().is_ok_and(|m| m.to_str().is_ok_and(|m| m == "torch")) {
        let text = d.str()?.to_string();
        if let Some(name) = text.strip_prefix("torch.") {
            return dtype_name(name);
        }
    }
    Err(PyTypeError::new_err(format!(
        "dtype must be a dtype name (str), a NumPy or torch dtype or a Python scalar type, not {}",
        d.get_type().name()?
    )))
}

/// A zero-filled `dlbridge.Array`, NumPy's `zeros(shape, dtype)`: `shape` is
/// an int or a sequence of ints, `dtype` a dtype name (`"f32"`, `"float32"`),
/// NumPy or torch dtype or Python scalar type (default f32, not NumPy's
/// float64). Too many dims, negative dims or a size that overflows are
/// ValueErrors, memory that cannot be had is a MemoryError.
#[pyfunction]
#[pyo3(signature = (shape, dtype=None))]
fn zeros(shape: &Bound<'_, PyAny>, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<PyArray> {
    let shape = shape_arg(shape)?;
    let dtype = dtype_arg(dtype)?;
    dlbridge::Array::zeros(dtype, &shape).map(PyArray::new).py_err()
}

/// `0, 1, .., n-1` as a 1-d `dlbridge.Array`; `dtype` as for `zeros`.
#[pyfunction]
#[pyo3(signature = (n, dtype=None))]
fn arange(n: &Bound<'_, PyAny>, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<PyArray> {
    let n = n.extract::<i64>().map_err(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(n.py()) {
            pyo3::exceptions::PyValueError::new_err(format!("arange: n = {n} does not fit in 64 bits"))
        } else {
            e
        }
    })?;
    let dtype = dtype_arg(dtype)?;
    dlbridge::Array::arange(n, dtype).map(PyArray::new).py_err()
}

/// Reads a DLPack capsule without consuming it: name, version, flags, dtype,
/// shape, strides, device and data address.
#[pyfunction]
fn inspect_capsule<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    crate::raw::inspect::inspect(obj)
}

/// The Python module.
/// What CUDA support this process has: `available`, and if not the `reason`;
/// the driver's CUDA version and device count; where NVRTC was loaded from and
/// its version (or why it was not found). Detects once, never raises.
#[pyfunction]
fn cuda_status(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    use dlbridge::cuda::{nvrtc, probe};
    let d = pyo3::types::PyDict::new(py);
    match probe::driver() {
        Ok(info) => {
            d.set_item("available", true)?;
            d.set_item("reason", py.None())?;
            d.set_item("driver_version", probe::version_text(info.version))?;
            d.set_item("devices", info.devices)?;
        }
        Err(u) => {
            d.set_item("available", false)?;
            d.set_item("reason", u.0)?;
            d.set_item("driver_version", py.None())?;
            d.set_item("devices", 0)?;
        }
    }
    match nvrtc::nvrtc() {
        Ok(n) => {
            d.set_item("nvrtc", n.path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "(found by name)".into()))?;
            d.set_item("nvrtc_version", n.version)?;
            d.set_item("nvrtc_error", py.None())?;
        }
        Err(u) => {
            d.set_item("nvrtc", py.None())?;
            d.set_item("nvrtc_version", py.None())?;
            d.set_item("nvrtc_error", u.0.clone())?;
        }
    }
    Ok(d)
}

/// dlbridge's memory pool and stream ordering on one CUDA device: `raw_allocs`
/// and `raw_frees` (calls to cuMemAlloc / cuMemFree), `hits` (requests served
/// from the cache), `bytes_in_use`, `bytes_cached`, and `stream_waits` (events
/// one stream was made to wait for on another). Raises where CUDA is unavailable.
#[pyfunction]
#[pyo3(signature = (device = 0))]
fn cuda_memory_stats(py: Python<'_>, device: i32) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let dev = crate::cuda::device(dlbridge::Device::cuda(device)).py_err()?;
    let s = dev.pool_stats();
    let d = pyo3::types::PyDict::new(py);
    d.set_item("raw_allocs", s.raw_allocs)?;
    d.set_item("raw_frees", s.raw_frees)?;
    d.set_item("hits", s.hits)?;
    d.set_item("bytes_in_use", s.bytes_in_use)?;
    d.set_item("bytes_cached", s.bytes_cached)?;
    d.set_item("stream_waits", dev.stream_waits())?;
    Ok(d)
}

/// `dlbridge.cuda.RawKernel`'s kernel: CUDA C `source` whose `extern "C"
/// __global__` function `name` has the parameters `signature` declares.
#[pyfunction]
#[pyo3(signature = (source, name, signature, options = Vec::new(), block = 256, grid = None))]
fn cuda_raw_kernel(source: &str, name: &str, signature: &str, options: Vec<String>, block: u32, grid: Option<u32>) -> PyResult<PyKernel> {
    use dlbridge::cuda::raw_kernel::{RawLaunch, raw_kernel};
    raw_kernel(source, name, signature, &options, RawLaunch { block, grid }).map(PyKernel::new).py_err()
}

/// Compiles a CuPy-style elementwise kernel's parameters into a registered
/// kernel (its C++ is generated and compiled per dtype combination on first use).
#[pyfunction]
#[pyo3(signature = (in_params, out_params, operation, name, preamble = "", loop_prep = "", after_loop = ""))]
fn elementwise_kernel(
    in_params: &str,
    out_params: &str,
    operation: &str,
    name: &str,
    preamble: &str,
    loop_prep: &str,
    after_loop: &str,
) -> PyResult<PyKernel> {
    use dlbridge::compile::{ElementwiseKernel, ElementwiseOptions};
    let opts = ElementwiseOptions { preamble: preamble.into(), loop_prep: loop_prep.into(), after_loop: after_loop.into() };
    // The name is a label, as in CuPy: one a built-in holds gets a free variant.
    let name = dlbridge::compile::registry_name(dlbridge::registry(), name);
    let k = ElementwiseKernel::new(in_params, out_params, operation, &name, opts).py_err()?;
    k.register(dlbridge::registry()).map(PyKernel::new).py_err()
}

/// `dlbridge.define`'s kernels: every `def` of `lang` checked and registered
/// (under its own name where that is free or held by an earlier kernel from
/// source, else `name_2`, ...), with its derived backward. Returns `(def
/// name, kernel, backward kernel or None, why there is none)` in order.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn tc_define(py: Python<'_>, lang: &str) -> PyResult<Vec<(String, PyKernel, Option<PyKernel>, String)>> {
    let defs = py.detach(|| dlbridge::compile::tc::define_in(dlbridge::registry(), lang)).py_err()?;
    Ok(defs
        .into_iter()
        .map(|d| {
            let (backward, why) = match d.backward {
                Ok(b) => (Some(PyKernel::new(b)), String::new()),
                Err(why) => (None, why),
            };
            (d.kernel.spec().def_name().to_owned(), PyKernel::new(d.registered), backward, why)
        })
        .collect())
}

/// Compiles a CuPy-style reduction kernel into a registered kernel (outputs
/// as `mut` tensors; see `dlbridge.ReductionKernel`).
#[pyfunction]
#[allow(clippy::too_many_arguments)] // CuPy's constructor, argument for argument.
#[pyo3(signature = (in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name, reduce_type = None, preamble = ""))]
fn reduction_kernel(
    in_params: &str,
    out_params: &str,
    map_expr: &str,
    reduce_expr: &str,
    post_map_expr: &str,
    identity: Option<&str>,
    name: &str,
    reduce_type: Option<&str>,
    preamble: &str,
) -> PyResult<PyKernel> {
    use dlbridge::compile::{Reduction, ReductionKernel};
    let name = &dlbridge::compile::registry_name(dlbridge::registry(), name);
    let r = Reduction { in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name, reduce_type, preamble };
    let k = ReductionKernel::new(r).py_err()?;
    k.register(dlbridge::registry()).map(PyKernel::new).py_err()
}

/// `dlbridge.load_inline`'s library: the user's C / CUDA C functions, each
/// registered under its signature (see `dlbridge.load_inline`); `functions`
/// holds `(key, signature)` pairs (`key` None when given as a list). Returns
/// the kernels in order.
#[pyfunction]
#[pyo3(signature = (name, c_source, functions, cuda_source = None, extra_cflags = Vec::new(), cuda_options = Vec::new(), strided = Vec::new(), sources = Vec::new()))]
#[allow(clippy::too_many_arguments)] // load_inline's keywords, one for one.
fn load_inline(
    py: Python<'_>,
    name: &str,
    c_source: Option<&str>,
    functions: Vec<(Option<String>, String)>,
    cuda_source: Option<&str>,
    extra_cflags: Vec<String>,
    cuda_options: Vec<String>,
    strided: Vec<String>,
    sources: Vec<std::path::PathBuf>,
) -> PyResult<Vec<PyKernel>> {
    use dlbridge::compile::{InlineLibrary, InlineOptions};
    let opts = InlineOptions { extra_cflags, cuda_options, cache: None, strided, sources };
    py.detach(|| {
        let lib = if functions.iter().all(|(k, _)| k.is_some()) {
            let pairs: Vec<(&str, &str)> = functions.iter().map(|(k, s)| (k.as_deref().unwrap_or_default(), s.as_str())).collect();
            InlineLibrary::with_names(name, c_source, &pairs, cuda_source, opts)
        } else {
            let texts: Vec<&str> = functions.iter().map(|(_, s)| s.as_str()).collect();
            InlineLibrary::new(name, c_source, &texts, cuda_source, opts)
        }?;
        lib.register(dlbridge::registry())
    })
    .map(|ks| ks.into_iter().map(PyKernel::new).collect())
    .py_err()
}

/// What the CPU kernel cache did in this process: `compiled`, `disk_hits`, and its `dir`.
#[pyfunction]
fn compile_stats(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    use std::sync::atomic::Ordering;
    let c = dlbridge::compile::LibraryCache::global();
    let d = pyo3::types::PyDict::new(py);
    d.set_item("compiled", c.stats.compiled.load(Ordering::Relaxed))?;
    d.set_item("disk_hits", c.stats.disk_hits.load(Ordering::Relaxed))?;
    d.set_item("dir", c.dir().display().to_string())?;
    Ok(d)
}

/// An array of `shape` with every element `fill_value` (bool, int, float or
/// complex, converted to `dtype` as C converts; an int that does not fit is an
/// OverflowError); `dtype` as for `zeros`, default from the value's type.
#[pyfunction]
#[pyo3(signature = (shape, fill_value, dtype=None))]
fn full(shape: &Bound<'_, PyAny>, fill_value: &Bound<'_, PyAny>, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<PyArray> {
    use dlbridge::DType;
    use dlbridge::half::{bf16, f16};
    use pyo3::exceptions::PyTypeError;
    use pyo3::types::{PyBool, PyComplex, PyFloat, PyInt};
    let shape = shape_arg(shape)?;
    let dtype = match dtype.filter(|d| !d.is_none()) {
        Some(d) => dtype_arg(Some(d))?,
        None if fill_value.is_instance_of::<PyBool>() => DType::BOOL,
        None if fill_value.is_instance_of::<PyInt>() => DType::I64,
        None if fill_value.is_instance_of::<PyComplex>() => DType::C128,
        None => DType::F64,
    };
    if !(fill_value.is_instance_of::<PyBool>()
        || fill_value.is_instance_of::<PyInt>()
        || fill_value.is_instance_of::<PyFloat>()
        || fill_value.is_instance_of::<PyComplex>()
        || fill_value.hasattr("__index__")?
        || fill_value.hasattr("__float__")?)
    {
        return Err(PyTypeError::new_err(format!("full: fill_value must be a number, not {}", fill_value.get_type().name()?)));
    }
    let mut a = dlbridge::Array::zeros(dtype, &shape).py_err()?;
    macro_rules! fill {
        ($t:ty, $v:expr) => {{
            let v: $t = $v;
            a.as_slice_mut::<$t>().py_err()?.iter_mut().for_each(|x| *x = v);
        }};
    }
    let int = || -> PyResult<i128> { fill_value.call_method0("__index__")?.extract::<i128>() };
    let float = || -> PyResult<f64> { fill_value.call_method0("__float__")?.extract::<f64>() };
    match dtype {
        DType::BOOL => {
            let v = u8::from(fill_value.is_truthy()?);
            a.as_slice_mut::<u8>().py_err()?.iter_mut().for_each(|x| *x = v);
        }
        DType::I8 => fill!(i8, int()?.try_into().map_err(|_| overflow(fill_value, dtype))?),
        DType::I16 => fill!(i16, int()?.try_into().map_err(|_| overflow(fill_value, dtype))?),
        DType::I32 => fill!(i32, int()?.try_into().map_err(|_| overflow(fill_value, dtype))?),
        DType::I64 => fill!(i64, int()?.try_into().map_err(|_| overflow(fill_value, dtype))?),
        DType::U8 => fill!(u8, int()?.try_into().map_err(|_| overflow(fill_value, dtype))?),
        DType::U16 => fill!(u16, int()?.try_into().map_err(|_| overflow(fill_value, dtype))?),
        DType::U32 => fill!(u32, int()?.try_into().map_err(|_| overflow(fill_value, dtype))?),
        DType::U64 => fill!(u64, int()?.try_into().map_err(|_| overflow(fill_value, dtype))?),
        DType::F32 => fill!(f32, float()? as f32),
        DType::F64 => fill!(f64, float()?),
        DType::F16 => fill!(f16, f16::from_f64(float()?)),
        DType::BF16 => fill!(bf16, bf16::from_f64(float()?)),
        DType::C64 | DType::C128 => {
            let c: dlbridge::core::num_complex::Complex<f64> = if fill_value.is_instance_of::<PyComplex>() {
                let c = fill_value.cast::<PyComplex>()?;
                dlbridge::core::num_complex::Complex::new(c.real(), c.imag())
            } else {
                dlbridge::core::num_complex::Complex::new(float()?, 0.0)
            };
            if dtype == DType::C64 {
                fill!(dlbridge::core::num_complex::Complex<f32>, dlbridge::core::num_complex::Complex::new(c.re as f32, c.im as f32));
            } else {
                fill!(dlbridge::core::num_complex::Complex<f64>, c);
            }
        }
        other => return Err(PyTypeError::new_err(format!("full: cannot fill a {other} array from a Python number"))),
    }
    Ok(PyArray::new(a))
}

fn overflow(v: &Bound<'_, PyAny>, d: dlbridge::DType) -> PyErr {
    pyo3::exceptions::PyOverflowError::new_err(format!("full: {v} does not fit in {d}"))
}

/// The PTX NVRTC makes of a raw kernel's source for `arch` (e.g. `compute_80`).
#[pyfunction]
#[pyo3(signature = (source, name, signature, arch, options = Vec::new()))]
fn cuda_raw_kernel_ptx(source: &str, name: &str, signature: &str, arch: &str, options: Vec<String>) -> PyResult<String> {
    let arch = format!("--gpu-architecture={arch}");
    dlbridge::cuda::raw_kernel::raw_kernel_ptx(source, name, signature, &options, &arch).map(|p| p.to_string()).py_err()
}

/// Whether exact NumPy arrays are read in place (the layout check passed with
/// this NumPy), rather than through the buffer protocol.
#[pyfunction]
fn _numpy_read_in_place(py: Python<'_>) -> bool {
    crate::raw::ndarray::in_place(py)
}

/// Whether calling a `dlbridge.Kernel` takes its vectorcall entry (the type
/// object's layout check passed), rather than `tp_call` with a tuple and a dict.
#[pyfunction]
fn _kernel_vectorcall() -> bool {
    crate::vectorcall::installed()
}

/// Makes `dlbridge.Kernel` immutable once the package has set its attributes
/// (its vectorcall entry must stay the one `__call__` runs; see
/// `crate::vectorcall`).
#[pyfunction]
fn _freeze_kernel_type(py: Python<'_>) {
    crate::vectorcall::freeze(py);
}

#[pymodule]
fn _dlbridge(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // NVRTC ships in the NVIDIA wheels torch depends on: look in this interpreter's
    // site-packages (no CUDA library is loaded until CUDA is first used).
    if let Ok(dirs) = m.py().import("site").and_then(|s| s.call_method0("getsitepackages")).and_then(|d| d.extract::<Vec<String>>()) {
        for d in dirs {
            dlbridge::cuda::nvrtc::add_site_packages(d);
        }
    }
    m.add_class::<PyArray>()?;
    crate::array_exchange::install(m.py())?;
    m.add_class::<PyKernel>()?;
    // Calls skip the tuple and dict of tp_call (see crate::vectorcall);
    // measured on a real instance, before any kernel can be called.
    if let Some(k) = dlbridge::registry().list().into_iter().next() {
        crate::vectorcall::install(&Bound::new(m.py(), PyKernel::new(k))?)?;
    }
    m.add_class::<crate::param::PyParam>()?;
    m.add_class::<PyPlugin>()?;
    m.add_function(wrap_pyfunction!(list_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_names, m)?)?;
    m.add_function(wrap_pyfunction!(get_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(load_plugin, m)?)?;
    m.add_function(wrap_pyfunction!(from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(asarray, m)?)?;
    m.add_function(wrap_pyfunction!(full, m)?)?;
    m.add_function(wrap_pyfunction!(elementwise_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(reduction_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(tc_define, m)?)?;
    m.add_function(wrap_pyfunction!(compile_stats, m)?)?;
    m.add_function(wrap_pyfunction!(_numpy_read_in_place, m)?)?;
    m.add_function(wrap_pyfunction!(_kernel_vectorcall, m)?)?;
    m.add_function(wrap_pyfunction!(_freeze_kernel_type, m)?)?;
    m.add_function(wrap_pyfunction!(load_inline, m)?)?;
    m.add_function(wrap_pyfunction!(xla_ffi_handler, m)?)?;
    m.add_function(wrap_pyfunction!(register_allocator, m)?)?;
    m.add_function(wrap_pyfunction!(_empty_like, m)?)?;
    m.add_function(wrap_pyfunction!(_hand_over, m)?)?;
    m.add_function(wrap_pyfunction!(zeros, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(arange, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_status, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_raw_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_raw_kernel_ptx, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

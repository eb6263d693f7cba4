//! [`InlineLibrary`]: the user's own C (and CUDA C) functions as registered
//! kernels — `dlbridge.load_inline`, after tvm-ffi's `load_inline`.
//!
//! ```no_run
//! use dlbridge_compile::inline::{InlineLibrary, InlineOptions};
//! let c = "void axpy(const float* x, float* y, double a, long long n) {\n  for (long long i = 0; i < n; ++i) y[i] += a * x[i];\n}\n";
//! let lib = InlineLibrary::new("blas1", Some(c), &["axpy(x: f32[N], y: mut f32[N], a: f64)"], None, InlineOptions::default())?;
//! let kernels = lib.register(dlbridge_registry::Registry::global())?; // callable like any kernel
//! # Ok::<(), dlbridge_core::Error>(())
//! ```
//!
//! Each function is declared by a dlbridge signature; the registry checks
//! every call against it (dtypes, shapes, devices, read-only and overlapping
//! tensors, contiguity) and lets the caller's framework allocate the
//! outputs, then generated glue unpacks the DLTensors and calls the user's
//! function.
//!
//! # The C calling convention
//! For the signature `f<T: f32|f64>(a: T[M, K], b: T[K, N], alpha: f64) -> (c: T[M, N])`
//! the function is `void f(const T* a, const T* b, double alpha, T* c, long long M, long long K, long long N)`:
//! 1. one pointer per tensor parameter, in order: `const E*` for an input,
//!    `E*` for a `mut` input (element 0 of a C-contiguous tensor);
//! 2. one value per scalar parameter, in order: `f64` → `double`, `i64` →
//!    `long long`, `bool` → `int` (0 or 1);
//! 3. one `E*` per output, in order;
//! 4. one `long long` per size of the signature, in order of first
//!    appearance (parameters, then outputs, dims left to right): a symbol
//!    (`N`) passes its value, a group (`...B`) the product of its dims (its
//!    element count). Fixed dims (`3`) pass nothing.
//!
//! `E` is the element's C type: a type variable is a `typedef` of the call's
//! dtype (`typedef float T;`), so one source serves every dtype the signature
//! allows (one build per combination of dtypes); a concrete dtype is written
//! as its C type. The C types are [`dlbridge_cuda::raw_kernel::c_type`]'s, the
//! same for C and CUDA (one source can serve both): f32 `float`, f64
//! `double`, i8 `signed char`, i16 `short`, i32 `int`, i64 `long long`, u8
//! and bool `unsigned char`, u16 `unsigned short`, u32 `unsigned int`, u64
//! `unsigned long long`, f16 and bf16 `unsigned short` (the raw bits).
//! (On Linux `int64_t` is `long`, not `long long`: spell i64 `long long`.)
//! A type variable's name is one typedef in the whole source: two functions of
//! a library that both use `T` must allow the same dtypes; a build for one
//! function's dtypes gives the other type variables their first dtype.
//!
//! Every tensor is C-contiguous (the kernels are registered with
//! [`KernelOpts::contiguous`]): a strided input or output is refused by the
//! registry with an error naming it ("this kernel needs a contiguous ..."), never copied
//! behind the caller's back and never written through a wrong layout. A C
//! function named in [`InlineOptions::strided`] takes any layout instead
//! (as tvm-ffi's functions do): after the sizes it gets 5. one `const long
//! long*` per tensor (parameters, then outputs) holding its strides in
//! elements, one per dim (zero and negative strides included; the pointers
//! of 1. and 3. are element `[0, .., 0]`). CUDA kernels are not passed strides. No
//! output may overlap another tensor of the call. Broadcast groups (`*S`)
//! are refused at load time (the C code would not know the strides).
//!
//! # CPU (`c_source`)
//! The source is compiled as C++17 inside `extern "C" { ... }` (C code
//! compiles, names are not mangled), after the plugin header, `<math.h>`,
//! `<stdint.h>`, `<stddef.h>`, `<stdlib.h>`, `<string.h>`, `<stdio.h>`,
//! `<limits.h>`, `<float.h>`, their C++ forms and `<stdexcept>` (so an `#include` of them in
//! the source does nothing), `#define restrict __restrict__`, and the
//! typedefs. The glue declares each function's exact prototype before the
//! source, so a definition that does not match the signature is a compile
//! error at its `c_source` line ("conflicting declaration"), explained with
//! the prototypes the signatures imply. On Linux the library is linked with
//! `-Wl,--no-undefined`: a function the source does not define is an
//! "undefined reference" at build time, not at the call. The glue catches
//! C++ exceptions into the plugin ABI's error. One plugin (every CPU function
//! of the library) per combination of dtypes, through the plugin ABI and
//! loader, the [disk cache](crate::LibraryCache) (keyed as every compiled kernel,
//! plus `extra_cflags`, which follow the usual flags), built on first use
//! (concurrent first calls build once). [`InlineLibrary::register`] builds
//! the first combination at once, so a broken source fails there.
//!
//! # CUDA (`cuda_source`)
//! Each function is an `extern "C" __global__` kernel with the same
//! parameters. The source gets the typedefs, `int8_t`..`uint64_t`,
//! `ptrdiff_t`, `size_t`, `restrict` and a declaration of each kernel in
//! front, and is compiled with NVRTC (`--std=c++17 -default-device` and
//! `cuda_options`) per combination of dtypes (a CUBIN for the device, else
//! PTX, through the NVRTC cache in memory and on disk). A launch has
//! 256-thread blocks and `ceil(n / 256)` blocks, `n` the first output's
//! element count (else the first tensor's); nothing is launched for `n == 0`;
//! it runs on the call's stream. The kernel is registered as the `cuda`
//! implementation of the same signature: a function in both sources runs
//! where its tensors are. [`InlineLibrary::register`] compiles the source to
//! PTX at once (for the GPU, else for `compute_75`; skipped when NVRTC is not
//! found), so a broken source fails there with NVRTC's log. Without a CUDA
//! driver and device a call on `cuda` tensors is an error saying why.
//!
//! # Which source defines a function
//! A function is compiled for the CPU when its name occurs (outside
//! comments) in `c_source`, for CUDA when it occurs in `cuda_source`.
//!
//! # Diagnostics
//! The sources are `#line 1 "c_source"` / `#line 1 "cuda_source"`: compiler
//! errors read `c_source line 3, column 6: error: ...` (NVRTC's `cuda_source
//! line 3: error: ...`) with the line quoted.
//!
//! # Safety of the user's code
//! As with a plugin or a raw CUDA kernel, what the C code does with the
//! pointers is its responsibility: the registry guarantees their dtypes,
//! shapes, devices and contiguity; a function that reads or writes beyond the
//! sizes it is given corrupts memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dlbridge_core::{DType, DeviceType, Error, ErrorKind, Result};
use dlbridge_cuda::CudaDevice;
use dlbridge_cuda::generated::Program;
use dlbridge_cuda::raw_kernel::{CHECK_ARCH, c_type};
use dlbridge_registry::signature::{DTypeRef, Dim, ParamKind};
use dlbridge_registry::{Call, DynKernelFn, Impl, Kernel, KernelDef, KernelOpts, Plugin, Registry, Signature};

use crate::builder::cache::LibraryCache;
use crate::builder::specialise::{Specialisations, replaceable};
use crate::codegen::{Src, c_string};

mod cuda;
mod function;

use function::{Function, SizeArg, TensorSlot, cpu_entry};

/// The origin of every function of an inline library: `dlbridge.load_inline (NAME)`.
pub use crate::builder::specialise::INLINE_ORIGIN as ORIGIN;

/// The file name diagnostics give the C source.
pub const C_SOURCE: &str = crate::builder::cache::C_SOURCE;

/// The file name diagnostics give the CUDA source.
pub const CUDA_SOURCE: &str = "cuda_source";

/// The optional parts of an inline library.
#[derive(Debug, Clone, Default)]
pub struct InlineOptions {
    /// Flags appended to the C++ compiler's (part of the cache key).
    pub extra_cflags: Vec<String>,
    /// NVRTC options added to dlbridge's (`--std=c++17 -default-device`).
    pub cuda_options: Vec<String>,
    /// The library cache; `None`: [`LibraryCache::global`].
    pub cache: Option<Arc<LibraryCache>>,
    /// The C functions (of `c_source`) that take strides: they accept tensors
    /// of any layout (see the module docs).
    pub strided: Vec<String>,
    /// C++ source files (torch's `load(sources=...)`), read when the library
    /// is made and compiled after `c_source`, each under its own path in
    /// diagnostics. Their directories are searched for quoted `#include`s,
    /// and the cache key covers every file the sources include (the library
    /// is keyed on the preprocessed text).
    pub sources: Vec<std::path::PathBuf>,
}

fn value_error(message: String) -> Error {
    Error::Coded { kind: ErrorKind::Value, message }
}

/// The CPU functions of one build: by function index (`None`: not a CPU function).
type CpuBuild = Arc<Vec<Option<DynKernelFn>>>;

struct Shared {
    name: String,
    c_source: Option<String>,
    cuda_source: Option<String>,
    opts: InlineOptions,
    /// The library's type variables: name and allowed dtypes.
    vars: Vec<(String, Vec<DType>)>,
    functions: Vec<Function>,
    cpu_builds: Specialisations<Vec<DType>, CpuBuild>,
    programs: Mutex<HashMap<Vec<DType>, Arc<Program>>>,
    /// What the files its C++ includes said when it was made.
    included: Option<String>,
}

/// A library of the user's C / CUDA C functions (see the [module docs](self)).
#[derive(Clone)]
pub struct InlineLibrary {
    inner: Arc<Shared>,
}

impl std::fmt::Debug for InlineLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.inner.functions.iter().map(Function::name).collect();
        f.debug_struct("InlineLibrary").field("name", &self.inner.name).field("functions", &names).finish()
    }
}

/// Whether a compiler flag links a sanitizer's runtime into the library
/// (`-fsanitize=address`, `-lasan`, `-static-libasan`, ...). The runtimes
/// refuse to start inside a process that did not load them first, and exit it.
fn loads_a_sanitizer(flag: &str) -> bool {
    let f = flag.trim();
    f.starts_with("-fsanitize")
        || f.starts_with("--sanitize")
        || (f.starts_with("-l") && f.ends_with("san"))
        || (f.contains("-lib") && f.ends_with("san"))
}

/// Whether `name` occurs as an identifier in `src`, outside comments.
fn mentions(src: &str, name: &str) -> bool {
    let b = src.as_bytes();
    let (mut i, n) = (0, b.len());
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < n {
        if b[i] == b'/' && i + 1 < n && b[i + 1] == b'/' {
            while i < n && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && i + 1 < n && b[i + 1] == b'*' {
            i += 2;
            while i + 1 < n && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if ident(b[i]) {
            let start = i;
            while i < n && ident(b[i]) {
                i += 1;
            }
            if &src[start..i] == name {
                return true;
            }
        } else {
            i += 1;
        }
    }
    false
}

impl InlineLibrary {
    /// A library named `name` (the origin of its kernels and part of their
    /// cache names) of the functions `functions` declares (one dlbridge
    /// signature each) defined in `c_source` and/or `cuda_source`. Parses and
    /// checks everything; nothing is compiled until
    /// [`register`](Self::register) or a call.
    ///
    /// Errors (Value): no source, no function, a signature that does not
    /// parse, a function listed twice or defined in neither source, a
    /// broadcast group, a dtype without a C type, a type variable name used
    /// with two different sets of dtypes.
    pub fn new(
        name: &str,
        c_source: Option<&str>,
        functions: &[&str],
        cuda_source: Option<&str>,
        opts: InlineOptions,
    ) -> Result<InlineLibrary> {
        // The name becomes part of generated code and of file names: a C
        // identifier, as a kernel's name is.
        if let Some(why) = crate::params::bad_name(name) {
            return Err(value_error(format!("load_inline: the library name `{}` {why}", crate::params::shortened(name))));
        }
        let what = format!("load_inline {name:?}");
        if let Some(flag) = opts.extra_cflags.iter().find(|f| loads_a_sanitizer(f)) {
            return Err(value_error(format!(
                "{what}: extra_cflags `{}` would link a sanitizer runtime, which must be loaded first in a process and ends this one when the library is loaded; it is refused",
                crate::params::shortened(flag)
            )));
        }
        // A response file's flags would act on the build unseen by the cache key
        // and the kernel's digest, which see the flags and the files the
        // preprocessor enters.
        if let Some(flag) = opts.extra_cflags.iter().find(|f| f.trim_start().starts_with('@')) {
            return Err(value_error(format!(
                "{what}: extra_cflags `{}` is a response file, whose flags the kernel cache and digest cannot see; pass the flags themselves",
                crate::params::shortened(flag)
            )));
        }
        // The source files, after `c_source`, each numbered as its own file.
        let mut combined = c_source.map(str::to_owned);
        for path in &opts.sources {
            let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::FileNotFound { path: path.clone() },
                _ => value_error(format!("{what}: cannot read the source {}: {e}", path.display())),
            })?;
            let c = combined.get_or_insert_with(String::new);
            c.push_str(&format!("\n#line 1 {}\n{text}\n", crate::codegen::c_string(&path.display().to_string())));
        }
        let c_source = combined.as_deref();
        if c_source.is_none() && cuda_source.is_none() {
            return Err(value_error(format!("{what}: give c_source, cuda_source, sources, or several")));
        }
        if functions.is_empty() {
            return Err(value_error(format!("{what}: `functions` lists no function (give each one's signature)")));
        }
        let mut vars: Vec<(String, Vec<DType>, String)> = Vec::new();
        let mut out: Vec<Function> = Vec::with_capacity(functions.len());
        for text in functions {
            let sig = Signature::parse(text).map_err(|e| e.context(format!("{what}: function signature `{text}`")))?;
            let fname = sig.name.clone();
            if out.iter().any(|f| f.name() == fname) {
                return Err(value_error(format!("{what}: function `{fname}` is listed twice")));
            }
            let mut fvars = Vec::with_capacity(sig.type_vars.len());
            for tv in &sig.type_vars {
                for &d in &tv.allowed {
                    if c_type(d).is_none() {
                        return Err(value_error(format!(
                            "{what}: `{fname}`: type variable {} allows {d}, which has no C type here",
                            tv.name
                        )));
                    }
                }
                match vars.iter().position(|(n, _, _)| *n == tv.name) {
                    Some(i) if vars[i].1 != tv.allowed => {
                        let list = |l: &[DType]| l.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("|");
                        return Err(value_error(format!(
                            "{what}: type variable {} is {} in `{}` but {} in `{fname}`: a type variable is one typedef in the source, \
                             so every function using its name must allow the same dtypes (rename one)",
                            tv.name,
                            list(&vars[i].1),
                            vars[i].2,
                            list(&tv.allowed)
                        )));
                    }
                    Some(i) => fvars.push(i),
                    None => {
                        vars.push((tv.name.clone(), tv.allowed.clone(), fname.clone()));
                        fvars.push(vars.len() - 1);
                    }
                }
            }
            let mut tensors = Vec::new();
            let mut scalars = Vec::new();
            let mut sizes: Vec<SizeArg> = Vec::new();
            let outputs = sig.outputs.iter().map(|p| (p, true));
            for (p, output) in sig.params.iter().map(|p| (p, false)).chain(outputs) {
                match &p.kind {
                    ParamKind::Scalar(k) => scalars.push((p.name.clone(), *k)),
                    ParamKind::Tensor(t) => {
                        if let DTypeRef::Concrete(d) = t.dtype
                            && c_type(d).is_none()
                        {
                            return Err(value_error(format!("{what}: `{fname}`: `{}` has dtype {d}, which has no C type here", p.name)));
                        }
                        let slot = tensors.len();
                        let rest_at = t.rest_position();
                        for (pos, d) in t.dims.iter().enumerate() {
                            let (sname, group) = match *d {
                                Dim::Fixed(_) | Dim::Expr(_) => continue,
                                Dim::Sym(i) => (sig.symbols[i].clone(), false),
                                Dim::Rest(i) if sig.is_broadcast(i) => {
                                    return Err(value_error(format!(
                                        "{what}: `{fname}`: `{}` has the broadcast group {}: a C function takes contiguous tensors \
                                         of the signature's exact shapes (write `...{}`)",
                                        p.name,
                                        sig.fmt_rest(i),
                                        sig.rests[i]
                                    )));
                                }
                                Dim::Rest(i) => (format!("...{}", sig.rests[i]), true),
                            };
                            if !sizes.iter().any(|s| s.name == sname) {
                                sizes.push(SizeArg { name: sname, slot, pos, len: t.dims.len(), rest_at, group });
                            }
                        }
                        tensors.push(TensorSlot { name: p.name.clone(), dtype: t.dtype, mutable: t.mutable, output });
                    }
                }
            }
            let cpu = c_source.is_some_and(|s| mentions(s, &fname));
            let cuda = cuda_source.is_some_and(|s| mentions(s, &fname));
            if !cpu && !cuda {
                let which = match (c_source.is_some(), cuda_source.is_some()) {
                    (true, true) => "neither c_source nor cuda_source mentions it",
                    (true, false) => "c_source does not mention it",
                    _ => "cuda_source does not mention it",
                };
                return Err(value_error(format!("{what}: function `{fname}` is listed in `functions`, but {which}")));
            }
            let strided = opts.strided.contains(&fname);
            if strided && cuda {
                return Err(value_error(format!(
                    "{what}: function `{fname}` takes strides, which only C functions (c_source) are passed; \
                     cuda_source mentions it too (rename one, or drop it from `strided`)"
                )));
            }
            out.push(Function { sig, text: (*text).to_owned(), vars: fvars, tensors, scalars, sizes, cpu, cuda, strided });
        }
        if let Some(s) = opts.strided.iter().find(|s| !out.iter().any(|f| f.name() == s.as_str())) {
            return Err(value_error(format!("{what}: `strided` names `{}`, which `functions` does not list", crate::params::shortened(s))));
        }
        let mut lib = InlineLibrary {
            inner: Arc::new(Shared {
                name: name.to_owned(),
                c_source: c_source.map(str::to_owned),
                cuda_source: cuda_source.map(str::to_owned),
                opts,
                vars: vars.into_iter().map(|(n, a, _)| (n, a)).collect(),
                functions: out,
                cpu_builds: Specialisations::default(),
                programs: Mutex::default(),
                included: None,
            }),
        };
        // The C++ it compiles, preprocessed now, when it includes files (or is given as files).
        let c = lib.inner.c_source.as_deref().unwrap_or("");
        let included = if !lib.inner.opts.sources.is_empty() {
            lib.cpu_source(&lib.first_dtypes()).ok().and_then(|src| {
                crate::builder::cache::included_digest(&[(C_SOURCE, &format!("#include <cstddef>\n{src}"))], &lib.cpu_flags())
            })
        } else {
            crate::builder::cache::included_digest(&[(C_SOURCE, c)], &lib.cpu_flags())
        };
        if let Some(shared) = Arc::get_mut(&mut lib.inner) {
            shared.included = included;
        }
        Ok(lib)
    }

    /// [`new`](Self::new) from `(name, signature)` pairs (Python's
    /// `functions={name: signature}`): each name must be its signature's
    /// name (a Value error naming both).
    pub fn with_names(
        name: &str,
        c_source: Option<&str>,
        functions: &[(&str, &str)],
        cuda_source: Option<&str>,
        opts: InlineOptions,
    ) -> Result<InlineLibrary> {
        for (key, text) in functions {
            let sig = Signature::parse(text).map_err(|e| e.context(format!("load_inline {name:?}: function `{key}`")))?;
            if sig.name != *key {
                return Err(value_error(format!(
                    "load_inline {name:?}: functions[{key:?}] has the signature of `{}` (`{text}`): the key must be the signature's name",
                    sig.name
                )));
            }
        }
        let texts: Vec<&str> = functions.iter().map(|(_, t)| *t).collect();
        InlineLibrary::new(name, c_source, &texts, cuda_source, opts)
    }

    /// The library's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The origin its kernels carry: `dlbridge.load_inline (NAME)`.
    pub fn origin(&self) -> String {
        format!("{ORIGIN} ({})", self.inner.name)
    }

    /// The functions' names, in the order given.
    pub fn functions(&self) -> Vec<&str> {
        self.inner.functions.iter().map(Function::name).collect()
    }

    /// The library's type variables (every function's, each once) with their dtypes.
    pub fn type_vars(&self) -> &[(String, Vec<DType>)] {
        &self.inner.vars
    }

    /// The C prototype each function must have (`void axpy(const float* x, float* y, double a, long long N)`).
    pub fn prototype(&self, function: &str) -> Option<String> {
        self.inner.functions.iter().find(|f| f.name() == function).map(|f| f.prototype("", true))
    }

    /// How many CPU builds (combinations of dtypes) it has made or loaded.
    pub fn cpu_specialisations(&self) -> usize {
        self.inner.cpu_builds.built()
    }

    /// The flags the CPU library is compiled with beyond the usual ones.
    pub fn cpu_flags(&self) -> Vec<String> {
        let mut f = Vec::new();
        if cfg!(target_os = "linux") {
            f.push("-Wl,--no-undefined".to_owned());
        }
        // A C function defined with other parameters than its prototype is a
        // C++ overload: this warning says where, for the error (see `explain_cpu`).
        f.push("-Wmissing-declarations".to_owned());
        // Quoted includes of the source files resolve beside them.
        for dir in self.inner.opts.sources.iter().filter_map(|p| p.parent()) {
            f.push("-iquote".to_owned());
            f.push(if dir.as_os_str().is_empty() { ".".to_owned() } else { dir.display().to_string() });
        }
        f.extend(self.inner.opts.extra_cflags.iter().cloned());
        f
    }

    /// The first dtype of every type variable: the build [`register`](Self::register) makes at once.
    pub fn first_dtypes(&self) -> Vec<DType> {
        self.inner.vars.iter().map(|(_, a)| a[0]).collect()
    }

    fn check_lib(&self, lib: &[DType]) -> Result<()> {
        let vars = &self.inner.vars;
        if lib.len() != vars.len() || lib.iter().zip(vars).any(|(d, (_, a))| !a.contains(d)) {
            let want: Vec<String> = vars.iter().map(|(n, a)| format!("{n}: {}", a.len())).collect();
            return Err(Error::InvalidArgument(format!(
                "load_inline {:?}: {lib:?} is not a dtype for each type variable ({})",
                self.inner.name,
                want.join(", ")
            )));
        }
        Ok(())
    }

    fn dtypes_text(&self, lib: &[DType]) -> String {
        self.inner.vars.iter().zip(lib).map(|((n, _), d)| format!("{n}={d}")).collect::<Vec<_>>().join(",")
    }

    fn what(&self, lib: &[DType]) -> String {
        let t = self.dtypes_text(lib);
        if t.is_empty() { format!("load_inline {}", self.inner.name) } else { format!("load_inline {} ({t})", self.inner.name) }
    }

    /// The start of a generated file for the dtypes `lib`, and the user's
    /// `source` (the `field` argument of `load_inline`) it is built around.
    fn begin<'s>(&self, lib: &[DType], source: Option<&'s str>, field: &str, file: &'static str, backend: &str) -> Result<(Src, &'s str)> {
        self.check_lib(lib)?;
        let name = &self.inner.name;
        let source = source.ok_or_else(|| Error::InvalidArgument(format!("load_inline {name}: no {field}")))?;
        let mut src = Src::for_file(file);
        src.resync();
        src.line(&format!("// Generated by dlbridge-compile {}{backend}: dlbridge.load_inline `{name}`.", env!("CARGO_PKG_VERSION")));
        Ok((src, source))
    }

    /// The complete C++ of the CPU plugin for the dtypes `lib` (one per
    /// [`type_vars`](Self::type_vars) entry): every CPU function's glue and
    /// the user's source.
    pub fn cpu_source(&self, lib: &[DType]) -> Result<String> {
        let s = &*self.inner;
        let (mut src, c_source) = self.begin(lib, s.c_source.as_deref(), C_SOURCE, crate::codegen::cpu::GENERATED_FILE, "")?;
        src.line(&format!("// Specialisation: {}.", if lib.is_empty() { "no type variables".into() } else { self.dtypes_text(lib) }));
        // The generated code's own functions need no declarations (the
        // warning is for the user's definitions: see `explain_cpu`).
        src.line("#pragma GCC diagnostic ignored \"-Wmissing-declarations\"");
        src.push(&crate::codegen::headers::expand("dlbridge_compile/inline_runtime.h"));
        src.push(crate::codegen::cpu::DIVGUARD);
        src.line("");
        src.line("// ---- the library's types ----");
        for ((n, _), d) in s.vars.iter().zip(lib) {
            src.line(&format!("typedef {} {n};", c_type(*d).unwrap_or("void")));
        }
        let cpu: Vec<(usize, &Function)> = s.functions.iter().enumerate().filter(|(_, f)| f.cpu).collect();
        src.line("");
        src.line("// ---- the functions, as their signatures declare them ----");
        src.line("extern \"C\" {");
        for (_, f) in &cpu {
            src.line(&format!("{};", f.prototype("", false)));
        }
        src.line("}  // extern \"C\"");
        src.line("");
        src.line("// ---- the entry points ----");
        src.line("namespace {");
        for (k, f) in &cpu {
            cpu_entry(&mut src, *k, f, lib);
        }
        src.line("}  // namespace");
        src.line("");
        src.line("static const DLBridgeKernel dlbridge_kernels[] = {");
        for (k, f) in &cpu {
            let doc = format!("{ORIGIN} ({}): C function {}", s.name, f.prototype("", true));
            src.line(&format!(
                "    {{{}, 1, DLBRIDGE_KERNEL_CONTIGUOUS, dlbridge_entry_{k}, {}}},",
                c_string(&f.specialised(lib)),
                c_string(&doc)
            ));
        }
        src.line("};");
        src.line("static const DLBridgePlugin dlbridge_plugin_table = {");
        src.line("    DLBRIDGE_PLUGIN_ABI_VERSION, static_cast<uint32_t>(sizeof(DLBridgePlugin)),");
        src.line(&format!(
            "    {}, {}, static_cast<uint32_t>(sizeof(DLBridgeKernel)), {}, dlbridge_kernels,",
            c_string(&format!("dlbridge.load_inline:{}", s.name)),
            c_string(env!("CARGO_PKG_VERSION")),
            cpu.len()
        ));
        src.line("};");
        src.line("extern \"C\" __attribute__((visibility(\"default\"))) const DLBridgePlugin* dlbridge_plugin(void) {");
        // Not `&`: a unary `&` on a class may call an `operator&` a preamble declares.
        src.line("  return __builtin_addressof(dlbridge_plugin_table);");
        src.line("}");
        src.line("");
        // C++ as C++ (templates, `#include <vector>`, overloads): only the
        // functions the signatures name have C linkage, from their `extern "C"`
        // declarations above, which their definitions here inherit.
        src.line("// ---- the user's source ----");
        src.line("#pragma GCC diagnostic warning \"-Wmissing-declarations\"");
        src.line("#define restrict __restrict__");
        src.user(C_SOURCE, c_source, "");
        Ok(src.text)
    }

    fn prototypes_note(&self, which: impl Fn(&Function) -> bool, qualifier: &str) -> String {
        let mut s = String::from("\nthe prototypes the signatures declare (type variables are typedefs of the call's dtypes):");
        for f in self.inner.functions.iter().filter(|f| which(f)) {
            s.push_str(&format!("\n  {};   // {}", f.prototype(qualifier, true), f.text));
        }
        s
    }

    /// The CPU build for the dtypes `lib`: from the cache, compiled if need be.
    fn cpu_build(&self, lib: &[DType]) -> Result<CpuBuild> {
        self.inner.cpu_builds.get(lib, || {
            let mut source = self.cpu_source(lib)?;
            let cache: &LibraryCache = self.inner.opts.cache.as_deref().unwrap_or_else(|| LibraryCache::global());
            let user = [(C_SOURCE, self.inner.c_source.as_deref().unwrap_or(""))];
            let what = self.what(lib);
            if !self.inner.opts.sources.is_empty() {
                // Keyed on what the files and every header they include say now.
                let compiler = crate::builder::toolchain::Compiler::get()?;
                source = compiler.preprocess_text(&source, &what, &user, &self.cpu_flags()).map_err(|e| self.explain_cpu(e))?;
            }
            cache
                .get_or_build_with(
                    &source,
                    &self.dtypes_text(lib),
                    &self.cpu_flags(),
                    &what,
                    &user,
                    crate::builder::elf::Policy::UserCode,
                    |path| self.load(path, lib),
                )
                .map_err(|e| self.explain_cpu(e))
        })
    }

    /// The compiler's rejection with the prototypes (and what an undefined reference means).
    fn explain_cpu(&self, e: Error) -> Error {
        let text = e.to_string();
        if e.kind() != ErrorKind::Value || !text.contains("rejected the kernel") {
            return e;
        }
        let mut msg = text.clone();
        if text.contains("undefined reference to") {
            let missing: Vec<&str> = self
                .inner
                .functions
                .iter()
                .filter(|f| f.cpu && text.contains(&format!("undefined reference to `{}'", f.name())))
                .map(Function::name)
                .collect();
            if !missing.is_empty() {
                msg = format!("{msg}\nc_source mentions but does not define: {}", missing.join(", "));
            }
            // A definition with other parameters is another function in C++
            // (an overload): the compiler's -Wmissing-declarations says where.
            for name in &missing {
                let Some(line) =
                    text.lines().find(|l| l.contains("warning: no previous declaration for '") && l.contains(&format!(" {name}(")))
                else {
                    continue;
                };
                let (at, rest) = line.split_once(": warning: ").unwrap_or((line, ""));
                let mut parts = at.trim().rsplitn(3, ':');
                let (col, ln, file) = (parts.next(), parts.next(), parts.next());
                let defined = rest.split(['\'', '\u{2018}', '\u{2019}']).nth(1).unwrap_or(rest);
                msg = format!(
                    "{msg}\n{} line {}, column {}: `{name}` is defined as `{defined}`, not as its signature's prototype \
                     (in C++ another parameter list is another function)",
                    file.unwrap_or("c_source"),
                    ln.unwrap_or("?"),
                    col.unwrap_or("?")
                );
            }
        }
        msg.push_str(&self.prototypes_note(|f| f.cpu, ""));
        value_error(msg)
    }

    /// Opens a built library and takes each CPU function's entry.
    fn load(&self, path: &crate::builder::cache::HeldLibrary, lib: &[DType]) -> Result<CpuBuild> {
        let (_, defs) = Plugin::open_held(path)?.into_defs();
        let mut by_sig: HashMap<String, DynKernelFn> = HashMap::new();
        for d in defs {
            if let Impl::Dyn(f) = d.imp {
                by_sig.insert(d.signature, f);
            }
        }
        let mut out = Vec::with_capacity(self.inner.functions.len());
        for f in &self.inner.functions {
            if !f.cpu {
                out.push(None);
                continue;
            }
            let want = Signature::parse(&f.specialised(lib))?.to_string();
            let entry =
                by_sig.remove(&want).ok_or_else(|| Error::Runtime(format!("{}: not the library of `{want}`", path.path().display())))?;
            out.push(Some(entry));
        }
        Ok(Arc::new(out))
    }

    /// The library binding of a call of function `k`: its own type variables
    /// from the call, the others at their first dtype.
    fn call_lib(&self, k: usize, call: &Call<'_, '_>) -> Result<Vec<DType>> {
        let f = &self.inner.functions[k];
        let mut lib = self.first_dtypes();
        for (i, &v) in f.vars.iter().enumerate() {
            lib[v] = call
                .dtype(i)
                .ok_or_else(|| Error::Runtime(format!("{}: type variable {} is not bound", f.name(), self.inner.vars[v].0)))?;
        }
        Ok(lib)
    }

    fn run_cpu(&self, k: usize, call: &mut Call<'_, '_>) -> Result<()> {
        let lib = self.call_lib(k, call)?;
        let build = self.cpu_build(&lib)?;
        let f = build[k].as_ref().ok_or_else(|| call.layout_bug())?;
        f(call)
    }

    /// Compiles what a call would compile first, for the first dtype of
    /// every type variable: the CPU plugin (when there are CPU functions),
    /// and `cuda_source` to PTX (for the GPU's architecture, else
    /// [`CHECK_ARCH`]; skipped where NVRTC is not found). A broken source is
    /// an error here.
    pub fn check(&self) -> Result<()> {
        let lib = self.first_dtypes();
        if self.inner.functions.iter().any(|f| f.cpu) {
            self.cpu_build(&lib)?;
        }
        if self.inner.functions.iter().any(|f| f.cuda) && dlbridge_cuda::nvrtc::nvrtc().is_ok() {
            let arch = match dlbridge_cuda::probe::driver().ok().and_then(|_| CudaDevice::get(0).ok()) {
                Some(dev) => dev.nvrtc_arch(),
                None => CHECK_ARCH.to_string(),
            };
            self.cuda_ptx(&lib, &arch)?;
        }
        Ok(())
    }

    /// The definitions of function `k`: CPU and/or CUDA, one signature.
    fn defs(&self, k: usize) -> Vec<KernelDef> {
        let f = &self.inner.functions[k];
        let opts = KernelOpts { contiguous: !f.strided, ..KernelOpts::DEFAULT };
        let def = |device, imp: Impl, what: String| KernelDef {
            signature: f.text.clone(),
            device,
            imp,
            opts,
            origin: self.origin(),
            doc: format!("{what} of {ORIGIN} ({})", self.inner.name),
            identity: format!(
                "c_source:\n{}\ncuda_source:\n{}\nflags: {:?}\ncuda options: {:?}\n{}",
                self.inner.c_source.as_deref().unwrap_or(""),
                self.inner.cuda_source.as_deref().unwrap_or(""),
                self.cpu_flags(),
                self.inner.opts.cuda_options,
                self.inner.included.as_deref().unwrap_or("")
            ),
        };
        let (cpu, cuda) = (self.clone(), self.clone());
        let mut defs = Vec::with_capacity(2);
        if f.cpu {
            let imp = Impl::Dyn(Arc::new(move |call: &mut Call<'_, '_>| cpu.run_cpu(k, call)));
            defs.push(def(DeviceType::CPU, imp, format!("C function {}", f.prototype("", true))));
        }
        if f.cuda {
            let imp = Impl::Dyn(Arc::new(move |call: &mut Call<'_, '_>| cuda.run_cuda(k, call)));
            defs.push(def(DeviceType::CUDA, imp, format!("CUDA kernel {}", f.prototype("__global__ ", true))));
        }
        defs
    }

    /// [`check`](Self::check)s the sources, then registers every function
    /// under its name (CPU and/or CUDA implementations of its signature) and
    /// returns the kernels in the order given. A kernel compiled from source
    /// of the same name is replaced (as an `ElementwiseKernel` replaces one);
    /// a name taken by any other kernel (a built-in, a plugin's) is an error
    /// naming it, and then nothing is registered. Functions an earlier
    /// library of the same name had and this one has not are unregistered.
    pub fn register(&self, registry: &Registry) -> Result<Vec<Arc<Kernel>>> {
        self.check()?;
        for f in &self.inner.functions {
            if let Ok(k) = registry.get(f.name())
                && !replaceable(&k)
            {
                let origins: Vec<String> = k.origins().map(|(d, o)| format!("{d}: {o}")).collect();
                return Err(value_error(format!(
                    "load_inline {:?}: function `{}` clashes with the kernel `{}` already registered ({}); rename the function",
                    self.inner.name,
                    f.name(),
                    k.name(),
                    origins.join("; ")
                )));
            }
        }
        let origin = self.origin();
        for k in registry.list() {
            if k.origins().all(|(_, o)| o == origin) && !self.inner.functions.iter().any(|f| f.name() == k.name()) {
                registry.unregister(k.name());
            }
        }
        for f in &self.inner.functions {
            crate::source_kernel::claim_name(registry, f.name());
        }
        (0..self.inner.functions.len()).map(|k| registry.register_replacing(self.defs(k), replaceable)).collect()
    }
}

#[cfg(test)]
mod tests;

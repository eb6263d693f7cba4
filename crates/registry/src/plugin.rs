//! Loading kernel plugins: shared libraries that follow the C ABI in
//! `include/dlbridge/plugin.h` (version 1).
//!
//! Invariants: the library is opened with `libloading` and kept in an
//! `Arc<Library>` that every registered kernel closure holds, so the code and
//! the static table stay mapped while any kernel can still be called. Of the
//! table we read `abi_version` and `struct_size` first, and nothing else unless
//! the version is ours and the size covers the v1 struct; kernel descriptors
//! are read with the plugin's `kernel_size` stride only when it covers the v1
//! descriptor and keeps alignment. Strings are read only when non-NULL, one
//! byte at a time up to their NUL and never more than their field's bound
//! (`MAX_*_LEN` + 1 bytes: a longer string is refused without reading the
//! rest), and must be UTF-8. An entry point is only ever called with tensors the registry
//! checked against that kernel's (parsed, type-checked) signature, and with an
//! error buffer we own; the message is read up to the first NUL within the
//! buffer, never past it.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dlbridge_core::ffi::DLTensor;
use dlbridge_core::{DeviceType, Error, ErrorKind, Result};
use libloading::Library;
use smallvec::SmallVec;

use crate::arg::Arg;
use crate::call::Call;
use crate::kernel::{Impl, KernelDef, KernelOpts, Staging};
use crate::signature::{MAX_SIGNATURE_LEN, Scalar, Signature, clip};

/// The plugin ABI's C header, `include/dlbridge/plugin.h`, as text (for code
/// generators that paste it into what they compile).
pub const PLUGIN_H: &str = include_str!("../../../include/dlbridge/plugin.h");

/// The ABI version this build implements.
pub const ABI_VERSION: u32 = 1;
/// The symbol a plugin exports.
pub const SYMBOL: &str = "dlbridge_plugin";
/// `DLBRIDGE_KERNEL_ALIAS_OUTPUTS`
pub const FLAG_ALIAS_OUTPUTS: u32 = 1;
/// `DLBRIDGE_KERNEL_CONTIGUOUS`
pub const FLAG_CONTIGUOUS: u32 = 2;
/// `DLBRIDGE_KERNEL_ROW_MAJOR_OUTPUTS`
pub const FLAG_ROW_MAJOR_OUTPUTS: u32 = 4;
/// Most kernels one plugin may declare.
pub const MAX_KERNELS: u32 = 4096;
/// Longest plugin name, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// Longest plugin version, in bytes.
pub const MAX_VERSION_LEN: usize = 128;
/// Longest kernel description, in bytes.
pub const MAX_DOC_LEN: usize = 4096;
/// Most bytes of a loader's (`dlerror`) message an error quotes.
const MAX_REASON_LEN: usize = 512;

/// `DLBridgeScalar`
#[repr(C)]
#[derive(Clone, Copy)]
pub union RawScalar {
    /// f64 parameters.
    pub f64: f64,
    /// i64 parameters.
    pub i64: i64,
    /// bool parameters (0 or 1).
    pub boolean: i64,
}

/// `DLBridgeKernelFn`
pub type RawKernelFn = unsafe extern "C" fn(
    tensors: *const *mut DLTensor,
    num_tensors: i32,
    scalars: *const RawScalar,
    num_scalars: i32,
    stream: *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> i32;

/// `DLBridgeKernel` (v1 layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawKernel {
    /// NUL-terminated signature.
    pub signature: *const c_char,
    /// DLDeviceType.
    pub device_type: i32,
    /// `DLBRIDGE_KERNEL_*` flags.
    pub flags: u32,
    /// Entry point (NULL is refused).
    pub entry: Option<RawKernelFn>,
    /// One-line description or NULL.
    pub doc: *const c_char,
}

/// `DLBridgePlugin` (v1 layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawPlugin {
    /// ABI version.
    pub abi_version: u32,
    /// `sizeof(DLBridgePlugin)` as the plugin was compiled.
    pub struct_size: u32,
    /// Plugin name.
    pub name: *const c_char,
    /// Plugin version.
    pub version: *const c_char,
    /// `sizeof(DLBridgeKernel)` as the plugin was compiled.
    pub kernel_size: u32,
    /// Number of kernel descriptors.
    pub num_kernels: u32,
    /// The descriptors.
    pub kernels: *const RawKernel,
}

/// A `RawPlugin` in a `static` (Rust plugins; see [`export_plugin!`](crate::export_plugin)).
#[repr(transparent)]
#[derive(Debug)]
pub struct StaticPlugin(pub RawPlugin);
// SAFETY: the table and everything it points to is immutable static data.
unsafe impl Sync for StaticPlugin {}

/// What a plugin declares, as `dlbridge inspect` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// Canonical path of the library.
    pub path: PathBuf,
    /// Plugin name.
    pub name: String,
    /// Plugin version.
    pub version: String,
    /// ABI version it was built for.
    pub abi_version: u32,
    /// Its kernels.
    pub kernels: Vec<PluginKernel>,
}

/// One kernel of a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginKernel {
    /// Canonical signature text.
    pub signature: String,
    /// Device it runs on.
    pub device: DeviceType,
    /// Options from the flags.
    pub opts: KernelOpts,
    /// One-line description.
    pub doc: String,
}

impl fmt::Display for PluginInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "plugin  {} {}", self.name, self.version)?;
        writeln!(f, "path    {}", self.path.display())?;
        writeln!(f, "abi     {}", self.abi_version)?;
        writeln!(f, "kernels {}", self.kernels.len())?;
        for k in &self.kernels {
            write!(f, "  {}  [{}]", k.signature, k.device)?;
            if !k.doc.is_empty() {
                write!(f, "  {}", k.doc)?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// An opened, validated plugin whose kernels are ready to register.
pub struct Plugin {
    info: PluginInfo,
    defs: Vec<KernelDef>,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin").field("info", &self.info).finish()
    }
}

fn perr(path: &Path, msg: impl fmt::Display) -> Error {
    Error::Coded { kind: ErrorKind::Value, message: format!("plugin {}: {msg}", path.display()) }
}

/// Reads a C string field: non-NULL (unless `nullable`), at most `max` bytes,
/// UTF-8. At most `max + 1` bytes are read: a longer string is refused
/// without looking further.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string.
unsafe fn c_str(path: &Path, field: &str, p: *const c_char, nullable: bool, max: usize) -> Result<String> {
    if p.is_null() {
        return if nullable { Ok(String::new()) } else { Err(perr(path, format!("`{field}` is NULL"))) };
    }
    let p = p.cast::<u8>();
    let mut len = 0;
    loop {
        // SAFETY: every byte before `len` was non-NUL, so byte `len` is still
        // within the NUL-terminated string (the caller's contract).
        if unsafe { p.add(len).read() } == 0 {
            break;
        }
        if len == max {
            // SAFETY: the `max + 1` bytes before and at `len` are all in the string.
            let head = unsafe { std::slice::from_raw_parts(p, len.min(48)) };
            return Err(perr(
                path,
                format!("`{field}` is longer than {max} bytes (it starts `{}`)", String::from_utf8_lossy(head).escape_debug()),
            ));
        }
        len += 1;
    }
    // SAFETY: the `len` bytes before the NUL were just read: all in the string.
    let bytes = unsafe { std::slice::from_raw_parts(p, len) };
    std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| perr(path, format!("`{field}` is not UTF-8")))
}

/// Opens a library with every symbol bound now (`RTLD_NOW`): a function the
/// library calls but nothing defines is an error here, naming it, not a
/// process killed by the loader at the first call.
///
/// # Safety
/// As [`Library::new`]: the library's initialisers run.
unsafe fn open_now(path: &std::path::Path) -> Result<Library, libloading::Error> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library as Unix, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: the caller's contract.
        unsafe { Unix::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map(Library::from)
    }
    #[cfg(not(unix))]
    {
        // SAFETY: the caller's contract.
        unsafe { Library::new(path) }
    }
}

/// An error's text with the texts of its sources (libloading keeps the
/// `dlerror` message in the source), cut to a bounded length.
fn reason(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    clip(&text, MAX_REASON_LEN).into_owned()
}

impl Plugin {
    /// Opens a plugin library and runs every check [`Registry::load_plugin`]
    /// runs, without registering anything: the file exists
    /// ([`Error::FileNotFound`] if not) and loads, the table's version and
    /// sizes, every string (bounded, UTF-8), every signature (parsed and
    /// type-checked), device and flags, and that the kernels can be registered
    /// together (a name is declared once per device, and with one signature).
    /// Only conflicts with kernels already in a registry are left to
    /// [`Registry::load_plugin`].
    ///
    /// [`Registry::load_plugin`]: crate::Registry::load_plugin
    pub fn open(path: impl AsRef<Path>) -> Result<Plugin> {
        let given = path.as_ref();
        let path = given.canonicalize().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::FileNotFound { path: given.to_path_buf() },
            _ => Error::Coded { kind: ErrorKind::NotFound, message: format!("plugin {}: {e}", given.display()) },
        })?;
        Plugin::open_at(path)
    }

    /// [`Plugin::open`] of a library this process holds
    /// ([`crate::trust::HeldLibrary`]: the very bytes a caller checked), by
    /// the path it is given, unresolved (resolving it would name a file that
    /// is in no directory).
    pub fn open_held(held: &crate::trust::HeldLibrary) -> Result<Plugin> {
        Plugin::open_at(held.path().to_path_buf())
    }

    fn open_at(path: std::path::PathBuf) -> Result<Plugin> {
        // What the plugin's kernels are: its file's bytes (part of each kernel's digest).
        let identity = std::fs::read(&path).map_or_else(
            |_| String::new(),
            |bytes| {
                use sha2::{Digest, Sha256};
                let d: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
                format!("plugin file sha256 {d}")
            },
        );
        // SAFETY: loading a library runs its initialisers; loading a plugin means
        // trusting its code, which is what the user asked for.
        let lib = unsafe { open_now(&path) }.map_err(|e| perr(&path, format!("not a loadable shared library: {}", reason(&e))))?;
        let lib = Arc::new(lib);
        // SAFETY: the symbol's type is the ABI's `DLBridgePluginFn`.
        let get: libloading::Symbol<'_, unsafe extern "C" fn() -> *const RawPlugin> =
            unsafe { lib.get(SYMBOL.as_bytes()) }.map_err(|e| Error::Coded {
                kind: ErrorKind::NotFound,
                message: format!("plugin {}: no `{SYMBOL}` symbol ({})", path.display(), reason(&e)),
            })?;
        // SAFETY: calling the plugin's exported table function (no arguments).
        let table = unsafe { get() };
        if table.is_null() {
            return Err(perr(&path, format!("`{SYMBOL}()` returned NULL")));
        }
        // SAFETY: the first two u32 fields are frozen across ABI versions; the
        // pointer is non-NULL and points to the plugin's static table.
        let (abi_version, struct_size) = unsafe { (table.cast::<u32>().read_unaligned(), table.cast::<u32>().add(1).read_unaligned()) };
        if abi_version != ABI_VERSION {
            return Err(perr(
                &path,
                format!(
                    "ABI version {abi_version} (this dlbridge implements version {ABI_VERSION}{})",
                    if abi_version > ABI_VERSION { "; the plugin is from the future" } else { "" }
                ),
            ));
        }
        if (struct_size as usize) < std::mem::size_of::<RawPlugin>() {
            return Err(perr(
                &path,
                format!("struct_size {struct_size} is smaller than the v1 table ({} bytes)", std::mem::size_of::<RawPlugin>()),
            ));
        }
        if !(table as usize).is_multiple_of(std::mem::align_of::<RawPlugin>()) {
            return Err(perr(&path, "table is misaligned"));
        }
        // SAFETY: version and size checked: at least a v1 table lives there, aligned.
        let raw = unsafe { table.read() };
        // SAFETY: C strings from the table (NULL checked inside).
        let name = unsafe { c_str(&path, "name", raw.name, false, MAX_NAME_LEN) }?;
        // SAFETY: as above.
        let version = unsafe { c_str(&path, "version", raw.version, false, MAX_VERSION_LEN) }?;
        if raw.num_kernels > MAX_KERNELS {
            return Err(perr(&path, format!("num_kernels {} exceeds {MAX_KERNELS}", raw.num_kernels)));
        }
        let ksize = raw.kernel_size as usize;
        if raw.num_kernels > 0 {
            if ksize < std::mem::size_of::<RawKernel>() || !ksize.is_multiple_of(std::mem::align_of::<RawKernel>()) {
                return Err(perr(
                    &path,
                    format!(
                        "kernel_size {ksize} does not cover the v1 kernel descriptor ({} bytes, aligned)",
                        std::mem::size_of::<RawKernel>()
                    ),
                ));
            }
            if raw.kernels.is_null() || !(raw.kernels as usize).is_multiple_of(std::mem::align_of::<RawKernel>()) {
                return Err(perr(&path, "kernels is NULL or misaligned"));
            }
        }
        let mut kernels = Vec::new();
        let mut defs = Vec::new();
        for i in 0..raw.num_kernels as usize {
            // SAFETY: i < num_kernels, descriptors are `ksize` bytes apart (>= v1
            // size, aligned), the array is non-NULL and aligned (checked above).
            let k = unsafe { raw.kernels.cast::<u8>().add(i * ksize).cast::<RawKernel>().read() };
            // SAFETY: C string fields of the descriptor.
            let text = unsafe { c_str(&path, &format!("kernels[{i}].signature"), k.signature, false, MAX_SIGNATURE_LEN) }?;
            // SAFETY: as above.
            let doc = unsafe { c_str(&path, &format!("kernels[{i}].doc"), k.doc, true, MAX_DOC_LEN) }?;
            let sig = Signature::parse(&text).map_err(|e| perr(&path, format!("kernels[{i}]: {e}")))?;
            let device = DeviceType(k.device_type as u32);
            if k.device_type < 0 || !device.is_known() {
                return Err(perr(&path, format!("kernels[{i}] ({}): unknown device type {}", sig.name, k.device_type)));
            }
            let Some(entry) = k.entry else {
                return Err(perr(&path, format!("kernels[{i}] ({}): entry point is NULL", sig.name)));
            };
            if k.flags & !(FLAG_ALIAS_OUTPUTS | FLAG_CONTIGUOUS | FLAG_ROW_MAJOR_OUTPUTS) != 0 {
                return Err(perr(&path, format!("kernels[{i}] ({}): unknown flags {:#x}", sig.name, k.flags)));
            }
            let opts = KernelOpts {
                alias_outputs: k.flags & FLAG_ALIAS_OUTPUTS != 0,
                contiguous: k.flags & FLAG_CONTIGUOUS != 0,
                row_major_outputs: k.flags & FLAG_ROW_MAJOR_OUTPUTS != 0,
                per_element: false,
                kept_leading_dims: false,
            };
            kernels.push(PluginKernel { signature: sig.to_string(), device, opts, doc: doc.clone() });
            defs.push(KernelDef {
                signature: sig.to_string(),
                device,
                imp: Impl::Dyn(Arc::new(PluginEntry { lib: lib.clone(), entry, plugin: name.clone() }.into_fn())),
                opts,
                origin: format!("plugin {} {} ({})", name, version, path.display()),
                doc,
                identity: identity.clone(),
            });
        }
        // The checks registration makes among the plugin's own kernels, against
        // an empty registry.
        let empty = BTreeMap::new();
        let mut staging = Staging::new(&empty);
        for (i, def) in defs.iter().enumerate() {
            staging.add(def.clone()).map_err(|e| perr(&path, format!("kernels[{i}]: {e}")))?;
        }
        Ok(Plugin { info: PluginInfo { path, name, version, abi_version, kernels }, defs })
    }

    /// What the plugin declares.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// The kernel definitions, ready for [`Registry::register`](crate::Registry::register).
    pub fn into_defs(self) -> (PluginInfo, Vec<KernelDef>) {
        (self.info, self.defs)
    }
}

/// One plugin entry point, with the library it lives in.
struct PluginEntry {
    lib: Arc<Library>,
    entry: RawKernelFn,
    plugin: String,
}

impl PluginEntry {
    fn into_fn(self) -> impl Fn(&mut Call<'_, '_>) -> Result<()> + Send + Sync {
        move |call: &mut Call<'_, '_>| self.run(call)
    }

    fn run(&self, call: &mut Call<'_, '_>) -> Result<()> {
        let _library_stays_loaded = &self.lib;
        let stream = call.stream();
        let (args, outs) = call.split();
        let mut tensors: SmallVec<[DLTensor; 8]> = SmallVec::new();
        let mut scalars: SmallVec<[RawScalar; 4]> = SmallVec::new();
        for a in args.iter_mut() {
            match a {
                Arg::Tensor(v) => tensors.push(v.as_dltensor()),
                Arg::TensorMut(v) => tensors.push(v.as_dltensor()),
                Arg::Scalar(Scalar::F64(x)) => scalars.push(RawScalar { f64: *x }),
                Arg::Scalar(Scalar::I64(x)) => scalars.push(RawScalar { i64: *x }),
                Arg::Scalar(Scalar::Bool(x)) => scalars.push(RawScalar { boolean: i64::from(*x) }),
            }
        }
        for o in outs.iter_mut() {
            tensors.push(o.as_dltensor());
        }
        let mut ptrs: SmallVec<[*mut DLTensor; 8]> = tensors.iter_mut().map(|t| t as *mut DLTensor).collect();
        let mut err = [0u8; 1024];
        // SAFETY: the registry checked every tensor against the kernel's signature
        // (dtype, shape, device, writability, aliasing) before this closure runs; the
        // DLTensors point at views that outlive the call; the error buffer is ours
        // and its length is passed; the library is kept loaded by `self.lib`.
        let code = unsafe {
            (self.entry)(
                ptrs.as_mut_ptr().cast_const(),
                ptrs.len() as i32,
                scalars.as_ptr(),
                scalars.len() as i32,
                stream,
                err.as_mut_ptr().cast(),
                err.len(),
            )
        };
        if code == 0 {
            return Ok(());
        }
        let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
        let msg = String::from_utf8_lossy(&err[..end]);
        let msg = if msg.is_empty() { format!("failed with code {code}") } else { msg.into_owned() };
        Err(Error::Coded { kind: ErrorKind::from_code(code), message: format!("{msg} (plugin {})", self.plugin) })
    }
}

//! The registry: kernels compiled in (collected with `inventory`) and kernels
//! registered at run time, looked up by name.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use dlbridge_core::{DType, DeviceType, Error, Result, TensorViewMut};

use crate::call::Arg;
use crate::kernel::{Impl, Kernel, KernelDef, KernelFn, KernelOpts};
use crate::plugin::{Plugin, PluginInfo};

/// How a compiled-in kernel is implemented.
#[derive(Debug, Clone, Copy)]
pub enum StaticImpl {
    /// One function for every dtype.
    Generic(KernelFn),
    /// One function per dtype of the first type variable.
    PerDType(&'static [(DType, KernelFn)]),
}

/// A kernel compiled into the binary, collected with `inventory`. Use
/// [`register_kernel!`](crate::register_kernel) rather than building it by hand.
#[derive(Debug, Clone, Copy)]
pub struct KernelEntry {
    /// The signature text.
    pub signature: &'static str,
    /// The device it runs on.
    pub device: DeviceType,
    /// The implementation.
    pub imp: StaticImpl,
    /// Options.
    pub opts: KernelOpts,
    /// One-line description.
    pub doc: &'static str,
    /// Source file of the registration.
    pub file: &'static str,
    /// Source line of the registration.
    pub line: u32,
}

impl KernelEntry {
    /// Defaults for the optional fields (`..KernelEntry::DEFAULT`).
    pub const DEFAULT: KernelEntry = KernelEntry {
        signature: "",
        device: DeviceType::CPU,
        imp: StaticImpl::PerDType(&[]),
        opts: KernelOpts::DEFAULT,
        doc: "",
        file: "",
        line: 0,
    };

    fn def(&self) -> KernelDef {
        KernelDef {
            signature: self.signature.to_owned(),
            device: self.device,
            imp: match self.imp {
                StaticImpl::Generic(f) => Impl::Generic(f),
                StaticImpl::PerDType(l) => Impl::PerDType(l),
            },
            opts: self.opts,
            origin: format!("built-in ({}:{})", self.file, self.line),
            doc: self.doc.to_owned(),
        }
    }
}

inventory::collect!(KernelEntry);

/// Registers a Rust function as a kernel, compiled into the binary.
///
/// ```text
/// register_kernel!("relu<T: f32|f64>(x: T[...S]) -> (y: T[...S])",
///     dispatch { F32 => relu::<f32>, F64 => relu::<f64> },
///     opts = KernelOpts::ELEMENTWISE, doc = "max(x, 0)");
/// register_kernel!("copy<T: f32|i64>(x: T[...S]) -> (y: T[...S])", generic copy);
/// ```
/// `dispatch` names one function per dtype of the first type variable (the
/// `DType` constant names: `F32`, `BF16`, ...); `generic` one function for all.
#[macro_export]
macro_rules! register_kernel {
    ($sig:literal, dispatch { $($dt:ident => $f:expr),+ $(,)? } $(, $key:ident = $val:expr)* $(,)?) => {
        $crate::inventory::submit! {
            $crate::KernelEntry {
                signature: $sig,
                imp: $crate::StaticImpl::PerDType(&[$(($crate::DType::$dt, $f as $crate::KernelFn)),+]),
                file: file!(),
                line: line!(),
                $($key: $val,)*
                ..$crate::KernelEntry::DEFAULT
            }
        }
    };
    ($sig:literal, generic $f:expr $(, $key:ident = $val:expr)* $(,)?) => {
        $crate::inventory::submit! {
            $crate::KernelEntry {
                signature: $sig,
                imp: $crate::StaticImpl::Generic($f),
                file: file!(),
                line: line!(),
                $($key: $val,)*
                ..$crate::KernelEntry::DEFAULT
            }
        }
    };
}

/// Kernels by name. `Send + Sync`: share it freely; lookups take a read lock,
/// calls none (hold the `Arc<Kernel>` from [`Registry::get`]).
#[derive(Debug, Default)]
pub struct Registry {
    kernels: RwLock<BTreeMap<String, Arc<Kernel>>>,
    problems: Mutex<Vec<String>>,
    plugins: Mutex<BTreeMap<std::path::PathBuf, PluginInfo>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// A registry holding every compiled-in kernel linked into this binary.
    /// Registrations are sorted (inventory gives no order); a signature that
    /// does not parse or a duplicate is recorded in [`Registry::problems`].
    pub fn with_builtins() -> Registry {
        let reg = Registry::new();
        let mut entries: Vec<&KernelEntry> = inventory::iter::<KernelEntry>.into_iter().collect();
        entries.sort_by(|a, b| (a.signature, a.device.0, a.file, a.line).cmp(&(b.signature, b.device.0, b.file, b.line)));
        for e in entries {
            if let Err(err) = reg.register(e.def()) {
                reg.note_problem(format!("{}:{}: {err}", e.file, e.line));
            }
        }
        reg
    }

    /// The process-wide registry, built from the compiled-in kernels on first use.
    pub fn global() -> &'static Registry {
        static GLOBAL: OnceLock<Registry> = OnceLock::new();
        GLOBAL.get_or_init(Registry::with_builtins)
    }

    /// Registers a kernel at run time. A name already registered is an error,
    /// unless the signature and options are identical and the device is new (then
    /// the kernel gains an implementation for that device).
    pub fn register(&self, def: KernelDef) -> Result<Arc<Kernel>> {
        let name = crate::signature::Signature::parse(&def.signature)?.name;
        let mut map = self.kernels.write().unwrap_or_else(|p| p.into_inner());
        let kernel = match map.get(&name) {
            Some(existing) => Arc::new(existing.with_impl(def)?),
            None => Arc::new(Kernel::new(def)?),
        };
        map.insert(name, kernel.clone());
        Ok(kernel)
    }

    /// Removes a kernel (plugins use it to roll back a partial load).
    pub fn unregister(&self, name: &str) -> Option<Arc<Kernel>> {
        self.kernels.write().unwrap_or_else(|p| p.into_inner()).remove(name)
    }

    /// Looks a kernel up by name.
    pub fn get(&self, name: &str) -> Result<Arc<Kernel>> {
        let map = self.kernels.read().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = map.get(name) {
            return Ok(k.clone());
        }
        let mut near: Vec<&str> = map.keys().map(|k| k.as_str()).filter(|k| k.contains(name) || name.contains(*k)).collect();
        near.truncate(5);
        Err(Error::NotFound(if near.is_empty() {
            format!("no kernel named `{name}` ({} kernels registered; `dlbridge list` shows them)", map.len())
        } else {
            format!("no kernel named `{name}`; did you mean {}?", near.join(", "))
        }))
    }

    /// Every kernel, sorted by name.
    pub fn list(&self) -> Vec<Arc<Kernel>> {
        self.kernels.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// Looks up and calls a kernel in one step (use [`Registry::get`] once and
    /// [`Kernel::call`] in loops).
    pub fn call<'a>(&self, name: &str, args: &mut [Arg<'a>], outs: &mut [TensorViewMut<'a>]) -> Result<()> {
        self.get(name)?.call(args, outs)
    }

    /// Loads a plugin library and registers its kernels (all or none).
    ///
    /// The ABI version and table size are checked before anything else is read,
    /// every signature is parsed and type-checked, and the library stays loaded
    /// while any of its kernels is registered or held. Loading the same file
    /// again returns the same info and registers nothing new. A kernel name that
    /// is already registered (built in or by another plugin) is an error naming
    /// both origins, and the plugin's other kernels are rolled back.
    pub fn load_plugin(&self, path: impl AsRef<std::path::Path>) -> Result<PluginInfo> {
        let mut plugins = self.plugins.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(canonical) = path.as_ref().canonicalize()
            && let Some(info) = plugins.get(&canonical)
        {
            return Ok(info.clone());
        }
        let (info, defs) = Plugin::open(path)?.into_defs();
        let mut done: Vec<String> = Vec::new();
        for def in defs {
            let name = def.signature.clone();
            match self.register(def) {
                Ok(k) => done.push(k.name().to_owned()),
                Err(e) => {
                    for n in &done {
                        self.unregister(n);
                    }
                    return Err(e.context(format!("plugin {}: kernel `{name}`", info.path.display())));
                }
            }
        }
        plugins.insert(info.path.clone(), info.clone());
        Ok(info)
    }

    /// The plugins loaded so far.
    pub fn plugins(&self) -> Vec<PluginInfo> {
        self.plugins.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// Problems found while collecting compiled-in kernels (bad signatures, duplicates).
    pub fn problems(&self) -> Vec<String> {
        self.problems.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn note_problem(&self, p: String) {
        self.problems.lock().unwrap_or_else(|p| p.into_inner()).push(p);
    }
}

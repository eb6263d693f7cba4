//! The registry: kernels compiled in (collected with `inventory`) and kernels
//! registered at run time, looked up by name.
//!
//! Every change is all or nothing: the kernels a registration adds or extends
//! (one for [`Registry::register`], all of a plugin's for
//! [`Registry::load_plugin`], all of a list for [`Registry::register_all`]) are
//! built in a staging map over the current one under one write lock, and the
//! map is changed only when every one of them was built. A failure leaves the
//! registry exactly as it was: the same kernels, the same `Arc`s.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use dlbridge_core::{DType, DeviceType, Error, Result, TensorViewMut};

use crate::arg::Arg;
use crate::kernel::{Impl, Kernel, KernelDef, KernelFn, KernelOpts, Staging};
use crate::plugin::{Plugin, PluginInfo};
use crate::signature::Signature;

/// How a compiled-in kernel is implemented.
#[derive(Debug, Clone, Copy)]
pub enum StaticImpl {
    /// One function for every dtype.
    Generic(KernelFn),
    /// One function per dtype of the first type variable.
    PerDType(&'static [(DType, KernelFn)]),
    /// A resolver that instantiates one generic function for a dtype (see
    /// [`dtype_resolver!`](crate::dtype_resolver)). The dispatch table is derived
    /// from the signature: every dtype of the first type variable is resolved when
    /// the kernel is registered, and one the resolver cannot serve fails the
    /// registration loudly.
    Each(fn(DType) -> Option<KernelFn>),
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

    /// The kernel this entry implements on its device when its signature
    /// is a bare name (`"add"`): the declared kernel's signature and options
    /// are its own.
    fn implements(&self) -> Option<&'static str> {
        (!self.signature.contains('(')).then_some(self.signature)
    }

    fn def(&self) -> KernelDef {
        KernelDef {
            signature: self.signature.to_owned(),
            device: self.device,
            imp: match self.imp {
                StaticImpl::Generic(f) => Impl::Generic(f),
                StaticImpl::PerDType(l) => Impl::PerDType(l.into()),
                StaticImpl::Each(r) => Impl::Each(r),
            },
            opts: self.opts,
            origin: format!("built-in ({}:{})", self.file, self.line),
            doc: self.doc.to_owned(),
            identity: String::new(),
        }
    }
}

inventory::collect!(KernelEntry);

/// Makes a macro that turns a generic kernel function into a dtype resolver for
/// [`register_kernel!`](crate::register_kernel)'s `each` form, over one family of
/// Rust element types — the one list of types a kernel crate keeps per trait
/// bound, shared by every kernel with that bound:
///
/// ```text
/// dtype_resolver!(floats: f32, f64, half::f16, half::bf16);
/// register_kernel!("gelu<T: f32|f64>(x: T[...S]) -> (y: T[...S])", each floats!(gelu));
/// ```
#[macro_export]
macro_rules! dtype_resolver {
    ($name:ident: $($t:ty),+ $(,)?) => {
        macro_rules! $name {
            ($f:ident) => {{
                fn resolve(d: $crate::DType) -> ::core::option::Option<$crate::KernelFn> {
                    $( if d == <$t as $crate::dlbridge_core::Element>::DTYPE { return ::core::option::Option::Some($f::<$t> as $crate::KernelFn); } )+
                    ::core::option::Option::None
                }
                resolve as fn($crate::DType) -> ::core::option::Option<$crate::KernelFn>
            }};
        }
    };
}

/// Registers a Rust function as a kernel, compiled into the binary.
///
/// ```text
/// register_kernel!("relu<T: f32|f64>(x: T[...S]) -> (y: T[...S])",
///     each floats!(relu), opts = KernelOpts::ELEMENTWISE, doc = "max(x, 0)");
/// register_kernel!("copy<T: f32|i64>(x: T[...S]) -> (y: T[...S])", generic copy);
/// ```
/// `each RESOLVER` (the usual form) derives the dispatch table from the
/// signature: `RESOLVER` is a `fn(DType) -> Option<KernelFn>` that instantiates a
/// generic function for a dtype, normally made once per family of types with
/// [`dtype_resolver!`](crate::dtype_resolver); every dtype the signature allows must
/// resolve, or the registration fails (and `Registry::problems` says why).
/// `dispatch` names one function per dtype of the first type variable (the
/// `DType` constant names: `F32`, `BF16`, ...); `generic` one function for all.
///
/// A bare name in place of the signature (`register_kernel!("add", dispatch {
/// F32 => add_f32 }, device = DeviceType::CUDA)`) implements, on another device,
/// the kernel that a full registration declares: its signature and options
/// are the declaration's, written once. Without a declaration the
/// registration fails (and `Registry::problems` says so).
///
/// The signature's shape is checked when the program compiles
/// ([`signature_is_well_formed`]): an unclosed bracket is a compile error,
/// not a kernel missing at run time.
///
/// ```compile_fail
/// fn f(_: &mut dlbridge_registry::Call<'_, '_>) -> dlbridge_core::Result<()> { Ok(()) }
/// dlbridge_registry::register_kernel!("neg(x: f32[N) -> (y: f32[N])", generic f);
/// ```
#[macro_export]
macro_rules! register_kernel {
    (@entry $sig:expr, $imp:expr $(, $key:ident = $val:expr)*) => {
        const _: () = ::core::assert!(
            $crate::signature_is_well_formed($sig),
            "register_kernel!: the signature's name, brackets or arrow are malformed (see dlbridge_registry::signature_is_well_formed)"
        );
        $crate::inventory::submit! {
            $crate::KernelEntry {
                signature: $sig,
                imp: $imp,
                file: file!(),
                line: line!(),
                $($key: $val,)*
                ..$crate::KernelEntry::DEFAULT
            }
        }
    };
    ($sig:expr, dispatch { $($dt:ident => $f:expr),+ $(,)? } $(, $key:ident = $val:expr)* $(,)?) => {
        $crate::register_kernel!(@entry $sig, $crate::StaticImpl::PerDType(&[$(($crate::DType::$dt, $f as $crate::KernelFn)),+]) $(, $key = $val)*);
    };
    ($sig:expr, each $r:expr $(, $key:ident = $val:expr)* $(,)?) => {
        $crate::register_kernel!(@entry $sig, $crate::StaticImpl::Each($r) $(, $key = $val)*);
    };
    ($sig:expr, generic $f:expr $(, $key:ident = $val:expr)* $(,)?) => {
        $crate::register_kernel!(@entry $sig, $crate::StaticImpl::Generic($f) $(, $key = $val)*);
    };
}

/// What [`register_kernel!`] checks of a signature text while the program
/// compiles: a name (letters, digits, `_`), then either nothing (an
/// implementation of a declared kernel) or `(`...`)` with every `(`, `[` and
/// `<` closed in order and, after the parameters, nothing or ` -> (`...`)`.
/// The full check is [`Signature::parse`] at registration.
pub const fn signature_is_well_formed(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    let start = i;
    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
        i += 1;
    }
    if i == start || b[start].is_ascii_digit() {
        return false;
    }
    if i == b.len() {
        return true; // a bare name
    }
    // Brackets closed in order; `>` of `->` is not a bracket.
    let mut stack = [0u8; 64];
    let mut depth = 0;
    let mut closed_params = 0; // top-level `(...)` groups seen
    while i < b.len() {
        let c = b[i];
        match c {
            b'(' | b'[' | b'<' => {
                if depth == stack.len() {
                    return false;
                }
                stack[depth] = c;
                depth += 1;
            }
            b')' | b']' | b'>' => {
                if c == b'>' && i > 0 && b[i - 1] == b'-' {
                    if depth != 0 || closed_params != 1 {
                        return false; // an arrow inside brackets, or before the parameters
                    }
                } else {
                    let open = match c {
                        b')' => b'(',
                        b']' => b'[',
                        _ => b'<',
                    };
                    if depth == 0 || stack[depth - 1] != open {
                        return false;
                    }
                    depth -= 1;
                    if depth == 0 && c == b')' {
                        closed_params += 1;
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    depth == 0 && (closed_params == 1 || closed_params == 2)
}

/// Kernels by name. `Send + Sync`: share it freely; lookups take a read lock,
/// calls none (hold the `Arc<Kernel>` from [`Registry::get`]).
#[derive(Debug, Default)]
pub struct Registry {
    kernels: RwLock<BTreeMap<String, Arc<Kernel>>>,
    problems: Mutex<Vec<String>>,
    /// Names whose compiled-in registrations were rejected: claimed with
    /// different signatures, options or the same device twice (none of them is
    /// registered), or refused (a signature that does not parse, a dtype its
    /// dispatch does not cover). A lookup is an error that says why.
    conflicts: Mutex<BTreeMap<String, String>>,
    plugins: Mutex<BTreeMap<std::path::PathBuf, PluginInfo>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// A registry holding every compiled-in kernel linked into this binary.
    /// Registrations are sorted (inventory gives no order); a signature that
    /// does not parse is recorded in [`Registry::problems`].
    ///
    /// Each registration is applied whole or not at all (a rejected one leaves
    /// no trace but its problem). A name is one kernel: registrations of one
    /// name that disagree (another signature or options, or the same device
    /// twice) register none of them, whichever came first, so no registration
    /// silently replaces another (a program's own `relu` never stands in for the
    /// built-in, nor the built-in for it). Looking the name up is then an error
    /// naming every registration of it, and so is its problem.
    pub fn with_builtins() -> Registry {
        let reg = Registry::new();
        let mut entries: Vec<&KernelEntry> = inventory::iter::<KernelEntry>.into_iter().collect();
        // Declarations first: an implementation by name joins the kernel its
        // declaration made.
        entries.sort_by_key(|e| (e.implements().is_some(), e.signature, e.device.0, e.file, e.line));
        let mut map = reg.kernels.write().unwrap_or_else(|p| p.into_inner());
        // Every registration of each name, for the conflicts' messages.
        let mut claims: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut conflicts: BTreeSet<String> = BTreeSet::new();
        // Names whose only registrations were refused, with why.
        let mut refused: BTreeMap<String, String> = BTreeMap::new();
        for e in entries {
            let mut def = e.def();
            if let Some(name) = e.implements() {
                if conflicts.contains(name) {
                    continue;
                }
                let Some(k) = map.get(name) else {
                    let problem = format!(
                        "{}:{}: a {} implementation of `{name}`, but no registration declares `{name}` with its signature",
                        e.file, e.line, e.device
                    );
                    refused.entry(name.to_owned()).or_insert_with(|| problem.clone());
                    reg.note_problem(problem);
                    continue;
                };
                (def.signature, def.opts) = (k.signature_text().to_owned(), k.opts());
            }
            let sig = Signature::parse(&def.signature).ok();
            if let Some(sig) = &sig {
                let claim = format!("`{}` on {} at {}:{}", e.signature, e.device, e.file, e.line);
                claims.entry(sig.name.clone()).or_default().push(claim);
                // Another kernel of this name that this one cannot join (another
                // signature or options, or this device again), or one withdrawn.
                let disagrees =
                    map.get(&sig.name).is_some_and(|k| k.signature() != sig || k.opts() != def.opts || k.devices().any(|d| d == e.device));
                if disagrees || conflicts.contains(&sig.name) {
                    conflicts.insert(sig.name.clone());
                    continue;
                }
            }
            let name =
                sig.as_ref().map(|s| s.name.clone()).or_else(|| e.implements().map(str::to_owned)).or_else(|| name_in(&def.signature));
            let mut staging = Staging::new(&map);
            match staging.add(def) {
                Ok(_) => {
                    let changes = staging.into_changes();
                    map.extend(changes);
                }
                Err(err) => {
                    let problem = format!("{}:{}: {err}", e.file, e.line);
                    if let Some(name) = name {
                        refused.entry(name).or_insert_with(|| problem.clone());
                    }
                    reg.note_problem(problem);
                }
            }
        }
        let mut withdrawn = reg.conflicts.lock().unwrap_or_else(|p| p.into_inner());
        for (name, problem) in refused {
            if !map.contains_key(&name) && !conflicts.contains(&name) {
                withdrawn.insert(name.clone(), format!("kernel `{name}` was not registered: {problem}"));
            }
        }
        for name in conflicts {
            map.remove(&name);
            let all = claims.remove(&name).unwrap_or_default();
            let msg = format!(
                "kernel {name} is registered {} times, and the registrations disagree: {}; none of them is registered (rename one)",
                all.len(),
                all.join("; ")
            );
            reg.note_problem(msg.clone());
            withdrawn.insert(name, msg);
        }
        drop(withdrawn);
        drop(map);
        reg
    }

    /// The process-wide registry, built from the compiled-in kernels on first use.
    pub fn global() -> &'static Registry {
        static GLOBAL: OnceLock<Registry> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let reg = Registry::with_builtins();
            // A registration this program made and the registry refused is said at
            // once, not found later as a missing kernel.
            for p in reg.problems() {
                eprintln!("dlbridge: a kernel registration was rejected: {p}");
            }
            reg
        })
    }

    /// Registers a kernel at run time. A name already registered is an error,
    /// unless the signature and options are identical and the device is new (then
    /// the kernel gains an implementation for that device: a new `Arc<Kernel>`
    /// replaces the old one, which holders of it keep using unchanged).
    pub fn register(&self, def: KernelDef) -> Result<Arc<Kernel>> {
        let mut map = self.kernels.write().unwrap_or_else(|p| p.into_inner());
        let mut staging = Staging::new(&map);
        let kernel = staging.add(def)?;
        let changes = staging.into_changes();
        map.extend(changes);
        Ok(kernel)
    }

    /// Registers several kernels, all or none: when one fails (its error is
    /// returned, with its index as context) the registry is left exactly as it
    /// was. Later definitions see earlier ones (a list may give one kernel for
    /// several devices). Returns the registered kernels, one per definition.
    pub fn register_all(&self, defs: impl IntoIterator<Item = KernelDef>) -> Result<Vec<Arc<Kernel>>> {
        let mut map = self.kernels.write().unwrap_or_else(|p| p.into_inner());
        let mut staging = Staging::new(&map);
        let mut names = Vec::new();
        for (i, def) in defs.into_iter().enumerate() {
            let k = staging.add(def).map_err(|e| e.context(format!("definition {i}")))?;
            names.push(k.name().to_owned());
        }
        let changes = staging.into_changes();
        let kernels = names.iter().filter_map(|n| changes.get(n).cloned()).collect();
        map.extend(changes);
        Ok(kernels)
    }

    /// Registers `defs` (one kernel, on one or more devices) in place of the
    /// kernel of the same name when `replaceable` says the registered one may
    /// be replaced (kernels compiled from source at run time replace their own
    /// earlier versions, as CuPy's kernels of one name do); otherwise exactly
    /// as [`Registry::register_all`]. One step under the registry's lock:
    /// nobody sees the name missing. Holders of the old `Arc` keep it.
    pub fn register_replacing(&self, defs: Vec<KernelDef>, replaceable: impl Fn(&Kernel) -> bool) -> Result<Arc<Kernel>> {
        let mut map = self.kernels.write().unwrap_or_else(|p| p.into_inner());
        let name = match defs.first() {
            Some(d) => crate::signature::Signature::parse(&d.signature)?.name,
            None => return Err(Error::InvalidArgument("register_replacing: no definitions".into())),
        };
        let old = map.get(&name).filter(|k| replaceable(k)).cloned();
        if old.is_some() {
            map.remove(&name);
        }
        let mut staging = Staging::new(&map);
        let mut last = None;
        for (i, def) in defs.into_iter().enumerate() {
            match staging.add(def) {
                Ok(k) => last = Some(k),
                Err(e) => {
                    drop(staging);
                    if let Some(k) = old {
                        map.insert(name, k);
                    }
                    return Err(e.context(format!("definition {i}")));
                }
            }
        }
        let changes = staging.into_changes();
        map.extend(changes);
        map.get(&name).cloned().or(last).ok_or_else(|| Error::Runtime(format!("{name}: not registered")))
    }

    /// Removes a kernel with all its implementations (holders of its `Arc`
    /// keep a working kernel).
    pub fn unregister(&self, name: &str) -> Option<Arc<Kernel>> {
        self.kernels.write().unwrap_or_else(|p| p.into_inner()).remove(name)
    }

    /// Looks a kernel up by name.
    pub fn get(&self, name: &str) -> Result<Arc<Kernel>> {
        let map = self.kernels.read().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = map.get(name) {
            return Ok(k.clone());
        }
        if let Some(msg) = self.conflicts.lock().unwrap_or_else(|p| p.into_inner()).get(name) {
            return Err(Error::InvalidArgument(msg.clone()));
        }
        let mut near: Vec<&str> = map.keys().map(|k| k.as_str()).filter(|k| k.contains(name) || name.contains(*k)).collect();
        near.truncate(5);
        let rejected = self.problems.lock().unwrap_or_else(|p| p.into_inner()).len();
        let problems = match rejected {
            0 => String::new(),
            1 => "; Registry::problems() lists 1 rejected registration".to_owned(),
            n => format!("; Registry::problems() lists {n} rejected registrations"),
        };
        Err(Error::NotFound(if near.is_empty() {
            format!(
                "no kernel named `{name}` ({} kernels registered: `Registry::list()` shows them, `dlbridge list` the built-ins{problems})",
                map.len()
            )
        } else {
            format!("no kernel named `{name}`; did you mean {}?{problems}", near.join(", "))
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
    /// again returns the same info and registers nothing new. A missing file is
    /// [`Error::FileNotFound`]. Every check [`Plugin::open`] makes runs first; then
    /// a kernel that conflicts with one already registered (built in or by
    /// another plugin: another signature, or the same device twice) is an error
    /// naming both origins, and nothing of the plugin is registered. A kernel
    /// with the signature and options of a registered one and a new device
    /// extends it.
    pub fn load_plugin(&self, path: impl AsRef<std::path::Path>) -> Result<PluginInfo> {
        let mut plugins = self.plugins.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(canonical) = path.as_ref().canonicalize()
            && let Some(info) = plugins.get(&canonical)
        {
            return Ok(info.clone());
        }
        let (info, defs) = Plugin::open(path)?.into_defs();
        let mut map = self.kernels.write().unwrap_or_else(|p| p.into_inner());
        let mut staging = Staging::new(&map);
        for (i, def) in defs.into_iter().enumerate() {
            let name = info.kernels.get(i).and_then(|k| k.signature.split(['<', '(']).next()).unwrap_or("?");
            staging.add(def).map_err(|e| e.context(format!("plugin {}: kernels[{i}] ({name})", info.path.display())))?;
        }
        let changes = staging.into_changes();
        map.extend(changes);
        drop(map);
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

/// The kernel name a signature text starts with, if it starts with one (for
/// a signature that does not parse).
fn name_in(text: &str) -> Option<String> {
    let head = text.trim_start();
    let end = head.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(head.len());
    let name = &head[..end];
    (!name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit())).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::signature_is_well_formed as ok;

    #[test]
    fn the_compile_time_check_catches_unclosed_and_misplaced_brackets() {
        for good in [
            "add<T: f32|f64>(a: T[...S], b: T[...S]) -> (out: T[...S])",
            "matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])",
            "axpy<T: f32>(alpha: f64, x: T[N], y: mut T[N])",
            "c_dot(a: f64[N], b: f64[N]) -> (out: f64[])",
            "add",
            "nop()",
        ] {
            assert!(ok(good), "{good}");
        }
        for bad in [
            "neg(x: f32[N) -> (y: f32[N])",
            "neg(x: f32[N]) -> (y: f32[N]",
            "neg<T: f32(x: T[N]) -> (y: T[N])",
            "neg(x: f32[N]] -> (y: f32[N])",
            "(x: f32[N])",
            "9neg(x: f32[N])",
            "neg -> (y: f32[N])",
            "neg(x: f32[N]) (y: f32[N]) (z: f32[N])",
            "",
        ] {
            assert!(!ok(bad), "{bad}");
        }
    }
}

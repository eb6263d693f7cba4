//! What every kernel compiled from source shares: its origin (by which a later
//! kernel of the same name may replace it), the specialisations built per
//! dtype combination on first use, and building and loading one from the
//! library cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dlbridge_core::{DType, Error, Result};
use dlbridge_registry::{Call, DynKernelFn, Impl, Kernel, KernelDef, Plugin, Signature};

use crate::builder::cache::LibraryCache;
use crate::params::bind_text;
use crate::spec::Spec;

/// The origin every kernel compiled from source carries (and by which a later
/// kernel of the same name may replace it).
pub const ORIGIN_PREFIX: &str = "compiled from source by dlbridge-compile";

/// The origin of the functions of `dlbridge.load_inline` (the libraries of
/// [`InlineLibrary`](crate::inline::InlineLibrary)).
pub const INLINE_ORIGIN: &str = "dlbridge.load_inline";

/// Whether a registered kernel may be replaced by a kernel compiled from
/// source of the same name: every implementation of it was compiled from
/// source (an `ElementwiseKernel`, a `ReductionKernel`, a function of
/// `dlbridge.load_inline`); a built-in or a plugin's kernel never is.
pub(crate) fn replaceable(k: &Kernel) -> bool {
    k.origins().all(|(_, o)| o.starts_with(ORIGIN_PREFIX) || o.starts_with(INLINE_ORIGIN))
}

/// A CPU implementation that builds (once) and runs the specialisation for
/// the call's bound type variables `vars` (in signature order).
pub(crate) fn specialising(
    name: &str,
    vars: Vec<char>,
    specs: Arc<Specialisations>,
    build: impl Fn(&[(char, DType)]) -> Result<DynKernelFn> + Send + Sync + 'static,
) -> Impl {
    let name = name.to_owned();
    Impl::Dyn(Arc::new(move |call: &mut Call<'_, '_>| -> Result<()> {
        let mut dtypes = Vec::with_capacity(vars.len());
        for (i, v) in vars.iter().enumerate() {
            dtypes.push(call.dtype(i).ok_or_else(|| Error::Runtime(format!("{name}: type variable {v} is not bound")))?);
        }
        let f = specs.get(&dtypes, || build(&vars.iter().copied().zip(dtypes.iter().copied()).collect::<Vec<_>>()))?;
        // The generated entry point runs its parallel loops on dlbridge's
        // threads, within the call's budget (see `dlbridge_cpu::ffi`).
        let context = dlbridge_cpu::ffi::CpuContext::current();
        call.with_stream((&raw const context).cast_mut().cast(), |call| f(call))
    }))
}

/// The library of one specialisation from the cache, compiled from its C++
/// `source` if need be; errors name the specialisation and point into the
/// user's texts.
pub(crate) fn build_library<S: Spec>(spec: &S, bind: &[(char, DType)], source: &str) -> Result<DynKernelFn> {
    let expected = spec.specialised_signature(bind)?;
    LibraryCache::global().get_or_build(source, &bind_text(bind), &spec.what(bind), &spec.texts(), |path| load_one(path, &expected))
}

/// Opens a compiled library through the plugin loader and takes its one
/// kernel, checking it is the expected specialisation.
pub(crate) fn load_one(held: &crate::builder::cache::HeldLibrary, expected: &str) -> Result<DynKernelFn> {
    let path = held.path();
    let (info, defs) = Plugin::open_held(held)?.into_defs();
    let want = Signature::parse(expected)?.to_string();
    match defs.into_iter().next() {
        Some(KernelDef { imp: Impl::Dyn(f), signature, .. }) if info.kernels.len() == 1 && signature == want => Ok(f),
        _ => Err(Error::Runtime(format!("{}: not the library of `{want}`", path.display()))),
    }
}

/// The specialisations of one kernel, by dtypes. Each slot has a lock of its
/// own: threads calling with the same new dtypes wait for one compilation;
/// other dtypes are not held up.
pub(crate) struct Specialisations<K = Vec<DType>, V = DynKernelFn> {
    slots: Mutex<HashMap<K, Slot<V>>>,
}

impl<K, V> Default for Specialisations<K, V> {
    fn default() -> Self {
        Specialisations { slots: Mutex::new(HashMap::new()) }
    }
}

/// One specialisation: built once, under its own lock.
type Slot<V> = Arc<Mutex<Option<V>>>;

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Specialisations<K, V> {
    /// How many are built.
    pub(crate) fn built(&self) -> usize {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).values().filter(|s| s.lock().is_ok_and(|s| s.is_some())).count()
    }

    pub(crate) fn get<Q>(&self, key: &Q, build: impl FnOnce() -> Result<V>) -> Result<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            match slots.get(key) {
                Some(s) => s.clone(),
                None => slots.entry(key.to_owned()).or_default().clone(),
            }
        };
        let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = &*s {
            return Ok(f.clone());
        }
        let f = build()?;
        *s = Some(f.clone());
        Ok(f)
    }
}

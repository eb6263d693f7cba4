//! Kernels named by identity rather than by name: a compiled program of
//! another framework (an XLA custom call) that was built for one kernel
//! runs that kernel, even after its name is given to another one
//! (`dlbridge.define` again, a recompiled `ElementwiseKernel`).
//!
//! A handle is a number, never reused in a process; the table holds weak
//! references, so a handle keeps nothing alive: whoever made the program
//! holds the kernel (dlbridge.jax's operator holds its `dlbridge.Kernel`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::Kernel;

static NEXT: AtomicU64 = AtomicU64::new(1);
static TABLE: Mutex<Option<HashMap<u64, Weak<Kernel>>>> = Mutex::new(None);

/// A new handle for `kernel`.
pub fn handle(kernel: &Arc<Kernel>) -> u64 {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut table = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
    let table = table.get_or_insert_with(HashMap::new);
    if table.len() >= 64 && table.len().is_power_of_two() {
        table.retain(|_, k| k.strong_count() > 0);
    }
    table.insert(id, Arc::downgrade(kernel));
    id
}

/// The kernel of `id`, while it lives.
pub fn resolve(id: u64) -> Option<Arc<Kernel>> {
    TABLE.lock().unwrap_or_else(PoisonError::into_inner).as_ref()?.get(&id)?.upgrade()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KernelDef, Registry};

    #[test]
    fn a_handle_names_its_kernel_after_the_name_moves_on_and_nothing_once_it_is_gone() {
        let def = |doc: &str| KernelDef { doc: doc.into(), ..KernelDef::cpu("h(x: f32[N]) -> (y: f32[N])", |_call| Ok(())) };
        let reg = Registry::new();
        let first = reg.register_replacing(vec![def("first")], |_| true).unwrap();
        let id = handle(&first);
        let second = reg.register_replacing(vec![def("second")], |_| true).unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(Arc::ptr_eq(&resolve(id).unwrap(), &first));
        assert!(Arc::ptr_eq(&reg.get("h").unwrap(), &second));
        let again = handle(&first);
        assert_ne!(id, again, "a handle is never reused");
        drop(first);
        assert!(resolve(id).is_none() && resolve(again).is_none());
        assert!(resolve(0).is_none());
    }
}

//! Where the caches of kernels compiled from source live.

use std::path::PathBuf;

use dlbridge_registry::trust::euid;

/// The root of dlbridge's caches: `$DLBRIDGE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/dlbridge`, else `~/.cache/dlbridge`.
pub fn cache_root() -> Option<PathBuf> {
    let var = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty()).map(PathBuf::from);
    var("DLBRIDGE_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("dlbridge")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/dlbridge")))
}

/// Where CPU libraries are cached: [`cache_root`]`/cpu`, else
/// `dlbridge-cache-<uid>/cpu` under the system's temporary directory (one per
/// user; [`trusted_dir`](dlbridge_registry::trust::trusted_dir) refuses it when another user made it first).
pub fn cpu_cache_dir() -> PathBuf {
    cpu_dir_under(cache_root())
}

/// `root/cpu`, or the per-user fallback's.
fn cpu_dir_under(root: Option<PathBuf>) -> PathBuf {
    root.unwrap_or_else(|| std::env::temp_dir().join(format!("dlbridge-cache-{}", euid()))).join("cpu")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_cache_root_the_directory_is_one_per_user() {
        let dir = cpu_dir_under(None);
        assert!(dir.starts_with(std::env::temp_dir()), "{}", dir.display());
        assert!(dir.ends_with(format!("dlbridge-cache-{}/cpu", euid())), "{}", dir.display());
    }
}

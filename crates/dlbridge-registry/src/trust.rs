//! Which directories may hold code this process loads: the caches of kernels
//! compiled at run time (C++ libraries, NVRTC's PTX and CUBIN images, the
//! toolchain's probe answers) live in such directories, so whoever can write
//! one can run code here.
//!
//! A directory is trusted when it is a real directory (not a symbolic link),
//! owned by this process's effective user and writable by no one else, as pip
//! and ccache require of their caches. Files in it are read only when they are
//! regular files, never through a symbolic link.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

/// This process's effective user id.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Creates `dir` (mode 0700 for each directory it creates) and checks that it
/// may hold code this process runs: a real directory, not a symbolic link,
/// owned by this process's user and writable by no one else. `Err` says why not.
pub fn trusted_dir(dir: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| format!("it cannot be created: {e}"))?;
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("it cannot be read: {e}"))?;
    if m.file_type().is_symlink() {
        return Err("it is a symbolic link".into());
    }
    if !m.is_dir() {
        return Err("it is not a directory".into());
    }
    if m.uid() != euid() {
        return Err(format!("it belongs to user {}, not to this process's user {}", m.uid(), euid()));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!("users other than its owner may write it (mode {:o})", m.mode() & 0o7777));
    }
    Ok(())
}

/// Whether `path` is a regular file (a symbolic link is not, whatever it points at).
pub fn is_plain_file(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_directory_others_may_write_or_a_symlink_is_not_trusted() {
        let root = std::env::temp_dir().join(format!("dlbridge-trust-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mine = root.join("mine");
        trusted_dir(&mine).unwrap();
        assert_eq!(std::fs::metadata(&mine).unwrap().permissions().mode() & 0o777, 0o700, "created 0700");
        let open = root.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(trusted_dir(&open).unwrap_err().contains("users other than its owner may write it (mode 777)"));
        let link = root.join("link");
        std::os::unix::fs::symlink(&mine, &link).unwrap();
        assert_eq!(trusted_dir(&link).unwrap_err(), "it is a symbolic link");
        let file = root.join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(is_plain_file(&file) && !is_plain_file(&link) && !is_plain_file(&mine));
        std::fs::remove_dir_all(&root).unwrap();
    }
}

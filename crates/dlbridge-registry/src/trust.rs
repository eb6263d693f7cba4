//! Which directories may hold code this process loads: the caches of kernels
//! compiled at run time (C++ libraries, NVRTC's PTX and CUBIN images, the
//! toolchain's probe answers) live in such directories, so whoever can write
//! one can run code here.
//!
//! A directory is trusted when it is a real directory (not a symbolic link),
//! owned by this process's effective user and writable by no one else, as pip
//! and ccache require of their caches. Files in it are read only when they are
//! regular files, never through a symbolic link.
//!
//! What a cache keeps is sealed: each file's bytes carry an HMAC-SHA256 under a
//! secret of this user's ([`seal`], [`sealed`]), kept outside every cache
//! directory. Whoever can write a cache directory, or copies one from another
//! machine, cannot make a file that passes: a library is checked before
//! `dlopen` sees it, so a replaced library's constructor never runs.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hmac::{Hmac, Mac};
use sha2::Sha256;

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

/// The seal of `contents` kept under `name` (the name binds it to its file:
/// a seal moved to another file does not pass): a hex HMAC-SHA256 under this
/// user's secret ([`secret_file`]).
pub fn seal(name: &str, contents: &[u8]) -> String {
    mac(name, contents).finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `tag` is the seal of `contents` under `name` (compared in constant time).
pub fn sealed(name: &str, contents: &[u8], tag: &str) -> bool {
    let tag = tag.trim();
    if tag.len() != 64 || !tag.bytes().all(|b| b.is_ascii_hexdigit()) {
        return false;
    }
    let bytes: Vec<u8> = (0..32).map(|i| u8::from_str_radix(&tag[2 * i..2 * i + 2], 16).unwrap_or(0)).collect();
    mac(name, contents).verify_slice(&bytes).is_ok()
}

fn mac(name: &str, contents: &[u8]) -> Hmac<Sha256> {
    // Any key length is accepted by HMAC: `new_from_slice` cannot fail here.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret()).unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    m.update(&(name.len() as u64).to_le_bytes());
    m.update(name.as_bytes());
    m.update(contents);
    m
}

/// Where this user's secret is kept: `$XDG_CONFIG_HOME/dlbridge/cache.key`, else
/// `~/.config/dlbridge/cache.key`, else `dlbridge-key-<uid>/cache.key` under the
/// system's temporary directory. Never in a cache directory, so a cache that is
/// copied or written by someone else brings no secret with it.
pub fn secret_file() -> PathBuf {
    let var = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty()).map(PathBuf::from);
    var("XDG_CONFIG_HOME")
        .map(|d| d.join("dlbridge"))
        .or_else(|| var("HOME").map(|h| h.join(".config/dlbridge")))
        .unwrap_or_else(|| std::env::temp_dir().join(format!("dlbridge-key-{}", euid())))
        .join("cache.key")
}

/// This user's secret: read from [`secret_file`] (a regular file of 32 bytes
/// that only its owner, this process's user, may read or write, in a
/// directory [`trusted_dir`] accepts), else created there (0600, exclusively).
/// When neither can be done, a secret of this process alone (a warning says
/// why, once): what it seals is then never accepted by another process, so
/// the caches are rebuilt rather than trusted.
fn secret() -> &'static [u8] {
    static SECRET: OnceLock<Vec<u8>> = OnceLock::new();
    SECRET.get_or_init(|| {
        let file = secret_file();
        match load_or_create(&file) {
            Ok(key) => key,
            Err(why) => {
                eprintln!(
                    "dlbridge: cannot use the cache key {}: {why}; kernels cached on disk by other processes are compiled again",
                    file.display()
                );
                random_key().unwrap_or_else(|e| {
                    // No randomness at all: a key that changes with the process and time
                    // still seals nothing another process accepts.
                    eprintln!("dlbridge: no random bytes ({e})");
                    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                    [t.as_nanos().to_le_bytes(), u128::from(std::process::id()).to_le_bytes()].concat()
                })
            }
        }
    })
}

const KEY_LEN: usize = 32;

fn random_key() -> std::io::Result<Vec<u8>> {
    let mut key = vec![0u8; KEY_LEN];
    let mut filled = 0;
    while filled < KEY_LEN {
        filled += rustix::rand::getrandom(&mut key[filled..], rustix::rand::GetRandomFlags::empty())?;
    }
    Ok(key)
}

fn load_or_create(file: &Path) -> Result<Vec<u8>, String> {
    let dir = file.parent().unwrap_or(Path::new("."));
    trusted_dir(dir).map_err(|why| format!("its directory is not usable: {why}"))?;
    if std::fs::symlink_metadata(file).is_err() {
        let key = random_key().map_err(|e| format!("no random bytes: {e}"))?;
        // Exclusively: of two processes creating it at once, one wins and the other reads its key.
        match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(file) {
            Ok(mut f) => {
                f.write_all(&key).and_then(|()| f.sync_all()).map_err(|e| format!("it cannot be written: {e}"))?;
                return Ok(key);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("it cannot be created: {e}")),
        }
    }
    let m = std::fs::symlink_metadata(file).map_err(|e| format!("it cannot be read: {e}"))?;
    if !m.file_type().is_file() {
        return Err("it is not a regular file".into());
    }
    if m.uid() != euid() {
        return Err(format!("it belongs to user {}, not to this process's user {}", m.uid(), euid()));
    }
    if m.mode() & 0o077 != 0 {
        return Err(format!("users other than its owner may read or write it (mode {:o})", m.mode() & 0o7777));
    }
    let key = std::fs::read(file).map_err(|e| format!("it cannot be read: {e}"))?;
    if key.len() != KEY_LEN {
        // Being written by another process this instant, or damaged.
        return Err(format!("it holds {} bytes, not {KEY_LEN}", key.len()));
    }
    Ok(key)
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

    #[test]
    fn a_seal_passes_only_for_its_own_name_and_bytes() {
        let tag = seal("k.so", b"library");
        assert!(sealed("k.so", b"library", &tag));
        assert!(sealed("k.so", b"library", &format!("{tag}\n")), "a trailing newline is not part of the seal");
        assert!(!sealed("k.so", b"librarz", &tag), "other bytes");
        assert!(!sealed("j.so", b"library", &tag), "moved to another file");
        assert!(!sealed("k.so", b"library", &tag[..63]));
        assert!(!sealed("k.so", b"library", ""));
        // The SHA-256 of the bytes, which anyone can compute, is not a seal.
        use sha2::Digest;
        let sha: String = Sha256::digest(b"library").iter().map(|b| format!("{b:02x}")).collect();
        assert!(!sealed("k.so", b"library", &sha));
    }

    #[test]
    fn the_secret_is_created_private_and_a_foreign_one_is_refused() {
        let root = std::env::temp_dir().join(format!("dlbridge-key-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let file = root.join("dlbridge/cache.key");
        let key = load_or_create(&file).unwrap();
        assert_eq!(key.len(), KEY_LEN);
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(load_or_create(&file).unwrap(), key, "read back, not replaced");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(load_or_create(&file).unwrap_err().contains("users other than its owner may read or write it (mode 644)"));
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere"), &file).unwrap();
        assert_eq!(load_or_create(&file).unwrap_err(), "it is not a regular file");
        std::fs::remove_dir_all(&root).unwrap();
    }
}

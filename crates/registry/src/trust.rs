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

/// Checks the whole path to `dir` as ssh's `StrictModes` does: every
/// directory on the way, from the root down, must be owned by root or by this
/// process's user and writable by no one else, except a directory with the
/// sticky bit (`/tmp`), where others cannot rename or remove what is not
/// theirs, when the next step on the way is root's or this user's. A symbolic
/// link on the way is followed when it is root's or this user's (it lies in a
/// directory already checked), and its target's path is checked the same way.
/// `Err` names the directory at fault.
pub fn trusted_path(dir: &Path) -> Result<(), String> {
    check_path(dir, 0)
}

fn check_path(path: &Path, depth: usize) -> Result<(), String> {
    if depth > 8 {
        return Err(format!("{}: too many symbolic links on the way", path.display()));
    }
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map_err(|e| format!("the current directory cannot be read: {e}"))?.join(path)
    };
    let me = euid();
    let mut prefix = PathBuf::new();
    // Whether the directory just checked lets others write (sticky): the next
    // step must then be root's or ours.
    let mut sticky_parent: Option<PathBuf> = None;
    for part in abs.components() {
        prefix.push(part);
        let m = std::fs::symlink_metadata(&prefix).map_err(|e| format!("{} cannot be read: {e}", prefix.display()))?;
        if let Some(parent) = sticky_parent.take()
            && m.uid() != 0
            && m.uid() != me
        {
            return Err(format!(
                "{} belongs to user {} and lies in {}, which others may write",
                prefix.display(),
                m.uid(),
                parent.display()
            ));
        }
        if m.uid() != 0 && m.uid() != me {
            return Err(format!("{} on the way belongs to user {}, not to root or this process's user {me}", prefix.display(), m.uid()));
        }
        if m.file_type().is_symlink() {
            let target = std::fs::read_link(&prefix).map_err(|e| format!("{} cannot be read: {e}", prefix.display()))?;
            let target = prefix.parent().map_or(target.clone(), |p| p.join(&target));
            check_path(&target, depth + 1)?;
            prefix = target.canonicalize().map_err(|e| format!("{} cannot be resolved: {e}", prefix.display()))?;
            continue;
        }
        if m.is_dir() && m.mode() & 0o022 != 0 {
            if m.mode() & 0o1000 == 0 {
                return Err(format!(
                    "{} on the way may be written by users other than its owner (mode {:o})",
                    prefix.display(),
                    m.mode() & 0o7777
                ));
            }
            sticky_parent = Some(prefix.clone());
        }
    }
    Ok(())
}

/// A directory that may hold code this process loads, held open: every file
/// in it is read, written and renamed through this handle (`openat` and its
/// kin, never following a symbolic link), so swapping the directory, or any
/// directory on its path, after it was checked changes nothing this process
/// reads or loads.
///
/// Invariants: `fd` is a directory, opened without following a symbolic
/// link, owned by this process's user and writable by no one else (checked
/// on the handle itself, after the whole path was checked).
#[derive(Debug)]
pub struct TrustedDir {
    fd: rustix::fd::OwnedFd,
    path: PathBuf,
}

/// Called between each check of a cache directory and each use of it, with a
/// word naming the moment (`checked`, `built`, `sealed`): tests swap the
/// directory there to show that the swap changes nothing.
#[doc(hidden)]
pub type SwapHook = Box<dyn Fn(&str, &Path) + Send + Sync>;

static SWAP_HOOK: std::sync::RwLock<Option<SwapHook>> = std::sync::RwLock::new(None);

/// Installs (or, with `None`, removes) the [`SwapHook`]: for tests only.
#[doc(hidden)]
pub fn set_swap_hook(hook: Option<SwapHook>) {
    *SWAP_HOOK.write().unwrap_or_else(|p| p.into_inner()) = hook;
}

/// Runs the [`SwapHook`], if any, at `moment` for `dir`.
#[doc(hidden)]
pub fn swap_point(moment: &str, dir: &Path) {
    if let Some(h) = &*SWAP_HOOK.read().unwrap_or_else(|p| p.into_inner()) {
        h(moment, dir);
    }
}

impl TrustedDir {
    /// Creates `dir` if need be (0700), checks its whole path
    /// ([`trusted_path`]) and opens it. `Err` says why it may not be used.
    pub fn open(dir: &Path) -> Result<TrustedDir, String> {
        // Absolute once: programs given its paths run in another directory.
        let abs;
        let dir = if dir.is_absolute() {
            dir
        } else {
            abs = std::env::current_dir().map_err(|e| format!("the current directory cannot be read: {e}"))?.join(dir);
            &abs
        };
        // The part of the path that exists is checked before anything is created
        // in it (a directory made through another user's link would be theirs to use).
        if let Some(existing) = dir.ancestors().find(|a| std::fs::symlink_metadata(a).is_ok()) {
            trusted_path(existing)?;
        }
        trusted_dir(dir)?;
        trusted_path(dir)?;
        swap_point("checked", dir);
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(dir, OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY, Mode::empty())
            .map_err(|e| format!("it cannot be opened: {e}"))?;
        let d = TrustedDir { fd, path: dir.to_path_buf() };
        d.check_handle()?;
        Ok(d)
    }

    /// Checks what the handle itself is (after the path was checked and opened).
    fn check_handle(&self) -> Result<(), String> {
        let st = rustix::fs::fstat(&self.fd).map_err(|e| format!("it cannot be read: {e}"))?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Directory {
            return Err("it is not a directory".into());
        }
        if st.st_uid != euid() {
            return Err(format!("it belongs to user {}, not to this process's user {}", st.st_uid, euid()));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(format!("users other than its owner may write it (mode {:o})", st.st_mode & 0o7777));
        }
        Ok(())
    }

    /// The path it was opened at (for messages, and for programs that take
    /// paths: what they write there is read back through the handle).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bytes of the regular file `name` in it (never through a symbolic
    /// link); `None` when there is none.
    pub fn read(&self, name: &str) -> Option<Vec<u8>> {
        use rustix::fs::{Mode, OFlags};
        use std::io::Read;
        // Non-blocking: a FIFO planted under the name is refused below, not waited on.
        let fd = rustix::fs::openat(&self.fd, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK, Mode::empty())
            .ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return None;
        }
        let mut bytes = Vec::with_capacity(usize::try_from(st.st_size).unwrap_or(0));
        std::fs::File::from(fd).read_to_end(&mut bytes).ok()?;
        Some(bytes)
    }

    /// Writes `name` whole: through a new file of an unpredictable name
    /// (created exclusively, 0600) renamed into place, so a reader never sees
    /// half of it. A rename replaces whatever had the name, a symbolic link
    /// included, and never follows it.
    pub fn write(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        use rustix::fs::{Mode, OFlags};
        use std::io::Write as _;
        let tmp = format!(".dlbridge-tmp-{}", random_name());
        let fd = rustix::fs::openat(
            &self.fd,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let written = std::fs::File::from(fd).write_all(bytes);
        let renamed = written.and_then(|()| Ok(rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name)?));
        if renamed.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), rustix::fs::AtFlags::empty());
        }
        renamed
    }

    /// Renames `from` to `to`, both in this directory.
    pub fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        Ok(rustix::fs::renameat(&self.fd, from, &self.fd, to)?)
    }

    /// A new directory in it with an unpredictable name (created exclusively,
    /// 0700: nothing can have been planted in it), held open; removed with
    /// what it holds when dropped.
    pub fn private_subdir(&self, prefix: &str) -> std::io::Result<PrivateDir<'_>> {
        use rustix::fs::{Mode, OFlags};
        let name = format!("{prefix}{}", random_name());
        rustix::fs::mkdirat(&self.fd, name.as_str(), Mode::from_raw_mode(0o700))?;
        let fd = rustix::fs::openat(
            &self.fd,
            name.as_str(),
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
            Mode::empty(),
        )?;
        let dir = TrustedDir { fd, path: self.path.join(&name) };
        dir.check_handle().map_err(std::io::Error::other)?;
        Ok(PrivateDir { parent: self, name, dir: Some(dir) })
    }
}

/// A directory of [`TrustedDir::private_subdir`]: removed when dropped.
#[derive(Debug)]
pub struct PrivateDir<'p> {
    parent: &'p TrustedDir,
    name: String,
    dir: Option<TrustedDir>,
}

impl std::ops::Deref for PrivateDir<'_> {
    type Target = TrustedDir;
    fn deref(&self) -> &TrustedDir {
        self.dir.as_ref().unwrap_or(self.parent)
    }
}

impl Drop for PrivateDir<'_> {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            // Its files, through its handle, then the directory itself.
            if let Ok(entries) = rustix::fs::Dir::read_from(&dir.fd) {
                for e in entries.flatten() {
                    let n = e.file_name().to_bytes();
                    if n != b"." && n != b".." {
                        let _ = rustix::fs::unlinkat(&dir.fd, e.file_name(), rustix::fs::AtFlags::empty());
                    }
                }
            }
            drop(dir);
            let _ = rustix::fs::unlinkat(&self.parent.fd, self.name.as_str(), rustix::fs::AtFlags::REMOVEDIR);
        }
    }
}

/// 24 hex digits nobody can predict.
fn random_name() -> String {
    random_key().map_or_else(
        |_| {
            format!(
                "{:x}{:x}",
                std::process::id(),
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
            )
        },
        |k| k.iter().take(12).map(|b| format!("{b:02x}")).collect(),
    )
}

/// A library's bytes as a file of this process's own that nobody else can
/// change (an anonymous memory file, sealed against writes), and a path that
/// opens it, unique in the process (a symbolic link to `/proc/self/fd/N` in
/// a private directory: the dynamic loader takes two loads of one path for
/// one library, and file descriptor numbers are reused). What `dlopen` is
/// given, so it loads exactly the bytes that were checked. Both go when this
/// is dropped (after the load: the mapping stays).
#[derive(Debug)]
pub struct HeldLibrary {
    _fd: rustix::fd::OwnedFd,
    dir: PathBuf,
    path: PathBuf,
}

impl HeldLibrary {
    /// The path to give `dlopen`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HeldLibrary {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Holds `bytes` (see [`HeldLibrary`]); `name` names the memory file.
#[cfg(target_os = "linux")]
pub fn sealed_memory_file(name: &str, bytes: &[u8]) -> std::io::Result<HeldLibrary> {
    use rustix::fd::AsRawFd;
    use rustix::fs::{MemfdFlags, SealFlags};
    use std::io::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes)?;
    let fd = rustix::fd::OwnedFd::from(f);
    rustix::fs::fcntl_add_seals(&fd, SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL)?;
    // A directory of this process's alone (0700, a name nobody can predict)
    // under the system's temporary directory, holding the one link.
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("dlbridge-load-{}-{n}-{}", std::process::id(), random_name()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    let path = dir.join(format!("{name}.so"));
    std::os::unix::fs::symlink(format!("/proc/self/fd/{}", fd.as_raw_fd()), &path)?;
    Ok(HeldLibrary { _fd: fd, dir, path })
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
    trusted_dir(dir).and_then(|()| trusted_path(dir)).map_err(|why| format!("its directory is not usable: {why}"))?;
    // Written whole into a file of its own, then linked into place: the key
    // file is never seen half written. Of two processes creating it at once,
    // one link wins and the other reads its key.
    let fresh = |replace: bool| -> Result<Vec<u8>, String> {
        let key = random_key().map_err(|e| format!("no random bytes: {e}"))?;
        let tmp = dir.join(format!(".cache.key-{}", random_name()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&key).and_then(|()| f.sync_all()));
        let placed = written.and_then(|()| if replace { std::fs::rename(&tmp, file) } else { std::fs::hard_link(&tmp, file) });
        let _ = std::fs::remove_file(&tmp);
        match placed {
            Ok(()) => Ok(key),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(String::new()),
            Err(e) => Err(format!("it cannot be written: {e}")),
        }
    };
    if std::fs::symlink_metadata(file).is_err() {
        match fresh(false) {
            Ok(key) => return Ok(key),
            Err(why) if why.is_empty() => {} // another process made it first
            Err(why) => return Err(why),
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
    if key.is_empty() {
        // A write that failed (a full disk) left it empty: nothing was ever
        // sealed with it. Replaced whole, and said.
        let key = fresh(true).map_err(|why| format!("it is empty and {why}"))?;
        eprintln!("dlbridge: the cache key {} was empty (an earlier write failed); it has been replaced", file.display());
        return Ok(key);
    }
    if key.len() != KEY_LEN {
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
    fn every_directory_on_the_way_must_be_unwritable_by_others() {
        let root = tempfile_root("path");
        let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        // A directory anyone may write, without the sticky bit: whoever can
        // write it can swap what lies below.
        let open = root.join("open");
        std::fs::create_dir_all(open.join("cache")).unwrap();
        mode(&open, 0o777);
        let e = trusted_path(&open.join("cache")).unwrap_err();
        assert!(e.contains(&format!("{} on the way may be written by users other than its owner (mode 777)", open.display())), "{e}");
        assert!(TrustedDir::open(&open.join("cache")).is_err());
        // With the sticky bit (as /tmp), what is ours below it is safe.
        mode(&open, 0o1777);
        trusted_path(&open.join("cache")).unwrap();
        TrustedDir::open(&open.join("cache")).unwrap();
        // A symbolic link on the way is followed, and its target checked.
        let link = root.join("link");
        std::os::unix::fs::symlink(&open, &link).unwrap();
        trusted_path(&link.join("cache")).unwrap();
        mode(&open, 0o777);
        assert!(trusted_path(&link.join("cache")).unwrap_err().contains("may be written by users other than its owner"));
        mode(&open, 0o755);
        // Another user's directory on the way (made so as root; elsewhere skipped).
        if euid() == 0 {
            let theirs = root.join("theirs");
            std::fs::create_dir_all(theirs.join("cache")).unwrap();
            rustix::fs::chown(&theirs, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
            let e = trusted_path(&theirs.join("cache")).unwrap_err();
            assert!(e.contains("belongs to user 65534, not to root or this process's user"), "{e}");
            // ... and below a sticky directory, an entry of another user's.
            mode(&open, 0o1777);
            let planted = open.join("planted");
            std::fs::create_dir_all(planted.join("cache")).unwrap();
            rustix::fs::chown(&planted, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
            let e = trusted_path(&planted.join("cache")).unwrap_err();
            assert!(e.contains("belongs to user 65534"), "{e}");
        } else {
            eprintln!("skipped: another user's directory can be made only as root");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_trusted_directory_reads_and_writes_through_its_handle_whatever_its_path_becomes() {
        let root = tempfile_root("handle");
        let cache = root.join("cache");
        let d = TrustedDir::open(&cache).unwrap();
        d.write("k.so", b"ours").unwrap();
        // Swapped after the check: the path now names another directory.
        std::fs::rename(&cache, root.join("moved")).unwrap();
        std::fs::create_dir(&cache).unwrap();
        std::fs::write(cache.join("k.so"), b"planted").unwrap();
        assert_eq!(d.read("k.so").as_deref(), Some(&b"ours"[..]));
        d.write("j.so", b"also ours").unwrap();
        assert!(root.join("moved/j.so").exists() && !cache.join("j.so").exists());
        {
            let sub = d.private_subdir(".build-").unwrap();
            sub.write("x", b"1").unwrap();
            assert_eq!(sub.read("x").as_deref(), Some(&b"1"[..]));
        }
        assert_eq!(std::fs::read_dir(root.join("moved")).unwrap().count(), 2, "the private directory went when dropped");
        let relative = TrustedDir::open(Path::new(".")).map(|d| d.path().is_absolute());
        assert!(relative.is_err() || relative == Ok(true), "a relative path is made absolute");
        std::os::unix::fs::symlink(root.join("moved/k.so"), root.join("moved/l.so")).unwrap();
        assert_eq!(d.read("l.so"), None, "never through a symbolic link");
        rustix::fs::mkfifoat(rustix::fs::CWD, root.join("moved/fifo.so").as_path(), rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
        assert_eq!(d.read("fifo.so"), None, "a FIFO is refused, not waited on");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_held_library_holds_exactly_its_bytes_under_a_path_of_its_own() {
        let a = sealed_memory_file("t", b"bytes").unwrap();
        let b = sealed_memory_file("t", b"other").unwrap();
        assert_ne!(a.path(), b.path());
        assert_eq!(std::fs::read(a.path()).unwrap(), b"bytes");
        assert!(
            std::fs::OpenOptions::new().write(true).open(a.path()).and_then(|mut f| f.write_all(b"x")).is_err(),
            "sealed against writes"
        );
        let dir = a.path().parent().unwrap().to_path_buf();
        drop(a);
        assert!(!dir.exists(), "its directory goes with it");
    }

    /// A fresh directory for one test.
    fn tempfile_root(what: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("dlbridge-trust-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        root
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
        // A key file a failed write left empty is replaced (and it is said).
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&file, b"").unwrap();
        let replaced = load_or_create(&file).unwrap();
        assert_eq!(replaced.len(), KEY_LEN);
        assert_eq!(std::fs::read(&file).unwrap(), replaced);
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&file, b"short").unwrap();
        assert!(load_or_create(&file).unwrap_err().contains("it holds 5 bytes"));
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere"), &file).unwrap();
        assert_eq!(load_or_create(&file).unwrap_err(), "it is not a regular file");
        std::fs::remove_dir_all(&root).unwrap();
    }
}

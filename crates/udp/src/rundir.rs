//! The user's runtime directory, where the port-sharing state lives, and
//! the only ways files in it are opened.
//!
//! The directory is `$XDG_RUNTIME_DIR`, else `/run/user/<uid>`, else
//! `/tmp/softrdma-<uid>` (created with mode 0700). Whatever it is, it must
//! be a real directory (not a symlink) owned by this effective user and not
//! writable by anyone else, or another user could plant or swap the files
//! that decide where this user's datagrams go. Files in it are opened with
//! `O_NOFOLLOW` and checked the same way (owner, no group or other access)
//! after opening, so the check applies to the file actually opened.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The runtime directory to use by default (not created or checked yet).
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let uid = euid();
    let run = PathBuf::from(format!("/run/user/{uid}"));
    if fs::symlink_metadata(&run).is_ok_and(|m| m.is_dir() && m.uid() == uid) {
        return run;
    }
    PathBuf::from(format!("/tmp/softrdma-{uid}"))
}

fn denied(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg)
}

/// Check that `meta` (of `path`) belongs to us and that nobody else may
/// change it (`forbidden`: the mode bits others must not have).
fn check_owner(path: &Path, meta: &fs::Metadata, forbidden: u32) -> io::Result<()> {
    if meta.uid() != euid() {
        return Err(denied(format!(
            "{} belongs to uid {}, not to this user (uid {})",
            path.display(),
            meta.uid(),
            euid()
        )));
    }
    if meta.mode() & forbidden != 0 {
        return Err(denied(format!(
            "{} has mode {:o}: other users may change it",
            path.display(),
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Make sure `dir` exists (creating it 0700 if missing) and is a directory
/// of ours that no other user can write.
pub fn ensure_dir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("creating {}: {e}", dir.display()),
            ))
        }
    }
    let meta = fs::symlink_metadata(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    if !meta.is_dir() {
        return Err(denied(format!(
            "{} is not a directory (a symlink?)",
            dir.display()
        )));
    }
    check_owner(dir, &meta, 0o022)
}

/// Open (creating if asked, mode 0600) a file in a checked directory,
/// without following a symlink, and check what was opened.
pub fn open_file(path: &Path, write: bool, create: bool) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(write)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", path.display())))?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(denied(format!("{} is not a regular file", path.display())));
    }
    check_owner(path, &meta, 0o077)?;
    Ok(f)
}

/// Replace `path` by a file holding `data`, atomically: written to a fresh
/// temporary file in the same directory (`<name>.tmp<pid>`, created
/// `O_EXCL`, so never through someone's symlink), then renamed over it. A
/// reader opens either the old file or the new one, each whole; a writer
/// that dies or fails before the rename leaves the old one in place.
pub fn replace_file(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(name);
    let _ = fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", tmp.display())))?;
    let written = f
        .write_all(data)
        .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", tmp.display())));
    drop(f);
    let renamed = written.and_then(|()| {
        fs::rename(&tmp, path)
            .map_err(|e| io::Error::new(e.kind(), format!("renaming to {}: {e}", path.display())))
    });
    if renamed.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    renamed
}

/// Identity of a file's current version, to notice that it was replaced:
/// inode, size and modification time.
pub fn version(path: &Path) -> Option<(u64, u64, i64, i64)> {
    let m = fs::symlink_metadata(path).ok()?;
    Some((m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// An exclusive `flock` held until dropped.
pub struct Locked {
    _file: File,
}

/// Take the exclusive lock on `path` (created 0600 if missing), waiting.
pub fn lock(path: &Path) -> io::Result<Locked> {
    let f = open_file(path, true, true)?;
    loop {
        // SAFETY: plain syscall on a file descriptor `f` owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(Locked { _file: f });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(io::Error::new(
                e.kind(),
                format!("locking {}: {e}", path.display()),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A path that does not exist yet, in a scratch directory of the
    /// test's own (removed with the returned handle).
    fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::Builder::new()
            .prefix("srdma-rundir-")
            .tempdir()
            .expect("a scratch directory");
        let d = t.path().join(name);
        (t, d)
    }

    #[test]
    fn a_group_writable_directory_is_refused() {
        let (_t, d) = scratch("gw");
        ensure_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o770)).unwrap();
        let e = ensure_dir(&d).unwrap_err().to_string();
        assert!(e.contains("other users may change it"), "{e}");
    }

    #[test]
    fn symlinks_are_not_followed() {
        let (_t, d) = scratch("ln");
        ensure_dir(&d).unwrap();
        let target = d.join("target");
        fs::write(&target, b"x").unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(open_file(&link, false, false).is_err());
        assert!(open_file(&target, false, false).is_ok());
        // A readable-by-others file is refused.
        fs::set_permissions(&target, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(open_file(&target, false, false).is_err());
        // A symlinked directory is refused too.
        let (_t2, dlink) = scratch("dl");
        std::os::unix::fs::symlink(&d, &dlink).unwrap();
        assert!(ensure_dir(&dlink).is_err());
        fs::remove_file(&dlink).unwrap();
        // Replacing goes through a fresh file, not the link's target.
        replace_file(&link, b"new").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"x");
        assert_eq!(fs::read(&link).unwrap(), b"new");
    }
}

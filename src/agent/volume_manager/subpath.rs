//! subPath mounts made safe, as upstream's `PrepareSafeSubpath`: the path
//! is resolved, must stay inside its volume, is then opened one component
//! at a time refusing symlinks (so a container cannot swap a folder for a
//! link to the host between our check and the mount), and the open file is
//! bind-mounted through `/proc/self/fd/N` onto
//! `<pod>/volume-subpaths/<volume>/<container>/<index>`. That bind keeps
//! what it points at: a subPath of a configMap does not follow updates.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use super::error::VolumeError;
use super::mounter;

fn c_name(s: &std::ffi::OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    let c = c_name(path.as_os_str())?;
    // SAFETY: a valid C string; the returned fd is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `name` in `dir` without following a link.
fn open_at_nofollow(dir: &OwnedFd, name: &std::ffi::OsStr) -> io::Result<OwnedFd> {
    let c = c_name(name)?;
    // SAFETY: a valid dir fd and C string; the returned fd is owned below.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fstat fills the zeroed struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is a symlink", name.to_string_lossy())));
    }
    Ok(fd)
}

fn normal_components(rel: &Path) -> Vec<&std::ffi::OsStr> {
    rel.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect()
}

/// Opens `base/rel` refusing any symlink on the way.
fn open_beneath(base: &Path, rel: &Path) -> io::Result<OwnedFd> {
    let mut fd = open_dir_path(base)?;
    for name in normal_components(rel) {
        fd = open_at_nofollow(&fd, name)?;
    }
    Ok(fd)
}

/// Creates the missing folders of `rel` under `base` with `mode`, refusing links.
fn safe_make_dir(base: &Path, rel: &Path, mode: u32) -> io::Result<()> {
    let mut fd = open_dir_path(base)?;
    for name in normal_components(rel) {
        fd = match open_at_nofollow(&fd, name) {
            Ok(next) => next,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let c = c_name(name)?;
                // SAFETY: a valid dir fd and C string.
                if unsafe { libc::mkdirat(fd.as_raw_fd(), c.as_ptr(), mode) } != 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::AlreadyExists {
                        return Err(e);
                    }
                }
                // SAFETY: as above; the umask narrowed the mode.
                unsafe { libc::fchmodat(fd.as_raw_fd(), c.as_ptr(), mode, 0) };
                open_at_nofollow(&fd, name)?
            }
            Err(e) => return Err(e),
        };
    }
    Ok(())
}

/// Prepares the subPath `sub` of the volume at `volume` for a container;
/// returns the host path the container mounts.
pub fn prepare(volume: &Path, sub: &str, target: &Path, mount: &str, container: &str) -> Result<PathBuf, VolumeError> {
    let fail = |reason: String| VolumeError::SubPath { mount: mount.into(), container: container.into(), reason };
    let full = volume.join(sub);
    if std::fs::metadata(&full).is_err() {
        // Made now, with the volume's mode, so a group can write into it.
        let mode = std::fs::metadata(volume).map(|m| m.mode() & 0o7777).unwrap_or(0o755);
        safe_make_dir(volume, Path::new(sub), mode).map_err(|e| fail(format!("cannot create subPath: {e}")))?;
    }
    let base = std::fs::canonicalize(volume).map_err(VolumeError::io(volume))?;
    let resolved = std::fs::canonicalize(&full).map_err(VolumeError::io(&full))?;
    let rel = resolved
        .strip_prefix(&base)
        .map_err(|_| VolumeError::SubPathOutside { path: resolved.clone(), volume: base.clone() })?
        .to_path_buf();
    let fd = open_beneath(&base, &rel).map_err(|e| fail(e.to_string()))?;
    // SAFETY: fstat fills the zeroed struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(fail(io::Error::last_os_error().to_string()));
    }
    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;

    if target.exists() && mounter::is_mount_point(target).map_err(VolumeError::io(target))? {
        let same = std::fs::metadata(target).map(|m| m.dev() == st.st_dev && m.ino() == st.st_ino).unwrap_or(false);
        if same {
            return Ok(target.to_path_buf());
        }
        mounter::unmount_detach(target).map_err(|source| VolumeError::Unmount { path: target.into(), source })?;
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(VolumeError::io(parent))?;
        let _ = std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o750));
    }
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() != is_dir || m.file_type().is_symlink() => {
            if m.is_dir() {
                std::fs::remove_dir(target).map_err(VolumeError::io(target))?;
            } else {
                std::fs::remove_file(target).map_err(VolumeError::io(target))?;
            }
            make_target(target, is_dir)?;
        }
        Ok(_) => {}
        Err(_) => make_target(target, is_dir)?,
    }
    let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    mounter::bind_mount(&source, target, false).map_err(|e| fail(format!("bind mount failed: {e}")))?;
    Ok(target.to_path_buf())
}

fn make_target(target: &Path, is_dir: bool) -> Result<(), VolumeError> {
    if is_dir {
        std::fs::create_dir(target).map_err(VolumeError::io(target))
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(target)
            .map(|_| ())
            .map_err(VolumeError::io(target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_beneath_refuses_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("a/link")).unwrap();
        assert!(open_beneath(dir.path(), Path::new("a/b/f")).is_ok());
        assert!(open_beneath(dir.path(), Path::new("a/link")).is_err());
        assert!(open_beneath(dir.path(), Path::new("a/link/passwd")).is_err());
        safe_make_dir(dir.path(), Path::new("a/new/deeper"), 0o777).unwrap();
        assert_eq!(std::fs::metadata(dir.path().join("a/new/deeper")).unwrap().mode() & 0o777, 0o777);
        assert!(safe_make_dir(dir.path(), Path::new("a/link/x"), 0o755).is_err());
        assert!(!Path::new("/etc/x").exists());
    }
}

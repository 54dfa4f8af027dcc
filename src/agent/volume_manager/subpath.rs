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
use super::mounter::Mounter;

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

/// Where a container's subPath goes: the volume's folder, the subPath in
/// it, and the bind target under the pod's folder; the volume mount's and
/// the container's names, for errors.
pub struct SubPath<'a> {
    pub volume: &'a Path,
    pub sub: &'a str,
    pub target: &'a Path,
    pub mount: &'a str,
    pub container: &'a str,
}

/// Prepares the subPath for a container, bind-mounting it through
/// `mounter`; returns the host path the container mounts.
pub fn prepare(mounter: &dyn Mounter, s: &SubPath<'_>) -> Result<PathBuf, VolumeError> {
    let SubPath { volume, sub, target, mount, container } = *s;
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

    if target.exists() && mounter.is_mount_point(target).map_err(VolumeError::io(target))? {
        let same = std::fs::metadata(target).map(|m| m.dev() == st.st_dev && m.ino() == st.st_ino).unwrap_or(false);
        if same {
            return Ok(target.to_path_buf());
        }
        mounter.unmount_detach(target).map_err(|source| VolumeError::Unmount { path: target.into(), source })?;
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
    mounter.bind_mount(&source, target, false).map_err(|e| fail(format!("bind mount failed: {e}")))?;
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
    use super::super::mounter::{FakeMount, FakeMounter};
    use super::*;

    fn at<'a>(volume: &'a Path, sub: &'a str, target: &'a Path) -> SubPath<'a> {
        SubPath { volume, sub, target, mount: "data", container: "app" }
    }

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

    #[test]
    fn a_sub_path_leading_out_of_its_volume_is_refused_and_nothing_is_mounted() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host's").unwrap();
        let pod = tempfile::tempdir().unwrap();
        let volume = pod.path().join("volume");
        std::fs::create_dir(&volume).unwrap();
        // A container planted a link in its volume.
        std::os::unix::fs::symlink(outside.path(), volume.join("escape")).unwrap();
        let mounter = FakeMounter::default();
        let target = pod.path().join("volume-subpaths/data/app/0");
        match prepare(&mounter, &at(&volume, "escape/secret", &target)) {
            Err(VolumeError::SubPathOutside { .. }) => {}
            other => panic!("a subPath through a link out of the volume: {other:?}"),
        }
        // A missing subPath behind the link is not created outside either.
        match prepare(&mounter, &at(&volume, "escape/new/dir", &target)) {
            Err(VolumeError::SubPath { reason, .. }) => assert!(reason.contains("symlink"), "{reason}"),
            other => panic!("a subPath created through a link: {other:?}"),
        }
        assert!(!outside.path().join("new").exists());
        assert!(mounter.table().is_empty());
        assert!(!target.exists());
    }

    #[test]
    fn a_sub_path_inside_its_volume_is_bound_on_its_own_target() {
        let pod = tempfile::tempdir().unwrap();
        let volume = pod.path().join("volume");
        std::fs::create_dir_all(volume.join("conf")).unwrap();
        std::fs::set_permissions(&volume, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(volume.join("conf/app.conf"), "x=1").unwrap();
        let mounter = FakeMounter::default();

        // A file: its target is a file, bound from the file in the volume.
        let file_target = pod.path().join("volume-subpaths/data/app/0");
        let host = prepare(&mounter, &at(&volume, "conf/app.conf", &file_target)).unwrap();
        assert_eq!(host, file_target);
        assert!(file_target.is_file());
        let source = std::fs::canonicalize(volume.join("conf/app.conf")).unwrap();
        assert_eq!(mounter.mounts_on(&file_target), [FakeMount::Bind { source, read_only: false }]);

        // A folder not there yet: made in the volume with the volume's mode.
        let dir_target = pod.path().join("volume-subpaths/data/app/1");
        prepare(&mounter, &at(&volume, "logs/web", &dir_target)).unwrap();
        let made = volume.join("logs/web");
        assert_eq!(std::fs::metadata(&made).unwrap().mode() & 0o777, 0o777);
        assert!(dir_target.is_dir());
        let source = std::fs::canonicalize(&made).unwrap();
        assert_eq!(mounter.mounts_on(&dir_target), [FakeMount::Bind { source, read_only: false }]);
        assert_eq!(mounter.table().len(), 2);
    }

    #[test]
    fn a_target_bound_to_something_else_is_unmounted_first() {
        let pod = tempfile::tempdir().unwrap();
        let volume = pod.path().join("volume");
        std::fs::create_dir_all(volume.join("a")).unwrap();
        std::fs::create_dir_all(volume.join("b")).unwrap();
        let mounter = FakeMounter::default();
        let target = pod.path().join("volume-subpaths/data/app/0");
        prepare(&mounter, &at(&volume, "a", &target)).unwrap();
        // The spec changed: the same mount now asks for another subPath.
        prepare(&mounter, &at(&volume, "b", &target)).unwrap();
        let source = std::fs::canonicalize(volume.join("b")).unwrap();
        assert_eq!(mounter.mounts_on(&target), [FakeMount::Bind { source, read_only: false }], "no bind stacked");
    }
}

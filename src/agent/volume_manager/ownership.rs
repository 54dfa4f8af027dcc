//! fsGroup: upstream's `SetVolumeOwnership`. Every file of the volume gets
//! the pod's fsGroup as its group and group read (and write, unless the
//! volume is read-only); directories also get the setgid bit and group
//! search, so files created later inherit the group. Symlinks are chowned
//! but never chmodded (that would change their target), and never followed.
//! `fsGroupChangePolicy: OnRootMismatch` skips the walk when the volume's
//! root already has the right group and permissions.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::error::SetUpError;

const RW_MASK: u32 = 0o660;
const RO_MASK: u32 = 0o440;
const EXEC_MASK: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// Applies `fs_group` to the volume at `dir`.
pub fn set_volume_ownership(
    dir: &Path,
    fs_group: Option<i64>,
    change_policy: Option<&str>,
    read_only: bool,
) -> Result<(), SetUpError> {
    let Some(gid) = fs_group else { return Ok(()) };
    let gid = u32::try_from(gid).map_err(|_| SetUpError::InvalidPath(format!("invalid fsGroup {gid}")))?;
    if change_policy == Some("OnRootMismatch") && !requires_change(dir, gid, read_only) {
        return Ok(());
    }
    walk(dir, gid, read_only)
}

/// Whether the root of the volume lacks the group, the permissions or the
/// setgid bit that ownership gives.
fn requires_change(dir: &Path, gid: u32, read_only: bool) -> bool {
    let Ok(meta) = std::fs::metadata(dir) else { return true };
    if meta.gid() != gid || !meta.is_dir() {
        return true;
    }
    let wanted = (if read_only { RO_MASK } else { RW_MASK }) | EXEC_MASK;
    let perms = meta.mode() & 0o777;
    perms & wanted != wanted || meta.mode() & SETGID == 0
}

fn walk(path: &Path, gid: u32, read_only: bool) -> Result<(), SetUpError> {
    let meta = std::fs::symlink_metadata(path).map_err(SetUpError::io(path))?;
    change(path, &meta, gid, read_only)?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).map_err(SetUpError::io(path))? {
            let entry = entry.map_err(SetUpError::io(path))?;
            walk(&entry.path(), gid, read_only)?;
        }
    }
    Ok(())
}

fn change(path: &Path, meta: &std::fs::Metadata, gid: u32, read_only: bool) -> Result<(), SetUpError> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| SetUpError::InvalidPath(format!("NUL in {}", path.display())))?;
    // SAFETY: a valid C string alive for the call; uid -1 keeps the owner.
    if unsafe { libc::lchown(c.as_ptr(), u32::MAX, gid) } != 0 {
        return Err(SetUpError::io(path)(std::io::Error::last_os_error()));
    }
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mut mask = if read_only { RO_MASK } else { RW_MASK };
    if meta.is_dir() {
        mask |= SETGID | EXEC_MASK;
    }
    let mode = (meta.mode() & 0o7777) | mask;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(SetUpError::io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn groups_and_modes_as_upstream() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("vol");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(root.join("f"), "x").unwrap();
        std::fs::set_permissions(root.join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink("f", root.join("link")).unwrap();
        // A link out of the volume is never followed.
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "o").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();

        let gid = 4242;
        set_volume_ownership(&root, Some(gid), None, true).unwrap();
        assert_eq!(mode(&root.join("f")), 0o640);
        assert_eq!(mode(&root), 0o2755);
        assert_eq!(std::fs::metadata(root.join("f")).unwrap().gid(), gid as u32);
        assert_eq!(std::fs::symlink_metadata(root.join("link")).unwrap().gid(), gid as u32);
        assert_eq!(mode(&outside), 0o600);
        assert_ne!(std::fs::metadata(&outside).unwrap().gid(), gid as u32);

        set_volume_ownership(&root, Some(gid), None, false).unwrap();
        assert_eq!(mode(&root.join("f")), 0o660);
        assert_eq!(mode(&root), 0o2775);
    }

    #[test]
    fn on_root_mismatch_skips_a_volume_already_right() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("f"), "x").unwrap();
        std::fs::set_permissions(root.join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        set_volume_ownership(root, Some(77), None, false).unwrap();
        // A file changed behind our back keeps its mode: the root is right.
        std::fs::set_permissions(root.join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        set_volume_ownership(root, Some(77), Some("OnRootMismatch"), false).unwrap();
        assert_eq!(mode(&root.join("f")), 0o600);
        set_volume_ownership(root, Some(77), Some("Always"), false).unwrap();
        assert_eq!(mode(&root.join("f")), 0o660);
        set_volume_ownership(root, None, None, false).unwrap();
    }
}

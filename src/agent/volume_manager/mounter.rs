//! The few mount(2) operations volumes need (tmpfs, bind, detach), and
//! reading `/proc/self/mountinfo` to know what is mounted where. They are
//! the host's effects that need root, behind [`Mounter`] (upstream's
//! mount.Interface): [`HostMounter`] makes them, the test double
//! `FakeMounter` keeps a mount table in memory.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[cfg(test)]
pub use fake::{FakeMount, FakeMounter};

/// The host's mount table, as volumes change and read it.
pub trait Mounter: Send + Sync {
    /// Mounts a tmpfs on `target`, of `size` bytes when given (else the
    /// kernel's default, half of RAM).
    fn mount_tmpfs(&self, target: &Path, size: Option<i64>) -> io::Result<()>;
    /// Bind-mounts `source` (a path, or `/proc/self/fd/N`) on `target`,
    /// read-only when asked.
    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> io::Result<()>;
    /// Detaches `target`: gone from the tree at once, freed when unused.
    fn unmount_detach(&self, target: &Path) -> io::Result<()>;
    /// Every mount point, as mountinfo spells it.
    fn mount_points(&self) -> io::Result<Vec<PathBuf>>;

    /// Whether `path` is a mount point (it must exist).
    fn is_mount_point(&self, path: &Path) -> io::Result<bool> {
        let path = std::fs::canonicalize(path)?;
        Ok(self.mount_points()?.contains(&path))
    }

    /// Mount points at or under `dir` (canonical), deepest first.
    fn mounts_under(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let dir = std::fs::canonicalize(dir)?;
        let mut found: Vec<PathBuf> = self.mount_points()?.into_iter().filter(|p| p.starts_with(&dir)).collect();
        found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        found.dedup();
        Ok(found)
    }
}

/// The host's own mount(2) and mountinfo.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostMounter;

impl Mounter for HostMounter {
    fn mount_tmpfs(&self, target: &Path, size: Option<i64>) -> io::Result<()> {
        mount_tmpfs(target, size)
    }

    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
        bind_mount(source, target, read_only)
    }

    fn unmount_detach(&self, target: &Path) -> io::Result<()> {
        unmount_detach(target)
    }

    fn mount_points(&self) -> io::Result<Vec<PathBuf>> {
        Ok(mounts()?.into_iter().map(|m| m.mount_point).collect())
    }
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

fn mount(
    source: &str,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = CString::new(source).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let target = c_path(target)?;
    let fstype = fstype.map(CString::new).transpose().map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let data = data.map(CString::new).transpose().map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: every pointer is a valid NUL-terminated string or null, alive for the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ref().map_or(std::ptr::null(), |f| f.as_ptr()),
            flags,
            data.as_ref().map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn mount_tmpfs(target: &Path, size: Option<i64>) -> io::Result<()> {
    let options = size.filter(|s| *s > 0).map(|s| format!("size={s}"));
    mount("tmpfs", target, Some("tmpfs"), 0, options.as_deref())
}

/// A bind mount takes `ro` only on a remount.
fn bind_mount(source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
    let src = source.to_str().ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    mount(src, target, None, libc::MS_BIND, None)?;
    if read_only {
        let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
        if let Err(e) = mount("none", target, None, flags, None) {
            let _ = unmount_detach(target);
            return Err(e);
        }
    }
    Ok(())
}

/// `umount2(MNT_DETACH | UMOUNT_NOFOLLOW)`.
fn unmount_detach(target: &Path) -> io::Result<()> {
    let t = c_path(target)?;
    // SAFETY: a valid C string alive for the call.
    if unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One line of mountinfo, the parts we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub root: String,
    pub major_minor: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            Some(MountInfo {
                major_minor: fields.get(2)?.to_string(),
                root: fields.get(3)?.to_string(),
                mount_point: unescape(fields.get(4)?),
                fs_type: fields.get(dash + 1)?.to_string(),
            })
        })
        .collect()
}

pub fn mounts() -> io::Result<Vec<MountInfo>> {
    Ok(parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// Bytes in use on the filesystem mounted at `path` (cheap: statfs).
pub fn filesystem_used(path: &Path) -> io::Result<u64> {
    let c = c_path(path)?;
    // SAFETY: statvfs fills the zeroed struct we own; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.f_blocks.saturating_sub(st.f_bfree) as u64).saturating_mul(st.f_frsize as u64))
}

/// The test double: a mount table in memory.
#[cfg(test)]
mod fake {
    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    use super::Mounter;
    use crate::sync::LockExt;

    /// What a [`FakeMounter`] mounted on a target.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum FakeMount {
        Tmpfs {
            size: Option<i64>,
        },
        /// What the bind source resolved to (a `/proc/self/fd/N` link is read
        /// at mount time, as the kernel does), and whether it is read-only.
        Bind {
            source: PathBuf,
            read_only: bool,
        },
    }

    /// A mount table in memory, for tests that must not need root: mounts
    /// change only the table, never the host. As on the host, a mount on a
    /// mount point stacks on it, and an unmount takes the top one off.
    #[derive(Debug, Default)]
    pub struct FakeMounter {
        table: Mutex<Vec<(PathBuf, FakeMount)>>,
    }

    impl FakeMounter {
        /// The table now, in mount order: each mount point (canonical) and what is on it.
        pub fn table(&self) -> Vec<(PathBuf, FakeMount)> {
            self.table.locked().clone()
        }

        /// What is mounted on `path`, bottom first.
        pub fn mounts_on(&self, path: &Path) -> Vec<FakeMount> {
            let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
            self.table().into_iter().filter(|(p, _)| *p == path).map(|(_, m)| m).collect()
        }

        fn insert(&self, target: &Path, mount: FakeMount) -> io::Result<()> {
            let target = std::fs::canonicalize(target)?;
            self.table.locked().push((target, mount));
            Ok(())
        }
    }

    impl Mounter for FakeMounter {
        fn mount_tmpfs(&self, target: &Path, size: Option<i64>) -> io::Result<()> {
            self.insert(target, FakeMount::Tmpfs { size })
        }

        fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
            let resolved = std::fs::canonicalize(source)?;
            self.insert(target, FakeMount::Bind { source: resolved, read_only })
        }

        fn unmount_detach(&self, target: &Path) -> io::Result<()> {
            let target = std::fs::canonicalize(target).unwrap_or_else(|_| target.to_path_buf());
            let mut table = self.table.locked();
            match table.iter().rposition(|(p, _)| *p == target) {
                Some(top) => {
                    table.remove(top);
                    Ok(())
                }
                None => Err(io::Error::from_raw_os_error(libc::EINVAL)),
            }
        }

        fn mount_points(&self) -> io::Result<Vec<PathBuf>> {
            Ok(self.table.locked().iter().map(|(p, _)| p.clone()).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_lines() {
        let text = "22 1 0:21 / /proc rw,nosuid shared:5 - proc proc rw\n\
                    90 22 0:50 / /var/lib/x\\040y/vol rw - tmpfs tmpfs rw,size=1024k\n\
                    91 22 8:1 /data /mnt/bind rw master:1 shared:2 - ext4 /dev/vda rw\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].mount_point, PathBuf::from("/var/lib/x y/vol"));
        assert_eq!(m[1].fs_type, "tmpfs");
        assert_eq!(m[2].root, "/data");
        assert_eq!(m[2].fs_type, "ext4");
        assert_eq!(unescape("a\\134b\\011"), PathBuf::from("a\\b\t"));
    }

    #[test]
    fn the_root_is_a_mount_point() {
        assert!(HostMounter.is_mount_point(Path::new("/")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        assert!(
            !HostMounter.is_mount_point(dir.path()).unwrap()
                || HostMounter.mounts_under(dir.path()).unwrap().len() == 1
        );
    }
}

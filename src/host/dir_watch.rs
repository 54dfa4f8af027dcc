//! Being told when a file lands in a folder: inotify (`IN_CLOSE_WRITE` for
//! a file written in place, `IN_MOVED_TO` for one renamed in), read
//! through tokio's `AsyncFd`, so nothing polls.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use tokio::io::unix::AsyncFd;

/// What changed in the folder.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// These files were written or moved in.
    Files(Vec<OsString>),
    /// The kernel's queue overflowed: events were lost, look at everything.
    Rescan,
}

pub struct DirWatch {
    fd: AsyncFd<OwnedFd>,
}

impl DirWatch {
    /// Files written or moved in.
    pub fn new(dir: &Path) -> io::Result<DirWatch> {
        Self::with_mask(dir, libc::IN_CLOSE_WRITE | libc::IN_MOVED_TO)
    }

    /// Files written, moved in, removed or moved out.
    pub fn any_change(dir: &Path) -> io::Result<DirWatch> {
        Self::with_mask(dir, libc::IN_CLOSE_WRITE | libc::IN_MOVED_TO | libc::IN_DELETE | libc::IN_MOVED_FROM)
    }

    fn with_mask(dir: &Path, mask: u32) -> io::Result<DirWatch> {
        let path =
            CString::new(dir.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: inotify_init1 has no preconditions; the result is checked.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fd is open and path is a NUL-terminated string.
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), mask) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: an OwnedFd is open and stays the same descriptor until dropped.
        let fd =
            unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.map_err(io::Error::from)?;
        Ok(DirWatch { fd })
    }

    /// Waits for the next batch of changes.
    pub async fn next(&mut self) -> io::Result<Change> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let mut guard = self.fd.readable().await?;
            let read = guard.try_io(|fd| {
                // SAFETY: buf is valid for buf.len() bytes; fd is open.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match read {
                Ok(Ok(n)) => return Ok(parse_events(&buf[..n])),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

/// Decodes `struct inotify_event` records: wd, mask, cookie, len, name.
fn parse_events(mut buf: &[u8]) -> Change {
    const HEADER: usize = 16;
    let mut files = Vec::new();
    while buf.len() >= HEADER {
        let mask = u32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
        let len = u32::from_ne_bytes([buf[12], buf[13], buf[14], buf[15]]) as usize;
        let end = (HEADER + len).min(buf.len());
        if mask & libc::IN_Q_OVERFLOW != 0 {
            return Change::Rescan;
        }
        let name: Vec<u8> = buf[HEADER..end].iter().copied().take_while(|&b| b != 0).collect();
        if !name.is_empty() && mask & libc::IN_ISDIR == 0 {
            let name = OsString::from_vec(name);
            if !files.contains(&name) {
                files.push(name);
            }
        }
        buf = &buf[end..];
    }
    Change::Files(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_written_or_moved_in_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut watch = DirWatch::new(dir.path()).unwrap();
        std::fs::write(dir.path().join("a.tar"), b"x").unwrap();
        assert_eq!(watch.next().await.unwrap(), Change::Files(vec!["a.tar".into()]));
        let outside = tempfile::NamedTempFile::new_in(dir.path().parent().unwrap()).unwrap();
        let (_, tmp) = outside.keep().unwrap();
        std::fs::rename(&tmp, dir.path().join("b.tar")).unwrap();
        assert_eq!(watch.next().await.unwrap(), Change::Files(vec!["b.tar".into()]));
    }
}

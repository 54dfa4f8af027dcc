//! The node's allocatable resources as the volume manager needs them: the
//! default size of memory-backed volumes, and the value the downward API
//! reports for a container without a limit.

use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeAllocatable {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub ephemeral_storage_bytes: i64,
}

impl NodeAllocatable {
    /// The host's capacity: its CPUs, `MemTotal`, and the size of the
    /// filesystem holding `dir` (used until the node role passes its own
    /// allocatable, which subtracts reservations).
    pub fn detect(dir: &Path) -> NodeAllocatable {
        let cpus = std::thread::available_parallelism().map(|n| n.get() as i64).unwrap_or(1);
        let memory = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| mem_total(&s)).unwrap_or(0);
        NodeAllocatable {
            cpu_millis: cpus * 1000,
            memory_bytes: memory,
            ephemeral_storage_bytes: filesystem_size(dir).unwrap_or(0),
        }
    }
}

fn mem_total(meminfo: &str) -> Option<i64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The size in bytes of the filesystem holding `dir` (or its nearest
/// existing ancestor).
fn filesystem_size(dir: &Path) -> Option<i64> {
    let mut dir = dir;
    while !dir.exists() {
        dir = dir.parent()?;
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct we own; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_blocks as i64).saturating_mul(st.f_frsize as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_meminfo() {
        assert_eq!(mem_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n"), Some(24576000 * 1024));
        let n = NodeAllocatable::detect(Path::new("/tmp/does/not/exist"));
        assert!(n.cpu_millis >= 1000 && n.memory_bytes > 0 && n.ephemeral_storage_bytes > 0, "{n:?}");
    }
}

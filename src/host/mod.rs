//! Facts about the machine ferrok runs on, read from /proc, /sys and the
//! kernel: its name and addresses, processors, memory, file systems,
//! where its programs are, and its random numbers (`random`). Every layer
//! may use these; they know nothing of Kubernetes.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub mod check;
pub mod dir_watch;
pub mod random;
pub mod resolv_conf;

/// Finds a program in `$PATH` and the usual binary folders.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let fixed = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from);
    std::env::split_paths(&path).chain(fixed).map(|d| d.join(name)).find(|p| is_executable(p))
}

pub fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The kernel's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The host's first non-loopback IPv4 address, from the routing table's
/// choice of source address (no packet is sent).
pub fn host_ip() -> IpAddr {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").and_then(|s| {
        s.connect("10.255.255.255:1")?;
        s.local_addr()
    });
    match probe {
        Ok(addr) if !addr.ip().is_unspecified() => addr.ip(),
        _ => IpAddr::from([127, 0, 0, 1]),
    }
}

/// Processors this process may run on.
pub fn cpu_count() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// A value from /proc/meminfo, in bytes (`MemTotal`, `MemAvailable`).
pub fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text, field)
}

fn parse_meminfo(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, rest) = line.split_once(':')?;
        if name.trim() != field {
            return None;
        }
        let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kib * 1024)
    })
}

/// Size and free space of the file system holding `path`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsStats {
    pub capacity: u64,
    pub available: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

pub fn fs_stats(path: &Path) -> Option<FsStats> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated path and st a properly sized out-parameter.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some(FsStats {
        capacity: st.f_blocks as u64 * frsize,
        available: st.f_bavail as u64 * frsize,
        inodes: st.f_files as u64,
        inodes_free: st.f_ffree as u64,
    })
}

/// `uname -r`, and the machine (`x86_64`).
pub fn uname() -> (String, String) {
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a properly sized out-parameter.
    if unsafe { libc::uname(&mut u) } != 0 {
        return (String::new(), String::new());
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (field(&u.release), field(&u.machine))
}

/// `PRETTY_NAME` from /etc/os-release (`Debian GNU/Linux 12 (bookworm)`).
pub fn os_image() -> String {
    let text = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".into())
}

/// Kubernetes' name for this architecture (`amd64`, `arm64`, `arm`).
pub fn goarch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "x86" => "386",
        "riscv64" => "riscv64",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        other => other,
    }
}

fn first_line(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default()
}

pub fn machine_id() -> String {
    let id = first_line("/etc/machine-id");
    if id.is_empty() {
        first_line("/var/lib/dbus/machine-id")
    } else {
        id
    }
}

pub fn boot_id() -> String {
    first_line("/proc/sys/kernel/random/boot_id")
}

pub fn system_uuid() -> String {
    first_line("/sys/class/dmi/id/product_uuid")
}

/// The largest PID the kernel hands out, and how many processes run now.
pub fn pid_stats() -> Option<(u64, u64)> {
    let max: u64 = first_line("/proc/sys/kernel/pid_max").parse().ok()?;
    let running = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().as_encoded_bytes().iter().all(u8::is_ascii_digit))
        .count() as u64;
    Some((max, running))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_bytes() {
        let text = "MemTotal:       24578316 kB\nMemFree:        1000 kB\nMemAvailable:   2000 kB\n";
        assert_eq!(parse_meminfo(text, "MemTotal"), Some(24578316 * 1024));
        assert_eq!(parse_meminfo(text, "MemAvailable"), Some(2000 * 1024));
        assert_eq!(parse_meminfo(text, "Nope"), None);
    }

    #[test]
    fn this_host_has_facts() {
        assert!(cpu_count() >= 1);
        assert!(meminfo("MemTotal").unwrap_or(0) > 0);
        assert!(fs_stats(Path::new("/")).is_some_and(|s| s.capacity > 0));
        assert!(!uname().0.is_empty());
    }
}

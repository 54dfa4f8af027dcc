//! What a host needs to run ferrok, checked one item at a time for
//! `ferrok check-config`: the kernel and its options, cgroups, the
//! programs ferrok drives, nftables, free ports and the data dir. Each
//! check says what it found, or what to do about it.

use std::io::Read;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Works, with a caveat, or could not be checked.
    Warn,
    /// ferrok will not run (or not fully) until this is fixed.
    Fail,
}

#[derive(Debug, Clone)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
}

fn check(name: &str, status: Status, detail: impl Into<String>) -> Check {
    Check { name: name.into(), status, detail: detail.into() }
}

/// nftables NAT in the `inet` family (the service proxy's table) came with Linux 5.2.
const MIN_KERNEL: (u32, u32) = (5, 2);

/// Kernel options ferrok relies on, built in or as modules.
const KERNEL_OPTIONS: &[&str] = &[
    "CONFIG_NAMESPACES",
    "CONFIG_NET_NS",
    "CONFIG_PID_NS",
    "CONFIG_IPC_NS",
    "CONFIG_UTS_NS",
    "CONFIG_CGROUPS",
    "CONFIG_MEMCG",
    "CONFIG_CGROUP_PIDS",
    "CONFIG_CGROUP_SCHED",
    "CONFIG_OVERLAY_FS",
    "CONFIG_VETH",
    "CONFIG_BRIDGE",
    "CONFIG_VXLAN",
    "CONFIG_NF_CONNTRACK",
    "CONFIG_NF_TABLES",
    "CONFIG_NF_TABLES_INET",
    "CONFIG_NFT_CT",
    "CONFIG_NFT_NAT",
    "CONFIG_NFT_MASQ",
    "CONFIG_NFT_NUMGEN",
    "CONFIG_NFT_REJECT",
    "CONFIG_NFT_FIB_INET",
];

pub fn kernel_version(release: &str) -> Check {
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) if (major, minor) >= MIN_KERNEL => check("kernel", Status::Ok, release),
        (Some(_), Some(_)) => check(
            "kernel",
            Status::Fail,
            format!(
                "{release}: Linux {}.{} or newer is needed (nftables NAT in the inet family)",
                MIN_KERNEL.0, MIN_KERNEL.1
            ),
        ),
        _ => check("kernel", Status::Warn, format!("cannot read the version in {release:?}")),
    }
}

/// The kernel's build configuration, from `/proc/config.gz` or `/boot/config-<release>`.
fn kernel_config(release: &str) -> Option<(String, String)> {
    if let Ok(f) = std::fs::File::open("/proc/config.gz") {
        let mut text = String::new();
        if flate2::read::GzDecoder::new(f).read_to_string(&mut text).is_ok() {
            return Some(("/proc/config.gz".into(), text));
        }
    }
    let boot = format!("/boot/config-{release}");
    std::fs::read_to_string(&boot).ok().map(|t| (boot, t))
}

pub fn kernel_options_in(source: &str, config: &str) -> Check {
    let set = |opt: &str| {
        config
            .lines()
            .any(|l| l.strip_prefix(opt).and_then(|r| r.strip_prefix('=')).is_some_and(|v| v == "y" || v == "m"))
    };
    let missing: Vec<&str> = KERNEL_OPTIONS.iter().copied().filter(|o| !set(o)).collect();
    if missing.is_empty() {
        check("kernel options", Status::Ok, format!("all {} present ({source})", KERNEL_OPTIONS.len()))
    } else {
        check(
            "kernel options",
            Status::Fail,
            format!("{} not set in {source}: use a kernel built with them", missing.join(", ")),
        )
    }
}

pub fn kernel_options(release: &str) -> Check {
    match kernel_config(release) {
        Some((source, text)) => kernel_options_in(&source, &text),
        None => check(
            "kernel options",
            Status::Warn,
            format!("no /proc/config.gz or /boot/config-{release}: the kernel's options cannot be checked"),
        ),
    }
}

/// cgroup v2 (`cgroup.controllers` at `root`) or v1 (`/proc/cgroups`),
/// with the controllers pods need.
pub fn cgroups(root: &Path, proc_cgroups: &str) -> Check {
    const NEEDED: &[&str] = &["cpu", "memory", "pids"];
    if let Ok(controllers) = std::fs::read_to_string(root.join("cgroup.controllers")) {
        let have: Vec<&str> = controllers.split_whitespace().collect();
        let missing: Vec<&str> = NEEDED.iter().copied().filter(|c| !have.contains(c)).collect();
        return if missing.is_empty() {
            check("cgroups", Status::Ok, format!("v2 ({})", have.join(" ")))
        } else {
            check("cgroups", Status::Fail, format!("v2 without the {} controller(s): enable them", missing.join(", ")))
        };
    }
    let enabled: Vec<&str> = proc_cgroups
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && f[3] == "1").then(|| f[0])
        })
        .collect();
    if enabled.is_empty() {
        return check("cgroups", Status::Fail, "neither cgroup v2 nor v1 controllers found: mount /sys/fs/cgroup");
    }
    let missing: Vec<&str> = NEEDED.iter().copied().filter(|c| !enabled.contains(c)).collect();
    if missing.is_empty() {
        let hybrid = if root.join("unified").exists() { ", hybrid" } else { "" };
        check("cgroups", Status::Ok, format!("v1{hybrid} ({})", NEEDED.join(" ")))
    } else {
        check(
            "cgroups",
            Status::Fail,
            format!(
                "v1 without the {} controller(s): enable them (e.g. cgroup_enable=memory on the kernel command line)",
                missing.join(", ")
            ),
        )
    }
}

/// A program ferrok runs, and the Debian package that has it.
pub fn program(name: &str, package: &str, optional: bool) -> Check {
    match super::find_binary(name) {
        Some(p) => check(name, Status::Ok, p.display().to_string()),
        None if optional => check(name, Status::Warn, format!("not installed (optional; Debian package {package})")),
        None => check(name, Status::Fail, format!("not installed: install the {package} package")),
    }
}

/// The CNI plugins the pod network uses, in `dir` (when found).
pub fn cni_plugins(dir: Option<&Path>) -> Check {
    const PLUGINS: &[&str] = &["bridge", "host-local", "loopback", "portmap"];
    let Some(dir) = dir else {
        return check("CNI plugins", Status::Fail, "not found: install the containernetworking-plugins package");
    };
    let missing: Vec<&str> = PLUGINS.iter().copied().filter(|p| !super::is_executable(&dir.join(p))).collect();
    if missing.is_empty() {
        check("CNI plugins", Status::Ok, format!("{} in {}", PLUGINS.join(" "), dir.display()))
    } else {
        check(
            "CNI plugins",
            Status::Fail,
            format!(
                "{} missing in {}: install the containernetworking-plugins package",
                missing.join(", "),
                dir.display()
            ),
        )
    }
}

/// Whether `nft` can read the ruleset (it needs root).
pub fn nftables(root: bool) -> Check {
    if !root {
        return check("nftables", Status::Warn, "not checked: run as root");
    }
    let Some(nft) = super::find_binary("nft") else {
        return check("nftables", Status::Fail, "nft is not installed: install the nftables package");
    };
    match std::process::Command::new(nft).args(["list", "tables"]).output() {
        Ok(o) if o.status.success() => check("nftables", Status::Ok, "the ruleset is readable"),
        Ok(o) => {
            check("nftables", Status::Fail, format!("nft list tables: {}", String::from_utf8_lossy(&o.stderr).trim()))
        }
        Err(e) => check("nftables", Status::Fail, format!("cannot run nft: {e}")),
    }
}

/// A TCP port (or a UDP one) free on every address.
pub fn port(what: &str, port: u16, udp: bool) -> Check {
    let name = format!("port {port}/{}", if udp { "udp" } else { "tcp" });
    let free = if udp {
        UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)).map(drop)
    } else {
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).map(drop)
    };
    match free {
        Ok(()) => check(&name, Status::Ok, format!("free ({what})")),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => check(
            &name,
            Status::Fail,
            format!("in use ({what}): stop what holds it (another ferrok or k3s?) or choose another port"),
        ),
        Err(e) => check(&name, Status::Warn, format!("cannot test ({what}): {e}")),
    }
}

/// The data dir: private to its owner, or creatable.
pub fn data_dir(dir: &Path) -> Check {
    use std::os::unix::fs::MetadataExt;
    let name = "data dir";
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => check(name, Status::Fail, format!("{} is not a directory", dir.display())),
        Ok(m) if m.mode() & 0o022 != 0 => check(
            name,
            Status::Fail,
            format!("{} is writable by others (mode {:o}): chmod go-w it", dir.display(), m.mode() & 0o777),
        ),
        // SAFETY: geteuid has no preconditions.
        Ok(m) if m.uid() != unsafe { libc::geteuid() } => check(
            name,
            Status::Fail,
            format!("{} belongs to uid {}, not to the user running ferrok", dir.display(), m.uid()),
        ),
        Ok(_) => check(name, Status::Ok, dir.display().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = dir.ancestors().skip(1).find(|p| p.exists());
            // SAFETY: access(2) on a NUL-terminated path.
            let writable = parent
                .and_then(|p| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok())
                .is_some_and(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0);
            if writable {
                check(name, Status::Ok, format!("{} (made at first start)", dir.display()))
            } else {
                check(name, Status::Fail, format!("{} does not exist and cannot be made here", dir.display()))
            }
        }
        Err(e) => check(name, Status::Fail, format!("{}: {e}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions() {
        assert_eq!(kernel_version("6.18.44-fc").status, Status::Ok);
        assert_eq!(kernel_version("5.2.0").status, Status::Ok);
        assert_eq!(kernel_version("4.19.0-17-amd64").status, Status::Fail);
        assert_eq!(kernel_version("weird").status, Status::Warn);
    }

    #[test]
    fn kernel_options_y_or_m() {
        let all: String = KERNEL_OPTIONS.iter().map(|o| format!("{o}=m\n")).collect();
        assert_eq!(kernel_options_in("x", &all).status, Status::Ok);
        let without = all.replace("CONFIG_VXLAN=m", "# CONFIG_VXLAN is not set");
        let c = kernel_options_in("x", &without);
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.starts_with("CONFIG_VXLAN not set"), "{}", c.detail);
    }

    #[test]
    fn cgroup_layouts() {
        let d = tempfile::tempdir().unwrap();
        let v1 = "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t1\t1\t1\nmemory\t2\t1\t1\npids\t3\t1\t1\n";
        assert_eq!(cgroups(d.path(), v1).status, Status::Ok);
        assert_eq!(cgroups(d.path(), &v1.replace("memory\t2\t1\t1", "memory\t0\t1\t0")).status, Status::Fail);
        std::fs::write(d.path().join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
        let c = cgroups(d.path(), "");
        assert_eq!((c.status, c.detail.as_str()), (Status::Ok, "v2 (cpuset cpu io memory pids)"));
        std::fs::write(d.path().join("cgroup.controllers"), "cpu io\n").unwrap();
        assert_eq!(cgroups(d.path(), "").status, Status::Fail);
    }

    #[test]
    fn ports_in_use() {
        let held = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        let p = held.local_addr().unwrap().port();
        assert_eq!(port("test", p, false).status, Status::Fail);
        drop(held);
        assert_eq!(port("test", p, false).status, Status::Ok);
    }

    #[test]
    fn data_dirs() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(data_dir(d.path()).status, Status::Ok);
        assert_eq!(data_dir(&d.path().join("new")).status, Status::Ok);
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(data_dir(d.path()).status, Status::Fail);
    }
}

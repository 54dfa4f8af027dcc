//! The eviction signals as observed on this node, and how upstream prints
//! their quantities.
//!
//! `memory.available` is the kernel's `MemAvailable` (of `MemTotal`), not
//! upstream's `capacity − working set of the root cgroup`. ferrok runs on
//! the host itself, not in a container whose /proc lies, so the kernel's
//! own estimate of memory usable without swapping is right there; it reads
//! the same on cgroup v1 and v2 (v2's root has no `memory.current`), and it
//! counts reclaimable slab and active page cache as available, which the
//! working set does not — on a small node with a big page cache the working
//! set reports pressure the kernel would resolve by itself.
//!
//! `pid.available` is `pid_max` minus the tasks the kernel counts in
//! /proc/loadavg (threads take PIDs too), as upstream. The file systems
//! are statvfs of the agent dir (nodefs) and containerd's root (imagefs).

use std::collections::BTreeMap;
use std::path::Path;

use crate::agent::config::Signal;
use crate::quantity::{Amount, Format};

/// A signal's value: what is left, and of how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: i64,
}

pub type Observations = BTreeMap<Signal, Observation>;

/// The tasks (processes and threads) the kernel runs: the 4th field of
/// /proc/loadavg, `running/total`.
pub fn loadavg_tasks(text: &str) -> Option<i64> {
    text.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok()
}

/// Reads every signal the node can observe; a signal that cannot be read is absent.
pub fn observe(node_fs: &Path, image_fs: &Path) -> Observations {
    let mut out = Observations::new();
    if let (Some(total), Some(available)) = (crate::host::meminfo("MemTotal"), crate::host::meminfo("MemAvailable")) {
        out.insert(Signal::MemoryAvailable, Observation { available: available as i64, capacity: total as i64 });
    }
    for (path, bytes, inodes) in [
        (node_fs, Signal::NodeFsAvailable, Signal::NodeFsInodesFree),
        (image_fs, Signal::ImageFsAvailable, Signal::ImageFsInodesFree),
    ] {
        if let Some(fs) = crate::host::fs_stats(path) {
            out.insert(bytes, Observation { available: fs.available as i64, capacity: fs.capacity as i64 });
            if fs.inodes > 0 {
                out.insert(inodes, Observation { available: fs.inodes_free as i64, capacity: fs.inodes as i64 });
            }
        }
    }
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max").ok().and_then(|s| s.trim().parse::<i64>().ok());
    let tasks = std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| loadavg_tasks(&s));
    if let (Some(max), Some(tasks)) = (pid_max, tasks) {
        out.insert(Signal::PidAvailable, Observation { available: (max - tasks).max(0), capacity: max });
    }
    out
}

/// The resource a signal starves, as eviction messages name it.
pub fn resource_of(signal: Signal) -> &'static str {
    match signal {
        Signal::MemoryAvailable => "memory",
        Signal::NodeFsAvailable | Signal::ImageFsAvailable => "ephemeral-storage",
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => "inodes",
        Signal::PidAvailable => "pids",
    }
}

/// A count as Go's `resource.Quantity` prints it in the DecimalSI format (`1500`, `2k`, `3M`).
pub fn decimal_si(value: i64) -> String {
    Amount::from_units(value, Format::DecimalSI).to_string()
}

/// Bytes as Go's `resource.Quantity` prints them in the BinarySI format
/// (`100Mi`, `51200Ki`, `1500`); under 1024 it prints DecimalSI, as Go does.
pub fn binary_si(value: i64) -> String {
    Amount::from_units(value, Format::BinarySI).to_string()
}

/// How a signal's amounts print (bytes in BinarySI, counts in DecimalSI).
pub fn format_amount(signal: Signal, value: i64) -> String {
    match signal {
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => decimal_si(value),
        _ => binary_si(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_come_from_loadavg() {
        assert_eq!(loadavg_tasks("3.88 4.93 5.38 2/135 31339\n"), Some(135));
        assert_eq!(loadavg_tasks("garbage"), None);
    }

    #[test]
    fn quantities_print_like_go() {
        assert_eq!(binary_si(100 << 20), "100Mi");
        assert_eq!(binary_si(51200 * 1024 + 1024), "51201Ki");
        assert_eq!(binary_si(60 << 20), "60Mi");
        assert_eq!(binary_si(1 << 30), "1Gi");
        assert_eq!(binary_si(1500), "1500");
        assert_eq!(binary_si(1000), "1k");
        assert_eq!(binary_si(0), "0");
        assert_eq!(decimal_si(2_000_000), "2M");
        assert_eq!(decimal_si(1234), "1234");
    }

    #[test]
    fn this_node_has_signals() {
        let obs = observe(Path::new("/"), Path::new("/"));
        let mem = obs[&Signal::MemoryAvailable];
        assert!(mem.capacity > 0 && mem.available > 0 && mem.available <= mem.capacity);
        assert!(obs[&Signal::NodeFsAvailable].capacity > 0);
        assert!(obs[&Signal::PidAvailable].available > 0);
    }
}

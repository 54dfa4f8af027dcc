//! CPU and memory of one cgroup, as cAdvisor reads them: cgroup v1's
//! `cpuacct.usage` and `memory.usage_in_bytes` + `memory.stat` (the
//! `total_*` fields, which count the children), or cgroup v2's `cpu.stat`
//! and `memory.current` + `memory.stat`. The working set is usage less
//! inactive file pages; rss is anonymous memory.

use std::path::{Path, PathBuf};

/// Memory of a cgroup, in bytes and page-fault counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    pub usage_bytes: u64,
    pub working_set_bytes: u64,
    pub rss_bytes: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
}

/// One reading of a cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupSample {
    /// Cumulative CPU time of all cores, in nanoseconds.
    pub cpu_usage_ns: Option<u64>,
    pub memory: Option<MemoryUsage>,
}

/// The cgroup file systems under a mount point (`/sys/fs/cgroup`).
#[derive(Debug, Clone)]
pub struct CgroupFs {
    root: PathBuf,
    unified: bool,
}

impl Default for CgroupFs {
    fn default() -> Self {
        CgroupFs::at("/sys/fs/cgroup")
    }
}

/// A field of a `key value` file (memory.stat, cpu.stat).
pub fn stat_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == field).then(|| v.trim().parse().ok()).flatten()
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Working set and rss from usage and memory.stat (v1 names or v2 names).
pub fn memory_usage(usage: u64, stat: &str, unified: bool) -> MemoryUsage {
    let f = |v1: &str, v2: &str| stat_field(stat, if unified { v2 } else { v1 }).unwrap_or(0);
    let inactive = f("total_inactive_file", "inactive_file");
    MemoryUsage {
        usage_bytes: usage,
        working_set_bytes: usage.saturating_sub(inactive),
        rss_bytes: f("total_rss", "anon"),
        page_faults: f("total_pgfault", "pgfault"),
        major_page_faults: f("total_pgmajfault", "pgmajfault"),
    }
}

impl CgroupFs {
    /// The hierarchies mounted at `root`; v2 when it holds `cgroup.controllers`.
    pub fn at(root: impl Into<PathBuf>) -> CgroupFs {
        let root = root.into();
        let unified = root.join("cgroup.controllers").exists();
        CgroupFs { root, unified }
    }

    pub fn unified(&self) -> bool {
        self.unified
    }

    /// The folder of `cgroup` (`/kubepods/besteffort/pod…`) for a v1 controller.
    pub fn dir(&self, controller: &str, cgroup: &str) -> PathBuf {
        let rel = cgroup.trim_start_matches('/');
        if self.unified {
            return self.root.join(rel);
        }
        let mut base = self.root.join(controller);
        // Some hosts mount cpuacct together with cpu.
        if controller == "cpuacct" && !base.exists() {
            base = self.root.join("cpu,cpuacct");
        }
        base.join(rel)
    }

    /// Whether the cgroup exists.
    pub fn exists(&self, cgroup: &str) -> bool {
        self.dir("memory", cgroup).is_dir()
    }

    pub fn cpu_usage_ns(&self, cgroup: &str) -> Option<u64> {
        let dir = self.dir("cpuacct", cgroup);
        if self.unified {
            let text = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
            return stat_field(&text, "usage_usec").map(|us| us * 1000);
        }
        read_u64(&dir.join("cpuacct.usage"))
    }

    pub fn memory(&self, cgroup: &str) -> Option<MemoryUsage> {
        let dir = self.dir("memory", cgroup);
        let usage = if self.unified {
            read_u64(&dir.join("memory.current"))
        } else {
            read_u64(&dir.join("memory.usage_in_bytes"))
        }?;
        let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
        Some(memory_usage(usage, &stat, self.unified))
    }

    pub fn sample(&self, cgroup: &str) -> CgroupSample {
        CgroupSample { cpu_usage_ns: self.cpu_usage_ns(cgroup), memory: self.memory(cgroup) }
    }

    /// The cgroup of a pod under `cgroup_root`, whichever QoS class it is in.
    pub fn pod_cgroup(&self, cgroup_root: &str, uid: &str) -> Option<String> {
        let root = cgroup_root.trim_end_matches('/');
        ["", "burstable/", "besteffort/"]
            .into_iter()
            .map(|qos| format!("{root}/{qos}pod{uid}"))
            .find(|c| self.exists(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn cgroup_v1_files_are_read() {
        let d = tempfile::tempdir().unwrap();
        let pod = "kubepods/besteffort/podabc";
        write(d.path(), &format!("cpuacct/{pod}/cpuacct.usage"), "123456789\n");
        write(d.path(), &format!("memory/{pod}/memory.usage_in_bytes"), "10000\n");
        write(
            d.path(),
            &format!("memory/{pod}/memory.stat"),
            "cache 1\nrss 2\ninactive_file 7\ntotal_cache 3000\ntotal_rss 6000\ntotal_inactive_file 2500\n\
             total_pgfault 42\ntotal_pgmajfault 1\n",
        );
        let fs = CgroupFs::at(d.path());
        assert!(!fs.unified());
        assert_eq!(fs.pod_cgroup("/kubepods", "abc").as_deref(), Some("/kubepods/besteffort/podabc"));
        assert_eq!(fs.pod_cgroup("/kubepods", "other"), None);
        let s = fs.sample("/kubepods/besteffort/podabc");
        assert_eq!(s.cpu_usage_ns, Some(123456789));
        assert_eq!(
            s.memory,
            Some(MemoryUsage {
                usage_bytes: 10000,
                working_set_bytes: 7500,
                rss_bytes: 6000,
                page_faults: 42,
                major_page_faults: 1
            })
        );
    }

    #[test]
    fn cgroup_v2_files_are_read() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "cgroup.controllers", "cpu memory\n");
        write(d.path(), "kubepods/podx/cpu.stat", "usage_usec 2500\nuser_usec 2000\n");
        write(d.path(), "kubepods/podx/memory.current", "8192\n");
        write(d.path(), "kubepods/podx/memory.stat", "anon 4096\ninactive_file 10000\npgfault 3\n");
        let fs = CgroupFs::at(d.path());
        assert!(fs.unified());
        let s = fs.sample("/kubepods/podx");
        assert_eq!(s.cpu_usage_ns, Some(2_500_000));
        let m = s.memory.unwrap();
        // Inactive file pages beyond usage leave no negative working set.
        assert_eq!((m.usage_bytes, m.working_set_bytes, m.rss_bytes, m.page_faults), (8192, 0, 4096, 3));
    }

    #[test]
    fn a_missing_cgroup_reads_as_nothing() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(CgroupFs::at(d.path()).sample("/gone"), CgroupSample::default());
    }
}

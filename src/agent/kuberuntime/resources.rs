//! Resources in the runtime's terms, as upstream's kuberuntime and
//! cm/helpers_linux: CPU shares from requests, CFS quota from limits, the
//! memory limit, the OOM score by QoS class, and the cgroup parent a pod's
//! sandbox goes under (`<root>/{burstable,besteffort}/pod<uid>`, Guaranteed
//! pods directly under the root).

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::agent::cri::api;
use crate::agent::pod_util;
use crate::quantity;

const MIN_SHARES: i64 = 2;
const MAX_SHARES: i64 = 262144;
const SHARES_PER_CPU: i64 = 1024;
const QUOTA_PERIOD: i64 = 100_000;
const MIN_QUOTA: i64 = 1000;

/// Upstream's MilliCPUToShares.
pub fn milli_cpu_to_shares(milli: i64) -> i64 {
    if milli == 0 {
        return MIN_SHARES;
    }
    (milli * SHARES_PER_CPU / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// Upstream's MilliCPUToQuota for the default 100 ms period.
pub fn milli_cpu_to_quota(milli: i64) -> i64 {
    if milli == 0 {
        return 0;
    }
    (milli * QUOTA_PERIOD / 1000).max(MIN_QUOTA)
}

/// Upstream's GetContainerOOMScoreAdjust.
pub fn oom_score_adj(pod: &Pod, c: &Container, memory_capacity: i64) -> i64 {
    match pod_util::qos_class(pod) {
        "Guaranteed" => -997,
        "BestEffort" => 1000,
        _ => {
            let request = c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("memory"))
                .and_then(quantity::value)
                .unwrap_or(0);
            if memory_capacity <= 0 {
                return 999;
            }
            let adj = 1000 - (1000 * request) / memory_capacity;
            adj.clamp(2, 999)
        }
    }
}

/// The container's LinuxContainerResources.
pub fn container_resources(pod: &Pod, c: &Container, memory_capacity: i64) -> api::LinuxContainerResources {
    let res = c.resources.as_ref();
    let get =
        |m: Option<&std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
         k: &str| m.and_then(|m| m.get(k)).cloned();
    let cpu_limit = get(res.and_then(|r| r.limits.as_ref()), "cpu").and_then(|q| quantity::milli_value(&q));
    let cpu_request =
        get(res.and_then(|r| r.requests.as_ref()), "cpu").and_then(|q| quantity::milli_value(&q)).or(cpu_limit);
    let memory_limit = get(res.and_then(|r| r.limits.as_ref()), "memory").and_then(|q| quantity::value(&q));
    let shares = if pod_util::qos_class(pod) == "BestEffort" {
        MIN_SHARES
    } else {
        milli_cpu_to_shares(cpu_request.unwrap_or(0))
    };
    let mut out = api::LinuxContainerResources {
        cpu_shares: shares,
        oom_score_adj: oom_score_adj(pod, c, memory_capacity),
        ..Default::default()
    };
    if let Some(milli) = cpu_limit.filter(|m| *m > 0) {
        out.cpu_period = QUOTA_PERIOD;
        out.cpu_quota = milli_cpu_to_quota(milli);
    }
    if let Some(bytes) = memory_limit.filter(|b| *b > 0) {
        out.memory_limit_in_bytes = bytes;
    }
    out
}

/// The cgroup a pod's sandbox and containers go under.
pub fn pod_cgroup_parent(pod: &Pod, cgroup_root: &str) -> String {
    let uid = pod_util::uid(pod);
    let root = cgroup_root.trim_end_matches('/');
    match pod_util::qos_class(pod) {
        "Guaranteed" => format!("{root}/pod{uid}"),
        "Burstable" => format!("{root}/burstable/pod{uid}"),
        _ => format!("{root}/besteffort/pod{uid}"),
    }
}

/// Every cgroup folder a pod may have left behind, under each mounted
/// hierarchy (cgroup v1 controllers, or the v2 unified tree).
pub fn pod_cgroup_dirs(cgroup_root: &str, uid: &str) -> Vec<std::path::PathBuf> {
    let mut bases: Vec<std::path::PathBuf> = Vec::new();
    if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        bases.push("/sys/fs/cgroup".into());
    } else if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        bases.extend(entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_dir()));
    }
    let root = cgroup_root.trim_matches('/');
    let mut out = Vec::new();
    for b in bases {
        for qos in ["", "burstable/", "besteffort/"] {
            out.push(b.join(root).join(format!("{qos}pod{uid}")));
        }
    }
    out
}

/// Removes the pod's leftover cgroup folders (runc leaves them behind).
/// Only empty folders can be removed; children go first.
pub fn remove_pod_cgroups(cgroup_root: &str, uid: &str) {
    for dir in pod_cgroup_dirs(cgroup_root, uid) {
        if dir.is_dir() {
            remove_cgroup_tree(&dir);
        }
    }
}

fn remove_cgroup_tree(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.filter_map(Result::ok) {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::debug!(dir = %dir.display(), error = %e, "cannot remove cgroup");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shares_and_quota_match_upstream() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_quota(500), 50_000);
        assert_eq!(milli_cpu_to_quota(1), 1000);
    }

    #[test]
    fn resources_and_cgroups_follow_qos() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"uid": "u1"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}]}}))
        .unwrap();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let r = container_resources(&pod, c, 1 << 30);
        assert_eq!(r.cpu_shares, 512);
        assert_eq!(r.cpu_quota, 50_000);
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
        assert_eq!(r.oom_score_adj, -997);
        assert_eq!(pod_cgroup_parent(&pod, "/kubepods"), "/kubepods/podu1");
        let be: Pod =
            serde_json::from_value(json!({"metadata": {"uid": "u2"}, "spec": {"containers": [{"name": "a"}]}}))
                .unwrap();
        assert_eq!(pod_cgroup_parent(&be, "/kubepods"), "/kubepods/besteffort/podu2");
        assert_eq!(container_resources(&be, &be.spec.as_ref().unwrap().containers[0], 1 << 30).oom_score_adj, 1000);
    }
}

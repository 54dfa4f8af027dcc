//! Local storage limits (upstream's localStorageEviction): a pod whose
//! emptyDir outgrows its `sizeLimit`, whose containers together outgrow the
//! sum of their `ephemeral-storage` limits, or one of whose containers
//! outgrows its own limit is evicted at once, whatever the node's state.

use k8s_openapi::api::core::v1::Pod;

use super::signals::binary_si;
use super::stats::PodDiskUsage;
use crate::agent::pod_util;
use crate::quantity;

const EPHEMERAL: &str = "ephemeral-storage";

/// Whether the pod has a limit worth measuring it for.
pub fn has_limits(pod: &Pod) -> bool {
    let spec = pod_util::spec(pod);
    let size_limit =
        spec.volumes.iter().flatten().any(|v| v.empty_dir.as_ref().is_some_and(|e| e.size_limit.is_some()));
    size_limit || spec.containers.iter().any(|c| container_limit(c).is_some())
}

fn container_limit(c: &k8s_openapi::api::core::v1::Container) -> Option<(i64, String)> {
    let q = c.resources.as_ref()?.limits.as_ref()?.get(EPHEMERAL)?;
    Some((quantity::value(q)?, q.0.clone()))
}

/// Why the pod must go, in upstream's words; None when within its limits.
pub fn violation(pod: &Pod, usage: &PodDiskUsage) -> Option<String> {
    let spec = pod_util::spec(pod);
    for v in spec.volumes.iter().flatten() {
        let Some(limit) = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()) else { continue };
        let Some(bytes) = quantity::value(limit).filter(|b| *b > 0) else { continue };
        if usage.empty_dirs.get(&v.name).is_some_and(|used| *used > bytes) {
            return Some(format!("Usage of EmptyDir volume {:?} exceeds the limit {:?}. ", v.name, limit.0));
        }
    }
    let limits: Vec<(i64, String)> = spec.containers.iter().filter_map(container_limit).collect();
    if !limits.is_empty() {
        let total: i64 = limits.iter().map(|(b, _)| b).sum();
        if usage.total > total {
            let text = if limits.len() == 1 { limits[0].1.clone() } else { binary_si(total) };
            return Some(format!("Pod ephemeral local storage usage exceeds the total limit of containers {text}. "));
        }
    }
    for c in &spec.containers {
        let Some((bytes, text)) = container_limit(c) else { continue };
        if usage.containers.iter().any(|(name, used)| name == &c.name && *used > bytes) {
            return Some(format!("Container {} exceeded its local ephemeral storage limit {text:?}. ", c.name));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashMap;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec})).unwrap()
    }

    #[test]
    fn empty_dir_over_its_size_limit() {
        let p = pod(json!({"containers": [{"name": "app"}], "volumes": [
            {"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}, {"name": "free", "emptyDir": {}}]}));
        assert!(has_limits(&p));
        let mut u = PodDiskUsage {
            empty_dirs: HashMap::from([("scratch".into(), 1 << 20), ("free".into(), 1 << 30)]),
            ..Default::default()
        };
        assert_eq!(violation(&p, &u), None);
        u.empty_dirs.insert("scratch".into(), (1 << 20) + 4096);
        assert_eq!(
            violation(&p, &u).as_deref(),
            Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ")
        );
    }

    #[test]
    fn containers_over_their_ephemeral_limits() {
        let p = pod(json!({"containers": [
            {"name": "a", "resources": {"limits": {"ephemeral-storage": "10Mi"}}},
            {"name": "b", "resources": {"limits": {"ephemeral-storage": "30Mi"}}}]}));
        assert!(has_limits(&p));
        let u = PodDiskUsage {
            containers: vec![("a".into(), 11 << 20), ("b".into(), 1 << 20)],
            total: 12 << 20,
            ..Default::default()
        };
        assert_eq!(
            violation(&p, &u).as_deref(),
            Some("Container a exceeded its local ephemeral storage limit \"10Mi\". ")
        );
        let u = PodDiskUsage { containers: vec![("a".into(), 1 << 20)], total: 41 << 20, ..Default::default() };
        assert_eq!(
            violation(&p, &u).as_deref(),
            Some("Pod ephemeral local storage usage exceeds the total limit of containers 40Mi. ")
        );
        assert!(!has_limits(&pod(json!({"containers": [{"name": "a"}]}))));
    }
}

//! Which pod goes first (upstream's rankMemoryPressure, rankDiskPressureFunc,
//! rankPIDPressure), which pods never go (critical: static, mirror, or a
//! priority of at least system-cluster-critical's), and the words of an
//! eviction as upstream writes them.

use std::cmp::Ordering;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::signals::binary_si;
use crate::agent::pod_util;
use crate::quantity;
use crate::well_known::annotations::CONFIG_MIRROR;

/// `scheduling.SystemCriticalPriority`.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
const CONFIG_SOURCE: &str = "kubernetes.io/config.source";

/// A pod and what it uses of the starved resource.
#[derive(Debug, Clone)]
pub struct PodUsage {
    pub pod: Arc<Pod>,
    /// The pod's usage (bytes, or processes); None when unknown.
    pub usage: Option<i64>,
    /// Usage by container name, for the message.
    pub containers: Vec<(String, i64)>,
}

/// Static and mirror pods, and pods at system-critical priority (upstream's IsCriticalPod).
pub fn is_critical(pod: &Pod) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    let source = annotations.and_then(|a| a.get(CONFIG_SOURCE)).map(String::as_str);
    let is_static = source.is_some_and(|s| s != "api");
    let is_mirror = annotations.is_some_and(|a| a.contains_key(CONFIG_MIRROR));
    let spec = pod_util::spec(pod);
    let by_class =
        matches!(spec.priority_class_name.as_deref(), Some("system-node-critical") | Some("system-cluster-critical"));
    is_static || is_mirror || by_class || priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

pub fn priority(pod: &Pod) -> i32 {
    pod_util::spec(pod).priority.unwrap_or(0)
}

fn container_request(c: &k8s_openapi::api::core::v1::Container, resource: &str) -> i64 {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(resource))
        .and_then(quantity::value)
        .unwrap_or(0)
}

/// The pod's request of a resource: its containers' sum, or its largest
/// init container's when that is more (upstream's PodRequests, without overhead).
pub fn pod_request(pod: &Pod, resource: &str) -> i64 {
    let spec = pod_util::spec(pod);
    let regular: i64 = spec.containers.iter().map(|c| container_request(c, resource)).sum();
    let init = spec.init_containers.iter().flatten().map(|c| container_request(c, resource)).max().unwrap_or(0);
    regular.max(init)
}

/// The text of a container's request, as the pod spec has it (`0` for none).
fn request_text(pod: &Pod, container: &str, resource: &str) -> String {
    pod_util::spec(pod)
        .containers
        .iter()
        .find(|c| c.name == container)
        .and_then(|c| c.resources.as_ref()?.requests.as_ref()?.get(resource).map(|q| q.0.clone()))
        .unwrap_or_else(|| "0".into())
}

/// Pods with unknown usage first, then those over their request.
fn exceeds_request(a: &PodUsage, b: &PodUsage, resource: &str) -> Ordering {
    match (a.usage, b.usage) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(ua), Some(ub)) => {
            let ea = ua > pod_request(&a.pod, resource);
            let eb = ub > pod_request(&b.pod, resource);
            eb.cmp(&ea)
        }
    }
}

/// Lower priority first.
fn by_priority(a: &PodUsage, b: &PodUsage) -> Ordering {
    priority(&a.pod).cmp(&priority(&b.pod))
}

/// Larger usage above the request first.
fn usage_over_request(a: &PodUsage, b: &PodUsage, resource: &str) -> Ordering {
    let over = |p: &PodUsage| p.usage.map(|u| u - pod_request(&p.pod, resource));
    match (over(a), over(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

fn rank_by_request(pods: &mut [PodUsage], resource: &str) {
    pods.sort_by(|a, b| {
        exceeds_request(a, b, resource).then_with(|| by_priority(a, b)).then_with(|| usage_over_request(a, b, resource))
    });
}

/// Memory pressure: over-request pods first, then by priority, then by usage over request.
pub fn rank_memory(pods: &mut [PodUsage]) {
    rank_by_request(pods, "memory");
}

/// Disk pressure: the same on local ephemeral storage.
pub fn rank_disk(pods: &mut [PodUsage]) {
    rank_by_request(pods, "ephemeral-storage");
}

/// PID pressure: by priority, then by process count.
pub fn rank_pid(pods: &mut [PodUsage]) {
    pods.sort_by(|a, b| by_priority(a, b).then_with(|| b.usage.unwrap_or(i64::MAX).cmp(&a.usage.unwrap_or(i64::MAX))));
}

/// Upstream's eviction message: the starved resource, the threshold and
/// what was available, and each container using more than it requested.
pub fn eviction_message(resource: &str, threshold: &str, available: &str, usage: &PodUsage) -> String {
    let mut msg =
        format!("The node was low on resource: {resource}. Threshold quantity: {threshold}, available: {available}. ");
    if resource == "memory" || resource == "ephemeral-storage" {
        for (name, used) in &usage.containers {
            let Some(c) = pod_util::spec(&usage.pod).containers.iter().find(|c| &c.name == name) else { continue };
            if *used > container_request(c, resource) {
                msg.push_str(&format!(
                    "Container {name} was using {}, request is {}, has larger consumption of {resource}. ",
                    binary_si(*used),
                    request_text(&usage.pod, name, resource)
                ));
            }
        }
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, priority: i32, memory_request: Option<&str>) -> Arc<Pod> {
        let resources = match memory_request {
            Some(r) => json!({"requests": {"memory": r}}),
            None => json!({}),
        };
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "uid": name},
                "spec": {"priority": priority, "containers": [{"name": "app", "resources": resources}]}
            }))
            .unwrap(),
        )
    }

    fn usage(pod: Arc<Pod>, used: Option<i64>) -> PodUsage {
        PodUsage { containers: used.map(|u| vec![("app".to_string(), u)]).unwrap_or_default(), pod, usage: used }
    }

    fn names(pods: &[PodUsage]) -> Vec<String> {
        pods.iter().map(|p| pod_util::name(&p.pod).to_string()).collect()
    }

    #[test]
    fn memory_ranking_is_upstreams() {
        let mut pods = vec![
            usage(pod("within-request", 0, Some("100Mi")), Some(50 << 20)),
            usage(pod("high-prio-over", 1000, Some("10Mi")), Some(500 << 20)),
            usage(pod("besteffort-small", 0, None), Some(10 << 20)),
            usage(pod("besteffort-big", 0, None), Some(200 << 20)),
            usage(pod("no-stats", 5000, None), None),
        ];
        rank_memory(&mut pods);
        assert_eq!(
            names(&pods),
            ["no-stats", "besteffort-big", "besteffort-small", "high-prio-over", "within-request"]
        );
    }

    #[test]
    fn pid_ranking_is_by_priority_then_count() {
        let mut pods = vec![
            usage(pod("many-high", 10, None), Some(500)),
            usage(pod("few-low", 0, None), Some(5)),
            usage(pod("many-low", 0, None), Some(50)),
        ];
        rank_pid(&mut pods);
        assert_eq!(names(&pods), ["many-low", "few-low", "many-high"]);
    }

    #[test]
    fn critical_pods_are_known() {
        assert!(!is_critical(&pod("a", 0, None)));
        assert!(is_critical(&pod("b", 2_000_001_000, None)));
        let mut p = (*pod("c", 0, None)).clone();
        p.spec.as_mut().unwrap().priority_class_name = Some("system-cluster-critical".into());
        assert!(is_critical(&p));
        let mut s = (*pod("d", 0, None)).clone();
        s.metadata.annotations = Some([(CONFIG_SOURCE.to_string(), "file".to_string())].into());
        assert!(is_critical(&s));
    }

    #[test]
    fn messages_are_upstreams() {
        let u = usage(pod("p", 0, None), Some(60 << 20));
        assert_eq!(
            eviction_message("memory", "100Mi", "51200Ki", &u),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. Container app was using 60Mi, request is 0, has larger consumption of memory. "
        );
        let within = usage(pod("q", 0, Some("100Mi")), Some(60 << 20));
        assert_eq!(
            eviction_message("memory", "100Mi", "50Mi", &within),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
        );
        assert_eq!(pod_request(&within.pod, "memory"), 100 << 20);
    }
}

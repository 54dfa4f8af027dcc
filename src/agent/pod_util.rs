//! Small facts about a pod spec that several parts of the node need: its
//! restart policy, which init containers are sidecars, a container's spec
//! hash, the QoS class, the pod's full name as the kubelet writes it.

use std::collections::BTreeMap;

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// Which list of the spec a container comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ContainerKind {
    Init,
    /// An init container with `restartPolicy: Always`.
    Sidecar,
    Regular,
    /// A container of `spec.ephemeralContainers`: started once, never restarted.
    Ephemeral,
}

impl ContainerKind {
    pub fn label(self) -> &'static str {
        match self {
            ContainerKind::Init => "init",
            ContainerKind::Sidecar => "sidecar",
            ContainerKind::Regular => "regular",
            ContainerKind::Ephemeral => "ephemeral",
        }
    }

    /// The field path events use: `spec.containers{app}`.
    pub fn field_path(self, name: &str) -> String {
        match self {
            ContainerKind::Regular => format!("spec.containers{{{name}}}"),
            ContainerKind::Ephemeral => format!("spec.ephemeralContainers{{{name}}}"),
            _ => format!("spec.initContainers{{{name}}}"),
        }
    }
}

pub fn spec(pod: &Pod) -> &PodSpec {
    static EMPTY: std::sync::OnceLock<PodSpec> = std::sync::OnceLock::new();
    pod.spec.as_ref().unwrap_or_else(|| EMPTY.get_or_init(PodSpec::default))
}

pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// `name_namespace(uid)`, as the kubelet names pods in messages.
pub fn full_name(pod: &Pod) -> String {
    format!("{}_{}({})", name(pod), namespace(pod), uid(pod))
}

/// `Always`, `OnFailure` or `Never` (default Always).
pub fn restart_policy(pod: &Pod) -> &str {
    spec(pod).restart_policy.as_deref().unwrap_or("Always")
}

pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Every container of the pod with its kind, init containers first.
pub fn containers(pod: &Pod) -> impl Iterator<Item = (ContainerKind, &Container)> {
    let s = spec(pod);
    let init = s.init_containers.iter().flatten().map(|c| {
        let kind = if is_sidecar(c) { ContainerKind::Sidecar } else { ContainerKind::Init };
        (kind, c)
    });
    init.chain(s.containers.iter().map(|c| (ContainerKind::Regular, c)))
}

pub fn find_container<'a>(pod: &'a Pod, name: &str) -> Option<(ContainerKind, &'a Container)> {
    containers(pod).find(|(_, c)| c.name == name)
}

/// An ephemeral container as the container it runs as (the fields both share).
pub fn ephemeral_as_container(ec: &EphemeralContainer) -> Container {
    let ec = ec.clone();
    Container {
        args: ec.args,
        command: ec.command,
        env: ec.env,
        env_from: ec.env_from,
        image: ec.image,
        image_pull_policy: ec.image_pull_policy,
        lifecycle: ec.lifecycle,
        liveness_probe: ec.liveness_probe,
        name: ec.name,
        ports: ec.ports,
        readiness_probe: ec.readiness_probe,
        resize_policy: ec.resize_policy,
        resources: ec.resources,
        restart_policy: ec.restart_policy,
        security_context: ec.security_context,
        startup_probe: ec.startup_probe,
        stdin: ec.stdin,
        stdin_once: ec.stdin_once,
        termination_message_path: ec.termination_message_path,
        termination_message_policy: ec.termination_message_policy,
        tty: ec.tty,
        volume_devices: ec.volume_devices,
        volume_mounts: ec.volume_mounts,
        working_dir: ec.working_dir,
    }
}

/// The pod's ephemeral containers, in the order they were added.
pub fn ephemeral_containers(pod: &Pod) -> impl Iterator<Item = &EphemeralContainer> {
    spec(pod).ephemeral_containers.iter().flatten()
}

/// The container an ephemeral container shares its process namespace with.
pub fn ephemeral_target<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    ephemeral_containers(pod)
        .find(|ec| ec.name == name)
        .and_then(|ec| ec.target_container_name.as_deref())
        .filter(|t| !t.is_empty())
}

/// Any container of the pod by name, ephemeral ones included.
pub fn find_any_container<'a>(pod: &'a Pod, name: &str) -> Option<(ContainerKind, Cow<'a, Container>)> {
    if let Some((kind, c)) = find_container(pod, name) {
        return Some((kind, Cow::Borrowed(c)));
    }
    ephemeral_containers(pod)
        .find(|ec| ec.name == name)
        .map(|ec| (ContainerKind::Ephemeral, Cow::Owned(ephemeral_as_container(ec))))
}

/// Whether a container that exited with `exit_code` is started again.
pub fn should_restart(pod: &Pod, kind: ContainerKind, exit_code: i32) -> bool {
    match kind {
        ContainerKind::Sidecar => return true,
        ContainerKind::Ephemeral => return false,
        _ => {}
    }
    match restart_policy(pod) {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => kind == ContainerKind::Regular || exit_code != 0,
    }
}

/// A hash of what in a container's spec needs a new container when it
/// changes (everything but resources, which change in place). FNV-1a over
/// the JSON form, which is stable for the same spec.
pub fn container_hash(c: &Container) -> String {
    let mut c = c.clone();
    c.resources = None;
    c.resize_policy = None;
    let bytes = serde_json::to_vec(&c).unwrap_or_default();
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}")
}

/// Guaranteed, Burstable or BestEffort, as upstream's qos.GetPodQOS.
pub fn qos_class(pod: &Pod) -> &'static str {
    let mut requests: BTreeMap<String, i64> = BTreeMap::new();
    let mut limits: BTreeMap<String, i64> = BTreeMap::new();
    let mut guaranteed = true;
    let s = spec(pod);
    let all = s.containers.iter().chain(s.init_containers.iter().flatten());
    let tracked = |name: &str| name == "cpu" || name == "memory";
    for c in all {
        let res = c.resources.as_ref();
        let req = res.and_then(|r| r.requests.as_ref());
        let lim = res.and_then(|r| r.limits.as_ref());
        for (k, v) in req.into_iter().flatten() {
            if tracked(k) && milli(v) != 0 {
                *requests.entry(k.clone()).or_default() += milli(v);
            }
        }
        let mut has_both = 0;
        for (k, v) in lim.into_iter().flatten() {
            if tracked(k) && milli(v) != 0 {
                has_both += 1;
                *limits.entry(k.clone()).or_default() += milli(v);
            }
        }
        if has_both != 2 {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed {
        // Requests default to limits; any request that differs breaks it.
        for (k, v) in &requests {
            if limits.get(k) != Some(v) {
                guaranteed = false;
            }
        }
    }
    if guaranteed && limits.len() == 2 {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

fn milli(q: &Quantity) -> i64 {
    quantity::milli_value(q).unwrap_or(0)
}

/// A resource of a container: the limit, else the request.
pub fn request_or_limit(c: &Container, resource: &str) -> (Option<i64>, Option<i64>) {
    let res = c.resources.as_ref();
    let get = |m: Option<&BTreeMap<String, Quantity>>| m.and_then(|m| m.get(resource)).and_then(quantity::milli_value);
    let limit = get(res.and_then(|r| r.limits.as_ref()));
    let request = get(res.and_then(|r| r.requests.as_ref())).or(limit);
    (request, limit)
}

/// The hostname a pod's sandbox gets: `spec.hostname`, else the pod name,
/// cut to 63 characters without a trailing `-` or `.`.
pub fn hostname(pod: &Pod) -> String {
    let s = spec(pod);
    let h = s.hostname.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| name(pod).to_string());
    let mut h: String = h.chars().take(63).collect();
    while h.ends_with('-') || h.ends_with('.') {
        h.pop();
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn qos_classes() {
        let be = pod(json!({"spec": {"containers": [{"name": "a"}]}}));
        assert_eq!(qos_class(&be), "BestEffort");
        let g = pod(
            json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}),
        );
        assert_eq!(qos_class(&g), "Guaranteed");
        let b = pod(json!({"spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "100m"}}}]}}));
        assert_eq!(qos_class(&b), "Burstable");
        let b2 = pod(json!({"spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m"}}}]}}));
        assert_eq!(qos_class(&b2), "Burstable");
    }

    #[test]
    fn restart_rules() {
        let never = pod(json!({"spec": {"restartPolicy": "Never", "containers": []}}));
        let on_failure = pod(json!({"spec": {"restartPolicy": "OnFailure", "containers": []}}));
        let always = pod(json!({"spec": {"containers": []}}));
        assert!(!should_restart(&never, ContainerKind::Regular, 1));
        assert!(should_restart(&never, ContainerKind::Sidecar, 0));
        assert!(should_restart(&on_failure, ContainerKind::Regular, 1));
        assert!(!should_restart(&on_failure, ContainerKind::Regular, 0));
        assert!(should_restart(&always, ContainerKind::Regular, 0));
        assert!(!should_restart(&always, ContainerKind::Init, 0));
        assert!(should_restart(&always, ContainerKind::Init, 2));
    }

    #[test]
    fn hash_ignores_resources() {
        let a: Container = serde_json::from_value(json!({"name": "a", "image": "x:1"})).unwrap();
        let mut b = a.clone();
        b.resources = serde_json::from_value(json!({"limits": {"cpu": "1"}})).unwrap();
        assert_eq!(container_hash(&a), container_hash(&b));
        b.image = Some("x:2".into());
        assert_ne!(container_hash(&a), container_hash(&b));
    }

    #[test]
    fn hostnames_are_cut() {
        let p = pod(json!({"metadata": {"name": format!("{}-x", "a".repeat(62))}, "spec": {"containers": []}}));
        assert_eq!(hostname(&p), "a".repeat(62));
    }
}

/// Whether the pod has not started on any node yet: a restart of ferrok
/// must not reject (at admission) the pods it already runs.
pub fn never_started(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else { return true };
    let phase_pending = status.phase.as_deref().is_none_or(|p| p == "Pending");
    let any_started =
        status.container_statuses.iter().chain(status.init_container_statuses.iter()).flatten().any(|c| {
            c.state.as_ref().is_some_and(|s| s.running.is_some() || s.terminated.is_some()) || c.restart_count > 0
        });
    phase_pending && !any_started
}

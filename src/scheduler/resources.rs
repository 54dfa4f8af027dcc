//! Resource arithmetic of the scheduler: what a pod requests (upstream's
//! `PodRequests`: containers summed, each init container as a floor,
//! sidecars added, plus overhead) and what a node can hold.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// What a container without a CPU request counts as, for scoring only.
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
/// What a container without a memory request counts as, for scoring only.
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

/// An amount of each resource: millicores, bytes, pods and the rest by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    pub pods: i64,
    /// Extended resources (`nvidia.com/gpu`, `hugepages-2Mi`, ...).
    pub scalar: BTreeMap<String, i64>,
}

impl Resources {
    /// Reads a ResourceList (node allocatable or container requests).
    pub fn from_list(list: Option<&BTreeMap<String, Quantity>>) -> Self {
        let mut r = Resources::default();
        for (name, q) in list.into_iter().flatten() {
            match name.as_str() {
                "cpu" => r.milli_cpu = quantity::milli_value(q).unwrap_or(0),
                "memory" => r.memory = quantity::value(q).unwrap_or(0),
                "ephemeral-storage" => r.ephemeral_storage = quantity::value(q).unwrap_or(0),
                "pods" => r.pods = quantity::value(q).unwrap_or(0),
                other => {
                    r.scalar.insert(other.to_string(), quantity::value(q).unwrap_or(0));
                }
            }
        }
        r
    }

    pub fn add(&mut self, o: &Resources) {
        self.milli_cpu += o.milli_cpu;
        self.memory += o.memory;
        self.ephemeral_storage += o.ephemeral_storage;
        self.pods += o.pods;
        for (k, v) in &o.scalar {
            *self.scalar.entry(k.clone()).or_default() += v;
        }
    }

    pub fn sub(&mut self, o: &Resources) {
        self.milli_cpu -= o.milli_cpu;
        self.memory -= o.memory;
        self.ephemeral_storage -= o.ephemeral_storage;
        self.pods -= o.pods;
        for (k, v) in &o.scalar {
            *self.scalar.entry(k.clone()).or_default() -= v;
        }
    }

    /// Each resource the larger of the two.
    fn max_with(&mut self, o: &Resources) {
        self.milli_cpu = self.milli_cpu.max(o.milli_cpu);
        self.memory = self.memory.max(o.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(o.ephemeral_storage);
        for (k, v) in &o.scalar {
            let e = self.scalar.entry(k.clone()).or_default();
            *e = (*e).max(*v);
        }
    }

    /// Whether nothing is asked at all (a pod with no requests).
    pub fn is_zero(&self) -> bool {
        self.milli_cpu == 0 && self.memory == 0 && self.ephemeral_storage == 0 && self.scalar.values().all(|v| *v == 0)
    }
}

fn container_requests(c: &Container, non_zero: bool) -> Resources {
    let mut r = Resources::from_list(c.resources.as_ref().and_then(|r| r.requests.as_ref()));
    // A limit without a request means the request equals the limit (the
    // API server defaults it; read it here too for objects that skipped it).
    let limits = Resources::from_list(c.resources.as_ref().and_then(|r| r.limits.as_ref()));
    let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
    let has = |name: &str| requests.is_some_and(|m| m.contains_key(name));
    if !has("cpu") {
        r.milli_cpu = limits.milli_cpu;
    }
    if !has("memory") {
        r.memory = limits.memory;
    }
    if non_zero {
        if !has("cpu") && r.milli_cpu == 0 {
            r.milli_cpu = DEFAULT_MILLI_CPU_REQUEST;
        }
        if !has("memory") && r.memory == 0 {
            r.memory = DEFAULT_MEMORY_REQUEST;
        }
    }
    r
}

/// What the pod asks of a node. `non_zero` counts containers without CPU or
/// memory requests at the scoring defaults (100m, 200Mi), as upstream's
/// scoring does; filtering uses the real requests.
pub fn pod_requests(pod: &Pod, non_zero: bool) -> Resources {
    let Some(spec) = pod.spec.as_ref() else { return Resources::default() };
    let mut total = Resources::default();
    for c in &spec.containers {
        total.add(&container_requests(c, non_zero));
    }
    // Init containers run one at a time before the others; sidecars
    // (restartPolicy Always) keep running and add up.
    let mut sidecars = Resources::default();
    let mut floor = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let r = container_requests(c, non_zero);
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars.add(&r);
            total.add(&r);
        } else {
            let mut with_sidecars = r.clone();
            with_sidecars.add(&sidecars);
            floor.max_with(&with_sidecars);
        }
    }
    total.max_with(&floor);
    if let Some(overhead) = spec.overhead.as_ref() {
        total.add(&Resources::from_list(Some(overhead)));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn requests_sum_containers_and_take_init_containers_as_a_floor() {
        let p = pod(serde_json::json!({"spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "200m"}}}
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "1", "memory": "1Mi"}}}],
            "overhead": {"cpu": "10m"}
        }}));
        let r = pod_requests(&p, false);
        assert_eq!(r.milli_cpu, 1010);
        assert_eq!(r.memory, 64 * 1024 * 1024);
        let empty = pod(serde_json::json!({"spec": {"containers": [{"name": "a"}]}}));
        assert!(pod_requests(&empty, false).is_zero());
        let nz = pod_requests(&empty, true);
        assert_eq!((nz.milli_cpu, nz.memory), (DEFAULT_MILLI_CPU_REQUEST, DEFAULT_MEMORY_REQUEST));
    }
}

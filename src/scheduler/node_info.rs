//! What the scheduler knows of each node and of each pod it places: the
//! node object, what its pods already request, the host ports they hold and
//! the pods themselves (for inter-pod affinity and topology spread).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};

use super::resources::{pod_requests, Resources};

/// A pod with what the scheduler computes once about it.
#[derive(Debug)]
pub struct PodInfo {
    pub pod: Arc<Pod>,
    /// `namespace/name`.
    pub key: String,
    pub uid: String,
    pub namespace: String,
    pub priority: i32,
    /// What the pod asks for (filtering).
    pub requests: Resources,
    /// The same with 100m/200Mi for containers asking nothing (scoring).
    pub non_zero_requests: Resources,
    /// (protocol, hostIP, hostPort) of every container port with a hostPort.
    pub host_ports: Vec<(String, String, i32)>,
    /// Whether the pod has any (anti-)affinity to other pods.
    pub has_pod_affinity: bool,
    pub has_required_anti_affinity: bool,
}

impl PodInfo {
    pub fn new(pod: Arc<Pod>) -> Self {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_default();
        let key = format!("{namespace}/{}", meta.name.as_deref().unwrap_or_default());
        let spec = pod.spec.as_ref();
        let affinity = spec.and_then(|s| s.affinity.as_ref());
        let anti = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let has_required_anti_affinity = anti
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
            .is_some_and(|t| !t.is_empty());
        let has_pod_affinity = affinity.is_some_and(|a| a.pod_affinity.is_some() || a.pod_anti_affinity.is_some());
        let mut host_ports = Vec::new();
        for c in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
            for p in c.ports.iter().flatten() {
                if let Some(hp) = p.host_port.filter(|p| *p > 0) {
                    let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
                    let ip = p.host_ip.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "0.0.0.0".into());
                    host_ports.push((proto, ip, hp));
                }
            }
        }
        PodInfo {
            uid: meta.uid.clone().unwrap_or_default(),
            namespace,
            key,
            priority: spec.and_then(|s| s.priority).unwrap_or(0),
            requests: pod_requests(&pod, false),
            non_zero_requests: pod_requests(&pod, true),
            host_ports,
            has_pod_affinity,
            has_required_anti_affinity,
            pod,
        }
    }

    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.pod.metadata.labels.as_ref()
    }
}

/// One node and what is placed on it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub node: Arc<Node>,
    pub allocatable: Resources,
    /// Sum of the requests of the pods on the node.
    pub requested: Resources,
    /// Sum of the non-zero requests (scoring).
    pub non_zero_requested: Resources,
    pub pods: Vec<Arc<PodInfo>>,
    pub used_ports: HashSet<(String, String, i32)>,
    /// Image name → size in bytes, from node.status.images.
    pub images: BTreeMap<String, i64>,
    /// Pods here with any pod (anti-)affinity; with required anti-affinity.
    pub pods_with_affinity: usize,
    pub pods_with_required_anti_affinity: usize,
    /// `spec.unschedulable` and `spec.taints`, kept beside the counts the
    /// filters read so that filtering a node that has neither does not
    /// reach into the node object (a cache miss per node and cycle).
    pub unschedulable: bool,
    pub taints: Vec<Taint>,
}

impl NodeInfo {
    pub fn new(node: Arc<Node>) -> Self {
        let mut info = NodeInfo {
            name: node.metadata.name.clone().unwrap_or_default(),
            node: node.clone(),
            allocatable: Resources::default(),
            requested: Resources::default(),
            non_zero_requested: Resources::default(),
            pods: Vec::new(),
            used_ports: HashSet::new(),
            images: BTreeMap::new(),
            pods_with_affinity: 0,
            pods_with_required_anti_affinity: 0,
            unschedulable: false,
            taints: Vec::new(),
        };
        info.set_node(node);
        info
    }

    /// Takes a newer version of the node object, keeping its pods.
    pub fn set_node(&mut self, node: Arc<Node>) {
        let status = node.status.as_ref();
        self.allocatable = Resources::from_list(status.and_then(|s| s.allocatable.as_ref()));
        self.images.clear();
        for image in status.and_then(|s| s.images.as_ref()).into_iter().flatten() {
            for name in image.names.iter().flatten() {
                self.images.insert(name.clone(), image.size_bytes.unwrap_or(0));
            }
        }
        let spec = node.spec.as_ref();
        self.unschedulable = spec.and_then(|s| s.unschedulable).unwrap_or(false);
        self.taints = spec.and_then(|s| s.taints.clone()).unwrap_or_default();
        self.node = node;
    }

    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.node.metadata.labels.as_ref()
    }

    pub fn add_pod(&mut self, pod: Arc<PodInfo>) {
        self.requested.add(&pod.requests);
        self.requested.pods += 1;
        self.non_zero_requested.add(&pod.non_zero_requests);
        for p in &pod.host_ports {
            self.used_ports.insert(p.clone());
        }
        self.pods_with_affinity += usize::from(pod.has_pod_affinity);
        self.pods_with_required_anti_affinity += usize::from(pod.has_required_anti_affinity);
        self.pods.push(pod);
    }

    /// Removes the pod with `uid`; returns it if it was here.
    pub fn remove_pod(&mut self, uid: &str) -> Option<Arc<PodInfo>> {
        let i = self.pods.iter().position(|p| p.uid == uid)?;
        let pod = self.pods.swap_remove(i);
        self.requested.sub(&pod.requests);
        self.requested.pods -= 1;
        self.non_zero_requested.sub(&pod.non_zero_requests);
        for p in &pod.host_ports {
            self.used_ports.remove(p);
        }
        self.pods_with_affinity -= usize::from(pod.has_pod_affinity);
        self.pods_with_required_anti_affinity -= usize::from(pod.has_required_anti_affinity);
        Some(pod)
    }
}

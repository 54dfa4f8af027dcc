//! The scheduler's cache: every node with the pods bound or assumed to it.
//! A pod is *assumed* on its node as soon as the scheduler picks the node,
//! before the binding is written, so the next cycle already sees its
//! requests; the watch then confirms it, or a failed binding forgets it.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::node_info::{NodeInfo, PodInfo};

#[derive(Default)]
pub struct SchedulerCache {
    pub nodes: Vec<NodeInfo>,
    index: HashMap<String, usize>,
    /// uid → (node name, pod, assumed and not yet confirmed).
    pods: HashMap<String, (String, Arc<PodInfo>, bool)>,
}

impl SchedulerCache {
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.name.as_str())
    }

    pub fn pod_uids(&self) -> impl Iterator<Item = &str> {
        self.pods.keys().map(String::as_str)
    }

    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.index.get(name).map(|i| &self.nodes[*i])
    }

    pub fn set_node(&mut self, node: Arc<Node>) {
        let name = node.metadata.name.clone().unwrap_or_default();
        if let Some(i) = self.index.get(&name) {
            self.nodes[*i].set_node(node);
            return;
        }
        let mut info = NodeInfo::new(node);
        // Pods the watch delivered before their node.
        for (node_name, pod, _) in self.pods.values() {
            if *node_name == name {
                info.add_pod(pod.clone());
            }
        }
        self.index.insert(name, self.nodes.len());
        self.nodes.push(info);
    }

    pub fn remove_node(&mut self, name: &str) {
        let Some(i) = self.index.remove(name) else { return };
        self.nodes.swap_remove(i);
        if let Some(moved) = self.nodes.get(i) {
            self.index.insert(moved.name.clone(), i);
        }
    }

    /// A pod the watch shows bound to `node` (new, changed, or confirming an
    /// assumed one).
    pub fn add_pod(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.remove_pod(&pod.uid);
        self.place(pod, node, false);
    }

    /// The scheduler picked `node` for the pod; binding is under way.
    pub fn assume(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.remove_pod(&pod.uid);
        self.place(pod, node, true);
    }

    fn place(&mut self, pod: Arc<PodInfo>, node: &str, assumed: bool) {
        if let Some(i) = self.index.get(node) {
            self.nodes[*i].add_pod(pod.clone());
        }
        self.pods.insert(pod.uid.clone(), (node.to_string(), pod, assumed));
    }

    /// Binding failed: undo the assumption (a confirmed pod stays).
    pub fn forget(&mut self, uid: &str) {
        if self.pods.get(uid).is_some_and(|(_, _, assumed)| *assumed) {
            self.remove_pod(uid);
        }
    }

    /// Removes a placed or assumed pod; returns it if it was here.
    pub fn remove_pod(&mut self, uid: &str) -> Option<Arc<PodInfo>> {
        let (node, pod, _) = self.pods.remove(uid)?;
        if let Some(i) = self.index.get(&node) {
            self.nodes[*i].remove_pod(uid);
        }
        Some(pod)
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    pub fn is_assumed(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|(_, _, a)| *a)
    }
}

//! The scheduler's plugins, one file each, and the default profile's
//! plugin set with upstream's score weights.

pub mod image_locality;
pub mod inter_pod_affinity;
pub mod node_affinity;
pub mod node_name;
pub mod node_ports;
pub mod node_resources_fit;
pub mod node_unschedulable;
pub mod pod_topology_spread;
pub mod taint_toleration;

use std::sync::Arc;

use super::framework::{FilterPlugin, ScorePlugin};
use node_resources_fit::ScoringStrategy;

/// A filter plugin by its upstream name.
pub fn filter_plugin(name: &str, strategy: ScoringStrategy) -> Option<Arc<dyn FilterPlugin>> {
    Some(match name {
        "NodeName" => Arc::new(node_name::NodeName),
        "NodeUnschedulable" => Arc::new(node_unschedulable::NodeUnschedulable),
        "TaintToleration" => Arc::new(taint_toleration::TaintToleration),
        "NodeAffinity" => Arc::new(node_affinity::NodeAffinity),
        "NodePorts" => Arc::new(node_ports::NodePorts),
        "NodeResourcesFit" => Arc::new(node_resources_fit::NodeResourcesFit { strategy }),
        "PodTopologySpread" => Arc::new(pod_topology_spread::PodTopologySpread),
        "InterPodAffinity" => Arc::new(inter_pod_affinity::InterPodAffinity),
        _ => return None,
    })
}

/// A score plugin by its upstream name.
pub fn score_plugin(name: &str, strategy: ScoringStrategy) -> Option<Arc<dyn ScorePlugin>> {
    Some(match name {
        "TaintToleration" => Arc::new(taint_toleration::TaintToleration),
        "NodeAffinity" => Arc::new(node_affinity::NodeAffinity),
        "NodeResourcesFit" => Arc::new(node_resources_fit::NodeResourcesFit { strategy }),
        "NodeResourcesBalancedAllocation" => Arc::new(node_resources_fit::BalancedAllocation),
        "ImageLocality" => Arc::new(image_locality::ImageLocality),
        "PodTopologySpread" => Arc::new(pod_topology_spread::PodTopologySpread),
        "InterPodAffinity" => Arc::new(inter_pod_affinity::InterPodAffinity),
        _ => return None,
    })
}

/// The default profile's filters, in upstream's order (cheap ones first).
pub const DEFAULT_FILTERS: &[&str] = &[
    "NodeUnschedulable",
    "NodeName",
    "TaintToleration",
    "NodeAffinity",
    "NodePorts",
    "NodeResourcesFit",
    "PodTopologySpread",
    "InterPodAffinity",
];

/// The default profile's score plugins and their weights.
pub const DEFAULT_SCORES: &[(&str, i64)] = &[
    ("TaintToleration", 3),
    ("NodeAffinity", 2),
    ("NodeResourcesFit", 1),
    ("PodTopologySpread", 2),
    ("InterPodAffinity", 2),
    ("NodeResourcesBalancedAllocation", 1),
    ("ImageLocality", 1),
];

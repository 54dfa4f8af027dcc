//! ImageLocality: nodes that already hold the pod's images score higher,
//! weighted by how widely each image is spread (so that one node holding a
//! popular image does not attract every pod).

use std::collections::HashMap;

use crate::scheduler::framework::{CycleState, ScorePlugin, Snapshot, Status, MAX_NODE_SCORE};
use crate::scheduler::node_info::{NodeInfo, PodInfo};

const MB: i64 = 1024 * 1024;
const MIN_THRESHOLD: i64 = 23 * MB;
const MAX_CONTAINER_THRESHOLD: i64 = 1000 * MB;
const STATE_KEY: &str = "PreScoreImageLocality";

/// `busybox` → `docker.io/library/busybox:latest`, as node status lists images.
pub fn normalized_image_name(image: &str) -> String {
    let (name, has_tag) = match image.rsplit_once('/') {
        Some((_, last)) => (image.to_string(), last.contains(':') || last.contains('@')),
        None => (image.to_string(), image.contains(':') || image.contains('@')),
    };
    let first = name.split('/').next().unwrap_or_default();
    let has_registry = name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut full = if has_registry {
        name
    } else if name.contains('/') {
        format!("docker.io/{name}")
    } else {
        format!("docker.io/library/{name}")
    };
    if !has_tag {
        full.push_str(":latest");
    }
    full
}

#[derive(Clone)]
struct ImageSpread {
    /// Normalized image → on how many nodes it is present.
    nodes_with: HashMap<String, usize>,
    total_nodes: usize,
    images: Vec<String>,
}

pub struct ImageLocality;

impl ScorePlugin for ImageLocality {
    fn name(&self) -> &'static str {
        "ImageLocality"
    }

    fn pre_score(&self, state: &mut CycleState, pod: &PodInfo, _nodes: &[&NodeInfo], snapshot: &Snapshot) -> Status {
        let images: Vec<String> = pod
            .pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(s.containers.iter()))
            .filter_map(|c| c.image.as_deref())
            .map(normalized_image_name)
            .collect();
        let mut nodes_with = HashMap::new();
        for image in &images {
            let n = snapshot.nodes.iter().filter(|n| n.images.contains_key(image)).count();
            nodes_with.insert(image.clone(), n);
        }
        state.write(STATE_KEY, ImageSpread { nodes_with, total_nodes: snapshot.nodes.len(), images });
        Status::success()
    }

    fn score(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> i64 {
        let Some(spread) = state.read::<ImageSpread>(STATE_KEY) else { return 0 };
        if spread.images.is_empty() || spread.total_nodes == 0 {
            return 0;
        }
        let sum: i64 = spread
            .images
            .iter()
            .filter_map(|i| node.images.get(i).map(|size| (i, *size)))
            .map(|(i, size)| {
                let with = spread.nodes_with.get(i).copied().unwrap_or(0) as f64;
                (size as f64 * with / spread.total_nodes as f64) as i64
            })
            .sum();
        let max = MAX_CONTAINER_THRESHOLD * spread.images.len() as i64;
        let clamped = sum.clamp(MIN_THRESHOLD, max);
        MAX_NODE_SCORE * (clamped - MIN_THRESHOLD) / (max - MIN_THRESHOLD)
    }
}

#[cfg(test)]
mod tests {
    use super::normalized_image_name;

    #[test]
    fn image_names_normalize_as_the_runtime_reports_them() {
        assert_eq!(normalized_image_name("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(normalized_image_name("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(normalized_image_name("me/app"), "docker.io/me/app:latest");
        assert_eq!(normalized_image_name("registry.local:5000/app:v1"), "registry.local:5000/app:v1");
    }
}

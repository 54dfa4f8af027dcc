//! What feeds the Node authorizer's graph (upstream's graph populator):
//! three watch-fed caches of the API server, each holding the small
//! projection `node_graph` makes of its objects (pods, persistent volume
//! claims, persistent volumes), never the whole objects.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::node_graph::{parse_claim_edges, parse_pod_edges, parse_volume_edges, NodeGraph, PodEdges};
use crate::apiserver::cache::PrefixCache;
use crate::apiserver::status::ApiError;
use crate::apiserver::storage::Storage;

/// The caches the Node authorizer reads its graph from.
pub struct NodeGraphCaches {
    /// Pods as the Node authorizer sees them: bound node and references.
    pub pods: Arc<PrefixCache<PodEdges>>,
    /// PersistentVolumeClaims as the Node authorizer sees them: bound volume.
    pub claims: Arc<PrefixCache>,
    /// PersistentVolumes as the Node authorizer sees them: the node of a local-path volume.
    pub volumes: Arc<PrefixCache>,
}

impl Default for NodeGraphCaches {
    fn default() -> Self {
        NodeGraphCaches {
            pods: PrefixCache::projected("/registry/pods/", parse_pod_edges),
            claims: PrefixCache::projected("/registry/persistentvolumeclaims/", parse_claim_edges),
            volumes: PrefixCache::projected("/registry/persistentvolumes/", parse_volume_edges),
        }
    }
}

impl NodeGraphCaches {
    /// The graph over the caches as they are now.
    pub fn graph(&self) -> NodeGraph<'_> {
        NodeGraph { pods: &self.pods, claims: &self.claims, volumes: &self.volumes }
    }

    /// Receivers told of every change applied to any of the caches from now on.
    pub fn subscribe(&self) -> [watch::Receiver<u64>; 3] {
        [self.pods.subscribe(), self.claims.subscribe(), self.volumes.subscribe()]
    }

    /// Loads every cache and starts following them.
    pub async fn start(&self, storage: &Storage) -> Result<Vec<JoinHandle<()>>, ApiError> {
        Ok(vec![
            self.claims.start(storage.clone()).await?,
            self.volumes.start(storage.clone()).await?,
            self.pods.start(storage.clone()).await?,
        ])
    }

    /// Every cache has loaded once.
    pub fn synced(&self) -> bool {
        self.claims.has_synced() && self.volumes.has_synced() && self.pods.has_synced()
    }
}

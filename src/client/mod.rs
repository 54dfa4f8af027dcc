//! How components other than the API server reach the API: each takes a
//! `kube::Client`, whatever its transport (HTTPS, `https`, for an agent; in
//! the server's process any `tower::Service`, such as the API server's own
//! router that `apiserver::in_process` wraps, so every request goes
//! through the same authentication, authorization, admission and
//! validation as kubectl's); the shared informers (one watch and one
//! indexed cache per kind for the process); the recorder of Events; leader
//! election; the join protocol's wire contract (`node_join`).

pub mod cache_sync;
pub mod events;
pub mod https;
pub mod indexer;
pub mod informer;
pub mod informer_factory;
pub mod labels;
pub mod leader;
pub mod node_join;
pub mod pod_volumes;
pub mod predicates;
pub mod scheduling;
pub mod transform;
pub mod typed_watcher;

use std::sync::Arc;

/// Builds the client a controller (named as upstream names it, e.g.
/// `replicaset-controller`) acts through.
pub type ClientFor = Arc<dyn Fn(&str) -> kube::Client + Send + Sync>;

/// The agent never reads managedFields; dropping them from its cached pods
/// keeps each a fraction of its size (the shared informers' `transform`
/// drops them too).
pub fn forget_managed_fields<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

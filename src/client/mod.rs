//! How components other than the API server reach the API: a `kube::Client`
//! whose transport is the API server's own router, in process (no TCP, no
//! TLS), so every request goes through the same authentication,
//! authorization, admission and validation as kubectl's; the shared
//! informers (one watch and one indexed cache per kind for the process);
//! the recorder of Events; leader election.

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

use std::sync::Arc;

use crate::apiserver::auth::User;
use crate::apiserver::{router, Api};

/// A client that acts as `user` against the in-process API server.
pub fn in_process(api: Arc<Api>, user: User) -> kube::Client {
    let service = router(api).layer(axum::Extension(user)).into_service::<kube::client::Body>();
    kube::Client::new(service, "default")
}

/// `in_process` for the shared informers, whose caches drop managedFields
/// (`transform`): the API server leaves them out of what it lists and
/// watches for this client, instead of sending what is decoded only to be
/// dropped.
pub fn in_process_for_informers(api: Arc<Api>, user: User) -> kube::Client {
    let service = router(api)
        .layer(axum::Extension(user))
        .layer(axum::Extension(crate::apiserver::call::OmitManagedFields))
        .into_service::<kube::client::Body>();
    kube::Client::new(service, "default")
}

/// The identity ferrok's controller manager uses in process: the shared
/// informers and its leader election, bound by the
/// `system:kube-controller-manager` role (list and watch of everything,
/// its own Lease). Each controller acts under its own service account
/// (`controller_service_account`), so RBAC constrains what it writes.
pub fn controller_manager() -> User {
    User { name: "system:kube-controller-manager".into(), groups: vec!["system:authenticated".into()] }
}

/// The identity a controller acts as when it runs under its own service
/// account in kube-system (upstream's `--use-service-account-credentials`).
pub fn controller_service_account(name: &str) -> User {
    User {
        name: format!("system:serviceaccount:kube-system:{name}"),
        groups: vec![
            "system:serviceaccounts".into(),
            "system:serviceaccounts:kube-system".into(),
            "system:authenticated".into(),
        ],
    }
}

/// Builds the client a controller (named as upstream names it, e.g.
/// `replicaset-controller`) acts through.
pub type ClientFor = Arc<dyn Fn(&str) -> kube::Client + Send + Sync>;

/// The identity ferrok's scheduler uses in process, bound by the
/// `system:kube-scheduler` and `system:volume-scheduler` roles.
pub fn scheduler() -> User {
    User { name: "system:kube-scheduler".into(), groups: vec!["system:authenticated".into()] }
}

/// The identity the server's own node role uses in process: the node's
/// kubelet user (`system:node:<name>` in `system:nodes`), exactly what an
/// agent's client certificate names. The Node authorizer and the
/// NodeRestriction admission plugin confine it to its own Node, Lease and
/// pods and to the objects those pods reference; the `system:ferrok:node`
/// ClusterRole adds the cluster-wide reads of its service proxy, DNS and
/// network policy parts.
pub fn node(name: &str) -> User {
    User { name: format!("system:node:{name}"), groups: vec!["system:nodes".into(), "system:authenticated".into()] }
}

/// The identity of the server itself where it does what no component's
/// role allows, as k3s' supervisor does with its admin credentials: the
/// labels of its own Node that a kubelet may not set
/// (`node-role.kubernetes.io/control-plane`, restricted `--node-label`s).
pub fn supervisor() -> User {
    User {
        name: "system:ferrok:supervisor".into(),
        groups: vec!["system:masters".into(), "system:authenticated".into()],
    }
}

/// The agent never reads managedFields; dropping them from its cached pods
/// keeps each a fraction of its size (the shared informers' `transform`
/// drops them too).
pub fn forget_managed_fields<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

//! The control loops that run inside `ferrok server`, each talking to the
//! API only through an in-process `kube::Client` and driven by kube-runtime
//! (watch-fed caches, a deduplicating work queue, retries with back-off).

pub mod garbage_collector;
pub mod namespace;
pub mod root_ca;
pub mod serviceaccount;

use std::sync::Arc;

/// What a reconcile can fail with; the work queue retries it.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Discovery(String),
}

/// Starts every controller; they run until the process stops.
pub fn start(client: kube::Client, server_ca_pem: String) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        tokio::spawn(namespace::run(client.clone())),
        tokio::spawn(garbage_collector::run(client.clone())),
        tokio::spawn(serviceaccount::run(client.clone())),
        tokio::spawn(root_ca::run(client, Arc::new(server_ca_pem))),
    ]
}

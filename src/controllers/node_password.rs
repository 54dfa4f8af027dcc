//! Node passwords follow their Nodes: when a Node is deleted, its
//! password Secret (`kube-system/<node>.node-password.ferrok`, written when
//! the node first joined) goes too, so that a new machine may take the
//! name, as k3s' node controller does. Passwords whose Node went while no
//! server watched are swept when the watch starts, once they are older
//! than a join takes (a password is recorded before its Node registers).

use std::collections::HashSet;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::watcher::{self, Event};

use crate::pki::node_password::{secret_name, NODE_LABEL};

/// A password with no Node for this long belongs to a node that is gone.
const JOIN_GRACE: Duration = Duration::from_secs(600);

/// Runs until aborted; `client` may list and delete Secrets in kube-system.
pub async fn run(client: kube::Client) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let mut events = crate::client::typed_watcher::watch(Api::<Node>::all(client), watcher::Config::default());
    let mut listed: HashSet<String> = HashSet::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Delete(node)) => {
                if let Some(name) = node.metadata.name {
                    delete(&secrets, &name).await;
                }
            }
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(node)) => listed.extend(node.metadata.name),
            Ok(Event::InitDone) => sweep(&secrets, &listed).await,
            Ok(Event::Apply(_)) => {}
            Err(e) => tracing::debug!(error = %e, "node watch error; the watcher retries"),
        }
    }
}

async fn delete(secrets: &Api<Secret>, node: &str) {
    match secrets.delete(&secret_name(node), &DeleteParams::default()).await {
        Ok(_) => tracing::info!(node = %node, "node deleted; its password removed"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => tracing::warn!(node = %node, error = %e, "cannot remove the deleted node's password"),
    }
}

/// Removes the passwords of nodes that are not among `nodes`.
async fn sweep(secrets: &Api<Secret>, nodes: &HashSet<String>) {
    let list = match secrets.list(&ListParams::default().labels(NODE_LABEL)).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list node passwords");
            return;
        }
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    for s in list.items {
        let Some(node) = s.metadata.labels.as_ref().and_then(|l| l.get(NODE_LABEL)) else { continue };
        let old = s
            .metadata
            .creation_timestamp
            .as_ref()
            .is_some_and(|t| now.duration_since(t.0).as_secs() > JOIN_GRACE.as_secs() as i64);
        if old && !nodes.contains(node) && s.metadata.name.as_deref() == Some(secret_name(node).as_str()) {
            delete(secrets, node).await;
        }
    }
}

//! ClusterDnsController: the `kube-dns` Service has no selector; its one
//! EndpointSlice (`kube-system/kube-dns`, managed by `cluster-dns.ferrok.io`)
//! lists every node's own cluster DNS, the node's pod-network gateway (the
//! first address of its podCIDR), with the node's name, ready while the
//! node is. Driven by a watch on Nodes; it acts as the
//! endpointslice-controller (reads nodes and services, writes slices).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::reflector::Store;

use super::endpointslice::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL};
use super::informers::wait_synced;
use super::ControllerError;
use crate::net::NthAddr;

pub const NAMESPACE: &str = "kube-system";
pub const SERVICE: &str = "kube-dns";
pub const MANAGED_BY: &str = "cluster-dns.ferrok.io";
/// How long a failed write waits before it is tried again.
const RETRY: Duration = Duration::from_secs(2);

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// One endpoint per node with a podCIDR: its gateway address, by node name.
pub fn desired_endpoints(nodes: &[Arc<Node>]) -> Vec<Endpoint> {
    let mut by_name: BTreeMap<String, Endpoint> = BTreeMap::new();
    for node in nodes {
        let Some(name) = node.metadata.name.clone() else { continue };
        let Some(cidr) =
            node.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()).and_then(|c| crate::net::parse_pod_cidr(c).ok())
        else {
            continue;
        };
        let ready = node_ready(node) && node.metadata.deletion_timestamp.is_none();
        by_name.insert(
            name.clone(),
            Endpoint {
                addresses: vec![cidr.nth(1).to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(ready),
                    serving: Some(ready),
                    terminating: Some(false),
                }),
                node_name: Some(name),
                ..Default::default()
            },
        );
    }
    by_name.into_values().collect()
}

fn ports() -> Vec<EndpointPort> {
    [("dns", "UDP"), ("dns-tcp", "TCP")]
        .into_iter()
        .map(|(name, protocol)| EndpointPort {
            name: Some(name.into()),
            port: Some(53),
            protocol: Some(protocol.into()),
            app_protocol: None,
        })
        .collect()
}

async fn reconcile(client: &kube::Client, nodes: &Store<Node>) -> Result<(), ControllerError> {
    wait_synced(nodes).await?;
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    // No Service (an older server, or deleted by hand): nothing to list.
    let Some(svc) = services.get_opt(SERVICE).await? else { return Ok(()) };
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NAMESPACE);
    let labels: BTreeMap<String, String> =
        [(SERVICE_NAME_LABEL.to_string(), SERVICE.to_string()), (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())]
            .into_iter()
            .collect();
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: SERVICE.into(),
        uid: svc.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let endpoints = desired_endpoints(&nodes.state());
    let want_ports = Some(ports());
    match slices.get_opt(SERVICE).await? {
        Some(current) => {
            let same = current.endpoints == endpoints
                && current.ports == want_ports
                && current.metadata.labels.as_ref() == Some(&labels)
                && current.metadata.owner_references.as_deref() == Some(std::slice::from_ref(&owner));
            if same {
                return Ok(());
            }
            let mut updated = current;
            updated.endpoints = endpoints;
            updated.ports = want_ports;
            updated.metadata.labels = Some(labels);
            updated.metadata.owner_references = Some(vec![owner]);
            slices.replace(SERVICE, &PostParams::default(), &updated).await?;
        }
        None => {
            let slice = EndpointSlice {
                metadata: ObjectMeta {
                    name: Some(SERVICE.into()),
                    namespace: Some(NAMESPACE.into()),
                    labels: Some(labels),
                    owner_references: Some(vec![owner]),
                    ..Default::default()
                },
                address_type: "IPv4".into(),
                endpoints,
                ports: want_ports,
            };
            slices.create(&PostParams::default(), &slice).await?;
        }
    }
    tracing::debug!("kube-dns EndpointSlice updated");
    Ok(())
}

/// `client` is the controller's own; `informers` the controller manager's,
/// through which it watches Nodes.
pub async fn run(client: kube::Client, informers: crate::client::informer_factory::SharedInformerFactory) {
    let (nodes, events) = informers
        .informer::<Node>()
        .subscribe()
        .skip_updates(crate::client::predicates::node_heartbeat_only)
        .into_parts();
    // A burst of node changes is one reconcile.
    let mut events = events.ready_chunks(256).boxed();
    let mut retry_at: Option<tokio::time::Instant> = None;
    loop {
        let woke = match retry_at {
            Some(at) => tokio::select! {
                e = events.next() => e.is_some(),
                _ = tokio::time::sleep_until(at) => true,
            },
            None => events.next().await.is_some(),
        };
        if !woke {
            return;
        }
        match reconcile(&client, &nodes).await {
            Ok(()) => retry_at = None,
            Err(e) => {
                tracing::warn!(error = %e, "cluster DNS endpoints: reconcile failed; retrying");
                retry_at = Some(tokio::time::Instant::now() + RETRY);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_node_with_a_pod_cidr_is_listed_at_its_gateway() {
        let node = |name: &str, cidr: Option<&str>, ready: &str| {
            Arc::new(
                serde_json::from_value::<Node>(json!({"metadata": {"name": name}, "spec": {"podCIDR": cidr},
                "status": {"conditions": [{"type": "Ready", "status": ready}]}}))
                .unwrap(),
            )
        };
        let eps = desired_endpoints(&[
            node("b", Some("10.42.1.0/24"), "False"),
            node("a", Some("10.42.0.0/24"), "True"),
            node("c", None, "True"),
        ]);
        assert_eq!(eps.len(), 2);
        assert_eq!(eps[0].addresses, ["10.42.0.1"]);
        assert_eq!(eps[0].node_name.as_deref(), Some("a"));
        assert_eq!(eps[0].conditions.as_ref().unwrap().ready, Some(true));
        assert_eq!(eps[1].addresses, ["10.42.1.1"]);
        assert_eq!(eps[1].conditions.as_ref().unwrap().ready, Some(false));
    }
}

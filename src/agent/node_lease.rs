//! The node's heartbeat: its Lease in `kube-node-lease`, renewed every
//! quarter of the lease duration (10 s for the default 40 s), as upstream's
//! nodelease controller. The node lifecycle controller reads it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

const NAMESPACE: &str = "kube-node-lease";

/// Renews the Lease until the task is aborted. `node_uid` makes the Node
/// the Lease's owner, so deleting the Node deletes its Lease.
pub async fn run(client: kube::Client, node_name: String, node_uid: String, duration_seconds: i32) {
    let api: Api<Lease> = Api::namespaced(client, NAMESPACE);
    let interval = Duration::from_secs((duration_seconds.max(4) / 4) as u64);
    let mut failures = 0u32;
    // The Lease as last written: renewing it is one PUT, no GET.
    let mut last: Option<Lease> = None;
    loop {
        let delay = match renew(&api, &mut last, &node_name, &node_uid, duration_seconds).await {
            Ok(()) => {
                failures = 0;
                interval
            }
            Err(e) => {
                failures += 1;
                last = None;
                // Upstream retries at 200 ms doubling up to 7 s.
                tracing::warn!(error = %e, node = %node_name, "cannot renew the node lease");
                crate::backoff::exponential(Duration::from_millis(200), Duration::from_secs(7), failures)
            }
        };
        tokio::time::sleep(delay).await;
    }
}

async fn renew(
    api: &Api<Lease>,
    last: &mut Option<Lease>,
    node: &str,
    node_uid: &str,
    duration_seconds: i32,
) -> Result<(), kube::Error> {
    let now = MicroTime(Timestamp::now());
    let current = match last.take() {
        Some(lease) => Some(lease),
        None => api.get_opt(node).await?,
    };
    match current {
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(node.to_string());
            spec.lease_duration_seconds = Some(duration_seconds);
            spec.renew_time = Some(now);
            if lease.metadata.owner_references.as_ref().is_none_or(|o| o.is_empty()) && !node_uid.is_empty() {
                lease.metadata.owner_references = Some(vec![owner(node, node_uid)]);
            }
            *last = Some(api.replace(node, &PostParams::default(), &lease).await?);
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(node.to_string()),
                    namespace: Some(NAMESPACE.into()),
                    owner_references: (!node_uid.is_empty()).then(|| vec![owner(node, node_uid)]),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(node.to_string()),
                    lease_duration_seconds: Some(duration_seconds),
                    renew_time: Some(now),
                    ..Default::default()
                }),
            };
            *last = Some(api.create(&PostParams::default(), &lease).await?);
        }
    }
    Ok(())
}

fn owner(node: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.to_string(),
        uid: uid.to_string(),
        ..Default::default()
    }
}

//! ServiceCIDRController (service-cidr), as upstream v1.33's
//! pkg/controller/servicecidrs (MultiCIDRServiceAllocator, GA and on by
//! default), acting as `service-cidrs-controller`: every ServiceCIDR (the
//! default `kubernetes` one the API server writes from `--service-cidr`,
//! and any a user adds for more cluster IPs) carries the finalizer
//! `networking.k8s.io/service-cidr-finalizer` and the condition `Ready`
//! True. A ServiceCIDR being deleted keeps its finalizer while an
//! IPAddress of the allocator lies in it and in no other ServiceCIDR
//! (`Ready` False, reason `Terminating`, upstream's message); once none
//! would be orphaned, and 10 s after the deletion began (so that no API
//! server still allocates from it), the finalizer goes.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::informers;
use super::ControllerError;
use crate::client::events::{EventRecorder, EventType};
use crate::client::informer_factory::SharedInformerFactory;
use crate::net::Ipv4Net;

/// The service account it acts as.
pub const NAME: &str = "service-cidrs-controller";
/// What keeps a ServiceCIDR whose addresses are still in use.
pub const FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";
/// How long a ServiceCIDR being deleted is kept after its last address went.
const DELETION_GRACE_PERIOD: Duration = Duration::from_secs(10);
const MANAGED_BY_LABEL: &str = "ipaddress.kubernetes.io/managed-by";
const ALLOCATOR: &str = "ipallocator.k8s.io";

struct Context {
    client: kube::Client,
    cidrs: Store<ServiceCIDR>,
    addresses: Store<IPAddress>,
    recorder: EventRecorder,
}

fn deleting(cidr: &ServiceCIDR) -> bool {
    cidr.metadata.deletion_timestamp.is_some()
}

/// Runs until aborted.
pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let cidr_informer = informers.informer::<ServiceCIDR>();
    let (cidrs, own_requests) = cidr_informer.subscribe().trigger_self();
    // Any address or ServiceCIDR that comes or goes may unblock a deletion.
    let being_deleted = {
        let cidrs = cidrs.clone();
        move || cidrs.state().iter().filter(|c| deleting(c)).map(|c| ObjectRef::from_obj(&**c)).collect::<Vec<_>>()
    };
    let (_, others) = cidr_informer.subscribe().trigger_with({
        let being_deleted = being_deleted.clone();
        move |_: &ServiceCIDR| being_deleted()
    });
    let (addresses, address_requests) =
        informers.informer::<IPAddress>().subscribe().trigger_with(move |_: &IPAddress| being_deleted());
    let ctx = Arc::new(Context {
        recorder: EventRecorder::new(client.clone(), "service-cidr-controller"),
        client,
        cidrs: cidrs.clone(),
        addresses,
    });
    informers::run("service-cidr", cidrs, vec![own_requests, others, address_requests], reconcile, ctx).await;
}

/// The IPv4 prefixes of a ServiceCIDR, any length (ferrok's Services are IPv4 only).
fn ranges(cidr: &ServiceCIDR) -> Vec<Ipv4Net> {
    let cidrs = cidr.spec.iter().flat_map(|s| s.cidrs.iter().flatten());
    cidrs.filter_map(|c| crate::net::parse_v4(c, 0..=32).ok()).collect()
}

/// Whether deleting `cidr` orphans no address of the allocator (upstream's canDeleteCIDR).
fn can_delete(cidr: &ServiceCIDR, all: &[Arc<ServiceCIDR>], addresses: &[Arc<IPAddress>]) -> bool {
    let name = cidr.metadata.name.as_deref();
    let others: Vec<Ipv4Net> =
        all.iter().filter(|c| c.metadata.name.as_deref() != name).flat_map(|c| ranges(c)).collect();
    let own = ranges(cidr);
    // Wholly inside another ServiceCIDR: every address stays covered.
    if own.iter().all(|r| others.iter().any(|o| o.contains(r))) {
        return true;
    }
    !addresses.iter().any(|a| {
        let managed = a.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY_LABEL)).is_some_and(|v| v == ALLOCATOR);
        let Some(ip) = a.metadata.name.as_deref().and_then(|n| n.parse::<Ipv4Addr>().ok()) else { return false };
        managed && own.iter().any(|r| r.contains(&ip)) && !others.iter().any(|o| o.contains(&ip))
    })
}

fn ready_condition(cidr: &ServiceCIDR) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    cidr.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")
}

async fn reconcile(cidr: Arc<ServiceCIDR>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    informers::wait_synced(&ctx.addresses).await?;
    let name = cidr.metadata.name.clone().unwrap_or_default();
    let api: Api<ServiceCIDR> = Api::all(ctx.client.clone());
    let finalizers = cidr.metadata.finalizers.clone().unwrap_or_default();
    if let Some(since) = &cidr.metadata.deletion_timestamp {
        if !can_delete(&cidr, &ctx.cidrs.state(), &ctx.addresses.state()) {
            let ready = ready_condition(&cidr);
            if !ready.is_some_and(|c| c.status == "False" && c.reason == "Terminating") {
                let message = "There are still IPAddresses referencing the ServiceCIDR, please remove them or create a new ServiceCIDR";
                set_ready(&api, &name, "False", "Terminating", message).await?;
            }
            return Ok(Action::await_change());
        }
        let elapsed = Timestamp::now().as_millisecond() - since.0.as_millisecond();
        let left = i64::try_from(DELETION_GRACE_PERIOD.as_millis()).unwrap_or(10_000) - elapsed;
        if left > 0 {
            return Ok(Action::requeue(Duration::from_millis(u64::try_from(left).unwrap_or(0))));
        }
        if finalizers.iter().any(|f| f == FINALIZER) {
            let kept: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
            let patch = json!({"metadata": {"resourceVersion": cidr.metadata.resource_version, "finalizers": kept}});
            patch_ignoring_gone(api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await)?;
            tracing::info!(servicecidr = %name, "ServiceCIDR released");
        }
        return Ok(Action::await_change());
    }
    if !finalizers.iter().any(|f| f == FINALIZER) {
        let mut with = finalizers.clone();
        with.push(FINALIZER.to_string());
        let patch = json!({"metadata": {"resourceVersion": cidr.metadata.resource_version, "finalizers": with}});
        patch_ignoring_gone(api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await)?;
    }
    if !ready_condition(&cidr).is_some_and(|c| c.status == "True") {
        if let Err(e) = set_ready(&api, &name, "True", "", "Kubernetes Service CIDR is ready").await {
            let message = "The ServiceCIDR Status can not be set to Ready=True";
            ctx.recorder.publish(&*cidr, EventType::Warning, "KubernetesServiceCIDRError", message);
            return Err(e.into());
        }
    }
    Ok(Action::await_change())
}

async fn set_ready(
    api: &Api<ServiceCIDR>,
    name: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let patch = json!({"status": {"conditions": [{
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": Timestamp::now().to_string(),
    }]}});
    patch_ignoring_gone(api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await)
}

fn patch_ignoring_gone<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(name: &str, range: &str) -> Arc<ServiceCIDR> {
        Arc::new(serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"cidrs": [range]}})).unwrap())
    }

    fn address(ip: &str) -> Arc<IPAddress> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": ip, "labels": {MANAGED_BY_LABEL: ALLOCATOR}},
                "spec": {"parentRef": {"resource": "services", "namespace": "default", "name": "web"}},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_cidr_goes_only_when_no_address_would_be_orphaned() {
        let default = cidr("kubernetes", "10.43.0.0/16");
        let extra = cidr("extra", "10.44.0.0/24");
        let inner = cidr("inner", "10.43.1.0/24");
        let all = vec![default.clone(), extra.clone(), inner.clone()];
        assert!(!can_delete(&extra, &all, &[address("10.44.0.5")]));
        assert!(can_delete(&extra, &all, &[address("10.43.0.5")]));
        // Inside another ServiceCIDR: its addresses stay covered.
        assert!(can_delete(&inner, &all, &[address("10.43.1.5")]));
    }
}

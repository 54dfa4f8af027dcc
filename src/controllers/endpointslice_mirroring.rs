//! EndpointSliceMirroringController (endpointslice-mirroring), as upstream's
//! pkg/controller/endpointslicemirroring, acting as
//! `endpointslicemirroring-controller`: the Endpoints a user writes for a
//! Service without a selector are mirrored into EndpointSlices, so that
//! everything reading slices (the service proxy, the cluster DNS) sees
//! them. Each slice is controlled by its Endpoints, labelled
//! `kubernetes.io/service-name` and
//! `endpointslice.kubernetes.io/managed-by: endpointslicemirroring-controller.k8s.io`,
//! and carries the Endpoints' other labels and annotations (but the
//! last-change-trigger-time and kubectl's last-applied-configuration).
//!
//! As upstream: the subsets are repacked first (subsets with the same
//! ports merged, an address both ready and not ready counted ready); each
//! distinct set of ports and address family (IPv4, IPv6, from each
//! address) gets one slice; at most 1000 addresses of a subset are
//! mirrored, and an address that is not an IP is skipped, each reported
//! on the Endpoints with a `Warning` Event (`TooManyAddressesToMirror`,
//! `InvalidIPAddress`). Endpoints labelled
//! `endpointslice.kubernetes.io/skip-mirror: "true"`, or carrying the old
//! leader-election annotation, are not mirrored, nor are those of a Service
//! with a selector or of no Service: their mirrored slices are deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset, Endpoints, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::controller_utils::controller_ref;
use super::endpointslice::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL};
use super::informers;
use super::ControllerError;
use crate::client::events::{EventRecorder, EventType};
use crate::client::informer_factory::SharedInformerFactory;

/// The service account it acts as.
pub const NAME: &str = "endpointslicemirroring-controller";
/// The managed-by value of the slices it writes.
pub const MANAGED_BY: &str = "endpointslicemirroring-controller.k8s.io";
/// Endpoints with this label set to "true" are not mirrored.
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";
/// upstream's `--mirroring-max-endpoints-per-subset` default.
pub const MAX_ENDPOINTS_PER_SUBSET: usize = 1000;
const LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";
const LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

struct Context {
    client: kube::Client,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    recorder: EventRecorder,
}

/// Runs until aborted.
pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let managed = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let slice_informer = informers.informer_with::<EndpointSlice>(managed);
    let (endpoints, endpoints_requests) = informers.informer::<Endpoints>().subscribe().trigger_self();
    // A Service matters when it has no selector, or lost it (its slices go).
    let mirrored = slice_informer.store();
    let (services, service_requests) =
        informers.informer::<Service>().subscribe().trigger_with(move |svc: &Service| {
            let (ns, name) = (svc.metadata.namespace.as_deref().unwrap_or_default(), svc.metadata.name.as_deref());
            let name = name.unwrap_or_default();
            let wanted = !has_selector(svc) || !mirrored_slices(&mirrored, ns, name).is_empty();
            wanted.then(|| ObjectRef::<Endpoints>::new(name).within(ns))
        });
    let (slices, slice_requests) = slice_informer.subscribe().trigger_with(|slice: &EndpointSlice| {
        let ns = slice.metadata.namespace.as_deref().unwrap_or_default();
        let name = slice.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)).filter(|n| !n.is_empty());
        name.map(|n| ObjectRef::<Endpoints>::new(n).within(ns))
    });
    let ctx = Arc::new(Context {
        recorder: EventRecorder::new(client.clone(), "endpointslice-mirroring-controller"),
        client,
        services,
        slices,
    });
    informers::run(
        "endpoint_slice_mirroring",
        endpoints,
        vec![endpoints_requests, service_requests, slice_requests],
        reconcile,
        ctx,
    )
    .await;
}

fn has_selector(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.selector.as_ref()).is_some_and(|s| !s.is_empty())
}

/// The slices this controller mirrored for `namespace/name`.
fn mirrored_slices(slices: &Store<EndpointSlice>, namespace: &str, name: &str) -> Vec<Arc<EndpointSlice>> {
    slices.state_filter(|s| {
        s.metadata.namespace.as_deref() == Some(namespace)
            && s.metadata.labels.as_ref().is_some_and(|l| {
                l.get(SERVICE_NAME_LABEL).map(String::as_str) == Some(name)
                    && l.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
            })
    })
}

/// Whether the Endpoints are to be mirrored at all (upstream's shouldMirror).
fn should_mirror(ep: &Endpoints) -> bool {
    let skip = ep.metadata.labels.as_ref().and_then(|l| l.get(SKIP_MIRROR_LABEL)).is_some_and(|v| v == "true");
    let leader = ep.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(LEADER_ANNOTATION));
    !skip && !leader
}

async fn reconcile(ep: Arc<Endpoints>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    informers::wait_synced(&ctx.services).await?;
    informers::wait_synced(&ctx.slices).await?;
    let (ns, name) = (ep.metadata.namespace.clone().unwrap_or_default(), ep.metadata.name.clone().unwrap_or_default());
    let existing = mirrored_slices(&ctx.slices, &ns, &name);
    let service = ctx.services.get(&ObjectRef::new(&name).within(&ns));
    let mirror = should_mirror(&ep) && service.as_ref().is_some_and(|s| !has_selector(s));
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
    if !mirror {
        for slice in existing {
            delete(&api, &slice).await?;
        }
        return Ok(Action::await_change());
    }
    let desired = desired_state(&ep);
    if desired.invalid > 0 {
        let msg = format!("Skipped {} invalid IP addresses when mirroring to EndpointSlices", desired.invalid);
        ctx.recorder.publish(&*ep, EventType::Warning, "InvalidIPAddress", &msg);
    }
    if desired.skipped > desired.invalid {
        let msg = format!(
            "A max of {MAX_ENDPOINTS_PER_SUBSET} addresses can be mirrored to EndpointSlices per Endpoints subset. {} addresses were skipped",
            desired.skipped
        );
        ctx.recorder.publish(&*ep, EventType::Warning, "TooManyAddressesToMirror", &msg);
    }
    let plan = plan(&ep, desired.groups, &existing);
    match apply(&api, &ep, plan).await {
        Ok(()) => Ok(Action::await_change()),
        // The cache was behind a write of ours: look again shortly.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Action::requeue(Duration::from_millis(500))),
        Err(e) => Err(e.into()),
    }
}

/// One group of mirrored endpoints: an address family and a set of ports.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct GroupKey {
    address_type: &'static str,
    /// (name, port, protocol, appProtocol), sorted.
    ports: Vec<(String, i32, String, String)>,
}

fn port_tuple(p: &EndpointPort) -> (String, i32, String, String) {
    (
        p.name.clone().unwrap_or_default(),
        p.port.unwrap_or_default(),
        p.protocol.clone().unwrap_or_else(|| "TCP".into()),
        p.app_protocol.clone().unwrap_or_default(),
    )
}

fn group_key(address_type: &'static str, ports: &[EndpointPort]) -> GroupKey {
    let mut ports: Vec<_> = ports.iter().map(port_tuple).collect();
    ports.sort();
    GroupKey { address_type, ports }
}

/// What the Endpoints ask for.
struct Desired {
    /// The ports and endpoints of each group, endpoints by address.
    groups: BTreeMap<GroupKey, (Vec<EndpointPort>, BTreeMap<String, Endpoint>)>,
    /// Addresses that are not IPs.
    invalid: usize,
    /// Addresses left out: not IPs, or beyond the limit.
    skipped: usize,
}

/// An address as upstream's ParseIPSloppy reads it (leading zeros of an
/// IPv4 part allowed), in its canonical form, and its family.
fn parse_ip(text: &str) -> Option<(String, &'static str)> {
    let ip = text.parse::<IpAddr>().ok().or_else(|| {
        let parts: Vec<u8> = text.split('.').map(|p| p.parse::<u8>().ok()).collect::<Option<_>>()?;
        let octets: [u8; 4] = parts.try_into().ok()?;
        Some(IpAddr::from(octets))
    })?;
    Some(match ip {
        IpAddr::V4(v4) => (v4.to_string(), "IPv4"),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => (v4.to_string(), "IPv4"),
            None => (v6.to_string(), "IPv6"),
        },
    })
}

/// Upstream's RepackSubsets: one subset per distinct set of ports, each
/// address once (ready when it is ready in any subset).
fn repack(subsets: &[EndpointSubset]) -> Vec<EndpointSubset> {
    let mut by_ports: BTreeMap<
        Vec<(String, i32, String, String)>,
        (Vec<k8s_openapi::api::core::v1::EndpointPort>, BTreeMap<String, (EndpointAddress, bool)>),
    > = BTreeMap::new();
    for subset in subsets {
        let ports = subset.ports.clone().unwrap_or_default();
        let mut key: Vec<_> = ports
            .iter()
            .map(|p| {
                (
                    p.name.clone().unwrap_or_default(),
                    p.port,
                    p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    p.app_protocol.clone().unwrap_or_default(),
                )
            })
            .collect();
        key.sort();
        let entry = by_ports.entry(key).or_insert_with(|| (ports, BTreeMap::new()));
        let all = subset.addresses.iter().flatten().map(|a| (a, true));
        let not_ready = subset.not_ready_addresses.iter().flatten().map(|a| (a, false));
        for (address, ready) in all.chain(not_ready) {
            // The same address however it is written (`010.0.0.2`, `10.0.0.2`).
            let key = parse_ip(&address.ip).map(|(ip, _)| ip).unwrap_or_else(|| address.ip.clone());
            let slot = entry.1.entry(key).or_insert_with(|| (address.clone(), ready));
            if ready && !slot.1 {
                *slot = (address.clone(), true);
            }
        }
    }
    by_ports
        .into_values()
        .map(|(ports, addresses)| {
            let (ready, not_ready): (Vec<_>, Vec<_>) = addresses.into_values().partition(|(_, r)| *r);
            let strip = |v: Vec<(EndpointAddress, bool)>| {
                let v: Vec<EndpointAddress> = v.into_iter().map(|(a, _)| a).collect();
                (!v.is_empty()).then_some(v)
            };
            EndpointSubset {
                addresses: strip(ready),
                not_ready_addresses: strip(not_ready),
                ports: (!ports.is_empty()).then_some(ports),
            }
        })
        .collect()
}

fn endpoint_ports(subset: &EndpointSubset) -> Vec<EndpointPort> {
    subset
        .ports
        .iter()
        .flatten()
        .map(|p| EndpointPort {
            name: Some(p.name.clone().unwrap_or_default()),
            port: Some(p.port),
            protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
            app_protocol: p.app_protocol.clone(),
        })
        .collect()
}

fn desired_state(ep: &Endpoints) -> Desired {
    let mut desired = Desired { groups: BTreeMap::new(), invalid: 0, skipped: 0 };
    for subset in repack(ep.subsets.as_deref().unwrap_or_default()) {
        let ports = endpoint_ports(&subset);
        // Both families' groups exist for the subset's ports, as upstream's.
        for family in ["IPv4", "IPv6"] {
            desired.groups.entry(group_key(family, &ports)).or_insert_with(|| (ports.clone(), BTreeMap::new()));
        }
        let ready = subset.addresses.iter().flatten().map(|a| (a, true));
        let not_ready = subset.not_ready_addresses.iter().flatten().map(|a| (a, false));
        let total = subset.addresses.iter().flatten().count() + subset.not_ready_addresses.iter().flatten().count();
        let mut added = 0;
        for (address, is_ready) in ready.chain(not_ready) {
            if added >= MAX_ENDPOINTS_PER_SUBSET {
                break;
            }
            let Some((ip, family)) = parse_ip(&address.ip) else {
                desired.invalid += 1;
                tracing::info!(endpoints = ?ep.metadata.name, ip = %address.ip, "address is not a valid IP; not mirrored");
                continue;
            };
            let endpoint = Endpoint {
                addresses: vec![ip.clone()],
                conditions: Some(EndpointConditions { ready: Some(is_ready), ..Default::default() }),
                target_ref: address.target_ref.clone(),
                node_name: address.node_name.clone(),
                hostname: address.hostname.clone().filter(|h| !h.is_empty()),
                ..Default::default()
            };
            if let Some((_, endpoints)) = desired.groups.get_mut(&group_key(family, &ports)) {
                endpoints.entry(ip).or_insert(endpoint);
            }
            added += 1;
        }
        desired.skipped += total - added;
    }
    desired
}

/// The labels and annotations a mirrored slice of `ep` carries.
fn slice_meta(ep: &Endpoints) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut labels = ep.metadata.labels.clone().unwrap_or_default();
    labels.insert(SERVICE_NAME_LABEL.into(), ep.metadata.name.clone().unwrap_or_default());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    let mut annotations = ep.metadata.annotations.clone().unwrap_or_default();
    annotations.remove(LAST_CHANGE_TRIGGER_TIME);
    annotations.remove(LAST_APPLIED);
    (labels, annotations)
}

/// What to write: slices to create, to update (in place) and to delete.
#[derive(Default)]
struct Plan {
    create: Vec<EndpointSlice>,
    update: Vec<EndpointSlice>,
    delete: Vec<Arc<EndpointSlice>>,
}

fn same_endpoints(slice: &EndpointSlice, want: &BTreeMap<String, Endpoint>) -> bool {
    slice.endpoints.len() == want.len()
        && slice.endpoints.iter().all(|e| e.addresses.first().and_then(|a| want.get(a)) == Some(e))
}

/// Upstream's reconcile: per group, the first existing slice is kept (and
/// rewritten when it differs), the others deleted; a group without one
/// gets a new slice; slices of groups no longer wanted are deleted, or
/// reused for a new group of their address family.
fn plan(
    ep: &Endpoints,
    groups: BTreeMap<GroupKey, (Vec<EndpointPort>, BTreeMap<String, Endpoint>)>,
    existing: &[Arc<EndpointSlice>],
) -> Plan {
    let (labels, annotations) = slice_meta(ep);
    let mut existing_by_key: BTreeMap<GroupKey, Vec<Arc<EndpointSlice>>> = BTreeMap::new();
    let mut sorted = existing.to_vec();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for slice in sorted {
        let family = if slice.address_type == "IPv6" { "IPv6" } else { "IPv4" };
        existing_by_key.entry(group_key(family, slice.ports.as_deref().unwrap_or_default())).or_default().push(slice);
    }
    let mut plan = Plan::default();
    let wanted_keys: BTreeSet<GroupKey> = groups.keys().cloned().collect();
    for (key, (ports, endpoints)) in groups {
        let current = existing_by_key.remove(&key).unwrap_or_default();
        if endpoints.is_empty() {
            plan.delete.extend(current);
            continue;
        }
        let mut current = current.into_iter();
        let first = current.next();
        plan.delete.extend(current);
        if let Some(first) = &first {
            let unchanged = same_endpoints(first, &endpoints)
                && first.metadata.labels.as_ref() == Some(&labels)
                && first.metadata.annotations.clone().unwrap_or_default() == annotations;
            if unchanged {
                continue;
            }
        }
        let mut endpoints: Vec<Endpoint> = endpoints.into_values().collect();
        endpoints.truncate(MAX_ENDPOINTS_PER_SUBSET);
        let slice = EndpointSlice {
            metadata: ObjectMeta {
                name: first.as_ref().and_then(|s| s.metadata.name.clone()),
                generate_name: first.is_none().then(|| format!("{}-", ep.metadata.name.as_deref().unwrap_or_default())),
                namespace: ep.metadata.namespace.clone(),
                resource_version: first.as_ref().and_then(|s| s.metadata.resource_version.clone()),
                labels: Some(labels.clone()),
                annotations: (!annotations.is_empty()).then(|| annotations.clone()),
                owner_references: Some(vec![controller_ref(ep)]),
                ..Default::default()
            },
            address_type: key.address_type.to_string(),
            endpoints,
            ports: Some(ports),
        };
        if first.is_some() {
            plan.update.push(slice);
        } else {
            plan.create.push(slice);
        }
    }
    // Groups no longer wanted.
    for (key, slices) in existing_by_key {
        if !wanted_keys.contains(&key) {
            plan.delete.extend(slices);
        }
    }
    // Upstream's recycleSlices: a slice to delete becomes a slice to create
    // of its address family.
    let mut creates = std::mem::take(&mut plan.create);
    for slice in creates.iter_mut() {
        if let Some(i) = plan.delete.iter().position(|d| d.address_type == slice.address_type) {
            let reused = plan.delete.remove(i);
            slice.metadata.generate_name = None;
            slice.metadata.name = reused.metadata.name.clone();
            slice.metadata.resource_version = reused.metadata.resource_version.clone();
            plan.update.push(slice.clone());
        } else {
            plan.create.push(slice.clone());
        }
    }
    plan
}

async fn apply(api: &Api<EndpointSlice>, ep: &Endpoints, plan: Plan) -> Result<(), kube::Error> {
    // No new slices for Endpoints being deleted.
    if ep.metadata.deletion_timestamp.is_none() {
        for slice in &plan.create {
            match api.create(&PostParams::default(), slice).await {
                Ok(_) => {}
                Err(e) if super::controller_utils::namespace_terminating(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
    for slice in &plan.update {
        api.replace(slice.metadata.name.as_deref().unwrap_or_default(), &PostParams::default(), slice).await?;
    }
    for slice in &plan.delete {
        delete(api, slice).await?;
    }
    Ok(())
}

async fn delete(api: &Api<EndpointSlice>, slice: &EndpointSlice) -> Result<(), kube::Error> {
    let name = slice.metadata.name.clone().unwrap_or_default();
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn endpoints(subsets: serde_json::Value) -> Endpoints {
        serde_json::from_value(json!({
            "metadata": {"name": "ext", "namespace": "default", "uid": "u1",
                         "labels": {"team": "a"},
                         "annotations": {LAST_APPLIED: "{}", "note": "kept"}},
            "subsets": subsets,
        }))
        .unwrap()
    }

    #[test]
    fn addresses_are_grouped_by_family_and_ports_and_bad_ones_counted() {
        let ep = endpoints(json!([
            {"addresses": [{"ip": "10.0.0.1"}, {"ip": "not-an-ip"}, {"ip": "fd00::1"}],
             "notReadyAddresses": [{"ip": "010.0.0.2"}], "ports": [{"name": "http", "port": 80}]},
            {"addresses": [{"ip": "10.0.0.2"}], "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
        ]));
        let d = desired_state(&ep);
        assert_eq!((d.invalid, d.skipped), (1, 1));
        let v4 = &d.groups[&group_key("IPv4", &endpoint_ports(&repack(ep.subsets.as_deref().unwrap())[0]))];
        // 10.0.0.2 is ready in one subset: ready wins.
        let ready: Vec<(&str, Option<bool>)> =
            v4.1.values().map(|e| (e.addresses[0].as_str(), e.conditions.as_ref().and_then(|c| c.ready))).collect();
        assert_eq!(ready, [("10.0.0.1", Some(true)), ("10.0.0.2", Some(true))]);
        let p = plan(&ep, d.groups, &[]);
        assert_eq!(p.create.len(), 2);
        let families: Vec<&str> = p.create.iter().map(|s| s.address_type.as_str()).collect();
        assert_eq!(families, ["IPv4", "IPv6"]);
        let s = &p.create[0];
        assert_eq!(s.metadata.generate_name.as_deref(), Some("ext-"));
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(labels[SERVICE_NAME_LABEL], "ext");
        assert_eq!(labels["team"], "a");
        assert_eq!(s.metadata.annotations, Some([("note".to_string(), "kept".to_string())].into()));
        assert_eq!(s.metadata.owner_references.as_ref().unwrap()[0].kind, "Endpoints");
    }

    #[test]
    fn at_most_a_thousand_addresses_of_a_subset() {
        let addresses: Vec<_> = (0..1200).map(|i| json!({"ip": format!("10.1.{}.{}", i / 250, i % 250)})).collect();
        let ep = endpoints(json!([{"addresses": addresses, "ports": [{"port": 53, "protocol": "UDP"}]}]));
        let d = desired_state(&ep);
        assert_eq!((d.invalid, d.skipped), (0, 200));
        assert_eq!(d.groups.values().map(|g| g.1.len()).sum::<usize>(), 1000);
    }

    #[test]
    fn an_unchanged_slice_is_left_alone_and_extra_ones_go() {
        let ep = endpoints(json!([{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]));
        let first = plan(&ep, desired_state(&ep).groups, &[]).create.remove(0);
        let mut kept = first.clone();
        kept.metadata.name = Some("ext-a".into());
        kept.metadata.generate_name = None;
        let mut extra = kept.clone();
        extra.metadata.name = Some("ext-b".into());
        let p = plan(&ep, desired_state(&ep).groups, &[Arc::new(kept.clone()), Arc::new(extra)]);
        assert!(p.create.is_empty() && p.update.is_empty());
        assert_eq!(p.delete.iter().filter_map(|s| s.metadata.name.as_deref()).collect::<Vec<_>>(), ["ext-b"]);
        // No endpoints left: the slice goes.
        let empty = endpoints(json!([]));
        let p = plan(&empty, desired_state(&empty).groups, &[Arc::new(kept)]);
        assert_eq!(p.delete.len(), 1);
    }

    #[test]
    fn skip_mirror_and_leader_election_endpoints_are_not_mirrored() {
        let mut ep = endpoints(json!([]));
        assert!(should_mirror(&ep));
        ep.metadata.labels = Some([(SKIP_MIRROR_LABEL.to_string(), "true".to_string())].into());
        assert!(!should_mirror(&ep));
        ep.metadata.labels = None;
        ep.metadata.annotations = Some([(LEADER_ANNOTATION.to_string(), "{}".to_string())].into());
        assert!(!should_mirror(&ep));
    }
}

//! EndpointSliceController: the EndpointSlices of each Service with a
//! selector (`<service>-<random>`, owned by the Service, at most 100
//! endpoints each, one set of slices per distinct port list) list the
//! selected pods with their ready/serving/terminating conditions. Existing
//! slices are reused so endpoints do not move between slices needlessly.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::{Action, Controller};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::controller_utils::{controller_ref, is_pod_ready, relabelled};
use super::endpoints::{
    endpoint_labels, find_port, pod_hostname, pod_ip, pod_reference, selected_by_any, selected_pods,
    services_selecting, should_pod_be_in_endpoints,
};
use super::informers::reflected;
use super::queue_metrics::{drain, QueueMetrics};
use super::ControllerError;
use crate::controllers::controller_utils::ignore_not_found;

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
/// upstream's `--max-endpoints-per-slice` default.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

type PortKey = Vec<(String, i32, String)>;

fn port_key(ports: &[EndpointPort]) -> PortKey {
    let mut key: PortKey = ports
        .iter()
        .map(|p| (p.name.clone().unwrap_or_default(), p.port.unwrap_or(0), p.protocol.clone().unwrap_or_default()))
        .collect();
    key.sort();
    key
}

fn address(ep: &Endpoint) -> String {
    ep.addresses.first().cloned().unwrap_or_default()
}

/// The endpoints of `svc`, grouped by the ports each pod resolves.
/// The zone label upstream copies from the pod's node onto its endpoint.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

pub fn desired_endpoints(
    svc: &Service,
    pods: &[Arc<Pod>],
    zone_of: impl Fn(&str) -> Option<String>,
) -> BTreeMap<PortKey, (Vec<EndpointPort>, Vec<Endpoint>)> {
    let name = svc.metadata.name.clone().unwrap_or_default();
    let spec = svc.spec.clone().unwrap_or_default();
    let publish_not_ready = spec.publish_not_ready_addresses == Some(true);
    let mut groups: BTreeMap<PortKey, (Vec<EndpointPort>, Vec<Endpoint>)> = BTreeMap::new();
    for pod in pods {
        if !should_pod_be_in_endpoints(pod, true) {
            continue;
        }
        let Some(ip) = pod_ip(pod) else { continue };
        let mut ports: Vec<EndpointPort> = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|sp| {
                Some(EndpointPort {
                    name: Some(sp.name.clone().unwrap_or_default()),
                    port: Some(find_port(pod, sp)?),
                    protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                    app_protocol: sp.app_protocol.clone(),
                })
            })
            .collect();
        ports.sort_by(|a, b| (&a.name, a.port, &a.protocol).cmp(&(&b.name, b.port, &b.protocol)));
        let serving = is_pod_ready(pod);
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let endpoint = Endpoint {
            addresses: vec![ip],
            conditions: Some(EndpointConditions {
                // Never ready while terminating, unless not-ready addresses are published.
                ready: Some(publish_not_ready || (serving && !terminating)),
                serving: Some(serving),
                terminating: Some(terminating),
            }),
            hostname: pod_hostname(pod, &name),
            node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            zone: pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).and_then(&zone_of),
            target_ref: Some(pod_reference(pod)),
            ..Default::default()
        };
        groups.entry(port_key(&ports)).or_insert_with(|| (ports, Vec::new())).1.push(endpoint);
    }
    groups
}

/// The labels of `svc`'s slices.
pub fn slice_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut labels = endpoint_labels(svc);
    labels.insert(SERVICE_NAME_LABEL.into(), svc.metadata.name.clone().unwrap_or_default());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    labels
}

/// What to do with the slices: (existing slice or new, ports, endpoints).
type Plan = Vec<(Option<Arc<EndpointSlice>>, Vec<EndpointPort>, Vec<Endpoint>)>;

/// Places the desired endpoints into the existing slices first (keeping
/// each endpoint where it is), then into free room, then into new slices.
pub fn plan_slices(
    desired: BTreeMap<PortKey, (Vec<EndpointPort>, Vec<Endpoint>)>,
    existing: &[Arc<EndpointSlice>],
) -> (Plan, Vec<Arc<EndpointSlice>>) {
    let mut unused: Vec<Arc<EndpointSlice>> = existing.to_vec();
    unused.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut plan: Plan = Vec::new();
    if desired.is_empty() {
        // One placeholder slice with no ports and no endpoints.
        let keep = if unused.is_empty() { None } else { Some(unused.remove(0)) };
        plan.push((keep, Vec::new(), Vec::new()));
        return (plan, unused);
    }
    for (key, (ports, endpoints)) in desired {
        let mut remaining: BTreeMap<String, Endpoint> = endpoints.into_iter().map(|e| (address(&e), e)).collect();
        let mut group: Plan = Vec::new();
        let mut i = 0;
        while i < unused.len() {
            if port_key(unused[i].ports.as_deref().unwrap_or_default()) == key {
                let slice = unused.remove(i);
                let kept: Vec<Endpoint> =
                    slice.endpoints.iter().filter_map(|e| remaining.remove(&address(e))).collect();
                group.push((Some(slice), ports.clone(), kept));
            } else {
                i += 1;
            }
        }
        let mut rest = remaining.into_values();
        for (_, _, eps) in group.iter_mut() {
            while eps.len() < MAX_ENDPOINTS_PER_SLICE {
                match rest.next() {
                    Some(e) => eps.push(e),
                    None => break,
                }
            }
        }
        let rest: Vec<Endpoint> = rest.collect();
        for chunk in rest.chunks(MAX_ENDPOINTS_PER_SLICE) {
            group.push((None, ports.clone(), chunk.to_vec()));
        }
        // Slices left empty go, as long as the group keeps one.
        for (slice, ports, eps) in group {
            if eps.is_empty() {
                if let Some(s) = slice {
                    unused.push(s);
                }
            } else {
                plan.push((slice, ports, eps));
            }
        }
    }
    (plan, unused)
}

struct Context {
    client: kube::Client,
    pods: Store<Pod>,
    slices: Store<EndpointSlice>,
    nodes: Store<Node>,
}

async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let (Some(ns), Some(name)) = (svc.metadata.namespace.clone(), svc.metadata.name.clone()) else {
        return Ok(Action::await_change());
    };
    if svc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let _ = crate::client::cache_sync::wait_for_cache_sync(&ctx.pods).await;
    let _ = crate::client::cache_sync::wait_for_cache_sync(&ctx.slices).await;
    let Some(pods) = selected_pods(&svc, &ctx.pods) else {
        return Ok(Action::await_change());
    };
    let uid = svc.metadata.uid.clone().unwrap_or_default();
    let existing = ctx.slices.state_filter(|s| {
        s.metadata.namespace.as_deref() == Some(ns.as_str())
            && s.metadata.labels.as_ref().is_some_and(|l| {
                l.get(SERVICE_NAME_LABEL) == Some(&name)
                    && l.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
            })
            && s.metadata.owner_references.iter().flatten().any(|o| o.uid == uid)
    });
    let labels = slice_labels(&svc);
    let zone_of = |node: &str| {
        ctx.nodes
            .get(&kube::runtime::reflector::ObjectRef::new(node))?
            .metadata
            .labels
            .as_ref()?
            .get(ZONE_LABEL)
            .cloned()
    };
    let (plan, stale) = plan_slices(desired_endpoints(&svc, &pods, zone_of), &existing);
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
    for (slice, ports, mut endpoints) in plan {
        endpoints.sort_by_key(address);
        let ports = (!ports.is_empty()).then_some(ports);
        match slice {
            Some(cur) => {
                if cur.endpoints == endpoints && cur.ports == ports && cur.metadata.labels.as_ref() == Some(&labels) {
                    continue;
                }
                let mut updated = (*cur).clone();
                updated.endpoints = endpoints;
                updated.ports = ports;
                updated.metadata.labels = Some(labels.clone());
                updated.metadata.managed_fields = None;
                let slice_name = cur.metadata.name.clone().unwrap_or_default();
                match api.replace(&slice_name, &PostParams::default(), &updated).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                        return Ok(Action::requeue(Duration::from_millis(200)))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            None => {
                let slice = EndpointSlice {
                    metadata: ObjectMeta {
                        generate_name: Some(format!("{name}-")),
                        namespace: Some(ns.clone()),
                        labels: Some(labels.clone()),
                        owner_references: Some(vec![controller_ref(&*svc)]),
                        ..Default::default()
                    },
                    address_type: "IPv4".into(),
                    endpoints,
                    ports,
                };
                match api.create(&PostParams::default(), &slice).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) if super::controller_utils::namespace_terminating(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    for slice in stale {
        let slice_name = slice.metadata.name.clone().unwrap_or_default();
        ignore_not_found(api.delete(&slice_name, &DeleteParams::default()).await)?;
    }
    Ok(Action::await_change())
}

fn error_policy(_svc: Arc<Service>, err: &ControllerError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "endpoint slice reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

pub async fn run(
    client: kube::Client,
    informers: crate::client::informer_factory::SharedInformerFactory,
    pod_informer: super::informers::Informer<Pod>,
) {
    let (services, service_events) = informers.informer::<Service>().subscribe().into_parts();
    let selected = services.clone();
    let (pods, pod_events) =
        pod_informer.only(move |pod| selected_by_any(pod, &selected)).into_shared_parts_and_old(relabelled);
    let (slices, slice_events) = reflected(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}")),
    );
    // Nodes only for their zone label; a zone change alone does not resync.
    let (nodes, node_events) = informers
        .informer::<Node>()
        .subscribe()
        .skip_updates(crate::client::predicates::node_heartbeat_only)
        .into_parts();
    let nodes_cache = node_events.for_each(|_| std::future::ready(()));
    let queue = QueueMetrics::new("endpoint_slice", services.clone());
    let selecting = services.clone();
    let sync = Controller::for_stream(queue.primary(service_events), services)
        .watches_shared_stream(pod_events, queue.mapped(move |pod: Arc<Pod>| services_selecting(&pod, &selecting)))
        .watches_stream(slice_events, queue.mapped(|slice: EndpointSlice| owning_service(&slice)))
        .run(queue.timed(reconcile), queue.retried(error_policy), Arc::new(Context { client, pods, slices, nodes }));
    tokio::join!(drain("endpoint_slice", sync), nodes_cache);
}

/// The Service controlling a slice (what `owns` would map it to).
fn owning_service(slice: &EndpointSlice) -> Option<ObjectRef<Service>> {
    let owner = slice.metadata.owner_references.as_ref()?.iter().find(|r| r.controller == Some(true))?;
    (owner.kind == "Service" && owner.api_version == "v1")
        .then(|| ObjectRef::new(&owner.name).within(slice.metadata.namespace.as_deref().unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(ip: &str) -> Endpoint {
        Endpoint { addresses: vec![ip.into()], ..Default::default() }
    }

    #[test]
    fn slices_hold_at_most_a_hundred_and_keep_their_endpoints() {
        let ports = vec![EndpointPort {
            name: Some("http".into()),
            port: Some(80),
            protocol: Some("TCP".into()),
            app_protocol: None,
        }];
        let eps: Vec<Endpoint> = (0..250).map(|i| ep(&format!("10.42.{}.{}", i / 200, i % 200))).collect();
        let mut desired = BTreeMap::new();
        desired.insert(port_key(&ports), (ports.clone(), eps));
        let (plan, stale) = plan_slices(desired.clone(), &[]);
        assert!(stale.is_empty());
        assert_eq!(plan.iter().map(|p| p.2.len()).collect::<Vec<_>>(), vec![100, 100, 50]);
        // An existing slice keeps what it has and fills up.
        let existing = Arc::new(EndpointSlice {
            metadata: ObjectMeta { name: Some("web-a".into()), ..Default::default() },
            address_type: "IPv4".into(),
            endpoints: vec![ep("10.42.1.49"), ep("10.9.9.9")],
            ports: Some(ports.clone()),
        });
        let (plan, stale) = plan_slices(desired, &[existing]);
        assert!(stale.is_empty());
        assert_eq!(plan[0].0.as_ref().and_then(|s| s.metadata.name.as_deref()), Some("web-a"));
        assert_eq!(address(&plan[0].2[0]), "10.42.1.49");
        assert!(!plan[0].2.iter().any(|e| address(e) == "10.9.9.9"));
        assert_eq!(plan.iter().map(|p| p.2.len()).sum::<usize>(), 250);
        // No endpoints: one empty placeholder.
        let (plan, _) = plan_slices(BTreeMap::new(), &[]);
        assert_eq!(plan.len(), 1);
        assert!(plan[0].2.is_empty());
    }
}

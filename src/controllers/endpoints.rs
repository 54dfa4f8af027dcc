//! EndpointsController: the Endpoints object named after each Service with
//! a selector lists the selected pods' IPs, ready ones under `addresses`
//! and the others under `notReadyAddresses`, grouped into subsets by the
//! ports they resolve to. Endpoints of a Service that is gone are deleted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::{Action, Controller};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service, ServicePort,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::controller_utils::{is_pod_ready, relabelled};
use super::informers::reflected;
use super::queue_metrics::{drain, QueueMetrics};
use super::ControllerError;
use crate::client::informer::Change;
use crate::client::labels;

/// The label upstream puts on the Endpoints and EndpointSlices of headless Services.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// Leader-election Endpoints of old components are never deleted.
const LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

/// The pods a Service selects: `None` when it has no selector (its
/// endpoints are someone else's business).
pub fn selected_pods(svc: &Service, pods: &Store<Pod>) -> Option<Vec<Arc<Pod>>> {
    selector_of(svc)?;
    Some(pods.state_filter(|p| selects(svc, p)))
}

/// A Service's selector, when it has a non-empty one.
fn selector_of(service: &Service) -> Option<&BTreeMap<String, String>> {
    service.spec.as_ref()?.selector.as_ref().filter(|s| !s.is_empty())
}

/// Whether `service` is in `pod`'s namespace and its (non-empty) selector
/// matches the pod's labels.
fn selects(service: &Service, pod: &Pod) -> bool {
    service.metadata.namespace == pod.metadata.namespace
        && selector_of(service).is_some_and(|sel| labels::matches_map(sel, pod.metadata.labels.as_ref()))
}

/// Services in `pod`'s namespace that select it.
pub fn services_selecting(pod: &Pod, services: &Store<Service>) -> Vec<ObjectRef<Service>> {
    services.state().iter().filter(|s| selects(s, pod)).map(|s| ObjectRef::from_obj(&**s)).collect()
}

/// Whether any Service selects `pod` (`services_selecting` is not empty).
pub fn selected_by_any(pod: &Pod, services: &Store<Service>) -> bool {
    services.find(|s| selects(s, pod)).is_some()
}

/// upstream's `ShouldPodBeInEndpoints`: the pod has an IP, is not being
/// deleted (unless terminating pods are wanted) and may still run.
pub fn should_pod_be_in_endpoints(pod: &Pod, include_terminating: bool) -> bool {
    if pod_ip(pod).is_none() {
        return false;
    }
    if !include_terminating && pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always") {
        "Never" => !matches!(phase, "Failed" | "Succeeded"),
        "OnFailure" => phase != "Succeeded",
        _ => true,
    }
}

/// The pod's IPv4 address.
pub fn pod_ip(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let mut ips: Vec<&str> = status.pod_ips.iter().flatten().map(|p| p.ip.as_str()).collect();
    if let Some(ip) = status.pod_ip.as_deref() {
        ips.insert(0, ip);
    }
    ips.into_iter().find(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok()).map(str::to_string)
}

/// upstream's `FindPort`: a named targetPort is looked up among the pod's
/// container ports with the same protocol; a number is taken as is; none
/// means the Service port.
pub fn find_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    let protocol = port.protocol.as_deref().unwrap_or("TCP");
    match &port.target_port {
        None => Some(port.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => match name.parse::<i32>() {
            Ok(n) => Some(n),
            Err(_) => pod.spec.as_ref()?.containers.iter().flat_map(|c| c.ports.iter().flatten()).find_map(|p| {
                (p.name.as_deref() == Some(name) && p.protocol.as_deref().unwrap_or("TCP") == protocol)
                    .then_some(p.container_port)
            }),
        },
    }
}

/// The pod as the `targetRef` of an endpoint.
pub fn pod_reference(pod: &Pod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    }
}

/// The hostname a pod has under a headless Service named `svc`.
pub fn pod_hostname(pod: &Pod, svc: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    (spec.subdomain.as_deref() == Some(svc)).then(|| spec.hostname.clone()).flatten().filter(|h| !h.is_empty())
}

/// The labels of the Endpoints/EndpointSlices of `svc`: its own, plus the
/// headless marker.
pub fn endpoint_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut out = svc.metadata.labels.clone().unwrap_or_default();
    if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
        out.insert(HEADLESS_LABEL.into(), String::new());
    } else {
        out.remove(HEADLESS_LABEL);
    }
    out
}

/// The subsets of `svc`'s Endpoints, sorted the way upstream repacks them.
pub fn desired_subsets(svc: &Service, pods: &[Arc<Pod>]) -> Vec<EndpointSubset> {
    let name = svc.metadata.name.clone().unwrap_or_default();
    let spec = svc.spec.clone().unwrap_or_default();
    let tolerate_unready = spec.publish_not_ready_addresses == Some(true);
    // ports (sorted) → (ready, not ready) addresses by IP.
    type Addresses = (BTreeMap<String, EndpointAddress>, BTreeMap<String, EndpointAddress>);
    type PortKey = Vec<(String, i32, String)>;
    let mut groups: BTreeMap<PortKey, (Vec<EndpointPort>, Addresses)> = BTreeMap::new();
    for pod in pods {
        if !should_pod_be_in_endpoints(pod, tolerate_unready) {
            continue;
        }
        let Some(ip) = pod_ip(pod) else { continue };
        let address = EndpointAddress {
            ip: ip.clone(),
            hostname: pod_hostname(pod, &name),
            node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            target_ref: Some(pod_reference(pod)),
        };
        let ready = tolerate_unready || is_pod_ready(pod);
        let service_ports = spec.ports.clone().unwrap_or_default();
        let mut port_sets: Vec<Vec<EndpointPort>> = Vec::new();
        if service_ports.is_empty() {
            // A headless Service without ports still lists its pods.
            if spec.cluster_ip.as_deref() == Some("None") {
                port_sets.push(Vec::new());
            }
        } else {
            for sp in &service_ports {
                let Some(port) = find_port(pod, sp) else {
                    tracing::debug!(pod = ?pod.metadata.name, port = ?sp.name, "pod has no such port");
                    continue;
                };
                port_sets.push(vec![EndpointPort {
                    name: sp.name.clone(),
                    port,
                    protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                    app_protocol: sp.app_protocol.clone(),
                }]);
            }
        }
        for ports in port_sets {
            let key = ports
                .iter()
                .map(|p| (p.name.clone().unwrap_or_default(), p.port, p.protocol.clone().unwrap_or_default()))
                .collect();
            let entry = groups.entry(key).or_insert_with(|| (ports, Default::default()));
            let (ready_set, not_ready_set) = &mut entry.1;
            if ready {
                ready_set.insert(ip.clone(), address.clone());
            } else {
                not_ready_set.insert(ip.clone(), address.clone());
            }
        }
    }
    // Repack: subsets with the same addresses merge their ports.
    let mut by_addresses: BTreeMap<(Vec<String>, Vec<String>), EndpointSubset> = BTreeMap::new();
    for (_, (ports, (ready, not_ready))) in groups {
        let key = (ready.keys().cloned().collect(), not_ready.keys().cloned().collect());
        let subset = by_addresses.entry(key).or_insert_with(|| EndpointSubset {
            addresses: (!ready.is_empty()).then(|| ready.values().cloned().collect()),
            not_ready_addresses: (!not_ready.is_empty()).then(|| not_ready.values().cloned().collect()),
            ports: None,
        });
        if !ports.is_empty() {
            let list = subset.ports.get_or_insert_with(Vec::new);
            list.extend(ports);
            list.sort_by(|a, b| (&a.name, a.port, &a.protocol).cmp(&(&b.name, b.port, &b.protocol)));
        }
    }
    by_addresses.into_values().collect()
}

struct Context {
    client: kube::Client,
    pods: Store<Pod>,
    endpoints: Store<Endpoints>,
}

async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let (Some(ns), Some(name)) = (svc.metadata.namespace.clone(), svc.metadata.name.clone()) else {
        return Ok(Action::await_change());
    };
    if svc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let _ = crate::client::cache_sync::wait_for_cache_sync(&ctx.pods).await;
    let _ = crate::client::cache_sync::wait_for_cache_sync(&ctx.endpoints).await;
    let Some(pods) = selected_pods(&svc, &ctx.pods) else {
        return Ok(Action::await_change());
    };
    let subsets = desired_subsets(&svc, &pods);
    let labels = endpoint_labels(&svc);
    let api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), &ns);
    let current = ctx.endpoints.get(&ObjectRef::new(&name).within(&ns));
    let want_subsets = (!subsets.is_empty()).then_some(subsets);
    match current {
        Some(cur) => {
            let cur_labels = cur.metadata.labels.clone().unwrap_or_default();
            let cur_subsets = cur.subsets.clone().filter(|s| !s.is_empty());
            if cur_subsets == want_subsets && cur_labels == labels {
                return Ok(Action::await_change());
            }
            let mut updated = (*cur).clone();
            updated.metadata.labels = Some(labels);
            updated.subsets = want_subsets;
            updated.metadata.managed_fields = None;
            match api.replace(&name, &PostParams::default(), &updated).await {
                Ok(_) => tracing::debug!(service = %name, namespace = %ns, "updated Endpoints"),
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                    return Ok(Action::requeue(Duration::from_millis(200)))
                }
                Err(e) => return Err(e.into()),
            }
        }
        None => {
            let ep = Endpoints {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(ns.clone()),
                    labels: Some(labels),
                    ..Default::default()
                },
                subsets: want_subsets,
            };
            match api.create(&PostParams::default(), &ep).await {
                Ok(_) => tracing::debug!(service = %name, namespace = %ns, "created Endpoints"),
                Err(kube::Error::Api(s)) if s.code == 409 => return Ok(Action::requeue(Duration::from_millis(200))),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) if super::controller_utils::namespace_terminating(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(Action::await_change())
}

fn error_policy<K>(_obj: Arc<K>, err: &ControllerError, _ctx: Arc<impl Sized>) -> Action {
    tracing::warn!(error = %err, "endpoints reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

struct Cleanup {
    client: kube::Client,
    services: Store<Service>,
}

/// Deletes Endpoints whose Service is gone; it runs for a Service's
/// deletion and for each Endpoints object once at start.
async fn delete_orphaned(ep: Arc<Endpoints>, ctx: Arc<Cleanup>) -> Result<Action, ControllerError> {
    let (Some(ns), Some(name)) = (ep.metadata.namespace.clone(), ep.metadata.name.clone()) else {
        return Ok(Action::await_change());
    };
    if ep.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(LEADER_ANNOTATION)) {
        return Ok(Action::await_change());
    }
    let _ = crate::client::cache_sync::wait_for_cache_sync(&ctx.services).await;
    if ctx.services.get(&ObjectRef::new(&name).within(&ns)).is_some() {
        return Ok(Action::await_change());
    }
    let api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), &ns);
    let dp = crate::controllers::controller_utils::delete_only_uid(ep.metadata.uid.clone());
    match api.delete(&name, &dp).await {
        Ok(_) => tracing::debug!(endpoints = %name, namespace = %ns, "deleted Endpoints of a deleted Service"),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

pub async fn run(
    client: kube::Client,
    informers: crate::client::informer_factory::SharedInformerFactory,
    pod_informer: super::informers::Informer<Pod>,
) {
    let (by_pod, own_events) = informers.informer::<Service>().subscribe().into_parts();
    let selected = by_pod.clone();
    let (pods, pod_events) =
        pod_informer.only(move |pod| selected_by_any(pod, &selected)).into_shared_parts_and_old(relabelled);
    let (endpoints, endpoint_events) = reflected(Api::<Endpoints>::all(client.clone()), watcher::Config::default());
    let cleanup_endpoints = endpoints.clone();
    let queue = QueueMetrics::new("endpoint", by_pod.clone());
    let selecting = by_pod.clone();
    let sync = Controller::for_stream(queue.primary(own_events), by_pod)
        .watches_shared_stream(pod_events, queue.mapped(move |pod: Arc<Pod>| services_selecting(&pod, &selecting)))
        .watches_stream(
            endpoint_events,
            queue.mapped(|ep: Endpoints| {
                Some(ObjectRef::<Service>::new(ep.metadata.name.as_deref()?).within(ep.metadata.namespace.as_deref()?))
            }),
        )
        .run(
            queue.timed(reconcile),
            queue.retried(error_policy),
            Arc::new(Context { client: client.clone(), pods, endpoints }),
        );
    // Endpoints are deleted when their Service's deletion is seen, and once
    // at start for the leftovers of Services deleted while no controller
    // ran (upstream's checkLeftoverEndpoints); never for an Endpoints
    // object's own events: one made by hand, for no Service, stays.
    let (services, service_changes) = informers.informer::<Service>().subscribe().into_changes();
    let deleted_services = service_changes.filter_map(|change| {
        std::future::ready(match change {
            Change::Deleted(svc) => Some(Ok::<_, std::convert::Infallible>((*svc).clone())),
            _ => None,
        })
    });
    let leftovers = {
        let (endpoints, services) = (cleanup_endpoints.clone(), services.clone());
        futures_util::stream::once(async move {
            let synced = crate::client::cache_sync::wait_for_cache_sync(&endpoints).await.is_ok()
                && crate::client::cache_sync::wait_for_cache_sync(&services).await.is_ok();
            if synced {
                endpoints.state()
            } else {
                Vec::new()
            }
        })
        .flat_map(|all| {
            futures_util::stream::iter(all.into_iter().map(|ep| Ok::<_, std::convert::Infallible>((*ep).clone())))
        })
    };
    let cleanup = Controller::for_stream(leftovers, cleanup_endpoints)
        .watches_stream(deleted_services, |svc: Service| {
            Some(ObjectRef::<Endpoints>::new(svc.metadata.name.as_deref()?).within(svc.metadata.namespace.as_deref()?))
        })
        .run(delete_orphaned, error_policy, Arc::new(Cleanup { client, services }))
        .for_each(|_| std::future::ready(()));
    tokio::join!(drain("endpoint", sync), cleanup);
}

//! ServiceLBController: ferrok's built-in load balancer for Services of
//! type LoadBalancer, with k3s' ServiceLB semantics but no pods. Where k3s
//! runs a klipper-lb DaemonSet whose pods hold the Service's ports as host
//! ports, ferrok's service proxy answers on the node's own addresses; this
//! controller only decides which nodes serve each Service and publishes
//! their addresses in `status.loadBalancer.ingress` (`ipMode: VIP`).
//!
//! - Ours: type LoadBalancer with no `spec.loadBalancerClass`, or the class
//!   [`LOAD_BALANCER_CLASS`]. Services of another class are left alone.
//! - Eligible nodes: Ready and not being deleted; when any node carries the
//!   label [`ENABLE_LB_LABEL`] (any value), only those with `true`, and of
//!   those, when the Service has the label [`LB_POOL_LABEL`], only the nodes
//!   of that pool (k3s' `svccontroller.k3s.cattle.io/enablelb` and `lbpool`).
//! - A node serving a Service on a port/protocol cannot serve a later one
//!   on the same port/protocol (k3s' pod would stay Pending for its host
//!   port): Services are placed oldest first (creationTimestamp, then
//!   namespace/name), and the later one gets a Warning Event naming the
//!   node, the port and the Service holding it.
//! - `externalTrafficPolicy: Local`: only the serving nodes with a ready
//!   endpoint of the Service are published.
//! - Addresses: the ExternalIPs of the published nodes if any of them has
//!   one, else their InternalIPs (as k3s), only of the Service's IP
//!   families, sorted, in the order of `spec.ipFamilies`.
//! - A Service that is no longer of type LoadBalancer has its ingress cleared.
//!
//! Placement depends on every other LoadBalancer Service and on the nodes,
//! so any change of a Service or Node requeues every LoadBalancer Service;
//! EndpointSlice changes requeue their own Service.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use serde_json::json;

use super::endpointslice::SERVICE_NAME_LABEL;
use super::informers::{informer, run as run_controller};
use super::ControllerError;
use crate::client::events::{EventRecorder, EventType};
use crate::sync::LockExt;

/// The `spec.loadBalancerClass` ferrok's ServiceLB claims (besides none).
pub const LOAD_BALANCER_CLASS: &str = "ferrok.io/servicelb";
/// Node label: when any node has it, only nodes with `true` serve.
pub const ENABLE_LB_LABEL: &str = "svccontroller.ferrok.io/enablelb";
/// Service and node label: a Service with it is served only by the nodes
/// of the same pool (when the enablelb label is in use).
pub const LB_POOL_LABEL: &str = "svccontroller.ferrok.io/lbpool";
/// The name this controller acts and records Events under.
pub const CONTROLLER_NAME: &str = "service-controller";

/// `namespace/name` of a Service.
pub type ServiceKey = (String, String);

fn key_of(svc: &Service) -> ServiceKey {
    (svc.metadata.namespace.clone().unwrap_or_default(), svc.metadata.name.clone().unwrap_or_default())
}

fn is_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

/// Whether ferrok's ServiceLB serves `svc`.
pub fn is_ours(svc: &Service) -> bool {
    is_load_balancer(svc)
        && svc.metadata.deletion_timestamp.is_none()
        && match svc.spec.as_ref().and_then(|s| s.load_balancer_class.as_deref()) {
            None => true,
            Some(class) => class == LOAD_BALANCER_CLASS,
        }
}

fn is_node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

fn label<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// The nodes that may serve `svc`, before port clashes are considered.
pub fn eligible_nodes<'a>(svc: &Service, nodes: &'a [Arc<Node>]) -> Vec<&'a Arc<Node>> {
    let selective = nodes.iter().any(|n| label(&n.metadata, ENABLE_LB_LABEL).is_some());
    let pool = label(&svc.metadata, LB_POOL_LABEL).filter(|p| !p.is_empty());
    nodes
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none() && is_node_ready(n))
        .filter(|n| !selective || label(&n.metadata, ENABLE_LB_LABEL) == Some("true"))
        .filter(|n| !selective || pool.is_none() || label(&n.metadata, LB_POOL_LABEL) == pool)
        .collect()
}

/// A port of a Service as a host port: (port, protocol).
fn host_ports(svc: &Service) -> Vec<(i32, String)> {
    svc.spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| (p.port, p.protocol.clone().unwrap_or_else(|| "TCP".into())))
        .collect()
}

/// Why a node does not serve a Service: the port it wanted is held there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortConflict {
    pub node: String,
    pub port: i32,
    pub protocol: String,
    /// The earlier Service serving that port on the node.
    pub holder: ServiceKey,
}

impl std::fmt::Display for PortConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node {} does not serve this Service: port {}/{} is already served there by LoadBalancer Service {}/{}",
            self.node, self.port, self.protocol, self.holder.0, self.holder.1
        )
    }
}

/// Where each of our Services is served.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Placement {
    /// Nodes holding the Service's ports (k3s' nodes with a running svclb pod).
    pub nodes: Vec<String>,
    pub conflicts: Vec<PortConflict>,
}

/// Places every Service of ours on nodes, oldest Service first.
pub fn place(services: &[Arc<Service>], nodes: &[Arc<Node>]) -> BTreeMap<ServiceKey, Placement> {
    let mut ours: Vec<&Arc<Service>> = services.iter().filter(|s| is_ours(s)).collect();
    ours.sort_by(|a, b| {
        let ts = |s: &Service| s.metadata.creation_timestamp.as_ref().map(|t| t.0);
        ts(a).cmp(&ts(b)).then_with(|| key_of(a).cmp(&key_of(b)))
    });
    let mut held: HashMap<(String, i32, String), ServiceKey> = HashMap::new();
    let mut out = BTreeMap::new();
    for svc in ours {
        let key = key_of(svc);
        let ports = host_ports(svc);
        let mut placement = Placement::default();
        for node in eligible_nodes(svc, nodes) {
            let name = node.metadata.name.clone().unwrap_or_default();
            let clashes: Vec<PortConflict> = ports
                .iter()
                .filter_map(|(port, proto)| {
                    held.get(&(name.clone(), *port, proto.clone())).map(|holder| PortConflict {
                        node: name.clone(),
                        port: *port,
                        protocol: proto.clone(),
                        holder: holder.clone(),
                    })
                })
                .collect();
            if clashes.is_empty() {
                for (port, proto) in &ports {
                    held.insert((name.clone(), *port, proto.clone()), key.clone());
                }
                placement.nodes.push(name);
            } else {
                placement.conflicts.extend(clashes);
            }
        }
        placement.nodes.sort();
        placement.conflicts.sort();
        out.insert(key, placement);
    }
    out
}

/// The ingress of `svc` served by `serving` nodes: ExternalIPs if any of
/// them has one, else InternalIPs, of the Service's families, sorted.
pub fn ingress_for(svc: &Service, serving: &[&Node]) -> Vec<LoadBalancerIngress> {
    let mut external: BTreeSet<IpAddr> = BTreeSet::new();
    let mut internal: BTreeSet<IpAddr> = BTreeSet::new();
    for node in serving {
        for addr in node.status.iter().flat_map(|s| s.addresses.iter().flatten()) {
            let Ok(ip) = addr.address.parse::<IpAddr>() else { continue };
            match addr.type_.as_str() {
                "ExternalIP" => external.insert(ip),
                "InternalIP" => internal.insert(ip),
                _ => false,
            };
        }
    }
    let ips = if external.is_empty() { internal } else { external };
    let families: Vec<String> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.clone())
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| vec!["IPv4".into()]);
    families
        .iter()
        .flat_map(|family| {
            ips.iter().filter(move |ip| match family.as_str() {
                "IPv4" => ip.is_ipv4(),
                "IPv6" => ip.is_ipv6(),
                _ => false,
            })
        })
        .map(|ip| LoadBalancerIngress { ip: Some(ip.to_string()), ip_mode: Some("VIP".into()), ..Default::default() })
        .collect()
}

/// The nodes with a ready endpoint of the Service, from its EndpointSlices.
fn nodes_with_ready_endpoints(svc: &Service, slices: &Store<EndpointSlice>) -> HashSet<String> {
    let (ns, name) = key_of(svc);
    slices
        .state()
        .iter()
        .filter(|s| {
            s.metadata.namespace.as_deref() == Some(ns.as_str())
                && label(&s.metadata, SERVICE_NAME_LABEL) == Some(name.as_str())
        })
        .flat_map(|s| s.endpoints.clone())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .filter(|e| e.target_ref.as_ref().is_some_and(|r| r.kind.as_deref() == Some("Pod")))
        .filter_map(|e| e.node_name)
        .collect()
}

fn requests_only_local_traffic(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local")
}

fn current_ingress(svc: &Service) -> Vec<LoadBalancerIngress> {
    svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.clone()).unwrap_or_default()
}

fn ingress_ips(ingress: &[LoadBalancerIngress]) -> Vec<String> {
    ingress.iter().map(|i| i.ip.clone().or_else(|| i.hostname.clone()).unwrap_or_default()).collect()
}

struct Context {
    client: kube::Client,
    services: Store<Service>,
    nodes: Store<Node>,
    slices: Store<EndpointSlice>,
    recorder: EventRecorder,
    /// The port conflicts last reported per Service, so each is told once.
    reported: Mutex<HashMap<ServiceKey, Vec<PortConflict>>>,
}

async fn write_ingress(
    ctx: &Context,
    svc: &Service,
    ingress: &[LoadBalancerIngress],
) -> Result<Option<Action>, ControllerError> {
    let (ns, name) = key_of(svc);
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let body = if ingress.is_empty() {
        json!({"status": {"loadBalancer": {"ingress": null}}})
    } else {
        json!({"status": {"loadBalancer": {"ingress": ingress}}})
    };
    let params = PatchParams { field_manager: Some(CONTROLLER_NAME.into()), ..Default::default() };
    match api.patch_status(&name, &params, &Patch::Merge(&body)).await {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Some(Action::await_change())),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Some(Action::requeue(Duration::from_millis(200)))),
        Err(e) => Err(e.into()),
    }
}

async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let key = key_of(&svc);
    let current = current_ingress(&svc);
    if !is_load_balancer(&svc) {
        ctx.reported.lock().map(|mut r| r.remove(&key)).ok();
        if !current.is_empty() && svc.metadata.deletion_timestamp.is_none() {
            if let Some(action) = write_ingress(&ctx, &svc, &[]).await? {
                return Ok(action);
            }
            tracing::debug!(service = %format!("{}/{}", key.0, key.1), "no longer a LoadBalancer; ingress cleared");
        }
        return Ok(Action::await_change());
    }
    if !is_ours(&svc) {
        return Ok(Action::await_change());
    }
    let _ = crate::client::cache_sync::wait_for_cache_sync(&ctx.nodes).await;
    let _ = crate::client::cache_sync::wait_for_cache_sync(&ctx.slices).await;
    let _ = crate::client::cache_sync::wait_for_cache_sync(&ctx.services).await;
    let nodes = ctx.nodes.state();
    let placement = place(&ctx.services.state(), &nodes).remove(&key).unwrap_or_default();
    let local = requests_only_local_traffic(&svc).then(|| nodes_with_ready_endpoints(&svc, &ctx.slices));
    let serving: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.metadata.name.as_ref().is_some_and(|name| placement.nodes.contains(name)))
        .filter(|n| local.as_ref().is_none_or(|l| n.metadata.name.as_ref().is_some_and(|name| l.contains(name))))
        .map(|n| &**n)
        .collect();
    let desired = ingress_for(&svc, &serving);

    let newly_reported = {
        let mut reported = ctx.reported.locked();
        let before = reported.insert(key.clone(), placement.conflicts.clone()).unwrap_or_default();
        placement.conflicts.iter().filter(|c| !before.contains(c)).cloned().collect::<Vec<_>>()
    };
    for conflict in newly_reported {
        ctx.recorder.publish(&*svc, EventType::Warning, "LoadBalancerPortInUse", &conflict.to_string());
    }

    if desired == current {
        return Ok(Action::await_change());
    }
    if let Some(action) = write_ingress(&ctx, &svc, &desired).await? {
        return Ok(action);
    }
    if desired.is_empty() {
        ctx.recorder.publish(
            &*svc,
            EventType::Warning,
            "UnAvailableLoadBalancer",
            "There are no available nodes for LoadBalancer",
        );
    } else {
        let message =
            format!("Updated LoadBalancer with new IPs: {:?} -> {:?}", ingress_ips(&current), ingress_ips(&desired));
        ctx.recorder.publish(&*svc, EventType::Normal, "UpdatedLoadBalancer", &message);
    }
    Ok(Action::await_change())
}

/// Every LoadBalancer Service in `services` (placement is shared by all).
fn all_load_balancers(services: &Store<Service>) -> Vec<ObjectRef<Service>> {
    services.state().iter().filter(|s| is_load_balancer(s)).map(|s| ObjectRef::from_obj(&**s)).collect()
}

pub async fn run(client: kube::Client, informers: crate::client::informer_factory::SharedInformerFactory) {
    let service_informer = informers.informer::<Service>().subscribe();
    let services = service_informer.store.clone();
    let lbs = services.clone();
    let (services, service_triggers) = service_informer.trigger_with(move |svc: &Service| {
        let mut refs = all_load_balancers(&lbs);
        let own = ObjectRef::from_obj(svc);
        if !refs.contains(&own) {
            refs.push(own);
        }
        refs
    });
    let lbs = services.clone();
    let (nodes, node_triggers) = informers
        .informer::<Node>()
        .subscribe()
        .skip_updates(crate::client::predicates::node_heartbeat_only)
        .trigger_with(move |_: &Node| all_load_balancers(&lbs));
    let (slices, slice_triggers) =
        informer(Api::<EndpointSlice>::all(client.clone()), watcher::Config::default().labels(SERVICE_NAME_LABEL))
            .trigger_with(|slice: &EndpointSlice| {
                let name = label(&slice.metadata, SERVICE_NAME_LABEL).map(str::to_string);
                name.map(|n| {
                    ObjectRef::<Service>::new(&n).within(slice.metadata.namespace.as_deref().unwrap_or_default())
                })
            });
    let ctx = Arc::new(Context {
        recorder: EventRecorder::new(client.clone(), CONTROLLER_NAME),
        client,
        services: services.clone(),
        nodes,
        slices,
        reported: Mutex::new(HashMap::new()),
    });
    run_controller("service", services, vec![service_triggers, node_triggers, slice_triggers], reconcile, ctx).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition, NodeStatus, ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;

    fn node(name: &str, ready: bool, addrs: &[(&str, &str)], labels: &[(&str, &str)]) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                addresses: Some(
                    addrs.iter().map(|(t, a)| NodeAddress { type_: t.to_string(), address: a.to_string() }).collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn lb(name: &str, age_secs: i64, ports: &[(i32, &str)], class: Option<&str>) -> Arc<Service> {
        let ts = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + age_secs).unwrap();
        Arc::new(Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                creation_timestamp: Some(Time(ts)),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                load_balancer_class: class.map(str::to_string),
                ports: Some(
                    ports
                        .iter()
                        .map(|(p, proto)| ServicePort {
                            port: *p,
                            protocol: Some(proto.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn ips(ingress: &[LoadBalancerIngress]) -> Vec<String> {
        ingress_ips(ingress)
    }

    #[test]
    fn ingress_prefers_external_addresses_sorted_by_family() {
        let a = node("a", true, &[("InternalIP", "10.0.0.9"), ("Hostname", "a")], &[]);
        let b = node("b", true, &[("InternalIP", "10.0.0.10")], &[]);
        let svc = lb("web", 0, &[(80, "TCP")], None);
        let got = ingress_for(&svc, &[&b, &a]);
        assert_eq!(ips(&got), vec!["10.0.0.9", "10.0.0.10"]);
        assert!(got.iter().all(|i| i.ip_mode.as_deref() == Some("VIP")));
        let c = node(
            "c",
            true,
            &[("InternalIP", "10.0.0.11"), ("ExternalIP", "192.0.2.1"), ("ExternalIP", "fd00::1")],
            &[],
        );
        assert_eq!(ips(&ingress_for(&svc, &[&a, &c])), vec!["192.0.2.1"]);
        let mut dual = (*svc).clone();
        dual.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
        assert_eq!(ips(&ingress_for(&dual, &[&c])), vec!["fd00::1", "192.0.2.1"]);
        assert!(ingress_for(&svc, &[]).is_empty());
    }

    #[test]
    fn eligibility_follows_readiness_and_the_enablelb_label() {
        let nodes = vec![
            node("a", true, &[], &[]),
            node("b", false, &[], &[]),
            node("c", true, &[], &[(ENABLE_LB_LABEL, "false")]),
        ];
        let svc = lb("web", 0, &[(80, "TCP")], None);
        let names = |ns: Vec<&Arc<Node>>| ns.iter().map(|n| n.metadata.name.clone().unwrap()).collect::<Vec<_>>();
        // A label on any node turns selection on: c says false, a has none.
        assert!(names(eligible_nodes(&svc, &nodes)).is_empty());
        let nodes = vec![
            node("a", true, &[], &[(ENABLE_LB_LABEL, "true"), (LB_POOL_LABEL, "x")]),
            node("b", false, &[], &[(ENABLE_LB_LABEL, "true")]),
            node("c", true, &[], &[(ENABLE_LB_LABEL, "true"), (LB_POOL_LABEL, "y")]),
        ];
        assert_eq!(names(eligible_nodes(&svc, &nodes)), vec!["a", "c"]);
        let mut pooled = (*svc).clone();
        pooled.metadata.labels = Some([(LB_POOL_LABEL.to_string(), "y".to_string())].into());
        assert_eq!(names(eligible_nodes(&pooled, &nodes)), vec!["c"]);
        // No label anywhere: every ready node.
        let nodes = vec![node("a", true, &[], &[]), node("b", false, &[], &[])];
        assert_eq!(names(eligible_nodes(&svc, &nodes)), vec!["a"]);
    }

    #[test]
    fn the_older_service_keeps_a_clashing_port() {
        let nodes = vec![node("a", true, &[], &[]), node("b", true, &[], &[])];
        let first = lb("first", 0, &[(80, "TCP")], None);
        let second = lb("second", 10, &[(80, "TCP"), (443, "TCP")], None);
        let udp = lb("udp", 20, &[(80, "UDP")], None);
        let other_class = lb("other", -5, &[(80, "TCP")], Some("example.com/lb"));
        let ours_by_class = lb("named", 30, &[(8080, "TCP")], Some(LOAD_BALANCER_CLASS));
        let services = vec![second.clone(), udp, first, other_class, ours_by_class];
        let placed = place(&services, &nodes);
        let at = |n: &str| placed.get(&("default".to_string(), n.to_string())).cloned();
        assert_eq!(at("first").unwrap().nodes, vec!["a", "b"]);
        let second = at("second").unwrap();
        assert!(second.nodes.is_empty());
        assert_eq!(second.conflicts.len(), 2);
        assert_eq!(second.conflicts[0].holder, ("default".to_string(), "first".to_string()));
        assert!(second.conflicts[0].to_string().contains("port 80/TCP"));
        assert_eq!(at("udp").unwrap().nodes, vec!["a", "b"]);
        assert_eq!(at("named").unwrap().nodes, vec!["a", "b"]);
        assert!(at("other").is_none());
    }
}

//! ClusterIP and NodePort allocation for Services. Addresses in use are
//! read from the stored Services and IPAddresses (an address someone holds
//! with an IPAddress of their own is taken too), and allocation plus the
//! write happen under one lock (the Service resource's `BeginWrite`), so
//! two Services never get the same address. ClusterIPs come from the
//! ServiceCIDRs that are not being deleted (MultiCIDRServiceAllocator, on
//! in upstream v1.33): `--service-cidr` (the `kubernetes` ServiceCIDR)
//! first, then the others by name. `controlplane::service_ip_repair` writes the
//! IPAddress objects of what is allocated here.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use futures_util::future::BoxFuture;
use serde_json::Value;

use super::resource::{BeginWrite, WriteGuard};
use super::status::{ApiError, ApiResult};
use super::storage::Storage;
use crate::net::{Ipv4Net, NthAddr};

pub const NODE_PORT_RANGE: std::ops::RangeInclusive<i64> = 30000..=32767;

pub struct ServiceAllocator {
    pub cidr: Ipv4Net,
    storage: Storage,
    lock: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// Where ServiceCIDR objects are stored.
pub const SERVICE_CIDRS_PREFIX: &str = "/registry/networking.k8s.io/servicecidrs/";
/// Where IPAddress objects are stored.
pub const IP_ADDRESSES_PREFIX: &str = "/registry/networking.k8s.io/ipaddresses/";

/// The IPv4 ranges of a ServiceCIDR object (ferrok is single-stack IPv4),
/// /8 to /30 as `--service-cidr`.
pub fn service_cidr_ranges(obj: &Value) -> Vec<Ipv4Net> {
    let cidrs = obj.pointer("/spec/cidrs").and_then(Value::as_array);
    cidrs.into_iter().flatten().filter_map(|c| crate::net::parse_cluster_range(c.as_str()?).ok()).collect()
}

/// What Services (and IPAddresses) already hold.
struct InUse {
    ips: HashSet<Ipv4Addr>,
    ports: HashSet<i64>,
}

impl ServiceAllocator {
    pub fn new(cidr: Ipv4Net, storage: Storage) -> Self {
        ServiceAllocator { cidr, storage, lock: Default::default() }
    }

    async fn in_use(&self, except_key: Option<&str>) -> ApiResult<InUse> {
        let mut used = InUse { ips: HashSet::new(), ports: HashSet::new() };
        let prefix = "/registry/services/";
        let (services, _) = self.storage.list_all(prefix).await?;
        for s in &services {
            let ns = s.object.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
            let name = s.object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
            if except_key == Some(&format!("{prefix}{ns}/{name}")[..]) {
                continue;
            }
            if let Some(ips) = s.object.pointer("/spec/clusterIPs").and_then(Value::as_array) {
                used.ips.extend(ips.iter().filter_map(|v| v.as_str()?.parse::<Ipv4Addr>().ok()));
            }
            if let Some(ip) = s.object.pointer("/spec/clusterIP").and_then(Value::as_str).and_then(|v| v.parse().ok()) {
                used.ips.insert(ip);
            }
            for p in s.object.pointer("/spec/ports").and_then(Value::as_array).into_iter().flatten() {
                if let Some(np) = p.get("nodePort").and_then(Value::as_i64) {
                    used.ports.insert(np);
                }
            }
            if let Some(hc) = s.object.pointer("/spec/healthCheckNodePort").and_then(Value::as_i64) {
                used.ports.insert(hc);
            }
        }
        // An address held by an IPAddress is taken, unless it is this
        // Service's own (being updated).
        let (addresses, _) = self.storage.list_all(IP_ADDRESSES_PREFIX).await?;
        let own = except_key.and_then(|k| k.strip_prefix(prefix)).and_then(|k| k.split_once('/'));
        for a in &addresses {
            let parent = |f: &str| a.object.pointer(&format!("/spec/parentRef/{f}")).and_then(Value::as_str);
            let is_own = parent("resource") == Some("services")
                && own.is_some_and(|(ns, name)| parent("namespace") == Some(ns) && parent("name") == Some(name));
            if !is_own {
                used.ips.extend(
                    a.object.pointer("/metadata/name").and_then(Value::as_str).and_then(|n| n.parse::<Ipv4Addr>().ok()),
                );
            }
        }
        Ok(used)
    }

    /// The ranges ClusterIPs come from: `--service-cidr`, then the other
    /// ServiceCIDRs not being deleted, by name.
    async fn ranges(&self) -> ApiResult<Vec<Ipv4Net>> {
        let mut ranges = vec![self.cidr];
        let (cidrs, _) = self.storage.list_all(SERVICE_CIDRS_PREFIX).await?;
        let mut others: Vec<(String, Vec<Ipv4Net>)> = cidrs
            .iter()
            .filter(|c| c.object.pointer("/metadata/deletionTimestamp").is_none())
            .map(|c| (crate::apiserver::meta::name_of(&c.object).to_string(), service_cidr_ranges(&c.object)))
            .collect();
        others.sort_by(|a, b| a.0.cmp(&b.0));
        for cidr in others.into_iter().flat_map(|(_, r)| r) {
            if !ranges.contains(&cidr) {
                ranges.push(cidr);
            }
        }
        Ok(ranges)
    }

    /// Fills in clusterIP(s) and nodePorts of a Service about to be stored;
    /// refuses addresses and ports already taken. Call under `lock`.
    async fn allocate(&self, svc: &mut Value, key: &str, old: Option<&Value>) -> ApiResult<()> {
        let used = self.in_use(Some(key)).await?;
        let name = svc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        let invalid = |field: &str, msg: String| {
            ApiError::invalid("", "Service", &name, vec![super::status::Cause::invalid(field, msg)])
        };
        let ty = svc.pointer("/spec/type").and_then(Value::as_str).unwrap_or("ClusterIP").to_string();
        if ty == "ExternalName" {
            if let Some(old) = old {
                drop_type_dependent_fields(svc, old);
            }
            return Ok(());
        }
        let old_ip = old.and_then(|o| o.pointer("/spec/clusterIP")).and_then(Value::as_str).map(str::to_string);
        let requested = svc.pointer("/spec/clusterIP").and_then(Value::as_str).unwrap_or_default().to_string();
        let ip = match (requested.as_str(), &old_ip) {
            ("None", _) => "None".to_string(),
            ("", Some(old)) => old.clone(),
            ("", None) => {
                let ranges = self.ranges().await?;
                let found = ranges.iter().enumerate().find_map(|(i, range)| {
                    // `--service-cidr` keeps its first address (the `kubernetes`
                    // Service's) and its tenth (the cluster DNS's) for them.
                    let primary = i == 0;
                    free_address(*range, &name, &used.ips, if primary { &[1, 10] } else { &[] })
                });
                found
                    .ok_or_else(|| {
                        invalid(
                            "spec.clusterIPs",
                            "Internal error: failed to allocate a serviceIP: range is full".into(),
                        )
                    })?
                    .to_string()
            }
            (req, old) => {
                let parsed: Ipv4Addr = req.parse().map_err(|_| {
                    invalid(
                        "spec.clusterIPs[0]",
                        format!(
                            "Invalid value: {req:?}: must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
                        ),
                    )
                })?;
                if old.as_deref().is_some_and(|o| o != req) {
                    return Err(invalid(
                        "spec.clusterIPs[0]",
                        format!("Invalid value: {:?}: may not change once set", vec![req]),
                    ));
                }
                let ranges = if old.is_none() { self.ranges().await? } else { vec![self.cidr] };
                if old.is_none() && !ranges.iter().any(|r| r.contains(&parsed)) {
                    let valid = ranges.iter().map(Ipv4Net::to_string).collect::<Vec<_>>().join(",");
                    return Err(invalid("spec.clusterIPs", format!("Invalid value: {:?}: failed to allocate IP {req}: the provided IP ({req}) is not in the valid range. The range of valid IPs is {valid}", vec![req])));
                }
                if old.is_none() && used.ips.contains(&parsed) {
                    return Err(invalid(
                        "spec.clusterIPs",
                        format!(
                            "Invalid value: {:?}: failed to allocate IP {req}: provided IP is already allocated",
                            vec![req]
                        ),
                    ));
                }
                req.to_string()
            }
        };
        svc["spec"]["clusterIP"] = Value::String(ip.clone());
        svc["spec"]["clusterIPs"] = serde_json::json!([ip]);
        let mut taken = used.ports.clone();
        // A LoadBalancer gets node ports unless `allocateLoadBalancerNodePorts: false`
        // (then only those asked for); types other than NodePort and
        // LoadBalancer have none: those left from the old type are dropped.
        let allocate_node_ports = ty == "NodePort"
            || (ty == "LoadBalancer"
                && svc.pointer("/spec/allocateLoadBalancerNodePorts").and_then(Value::as_bool) != Some(false));
        let may_have_node_ports = ty == "NodePort" || ty == "LoadBalancer";
        let old_ports: Vec<Value> =
            old.and_then(|o| o.pointer("/spec/ports")).and_then(Value::as_array).cloned().unwrap_or_default();
        if let Some(Value::Array(ports)) = svc.pointer_mut("/spec/ports") {
            for (i, p) in ports.iter_mut().enumerate() {
                let want = p.get("nodePort").and_then(Value::as_i64).unwrap_or(0);
                let kept = old_ports
                    .iter()
                    .find(|o| o.get("port") == p.get("port"))
                    .and_then(|o| o.get("nodePort"))
                    .and_then(Value::as_i64);
                if !may_have_node_ports {
                    if want > 0 && kept != Some(want) {
                        return Err(invalid(
                            &format!("spec.ports[{i}].nodePort"),
                            format!("Forbidden: may not be used when `type` is '{ty}'"),
                        ));
                    }
                    if let Some(obj) = p.as_object_mut() {
                        obj.remove("nodePort");
                    }
                    continue;
                }
                let np = if want > 0 {
                    if !NODE_PORT_RANGE.contains(&want) {
                        return Err(invalid(&format!("spec.ports[{i}].nodePort"), format!("Invalid value: {want}: provided port is not in the valid range. The range of valid ports is 30000-32767")));
                    }
                    if taken.contains(&want) && kept != Some(want) {
                        return Err(invalid(
                            &format!("spec.ports[{i}].nodePort"),
                            format!("Invalid value: {want}: provided port is already allocated"),
                        ));
                    }
                    want
                } else if let Some(k) = kept.filter(|_| allocate_node_ports) {
                    k
                } else if allocate_node_ports {
                    free_node_port(&taken).ok_or_else(|| {
                        invalid(&format!("spec.ports[{i}].nodePort"), "Internal error: range is full".into())
                    })?
                } else {
                    continue;
                };
                taken.insert(np);
                p["nodePort"] = Value::from(np);
            }
        }
        // `healthCheckNodePort`: for a LoadBalancer with externalTrafficPolicy Local only.
        let wants_health_check =
            ty == "LoadBalancer" && svc.pointer("/spec/externalTrafficPolicy").and_then(Value::as_str) == Some("Local");
        let requested_hc = svc.pointer("/spec/healthCheckNodePort").and_then(Value::as_i64).unwrap_or(0);
        let old_hc = old.and_then(|o| o.pointer("/spec/healthCheckNodePort")).and_then(Value::as_i64);
        if wants_health_check {
            let hc = if requested_hc > 0 {
                if !NODE_PORT_RANGE.contains(&requested_hc) {
                    return Err(invalid("spec.healthCheckNodePort", format!("Invalid value: {requested_hc}: provided port is not in the valid range. The range of valid ports is 30000-32767")));
                }
                if taken.contains(&requested_hc) && old_hc != Some(requested_hc) {
                    return Err(invalid(
                        "spec.healthCheckNodePort",
                        format!("Invalid value: {requested_hc}: provided port is already allocated"),
                    ));
                }
                requested_hc
            } else if let Some(k) = old_hc {
                k
            } else {
                free_node_port(&taken)
                    .ok_or_else(|| invalid("spec.healthCheckNodePort", "Internal error: range is full".into()))?
            };
            svc["spec"]["healthCheckNodePort"] = Value::from(hc);
        } else if requested_hc > 0 {
            if old_hc != Some(requested_hc) {
                return Err(invalid("spec.healthCheckNodePort", format!("Invalid value: {requested_hc}: may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'")));
            }
            if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
                spec.remove("healthCheckNodePort");
            }
        }
        Ok(())
    }
}

/// A free address of `range` (neither its network nor its broadcast
/// address, nor the offsets `reserved`), from a point derived from the
/// Service's name so that allocations spread.
fn free_address(range: Ipv4Net, name: &str, used: &HashSet<Ipv4Addr>, reserved: &[u32]) -> Option<Ipv4Addr> {
    // The size less the network and broadcast addresses: the host mask less one.
    let hosts = range.hostmask().to_bits().saturating_sub(1).max(1);
    let start = name.bytes().fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32)) % hosts;
    (0..hosts)
        .map(|i| 1 + (start + i) % hosts)
        .filter(|n| !reserved.contains(n))
        .map(|n| range.nth(n))
        .find(|ip| !used.contains(ip))
}

/// A free node port, from a random point of the range.
fn free_node_port(taken: &HashSet<i64>) -> Option<i64> {
    let span = NODE_PORT_RANGE.end() - NODE_PORT_RANGE.start() + 1;
    let seed = (crate::host::random::u64() % span as u64) as i64;
    (0..span).map(|j| NODE_PORT_RANGE.start() + (seed + j) % span).find(|c| !taken.contains(c))
}

impl BeginWrite for ServiceAllocator {
    fn begin<'a>(
        &'a self,
        svc: &'a mut Value,
        key: &'a str,
        old: Option<&'a Value>,
    ) -> BoxFuture<'a, ApiResult<WriteGuard>> {
        Box::pin(async move {
            let held = self.lock.clone().lock_owned().await;
            self.allocate(svc, key, old).await?;
            Ok(Box::new(held) as WriteGuard)
        })
    }
}

/// What a Service turned ExternalName keeps of its old type, dropped as
/// upstream's dropTypeDependentFields does: its cluster IPs, IP families,
/// node ports and traffic policies, where the update left them as they were (a value the
/// request changed is the request's, for validation to judge).
fn drop_type_dependent_fields(svc: &mut Value, old: &Value) {
    let same = |svc: &Value, field: &str| svc.pointer(field) == old.pointer(field);
    if old.pointer("/spec/clusterIP").is_some() && same(svc, "/spec/clusterIP") {
        if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
            for field in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
                spec.remove(field);
            }
        }
    }
    for field in [
        "healthCheckNodePort",
        "externalTrafficPolicy",
        "internalTrafficPolicy",
        "allocateLoadBalancerNodePorts",
        "loadBalancerClass",
    ] {
        let path = format!("/spec/{field}");
        if old.pointer(&path).is_some() && same(svc, &path) {
            if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
                spec.remove(field);
            }
        }
    }
    let old_ports = old.pointer("/spec/ports").and_then(Value::as_array).cloned().unwrap_or_default();
    if let Some(ports) = svc.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
        for p in ports {
            let kept =
                old_ports.iter().any(|o| o.get("port") == p.get("port") && o.get("nodePort") == p.get("nodePort"));
            if kept {
                if let Some(obj) = p.as_object_mut() {
                    obj.remove("nodePort");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        let parse = crate::net::parse_cluster_range;
        let c = parse("10.43.0.0/16").unwrap();
        assert_eq!(c.nth(1), Ipv4Addr::new(10, 43, 0, 1));
        assert!(c.contains(&Ipv4Addr::new(10, 43, 200, 1)));
        assert!(!c.contains(&Ipv4Addr::new(10, 44, 0, 1)));
        assert!(parse("10.43.0.0").is_err());
    }

    #[test]
    fn a_service_turned_external_name_drops_what_its_old_type_had() {
        let old = serde_json::json!({"spec": {"type": "NodePort", "clusterIP": "10.43.0.7", "clusterIPs": ["10.43.0.7"],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
            "ports": [{"port": 80, "nodePort": 30080}, {"port": 81, "nodePort": 30081}]}});
        let mut new = old.clone();
        new["spec"]["type"] = "ExternalName".into();
        new["spec"]["externalName"] = "example.com".into();
        new["spec"]["ports"][1]["nodePort"] = 30099.into();
        drop_type_dependent_fields(&mut new, &old);
        assert!(new["spec"].get("clusterIP").is_none() && new["spec"].get("clusterIPs").is_none(), "{new}");
        assert!(new["spec"].get("ipFamilies").is_none() && new["spec"].get("ipFamilyPolicy").is_none(), "{new}");
        assert!(new["spec"]["ports"][0].get("nodePort").is_none(), "{new}");
        // A node port the request changed stays, for validation to judge.
        assert_eq!(new["spec"]["ports"][1]["nodePort"], 30099);
        // A cluster IP the request changed stays too.
        let mut changed = old.clone();
        changed["spec"]["type"] = "ExternalName".into();
        changed["spec"]["clusterIP"] = "10.43.0.9".into();
        drop_type_dependent_fields(&mut changed, &old);
        assert_eq!(changed["spec"]["clusterIP"], "10.43.0.9");
    }
}

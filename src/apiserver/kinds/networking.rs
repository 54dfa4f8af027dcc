//! Endpoints, EndpointSlices and the networking.k8s.io kinds (Ingresses,
//! IngressClasses, NetworkPolicies, IPAddresses, ServiceCIDRs): their
//! `kubectl get` columns.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::{selector_string, str_list};
use crate::apiserver::meta::{age, at, str_at};
use crate::apiserver::strategy::Hooks;
use crate::apiserver::table::Column;

/// How many items a list cell shows before `+ N more...`.
const MAX_LISTED: usize = 3;

fn array<'a>(o: &'a Value, path: &[&str]) -> &'a [Value] {
    at(o, path).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default()
}

/// `list` joined by commas, then `+ N more...` when `count` items were seen.
fn with_more(list: &[String], count: usize, empty: &str) -> String {
    let shown = list.join(",");
    if count > list.len() {
        format!("{shown} + {} more...", count - list.len())
    } else if shown.is_empty() {
        empty.to_string()
    } else {
        shown
    }
}

/// `ip:port`, with IPv6 addresses in brackets.
fn host_port(ip: &str, port: i64) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// The first three addresses (with each port) of an Endpoints object.
fn format_endpoints(o: &Value) -> String {
    let subsets = array(o, &["subsets"]);
    if subsets.is_empty() {
        return "<none>".into();
    }
    let (mut list, mut count) = (Vec::new(), 0);
    for ss in subsets {
        let ips: Vec<&str> = array(ss, &["addresses"]).iter().map(|a| str_at(a, &["ip"]).unwrap_or_default()).collect();
        let ports = array(ss, &["ports"]);
        if ports.is_empty() {
            // A headless service may have no ports.
            count += ips.len();
            list.extend(ips.iter().take(MAX_LISTED.saturating_sub(list.len())).map(|ip| ip.to_string()));
            continue;
        }
        for p in ports {
            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            count += ips.len();
            list.extend(ips.iter().take(MAX_LISTED.saturating_sub(list.len())).map(|ip| host_port(ip, port)));
        }
    }
    with_more(&list, count, "")
}

pub fn endpoints_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("Endpoints", "string", 0), Column::age()],
        cells: |o| vec![json!(format_endpoints(o)), json!(age(o))],
        ..Hooks::default()
    }
}

pub fn endpointslice_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                Column::new("AddressType", "string", 0),
                Column::new("Ports", "string", 0),
                Column::new("Endpoints", "string", 0),
                Column::age(),
            ]
        },
        cells: |o| {
            let ports = array(o, &["ports"]);
            let port_list: Vec<String> = ports
                .iter()
                .take(MAX_LISTED)
                .map(|p| match (p.get("port").and_then(Value::as_i64), str_at(p, &["name"])) {
                    (Some(n), _) => n.to_string(),
                    (None, Some(name)) => name.to_string(),
                    (None, None) => "*".to_string(),
                })
                .collect();
            let addresses: Vec<&str> =
                array(o, &["endpoints"]).iter().flat_map(|e| str_list(e, &["addresses"])).collect();
            let address_list: Vec<String> = addresses.iter().take(MAX_LISTED).map(|a| a.to_string()).collect();
            vec![
                json!(str_at(o, &["addressType"]).unwrap_or_default()),
                json!(with_more(&port_list, ports.len(), "<unset>")),
                json!(with_more(&address_list, addresses.len(), "<unset>")),
                json!(age(o)),
            ]
        },
        ..Hooks::default()
    }
}

/// The first three rules' hosts, `*` when no rule names one.
fn format_hosts(o: &Value) -> String {
    let rules = array(o, &["spec", "rules"]);
    let mut list = Vec::new();
    let mut more = false;
    for rule in rules {
        // Upstream stops at the fourth rule, counting every rule as "more".
        more |= list.len() == MAX_LISTED;
        match str_at(rule, &["host"]) {
            Some(host) if !more && !host.is_empty() => list.push(host),
            _ => {}
        }
    }
    if list.is_empty() {
        return "*".into();
    }
    let shown = list.join(",");
    if more {
        format!("{shown} + {} more...", rules.len() - MAX_LISTED)
    } else {
        shown
    }
}

pub fn ingress_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                Column::new("Class", "string", 0),
                Column::new("Hosts", "string", 0),
                Column::new("Address", "string", 0),
                Column::new("Ports", "string", 0),
                Column::age(),
            ]
        },
        cells: |o| {
            // The load balancer's addresses, sorted and without duplicates.
            let address: BTreeSet<&str> = array(o, &["status", "loadBalancer", "ingress"])
                .iter()
                .filter_map(|i| {
                    str_at(i, &["ip"])
                        .filter(|s| !s.is_empty())
                        .or_else(|| str_at(i, &["hostname"]).filter(|s| !s.is_empty()))
                })
                .collect();
            let tls = !array(o, &["spec", "tls"]).is_empty();
            vec![
                json!(str_at(o, &["spec", "ingressClassName"]).unwrap_or("<none>")),
                json!(format_hosts(o)),
                json!(address.into_iter().collect::<Vec<_>>().join(",")),
                json!(if tls { "80, 443" } else { "80" }),
                json!(age(o)),
            ]
        },
        ..Hooks::default()
    }
}

pub fn ingressclass_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("Controller", "string", 0), Column::new("Parameters", "string", 0), Column::age()],
        cells: |o| {
            let parameters = match at(o, &["spec", "parameters"]) {
                Some(p) => {
                    let kind = str_at(p, &["kind"]).unwrap_or_default();
                    let name = str_at(p, &["name"]).unwrap_or_default();
                    match str_at(p, &["apiGroup"]) {
                        Some(group) => format!("{kind}.{group}/{name}"),
                        None => format!("{kind}/{name}"),
                    }
                }
                None => "<none>".into(),
            };
            vec![json!(str_at(o, &["spec", "controller"]).unwrap_or_default()), json!(parameters), json!(age(o))]
        },
        ..Hooks::default()
    }
}

pub fn networkpolicy_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("Pod-Selector", "string", 0), Column::age()],
        cells: |o| vec![json!(selector_string(at(o, &["spec", "podSelector"]))), json!(age(o))],
        ..Hooks::default()
    }
}

/// Upstream defines no AGE column for IP addresses.
pub fn ipaddress_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("ParentRef", "string", 0)],
        cells: |o| {
            let parent = match at(o, &["spec", "parentRef"]) {
                Some(r) => {
                    let resource = str_at(r, &["resource"]).unwrap_or_default();
                    let mut s = match str_at(r, &["group"]).filter(|g| !g.is_empty()) {
                        Some(group) => format!("{resource}.{group}"),
                        None => resource.to_string(),
                    }
                    .to_lowercase();
                    if let Some(ns) = str_at(r, &["namespace"]).filter(|ns| !ns.is_empty()) {
                        s = format!("{s}/{ns}");
                    }
                    format!("{s}/{}", str_at(r, &["name"]).unwrap_or_default())
                }
                None => "<none>".into(),
            };
            vec![json!(parent)]
        },
        ..Hooks::default()
    }
}

pub fn servicecidr_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("CIDRs", "string", 0), Column::age()],
        cells: |o| vec![json!(str_list(o, &["spec", "cidrs"]).join(",")), json!(age(o))],
        ..Hooks::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_list_three_then_more() {
        assert_eq!(format_endpoints(&json!({})), "<none>");
        let ep = json!({"subsets": [
            {"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}], "ports": [{"port": 80}, {"port": 443}]},
            {"addresses": [{"ip": "fd00::1"}]}
        ]});
        assert_eq!(format_endpoints(&ep), "10.0.0.1:80,10.0.0.2:80,10.0.0.1:443 + 2 more...");
        let v6 = json!({"subsets": [{"addresses": [{"ip": "fd00::1"}], "ports": [{"port": 53}]}]});
        assert_eq!(format_endpoints(&v6), "[fd00::1]:53");
    }

    #[test]
    fn endpointslice_and_ingress_cells() {
        let slice = json!({"addressType": "IPv4", "ports": [{"port": 80}, {"name": "dns"}, {}, {"port": 9}],
                           "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]}]});
        let cells = (endpointslice_hooks().cells)(&slice);
        assert_eq!(&cells[..3], &[json!("IPv4"), json!("80,dns,* + 1 more..."), json!("10.0.0.1,10.0.0.2")]);
        assert_eq!((endpointslice_hooks().cells)(&json!({}))[1], json!("<unset>"));

        let ing = json!({"spec": {"ingressClassName": "nginx", "tls": [{"hosts": ["a"]}],
                                  "rules": [{"host": "a"}, {}, {"host": "b"}, {"host": "c"}, {"host": "d"}]},
                         "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.9"}, {"hostname": "lb"}, {"ip": "10.0.0.9"}]}}});
        let cells = (ingress_hooks().cells)(&ing);
        assert_eq!(&cells[..4], &[json!("nginx"), json!("a,b,c + 2 more..."), json!("10.0.0.9,lb"), json!("80, 443")]);
        assert_eq!(
            (ingress_hooks().cells)(&json!({"spec": {}}))[..4],
            [json!("<none>"), json!("*"), json!(""), json!("80")]
        );
    }

    #[test]
    fn ipaddress_parent() {
        let ip = json!({"spec": {"parentRef": {"group": "", "resource": "services", "namespace": "default", "name": "kubernetes"}}});
        assert_eq!((ipaddress_hooks().cells)(&ip), vec![json!("services/default/kubernetes")]);
        let gw = json!({"spec": {"parentRef": {"group": "gateway.networking.k8s.io", "resource": "Gateways", "name": "gw"}}});
        assert_eq!((ipaddress_hooks().cells)(&gw), vec![json!("gateways.gateway.networking.k8s.io/gw")]);
    }
}

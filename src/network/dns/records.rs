//! The cluster's DNS names, as CoreDNS' kubernetes plugin answers them,
//! indexed from Services and EndpointSlices so that a query is one hash
//! lookup. Each Service owns the names it makes; a change to the Service or
//! one of its slices rebuilds that Service's names only.
//!
//! - `svc.ns.svc.<domain>`: A/AAAA of the cluster IPs; of each ready
//!   endpoint for a headless Service; a CNAME for an ExternalName one.
//! - `_port._proto.svc.ns.svc.<domain>`: SRV per named port (headless: one
//!   per ready endpoint, its target the endpoint's own name); the Service
//!   name itself answers SRV with every named port.
//! - `endpoint.svc.ns.svc.<domain>` (headless only): the endpoint's
//!   `hostname` (StatefulSet pods, `hostname.subdomain`), else its address
//!   with dashes.
//! - PTR for cluster IPs and headless endpoint addresses.
//! - `a-b-c-d.ns.pod.<domain>` (`pods insecure`): the address in the name.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::views::{service_view, slice_view, ServiceKind, ServiceView, SliceView};

/// The TTL of every cluster record (CoreDNS' default `ttl 5`).
pub const TTL: u32 = 5;

/// A Service's namespace and name.
pub type ServiceKey = (String, String);

/// What a name holds, ready to be copied into an answer.
#[derive(Debug, Default, Clone)]
pub struct NameRecords {
    pub a: Vec<Record>,
    pub aaaa: Vec<Record>,
    pub srv: Vec<Record>,
    /// A and AAAA records of the SRV targets (the additional section).
    pub srv_targets: Vec<Record>,
    pub cname: Option<Record>,
}

impl NameRecords {
    fn is_empty(&self) -> bool {
        self.a.is_empty() && self.aaaa.is_empty() && self.srv.is_empty() && self.cname.is_none()
    }
}

/// The answer for a name inside the cluster domain.
#[derive(Debug, PartialEq)]
pub enum Found {
    /// Records of the asked type; `chase` is a CNAME target whose own
    /// records of that type belong in the answer too.
    Answer {
        answers: Vec<Record>,
        additionals: Vec<Record>,
        chase: Option<Name>,
    },
    /// The name exists without records of that type.
    NoData,
    NxDomain,
}

/// The index of cluster names.
#[derive(Debug)]
pub struct RecordIndex {
    /// The cluster domain, lower case, no trailing dot.
    domain: String,
    services: HashMap<ServiceKey, ServiceView>,
    /// Slices by (namespace, slice name).
    slices: HashMap<(String, String), SliceView>,
    slices_of: HashMap<ServiceKey, BTreeSet<String>>,
    names: HashMap<String, NameRecords>,
    ptr: HashMap<IpAddr, Vec<(ServiceKey, Record)>>,
    /// The names and reverse entries each Service made.
    owned: HashMap<ServiceKey, (Vec<String>, Vec<IpAddr>)>,
    /// Services per namespace (`ns.svc.<domain>` exists while it has one).
    namespaces: HashMap<String, usize>,
}

fn fqdn(name: &str) -> Option<Name> {
    let mut n = Name::from_ascii(name).ok()?;
    n.set_fqdn(true);
    Some(n)
}

fn address_record(name: &Name, ip: IpAddr) -> Record {
    let data = match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    };
    Record::from_rdata(name.clone(), TTL, data)
}

/// `10.42.0.5` → `10-42-0-5`, `fd00::1` → `fd00--1` (CoreDNS' endpoint names).
pub fn dashed(ip: IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

/// The address a dashed pod or endpoint label stands for.
pub fn undashed(label: &str) -> Option<IpAddr> {
    if label.matches('-').count() == 3 {
        if let Ok(v4) = label.replace('-', ".").parse::<Ipv4Addr>() {
            return Some(IpAddr::V4(v4));
        }
    }
    label.replace('-', ":").parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<(String, String)> {
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

impl RecordIndex {
    pub fn new(cluster_domain: &str) -> RecordIndex {
        RecordIndex {
            domain: cluster_domain.trim_end_matches('.').to_ascii_lowercase(),
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_of: HashMap::new(),
            names: HashMap::new(),
            ptr: HashMap::new(),
            owned: HashMap::new(),
            namespaces: HashMap::new(),
        }
    }

    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// Adds or updates a Service.
    pub fn apply_service(&mut self, svc: &Service) {
        let Some(key) = key_of(&svc.metadata) else { return };
        let view = service_view(svc);
        if self.services.get(&key) == Some(&view) {
            return;
        }
        if self.services.insert(key.clone(), view).is_none() {
            *self.namespaces.entry(key.0.clone()).or_default() += 1;
        }
        self.rebuild(&key);
    }

    pub fn delete_service(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        if self.services.remove(&key).is_some() {
            if let Some(n) = self.namespaces.get_mut(namespace) {
                *n -= 1;
                if *n == 0 {
                    self.namespaces.remove(namespace);
                }
            }
        }
        self.rebuild(&key);
    }

    /// Keeps only the Services in `keep` (after a relist).
    pub fn retain_services(&mut self, keep: &BTreeSet<ServiceKey>) {
        let gone: Vec<ServiceKey> = self.services.keys().filter(|k| !keep.contains(*k)).cloned().collect();
        for (ns, name) in gone {
            self.delete_service(&ns, &name);
        }
    }

    /// Adds or updates an EndpointSlice.
    pub fn apply_slice(&mut self, slice: &EndpointSlice) {
        let Some((ns, name)) = key_of(&slice.metadata) else { return };
        let view = slice_view(slice);
        let slice_key = (ns.clone(), name.clone());
        let old = self.slices.get(&slice_key);
        if old == view.as_ref() {
            return;
        }
        let old_service = old.map(|o| o.service.clone());
        self.delete_slice(&ns, &name);
        if let Some(old) = old_service {
            self.rebuild(&(ns.clone(), old));
        }
        let Some(view) = view else { return };
        let service = (ns.clone(), view.service.clone());
        self.slices.insert(slice_key, view);
        self.slices_of.entry(service.clone()).or_default().insert(name);
        self.rebuild(&service);
    }

    pub fn delete_slice(&mut self, namespace: &str, name: &str) {
        let Some(old) = self.slices.remove(&(namespace.to_string(), name.to_string())) else { return };
        let service = (namespace.to_string(), old.service);
        if let Some(set) = self.slices_of.get_mut(&service) {
            set.remove(name);
            if set.is_empty() {
                self.slices_of.remove(&service);
            }
        }
        self.rebuild(&service);
    }

    /// Keeps only the slices in `keep` (after a relist).
    pub fn retain_slices(&mut self, keep: &BTreeSet<(String, String)>) {
        let gone: Vec<(String, String)> = self.slices.keys().filter(|k| !keep.contains(*k)).cloned().collect();
        for (ns, name) in gone {
            self.delete_slice(&ns, &name);
        }
    }

    fn rebuild(&mut self, key: &ServiceKey) {
        if let Some((names, ips)) = self.owned.remove(key) {
            for n in names {
                self.names.remove(&n);
            }
            for ip in ips {
                if let Some(list) = self.ptr.get_mut(&ip) {
                    list.retain(|(owner, _)| owner != key);
                    if list.is_empty() {
                        self.ptr.remove(&ip);
                    }
                }
            }
        }
        let Some(svc) = self.services.get(key) else { return };
        let base = format!("{}.{}.svc.{}", key.1, key.0, self.domain);
        let Some(base_name) = fqdn(&base) else { return };
        let mut made: BTreeMap<String, NameRecords> = BTreeMap::new();
        let mut ptrs: Vec<(IpAddr, Record)> = Vec::new();
        let srv_of = |target: &Name, port: u16, weight: u16| {
            Record::from_rdata(Name::root(), TTL, RData::SRV(SRV::new(0, weight, port, target.clone())))
        };
        match &svc.kind {
            ServiceKind::ExternalName(target) => {
                if let Some(t) = fqdn(target) {
                    made.entry(base.clone()).or_default().cname =
                        Some(Record::from_rdata(base_name.clone(), TTL, RData::CNAME(CNAME(t))));
                }
            }
            ServiceKind::Cluster(ips) => {
                let entry = made.entry(base.clone()).or_default();
                for ip in ips {
                    let r = address_record(&base_name, *ip);
                    match ip {
                        IpAddr::V4(_) => entry.a.push(r.clone()),
                        IpAddr::V6(_) => entry.aaaa.push(r.clone()),
                    }
                    entry.srv_targets.push(r);
                    ptrs.push((*ip, Record::from_rdata(Name::root(), TTL, RData::PTR(PTR(base_name.clone())))));
                }
                let targets = entry.srv_targets.clone();
                for (port_name, proto, port) in &svc.ports {
                    let srv = srv_of(&base_name, *port, 100);
                    made.entry(base.clone()).or_default().srv.push(srv.clone());
                    let e = made.entry(format!("_{port_name}._{proto}.{base}")).or_default();
                    e.srv.push(srv);
                    e.srv_targets.extend(targets.iter().cloned());
                }
            }
            ServiceKind::Headless => {
                let slices: Vec<&SliceView> = self
                    .slices_of
                    .get(key)
                    .into_iter()
                    .flatten()
                    .filter_map(|s| self.slices.get(&(key.0.clone(), s.clone())))
                    .collect();
                // One SRV per endpoint and port; weights share 100 among them.
                let mut srv: BTreeMap<String, Vec<(Name, u16, Vec<Record>)>> = BTreeMap::new();
                for slice in slices {
                    for ep in &slice.endpoints {
                        for ip in &ep.addresses {
                            let label = ep.hostname.clone().unwrap_or_else(|| dashed(*ip));
                            let ep_text = format!("{label}.{base}");
                            let Some(ep_name) = fqdn(&ep_text) else { continue };
                            let own = address_record(&ep_name, *ip);
                            for (n, r) in [(&base, address_record(&base_name, *ip)), (&ep_text, own.clone())] {
                                let e = made.entry(n.clone()).or_default();
                                match ip {
                                    IpAddr::V4(_) => e.a.push(r),
                                    IpAddr::V6(_) => e.aaaa.push(r),
                                }
                            }
                            ptrs.push((*ip, Record::from_rdata(Name::root(), TTL, RData::PTR(PTR(ep_name.clone())))));
                            for (port_name, proto, port) in &slice.ports {
                                for n in [format!("_{port_name}._{proto}.{base}"), base.clone()] {
                                    srv.entry(n).or_default().push((ep_name.clone(), *port, vec![own.clone()]));
                                }
                            }
                        }
                    }
                }
                for (n, list) in srv {
                    let weight = (100 / list.len().max(1)).max(1) as u16;
                    let e = made.entry(n).or_default();
                    for (target, port, extra) in list {
                        e.srv.push(srv_of(&target, port, weight));
                        e.srv_targets.extend(extra);
                    }
                }
            }
        }
        let mut names = Vec::new();
        for (n, mut recs) in made {
            if recs.is_empty() {
                continue;
            }
            recs.a.dedup_by(|x, y| x.data == y.data);
            recs.aaaa.dedup_by(|x, y| x.data == y.data);
            names.push(n.clone());
            self.names.insert(n, recs);
        }
        let mut ips = Vec::new();
        for (ip, rec) in ptrs {
            self.ptr.entry(ip).or_default().push((key.clone(), rec));
            ips.push(ip);
        }
        self.owned.insert(key.clone(), (names, ips));
    }

    /// Whether `name` (lower case, no trailing dot) is the cluster domain or below it.
    pub fn is_cluster_name(&self, name: &str) -> bool {
        name == self.domain
            || (name.len() > self.domain.len()
                && name.ends_with(&self.domain)
                && name.as_bytes()[name.len() - self.domain.len() - 1] == b'.')
    }

    /// Answers `qname` (as asked; `key` is it in lower case without the
    /// trailing dot) inside the cluster domain.
    pub fn lookup(&self, qname: &Name, key: &str, qtype: RecordType) -> Found {
        let answer = |records: &[Record]| -> Vec<Record> {
            records
                .iter()
                .map(|r| {
                    let mut r = r.clone();
                    r.name = qname.clone();
                    r
                })
                .collect()
        };
        if let Some(recs) = self.names.get(key) {
            let (answers, additionals) = match qtype {
                RecordType::A => (answer(&recs.a), Vec::new()),
                RecordType::AAAA => (answer(&recs.aaaa), Vec::new()),
                RecordType::SRV => (answer(&recs.srv), recs.srv_targets.clone()),
                RecordType::ANY => {
                    let mut all = answer(&recs.a);
                    all.extend(answer(&recs.aaaa));
                    all.extend(answer(&recs.srv));
                    (all, Vec::new())
                }
                _ => (Vec::new(), Vec::new()),
            };
            if !answers.is_empty() {
                return Found::Answer { answers, additionals, chase: None };
            }
            if let Some(cname) = &recs.cname {
                let chase = match &cname.data {
                    RData::CNAME(CNAME(t)) if qtype != RecordType::CNAME => Some(t.clone()),
                    _ => None,
                };
                return Found::Answer { answers: answer(std::slice::from_ref(cname)), additionals: Vec::new(), chase };
            }
            return Found::NoData;
        }
        let rest = key.strip_suffix(&self.domain).unwrap_or(key).trim_end_matches('.');
        let labels: Vec<&str> = if rest.is_empty() { Vec::new() } else { rest.split('.').collect() };
        match labels.as_slice() {
            [] | ["svc"] | ["pod"] => Found::NoData,
            [ns, "svc"] if self.namespaces.contains_key(*ns) => Found::NoData,
            // Every namespace's pod subdomain exists (`pods insecure`).
            [_, "pod"] => Found::NoData,
            // `pods insecure`: the address in the name, unchecked.
            [ip, _ns, "pod"] => match (undashed(ip), qtype) {
                (Some(ip @ IpAddr::V4(_)), RecordType::A | RecordType::ANY)
                | (Some(ip @ IpAddr::V6(_)), RecordType::AAAA | RecordType::ANY) => {
                    Found::Answer { answers: vec![address_record(qname, ip)], additionals: Vec::new(), chase: None }
                }
                (Some(_), _) => Found::NoData,
                (None, _) => Found::NxDomain,
            },
            _ => Found::NxDomain,
        }
    }

    /// PTR records for an address the cluster knows (cluster IPs and
    /// headless endpoints), owned by `qname`.
    pub fn reverse(&self, qname: &Name, ip: IpAddr) -> Vec<Record> {
        self.ptr
            .get(&ip)
            .into_iter()
            .flatten()
            .map(|(_, r)| {
                let mut r = r.clone();
                r.name = qname.clone();
                r
            })
            .collect()
    }

    /// How many names the index holds (for logs and tests).
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn slice(v: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(v).unwrap()
    }

    fn ask(idx: &RecordIndex, name: &str, t: RecordType) -> Found {
        let q = Name::from_ascii(name).unwrap();
        idx.lookup(&q, name.trim_end_matches('.'), t)
    }

    fn data(found: &Found) -> Vec<String> {
        match found {
            Found::Answer { answers, .. } => answers.iter().map(|r| r.data.to_string()).collect(),
            other => vec![format!("{other:?}")],
        }
    }

    fn index() -> RecordIndex {
        let mut idx = RecordIndex::new("cluster.local");
        idx.apply_service(&svc(json!({"metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.43.0.20", "clusterIPs": ["10.43.0.20"],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"port": 81}]}})));
        idx.apply_service(&svc(json!({"metadata": {"name": "db", "namespace": "shop"},
            "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}})));
        idx.apply_slice(&slice(json!({"metadata": {"name": "db-abc", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "db"}},
            "addressType": "IPv4",
            "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.42.0.7"], "hostname": "db-0", "conditions": {"ready": true}},
                {"addresses": ["10.42.0.8"], "conditions": {"ready": true}},
                {"addresses": ["10.42.0.9"], "hostname": "db-2", "conditions": {"ready": false}}]})));
        idx.apply_service(&svc(json!({"metadata": {"name": "ext", "namespace": "shop"},
            "spec": {"type": "ExternalName", "externalName": "example.test."}})));
        idx
    }

    #[test]
    fn cluster_ip_services_answer_a_srv_and_ptr() {
        let idx = index();
        assert_eq!(data(&ask(&idx, "web.shop.svc.cluster.local.", RecordType::A)), ["10.43.0.20"]);
        assert_eq!(ask(&idx, "web.shop.svc.cluster.local.", RecordType::AAAA), Found::NoData);
        let srv = ask(&idx, "_http._tcp.web.shop.svc.cluster.local.", RecordType::SRV);
        assert_eq!(data(&srv), ["0 100 80 web.shop.svc.cluster.local."]);
        let Found::Answer { additionals, .. } = srv else { panic!() };
        assert_eq!(additionals[0].data.to_string(), "10.43.0.20");
        // The unnamed port has no SRV name.
        assert_eq!(ask(&idx, "_81._tcp.web.shop.svc.cluster.local.", RecordType::SRV), Found::NxDomain);
        let q = Name::from_ascii("20.0.43.10.in-addr.arpa.").unwrap();
        let ptr = idx.reverse(&q, "10.43.0.20".parse().unwrap());
        assert_eq!(ptr[0].data.to_string(), "web.shop.svc.cluster.local.");
    }

    #[test]
    fn headless_services_list_ready_endpoints_by_hostname_or_address() {
        let idx = index();
        assert_eq!(data(&ask(&idx, "db.shop.svc.cluster.local.", RecordType::A)), ["10.42.0.7", "10.42.0.8"]);
        assert_eq!(data(&ask(&idx, "db-0.db.shop.svc.cluster.local.", RecordType::A)), ["10.42.0.7"]);
        assert_eq!(data(&ask(&idx, "10-42-0-8.db.shop.svc.cluster.local.", RecordType::A)), ["10.42.0.8"]);
        assert_eq!(ask(&idx, "db-2.db.shop.svc.cluster.local.", RecordType::A), Found::NxDomain);
        let mut srv = data(&ask(&idx, "_pg._tcp.db.shop.svc.cluster.local.", RecordType::SRV));
        srv.sort();
        assert_eq!(
            srv,
            ["0 50 5432 10-42-0-8.db.shop.svc.cluster.local.", "0 50 5432 db-0.db.shop.svc.cluster.local."]
        );
        let q = Name::from_ascii("7.0.42.10.in-addr.arpa.").unwrap();
        assert_eq!(
            idx.reverse(&q, "10.42.0.7".parse().unwrap())[0].data.to_string(),
            "db-0.db.shop.svc.cluster.local."
        );
    }

    #[test]
    fn external_names_are_cnames_to_chase() {
        let idx = index();
        let found = ask(&idx, "ext.shop.svc.cluster.local.", RecordType::A);
        let Found::Answer { answers, chase, .. } = found else { panic!("{found:?}") };
        assert_eq!(answers[0].data.to_string(), "example.test.");
        assert_eq!(chase.unwrap().to_string(), "example.test.");
    }

    #[test]
    fn pods_missing_names_and_structure() {
        let idx = index();
        assert_eq!(data(&ask(&idx, "10-42-0-99.any.pod.cluster.local.", RecordType::A)), ["10.42.0.99"]);
        assert_eq!(ask(&idx, "nope.shop.svc.cluster.local.", RecordType::A), Found::NxDomain);
        assert_eq!(ask(&idx, "shop.svc.cluster.local.", RecordType::A), Found::NoData);
        assert_eq!(ask(&idx, "other.svc.cluster.local.", RecordType::A), Found::NxDomain);
        assert_eq!(ask(&idx, "cluster.local.", RecordType::A), Found::NoData);
        assert_eq!(ask(&idx, "any.pod.cluster.local.", RecordType::A), Found::NoData);
        assert_eq!(ask(&idx, "web.any.pod.cluster.local.", RecordType::A), Found::NxDomain);
        assert!(idx.is_cluster_name("a.cluster.local") && !idx.is_cluster_name("acluster.local"));
        // Case does not matter; the answer keeps the asker's case.
        let q = Name::from_ascii("WEB.Shop.svc.cluster.local.").unwrap();
        let Found::Answer { answers, .. } = idx.lookup(&q, "web.shop.svc.cluster.local", RecordType::A) else {
            panic!()
        };
        assert_eq!(answers[0].name.to_string(), "WEB.Shop.svc.cluster.local.");
    }

    #[test]
    fn changes_replace_and_deletes_remove_a_services_names() {
        let mut idx = index();
        idx.apply_slice(&slice(json!({"metadata": {"name": "db-abc", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "db"}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.42.0.10"], "hostname": "db-0"}]})));
        assert_eq!(data(&ask(&idx, "db-0.db.shop.svc.cluster.local.", RecordType::A)), ["10.42.0.10"]);
        assert_eq!(ask(&idx, "10-42-0-8.db.shop.svc.cluster.local.", RecordType::A), Found::NxDomain);
        assert!(idx.reverse(&Name::root(), "10.42.0.7".parse().unwrap()).is_empty());
        idx.delete_service("shop", "web");
        assert_eq!(ask(&idx, "web.shop.svc.cluster.local.", RecordType::A), Found::NxDomain);
        assert!(idx.reverse(&Name::root(), "10.43.0.20".parse().unwrap()).is_empty());
        idx.retain_services(&BTreeSet::new());
        idx.retain_slices(&BTreeSet::new());
        assert!(idx.is_empty());
        assert_eq!(ask(&idx, "shop.svc.cluster.local.", RecordType::A), Found::NxDomain);
    }

    #[test]
    fn dashes_round_trip() {
        for ip in ["10.42.0.5", "fd00::1"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(undashed(&dashed(ip)), Some(ip));
        }
        assert_eq!(undashed("web"), None);
    }
}

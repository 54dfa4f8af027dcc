//! What a query gets: names in the cluster domain (and reverse names the
//! cluster knows) from the record index, authoritatively, with the zone's
//! SOA in the authority section of NXDOMAIN and NODATA answers; everything
//! else from the cache or the host's resolvers. Answers that the index can
//! give are made without awaiting anything, so the listeners answer them
//! inline and spawn a task only for a forward.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{NS, SOA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use super::cache::{CacheKey, ResponseCache};
use super::forward::Forwarder;
use super::records::{Found, RecordIndex, TTL};
use crate::sync::RwLockExt;

/// The largest UDP answer without EDNS.
const PLAIN_UDP: usize = 512;
/// The largest UDP answer sent to an EDNS client.
const MAX_UDP: usize = 1232;
/// How many CNAMEs inside the cluster are followed.
const MAX_CHASE: usize = 8;

/// The question as the cluster index and the cache key it.
struct Question {
    query: Query,
    key: String,
}

/// A query the index could not answer: it goes upstream.
pub struct Pending {
    request: Message,
    question: Question,
}

pub struct Resolver {
    pub index: Arc<RwLock<RecordIndex>>,
    pub cache: ResponseCache,
    pub forwarder: Forwarder,
    zone: Name,
    soa: Record,
}

/// The zone's SOA, as CoreDNS makes it (its minimum is the record TTL).
fn zone_soa(zone: &Name) -> Record {
    let mname = Name::from_ascii("ns.dns").ok().and_then(|n| n.append_domain(zone).ok()).unwrap_or_else(Name::root);
    let rname = Name::from_ascii("hostmaster").ok().and_then(|n| n.append_domain(zone).ok()).unwrap_or_else(Name::root);
    let serial =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as u32).unwrap_or(1);
    Record::from_rdata(zone.clone(), TTL, RData::SOA(SOA::new(mname, rname, serial, 7200, 1800, 86400, TTL)))
}

fn lower_key(name: &Name) -> String {
    let mut s = name.to_lowercase().to_ascii();
    if s.ends_with('.') && s.len() > 1 {
        s.pop();
    }
    s
}

fn response_to(request: &Message) -> Message {
    let mut m = Message::new(request.metadata.id, MessageType::Response, request.metadata.op_code);
    m.metadata.recursion_desired = request.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.metadata.checking_disabled = request.metadata.checking_disabled;
    m.queries = request.queries.clone();
    if request.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(MAX_UDP as u16);
        m.set_edns(edns);
    }
    m
}

/// The largest UDP answer `request`'s sender takes.
pub fn udp_limit(request: &Message) -> usize {
    match request.edns.as_ref() {
        Some(e) => usize::from(e.max_payload()).clamp(PLAIN_UDP, MAX_UDP),
        None => PLAIN_UDP,
    }
}

/// Encodes `response` for the wire; over UDP (`udp_limit`) it is truncated
/// (TC set, records dropped) when longer than the client takes.
pub fn encode(response: &Message, udp_limit: Option<usize>) -> Option<Vec<u8>> {
    let bytes = response.to_vec().ok()?;
    match udp_limit {
        Some(limit) if bytes.len() > limit => response.truncate().to_vec().ok(),
        _ => Some(bytes),
    }
}

/// The answer to bytes that are not a usable query (FORMERR), when they
/// at least carry an id.
pub fn malformed(bytes: &[u8]) -> Option<Vec<u8>> {
    if bytes.len() < 12 {
        return None;
    }
    let id = u16::from_be_bytes([bytes[0], bytes[1]]);
    Message::error_msg(id, OpCode::Query, ResponseCode::FormErr).to_vec().ok()
}

impl Resolver {
    pub fn new(index: Arc<RwLock<RecordIndex>>, cache: ResponseCache, forwarder: Forwarder) -> Resolver {
        let domain = index.read_locked().domain().to_string();
        let mut zone = Name::from_ascii(&domain).unwrap_or_else(|_| Name::root());
        zone.set_fqdn(true);
        let soa = zone_soa(&zone);
        Resolver { index, cache, forwarder, zone, soa }
    }

    /// Answers from the index or the cache, or hands back what must be forwarded.
    pub fn answer_local(&self, request: &Message) -> Result<Message, Box<Pending>> {
        if request.metadata.message_type != MessageType::Query {
            return Ok(Message::error_msg(request.metadata.id, request.metadata.op_code, ResponseCode::FormErr));
        }
        if request.metadata.op_code != OpCode::Query {
            let mut m = response_to(request);
            m.metadata.response_code = ResponseCode::NotImp;
            return Ok(m);
        }
        let Some(query) = request.queries.first().cloned().filter(|_| request.queries.len() == 1) else {
            let mut m = response_to(request);
            m.metadata.response_code = ResponseCode::FormErr;
            return Ok(m);
        };
        let question = Question { key: lower_key(&query.name), query };
        if let Some(m) = self.authoritative(request, &question) {
            return Ok(m);
        }
        if let Some(m) = self.cached(request, &question) {
            return Ok(m);
        }
        Err(Box::new(Pending { request: request.clone(), question }))
    }

    /// The full answer: local, or forwarded (and cached).
    pub async fn answer(&self, request: &Message) -> Message {
        match self.answer_local(request) {
            Ok(m) if needs_chase(&m) => self.chase_upstream(request, m).await,
            Ok(m) => m,
            Err(p) => self.forward(*p).await,
        }
    }

    /// Asks upstream for a pending query.
    pub async fn forward(&self, pending: Pending) -> Message {
        let Pending { request, question } = pending;
        let mut m = response_to(&request);
        match self.upstream(&question, request.metadata.recursion_desired).await {
            Some(answer) => {
                m.metadata.response_code = answer.metadata.response_code;
                m.answers = answer.answers;
                m.authorities = answer.authorities;
                m.additionals = answer.additionals;
            }
            None => m.metadata.response_code = ResponseCode::ServFail,
        }
        m
    }

    fn cache_key(q: &Question) -> CacheKey {
        CacheKey { name: q.key.clone(), qtype: u16::from(q.query.query_type), qclass: u16::from(q.query.query_class) }
    }

    fn cached(&self, request: &Message, q: &Question) -> Option<Message> {
        let hit = self.cache.get(&Self::cache_key(q), Instant::now())?;
        let mut m = response_to(request);
        m.metadata.response_code = hit.response_code;
        m.answers = hit.answers;
        m.authorities = hit.authorities;
        m.additionals = hit.additionals;
        Some(m)
    }

    /// The upstream's answer for a question (through the cache).
    async fn upstream(&self, q: &Question, rd: bool) -> Option<Message> {
        let key = Self::cache_key(q);
        if let Some(hit) = self.cache.get(&key, Instant::now()) {
            let mut m = Message::new(0, MessageType::Response, OpCode::Query);
            m.metadata.response_code = hit.response_code;
            m.answers = hit.answers;
            m.authorities = hit.authorities;
            m.additionals = hit.additionals;
            return Some(m);
        }
        match self.forwarder.resolve(&q.query, rd).await {
            Ok(mut answer) => {
                answer.additionals.retain(|r| r.record_type() != RecordType::OPT);
                self.cache.insert(key, &answer, Instant::now());
                Some(answer)
            }
            Err(e) => {
                tracing::debug!(name = %q.key, error = %e, "cannot forward the query");
                None
            }
        }
    }

    /// The answer for a cluster name, or for a reverse name the cluster
    /// knows; `None` for anything to forward.
    fn authoritative(&self, request: &Message, q: &Question) -> Option<Message> {
        let qtype = q.query.query_type;
        let index = self.index.read_locked();
        if q.query.query_class != DNSClass::IN {
            return None;
        }
        if qtype == RecordType::PTR && (q.key.ends_with(".in-addr.arpa") || q.key.ends_with(".ip6.arpa")) {
            let net = q.query.name.parse_arpa_name().ok()?;
            if net.prefix_len() != net.max_prefix_len() {
                return None;
            }
            let ip: IpAddr = net.addr();
            let answers = index.reverse(&q.query.name, ip);
            if answers.is_empty() {
                // Not ours: the host's resolvers may know it (`fallthrough`).
                return None;
            }
            let mut m = response_to(request);
            m.metadata.authoritative = true;
            m.answers = answers;
            return Some(m);
        }
        if !index.is_cluster_name(&q.key) {
            return None;
        }
        let mut m = response_to(request);
        m.metadata.authoritative = true;
        if q.key == index.domain() && matches!(qtype, RecordType::SOA | RecordType::NS) {
            let mut soa = self.soa.clone();
            if qtype == RecordType::NS {
                let target = match &soa.data {
                    RData::SOA(s) => s.mname.clone(),
                    _ => Name::root(),
                };
                soa = Record::from_rdata(self.zone.clone(), TTL, RData::NS(NS(target)));
            }
            soa.name = q.query.name.clone();
            m.answers.push(soa);
            return Some(m);
        }
        let mut found = index.lookup(&q.query.name, &q.key, qtype);
        for _ in 0..MAX_CHASE {
            match found {
                Found::Answer { answers, additionals, chase } => {
                    m.answers.extend(answers);
                    m.additionals.extend(additionals);
                    let Some(target) = chase else { break };
                    let key = lower_key(&target);
                    if !index.is_cluster_name(&key) {
                        // An ExternalName out of the cluster: its target's
                        // records come from upstream (see `chase_upstream`).
                        return self.chase_pending(request, m, target);
                    }
                    found = index.lookup(&target, &key, qtype);
                }
                Found::NoData | Found::NxDomain => {
                    if m.answers.is_empty() {
                        if found == Found::NxDomain {
                            m.metadata.response_code = ResponseCode::NXDomain;
                        }
                        m.authorities.push(self.soa.clone());
                    }
                    break;
                }
            }
        }
        Some(m)
    }

    /// A CNAME out of the cluster: answered now when the target is cached;
    /// otherwise the CNAME alone (the client's resolver follows it).
    fn chase_pending(&self, request: &Message, mut m: Message, target: Name) -> Option<Message> {
        let q = q_for(&target, request);
        if let Some(hit) = self.cache.get(&Self::cache_key(&q), Instant::now()) {
            m.answers.extend(hit.answers);
        }
        Some(m)
    }

    /// Fills in an ExternalName's target from upstream when the cache did
    /// not have it (called by the listeners for answers that end in a
    /// CNAME leaving the cluster).
    pub async fn chase_upstream(&self, request: &Message, mut m: Message) -> Message {
        let Some(last) = m.answers.last() else { return m };
        let RData::CNAME(target) = &last.data else { return m };
        let target = target.0.clone();
        let q = q_for(&target, request);
        if let Some(answer) = self.upstream(&q, true).await {
            m.answers.extend(answer.answers);
        }
        m
    }
}

fn q_for(target: &Name, request: &Message) -> Question {
    let qtype = request.queries.first().map(|q| q.query_type).unwrap_or(RecordType::A);
    let query = Query::query(target.clone(), qtype);
    Question { key: lower_key(target), query }
}

/// Whether an answer stops at a CNAME out of the cluster that could be followed.
pub fn needs_chase(m: &Message) -> bool {
    let qtype = m.queries.first().map(|q| q.query_type);
    m.metadata.authoritative
        && !matches!(qtype, Some(RecordType::CNAME))
        && m.answers.last().is_some_and(|r| matches!(r.data, RData::CNAME(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resolver() -> Resolver {
        let mut idx = RecordIndex::new("cluster.local");
        idx.apply_service(
            &serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.43.0.20", "ports": [{"name": "http", "port": 80}]}}))
            .unwrap(),
        );
        Resolver::new(Arc::new(RwLock::new(idx)), ResponseCache::new(16), Forwarder::new(vec![]))
    }

    fn ask(r: &Resolver, name: &str, t: RecordType) -> Result<Message, Box<Pending>> {
        let mut m = Message::query();
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        r.answer_local(&m)
    }

    #[test]
    fn cluster_names_are_answered_with_authority() {
        let r = resolver();
        let m = ask(&r, "web.shop.svc.cluster.local.", RecordType::A).ok().unwrap();
        assert!(m.metadata.authoritative);
        assert_eq!(m.answers[0].data.to_string(), "10.43.0.20");
        let m = ask(&r, "nope.shop.svc.cluster.local.", RecordType::A).ok().unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        assert!(matches!(m.authorities[0].data, RData::SOA(_)));
        let m = ask(&r, "web.shop.svc.cluster.local.", RecordType::AAAA).ok().unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.answers.is_empty() && m.authorities.len() == 1);
        let m = ask(&r, "20.0.43.10.in-addr.arpa.", RecordType::PTR).ok().unwrap();
        assert_eq!(m.answers[0].data.to_string(), "web.shop.svc.cluster.local.");
        let m = ask(&r, "cluster.local.", RecordType::SOA).ok().unwrap();
        assert!(matches!(m.answers[0].data, RData::SOA(_)));
    }

    #[test]
    fn external_names_inside_the_cluster_are_followed_there() {
        let r = resolver();
        r.index.write().unwrap().apply_service(
            &serde_json::from_value(json!({"metadata": {"name": "alias", "namespace": "shop"},
            "spec": {"type": "ExternalName", "externalName": "web.shop.svc.cluster.local"}}))
            .unwrap(),
        );
        let m = ask(&r, "alias.shop.svc.cluster.local.", RecordType::A).ok().unwrap();
        let data: Vec<String> = m.answers.iter().map(|a| a.data.to_string()).collect();
        assert_eq!(data, ["web.shop.svc.cluster.local.", "10.43.0.20"]);
        assert!(!needs_chase(&m));
        // Out of the cluster, the answer ends at the CNAME until upstream fills it in.
        r.index.write().unwrap().apply_service(
            &serde_json::from_value(json!({"metadata": {"name": "out", "namespace": "shop"},
            "spec": {"type": "ExternalName", "externalName": "example.test"}}))
            .unwrap(),
        );
        let m = ask(&r, "out.shop.svc.cluster.local.", RecordType::A).ok().unwrap();
        assert!(needs_chase(&m));
    }

    #[test]
    fn other_names_go_upstream_and_fail_without_one() {
        let r = resolver();
        assert!(ask(&r, "example.test.", RecordType::A).is_err());
        assert!(ask(&r, "99.0.43.10.in-addr.arpa.", RecordType::PTR).is_err());
        let mut q = Message::query();
        q.add_query(Query::query(Name::from_ascii("example.test.").unwrap(), RecordType::A));
        let m = tokio_test_block(r.answer(&q));
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    }

    fn tokio_test_block<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    #[test]
    fn long_udp_answers_are_truncated() {
        let mut m = Message::new(1, MessageType::Response, OpCode::Query);
        for i in 0..100u8 {
            m.add_answer(Record::from_rdata(
                Name::from_ascii("a.test.").unwrap(),
                5,
                RData::A(hickory_proto::rr::rdata::A(std::net::Ipv4Addr::new(10, 0, 0, i))),
            ));
        }
        let bytes = encode(&m, Some(udp_limit(&Message::query()))).unwrap();
        assert!(bytes.len() <= 512);
        assert!(Message::from_vec(&bytes).unwrap().metadata.truncation);
        assert!(encode(&m, None).unwrap().len() > 512);
    }
}

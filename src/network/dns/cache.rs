//! A bounded cache of forwarded answers, as k3s' Corefile `cache 30`:
//! positive answers for their smallest TTL, at most 30 s; negative ones
//! (NXDOMAIN, NODATA) for their SOA's minimum, at most 30 s too. It holds
//! at most `capacity` answers (edge devices have little memory): when full,
//! expired answers go first, then an arbitrary one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{RData, Record, RecordType};

use crate::sync::LockExt;

/// The longest any answer is kept.
pub const MAX_TTL: Duration = Duration::from_secs(30);
/// The default number of answers kept (about 1-2 MB at most).
pub const DEFAULT_CAPACITY: usize = 4096;

/// A question: lower-case name, type and class.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
}

/// What is kept of an answer.
#[derive(Debug, Clone)]
pub struct Cached {
    pub response_code: ResponseCode,
    pub answers: Vec<Record>,
    pub authorities: Vec<Record>,
    pub additionals: Vec<Record>,
}

struct Entry {
    value: Cached,
    stored: Instant,
    expires: Instant,
}

struct Inner {
    map: HashMap<CacheKey, Entry>,
    last_sweep: Instant,
}

pub struct ResponseCache {
    inner: Mutex<Inner>,
    capacity: usize,
}

/// How long `response` may be kept, if at all.
pub fn lifetime(response: &Message) -> Option<Duration> {
    let secs = match response.metadata.response_code {
        ResponseCode::NoError if !response.answers.is_empty() => response.answers.iter().map(|r| r.ttl).min()?,
        ResponseCode::NoError | ResponseCode::NXDomain => response
            .authorities
            .iter()
            .filter_map(|r| match &r.data {
                RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
                _ => None,
            })
            .min()?,
        _ => return None,
    };
    let ttl = Duration::from_secs(u64::from(secs)).min(MAX_TTL);
    (!ttl.is_zero()).then_some(ttl)
}

impl ResponseCache {
    pub fn new(capacity: usize) -> ResponseCache {
        ResponseCache {
            inner: Mutex::new(Inner { map: HashMap::new(), last_sweep: Instant::now() }),
            capacity: capacity.max(1),
        }
    }

    /// The answer for `key` with its TTLs aged, if still fresh.
    pub fn get(&self, key: &CacheKey, now: Instant) -> Option<Cached> {
        let inner = self.inner.locked();
        let entry = inner.map.get(key)?;
        if now >= entry.expires {
            return None;
        }
        let age = now.duration_since(entry.stored).as_secs() as u32;
        let left = entry.expires.duration_since(now).as_secs().max(1) as u32;
        let mut value = entry.value.clone();
        for r in value.answers.iter_mut().chain(value.authorities.iter_mut()).chain(value.additionals.iter_mut()) {
            r.ttl = r.ttl.saturating_sub(age).clamp(1, left);
        }
        Some(value)
    }

    /// Keeps `response` for `key` if it may be cached.
    pub fn insert(&self, key: CacheKey, response: &Message, now: Instant) {
        let Some(ttl) = lifetime(response) else { return };
        let value = Cached {
            response_code: response.metadata.response_code,
            answers: response.answers.clone(),
            authorities: response.authorities.clone(),
            additionals: response.additionals.iter().filter(|r| r.record_type() != RecordType::OPT).cloned().collect(),
        };
        let mut inner = self.inner.locked();
        if inner.map.len() >= self.capacity && !inner.map.contains_key(&key) {
            // Sweeping is a pass over every entry: at most once a second.
            if now.duration_since(inner.last_sweep) >= Duration::from_secs(1) {
                inner.map.retain(|_, e| e.expires > now);
                inner.last_sweep = now;
            }
            if inner.map.len() >= self.capacity {
                if let Some(victim) = inner.map.keys().next().cloned() {
                    inner.map.remove(&victim);
                }
            }
        }
        inner.map.insert(key, Entry { value, stored: now, expires: now + ttl });
    }

    pub fn len(&self) -> usize {
        self.inner.locked().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{MessageType, OpCode};
    use hickory_proto::rr::rdata::{A, SOA};
    use hickory_proto::rr::Name;

    fn key(n: &str) -> CacheKey {
        CacheKey { name: n.into(), qtype: 1, qclass: 1 }
    }

    fn answer(ttl: u32) -> Message {
        let mut m = Message::new(1, MessageType::Response, OpCode::Query);
        m.add_answer(Record::from_rdata(
            Name::from_ascii("a.test.").unwrap(),
            ttl,
            RData::A(A(std::net::Ipv4Addr::new(192, 0, 2, 1))),
        ));
        m
    }

    fn negative(code: ResponseCode, soa_ttl: u32, minimum: u32) -> Message {
        let mut m = Message::new(1, MessageType::Response, OpCode::Query);
        m.metadata.response_code = code;
        let soa = SOA::new(Name::root(), Name::root(), 1, 1, 1, 1, minimum);
        m.add_authority(Record::from_rdata(Name::from_ascii("test.").unwrap(), soa_ttl, RData::SOA(soa)));
        m
    }

    #[test]
    fn positive_ttls_are_capped_and_aged() {
        let c = ResponseCache::new(10);
        let t0 = Instant::now();
        c.insert(key("a"), &answer(300), t0);
        let got = c.get(&key("a"), t0 + Duration::from_secs(10)).unwrap();
        assert_eq!(got.answers[0].ttl, 20);
        assert!(c.get(&key("a"), t0 + Duration::from_secs(30)).is_none());
        c.insert(key("b"), &answer(0), t0);
        assert!(c.get(&key("b"), t0).is_none(), "TTL 0 is not cached");
    }

    #[test]
    fn negative_answers_live_for_the_soa_minimum() {
        let c = ResponseCache::new(10);
        let t0 = Instant::now();
        c.insert(key("nx"), &negative(ResponseCode::NXDomain, 3600, 4), t0);
        assert_eq!(c.get(&key("nx"), t0 + Duration::from_secs(3)).unwrap().response_code, ResponseCode::NXDomain);
        assert!(c.get(&key("nx"), t0 + Duration::from_secs(4)).is_none());
        c.insert(key("nodata"), &negative(ResponseCode::NoError, 60, 600), t0);
        assert!(c.get(&key("nodata"), t0 + Duration::from_secs(29)).is_some());
        assert!(c.get(&key("nodata"), t0 + Duration::from_secs(31)).is_none());
        // No SOA, or a failure: not cached.
        let mut fail = answer(60);
        fail.metadata.response_code = ResponseCode::ServFail;
        c.insert(key("f"), &fail, t0);
        c.insert(key("bare"), &Message::new(1, MessageType::Response, OpCode::Query), t0);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn the_cache_stays_within_its_capacity() {
        let c = ResponseCache::new(3);
        let t0 = Instant::now();
        for i in 0..10 {
            c.insert(key(&format!("n{i}")), &answer(30), t0 + Duration::from_secs(i));
            assert!(c.len() <= 3);
        }
        // Expired entries are swept before live ones are evicted.
        let c = ResponseCache::new(2);
        c.insert(key("old"), &answer(1), t0);
        c.insert(key("live"), &answer(30), t0);
        c.insert(key("new"), &answer(30), t0 + Duration::from_secs(5));
        assert!(c.get(&key("live"), t0 + Duration::from_secs(5)).is_some());
        assert!(c.get(&key("new"), t0 + Duration::from_secs(5)).is_some());
    }
}

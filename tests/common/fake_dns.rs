//! A tiny upstream nameserver for the tests, so that the cluster DNS never
//! forwards to a real resolver: UDP and TCP on an address of the test's
//! own, answering a few names under `.test` and counting the questions.
//!
//! - `upstream.test` A: 192.0.2.10 (TTL 60); AAAA: NODATA;
//! - `big.test` A: 60 addresses (too long for 512-byte UDP: truncated
//!   there, whole over TCP);
//! - anything else: NXDOMAIN, with the SOA of `test.` (minimum 30).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};

pub const UPSTREAM_ANSWER: &str = "192.0.2.10";

#[derive(Clone, Default)]
pub struct FakeDns {
    /// Questions seen, by "name type" (name lower case, with the dot).
    pub asked: Arc<Mutex<HashMap<String, usize>>>,
    pub addr: Option<SocketAddr>,
}

fn answer(request: &Message, udp: bool) -> Message {
    let mut m = Message::new(request.metadata.id, MessageType::Response, OpCode::Query);
    m.metadata.recursion_desired = request.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.queries = request.queries.clone();
    let Some(q) = request.queries.first() else { return m };
    let name = q.name.to_lowercase().to_ascii();
    let soa = || {
        let zone = Name::from_ascii("test.").unwrap();
        let soa = SOA::new(
            Name::from_ascii("ns.test.").unwrap(),
            Name::from_ascii("admin.test.").unwrap(),
            1,
            60,
            60,
            60,
            30,
        );
        Record::from_rdata(zone, 60, RData::SOA(soa))
    };
    match (name.as_str(), q.query_type) {
        ("upstream.test.", RecordType::A) => {
            m.add_answer(Record::from_rdata(q.name.clone(), 60, RData::A(A(UPSTREAM_ANSWER.parse().unwrap()))));
        }
        ("upstream.test.", _) => {
            m.add_authority(soa());
        }
        ("big.test.", RecordType::A) => {
            if udp {
                m.metadata.truncation = true;
            } else {
                for i in 0..60u8 {
                    m.add_answer(Record::from_rdata(q.name.clone(), 60, RData::A(A(Ipv4Addr::new(192, 0, 2, i)))));
                }
            }
        }
        _ => {
            m.metadata.response_code = ResponseCode::NXDomain;
            m.add_authority(soa());
        }
    }
    m
}

impl FakeDns {
    /// Serves on `ip`:`port` (UDP and TCP) from threads that live as long as the test.
    pub fn start(ip: &str, port: u16) -> FakeDns {
        let addr: SocketAddr = format!("{ip}:{port}").parse().expect("address");
        let udp = UdpSocket::bind(addr).unwrap_or_else(|e| panic!("fake DNS cannot bind {addr}/udp: {e}"));
        let addr = udp.local_addr().expect("local addr");
        let tcp = TcpListener::bind(addr).unwrap_or_else(|e| panic!("fake DNS cannot bind {addr}/tcp: {e}"));
        let dns = FakeDns { asked: Default::default(), addr: Some(addr) };
        let count = |asked: &Arc<Mutex<HashMap<String, usize>>>, m: &Message| {
            if let Some(q) = m.queries.first() {
                let k = format!("{} {}", q.name.to_lowercase().to_ascii(), q.query_type);
                *asked.lock().unwrap().entry(k).or_default() += 1;
            }
        };
        let asked = dns.asked.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok((n, peer)) = udp.recv_from(&mut buf) {
                let Ok(req) = Message::from_vec(&buf[..n]) else { continue };
                count(&asked, &req);
                let _ = udp.send_to(&answer(&req, true).to_vec().unwrap(), peer);
            }
        });
        let asked = dns.asked.clone();
        std::thread::spawn(move || {
            for stream in tcp.incoming() {
                let Ok(mut s) = stream else { continue };
                let mut len = [0u8; 2];
                if s.read_exact(&mut len).is_err() {
                    continue;
                }
                let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
                if s.read_exact(&mut buf).is_err() {
                    continue;
                }
                let Ok(req) = Message::from_vec(&buf) else { continue };
                count(&asked, &req);
                let out = answer(&req, false).to_vec().unwrap();
                let _ = s.write_all(&(out.len() as u16).to_be_bytes());
                let _ = s.write_all(&out);
            }
        });
        dns
    }

    /// How often `name` (with the trailing dot) was asked for `qtype` (e.g. "A").
    pub fn count(&self, name: &str, qtype: &str) -> usize {
        self.asked.lock().unwrap().get(&format!("{name} {qtype}")).copied().unwrap_or(0)
    }
}

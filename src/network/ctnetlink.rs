//! The wire side of conntrack cleanup: a NETLINK_NETFILTER socket speaking
//! ctnetlink (`nfnetlink_conntrack`), enough to dump the conntrack table of
//! one address family and to delete an entry by its original tuple. The
//! socket is blocking (with a receive timeout); callers keep it off async
//! workers (see `conntrack.rs`).

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

// Netlink framing (linux/netlink.h).
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NLA_F_NESTED: u16 = 0x8000;
const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;

// nfnetlink / ctnetlink (linux/netfilter/nfnetlink*.h).
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NFNETLINK_V0: u8 = 0;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

/// How long a reply from the kernel may take before the call fails.
const RECV_TIMEOUT: Duration = Duration::from_secs(5);

/// One direction of a conntrack entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// IPPROTO_* (17 for UDP).
    pub protocol: u8,
    pub src_port: u16,
    pub dst_port: u16,
}

/// A conntrack entry: what the client sent (original) and what the reply
/// comes as (after NAT, its source is the endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub original: Tuple,
    pub reply: Tuple,
    pub zone: u16,
}

/// A netlink socket to the netfilter subsystem of the calling thread's
/// network namespace.
pub struct CtSocket {
    fd: OwnedFd,
    seq: u32,
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

fn put_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(align(buf.len()), 0);
}

fn put_nested(buf: &mut Vec<u8>, kind: u16, fill: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    fill(&mut inner);
    put_attr(buf, kind | NLA_F_NESTED, &inner);
}

fn put_tuple(buf: &mut Vec<u8>, kind: u16, t: &Tuple) {
    put_nested(buf, kind, |b| {
        put_nested(b, CTA_TUPLE_IP, |ip| match (t.src, t.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                put_attr(ip, CTA_IP_V4_SRC, &s.octets());
                put_attr(ip, CTA_IP_V4_DST, &d.octets());
            }
            (s, d) => {
                put_attr(ip, CTA_IP_V6_SRC, &v6_octets(s));
                put_attr(ip, CTA_IP_V6_DST, &v6_octets(d));
            }
        });
        put_nested(b, CTA_TUPLE_PROTO, |p| {
            put_attr(p, CTA_PROTO_NUM, &[t.protocol]);
            put_attr(p, CTA_PROTO_SRC_PORT, &t.src_port.to_be_bytes());
            put_attr(p, CTA_PROTO_DST_PORT, &t.dst_port.to_be_bytes());
        });
    });
}

fn v6_octets(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V6(v6) => v6.octets(),
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
    }
}

/// The attributes in `buf`: (type without flags, payload).
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let payload = &buf[4..len];
        buf = &buf[align(len).min(buf.len())..];
        Some((kind, payload))
    })
}

fn find(buf: &[u8], kind: u16) -> Option<&[u8]> {
    attrs(buf).find(|(k, _)| *k == kind).map(|(_, p)| p)
}

fn parse_ip(payload: &[u8]) -> Option<IpAddr> {
    match payload.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(payload).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(payload).ok()?)),
        _ => None,
    }
}

fn parse_port(payload: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(payload.get(..2)?.try_into().ok()?))
}

fn parse_tuple(buf: &[u8]) -> Option<Tuple> {
    let ip = find(buf, CTA_TUPLE_IP)?;
    let (src, dst) = match (find(ip, CTA_IP_V4_SRC), find(ip, CTA_IP_V4_DST)) {
        (Some(s), Some(d)) => (parse_ip(s)?, parse_ip(d)?),
        _ => (parse_ip(find(ip, CTA_IP_V6_SRC)?)?, parse_ip(find(ip, CTA_IP_V6_DST)?)?),
    };
    let proto = find(buf, CTA_TUPLE_PROTO)?;
    let protocol = *find(proto, CTA_PROTO_NUM)?.first()?;
    // ICMP and others carry no ports; they read as 0.
    let src_port = find(proto, CTA_PROTO_SRC_PORT).and_then(parse_port).unwrap_or(0);
    let dst_port = find(proto, CTA_PROTO_DST_PORT).and_then(parse_port).unwrap_or(0);
    Some(Tuple { src, dst, protocol, src_port, dst_port })
}

/// A conntrack message's payload after the nfgenmsg header.
fn parse_flow(attrs_buf: &[u8]) -> Option<Flow> {
    Some(Flow {
        original: parse_tuple(find(attrs_buf, CTA_TUPLE_ORIG)?)?,
        reply: parse_tuple(find(attrs_buf, CTA_TUPLE_REPLY)?)?,
        zone: find(attrs_buf, CTA_ZONE).and_then(parse_port).unwrap_or(0),
    })
}

fn family_of(v6: bool) -> u8 {
    if v6 {
        libc::AF_INET6 as u8
    } else {
        libc::AF_INET as u8
    }
}

impl CtSocket {
    /// Opens the socket in the calling thread's network namespace.
    pub fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2); the descriptor is owned at once below.
        let raw =
            unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_NETFILTER) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an all-zero sockaddr_nl is valid; the family is set below.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: `addr` is a valid sockaddr_nl of the given length.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let timeout = libc::timeval { tv_sec: RECV_TIMEOUT.as_secs() as _, tv_usec: 0 };
        let rcvbuf: libc::c_int = 4 << 20;
        // SAFETY: setsockopt with correctly sized option values.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &timeout as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            );
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                &rcvbuf as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as u32,
            );
        }
        Ok(CtSocket { fd, seq: 0 })
    }

    fn send(&mut self, msg_type: u16, flags: u16, family: u8, attrs: &[u8]) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let len = NLMSG_HDRLEN + NFGENMSG_LEN + attrs.len();
        let mut buf = Vec::with_capacity(len);
        buf.extend_from_slice(&(len as u32).to_ne_bytes());
        buf.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | msg_type).to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&self.seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&[family, NFNETLINK_V0, 0, 0]);
        buf.extend_from_slice(attrs);
        // SAFETY: an all-zero sockaddr_nl addresses the kernel.
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: `buf` and `kernel` are valid for the lengths given.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                buf.as_ptr() as *const libc::c_void,
                buf.len(),
                0,
                &kernel as *const libc::sockaddr_nl as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(self.seq)
    }

    /// Reads replies to `seq`, handing each message (type, payload after
    /// the netlink header) to `each`, until DONE (dumps) or an ACK/error.
    fn receive(&mut self, seq: u32, mut each: impl FnMut(u16, &[u8])) -> io::Result<()> {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: `buf` is writable for its length.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            let mut msgs = &buf[..n as usize];
            while msgs.len() >= NLMSG_HDRLEN {
                let len = u32::from_ne_bytes([msgs[0], msgs[1], msgs[2], msgs[3]]) as usize;
                let kind = u16::from_ne_bytes([msgs[4], msgs[5]]);
                let msg_seq = u32::from_ne_bytes([msgs[8], msgs[9], msgs[10], msgs[11]]);
                if len < NLMSG_HDRLEN || len > msgs.len() {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "truncated netlink message"));
                }
                let payload = &msgs[NLMSG_HDRLEN..len];
                msgs = &msgs[align(len).min(msgs.len())..];
                if msg_seq != seq {
                    continue;
                }
                match kind {
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => {
                        let code = payload.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
                        return if code == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(-code)) };
                    }
                    _ => each(kind & 0xff, payload),
                }
            }
        }
    }

    /// Every entry of one family (`v6` false: IPv4).
    pub fn dump(&mut self, v6: bool) -> io::Result<Vec<Flow>> {
        let seq = self.send(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, family_of(v6), &[])?;
        let mut flows = Vec::new();
        self.receive(seq, |kind, payload| {
            if kind == IPCTNL_MSG_CT_GET || kind == 0 {
                if let Some(flow) = payload.get(NFGENMSG_LEN..).and_then(parse_flow) {
                    flows.push(flow);
                }
            }
        })?;
        Ok(flows)
    }

    /// Deletes the entry with `flow`'s original tuple; `false` when it was
    /// already gone.
    pub fn delete(&mut self, flow: &Flow) -> io::Result<bool> {
        let mut attrs = Vec::new();
        put_tuple(&mut attrs, CTA_TUPLE_ORIG, &flow.original);
        if flow.zone != 0 {
            put_attr(&mut attrs, CTA_ZONE, &flow.zone.to_be_bytes());
        }
        let seq =
            self.send(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, family_of(flow.original.dst.is_ipv6()), &attrs)?;
        match self.receive(seq, |_, _| {}) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tuple_encodes_and_parses_back() {
        for (src, dst) in [("10.42.0.5", "10.43.0.10"), ("fd00::5", "fd00:43::a")] {
            let t = Tuple {
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
                protocol: 17,
                src_port: 40000,
                dst_port: 53,
            };
            let mut buf = Vec::new();
            put_tuple(&mut buf, CTA_TUPLE_ORIG, &t);
            put_tuple(&mut buf, CTA_TUPLE_REPLY, &Tuple { src: t.dst, dst: t.src, src_port: 53, dst_port: 40000, ..t });
            put_attr(&mut buf, CTA_ZONE, &7u16.to_be_bytes());
            let flow = parse_flow(&buf).unwrap();
            assert_eq!(flow.original, t);
            assert_eq!(flow.reply.src, t.dst);
            assert_eq!(flow.reply.dst_port, 40000);
            assert_eq!(flow.zone, 7);
        }
        // Garbage does not panic.
        assert!(parse_flow(&[0xff, 0xff, 1, 0, 9]).is_none());
    }
}

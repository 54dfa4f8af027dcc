//! Stale UDP conntrack entries, flushed when a Service's endpoint goes
//! (upstream kube-proxy's `conntrack` package: ClearEntriesForIP,
//! ClearEntriesForPort, ClearEntriesForNAT and ClearEntriesForPortNAT).
//! UDP has no connection to end: while an entry lives, a client's packets to
//! the service address keep being sent to the NAT destination chosen when
//! the entry was made, even once that endpoint is gone.
//!
//! Spoken over ctnetlink (`ctnetlink.rs`), without the `conntrack` tool:
//! the table of the address family is dumped, the matching entries are
//! deleted by their original tuple. IPv4 and IPv6 alike (the family
//! follows the address given).
//!
//! The functions here are **blocking** (netlink syscalls, each reply
//! waited for at most 5 s): call them from a thread of your own, or from
//! async code through [`in_background`], which runs them with
//! `spawn_blocking`. They act in the calling thread's network namespace.

use std::net::IpAddr;

use super::ctnetlink::{CtSocket, Flow};

const IPPROTO_UDP: u8 = 17;

#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("ctnetlink: {0}")]
    Netlink(#[from] std::io::Error),
    #[error("conntrack cleanup task failed: {0}")]
    Task(String),
}

/// The IP family a cleanup acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    fn of(ip: IpAddr) -> Self {
        if ip.is_ipv6() {
            IpFamily::V6
        } else {
            IpFamily::V4
        }
    }
}

/// The tracked UDP flows of a family (what `conntrack -L -p udp` lists).
pub fn list_udp(family: IpFamily) -> Result<Vec<Flow>, ConntrackError> {
    let mut socket = CtSocket::open()?;
    Ok(socket.dump(family == IpFamily::V6)?.into_iter().filter(|f| f.original.protocol == IPPROTO_UDP).collect())
}

/// Deletes the UDP entries of `family` that `matches` selects; how many went.
pub fn delete_udp_where(family: IpFamily, matches: impl Fn(&Flow) -> bool) -> Result<usize, ConntrackError> {
    let mut socket = CtSocket::open()?;
    // The whole dump is read before anything is deleted: deleting while the
    // kernel walks the table could skip entries.
    let doomed: Vec<Flow> = socket
        .dump(family == IpFamily::V6)?
        .into_iter()
        .filter(|f| f.original.protocol == IPPROTO_UDP && matches(f))
        .collect();
    let mut deleted = 0;
    for flow in &doomed {
        if socket.delete(flow)? {
            deleted += 1;
        }
    }
    if deleted > 0 {
        tracing::debug!(deleted, ?family, "deleted stale UDP conntrack entries");
    }
    Ok(deleted)
}

/// Deletes the UDP entries sent to `orig_dst` (a service IP, external IP
/// or load balancer address), on `port` only when given (ClearEntriesForIP,
/// or the same narrowed to one port).
pub fn delete_udp_to(orig_dst: IpAddr, port: Option<u16>) -> Result<usize, ConntrackError> {
    delete_udp_where(IpFamily::of(orig_dst), |f| {
        f.original.dst == orig_dst && port.is_none_or(|p| f.original.dst_port == p)
    })
}

/// Deletes the UDP entries sent to `port` on any address of `family` (a
/// node port: ClearEntriesForPort).
pub fn delete_udp_to_port(family: IpFamily, port: u16) -> Result<usize, ConntrackError> {
    delete_udp_where(family, |f| f.original.dst_port == port)
}

/// Deletes the UDP entries sent to `orig_dst`:`orig_port` that were NATed
/// to `endpoint`, i.e. whose reply comes from it (ClearEntriesForNAT,
/// narrowed to the service port).
pub fn delete_udp_nat(orig_dst: IpAddr, orig_port: u16, endpoint: IpAddr) -> Result<usize, ConntrackError> {
    delete_udp_where(IpFamily::of(orig_dst), |f| {
        f.original.dst == orig_dst && f.original.dst_port == orig_port && f.reply.src == endpoint
    })
}

/// Deletes the UDP entries sent to node port `port` on any address and
/// NATed to `endpoint` (ClearEntriesForPortNAT).
pub fn delete_udp_port_nat(port: u16, endpoint: IpAddr) -> Result<usize, ConntrackError> {
    delete_udp_where(IpFamily::of(endpoint), |f| f.original.dst_port == port && f.reply.src == endpoint)
}

/// Runs a blocking cleanup off the async workers:
/// `in_background(move || delete_udp_nat(vip, 53, gone)).await`.
pub async fn in_background<T: Send + 'static>(
    cleanup: impl FnOnce() -> Result<T, ConntrackError> + Send + 'static,
) -> Result<T, ConntrackError> {
    tokio::task::spawn_blocking(cleanup).await.map_err(|e| ConntrackError::Task(e.to_string()))?
}

#[cfg(test)]
mod tests {
    //! Real conntrack tables: each test runs on a thread of its own moved
    //! into a fresh network namespace (`unshare(CLONE_NEWNET)` affects the
    //! calling thread only; the `ip` and `nft` it starts inherit it).
    use super::*;
    use std::net::{SocketAddr, UdpSocket};
    use std::process::Command;
    use std::time::Duration;

    fn in_fresh_netns(test: impl FnOnce() + Send + 'static) {
        let thread = std::thread::spawn(move || {
            // SAFETY: unshare(2) on this thread only; it never returns to the pool.
            let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
            test();
        });
        if let Err(panic) = thread.join() {
            std::panic::resume_unwind(panic);
        }
    }

    fn sh(cmd: &str, args: &[&str], stdin: Option<&str>) {
        use std::io::Write;
        let mut child = Command::new(cmd)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
        child.stdin.take().unwrap().write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Loopback up, a few more addresses, and an nftables table of the
    /// test's own: a `ct` rule (conntrack only tracks a namespace once a
    /// rule needs it) and a DNAT of a "service" address to an "endpoint".
    fn set_up() {
        sh("ip", &["link", "set", "lo", "up"], None);
        sh("ip", &["-6", "addr", "add", "fd00:ff::2/128", "dev", "lo", "nodad"], None);
        sh("ip", &["-6", "addr", "add", "fd00:ff::3/128", "dev", "lo", "nodad"], None);
        sh("ip", &["-6", "route", "add", "local", "fd00:ff::100/128", "dev", "lo"], None);
        let rules = "table inet cttest {
            chain out {
                type filter hook output priority 0;
                ct state new counter
            }
            chain nat_out {
                type nat hook output priority -100;
                ip daddr 127.0.0.100 udp dport 53 dnat ip to 127.0.0.2:5300
                ip6 daddr fd00:ff::100 udp dport 53 dnat ip6 to [fd00:ff::2]:5300
            }
        }";
        sh("nft", &["-f", "-"], Some(rules));
    }

    /// Sends one datagram to `to` from a fresh client socket, received at
    /// `listener` (proving the path, NAT included); the client's port.
    fn flow(to: &str, listener: &UdpSocket) -> u16 {
        let to: SocketAddr = to.parse().unwrap();
        let bind = if to.is_ipv6() { "[::1]:0" } else { "127.0.0.1:0" };
        let client = UdpSocket::bind(bind).unwrap();
        client.send_to(b"ping", to).unwrap();
        listener.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 16];
        let (n, from) = listener.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"ping");
        from.port()
    }

    fn tracked(family: IpFamily, src_port: u16) -> Option<Flow> {
        list_udp(family).unwrap().into_iter().find(|f| f.original.src_port == src_port)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn entries_to_an_address_and_port_are_deleted_and_others_kept() {
        in_fresh_netns(|| {
            set_up();
            for (family, plain, other) in
                [(IpFamily::V4, "127.0.0.3", "127.0.0.4"), (IpFamily::V6, "fd00:ff::3", "fd00:ff::2")]
            {
                let at = |addr: &str, port: u16| SocketAddr::new(ip(addr), port).to_string();
                let listener = UdpSocket::bind(at(plain, 7000)).unwrap();
                let other_listener = UdpSocket::bind(at(other, 7000)).unwrap();
                let a = flow(&at(plain, 7000), &listener);
                let b = flow(&at(other, 7000), &other_listener);
                let seen = tracked(family, a).expect("the dump lists the flow");
                assert_eq!((seen.original.dst, seen.original.dst_port), (ip(plain), 7000));
                assert!(tracked(family, b).is_some());
                // Another port, another address: nothing goes.
                assert_eq!(delete_udp_to(ip(plain), Some(7001)).unwrap(), 0);
                assert_eq!(delete_udp_to(ip("127.0.0.99"), None).unwrap(), 0);
                assert!(tracked(family, a).is_some(), "{family:?}: kept");
                assert_eq!(delete_udp_to(ip(plain), Some(7000)).unwrap(), 1);
                assert!(tracked(family, a).is_none(), "{family:?}: deleted");
                assert!(tracked(family, b).is_some(), "{family:?}: the other address is kept");
                // A node port: any address.
                assert_eq!(delete_udp_to_port(family, 7000).unwrap(), 1);
                assert!(tracked(family, b).is_none());
            }
        });
    }

    #[test]
    fn entries_nated_to_a_removed_endpoint_are_deleted_and_others_kept() {
        in_fresh_netns(|| {
            set_up();
            for (family, vip, endpoint) in
                [(IpFamily::V4, "127.0.0.100", "127.0.0.2"), (IpFamily::V6, "fd00:ff::100", "fd00:ff::2")]
            {
                let listener = UdpSocket::bind(SocketAddr::new(ip(endpoint), 5300)).unwrap();
                let client_port = flow(&SocketAddr::new(ip(vip), 53).to_string(), &listener);
                let seen = tracked(family, client_port).expect("the dump lists the NATed flow");
                assert_eq!((seen.original.dst, seen.original.dst_port), (ip(vip), 53));
                assert_eq!((seen.reply.src, seen.reply.src_port), (ip(endpoint), 5300));
                // Another endpoint, another service port, another service address.
                let elsewhere = if family == IpFamily::V4 { "127.0.0.9" } else { "fd00:ff::9" };
                assert_eq!(delete_udp_nat(ip(vip), 53, ip(elsewhere)).unwrap(), 0);
                assert_eq!(delete_udp_nat(ip(vip), 54, ip(endpoint)).unwrap(), 0);
                assert_eq!(delete_udp_nat(ip(elsewhere), 53, ip(endpoint)).unwrap(), 0);
                assert_eq!(delete_udp_port_nat(54, ip(endpoint)).unwrap(), 0);
                assert!(tracked(family, client_port).is_some(), "{family:?}: kept");
                assert_eq!(delete_udp_nat(ip(vip), 53, ip(endpoint)).unwrap(), 1);
                assert!(tracked(family, client_port).is_none(), "{family:?}: deleted");
                // Through the async wrapper, on a runtime.
                let again = flow(&SocketAddr::new(ip(vip), 53).to_string(), &listener);
                let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                let (v, e) = (ip(vip), ip(endpoint));
                // spawn_blocking runs on another thread: outside this namespace,
                // so the cleanup is made to enter it first.
                let ns = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
                let n = rt
                    .block_on(in_background(move || {
                        use std::os::fd::AsRawFd;
                        // SAFETY: setns(2) on the blocking pool's thread, for this test only.
                        assert_eq!(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
                        delete_udp_port_nat(53, e).and_then(|n| Ok(n + delete_udp_nat(v, 53, e)?))
                    }))
                    .unwrap();
                assert_eq!(n, 1);
                assert!(tracked(family, again).is_none());
            }
        });
    }
}

//! The cluster DNS, measured from a client on the node (threads of this
//! process moved into the node's network namespace): queries per second
//! and p50/p99 latency for a cluster name and for a forwarded name the
//! cache holds, one query at a time and many in flight; ferrok's resident
//! memory before and after. The upstream is a fake of the bench's own on
//! the host side of the node's link. Prints figures; not a pass/fail test.
//! CoreDNS' anchor: about 33,000 QPS per instance with about 60 MiB resident.
//!
//! `cargo bench --profile dev --bench dns [-- --seconds N --services N --threads N --window N]`

#[path = "../tests/common/mod.rs"]
mod tcommon;

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use hickory_proto::op::Message;
use hickory_proto::op::Query;
use hickory_proto::rr::{Name, RecordType};
use tcommon::fake_dns::FakeDns;
use tcommon::node::{Node, BUSYBOX};
use tcommon::rss_mib;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == name).and_then(|w| w[1].parse().ok()).unwrap_or(default)
}

/// Moves the calling thread into the node's network namespace.
fn enter_netns(netns: &str) {
    let f = std::fs::File::open(format!("/run/netns/{netns}")).expect("netns file");
    // SAFETY: setns(2) on a valid namespace fd; it affects this thread only.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
}

fn query_bytes(name: &str) -> Vec<u8> {
    let mut q = Message::query();
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(Name::from_ascii(name).expect("name"), RecordType::A));
    q.to_vec().expect("encode")
}

struct Run {
    answered: u64,
    lost: u64,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

/// One client thread: `window` queries in flight on one socket for `time`.
fn client(netns: String, server: SocketAddr, name: String, window: usize, time: Duration) -> Run {
    enter_netns(&netns);
    let socket = UdpSocket::bind("0.0.0.0:0").expect("bind");
    socket.connect(server).expect("connect");
    socket.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    let mut query = query_bytes(&name);
    let mut sent_at: Vec<Option<Instant>> = vec![None; 65536];
    let mut next_id: u16 = 1;
    let mut send = |socket: &UdpSocket, sent_at: &mut Vec<Option<Instant>>| {
        next_id = next_id.wrapping_add(1);
        query[..2].copy_from_slice(&next_id.to_be_bytes());
        sent_at[next_id as usize] = Some(Instant::now());
        let _ = socket.send(&query);
    };
    let start = Instant::now();
    for _ in 0..window {
        send(&socket, &mut sent_at);
    }
    let mut run = Run { answered: 0, lost: 0, latencies: Vec::with_capacity(1 << 20), elapsed: Duration::ZERO };
    let mut buf = [0u8; 1500];
    while start.elapsed() < time {
        match socket.recv(&mut buf) {
            Ok(n) if n >= 12 => {
                let id = u16::from_be_bytes([buf[0], buf[1]]) as usize;
                if let Some(at) = sent_at[id].take() {
                    run.latencies.push(at.elapsed());
                    run.answered += 1;
                    send(&socket, &mut sent_at);
                }
            }
            Ok(_) => {}
            Err(_) => {
                // Nothing back in 200 ms: count the window lost and refill it.
                run.lost += window as u64;
                sent_at.iter_mut().for_each(|s| *s = None);
                for _ in 0..window {
                    send(&socket, &mut sent_at);
                }
            }
        }
    }
    run.elapsed = start.elapsed();
    run
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn measure(node: &Node, server: SocketAddr, what: &str, name: &str, threads: usize, window: usize, secs: u64) {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (netns, name) = (node.netns.clone(), name.to_string());
            std::thread::spawn(move || client(netns, server, name, window, Duration::from_secs(secs)))
        })
        .collect();
    let runs: Vec<Run> = handles.into_iter().map(|h| h.join().expect("client thread")).collect();
    let answered: u64 = runs.iter().map(|r| r.answered).sum();
    let lost: u64 = runs.iter().map(|r| r.lost).sum();
    let elapsed = runs.iter().map(|r| r.elapsed).max().unwrap_or_default();
    let mut lat: Vec<Duration> = runs.into_iter().flat_map(|r| r.latencies).collect();
    lat.sort();
    println!(
        "{what}: {threads}x{window} in flight: {:.0} QPS; p50 {:?}, p99 {:?}; {lost} lost",
        answered as f64 / elapsed.as_secs_f64(),
        percentile(&lat, 0.50),
        percentile(&lat, 0.99),
    );
}

fn main() {
    let secs = arg("--seconds", 5);
    let services = arg("--services", 200) as usize;
    let threads = arg("--threads", 2) as usize;
    let window = arg("--window", 32) as usize;
    let mut node = Node::new(&[]);
    let _upstream = FakeDns::start(&node.host_ip, 53);
    let resolv = node.dir.path().join("upstream-resolv.conf");
    std::fs::write(&resolv, format!("nameserver {}\n", node.host_ip)).expect("resolv.conf");
    node.extra.extend(["--resolv-conf".to_string(), resolv.to_string_lossy().into_owned()]);
    node.launch();
    let pid = node.pid().expect("pid");
    let rest = rss_mib(pid);
    // A pod (the pod bridge, and with it the DNS' address, exists from the
    // first one until the pod network makes it earlier) and `services` Services.
    let mut manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: default}}\nspec:\n  containers:\n  - {{name: c, image: {BUSYBOX}, command: [\"sleep\", \"3600\"]}}\n"
    );
    for i in 0..services {
        manifest.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: default}}\nspec:\n  ports: [{{name: http, port: 80}}]\n"
        ));
    }
    node.apply(&manifest);
    node.eventually("the pod running", 90, || node.get(&["pod", "p"], "{.status.phase}") == "Running");
    let cidr = node.get(&["node", &node.name], "{.spec.podCIDR}");
    let base: Ipv4Addr = cidr.split('/').next().unwrap_or_default().parse().expect("podCIDR");
    let server = SocketAddr::new(Ipv4Addr::from(u32::from(base) + 1).into(), 53);
    let last = format!("svc-{}.default.svc.cluster.local.", services.saturating_sub(1));
    // Wait until the DNS answers and knows the last Service.
    let probe = {
        let (netns, last) = (node.netns.clone(), last.clone());
        std::thread::spawn(move || {
            enter_netns(&netns);
            let s = UdpSocket::bind("0.0.0.0:0").expect("bind");
            s.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut buf = [0u8; 1500];
            while Instant::now() < deadline {
                let _ = s.send_to(&query_bytes(&last), server);
                if let Ok(n) = s.recv(&mut buf) {
                    if Message::from_vec(&buf[..n]).is_ok_and(|m| !m.answers.is_empty()) {
                        return true;
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            false
        })
    };
    assert!(probe.join().expect("probe"), "the cluster DNS did not answer for {last}");
    let loaded = rss_mib(pid);
    println!("cluster DNS at {server}, {services} Services indexed, {secs} s per run");
    measure(&node, server, "cluster name", &last, 1, 1, secs);
    measure(&node, server, "cluster name", &last, threads, window, secs);
    // The same through the cluster DNS address, as pods ask (the service
    // proxy's DNAT to the node's own DNS on the way).
    let vip = SocketAddr::new(Ipv4Addr::new(10, 43, 0, 10).into(), 53);
    measure(&node, vip, "cluster name via 10.43.0.10", &last, 1, 1, secs);
    measure(&node, vip, "cluster name via 10.43.0.10", &last, threads, window, secs);
    measure(&node, server, "forwarded name (cached)", "upstream.test.", 1, 1, secs);
    measure(&node, server, "forwarded name (cached)", "upstream.test.", threads, window, secs);
    println!(
        "ferrok resident memory (the whole server: control plane, node and DNS): {rest:.1} MiB at rest, \
         {loaded:.1} MiB with the Services, {:.1} MiB after the runs",
        rss_mib(pid)
    );
    println!("CoreDNS' anchor: ~33,000 QPS per instance, ~60 MiB resident");
}

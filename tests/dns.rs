//! Cluster DNS served by ferrok, asked from real pods with busybox
//! `nslookup`: every record type (A, SRV, PTR, pod names, a headless
//! Service with StatefulSet hostnames, ExternalName's CNAME), NXDOMAIN and
//! NODATA, forwarding of other names to the host's resolvers (a fake
//! upstream of the test's own on the host side of the node's link, named
//! by `--resolv-conf`) with the cache in front, the `kube-dns` Service and
//! its EndpointSlice, and each dnsPolicy's resolv.conf. Also the listeners
//! in-process: TCP, and truncation with the upstream asked again over TCP.
//! Needs root and what `scripts/deps` installs.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use common::fake_dns::{FakeDns, UPSTREAM_ANSWER};
use common::node::{Node, BUSYBOX};
use ferrok::network::dns::{cache, forward, records::RecordIndex, resolver::Resolver, server};
use hickory_proto::op::{Edns, Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};

/// The node's pod-network gateway, where its cluster DNS listens.
fn gateway(node: &Node) -> String {
    let cidr = node.get(&["node", &node.name], "{.spec.podCIDR}");
    let base: Ipv4Addr = cidr.split('/').next().unwrap_or_default().parse().expect("podCIDR");
    Ipv4Addr::from(u32::from(base) + 1).to_string()
}

fn running(node: &Node, pod: &str) {
    node.eventually(&format!("{pod} running"), 90, || node.get(&["pod", pod], "{.status.phase}") == "Running");
}

/// `nslookup` in the client pod (exit status appended, output kept either way).
fn nslookup(node: &Node, args: &str) -> String {
    node.exec("default", "client", "c", &format!("nslookup {args} 2>&1; echo rc=$?"))
}

/// Polls an nslookup until its output contains every one of `want`.
fn lookup_until(node: &Node, args: &str, want: &[&str]) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = nslookup(node, args);
        if want.iter().all(|w| out.contains(w)) {
            return out;
        }
        if std::time::Instant::now() > deadline {
            let slices = node.kubectl(&["get", "endpointslices", "-A", "-o", "yaml"]).1;
            panic!("nslookup {args} never showed {want:?}; last:\n{out}\n--- slices ---\n{slices}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn manifests(gw: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: default}}
spec:
  dnsPolicy: None
  # ClusterFirst's resolv.conf, with the node's DNS itself as the server
  # (what the service proxy sends 10.43.0.10 to).
  dnsConfig:
    nameservers: ["{gw}"]
    searches: [default.svc.cluster.local, svc.cluster.local, cluster.local]
    options: [{{name: ndots, value: "5"}}]
  containers:
  - {{name: c, image: {BUSYBOX}, command: ["sleep", "3600"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: default, labels: {{app: web}}}}
spec:
  containers:
  - {{name: c, image: {BUSYBOX}, command: ["sleep", "3600"]}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  selector: {{app: web}}
  ports:
  - {{name: http, port: 80, targetPort: 8080, protocol: TCP}}
---
apiVersion: v1
kind: Service
metadata: {{name: db, namespace: default}}
spec:
  clusterIP: None
  selector: {{app: db}}
  ports:
  - {{name: pg, port: 5432, protocol: TCP}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: db, namespace: default}}
spec:
  serviceName: db
  replicas: 2
  selector: {{matchLabels: {{app: db}}}}
  template:
    metadata: {{labels: {{app: db}}}}
    spec:
      containers:
      - {{name: c, image: {BUSYBOX}, command: ["sleep", "3600"], ports: [{{name: pg, containerPort: 5432}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: ext, namespace: default}}
spec:
  type: ExternalName
  externalName: upstream.test
"#
    )
}

fn reverse_name(ip: &str) -> String {
    let mut octets: Vec<&str> = ip.split('.').collect();
    octets.reverse();
    format!("{}.in-addr.arpa", octets.join("."))
}

#[test]
fn pods_resolve_every_cluster_record_type_and_forward_the_rest() {
    let mut node = Node::new(&[]);
    // The upstream: the host side of the node's link (the test's own address).
    let upstream = FakeDns::start(&node.host_ip, 53);
    let resolv = node.dir.path().join("upstream-resolv.conf");
    std::fs::write(&resolv, format!("nameserver {}\nsearch example.internal\n", node.host_ip)).expect("resolv.conf");
    node.extra.extend(["--resolv-conf".to_string(), resolv.to_string_lossy().into_owned()]);
    node.launch();
    let gw = gateway(&node);
    node.apply(&manifests(&gw));
    for pod in ["client", "web", "db-0", "db-1"] {
        running(&node, pod);
    }
    let web_ip = node.get(&["svc", "web"], "{.spec.clusterIP}");
    let db0 = node.get(&["pod", "db-0"], "{.status.podIP}");
    let db1 = node.get(&["pod", "db-1"], "{.status.podIP}");
    let client_ip = node.get(&["pod", "client"], "{.status.podIP}");
    let fqdn = "web.default.svc.cluster.local";

    // A: by short name through the search list, and fully qualified.
    lookup_until(&node, "web", &[fqdn, &format!("Address: {web_ip}")]);
    lookup_until(&node, &format!("{fqdn}."), &[&format!("Address: {web_ip}")]);
    // SRV of a named port.
    lookup_until(&node, &format!("-type=srv _http._tcp.{fqdn}"), &[&format!("0 100 80 {fqdn}")]);
    // PTR of the cluster IP (and AAAA of an IPv4 Service: no answer, no error).
    lookup_until(&node, &format!("-type=ptr {}", reverse_name(&web_ip)), &[&format!("name = {fqdn}")]);
    let out = nslookup(&node, &format!("-type=aaaa {fqdn}"));
    assert!(!out.contains("NXDOMAIN") && !out.contains("Address: "), "{out}");

    // A headless Service: each ready endpoint; StatefulSet hostnames; SRV per endpoint; PTR.
    let db = "db.default.svc.cluster.local";
    lookup_until(&node, db, &[&format!("Address: {db0}"), &format!("Address: {db1}")]);
    // (busybox's nslookup applies the search list to dotless names only.)
    lookup_until(&node, &format!("db-0.{db}"), &[&format!("Address: {db0}")]);
    lookup_until(&node, &format!("db-1.{db}"), &[&format!("Address: {db1}")]);
    lookup_until(&node, &format!("-type=srv _pg._tcp.{db}"), &[&format!("5432 db-0.{db}"), &format!("5432 db-1.{db}")]);
    lookup_until(&node, &format!("-type=ptr {}", reverse_name(&db0)), &[&format!("name = db-0.{db}")]);

    // Pod names (`pods insecure`).
    let dashed = client_ip.replace('.', "-");
    lookup_until(&node, &format!("{dashed}.default.pod.cluster.local"), &[&format!("Address: {client_ip}")]);

    // ExternalName: a CNAME, followed upstream.
    lookup_until(
        &node,
        "ext.default.svc.cluster.local",
        &["canonical name = upstream.test", &format!("Address: {UPSTREAM_ANSWER}")],
    );

    // A missing name in the cluster domain: NXDOMAIN, never asked upstream.
    let out = nslookup(&node, "nope.default.svc.cluster.local.");
    assert!(out.contains("NXDOMAIN"), "{out}");
    assert_eq!(upstream.count("nope.default.svc.cluster.local.", "A"), 0);

    // Other names go to the host's resolvers, once: then the cache answers.
    lookup_until(&node, "upstream.test.", &[&format!("Address: {UPSTREAM_ANSWER}")]);
    let asked = upstream.count("upstream.test.", "A");
    assert!(asked >= 1);
    for _ in 0..3 {
        lookup_until(&node, "upstream.test.", &[&format!("Address: {UPSTREAM_ANSWER}")]);
    }
    assert_eq!(upstream.count("upstream.test.", "A"), asked, "the cache answers repeats");
    // Upstream's NODATA and NXDOMAIN come back as they are (and are cached too).
    let out = nslookup(&node, "-type=aaaa upstream.test.");
    assert!(!out.contains("NXDOMAIN") && !out.contains("Address: 192"), "{out}");
    let out = nslookup(&node, "missing.test.");
    assert!(out.contains("NXDOMAIN"), "{out}");
    let before = upstream.count("missing.test.", "A");
    nslookup(&node, "missing.test.");
    assert_eq!(upstream.count("missing.test.", "A"), before, "NXDOMAIN is cached");

    // Changes follow the watch: a deleted Service's name goes.
    node.ok(&["delete", "svc", "web"]);
    lookup_until(&node, &format!("{fqdn}."), &["NXDOMAIN"]);

    // (The same through 10.43.0.10, as ClusterFirst pods ask: see
    // `dns_policies_give_pods_their_resolv_conf_and_kube_dns_exists`.)
}

#[test]
fn dns_policies_give_pods_their_resolv_conf_and_kube_dns_exists() {
    let mut node = Node::new(&[]);
    let resolv = node.dir.path().join("upstream-resolv.conf");
    std::fs::write(&resolv, format!("nameserver {}\nsearch example.internal\n", node.host_ip)).expect("resolv.conf");
    node.extra.extend(["--resolv-conf".to_string(), resolv.to_string_lossy().into_owned()]);
    node.launch();

    // The kube-dns Service as tools expect it, and its slice: this node's DNS.
    let svc = |path: &str| node.get(&["svc", "-n", "kube-system", "kube-dns"], path);
    assert_eq!(svc("{.spec.clusterIP}"), "10.43.0.10");
    assert_eq!(svc("{.spec.selector}"), "");
    assert_eq!(svc("{.spec.internalTrafficPolicy}"), "Local");
    assert_eq!(svc("{.metadata.labels.k8s-app}"), "kube-dns");
    assert_eq!(svc("{.spec.ports[*].name}"), "dns dns-tcp");
    let gw = gateway(&node);
    let slice = |path: &str| node.get(&["endpointslice", "-n", "kube-system", "kube-dns"], path);
    node.eventually("the kube-dns slice lists the node", 30, || {
        slice("{.endpoints[0].addresses[0]}") == gw
            && slice("{.endpoints[0].nodeName}") == node.name
            && slice("{.endpoints[0].conditions.ready}") == "true"
    });
    assert_eq!(slice("{.metadata.labels.endpointslice\\.kubernetes\\.io/managed-by}"), "cluster-dns.ferrok.io");
    // The allocator does not hand out the DNS address.
    let (ok, out) = node.kubectl(&["create", "service", "clusterip", "taken", "--tcp=80", "--clusterip=10.43.0.10"]);
    assert!(!ok && out.contains("already allocated"), "{out}");

    let pod = |name: &str, spec: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n{spec}  containers:\n  - {{name: c, image: {BUSYBOX}, command: [\"sleep\", \"3600\"]}}\n---\n"
        )
    };
    node.apply(
        &[
            pod("cluster-first", ""),
            pod("default", "  dnsPolicy: Default\n"),
            pod("host-net", "  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n"),
            pod("host-net-default", "  hostNetwork: true\n"),
            pod("none", "  dnsPolicy: None\n  dnsConfig: {nameservers: [\"192.0.2.53\"], searches: [a.example]}\n"),
        ]
        .concat(),
    );
    let resolv_of = |p: &str| {
        running(&node, p);
        node.exec("default", p, "c", "cat /etc/resolv.conf")
    };
    let cf = resolv_of("cluster-first");
    assert!(cf.contains("nameserver 10.43.0.10"), "{cf}");
    assert!(cf.contains("search default.svc.cluster.local svc.cluster.local cluster.local example.internal"), "{cf}");
    assert!(cf.contains("ndots:5"), "{cf}");
    let d = resolv_of("default");
    assert!(d.contains(&format!("nameserver {}", node.host_ip)) && !d.contains("cluster.local"), "{d}");
    let hn = resolv_of("host-net");
    assert!(hn.contains("nameserver 10.43.0.10") && hn.contains("ndots:5"), "{hn}");
    let hd = resolv_of("host-net-default");
    assert!(hd.contains(&format!("nameserver {}", node.host_ip)), "{hd}");
    let none = resolv_of("none");
    assert!(none.contains("nameserver 192.0.2.53") && none.contains("search a.example"), "{none}");
    assert!(!none.contains("10.43.0.10"), "{none}");
    // The node's DNS answers a ClusterFirst pod at the gateway address.
    let out = node.exec(
        "default",
        "cluster-first",
        "c",
        &format!("nslookup kube-dns.kube-system.svc.cluster.local {gw} 2>&1"),
    );
    assert!(out.contains("Address: 10.43.0.10"), "{out}");
    // Through the cluster DNS address (the service proxy sends 10.43.0.10:53
    // to this node's own DNS, `internalTrafficPolicy: Local`), as the pods'
    // resolv.conf says: a short name by the search list, over UDP.
    let mut out = String::new();
    node.eventually("a ClusterFirst pod resolving through 10.43.0.10", 30, || {
        out = node.exec("default", "cluster-first", "c", "nslookup kubernetes 2>&1; true");
        out.contains("Address: 10.43.0.1\n") || out.ends_with("Address: 10.43.0.1")
    });
    assert!(out.contains("Server:\t\t10.43.0.10"), "{out}");
    assert!(out.contains("kubernetes.default.svc.cluster.local"), "{out}");
    // A host-network pod (ClusterFirstWithHostNet) reaches it from the node itself.
    let out = node.exec("default", "host-net", "c", "nslookup kube-dns.kube-system.svc.cluster.local 2>&1; true");
    assert!(out.contains("Address: 10.43.0.10"), "{out}");
}

async fn ask(addr: SocketAddr, name: &str, qtype: RecordType, tcp: bool, edns: bool) -> Message {
    let mut q = Message::query();
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    if edns {
        q.set_edns(Edns::new());
    }
    let bytes = q.to_vec().unwrap();
    if tcp {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(&(bytes.len() as u16).to_be_bytes()).await.unwrap();
        s.write_all(&bytes).await.unwrap();
        let n = s.read_u16().await.unwrap() as usize;
        let mut buf = vec![0u8; n];
        s.read_exact(&mut buf).await.unwrap();
        Message::from_vec(&buf).unwrap()
    } else {
        let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        s.send_to(&bytes, addr).await.unwrap();
        let mut buf = vec![0u8; 65535];
        let (n, _) = tokio::time::timeout(Duration::from_secs(5), s.recv_from(&mut buf)).await.unwrap().unwrap();
        Message::from_vec(&buf[..n]).unwrap()
    }
}

#[tokio::test]
async fn listeners_answer_over_tcp_and_truncate_long_udp_answers() {
    let upstream = FakeDns::start("127.0.0.1", 0);
    let index = Arc::new(RwLock::new(RecordIndex::new("cluster.local")));
    let resolver = Arc::new(Resolver::new(
        index,
        cache::ResponseCache::new(64),
        forward::Forwarder::new(vec![upstream.addr.unwrap()]),
    ));
    let port = common::free_port();
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    let server = tokio::spawn(server::run(addr, resolver));
    // The listeners bind in the background.
    let mut tries = 0;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        tries += 1;
        assert!(tries < 100, "the listeners did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The upstream truncates big.test over UDP: ferrok asks again over TCP,
    // then truncates for a 512-byte UDP client, and answers whole over TCP.
    let m = ask(addr, "big.test.", RecordType::A, false, false).await;
    assert!(m.metadata.truncation && m.answers.is_empty(), "{m:?}");
    assert_eq!(upstream.count("big.test.", "A"), 2, "once over UDP, once over TCP");
    let m = ask(addr, "big.test.", RecordType::A, true, false).await;
    assert_eq!(m.answers.len(), 60);
    assert_eq!(upstream.count("big.test.", "A"), 2, "the second came from the cache");
    // Cluster names and NXDOMAIN over TCP, with the zone's SOA.
    let m = ask(addr, "nope.svc.cluster.local.", RecordType::A, true, true).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert!(m.metadata.authoritative && m.authorities.len() == 1);
    assert!(m.edns.is_some(), "an EDNS query gets an EDNS answer");
    let m = ask(addr, "upstream.test.", RecordType::A, false, true).await;
    assert_eq!(m.answers[0].data.to_string(), UPSTREAM_ANSWER);
    server.abort();
}

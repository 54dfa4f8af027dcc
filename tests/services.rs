//! Services on a real node: ClusterIP, NodePort, ExternalIPs and
//! LoadBalancer reached with wget from pods, from the node and from outside
//! it (the host side of the test's network namespace); session affinity,
//! both traffic policies, the terminating fallback, a reject for a Service
//! without endpoints, hairpin traffic, and the rules surviving a restart of
//! ferrok while another table on the host is left alone. Without a node:
//! which Endpoints the endpoints controller deletes.

mod common;

use std::collections::BTreeSet;

use common::node::{Node, BUSYBOX};

/// httpd answering its pod's name on `/`, and the client's address on `/cgi-bin/ip`.
const HTTPD: &str = "mkdir -p /www/cgi-bin && hostname > /www/index.html && \
    printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\necho $REMOTE_ADDR\\n' > /www/cgi-bin/ip && \
    busybox chmod +x /www/cgi-bin/ip && exec httpd -f -p 8080 -h /www";

fn manifests(external_ip: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - {{name: c, image: "{BUSYBOX}", command: ["sh", "-c", "{HTTPD}"], ports: [{{name: http, containerPort: 8080}}],
          readinessProbe: {{httpGet: {{path: /, port: 8080}}, periodSeconds: 1}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: client, labels: {{app: client}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: c, image: "{BUSYBOX}", command: ["sh", "-c", "{HTTPD}"]}}
---
apiVersion: v1
kind: Service
metadata: {{name: web}}
spec: {{selector: {{app: web}}, ports: [{{name: http, port: 80, targetPort: http}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: web-np}}
spec: {{type: NodePort, selector: {{app: web}}, ports: [{{port: 80, targetPort: 8080, nodePort: 30080}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: web-local}}
spec: {{type: NodePort, externalTrafficPolicy: Local, selector: {{app: web}}, ports: [{{port: 80, targetPort: 8080, nodePort: 30081}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: web-ext}}
spec: {{selector: {{app: web}}, externalIPs: ["{external_ip}"], ports: [{{port: 8081, targetPort: 8080}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: web-sticky}}
spec: {{selector: {{app: web}}, sessionAffinity: ClientIP, ports: [{{port: 80, targetPort: 8080}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: nothing}}
spec: {{selector: {{app: nothing}}, ports: [{{port: 80, targetPort: 8080}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: client-self}}
spec: {{selector: {{app: client}}, ports: [{{port: 80, targetPort: 8080}}]}}
"#
    )
}

/// 10.201.N.50: an address on the node's own link, never anybody else's.
fn external_ip(node: &Node) -> String {
    let (net, _) = node.ip.rsplit_once('.').expect("an IPv4 node address");
    format!("{net}.50")
}

fn cluster_ip(node: &Node, svc: &str) -> String {
    let ip = node.get(&["service", svc], "{.spec.clusterIP}");
    assert!(ip.starts_with("10.43."), "{svc} has no cluster IP: {ip}");
    ip
}

/// GET from the node's host side (in its network namespace).
fn from_node(node: &Node, url: &str) -> (bool, String) {
    node.on_host(&["timeout", "5", "busybox", "wget", "-q", "-O-", url])
}

/// GET from outside the node (the test's own namespace, over the veth).
fn from_outside(url: &str) -> (bool, String) {
    let out = std::process::Command::new("timeout")
        .args(["5", "busybox", "wget", "-q", "-O-", url])
        .output()
        .expect("busybox wget");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

fn from_pod(node: &Node, pod: &str, url: &str) -> (bool, String) {
    node.try_exec("default", pod, "c", &format!("busybox timeout 5 wget -q -O- {url}"))
}

/// httpd's REMOTE_ADDR as a plain IPv4 address (it listens on IPv6: `[::ffff:a.b.c.d]`).
fn client_address(remote_addr: &str) -> &str {
    remote_addr.trim().trim_start_matches('[').trim_end_matches(']').trim_start_matches("::ffff:")
}

fn web_pods(node: &Node) -> Vec<(String, String)> {
    let out = node.get(&["pods", "-l", "app=web"], "{range .items[*]}{.metadata.name} {.status.podIP}{\"\\n\"}{end}");
    out.lines()
        .filter_map(|l| l.split_once(' ').map(|(n, ip)| (n.to_string(), ip.to_string())))
        .filter(|(_, ip)| !ip.is_empty())
        .collect()
}

/// The pod names that answer `n` requests.
fn answers(n: usize, mut get: impl FnMut() -> (bool, String)) -> BTreeSet<String> {
    (0..n)
        .map(|_| {
            let (ok, out) = get();
            assert!(ok, "request failed: {out}");
            out.trim().to_string()
        })
        .collect()
}

#[test]
fn services_reach_their_endpoints_from_pods_the_node_and_outside() {
    let mut node = Node::new(&[]);
    // A table of somebody else's on the host, which ferrok must not touch.
    assert!(node.on_host(&["nft", "add", "table", "inet", "other"]).0);
    assert!(node.on_host(&["nft", "add", "chain", "inet", "other", "keep"]).0);
    node.launch();
    let external_ip = external_ip(&node);
    node.apply(&manifests(&external_ip));
    node.eventually("web pods and the client ready", 90, || {
        web_pods(&node).len() == 2 && node.get(&["pod", "client"], "{.status.phase}") == "Running"
    });
    let pods: BTreeSet<String> = web_pods(&node).into_iter().map(|(n, _)| n).collect();
    let web = cluster_ip(&node, "web");
    // Both endpoints ready (a pod has an address before its readiness probe passes).
    node.eventually("both web endpoints ready", 60, || {
        node.get(
            &["endpointslices", "-l", "kubernetes.io/service-name=web"],
            "{range .items[*].endpoints[?(@.conditions.ready==true)]}{.targetRef.name}{\"\\n\"}{end}",
        )
        .lines()
        .filter(|l| !l.is_empty())
        .count()
            == 2
    });

    // ClusterIP, from the node and from a pod, spread over both endpoints.
    let mut seen = BTreeSet::new();
    node.eventually("the node's requests to the web service reaching both endpoints", 30, || {
        let (ok, out) = from_node(&node, &format!("http://{web}/"));
        if ok {
            seen.insert(out.trim().to_string());
        }
        seen == pods
    });
    let seen = answers(30, || from_node(&node, &format!("http://{web}/")));
    assert_eq!(seen, pods, "the node's requests to {web}");
    let seen = answers(30, || from_pod(&node, "client", &format!("http://{web}/")));
    assert_eq!(seen, pods, "the client pod's requests to {web}");

    // NodePort on the node's address, from outside and from a pod.
    let np = format!("http://{}:30080/", node.ip);
    node.eventually("the node port answering from outside", 20, || from_outside(&np).1.starts_with("web-"));
    assert!(pods.contains(from_pod(&node, "client", &np).1.trim()));
    // From outside, the Cluster policy masquerades; Local keeps the client's address.
    let (ok, addr) = from_outside(&format!("http://{}:30080/cgi-bin/ip", node.ip));
    assert!(ok, "{addr}");
    assert_ne!(client_address(&addr), node.host_ip, "externalTrafficPolicy Cluster masquerades");
    let (ok, addr) = from_outside(&format!("http://{}:30081/cgi-bin/ip", node.ip));
    assert!(ok, "{addr}");
    assert_eq!(client_address(&addr), node.host_ip, "externalTrafficPolicy Local keeps the client address");

    // ExternalIPs, from the node and from a pod.
    let ext = format!("http://{external_ip}:8081/");
    assert!(pods.contains(from_node(&node, &ext).1.trim()), "{ext} from the node");
    assert!(pods.contains(from_pod(&node, "client", &ext).1.trim()), "{ext} from a pod");

    // ClientIP affinity: one endpoint for every request of a client.
    let sticky = cluster_ip(&node, "web-sticky");
    let seen = answers(20, || from_pod(&node, "client", &format!("http://{sticky}/")));
    assert_eq!(seen.len(), 1, "affinity: {seen:?}");

    // No endpoints: refused at once, not left to time out.
    let nothing = cluster_ip(&node, "nothing");
    let (ok, out) = from_pod(&node, "client", &format!("http://{nothing}/"));
    assert!(!ok && out.contains("refused"), "a service without endpoints: {out}");
    let (ok, out) = from_node(&node, &format!("http://{nothing}/"));
    assert!(!ok && out.contains("refused"), "a service without endpoints, from the node: {out}");
    // A cluster IP on a port none of its Service's: refused too.
    let (ok, out) = from_pod(&node, "client", &format!("http://{web}:81/"));
    assert!(!ok && out.contains("refused"), "an unknown port of a cluster IP: {out}");
    let (ok, out) = from_node(&node, &format!("http://{web}:81/"));
    assert!(!ok && out.contains("refused"), "an unknown port of a cluster IP, from the node: {out}");

    // A pod reaching itself through its own Service (hairpin).
    let own = cluster_ip(&node, "client-self");
    let (ok, out) = from_pod(&node, "client", &format!("http://{own}/"));
    assert!(ok && out.trim() == "client", "hairpin: {out}");

    // The rules stay while ferrok (and its containerd) is down, the pods
    // running on, and after it is back.
    node.stop(false);
    let (ok, out) = from_node(&node, &format!("http://{web}/"));
    assert!(ok && pods.contains(out.trim()), "while ferrok is down: {out}");
    let (ok, out) = from_outside(&np);
    assert!(ok && pods.contains(out.trim()), "the node port while ferrok is down: {out}");
    node.launch();
    node.eventually("the service answering after a restart", 30, || {
        pods.contains(from_node(&node, &format!("http://{web}/")).1.trim())
    });
    let (ok, tables) = node.on_host(&["nft", "list", "tables"]);
    assert!(ok && tables.contains("table inet other") && tables.contains("table inet ferrok"), "{tables}");
    let (ok, other) = node.on_host(&["nft", "list", "table", "inet", "other"]);
    assert!(ok && other.contains("chain keep"), "{other}");
}

/// A Service without a selector, with the EndpointSlice written by hand:
/// `internalTrafficPolicy: Local` uses only this node's endpoints, and
/// when no endpoint is ready, the serving terminating ones carry traffic.
#[test]
fn traffic_policies_and_terminating_endpoints() {
    let node = Node::start(&[]);
    node.apply(&manifests(&external_ip(&node)));
    node.eventually("web pods and the client ready", 90, || {
        web_pods(&node).len() == 2 && node.get(&["pod", "client"], "{.status.phase}") == "Running"
    });
    let web = web_pods(&node);
    let (a, b) = (&web[0], &web[1]);
    let slice = |a_cond: &str, b_cond: &str, b_node: &str| {
        format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{name: manual}}
spec: {{internalTrafficPolicy: Local, ports: [{{name: http, port: 80}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: manual-1, labels: {{kubernetes.io/service-name: manual}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
- {{addresses: ["{}"], nodeName: {}, conditions: {a_cond}}}
- {{addresses: ["{}"], nodeName: {b_node}, conditions: {b_cond}}}
"#,
            a.1, node.name, b.1
        )
    };
    node.apply(&slice("{ready: true}", "{ready: true}", "elsewhere"));
    let manual = cluster_ip(&node, "manual");
    node.eventually("the manual service answering", 30, || from_pod(&node, "client", &format!("http://{manual}/")).0);
    let seen = answers(20, || from_pod(&node, "client", &format!("http://{manual}/")));
    assert_eq!(seen, BTreeSet::from([a.0.clone()]), "internalTrafficPolicy Local uses this node's endpoint only");

    // Both endpoints local now, neither ready: the serving one carries traffic.
    node.apply(&slice(
        "{ready: false, serving: true, terminating: true}",
        "{ready: false, serving: false, terminating: true}",
        &node.name,
    ));
    node.eventually("the terminating endpoint serving", 30, || {
        let seen = answers(10, || from_pod(&node, "client", &format!("http://{manual}/")));
        seen == BTreeSet::from([a.0.clone()])
    });
}

/// Runs `f` on a thread inside the node's network namespace (setns is per thread).
fn in_netns<T: Send + 'static>(netns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(format!("/run/netns/{netns}")).expect("netns file");
    std::thread::spawn(move || {
        // SAFETY: setns on this thread only, with a valid namespace file descriptor.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("netns thread")
}

/// A UDP server on `addr` that answers every datagram with `name`.
fn udp_answering(addr: &str, name: &'static str) {
    let socket = std::net::UdpSocket::bind(addr).expect("bind the UDP server");
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((_, from)) = socket.recv_from(&mut buf) {
            let _ = socket.send_to(name.as_bytes(), from);
        }
    });
}

/// When a UDP endpoint goes, the conntrack entries that still send a
/// client's datagrams to it are deleted: the same client (same source
/// port, sending all along) reaches the new endpoint at once instead of
/// the old one until its entry times out.
#[test]
fn a_udp_client_follows_its_service_to_a_new_endpoint() {
    let node = Node::start(&[]);
    // The endpoints are two servers of the test itself, on the host side of
    // the node's link: traffic never leaves this machine.
    udp_answering(&format!("{}:7001", node.host_ip), "A");
    udp_answering(&format!("{}:7002", node.host_ip), "B");
    let slice = |name: &str, port: u16| {
        format!(
            r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}, labels: {{kubernetes.io/service-name: udp}}}}
addressType: IPv4
ports: [{{name: dgram, port: {port}, protocol: UDP}}]
endpoints: [{{addresses: ["{}"], conditions: {{ready: true}}}}]
"#,
            node.host_ip
        )
    };
    node.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: udp}}\nspec: {{ports: [{{name: dgram, port: 5000, protocol: UDP}}]}}\n---{}",
        slice("udp-a", 7001)
    ));
    let vip = format!("{}:5000", cluster_ip(&node, "udp"));
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    // One client socket, one source port, a datagram every 100 ms.
    let (netns, node_ip) = (node.netns.clone(), node.ip.clone());
    let client = std::thread::spawn(move || {
        in_netns(&netns, move || {
            let socket = std::net::UdpSocket::bind(format!("{node_ip}:40000")).expect("bind the client");
            socket.set_read_timeout(Some(std::time::Duration::from_millis(100))).expect("timeout");
            let mut buf = [0u8; 64];
            while stop_rx.try_recv().is_err() {
                let _ = socket.send_to(b"?", &vip);
                if let Ok(n) = socket.recv(&mut buf) {
                    let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        })
    });
    let wait_for = |want: &str, secs: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(got) if got == want => return true,
                Ok(_) => continue,
                Err(_) => return false,
            }
        }
    };
    assert!(wait_for("A", 30), "the client never reached endpoint A");
    node.ok(&["delete", "endpointslice", "udp-a"]);
    node.apply(&slice("udp-b", 7002));
    let moved = wait_for("B", 10);
    let _ = stop_tx.send(());
    let _ = client.join();
    assert!(moved, "the client kept its stale conntrack entry to the removed endpoint");
}

/// Whether the Endpoints `name` (in default) exists.
fn endpoints_exist(s: &common::ApiServer, name: &str) -> bool {
    let (_, out) = common::kubectl(s, &["get", "endpoints", name, "--ignore-not-found", "-o", "name"]);
    out.trim() == format!("endpoints/{name}")
}

/// A Service made and deleted: once its Endpoints are gone, the endpoints
/// controller has handled every event before the deletion.
fn service_round_trip(s: &common::ApiServer, name: &str) {
    common::create(
        s,
        &format!(
            r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}"}},
  "spec":{{"selector":{{"app":"{name}"}},"ports":[{{"port":80}}]}}}}"#
        ),
    );
    common::eventually("the Service's Endpoints", || endpoints_exist(s, name));
    let (ok, out) = common::kubectl(s, &["delete", "service", name]);
    assert!(ok, "{out}");
    common::eventually("the deleted Service's Endpoints to go", || !endpoints_exist(s, name));
}

/// An Endpoints object made by hand, for no Service, is left alone (upstream
/// deletes Endpoints when their Service is deleted, and once at start for
/// those whose Service went while no controller ran).
#[test]
fn endpoints_without_a_service_stay_until_a_restart_finds_them_left_over() {
    let server = common::ApiServer::start();
    common::create(
        &server,
        r#"{"apiVersion":"v1","kind":"Endpoints","metadata":{"name":"testservice","labels":{"test-endpoint-static":"true"}},
  "subsets":[{"addresses":[{"ip":"10.0.0.24"}],"ports":[{"name":"http","port":80,"protocol":"TCP"}]}]}"#,
    );
    service_round_trip(&server, "first");
    assert!(endpoints_exist(&server, "testservice"));
    let (ok, out) = common::kubectl(&server, &["label", "endpoints", "testservice", "test-service=updated"]);
    assert!(ok, "{out}");
    service_round_trip(&server, "second");
    let (_, out) = common::kubectl(
        &server,
        &["get", "endpoints", "-A", "-l", "test-endpoint-static=true", "-o", "jsonpath={.items[*].metadata.name}"],
    );
    assert_eq!(out, "testservice");

    // A Service's own Endpoints survive a restart; the hand-made ones,
    // which no Service has, are deleted as leftovers.
    common::create(
        &server,
        r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"kept"},"spec":{"selector":{"app":"kept"},"ports":[{"port":80}]}}"#,
    );
    common::eventually("the kept Service's Endpoints", || endpoints_exist(&server, "kept"));
    let (dir, port) = server.stop();
    let server = common::ApiServer::start_in(dir, port);
    common::eventually("the leftover Endpoints to go", || !endpoints_exist(&server, "testservice"));
    assert!(endpoints_exist(&server, "kept"));
}

//! Services on a real node: ClusterIP, NodePort, ExternalIPs and
//! LoadBalancer reached with wget from pods, from the node and from outside
//! it (the host side of the test's network namespace); session affinity,
//! both traffic policies, the terminating fallback, a reject for a Service
//! without endpoints, hairpin traffic, and the rules surviving a restart of
//! ferrok while another table on the host is left alone.

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
    node.eventually("the web service answering from the node", 30, || {
        from_node(&node, &format!("http://{web}/")).1.starts_with("web-")
    });

    // ClusterIP, from the node and from a pod, spread over both endpoints.
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

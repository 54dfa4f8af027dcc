//! The built-in ServiceLB against a real `ferrok server`, driven with
//! kubectl. No kubelet: the test plays the nodes (Node objects whose status
//! it patches: Ready or not, addresses), which is all ServiceLB reads.

mod common;

use common::node::{Node, BUSYBOX};
use common::{apply, eventually, kubectl};

use std::process::Command;
use std::sync::Once;

fn start() -> common::ApiServer {
    static ENV: Once = Once::new();
    // The fake nodes send no heartbeats: keep node lifecycle from marking
    // them Unknown while the test runs.
    ENV.call_once(|| unsafe {
        std::env::set_var("FERROK_NODE_MONITOR_GRACE_PERIOD", "600s");
        std::env::set_var("FERROK_NODE_STARTUP_GRACE_PERIOD", "600s");
    });
    common::ApiServer::start()
}

fn ok(s: &common::ApiServer, args: &[&str]) -> String {
    let (ok, out) = kubectl(s, args);
    assert!(ok, "kubectl {args:?} failed: {out}");
    out
}

fn get(s: &common::ApiServer, args: &[&str], path: &str) -> String {
    let mut a: Vec<&str> = vec!["get"];
    a.extend(args);
    let jp = format!("jsonpath={path}");
    a.extend(["-o", &jp]);
    kubectl(s, &a).1
}

fn now() -> String {
    let out = Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]).output().expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A node with `addresses` ((type, address)), Ready or not.
fn node(s: &common::ApiServer, name: &str, ready: bool, addresses: &[(&str, &str)]) {
    if !kubectl(s, &["get", "node", name]).0 {
        apply(s, &format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n"));
    }
    let t = now();
    let addrs: Vec<String> = addresses.iter().map(|(k, a)| format!(r#"{{"type":"{k}","address":"{a}"}}"#)).collect();
    let status = format!(
        r#"{{"status":{{"conditions":[{{"type":"Ready","status":"{}","reason":"Test","lastHeartbeatTime":"{t}","lastTransitionTime":"{t}"}}],"addresses":[{}]}}}}"#,
        if ready { "True" } else { "False" },
        addrs.join(",")
    );
    ok(s, &["patch", "node", name, "--subresource=status", "--type=merge", "-p", &status]);
}

fn lb(s: &common::ApiServer, name: &str, port: u16, protocol: &str, extra_spec: &str) {
    apply(
        s,
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  type: LoadBalancer\n  selector:\n    app: {name}\n  ports:\n  - port: {port}\n    protocol: {protocol}\n{extra_spec}"
        ),
    );
}

fn ingress(s: &common::ApiServer, svc: &str) -> String {
    get(s, &["svc", svc], "{.status.loadBalancer.ingress[*].ip}")
}

fn wait_ingress(s: &common::ApiServer, svc: &str, want: &str) {
    eventually(&format!("{svc}'s ingress to be {want:?}"), || ingress(s, svc) == want);
}

#[test]
fn servicelb_publishes_the_serving_nodes_addresses() {
    let s = start();
    node(&s, "n1", true, &[("InternalIP", "10.0.0.1"), ("Hostname", "n1")]);
    node(&s, "n2", true, &[("InternalIP", "10.0.0.2")]);

    // The nodes' InternalIPs, sorted, as VIPs; node ports allocated.
    lb(&s, "web", 80, "TCP", "");
    wait_ingress(&s, "web", "10.0.0.1 10.0.0.2");
    assert_eq!(get(&s, &["svc", "web"], "{.status.loadBalancer.ingress[*].ipMode}"), "VIP VIP");
    let node_port: u16 = get(&s, &["svc", "web"], "{.spec.ports[0].nodePort}").parse().expect("a node port");
    assert!((30000..=32767).contains(&node_port));
    assert!(ok(&s, &["get", "svc", "web"]).contains("10.0.0.1,10.0.0.2"), "kubectl shows the addresses");

    // Node changes: NotReady leaves, a new node joins.
    node(&s, "n2", false, &[("InternalIP", "10.0.0.2")]);
    wait_ingress(&s, "web", "10.0.0.1");
    node(&s, "n3", true, &[("InternalIP", "10.0.0.3")]);
    wait_ingress(&s, "web", "10.0.0.1 10.0.0.3");

    // A later Service on the same port and protocol finds the nodes taken;
    // another protocol does not clash; the reason is an Event.
    lb(&s, "web-late", 80, "TCP", "");
    lb(&s, "dns", 80, "UDP", "");
    wait_ingress(&s, "dns", "10.0.0.1 10.0.0.3");
    eventually("a port-in-use Event on web-late", || {
        let events = kubectl(&s, &["get", "events", "--field-selector", "involvedObject.name=web-late"]).1;
        events.contains("LoadBalancerPortInUse") && events.contains("port 80/TCP is already served there")
    });
    assert_eq!(ingress(&s, "web-late"), "");
    assert!(ok(&s, &["get", "svc", "web-late"]).contains("<pending>"));

    // Another class is left alone; ferrok's own class is served.
    lb(&s, "foreign", 8080, "TCP", "  loadBalancerClass: example.com/other-lb\n");
    lb(&s, "named", 8081, "TCP", "  loadBalancerClass: ferrok.io/servicelb\n");
    wait_ingress(&s, "named", "10.0.0.1 10.0.0.3");
    assert_eq!(ingress(&s, "foreign"), "", "a Service of another class is not ours");

    // No longer a LoadBalancer: cleared, and its port goes to the later one.
    ok(&s, &["patch", "svc", "web", "--type=merge", "-p", r#"{"spec":{"type":"ClusterIP"}}"#]);
    wait_ingress(&s, "web", "");
    assert_eq!(get(&s, &["svc", "web"], "{.spec.ports[0].nodePort}"), "", "node ports released");
    wait_ingress(&s, "web-late", "10.0.0.1 10.0.0.3");
    // And back.
    ok(&s, &["patch", "svc", "web", "--type=merge", "-p", r#"{"spec":{"type":"LoadBalancer"}}"#]);
    eventually("web, the older Service, to take its port back", || {
        ingress(&s, "web") == "10.0.0.1 10.0.0.3" && ingress(&s, "web-late").is_empty()
    });

    // ExternalIPs win over InternalIPs.
    node(&s, "n3", true, &[("InternalIP", "10.0.0.3"), ("ExternalIP", "192.0.2.3")]);
    wait_ingress(&s, "named", "192.0.2.3");

    // The enablelb label: once any node has it, only nodes labelled true serve.
    ok(&s, &["label", "node", "n1", "svccontroller.ferrok.io/enablelb=true"]);
    wait_ingress(&s, "named", "10.0.0.1");
    ok(&s, &["label", "node", "n3", "svccontroller.ferrok.io/enablelb=false"]);
    ok(&s, &["label", "node", "n1", "svccontroller.ferrok.io/enablelb-"]);
    wait_ingress(&s, "named", "");
    ok(&s, &["label", "node", "n3", "svccontroller.ferrok.io/enablelb-"]);
    wait_ingress(&s, "named", "192.0.2.3");
}

#[test]
fn load_balancer_node_ports_follow_the_spec() {
    let s = start();
    // allocateLoadBalancerNodePorts: false: no node port.
    lb(&s, "no-node-ports", 80, "TCP", "  allocateLoadBalancerNodePorts: false\n");
    assert_eq!(get(&s, &["svc", "no-node-ports"], "{.spec.ports[0].nodePort}"), "");
    assert_eq!(get(&s, &["svc", "no-node-ports"], "{.spec.healthCheckNodePort}"), "");
    // externalTrafficPolicy: Local: a health check node port beside the node port.
    lb(&s, "local", 80, "TCP", "  externalTrafficPolicy: Local\n");
    let hc: u16 = get(&s, &["svc", "local"], "{.spec.healthCheckNodePort}").parse().expect("a health check port");
    let np: u16 = get(&s, &["svc", "local"], "{.spec.ports[0].nodePort}").parse().expect("a node port");
    assert!((30000..=32767).contains(&hc) && hc != np);
    assert_eq!(get(&s, &["svc", "local"], "{.spec.allocateLoadBalancerNodePorts}"), "true");
    // Back to Cluster: the health check port goes.
    ok(&s, &["patch", "svc", "local", "--type=merge", "-p", r#"{"spec":{"externalTrafficPolicy":"Cluster"}}"#]);
    assert_eq!(get(&s, &["svc", "local"], "{.spec.healthCheckNodePort}"), "");
    // Not allowed where it means nothing.
    let (accepted, out) = kubectl(
        &s,
        &["patch", "svc", "no-node-ports", "--type=merge", "-p", r#"{"spec":{"healthCheckNodePort":31999}}"#],
    );
    assert!(!accepted && out.contains("healthCheckNodePort"), "{out}");
    // Defaults upstream sets.
    assert_eq!(get(&s, &["svc", "local"], "{.spec.externalTrafficPolicy}"), "Cluster");
}

/// On a real node with the service proxy: the ingress is the node's own
/// address, and the Service answers there from outside and from a pod.
#[test]
fn a_load_balancer_answers_on_the_node_address() {
    let node = Node::start(&[]);
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: web, labels: {{app: web}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: c, image: "{BUSYBOX}", command: ["sh", "-c", "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"],
      readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: web-lb}}
spec: {{type: LoadBalancer, selector: {{app: web}}, ports: [{{port: 8088, targetPort: 8080}}]}}
"#
    ));
    node.eventually("the ingress to be the node's address", 30, || {
        node.get(&["svc", "web-lb"], "{.status.loadBalancer.ingress[*].ip}") == node.ip
    });
    let url = format!("http://{}:8088/", node.ip);
    let wget = |url: &str| {
        let out = Command::new("timeout").args(["5", "busybox", "wget", "-q", "-O-", url]).output().expect("wget");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    node.eventually("the load balancer answering from outside the node", 60, || wget(&url) == (true, "web".into()));
    let from_pod = node.try_exec("default", "web", "c", &format!("busybox timeout 5 wget -q -O- {url}"));
    assert!(from_pod.0 && from_pod.1.trim() == "web", "from a pod (hairpin through the node address): {from_pod:?}");
    // No longer a LoadBalancer: the ingress goes.
    node.ok(&["patch", "svc", "web-lb", "--type=merge", "-p", r#"{"spec":{"type":"ClusterIP"}}"#]);
    node.eventually("the ingress cleared", 20, || {
        node.get(&["svc", "web-lb"], "{.status.loadBalancer.ingress}").is_empty()
    });
}

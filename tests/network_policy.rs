//! NetworkPolicy for real: `ferrok server` in a network namespace of its
//! own, busybox pods serving with httpd and probing with `wget`, policies
//! applied with kubectl. A denied connection is dropped, so each probe is
//! bounded by `timeout` (busybox's `wget -T` crashes). Needs root and the
//! packages `scripts/deps` installs; nothing here skips itself.

mod common;

use std::time::{Duration, Instant};

use common::node::{Node, BUSYBOX};

/// How long one probe waits before calling the connection dropped.
const PROBE_SECS: u32 = 2;
/// How long a policy change may take to show in traffic.
const PROGRAMMED: Duration = Duration::from_secs(30);

/// A pod serving `<name>` over HTTP on 8080 (container port `http`), 9090
/// and 9091, with `labels` (`k: v` pairs, YAML flow style).
fn server(node: &Node, ns: &str, name: &str, labels: &str) {
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}, labels: {{{labels}}}}}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: c
    image: {BUSYBOX}
    ports: [{{name: http, containerPort: 8080}}]
    command: ["sh", "-c", "mkdir -p /www && echo served-by-{name} > /www/index.html && httpd -p 8080 -h /www && httpd -p 9090 -h /www && exec httpd -f -p 9091 -h /www"]
"#
    ));
}

/// A pod that only probes others.
fn client(node: &Node, ns: &str, name: &str, labels: &str) {
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}, labels: {{{labels}}}}}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sleep", "1000000"]
"#
    ));
}

fn running(node: &Node, pods: &[(&str, &str)]) {
    for (ns, pod) in pods {
        node.eventually(&format!("{ns}/{pod} running"), 90, || {
            node.get(&["pod", "-n", ns, pod], "{.status.phase}") == "Running"
        });
    }
}

fn pod_ip(node: &Node, ns: &str, pod: &str) -> String {
    let ip = node.get(&["pod", "-n", ns, pod], "{.status.podIP}").trim().to_string();
    assert!(!ip.is_empty(), "{ns}/{pod} has no address");
    ip
}

/// Whether `from` (ns/pod) gets an HTTP answer from `to:port`.
fn reaches(node: &Node, from: (&str, &str), to: &str, port: u16) -> bool {
    let out = node.exec(
        from.0,
        from.1,
        "c",
        &format!("busybox timeout -s KILL {PROBE_SECS} wget -q -O- http://{to}:{port}/ 2>&1; true"),
    );
    out.contains("served-by-")
}

/// Waits until `from` reaching `to:port` is `expected`.
fn until(node: &Node, from: (&str, &str), to: &str, port: u16, expected: bool) -> Duration {
    let start = Instant::now();
    let what = format!("{}/{} {} {to}:{port}", from.0, from.1, if expected { "reaching" } else { "blocked from" });
    node.eventually(&what, PROGRAMMED.as_secs(), || reaches(node, from, to, port) == expected);
    start.elapsed()
}

fn assert_reach(node: &Node, from: (&str, &str), to: &str, port: u16, expected: bool) {
    assert_eq!(
        reaches(node, from, to, port),
        expected,
        "{}/{} → {to}:{port} should be {}\n{}",
        from.0,
        from.1,
        if expected { "allowed" } else { "denied" },
        nft_table(node)
    );
}

fn nft_table(node: &Node) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &node.netns, "nft", "list", "table", "inet", "ferrok"])
        .output()
        .expect("nft");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// The node itself (its network namespace) fetching from a pod.
fn host_reaches(node: &Node, to: &str, port: u16) -> bool {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &node.netns, "timeout", "5", "busybox", "wget", "-q", "-O-"])
        .arg(format!("http://{to}:{port}/"))
        .output()
        .expect("wget from the node");
    String::from_utf8_lossy(&out.stdout).contains("served-by-")
}

/// The pid of a pod's container (its network namespace is the pod's).
fn task_pid(node: &Node, ns: &str, pod: &str) -> u32 {
    let id = node.container_id(ns, pod, "c");
    let tasks = node.ctr(&["tasks", "ls"]);
    tasks
        .lines()
        .find(|l| l.starts_with(&id))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no task for {ns}/{pod} in\n{tasks}"))
}

/// A probe from a pod's network namespace with the host's busybox (works
/// while ferrok and containerd are down).
fn reaches_from_netns(pid: u32, to: &str, port: u16) -> bool {
    let out = std::process::Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-n", "timeout", "-s", "KILL", &PROBE_SECS.to_string()])
        .args(["busybox", "wget", "-q", "-O-", &format!("http://{to}:{port}/")])
        .output()
        .expect("nsenter");
    String::from_utf8_lossy(&out.stdout).contains("served-by-")
}

/// ferrok's own figures: how long each batch of watch events took to
/// reach the table (from the event's arrival to the transaction done).
fn programming_times(node: &Node) -> Vec<f64> {
    let mut times: Vec<f64> = node
        .log()
        .lines()
        .filter(|l| l.contains("network policies programmed"))
        .filter_map(|l| l.split("elapsed_ms=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    times.sort_by(f64::total_cmp);
    times
}

fn policy(node: &Node, ns: &str, name: &str, spec: &str) {
    node.apply(&format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n{spec}"
    ));
}

fn delete_policy(node: &Node, ns: &str, name: &str) {
    node.ok(&["delete", "networkpolicy", "-n", ns, name]);
}

#[test]
fn ingress_policies_select_peers_and_ports_and_survive_a_restart() {
    let mut node = Node::start(&[]);
    for ns in ["np", "friends", "strangers"] {
        node.ok(&["create", "namespace", ns]);
    }
    node.ok(&["label", "namespace", "friends", "team=friends"]);
    server(&node, "np", "web", "app: web");
    client(&node, "np", "client", "role: client");
    client(&node, "np", "other", "role: other");
    client(&node, "friends", "client", "role: client");
    client(&node, "friends", "other", "role: other");
    client(&node, "strangers", "client", "role: client");
    running(
        &node,
        &[
            ("np", "web"),
            ("np", "client"),
            ("np", "other"),
            ("friends", "client"),
            ("friends", "other"),
            ("strangers", "client"),
        ],
    );
    let web = pod_ip(&node, "np", "web");
    let np_client = ("np", "client");
    let np_other = ("np", "other");
    let friend = ("friends", "client");
    let friend_other = ("friends", "other");
    let stranger = ("strangers", "client");

    // No policy: everything reaches everything.
    assert_reach(&node, stranger, &web, 8080, true);

    // Default deny ingress in np; the node itself still reaches its pods.
    policy(&node, "np", "default-deny", "  podSelector: {}\n  policyTypes: [Ingress]\n");
    let took = until(&node, np_other, &web, 8080, false);
    eprintln!("default deny live after {took:?}");
    assert_reach(&node, np_client, &web, 8080, false);
    assert_reach(&node, friend, &web, 8080, false);
    assert!(host_reaches(&node, &web, 8080), "the node reaches its pods under a default deny");

    // podSelector: pods of the policy's namespace only.
    policy(
        &node,
        "np",
        "from-clients",
        "  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {role: client}}\n",
    );
    until(&node, np_client, &web, 8080, true);
    assert_reach(&node, np_other, &web, 8080, false);
    assert_reach(&node, friend, &web, 8080, false);
    delete_policy(&node, "np", "from-clients");
    until(&node, np_client, &web, 8080, false);

    // namespaceSelector: every pod of the matching namespaces.
    policy(
        &node,
        "np",
        "from-friends",
        "  podSelector: {}\n  ingress:\n  - from:\n    - namespaceSelector: {matchLabels: {team: friends}}\n",
    );
    until(&node, friend, &web, 8080, true);
    assert_reach(&node, friend_other, &web, 8080, true);
    assert_reach(&node, stranger, &web, 8080, false);
    assert_reach(&node, np_client, &web, 8080, false);

    // Both in one peer: the client pods of the friends' namespaces only.
    policy(
        &node,
        "np",
        "from-friends",
        "  podSelector: {}\n  ingress:\n  - from:\n    - namespaceSelector: {matchLabels: {team: friends}}\n      podSelector: {matchLabels: {role: client}}\n",
    );
    until(&node, friend_other, &web, 8080, false);
    assert_reach(&node, friend, &web, 8080, true);
    assert_reach(&node, stranger, &web, 8080, false);
    delete_policy(&node, "np", "from-friends");
    until(&node, friend, &web, 8080, false);

    // ipBlock with except: the pod network but the stranger's address.
    let stranger_ip = pod_ip(&node, "strangers", "client");
    policy(
        &node,
        "np",
        "from-block",
        &format!("  podSelector: {{}}\n  ingress:\n  - from:\n    - ipBlock: {{cidr: 10.42.0.0/16, except: [{stranger_ip}/32]}}\n"),
    );
    until(&node, friend, &web, 8080, true);
    assert_reach(&node, np_other, &web, 8080, true);
    assert_reach(&node, stranger, &web, 8080, false);
    delete_policy(&node, "np", "from-block");
    until(&node, friend, &web, 8080, false);

    // Ports: a range with endPort, and a named port (the web pod's `http`).
    policy(&node, "np", "ports", "  podSelector: {}\n  ingress:\n  - ports:\n    - {port: 9090, endPort: 9091}\n");
    until(&node, stranger, &web, 9091, true);
    assert_reach(&node, stranger, &web, 9090, true);
    assert_reach(&node, stranger, &web, 8080, false);
    policy(&node, "np", "ports", "  podSelector: {}\n  ingress:\n  - ports:\n    - {port: http, protocol: TCP}\n");
    until(&node, stranger, &web, 8080, true);
    assert_reach(&node, stranger, &web, 9090, false);
    delete_policy(&node, "np", "ports");
    until(&node, stranger, &web, 8080, false);

    // A pod coming later that matches a selector is allowed, and a pod
    // relabelled into it too, with nothing restarted.
    policy(
        &node,
        "np",
        "from-late",
        "  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {role: late}}\n",
    );
    until(&node, np_client, &web, 8080, false);
    client(&node, "np", "late", "role: late");
    running(&node, &[("np", "late")]);
    let took = until(&node, ("np", "late"), &web, 8080, true);
    eprintln!("new pod allowed {took:?} after it ran");
    node.ok(&["label", "pod", "-n", "np", "other", "role=late", "--overwrite"]);
    let took = until(&node, np_other, &web, 8080, true);
    eprintln!("relabelled pod allowed {took:?} after the label change (probe period {PROBE_SECS}s)");
    assert_reach(&node, np_client, &web, 8080, false);

    // A restart of ferrok: the rules stay while it is down (probed from
    // the pods' network namespaces, as containerd is down too) and after.
    let client_pid = task_pid(&node, "np", "client");
    let other_pid = task_pid(&node, "np", "other");
    node.stop(false);
    assert!(
        !reaches_from_netns(client_pid, &web, 8080),
        "np/client blocked while ferrok is down\n{}",
        nft_table(&node)
    );
    assert!(reaches_from_netns(other_pid, &web, 8080), "np/other allowed while ferrok is down\n{}", nft_table(&node));
    node.launch();
    let stranger_reaches = reaches(&node, stranger, &web, 8080);
    assert!(!stranger_reaches, "blocked right after the restart\n{}", nft_table(&node));
    assert_reach(&node, ("np", "late"), &web, 8080, true);
    assert_reach(&node, np_client, &web, 8080, false);
    // And still enforced by watch after the restart.
    node.ok(&["label", "pod", "-n", "np", "client", "role=late", "--overwrite"]);
    until(&node, np_client, &web, 8080, true);

    // Deleting the policies restores traffic.
    delete_policy(&node, "np", "from-late");
    assert_reach(&node, stranger, &web, 8080, false);
    delete_policy(&node, "np", "default-deny");
    until(&node, stranger, &web, 8080, true);
    assert!(!nft_table(&node).contains("np-i-"), "no policy chain left\n{}", nft_table(&node));
    let times = programming_times(&node);
    assert!(!times.is_empty(), "ferrok logs each programming");
    eprintln!(
        "programming (event to nft done), {} batches: p50 {:.1} ms, max {:.1} ms",
        times.len(),
        times[times.len() / 2],
        times[times.len() - 1]
    );
}

#[test]
fn egress_policies_deny_and_allow_to_pods_and_the_node() {
    let node = Node::start(&[]);
    for ns in ["out", "elsewhere"] {
        node.ok(&["create", "namespace", ns]);
    }
    client(&node, "out", "client", "app: client");
    server(&node, "out", "web", "app: web");
    server(&node, "elsewhere", "web", "app: web");
    running(&node, &[("out", "client"), ("out", "web"), ("elsewhere", "web")]);
    let web = pod_ip(&node, "out", "web");
    let far = pod_ip(&node, "elsewhere", "web");
    let me = ("out", "client");
    // The API server on the node's own address: reached (some HTTP answer
    // or a refusal, exit code 1) or dropped (killed by timeout, 137).
    let apiserver = |node: &Node| {
        let out = node.exec(
            "out",
            "client",
            "c",
            &format!(
                "busybox timeout -s KILL {PROBE_SECS} wget -q -O- http://{}:{}/ >/dev/null 2>&1; echo rc=$?",
                node.ip, node.port
            ),
        );
        !out.contains("rc=137")
    };
    assert_reach(&node, me, &web, 8080, true);
    assert!(apiserver(&node), "the node is reachable before any policy");

    policy(&node, "out", "deny-egress", "  podSelector: {}\n  policyTypes: [Egress]\n");
    until(&node, me, &web, 8080, false);
    assert_reach(&node, me, &far, 8080, false);
    assert!(!apiserver(&node), "egress to the node itself is denied too");
    // The cluster DNS (in ferrok, behind the kube-dns Service) still answers.
    let lookup = node.exec(
        "out",
        "client",
        "c",
        &format!("busybox timeout -s KILL {PROBE_SECS} nslookup kubernetes.default.svc.cluster.local 2>&1; echo rc=$?"),
    );
    assert!(lookup.contains("rc=0") && lookup.contains("10.43.0.1"), "DNS under default-deny egress: {lookup}");
    // Ingress is not isolated: the web pods (also egress-isolated) still
    // answer, since replies of allowed connections pass.
    assert!(host_reaches(&node, &web, 8080));

    // Allowed to the web pods of the own namespace, on 8080 only.
    policy(
        &node,
        "out",
        "to-web",
        "  podSelector: {matchLabels: {app: client}}\n  policyTypes: [Egress]\n  egress:\n  - to:\n    - podSelector: {matchLabels: {app: web}}\n    ports:\n    - {port: http}\n",
    );
    until(&node, me, &web, 8080, true);
    assert_reach(&node, me, &web, 9090, false);
    assert_reach(&node, me, &far, 8080, false);

    // To other namespaces by namespaceSelector, any port.
    node.ok(&["label", "namespace", "elsewhere", "zone=far"]);
    policy(
        &node,
        "out",
        "to-far",
        "  podSelector: {}\n  policyTypes: [Egress]\n  egress:\n  - to:\n    - namespaceSelector: {matchLabels: {zone: far}}\n",
    );
    until(&node, me, &far, 9090, true);

    // To the node by ipBlock.
    policy(
        &node,
        "out",
        "to-node",
        &format!(
            "  podSelector: {{}}\n  policyTypes: [Egress]\n  egress:\n  - to:\n    - ipBlock: {{cidr: {}/32}}\n",
            node.ip
        ),
    );
    node.eventually("the node reachable by ipBlock", PROGRAMMED.as_secs(), || apiserver(&node));

    for p in ["deny-egress", "to-web", "to-far", "to-node"] {
        delete_policy(&node, "out", p);
    }
    until(&node, me, &web, 9090, true);
}

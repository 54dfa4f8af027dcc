//! `ferrok agent` on other hosts: a server and two agents, each in a
//! network namespace of its own with its own containerd and data dir, one
//! agent on the server's segment and one behind a router (tests/common/cluster.rs).
//! Joining with the token (and refusing a wrong one or a wrong CA hash,
//! registering nothing), node passwords, what a kubelet credential may
//! not touch, a DaemonSet on every node, pods reaching each other across
//! nodes by pod IP, Service and DNS name, a NetworkPolicy across nodes,
//! a stopped agent's node going NotReady and its pods replaced, a
//! restarted agent keeping its pods, and an agent following its server's
//! `--disable coredns` and removing the local-path volumes released on it.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::node::{netns_exec, Node, BUSYBOX};

/// Runs `ferrok agent` with `args` in `node`'s namespace to its end (it
/// must end within `secs`); success and its stderr.
fn agent_run_to_end(node: &Node, args: &[&str], secs: u64) -> (bool, String) {
    let mut child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", node.netns))
        .arg(common::ferrok_bin())
        .arg("agent")
        .arg("--data-dir")
        .arg(node.dir.path())
        .args(["--node-name", &node.name])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("ferrok agent");
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut err = String::new();
            use std::io::Read;
            let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
            return (status.success(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ferrok agent {args:?} did not end within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `ferrok token <args>` on the server's host (its namespace) with its data
/// dir: success, stdout, stderr.
fn ferrok_token(server: &Node, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", server.netns))
        .arg(common::ferrok_bin())
        .arg("token")
        .args(args)
        .arg("--data-dir")
        .arg(server.dir.path())
        .args(["--server", &format!("https://127.0.0.1:{}", server.port)])
        .output()
        .expect("ferrok token");
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

fn server_token(cluster: &Cluster) -> String {
    std::fs::read_to_string(cluster.server().dir.path().join("server/token")).expect("token").trim().to_string()
}

/// The log of the node's newest process (tests/common/node.rs writes one file per start).
fn latest_log(node: &Node) -> String {
    let n = (1..).take_while(|i| node.dir.path().join(format!("server-{i}.log")).exists()).last().unwrap_or(1);
    std::fs::read_to_string(node.dir.path().join(format!("server-{n}.log"))).unwrap_or_default()
}

fn nodes(node: &Node) -> Vec<String> {
    node.get(&["nodes"], "{.items[*].metadata.name}").split_whitespace().map(str::to_string).collect()
}

/// Whether a DNS server listens on port 53 in the node's network namespace.
fn dns_listening(node: &Node) -> bool {
    netns_exec(&node.netns, &["ss", "-Hlun", "sport", "=", ":53"]).contains(":53")
}

fn ready(node: &Node, name: &str) -> String {
    node.get(&["node", name], r#"{.status.conditions[?(@.type=="Ready")].status}"#)
}

#[test]
fn agents_join_with_the_token_and_only_with_it() {
    // The server's flannel backend is its agents' (one L2 segment here).
    let mut cluster = Cluster::start(&["--flannel-backend=host-gw"]);
    let token = server_token(&cluster);
    let (hash_and_rest, secret) = token.rsplit_once(':').expect("K10…::server:secret");
    let url = format!("https://{}:{}", cluster.server().ip, cluster.server().port);
    let mut a = cluster.lan_agent(&[]);

    // A CA hash that is not the server's: refused before the token is sent.
    let wrong_hash = format!("K10{}::server:{secret}", "0".repeat(64));
    let (ok, err) = agent_run_to_end(&a, &["--server", &url, "--token", &wrong_hash], 30);
    assert!(!ok && err.contains("is not the one the token names"), "{err}");
    // The right CA, a wrong secret: refused by the server.
    let wrong_secret = format!("{hash_and_rest}:not-the-secret");
    let (ok, err) = agent_run_to_end(&a, &["--server", &url, "--token", &wrong_secret], 30);
    assert!(!ok && err.contains("refused the token"), "{err}");
    // No token at all: a one-line error naming the flag.
    let (ok, err) = agent_run_to_end(&a, &["--server", &url], 10);
    assert!(!ok && err.contains("--token"), "{err}");
    assert_eq!(nodes(cluster.server()), vec![cluster.server().name.clone()], "nothing registered");
    let secrets = cluster.server().get(&["secrets", "-n", "kube-system"], "{.items[*].metadata.name}");
    assert!(!secrets.contains("node-password"), "{secrets}");

    // The right token: the agent joins and its node turns Ready.
    a.launch();
    assert_eq!(ready(cluster.server(), &a.name), "True");
    // It serves the cluster DNS itself, as the server's node does.
    a.eventually("the agent's own cluster DNS", 30, || dns_listening(&a));
    let backend = r#"{.metadata.annotations.flannel\.alpha\.coreos\.com/backend-type}"#;
    a.eventually("the agent on the server's backend", 30, || {
        cluster.server().get(&["node", &a.name], backend) == "host-gw"
    });
    // Its credentials: keys made here, a client certificate for its node name.
    let agent_dir = a.dir.path().join("agent");
    for f in ["client-kubelet.key", "serving-kubelet.key", "node-password"] {
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(agent_dir.join(f)).expect("credential file").permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    let subject = Command::new("openssl")
        .args(["x509", "-noout", "-subject", "-in"])
        .arg(agent_dir.join("client-kubelet.crt"))
        .output()
        .expect("openssl");
    let subject = String::from_utf8_lossy(&subject.stdout).to_string();
    assert!(
        subject.contains(&format!("CN = system:node:{}", a.name)) && subject.contains("O = system:nodes"),
        "{subject}"
    );
    let secrets = cluster.server().get(&["secrets", "-n", "kube-system"], "{.items[*].metadata.name}");
    assert!(secrets.contains(&format!("{}.node-password.ferrok", a.name)), "{secrets}");
    // The API server reaches the agent's kubelet (its serving certificate is the server CA's).
    a.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: on-a}}\nspec:\n  nodeName: {}\n  containers:\n  - {{name: c, image: \"{BUSYBOX}\", command: [\"sh\", \"-c\", \"echo hello from a; exec sleep 3600\"]}}\n",
        a.name
    ));
    a.eventually("the pod on the agent running", 90, || a.get(&["pod", "on-a"], "{.status.phase}") == "Running");
    a.eventually("its logs through the API server", 30, || a.kubectl(&["logs", "on-a"]).1.contains("hello from a"));

    // Another machine taking the same node name: refused by its node password.
    let mut impostor = cluster.lan_agent(&[]);
    impostor.name = a.name.clone();
    let (ok, err) = agent_run_to_end(&impostor, &["--server", &url, "--token", &token], 30);
    assert!(!ok && err.contains("node password rejected"), "{err}");
    drop(impostor);

    // A bootstrap token from `ferrok token create` joins a node too, while valid.
    let (ok, _, err) = ferrok_token(cluster.server(), &["create", "not-a-token"]);
    assert!(!ok && err.trim().lines().count() == 1 && err.contains("[a-z0-9]{6}.[a-z0-9]{16}"), "{err}");
    let (ok, out, err) = ferrok_token(cluster.server(), &["create", "--ttl", "1h", "--description", "edge devices"]);
    assert!(ok && err.is_empty() && out.lines().count() == 1, "{out}{err}");
    let bootstrap = out.trim().to_string();
    let ca_part = hash_and_rest.split("::").next().expect("K10hash");
    let (prefix, id_secret) = bootstrap.split_once("::").expect("K10<hash>::<id>.<secret>");
    assert_eq!(prefix, ca_part, "the token names the server's CA");
    let id = id_secret.split('.').next().expect("<id>.<secret>").to_string();
    let (ok, list, err) = ferrok_token(cluster.server(), &["list"]);
    let line = list.lines().find(|l| l.starts_with(id_secret)).unwrap_or_else(|| panic!("{list}\n{err}"));
    assert!(ok && line.contains("edge devices") && line.contains("authentication,signing"), "{list}");
    assert!(line.contains("system:bootstrappers:ferrok:default-node-token"), "{list}");
    let mut c = cluster.lan_agent(&[]);
    if let common::node::Role::Agent { token_file, .. } = &mut c.role {
        let file = c.dir.path().join("bootstrap-token");
        std::fs::write(&file, &bootstrap).expect("token file");
        *token_file = file;
    }
    c.launch();
    assert_eq!(ready(cluster.server(), &c.name), "True");
    // A node deleted takes its password with it: the name is free again.
    let c_name = c.name.clone();
    drop(c);
    cluster.server().ok(&["delete", "node", &c_name]);
    cluster.server().eventually("the deleted node's password removed", 30, || {
        let (ok, out) = cluster.server().kubectl(&[
            "-n",
            "kube-system",
            "get",
            "secret",
            &format!("{c_name}.node-password.ferrok"),
        ]);
        !ok && out.contains("NotFound")
    });
    // Deleted by its id, it is gone; a second token shows it.
    let (ok, other, err) = ferrok_token(cluster.server(), &["create", "--ttl", "1h"]);
    assert!(ok, "{err}");
    let (_, other_id_secret) = other.trim().split_once("::").expect("K10<hash>::<id>.<secret>");
    let other_id = other_id_secret.split('.').next().expect("<id>.<secret>");
    let (ok, _, err) = ferrok_token(cluster.server(), &["delete", other_id]);
    assert!(ok, "{err}");
    assert!(!ferrok_token(cluster.server(), &["list"]).1.contains(other_id_secret));
    // Expired, it joins nothing.
    cluster.server().ok(&[
        "-n",
        "kube-system",
        "patch",
        "secret",
        &format!("bootstrap-token-{id}"),
        "-p",
        r#"{"stringData":{"expiration":"2020-01-01T00:00:00Z"}}"#,
    ]);
    let late = cluster.lan_agent(&[]);
    let (ok, err) = agent_run_to_end(&late, &["--server", &url, "--token", &bootstrap], 30);
    assert!(!ok && err.contains("refused the token"), "{err}");
    drop(late);
    // Expired, the token cleaner deletes it (upstream's tokencleaner), and
    // deleting it then says it is not there.
    cluster.server().eventually("the expired token deleted", 30, || {
        !ferrok_token(cluster.server(), &["list"]).1.contains(id_secret)
    });
    let (ok, _, err) = ferrok_token(cluster.server(), &["delete", &id]);
    assert!(!ok && err.contains("not found"), "{err}");
    let (ok, _, err) = ferrok_token(cluster.server(), &["delete", &bootstrap]);
    assert!(!ok && err.contains("not found"), "{err}");

    // A client certificate near its end (30 days left, signed by the
    // cluster's client CA as the real one was) is renewed when the agent
    // starts: a new key, a year's validity.
    let client_cert = agent_dir.join("client-kubelet.crt");
    let client_key = agent_dir.join("client-kubelet.key");
    let tls = cluster.server().dir.path().join("server/tls");
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let path = |p: &std::path::Path| p.display().to_string();
    let csr = path(&a.dir.path().join("short.csr"));
    let subj = format!("/O=system:nodes/CN=system:node:{}", a.name);
    openssl(&["req", "-new", "-key", &path(&client_key), "-subj", &subj, "-out", &csr]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &path(&tls.join("client-ca.crt")),
        "-CAkey",
        &path(&tls.join("client-ca.key")),
        "-days",
        "30",
        "-out",
        &path(&client_cert),
    ]);
    let fingerprint = |f: &std::path::Path| std::fs::read(f).expect("key file");
    let key_before = fingerprint(&client_key);
    // Whether the client certificate is still valid `days` from now.
    let valid_for = |days: u32| {
        Command::new("openssl")
            .args(["x509", "-noout", "-checkend", &(days * 86_400).to_string(), "-in"])
            .arg(&client_cert)
            .status()
            .expect("openssl")
            .success()
    };
    assert!(!valid_for(31), "the short certificate is in place");

    // Restarting the agent keeps its pod (same container, not restarted);
    // this time with the bare password, no CA hash (the CA it knows is kept).
    let before = a.get(&["pod", "on-a"], "{.status.containerStatuses[0].containerID}");
    if let common::node::Role::Agent { token_file, .. } = &mut a.role {
        let file = a.dir.path().join("bare-password");
        std::fs::write(&file, secret).expect("token file");
        *token_file = file;
    }
    a.restart(false);
    a.eventually("the node Ready again", 30, || ready(cluster.server(), &a.name) == "True");
    assert_eq!(a.get(&["pod", "on-a"], "{.status.containerStatuses[0].containerID}"), before);
    assert_eq!(a.get(&["pod", "on-a"], "{.status.containerStatuses[0].restartCount}"), "0");
    assert!(valid_for(300), "the client certificate renewed for a year");
    assert_ne!(fingerprint(&client_key), key_before, "a new key for the renewed certificate");

    // The server token rotated: bad input first, which changes nothing.
    let (ok, _, err) = ferrok_token(cluster.server(), &["rotate", "--new-token", "short"]);
    assert!(!ok && err.trim() == "error: --new-token: the token's secret must be at least 16 characters", "{err}");
    assert_eq!(server_token(&cluster), token);
    let (ok, new_token, err) = ferrok_token(cluster.server(), &["rotate", "--new-token", "a-new-secret-of-the-server"]);
    assert!(ok, "{err}");
    let new_token = new_token.trim().to_string();
    assert_eq!(
        new_token,
        format!("{}::server:a-new-secret-of-the-server", hash_and_rest.rsplit_once("::").expect("K10…::").0)
    );
    assert_eq!(server_token(&cluster), new_token, "the server's token file");
    // Only the new token reads the join settings now.
    let config_status = |bearer: &str| {
        let out = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", cluster.server().netns))
            .args(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(tls.join("server-ca.crt"))
            .args(["-H", &format!("Authorization: Bearer {bearer}")])
            .arg(format!("https://127.0.0.1:{}/v1-ferrok/config", cluster.server().port))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert_eq!(config_status(&new_token), "200");
    assert_eq!(config_status(secret), "401");
    // A new node with the old token is refused; the joined one, restarted
    // with its old token, rejoins with its own certificate and keeps its pod.
    let stale = cluster.lan_agent(&[]);
    let (ok, err) = agent_run_to_end(&stale, &["--server", &url, "--token", &token], 30);
    assert!(!ok && err.contains("refused the token"), "{err}");
    drop(stale);
    a.restart(false);
    a.eventually("the agent serving again after the token rotation", 30, || {
        latest_log(&a).contains("kubelet API listening")
    });
    assert!(!latest_log(&a).contains("joining with the token"), "{}", latest_log(&a));
    a.eventually("the node Ready after the token rotation", 30, || ready(cluster.server(), &a.name) == "True");
    assert_eq!(a.get(&["pod", "on-a"], "{.status.containerStatuses[0].containerID}"), before);

    // The cluster's CAs rotated (new ones made by the server, cross-signed
    // by the old). After the server's restart, the agent, which trusts only
    // the old CAs, still reaches the API and the API server its kubelet.
    let server = cluster.server();
    let data_dir = server.dir.path().display().to_string();
    let url = format!("https://127.0.0.1:{}", server.port);
    let (ok, out) =
        server.on_host(&[common::ferrok_bin(), "certificate", "rotate-ca", "--data-dir", &data_dir, "--server", &url]);
    assert!(ok, "rotate-ca: {out}");
    cluster.servers[0].restart(false);
    let bundle = std::fs::read_to_string(tls.join("server-ca.crt")).expect("server CA");
    assert_ne!(std::fs::read_to_string(agent_dir.join("server-ca.crt")).expect("agent's CA"), bundle);
    a.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: after-rotation}}\nspec:\n  nodeName: {}\n  containers:\n  - {{name: c, image: \"{BUSYBOX}\", command: [\"sh\", \"-c\", \"echo rotated; exec sleep 3600\"]}}\n",
        a.name
    ));
    a.eventually("a new pod on the agent running after the CA rotation", 90, || {
        a.get(&["pod", "after-rotation"], "{.status.phase}") == "Running"
    });
    a.eventually("its logs through the API server", 30, || {
        a.kubectl(&["logs", "after-rotation"]).1.contains("rotated")
    });
    // Restarted with a token that names the old CA bundle, the agent takes
    // the new bundle (the server proves itself under the old CA) and keeps its pods.
    if let common::node::Role::Agent { token_file, .. } = &mut a.role {
        let file = a.dir.path().join("token-of-the-old-ca");
        std::fs::write(&file, &new_token).expect("token file");
        *token_file = file;
    }
    a.restart(false);
    a.eventually("the agent serving again after the CA rotation", 30, || {
        latest_log(&a).contains("kubelet API listening")
    });
    assert!(latest_log(&a).contains("the server's CAs were rotated"), "{}", latest_log(&a));
    assert_eq!(std::fs::read_to_string(agent_dir.join("server-ca.crt")).expect("agent's CA"), bundle);
    a.eventually("the node Ready after the CA rotation", 30, || ready(cluster.server(), &a.name) == "True");
    assert_eq!(a.get(&["pod", "on-a"], "{.status.containerStatuses[0].containerID}"), before);
    cluster.agents.push(a);
}

/// Node leases renewed every 2 s, for servers told to give up on a node after 6 s.
const FAST_LEASE: &str = "--kubelet-arg=node-lease-duration-seconds=8";

/// httpd answering its pod's name, on 8080.
const HTTPD: &str = "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www";

fn manifests() -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: hello}}
spec:
  selector: {{matchLabels: {{app: hello}}}}
  template:
    metadata: {{labels: {{app: hello}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - {{name: c, image: "{BUSYBOX}", command: ["sh", "-c", "{HTTPD}"], ports: [{{containerPort: 8080}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: hello}}
spec: {{selector: {{app: hello}}, ports: [{{port: 80, targetPort: 8080}}]}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: mover}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: mover}}}}
  template:
    metadata: {{labels: {{app: mover}}}}
    spec:
      terminationGracePeriodSeconds: 1
      tolerations:
      - {{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 2}}
      - {{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 2}}
      containers:
      - {{name: c, image: "{BUSYBOX}", command: ["sleep", "3600"]}}
"#
    )
}

/// `(pod, node, podIP)` of the pods labelled `app=<app>`.
fn pods_of(node: &Node, app: &str) -> Vec<(String, String, String)> {
    node.get(
        &["pods", "-l", &format!("app={app}")],
        "{range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP} {.status.phase}{\"\\n\"}{end}",
    )
    .lines()
    .filter_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() == 4 && f[3] == "Running").then(|| (f[0].to_string(), f[1].to_string(), f[2].to_string()))
    })
    .collect()
}

#[test]
fn pods_on_every_node_reach_each_other() {
    // Nodes that stop heartbeating are given up on quickly here.
    let mut cluster = Cluster::start_with(&[FAST_LEASE], &[("FERROK_NODE_MONITOR_GRACE_PERIOD", "6s")]);
    let mut a = cluster.lan_agent(&[FAST_LEASE]);
    let mut b = cluster.routed_agent(&[FAST_LEASE]);
    a.launch();
    b.launch();
    let server = cluster.server();
    server.apply(&manifests());
    server.eventually_across("the DaemonSet's pod running on all three nodes", 120, &[&a, &b], || {
        pods_of(server, "hello").len() == 3
    });
    let hello = pods_of(server, "hello");
    let by_name = |n: &str| -> &Node {
        [server, &a, &b].into_iter().find(|x| x.name == n).unwrap_or_else(|| panic!("no node {n}"))
    };
    // Pod to pod by pod IP, every pair, across the segment and the router.
    for (from, from_node, _) in &hello {
        for (to, _, ip) in &hello {
            let (ok, out) = by_name(from_node).try_exec(
                "default",
                from,
                "c",
                &format!("busybox timeout 5 wget -q -O- http://{ip}:8080/"),
            );
            assert!(ok && out.trim() == to, "{from} ({from_node}) → {to} at {ip}: {out}");
        }
    }
    // Through the Service and by DNS name, from the pod behind the router.
    let (on_b, _, _) = hello.iter().find(|(_, n, _)| *n == b.name).expect("a pod on b").clone();
    let mut seen = std::collections::BTreeSet::new();
    server.eventually("the service reaching every node's pod from b", 60, || {
        let (ok, out) =
            b.try_exec("default", &on_b, "c", "busybox timeout 5 wget -q -O- http://hello.default.svc.cluster.local/");
        if ok {
            seen.insert(out.trim().to_string());
        }
        seen.len() == 3
    });

    // A NetworkPolicy across nodes: only pods labelled friend reach hello's pods.
    server.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: friends-only}\nspec:\n  podSelector: {matchLabels: {app: hello}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {role: friend}}}]\n",
    );
    let (on_a, _, ip_on_a) = hello.iter().find(|(_, n, _)| *n == a.name).expect("a pod on a").clone();
    let url = format!("http://{ip_on_a}:8080/");
    server.eventually("the policy refusing b's pod", 30, || {
        !b.try_exec("default", &on_b, "c", &format!("busybox timeout 3 wget -q -O- {url}")).0
    });
    server.ok(&["label", "pod", &on_b, "role=friend"]);
    server.eventually("the policy admitting b's pod once a friend", 30, || {
        b.try_exec("default", &on_b, "c", &format!("busybox timeout 3 wget -q -O- {url}")).1.trim() == on_a
    });
    server.ok(&["delete", "networkpolicy", "friends-only"]);

    // An agent that stops: its node goes NotReady and its pods (after
    // their tolerations) are replaced elsewhere.
    server.eventually("the mover pod running", 60, || !pods_of(server, "mover").is_empty());
    let (_, mover_node, _) = pods_of(server, "mover")[0].clone();
    let stopped = if mover_node == a.name {
        &mut a
    } else if mover_node == b.name {
        &mut b
    } else {
        // On the server: cordon it and move the pod to an agent first.
        server.ok(&["cordon", &server.name]);
        server.ok(&["delete", "pod", "-l", "app=mover", "--wait=false"]);
        server.eventually("the mover pod on an agent", 60, || {
            pods_of(server, "mover").iter().any(|(_, n, _)| *n != server.name)
        });
        let (_, n, _) = pods_of(server, "mover").into_iter().find(|(_, n, _)| *n != server.name).expect("mover");
        server.ok(&["uncordon", &server.name]);
        if n == a.name {
            &mut a
        } else {
            &mut b
        }
    };
    let gone = stopped.name.clone();
    let ds_pod_before = stopped.get(
        &["pods", "-l", "app=hello", "--field-selector", &format!("spec.nodeName={gone}")],
        "{.items[0].status.containerStatuses[0].containerID}",
    );
    stopped.stop(false);
    server.eventually("the stopped agent's node not Ready", 60, || ready(server, &gone) != "True");
    server.eventually("the mover pod replaced on another node", 90, || {
        pods_of(server, "mover").iter().any(|(_, n, _)| *n != gone)
    });
    // Back: Ready again, its DaemonSet pod the same container.
    stopped.spawn();
    server.eventually("the agent's node Ready again", 60, || ready(server, &gone) == "True");
    let ds_pod_after = server.get(
        &["pods", "-l", "app=hello", "--field-selector", &format!("spec.nodeName={gone}")],
        "{.items[0].status.containerStatuses[0].containerID}",
    );
    assert_eq!(ds_pod_before, ds_pod_after, "the restarted agent keeps its pods");
    cluster.agents.push(a);
    cluster.agents.push(b);
}

/// Two servers on one external etcd (real etcd) and an agent joined
/// through the first: the agent learns both from the `kubernetes`
/// EndpointSlice, and when the first server stops it carries on through
/// the second (its node stays Ready, a new pod runs on it).
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_fails_over_between_servers() {
    let mut cluster = Cluster::router();
    let etcd = common::start_etcd_on(&cluster.host_ip()).await;
    let endpoint = etcd.url();
    let flags = ["--datastore-endpoint", endpoint.as_str(), "--token", "agents-failover-test", FAST_LEASE];
    // A node whose heartbeats stop is NotReady after 6 s here: failover must be quicker.
    let grace = [("FERROK_NODE_MONITOR_GRACE_PERIOD", "6s")];
    cluster.add_server(&flags, &grace);
    cluster.add_server(&flags, &grace);
    let second_ip = cluster.servers[1].ip.clone();
    let mut a = cluster.lan_agent(&[FAST_LEASE]);
    a.launch();
    let servers_file = a.dir.path().join("agent/etc/servers");
    a.eventually("the agent knowing both servers", 30, || {
        std::fs::read_to_string(&servers_file).unwrap_or_default().contains(&second_ip)
    });
    // The first server is lost as to a power cut (SIGKILL: it takes nothing
    // out of the `kubernetes` EndpointSlice, so the agent's list still names
    // it first); kubectl goes to the second from now on.
    cluster.servers[0].stop(true);
    let second = &cluster.servers[1];
    // The node's heartbeat goes on through the second server: its Lease is
    // renewed (every 2 s with an 8 s lease) after the first one is gone.
    let lease = ["lease", "-n", "kube-node-lease", a.name.as_str()];
    let renewed_before = second.get(&lease, "{.spec.renewTime}");
    second.eventually("the node's Lease renewed after the first server stopped", 20, || {
        let now = second.get(&lease, "{.spec.renewTime}");
        !now.is_empty() && now != renewed_before
    });
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        assert_eq!(ready(second, &a.name), "True", "the agent's node while the first server is down");
        std::thread::sleep(Duration::from_secs(1));
    }
    second.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: after-failover}}\nspec:\n  nodeName: {}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: \"{BUSYBOX}\", command: [\"sleep\", \"3600\"]}}\n",
        a.name
    ));
    second.eventually("a pod on the agent running through the second server", 60, || {
        second.get(&["pod", "after-failover"], "{.status.phase}") == "Running"
    });
    let moved = format!("connected to the API server server={second_ip}:");
    assert!(a.log().contains(&moved), "the agent never connected to the second server\n{}", a.log());
    cluster.agents.push(a);
}

/// kubectl as the kubelet of `agent` (its own client certificate) against the server.
fn kubectl_as_node(cluster: &Cluster, agent: &Node, args: &[&str]) -> (bool, String) {
    let dir = agent.dir.path().join("agent");
    let config = agent.dir.path().join("node-kubeconfig.yaml");
    let server = cluster.server();
    let url = format!("https://{}:{}", server.ip, server.port);
    let file = |f: &str| dir.join(f).display().to_string();
    let setup: [Vec<String>; 4] = [
        vec![
            "set-cluster".into(),
            "c".into(),
            format!("--server={url}"),
            format!("--certificate-authority={}", file("server-ca.crt")),
        ],
        vec![
            "set-credentials".into(),
            "node".into(),
            format!("--client-certificate={}", file("client-kubelet.crt")),
            format!("--client-key={}", file("client-kubelet.key")),
        ],
        vec!["set-context".into(), "node".into(), "--cluster=c".into(), "--user=node".into()],
        vec!["use-context".into(), "node".into()],
    ];
    for step in setup {
        let out = Command::new("kubectl").arg("--kubeconfig").arg(&config).arg("config").args(&step).output();
        assert!(out.is_ok_and(|o| o.status.success()), "kubectl config {step:?}");
    }
    let out = Command::new("kubectl").arg("--kubeconfig").arg(&config).args(args).output().expect("kubectl");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// What an agent takes from its server's settings: under the server's
/// `--disable coredns` it serves no cluster DNS either (after a restart
/// too); and a local-path volume released on it has its directory and then
/// the volume removed with the node's own credentials, which delete no
/// other volume (Forbidden).
#[test]
fn an_agent_follows_its_servers_dns_and_local_storage() {
    let mut cluster = Cluster::start(&["--disable", "coredns"]);
    let mut a = cluster.lan_agent(&[]);
    a.launch();
    let server = cluster.server();
    server.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: data}}\n\
         spec:\n  accessModes: [ReadWriteOnce]\n  resources: {{requests: {{storage: 64Mi}}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: writer}}\nspec:\n  restartPolicy: Never\n\
         \x20 nodeSelector: {{kubernetes.io/hostname: {}}}\n\
         \x20 containers:\n  - name: w\n    image: {BUSYBOX}\n    command: [sh, -c, 'echo hello > /data/file']\n\
         \x20   volumeMounts:\n    - {{name: d, mountPath: /data}}\n  volumes:\n  - name: d\n\
         \x20   persistentVolumeClaim: {{claimName: data}}\n",
        a.name
    ));
    server.eventually("the claim bound and the pod done on the agent", 90, || {
        server.get(&["pvc", "data"], "{.status.phase}") == "Bound"
            && server.get(&["pod", "writer"], "{.status.phase}") == "Succeeded"
    });
    assert_eq!(server.get(&["pod", "writer"], "{.spec.nodeName}"), a.name);
    let pv = server.get(&["pvc", "data"], "{.spec.volumeName}");
    let dir = std::path::PathBuf::from(server.get(&["pv", &pv], "{.spec.hostPath.path}"));
    assert_eq!(std::fs::read_to_string(dir.join("file")).expect("the pod's file").trim(), "hello");
    // A pod has run there: the agent is long past starting, and serves no DNS.
    assert!(!dns_listening(&a), "the agent serves the cluster DNS under the server's --disable coredns");

    // The node's credentials delete no volume of another node, nor its own while it is bound.
    server.apply(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: elsewhere\n\
         \x20 annotations: {pv.kubernetes.io/provisioned-by: rancher.io/local-path}\n\
         spec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  hostPath: {path: /tmp/elsewhere}\n\
         \x20 nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions:\n\
         \x20       - {key: kubernetes.io/hostname, operator: In, values: [somewhere-else]}\n",
    );
    for name in ["elsewhere", pv.as_str()] {
        let (ok, out) = kubectl_as_node(&cluster, &a, &["delete", "pv", name, "--wait=false"]);
        assert!(!ok && out.contains("(Forbidden)"), "{name}: {out}");
        assert!(server.kubectl(&["get", "pv", name]).0, "{name} deleted by a node");
    }
    let (ok, out) = kubectl_as_node(&cluster, &a, &["delete", "pv", &pv, "--wait=false"]);
    assert!(!ok && out.contains("can only delete released local-path volumes pinned to itself"), "{out}");

    // Released: the agent removes the directory, then the volume.
    server.ok(&["delete", "pod", "writer", "--wait=false"]);
    server.ok(&["delete", "pvc", "data", "--wait=false"]);
    server.eventually("the directory and the volume gone", 60, || {
        !dir.exists() && !server.kubectl(&["get", "pv", &pv]).0
    });

    // Restarted (it joins again with its own certificate): still no DNS.
    a.restart(false);
    a.eventually("the node Ready again", 30, || ready(cluster.server(), &a.name) == "True");
    a.eventually("the agent serving again", 30, || latest_log(&a).contains("kubelet API listening"));
    assert!(!dns_listening(&a), "the restarted agent serves the cluster DNS");
    cluster.agents.push(a);
}

//! Several `ferrok server`s on one external etcd, each in a network
//! namespace of its own with its own data dir and advertise address: one
//! PKI for all (the first server's CAs, shared through the datastore
//! sealed with the token), one API, and the `kubernetes` Service's
//! endpoints listing every live server (a lease each, gone on SIGTERM at
//! once and after the lease TTL on SIGKILL). A server with another token
//! is refused and writes nothing.

mod common;

use std::time::{Duration, Instant};

use common::node::Node;

const TOKEN: &str = "ha-servers-test-secret";
/// The files every server of one cluster shares (src/pki/shared_pki.rs).
const SHARED: [&str; 5] = ["server-ca.crt", "server-ca.key", "client-ca.crt", "client-ca.key", "service.key"];

fn tls_file(node: &Node, name: &str) -> String {
    std::fs::read_to_string(node.dir.path().join("server").join("tls").join(name))
        .unwrap_or_else(|e| panic!("{}: {name}: {e}", node.name))
}

/// The addresses and ports of the EndpointSlice `default/kubernetes`, as `via` serves it.
fn kubernetes_slice(via: &Node) -> (Vec<String>, String) {
    let addrs = via.ok(&["get", "endpointslice", "kubernetes", "-o", "jsonpath={.endpoints[*].addresses[0]}"]);
    let ports = via.ok(&["get", "endpointslice", "kubernetes", "-o", "jsonpath={.ports[*].port}"]);
    let mut addrs: Vec<String> = addrs.split_whitespace().map(str::to_string).collect();
    addrs.sort();
    (addrs, ports)
}

fn kubernetes_endpoints(via: &Node) -> Vec<String> {
    let out = via.ok(&["get", "endpoints", "kubernetes", "-o", "jsonpath={.subsets[*].addresses[*].ip}"]);
    let mut addrs: Vec<String> = out.split_whitespace().map(str::to_string).collect();
    addrs.sort();
    addrs
}

fn sorted(ips: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ips.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

fn server_flags(node: &mut Node, endpoint: &str, token: &str) {
    let ip = node.ip.clone();
    node.extra.extend(
        ["--datastore-endpoint", endpoint, "--token", token, "--advertise-address", &ip].iter().map(|s| s.to_string()),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn servers_share_one_etcd() {
    let t0 = Instant::now();
    let stage = |what: &str| eprintln!("[{:>6.1}s] {what}", t0.elapsed().as_secs_f64());
    // Declared first so that it is dropped last: the servers stop while
    // their datastore is still there.
    let etcd: common::Proc;
    let mut a = Node::new_server(&[]);
    let mut b = Node::new_server(&[]);
    // etcd on the host side of a's link: every namespace reaches it through its default route.
    etcd = common::start_etcd_on(&a.host_ip).await;
    let endpoint = etcd.url();
    server_flags(&mut a, &endpoint, TOKEN);
    server_flags(&mut b, &endpoint, TOKEN);

    // Both at once: one stores the bootstrap data, the other joins it.
    a.spawn();
    b.spawn();
    a.wait_api_ready(Duration::from_secs(60));
    b.wait_api_ready(Duration::from_secs(60));

    stage("both servers ready");
    // One PKI: the same CAs, keys and join token in both data dirs.
    for name in SHARED {
        assert_eq!(tls_file(&a, name), tls_file(&b, name), "{name} differs between the servers");
    }
    let token = |n: &Node| std::fs::read_to_string(n.dir.path().join("server").join("token")).expect("token");
    assert_eq!(token(&a), token(&b));
    // The token is not readable in the datastore, nor the keys.
    let (ok, dump, err) = common::etcdctl(&endpoint, &["get", "--prefix", "/bootstrap/"], None);
    assert!(ok, "etcdctl: {err}");
    assert!(dump.starts_with("/bootstrap/"), "no bootstrap data in etcd: {dump}");
    assert!(!dump.contains(TOKEN) && !dump.contains("PRIVATE KEY"), "bootstrap data in clear: {dump}");

    stage("PKI compared");
    // a's admin kubeconfig works against b: same CA, b's serving cert names b.
    let a_at_b = a.dir.path().join("kubeconfig-a-at-b.yaml");
    let text = std::fs::read_to_string(a.kubeconfig()).expect("kubeconfig");
    std::fs::write(&a_at_b, text.replace(&format!("https://{}:", a.ip), &format!("https://{}:", b.ip)))
        .expect("write kubeconfig");
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&a_at_b)
        .args(["create", "configmap", "made-through-b", "--from-literal=k=v"])
        .output()
        .expect("kubectl");
    assert!(out.status.success(), "a's kubeconfig against b: {}", String::from_utf8_lossy(&out.stderr));

    // One API: what one server writes the other serves.
    a.ok(&["create", "configmap", "made-through-a", "--from-literal=k=v"]);
    assert_eq!(b.get(&["configmap", "made-through-a"], "{.data.k}"), "v");
    assert_eq!(a.get(&["configmap", "made-through-b"], "{.data.k}"), "v");

    stage("API shared");
    // The kubernetes Service's endpoints list every live server.
    let both = sorted(&[&a.ip, &b.ip]);
    a.eventually("both servers in the kubernetes EndpointSlice", 20, || kubernetes_slice(&a).0 == both);
    assert_eq!(kubernetes_slice(&b), (both.clone(), "6443".to_string()));
    assert_eq!(kubernetes_endpoints(&b), both);

    stage("both listed");
    // A server with another token is refused, and writes nothing.
    let mut c = Node::new_server(&[]);
    server_flags(&mut c, &endpoint, "not-the-cluster-token");
    c.spawn();
    let status = c.wait_exit(Duration::from_secs(30));
    stage("c exited");
    assert!(!status.success(), "a server with another token started");
    let log = c.log();
    assert!(
        log.contains("bootstrap data already exists and is encrypted with a different token"),
        "unclear refusal:\n{log}"
    );
    assert!(!c.dir.path().join("server").join("tls").exists(), "the refused server wrote its TLS folder");
    assert!(!c.dir.path().join("server").join("token").exists(), "the refused server wrote a token");
    let (_, leases, _) =
        common::etcdctl(&endpoint, &["get", "--prefix", "--keys-only", "/registry/masterleases/"], None);
    assert!(!leases.contains(&c.ip), "the refused server left a lease: {leases}");
    let (_, boot, _) = common::etcdctl(&endpoint, &["get", "--prefix", "--keys-only", "/bootstrap/"], None);
    assert_eq!(boot.lines().filter(|l| !l.is_empty()).count(), 1, "more bootstrap data: {boot}");
    assert_eq!(kubernetes_slice(&a).0, both);

    stage("wrong token refused");
    // SIGTERM: the server takes itself out before it exits.
    b.stop(false);
    stage("b stopped");
    let only_a = sorted(&[&a.ip]);
    let stopped = Instant::now();
    a.eventually("b gone from the endpoints after SIGTERM", 5, || kubernetes_slice(&a).0 == only_a);
    assert_eq!(kubernetes_endpoints(&a), only_a);
    eprintln!("after SIGTERM: gone in {:?}", stopped.elapsed());

    stage("SIGTERM removal seen");
    // b comes back on its data dir (its files equal the cluster's), and is listed again.
    b.spawn();
    b.wait_api_ready(Duration::from_secs(60));
    a.eventually("b back in the endpoints", 20, || kubernetes_slice(&a).0 == both);

    stage("b back");
    // SIGKILL: b stays listed until its lease expires (TTL 15 s after its last renewal).
    b.stop(true);
    let killed = Instant::now();
    assert_eq!(kubernetes_slice(&a).0, both, "b went before its lease expired");
    a.eventually("b gone from the endpoints after its lease expired", 30, || kubernetes_slice(&a).0 == only_a);
    assert_eq!(kubernetes_endpoints(&a), only_a);
    let gone = killed.elapsed();
    eprintln!("after SIGKILL: gone in {gone:?}");
    assert!(gone >= Duration::from_secs(4), "b went before its lease could have expired ({gone:?})");

    stage("CA rotation");
    // The CAs rotated through a: both servers take the new ones at their
    // next start (b from the bootstrap data, its old files the ones the new
    // grew from), and a kubeconfig of the old CA still works against b.
    let old_ca = tls_file(&a, "server-ca.crt");
    let data_dir = a.dir.path().display().to_string();
    let url = format!("https://127.0.0.1:{}", a.port);
    let (ok, out) =
        a.on_host(&[common::ferrok_bin(), "certificate", "rotate-ca", "--data-dir", &data_dir, "--server", &url]);
    assert!(ok, "rotate-ca: {out}");
    a.stop(false);
    a.spawn();
    a.wait_api_ready(Duration::from_secs(60));
    b.spawn();
    b.wait_api_ready(Duration::from_secs(60));
    for name in SHARED {
        assert_eq!(tls_file(&a, name), tls_file(&b, name), "{name} differs between the servers after the rotation");
    }
    let new_ca = tls_file(&b, "server-ca.crt");
    assert!(new_ca != old_ca && new_ca.ends_with(&old_ca), "b's CA file is not the rotated one");
    assert!(b.log().contains("taking the cluster's rotated certificate authority"), "{}", b.log());
    assert_eq!(token(&a), token(&b));
    let hash: String = {
        use sha2::Digest;
        sha2::Sha256::digest(new_ca.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    };
    assert_eq!(token(&b).trim(), format!("K10{hash}::server:{TOKEN}"), "the token names the new CA bundle");
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&a_at_b)
        .args(["get", "configmap", "made-through-a", "-o", "jsonpath={.data.k}"])
        .output()
        .expect("kubectl");
    assert!(out.status.success(), "the old CA's kubeconfig against b: {}", String::from_utf8_lossy(&out.stderr));
}

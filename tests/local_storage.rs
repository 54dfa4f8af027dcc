//! The built-in local-path provisioner on a real node (containerd, busybox):
//! a claim of the default class is bound, a pod's file lands under the data
//! dir, and deleting the pod and the claim removes the directory and the
//! volume. Also `--disable coredns` on a node: no DNS server, no kube-dns.

mod common;

use std::time::Duration;

use common::eventually_within;
use common::node::{netns_exec, Node, BUSYBOX};

#[test]
fn local_path_volumes_live_under_the_data_dir() {
    let node = Node::start(&[]);
    eventually_within("the default local-path class", Duration::from_secs(20), || {
        node.get(&["storageclass"], "{.items[*].metadata.name}") == "local-path"
    });
    node.apply(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\n  namespace: default\n\
         spec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 64Mi\n",
    );
    assert_eq!(node.get(&["pvc", "data"], "{.spec.storageClassName}"), "local-path");
    node.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: writer\n  namespace: default\nspec:\n  restartPolicy: Never\n\
         \x20 containers:\n  - name: w\n    image: {BUSYBOX}\n    command: [sh, -c, 'echo hello > /data/file']\n\
         \x20   volumeMounts:\n    - {{name: d, mountPath: /data}}\n  volumes:\n  - name: d\n\
         \x20   persistentVolumeClaim: {{claimName: data}}\n"
    ));
    eventually_within("the claim bound and the pod done", Duration::from_secs(60), || {
        node.get(&["pvc", "data"], "{.status.phase}") == "Bound"
            && node.get(&["pod", "writer"], "{.status.phase}") == "Succeeded"
    });
    // The scheduler named the node on the claim (WaitForFirstConsumer).
    let selected = node.get(&["pvc", "data"], "{.metadata.annotations.volume\\.kubernetes\\.io/selected-node}");
    assert_eq!(selected, node.name);
    let uid = node.get(&["pvc", "data"], "{.metadata.uid}");
    let pv = format!("pvc-{uid}");
    assert_eq!(node.get(&["pvc", "data"], "{.spec.volumeName}"), pv);
    let dir = node.dir.path().join("storage").join(format!("pvc-{uid}_default_data"));
    assert_eq!(node.get(&["pv", &pv], "{.spec.hostPath.path}"), dir.to_string_lossy());
    assert_eq!(
        node.get(&["pv", &pv], "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}"),
        node.name
    );
    assert_eq!(std::fs::read_to_string(dir.join("file")).expect("the pod's file").trim(), "hello");

    node.ok(&["delete", "pod", "writer", "--wait=false"]);
    node.ok(&["delete", "pvc", "data", "--wait=false"]);
    eventually_within("the directory and the volume gone", Duration::from_secs(60), || {
        !dir.exists() && !node.kubectl(&["get", "pv", &pv]).0
    });
}

#[test]
fn a_node_without_its_dns() {
    let listening = |node: &Node| netns_exec(&node.netns, &["ss", "-Hlun", "sport", "=", ":53"]).contains(":53");
    let mut node = Node::start(&[]);
    eventually_within("the node's DNS", Duration::from_secs(20), || listening(&node));
    assert!(node.kubectl(&["get", "svc", "-n", "kube-system", "kube-dns"]).0);
    node.stop(false);
    node.extra.extend(["--disable".to_string(), "coredns".to_string()]);
    node.launch();
    assert!(!node.kubectl(&["get", "svc", "-n", "kube-system", "kube-dns"]).0, "kube-dns Service kept");
    assert!(!listening(&node), "a DNS server runs with --disable coredns");
}

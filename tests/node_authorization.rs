//! The Node authorizer and NodeRestriction admission against the real
//! server: kubectl impersonates a kubelet (`--as=system:node:NAME
//! --as-group=system:nodes`, which the admin may do) and is allowed its own
//! pods' Secrets and its own Node, and refused everything else with a 403.
//! A second Node object (no kubelet behind it) holds the other node's pod.

mod common;

use common::node::{Node, BUSYBOX};

struct Kubelet<'a> {
    node: &'a Node,
    name: String,
}

impl Kubelet<'_> {
    fn kubectl(&self, args: &[&str]) -> (bool, String) {
        let who = format!("--as=system:node:{}", self.name);
        let mut all = vec![who.as_str(), "--as-group=system:nodes"];
        all.extend_from_slice(args);
        self.node.kubectl(&all)
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out) = self.kubectl(args);
        assert!(ok, "as node {}: kubectl {args:?} failed: {out}", self.name);
        out
    }

    /// The request is refused with a 403 Forbidden (whose message holds `why`).
    fn forbidden(&self, args: &[&str], why: &str) {
        let (ok, out) = self.kubectl(args);
        assert!(!ok, "as node {}: kubectl {args:?} should be refused: {out}", self.name);
        assert!(out.contains("Error from server (Forbidden)"), "kubectl {args:?}: not a 403: {out}");
        assert!(out.contains(why), "kubectl {args:?}: expected {why:?} in {out}");
    }
}

fn write(node: &Node, name: &str, body: &str) -> String {
    let dir = node.kubeconfig().parent().expect("dir").to_path_buf();
    let path = dir.join(name);
    std::fs::write(&path, body).expect("write manifest");
    path.display().to_string()
}

#[test]
fn a_node_reaches_only_its_own_pods_objects_and_its_own_node() {
    let node = Node::start(&[]);
    let me = Kubelet { node: &node, name: node.name.clone() };
    node.ok(&["create", "namespace", "app"]);
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Node
metadata: {{name: other, labels: {{site: far}}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: mine, namespace: app}}
stringData: {{k: v}}
---
apiVersion: v1
kind: Secret
metadata: {{name: theirs, namespace: app}}
stringData: {{k: v}}
---
apiVersion: v1
kind: Secret
metadata: {{name: unused, namespace: app}}
stringData: {{k: v}}
---
apiVersion: v1
kind: Pod
metadata: {{name: here, namespace: app}}
spec:
  nodeName: {me}
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sleep", "100000"]
    envFrom: [{{secretRef: {{name: mine}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: there, namespace: app}}
spec:
  nodeName: other
  containers:
  - name: c
    image: {BUSYBOX}
    envFrom: [{{secretRef: {{name: theirs}}}}]
"#,
        me = node.name
    ));

    // Its own pod's Secret, by name and as a watch of that one object.
    node.eventually("the node may read its pod's Secret", 30, || me.kubectl(&["get", "secret", "-n", "app", "mine"]).0);
    me.ok(&["get", "secrets", "-n", "app", "--field-selector", "metadata.name=mine"]);
    // Nothing else.
    let unrelated = format!("no relationship found between node '{}' and this object", node.name);
    me.forbidden(&["get", "secret", "-n", "app", "unused"], &unrelated);
    me.forbidden(&["get", "secret", "-n", "app", "theirs"], &unrelated);
    me.forbidden(&["get", "secrets", "-n", "app"], "cannot list resource \"secrets\"");
    me.forbidden(&["get", "secrets", "-n", "app", "--field-selector", "metadata.name=theirs"], &unrelated);
    // The other node's kubelet reads its pod's Secret and not ours.
    let other = Kubelet { node: &node, name: "other".into() };
    other.ok(&["get", "secret", "-n", "app", "theirs"]);
    other.forbidden(&["get", "secret", "-n", "app", "mine"], "no relationship found between node 'other'");

    // Its own Node: allowed labels yes, restricted ones no; another Node not at all.
    me.ok(&["label", "node", &node.name, "rack=r1"]);
    me.forbidden(
        &["label", "node", &node.name, "node-restriction.kubernetes.io/trusted=yes"],
        "is not allowed to modify labels: node-restriction.kubernetes.io/trusted",
    );
    me.forbidden(
        &["label", "node", "other", "site=near", "--overwrite"],
        &format!("node \"{}\" is not allowed to modify node \"other\"", node.name),
    );
    assert_eq!(node.get(&["node", "other"], "{.metadata.labels.site}"), "far");

    // Pod status: its own pods only (a PUT of the status, as a kubelet
    // sends it; kubelet rights hold no get of pods/status for kubectl patch).
    let status_of = |pod: &str, message: &str| {
        let mut obj: serde_json::Value =
            serde_json::from_str(&node.ok(&["get", "pod", "-n", "app", pod, "-o", "json"])).expect("pod json");
        obj["status"]["message"] = serde_json::json!(message);
        let file = write(&node, &format!("{pod}-status.json"), &obj.to_string());
        (format!("/api/v1/namespaces/app/pods/{pod}/status"), file)
    };
    let (uri, file) = status_of("there", "hijacked");
    me.forbidden(
        &["replace", "--raw", &uri, "-f", &file],
        "can only update pod status for pods with spec.nodeName set to itself",
    );
    let (uri, file) = status_of("here", "ok");
    me.ok(&["replace", "--raw", &uri, "-f", &file]);

    // Pods: mirror pods only, and only bound to itself.
    let plain = write(
        &node,
        "plain.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: sneaky, namespace: app}}\nspec:\n  nodeName: {}\n  containers: [{{name: c, image: {BUSYBOX}}}]\n",
            node.name
        ),
    );
    me.forbidden(&["create", "-f", &plain], "can only create mirror pods");
    let elsewhere = write(
        &node,
        "elsewhere.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: sneaky, namespace: app, annotations: {{kubernetes.io/config.mirror: x}}}}\nspec:\n  nodeName: other\n  containers: [{{name: c, image: {BUSYBOX}}}]\n"
        ),
    );
    me.forbidden(&["create", "-f", &elsewhere], "can only create pods with spec.nodeName set to itself");
    me.forbidden(
        &["delete", "pod", "-n", "app", "there", "--wait=false"],
        "can only delete pods with spec.nodeName set to itself",
    );
    assert!(node.kubectl(&["get", "pod", "-n", "app", "sneaky"]).1.contains("NotFound"));

    // Leases: its own, in kube-node-lease only.
    me.ok(&["get", "lease", "-n", "kube-node-lease", &node.name]);
    me.forbidden(&["get", "lease", "-n", "kube-node-lease", "other"], "can only access node lease with the same name");

    // The node role of the server itself kept working: its pod runs.
    node.eventually("the node's own pod running", 60, || {
        node.get(&["pod", "-n", "app", "here"], "{.status.phase}") == "Running"
    });
}

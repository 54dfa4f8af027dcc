//! What the Node authorizer knows of the cluster, as upstream's node graph
//! holds it: for every pod, the node it is bound to and the objects it
//! references (secrets, config maps, persistent volume claims, its service
//! account, resource claims); for every claim, the volume bound to it; for
//! every volume of the local-path provisioner, the node it is pinned to
//! (which removes its directory and then the volume once it is released).
//!
//! Each is kept in a watch-fed cache of the API server (`graph_populator`'s
//! `NodeGraphCaches`) as a small projection of the object, never the
//! whole object. A pod is held as `PodEdges`, its name, namespace, node
//! name and one short string per reference (about 300 bytes), where the
//! pod itself is several kilobytes and its projection as a JSON value
//! (two maps, each a B-tree node of about 600 bytes) about 1.5 KiB.

use serde_json::{json, Value};

use crate::apiserver::cache::{Cached, PrefixCache};
use crate::apiserver::storage::Decoded;

/// The kinds of object a pod references, by their resource names.
pub const SECRETS: &str = "secrets";
pub const CONFIG_MAPS: &str = "configmaps";
pub const CLAIMS: &str = "persistentvolumeclaims";
pub const SERVICE_ACCOUNTS: &str = "serviceaccounts";
pub const RESOURCE_CLAIMS: &str = "resourceclaims";

/// The non-empty string at `path` (keys, walked without parsing a pointer).
fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    crate::apiserver::meta::str_at(v, path).filter(|s| !s.is_empty())
}

fn items<'a>(v: &'a Value, path: &[&str]) -> impl Iterator<Item = &'a Value> {
    crate::apiserver::meta::at(v, path).and_then(Value::as_array).into_iter().flatten()
}

/// Every `(resource, name)` a pod references in its own namespace, as
/// upstream's graph populator and `VisitPodSecretNames` /
/// `VisitPodConfigmapNames` find them.
pub fn pod_references(pod: &Value) -> Vec<(&'static str, String)> {
    let mut refs: Vec<(&'static str, String)> = Vec::new();
    let mut add = |kind: &'static str, name: Option<&str>| {
        if let Some(n) = name.filter(|n| !n.is_empty()) {
            if !refs.iter().any(|(k, m)| *k == kind && m == n) {
                refs.push((kind, n.to_string()));
            }
        }
    };
    let sa = str_at(pod, &["spec", "serviceAccountName"]).or_else(|| str_at(pod, &["spec", "serviceAccount"]));
    add(SERVICE_ACCOUNTS, sa);
    for s in items(pod, &["spec", "imagePullSecrets"]) {
        add(SECRETS, str_at(s, &["name"]));
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in items(pod, &["spec", list]) {
            for from in items(c, &["envFrom"]) {
                add(SECRETS, str_at(from, &["secretRef", "name"]));
                add(CONFIG_MAPS, str_at(from, &["configMapRef", "name"]));
            }
            for env in items(c, &["env"]) {
                add(SECRETS, str_at(env, &["valueFrom", "secretKeyRef", "name"]));
                add(CONFIG_MAPS, str_at(env, &["valueFrom", "configMapKeyRef", "name"]));
            }
        }
    }
    let pod_name = str_at(pod, &["metadata", "name"]).unwrap_or_default();
    for vol in items(pod, &["spec", "volumes"]) {
        add(SECRETS, str_at(vol, &["secret", "secretName"]));
        add(CONFIG_MAPS, str_at(vol, &["configMap", "name"]));
        add(CLAIMS, str_at(vol, &["persistentVolumeClaim", "claimName"]));
        if vol.get("ephemeral").is_some() {
            // The claim the ephemeral volume controller makes: <pod>-<volume>.
            let volume = str_at(vol, &["name"]).unwrap_or_default();
            add(CLAIMS, Some(&format!("{pod_name}-{volume}")));
        }
        for src in items(vol, &["projected", "sources"]) {
            add(SECRETS, str_at(src, &["secret", "name"]));
            add(CONFIG_MAPS, str_at(src, &["configMap", "name"]));
        }
        // The volume plugins that name a secret of the pod's namespace.
        if let Some(source) = vol.as_object() {
            for (kind, spec) in source {
                if kind == "name" {
                    continue;
                }
                add(SECRETS, str_at(spec, &["secretRef", "name"]));
                add(SECRETS, str_at(spec, &["nodePublishSecretRef", "name"]));
                if kind == "azureFile" {
                    add(SECRETS, str_at(spec, &["secretName"]));
                }
            }
        }
    }
    for claim in items(pod, &["spec", "resourceClaims"]) {
        add(RESOURCE_CLAIMS, str_at(claim, &["resourceClaimName"]));
    }
    for status in items(pod, &["status", "resourceClaimStatuses"]) {
        add(RESOURCE_CLAIMS, str_at(status, &["resourceClaimName"]));
    }
    refs
}

/// The parts of a pod that hold references, and nothing else: what the
/// pod cache parses of each pod it is sent (a pod's resources, probes,
/// status and managed fields are skipped, never built).
#[derive(serde::Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodReferences {
    metadata: PodName,
    spec: PodSpecReferences,
    status: PodStatusReferences,
}

/// Of the metadata, only what names the pod (its managed fields, labels
/// and annotations are skipped).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct PodName {
    name: Option<String>,
    namespace: Option<String>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodSpecReferences {
    node_name: Value,
    service_account_name: Value,
    service_account: Value,
    image_pull_secrets: Value,
    init_containers: Vec<ContainerReferences>,
    containers: Vec<ContainerReferences>,
    ephemeral_containers: Vec<ContainerReferences>,
    volumes: Value,
    resource_claims: Value,
}

#[derive(serde::Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ContainerReferences {
    env_from: Value,
    env: Value,
}

#[derive(serde::Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodStatusReferences {
    resource_claim_statuses: Value,
}

/// A JSON object of these fields, moved in (a `json!` would copy each).
fn object<const N: usize>(fields: [(&str, Value); N]) -> Value {
    Value::Object(fields.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.to_string(), v)).collect())
}

impl PodReferences {
    /// The parts as the pod's own JSON places them, for `PodEdges::of`.
    fn into_value(self) -> Value {
        let containers = |list: Vec<ContainerReferences>| {
            Value::Array(list.into_iter().map(|c| object([("envFrom", c.env_from), ("env", c.env)])).collect())
        };
        let PodSpecReferences {
            node_name,
            service_account_name,
            service_account,
            image_pull_secrets,
            init_containers,
            containers: main,
            ephemeral_containers,
            volumes,
            resource_claims,
        } = self.spec;
        object([
            ("metadata", object([("name", self.metadata.name.into()), ("namespace", self.metadata.namespace.into())])),
            (
                "spec",
                object([
                    ("nodeName", node_name),
                    ("serviceAccountName", service_account_name),
                    ("serviceAccount", service_account),
                    ("imagePullSecrets", image_pull_secrets),
                    ("initContainers", containers(init_containers)),
                    ("containers", containers(main)),
                    ("ephemeralContainers", containers(ephemeral_containers)),
                    ("volumes", volumes),
                    ("resourceClaims", resource_claims),
                ]),
            ),
            ("status", object([("resourceClaimStatuses", self.status.resource_claim_statuses)])),
        ])
    }
}

/// Only the name of a pod, everything else skipped unbuilt.
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct PodOnlyName {
    metadata: PodName,
}

/// `PodEdges::of` a pod's JSON, parsing only the parts that hold references.
/// A pod bound to no node grants nothing, so for JSON without a `nodeName`
/// key anywhere only its name is read (an unbound pod's edges are never
/// looked at: `on_node` is false for it).
pub fn parse_pod_edges(bytes: &[u8]) -> serde_json::Result<PodEdges> {
    if memchr::memmem::find(bytes, b"\"nodeName\"").is_none() {
        let PodOnlyName { metadata } = serde_json::from_slice(bytes)?;
        return Ok(PodEdges {
            name: metadata.name.unwrap_or_default().into(),
            namespace: metadata.namespace.unwrap_or_default().into(),
            node_name: "".into(),
            refs: Box::default(),
        });
    }
    let pod: PodReferences = serde_json::from_slice(bytes)?;
    Ok(PodEdges::of(&pod.into_value()))
}

/// `claim_edges` of a claim's JSON.
pub fn parse_claim_edges(bytes: &[u8]) -> serde_json::Result<Value> {
    serde_json::from_slice(bytes).map(|c| claim_edges(&c))
}

/// `volume_edges` of a volume's JSON.
pub fn parse_volume_edges(bytes: &[u8]) -> serde_json::Result<Value> {
    serde_json::from_slice(bytes).map(|v| volume_edges(&v))
}

/// What the claim cache keeps of a PersistentVolumeClaim.
pub fn claim_edges(claim: &Value) -> Value {
    json!({
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim.pointer("/metadata/name"),
            "namespace": claim.pointer("/metadata/namespace"),
        },
        "volumeName": str_at(claim, &["spec", "volumeName"]).unwrap_or_default(),
    })
}

/// The node a volume of the built-in local-path provisioner is pinned to:
/// the provisioned-by annotation, and a node affinity of one term, one
/// `kubernetes.io/hostname In [node]` expression (what the provisioner
/// writes). None for any other volume.
pub fn local_path_node(volume: &Value) -> Option<&str> {
    use crate::well_known::annotations::{LOCAL_PATH_PROVISIONER, PROVISIONED_BY};
    let by = volume.pointer("/metadata/annotations").and_then(|a| a.get(PROVISIONED_BY)).and_then(Value::as_str);
    if by != Some(LOCAL_PATH_PROVISIONER) {
        return None;
    }
    let terms = volume.pointer("/spec/nodeAffinity/required/nodeSelectorTerms")?.as_array()?;
    let [term] = terms.as_slice() else { return None };
    let expressions = term.get("matchExpressions")?.as_array()?;
    let [e] = expressions.as_slice() else { return None };
    let values = e.get("values")?.as_array()?;
    match (str_at(e, &["key"]), str_at(e, &["operator"]), values.as_slice()) {
        (Some("kubernetes.io/hostname"), Some("In"), [node]) => node.as_str().filter(|n| !n.is_empty()),
        _ => None,
    }
}

/// What the volume cache keeps of a PersistentVolume.
pub fn volume_edges(volume: &Value) -> Value {
    json!({
        "kind": "PersistentVolume",
        "metadata": {"name": volume.pointer("/metadata/name")},
        "localPathNode": local_path_node(volume).unwrap_or_default(),
    })
}

/// What the Node authorizer keeps of a pod.
#[derive(Debug, PartialEq)]
pub struct PodEdges {
    name: Box<str>,
    namespace: Box<str>,
    /// Empty while the pod is unbound.
    node_name: Box<str>,
    /// `resource/name` of each object the pod references.
    refs: Box<[Box<str>]>,
}

impl PodEdges {
    /// What the pod cache keeps of `pod`.
    pub fn of(pod: &Value) -> PodEdges {
        let text = |path: &[&str]| -> Box<str> { str_at(pod, path).unwrap_or_default().into() };
        PodEdges {
            name: text(&["metadata", "name"]),
            namespace: text(&["metadata", "namespace"]),
            node_name: text(&["spec", "nodeName"]),
            refs: pod_references(pod).into_iter().map(|(k, n)| format!("{k}/{n}").into_boxed_str()).collect(),
        }
    }
}

impl Decoded for PodEdges {
    fn set_resource_version(&mut self, _: i64) {}
}

impl Cached for PodEdges {
    fn id(&self) -> String {
        format!("Pod/{}/{}", self.namespace, self.name)
    }

    fn namespace(&self) -> Option<&str> {
        Some(&self.namespace)
    }

    /// Bound pods are indexed by their node.
    fn index_key(&self) -> Option<&str> {
        Some(&*self.node_name).filter(|n| !n.is_empty())
    }
}

impl PodEdges {
    fn on_node(&self, node: &str) -> bool {
        !node.is_empty() && *self.node_name == *node
    }
}

/// The graph the Node authorizer asks.
pub struct NodeGraph<'a> {
    pub pods: &'a PrefixCache<PodEdges>,
    pub claims: &'a PrefixCache,
    pub volumes: &'a PrefixCache,
}

impl NodeGraph<'_> {
    /// Whether a pod bound to `node` references `resource/name` in `namespace`.
    pub fn referenced_by_node(&self, node: &str, resource: &str, namespace: &str, name: &str) -> bool {
        let wanted = format!("{resource}/{name}");
        // Only bound pods are indexed, by their node: each one visited is on `node`.
        self.pods.any_with_key(node, |p| *p.namespace == *namespace && p.refs.iter().any(|r| **r == *wanted))
    }

    /// Whether the pod `namespace/name` is bound to `node`.
    pub fn pod_on_node(&self, node: &str, namespace: &str, name: &str) -> bool {
        self.pods.get(&format!("Pod/{namespace}/{name}")).is_some_and(|p| p.on_node(node))
    }

    /// Whether the PersistentVolume `name` is a local-path volume pinned to `node`.
    pub fn local_volume_of_node(&self, node: &str, name: &str) -> bool {
        self.volumes.get(&format!("PersistentVolume/{name}")).is_some_and(|v| v["localPathNode"].as_str() == Some(node))
    }

    /// Whether the PersistentVolume `name` is bound to a claim a pod of
    /// `node` uses.
    pub fn volume_used_by_node(&self, node: &str, name: &str) -> bool {
        let bound: Vec<(String, String)> = {
            let mut out = Vec::new();
            self.claims.any(|c| {
                if c["volumeName"].as_str() == Some(name) {
                    let ns = c.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
                    let n = c.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
                    out.push((ns.to_string(), n.to_string()));
                }
                false
            });
            out
        };
        bound.iter().any(|(ns, claim)| self.referenced_by_node(node, CLAIMS, ns, claim))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reference_of_a_pod_is_found() {
        let pod = json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "nodeName": "n1",
                "serviceAccountName": "robot",
                "imagePullSecrets": [{"name": "pull"}],
                "initContainers": [{"env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "init-cm", "key": "k"}}}]}],
                "containers": [{
                    "envFrom": [{"secretRef": {"name": "env-secret"}}, {"configMapRef": {"name": "env-cm"}}],
                    "env": [{"name": "B", "valueFrom": {"secretKeyRef": {"name": "key-secret", "key": "k"}}}],
                }],
                "volumes": [
                    {"name": "s", "secret": {"secretName": "vol-secret"}},
                    {"name": "c", "configMap": {"name": "vol-cm"}},
                    {"name": "p", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "e", "ephemeral": {"volumeClaimTemplate": {}}},
                    {"name": "x", "projected": {"sources": [{"secret": {"name": "proj-secret"}}, {"configMap": {"name": "kube-root-ca.crt"}}, {"serviceAccountToken": {"path": "t"}}]}},
                    {"name": "csi", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi-secret"}}},
                    {"name": "ceph", "cephfs": {"monitors": [], "secretRef": {"name": "ceph-secret"}}},
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-claim"}],
            },
        });
        let refs = pod_references(&pod);
        let bytes = serde_json::to_vec(&pod).unwrap();
        assert_eq!(parse_pod_edges(&bytes).unwrap(), PodEdges::of(&pod), "the partial parse sees every reference");
        // Unbound, only its name is kept; it is on no node.
        let mut unbound = pod.clone();
        unbound["spec"].as_object_mut().unwrap().remove("nodeName");
        let edges = parse_pod_edges(&serde_json::to_vec(&unbound).unwrap()).unwrap();
        assert_eq!((&*edges.name, &*edges.namespace, &*edges.node_name, edges.refs.len()), ("web", "default", "", 0));
        assert!(!edges.on_node("n1") && !edges.on_node(""));
        for (k, n) in [
            (SERVICE_ACCOUNTS, "robot"),
            (SECRETS, "pull"),
            (CONFIG_MAPS, "init-cm"),
            (SECRETS, "env-secret"),
            (CONFIG_MAPS, "env-cm"),
            (SECRETS, "key-secret"),
            (SECRETS, "vol-secret"),
            (CONFIG_MAPS, "vol-cm"),
            (CLAIMS, "data"),
            (CLAIMS, "web-e"),
            (SECRETS, "proj-secret"),
            (CONFIG_MAPS, "kube-root-ca.crt"),
            (SECRETS, "csi-secret"),
            (SECRETS, "ceph-secret"),
            (RESOURCE_CLAIMS, "gpu-claim"),
        ] {
            assert!(refs.contains(&(k, n.to_string())), "{k}/{n} missing from {refs:?}");
        }
        assert_eq!(refs.len(), 15, "{refs:?}");
    }

    #[test]
    fn the_graph_answers_per_node() {
        let pods = PrefixCache::projected("/registry/pods/", parse_pod_edges);
        let claims = PrefixCache::projected("/registry/persistentvolumeclaims/", parse_claim_edges);
        let pod = |name: &str, node: &str, secret: &str, claim: &str| {
            json!({"kind": "Pod", "metadata": {"name": name, "namespace": "ns"}, "spec": {"nodeName": node,
                "volumes": [{"name": "s", "secret": {"secretName": secret}}, {"name": "d", "persistentVolumeClaim": {"claimName": claim}}]}})
        };
        pods.apply_for_test(&(pod("a", "n1", "s1", "c1")));
        pods.apply_for_test(&(pod("b", "n2", "s2", "c2")));
        let pending = json!({"kind": "Pod", "metadata": {"name": "c", "namespace": "ns"}, "spec": {"volumes": [{"name": "s", "secret": {"secretName": "s3"}}]}});
        pods.apply_for_test(&(pending));
        claims.apply_for_test(&(json!({"kind": "PersistentVolumeClaim", "metadata": {"name": "c1", "namespace": "ns"}, "spec": {"volumeName": "pv1"}})));
        claims.apply_for_test(&(json!({"kind": "PersistentVolumeClaim", "metadata": {"name": "c2", "namespace": "ns"}, "spec": {"volumeName": "pv2"}})));
        let volumes = PrefixCache::projected("/registry/persistentvolumes/", parse_volume_edges);
        let g = NodeGraph { pods: &pods, claims: &claims, volumes: &volumes };
        assert!(g.referenced_by_node("n1", SECRETS, "ns", "s1"));
        assert!(!g.referenced_by_node("n1", SECRETS, "ns", "s2"), "another node's pod's secret");
        assert!(!g.referenced_by_node("n1", SECRETS, "other", "s1"), "same name, other namespace");
        assert!(!g.referenced_by_node("n1", SECRETS, "ns", "s3"), "an unbound pod grants nothing");
        assert!(!g.referenced_by_node("n1", CONFIG_MAPS, "ns", "s1"), "the kind must match");
        assert!(g.pod_on_node("n1", "ns", "a"));
        assert!(!g.pod_on_node("n1", "ns", "b"));
        assert!(g.volume_used_by_node("n1", "pv1"));
        assert!(!g.volume_used_by_node("n1", "pv2"));
        // The index by node follows binding, moving and deletion.
        pods.apply_for_test(&pod("c", "n1", "s3", "c3"));
        assert!(g.referenced_by_node("n1", SECRETS, "ns", "s3"), "bound since");
        pods.apply_for_test(&pod("a", "n2", "s1", "c1"));
        assert!(!g.referenced_by_node("n1", SECRETS, "ns", "s1"), "moved off n1");
        assert!(g.referenced_by_node("n2", SECRETS, "ns", "s1") && g.referenced_by_node("n2", SECRETS, "ns", "s2"));
        pods.delete_for_test(&pod("b", "n2", "s2", "c2"));
        assert!(!g.referenced_by_node("n2", SECRETS, "ns", "s2"), "deleted");
        assert!(g.referenced_by_node("n2", SECRETS, "ns", "s1"), "a stays on n2");
        pods.delete_for_test(&pod("a", "n2", "s1", "c1"));
        assert!(!g.referenced_by_node("n2", SECRETS, "ns", "s1"));
    }

    fn local_volume(name: &str, by: &str, nodes: &[&str]) -> Value {
        json!({"kind": "PersistentVolume", "metadata": {"name": name,
            "annotations": {"pv.kubernetes.io/provisioned-by": by}},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}}})
    }

    #[test]
    fn local_path_volumes_belong_to_their_node() {
        assert_eq!(local_path_node(&local_volume("v", "rancher.io/local-path", &["n1"])), Some("n1"));
        assert_eq!(local_path_node(&local_volume("v", "someone.else/csi", &["n1"])), None);
        assert_eq!(local_path_node(&local_volume("v", "rancher.io/local-path", &["n1", "n2"])), None);
        assert_eq!(local_path_node(&local_volume("v", "rancher.io/local-path", &[])), None);
        let volumes = PrefixCache::projected("/registry/persistentvolumes/", parse_volume_edges);
        volumes.apply_for_test(&(local_volume("pvc-1", "rancher.io/local-path", &["n1"])));
        volumes.apply_for_test(&(local_volume("pvc-2", "someone.else/csi", &["n1"])));
        let (pods, claims) = (
            PrefixCache::projected("/registry/pods/", parse_pod_edges),
            PrefixCache::new("/registry/persistentvolumeclaims/"),
        );
        let g = NodeGraph { pods: &pods, claims: &claims, volumes: &volumes };
        assert!(g.local_volume_of_node("n1", "pvc-1"));
        assert!(!g.local_volume_of_node("n2", "pvc-1"));
        assert!(!g.local_volume_of_node("n1", "pvc-2"));
        assert!(!g.local_volume_of_node("n1", "pvc-3"));
    }
}

//! The controllers of kube-controller-manager's default list added last:
//! the pod garbage collector (pods of a deleted node, terminated pods
//! beyond the threshold, unscheduled terminating pods), the TTL controller
//! (nodes' `node.alpha.kubernetes.io/ttl`), generic ephemeral volumes (a
//! pod's claim made, used and deleted with it, on a real node), the
//! mirroring of a selector-less Service's Endpoints into an EndpointSlice
//! (reached through its ClusterIP from a pod), and volume expansion with
//! the PersistentVolumeClaimResize admission.

mod common;

use std::time::Duration;

use common::node::{Node, BUSYBOX};
use common::{create, eventually_within, kubectl, ApiServer};

fn ok(s: &ApiServer, args: &[&str]) -> String {
    let (ok, out) = kubectl(s, args);
    assert!(ok, "kubectl {args:?} failed: {out}");
    out
}

fn jsonpath(s: &ApiServer, what: &[&str], path: &str) -> String {
    let jp = format!("jsonpath={path}");
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    args.extend(["-o", &jp]);
    kubectl(s, &args).1
}

/// A Node object with no kubelet behind it.
fn fake_node(name: &str) -> String {
    format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n")
}

/// A pod bound to `node` (or left unscheduled by a selector nothing
/// matches), held by a finalizer when `held`.
fn pod(name: &str, node: Option<&str>, held: bool) -> String {
    let finalizers = if held { "  finalizers: [example.com/hold]\n" } else { "" };
    let placement = match node {
        Some(n) => format!("  nodeName: {n}\n"),
        None => "  nodeSelector: {nowhere: \"true\"}\n".to_string(),
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n{finalizers}\
         spec:\n{placement}  containers:\n  - name: c\n    image: {BUSYBOX}\n"
    )
}

fn exists(s: &ApiServer, what: &[&str]) -> bool {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    kubectl(s, &args).0
}

#[test]
fn pod_gc_deletes_pods_of_deleted_nodes_and_terminated_pods_beyond_the_threshold() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let s = ApiServer::start_with(
        tmp,
        common::free_port(),
        &["--kube-controller-manager-arg", "terminated-pod-gc-threshold=2"],
    );
    create(&s, &fake_node("keeper"));
    create(&s, &fake_node("ghost"));
    // Three finished pods on a node that stays: one beyond the threshold.
    for name in ["done-1", "done-2", "done-3"] {
        create(&s, &pod(name, Some("keeper"), false));
        ok(
            &s,
            &[
                "patch",
                "pod",
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"phase":"Succeeded"}}"#,
            ],
        );
        // Creation times a second apart: the oldest goes first.
        std::thread::sleep(Duration::from_millis(1100));
    }
    create(&s, &pod("running", Some("keeper"), false));
    eventually_within("the oldest terminated pod collected", Duration::from_secs(30), || {
        !exists(&s, &["pod", "done-1"])
    });
    for name in ["done-2", "done-3", "running"] {
        assert!(exists(&s, &["pod", name]), "{name} was collected");
    }

    // Pods of a node that goes: collected after the quarantine, marked
    // Failed with the DisruptionTarget condition first (a finalizer keeps
    // one to look at).
    create(&s, &pod("orphan", Some("ghost"), false));
    create(&s, &pod("held-orphan", Some("ghost"), true));
    ok(&s, &["delete", "node", "ghost"]);
    eventually_within("the orphans collected", Duration::from_secs(90), || {
        !exists(&s, &["pod", "orphan"])
            && !jsonpath(&s, &["pod", "held-orphan"], "{.metadata.deletionTimestamp}").is_empty()
    });
    assert_eq!(jsonpath(&s, &["pod", "held-orphan"], "{.status.phase}"), "Failed");
    let condition = jsonpath(
        &s,
        &["pod", "held-orphan"],
        "{.status.conditions[?(@.type==\"DisruptionTarget\")]['status','reason','message']}",
    );
    assert_eq!(condition, "True DeletionByPodGC PodGC: node no longer exists");
    assert!(exists(&s, &["pod", "running"]), "a pod of a live node was collected");

    // A terminating pod never scheduled is marked Failed and deleted.
    create(&s, &pod("unscheduled", None, true));
    ok(&s, &["delete", "pod", "unscheduled", "--wait=false"]);
    eventually_within("the unscheduled pod marked Failed", Duration::from_secs(30), || {
        jsonpath(&s, &["pod", "unscheduled"], "{.status.phase}") == "Failed"
    });
    for name in ["held-orphan", "unscheduled"] {
        ok(&s, &["patch", "pod", name, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
    }
}

#[test]
fn nodes_carry_the_ttl_annotation() {
    let s = ApiServer::start();
    create(&s, &fake_node("small-cluster-node"));
    let ttl =
        || jsonpath(&s, &["node", "small-cluster-node"], "{.metadata.annotations.node\\.alpha\\.kubernetes\\.io/ttl}");
    eventually_within("the ttl annotation", Duration::from_secs(20), || ttl() == "0");
    // Set by hand, it is put back to what the cluster's size says.
    ok(&s, &["annotate", "node", "small-cluster-node", "--overwrite", "node.alpha.kubernetes.io/ttl=15"]);
    eventually_within("the ttl annotation restored", Duration::from_secs(20), || ttl() == "0");
}

#[test]
fn a_generic_ephemeral_volume_gets_its_claim_and_goes_with_the_pod() {
    let node = Node::start(&[]);
    node.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: scratch-user, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sh", "-c", "echo written > /scratch/file && exec sleep 3600"]
    volumeMounts: [{{name: scratch, mountPath: /scratch}}]
  volumes:
  - name: scratch
    ephemeral:
      volumeClaimTemplate:
        metadata: {{labels: {{kind: scratch}}}}
        spec:
          accessModes: [ReadWriteOnce]
          resources: {{requests: {{storage: 16Mi}}}}
"#
    ));
    node.eventually("the pod running with its claim bound", 90, || {
        node.get(&["pod", "scratch-user"], "{.status.phase}") == "Running"
            && node.get(&["pvc", "scratch-user-scratch"], "{.status.phase}") == "Bound"
    });
    // The claim is the pod's: controlled by it, from its template.
    let pod_uid = node.get(&["pod", "scratch-user"], "{.metadata.uid}");
    let owner =
        node.get(&["pvc", "scratch-user-scratch"], "{.metadata.ownerReferences[0]['kind','name','uid','controller']}");
    assert_eq!(owner, format!("Pod scratch-user {pod_uid} true"));
    assert_eq!(node.get(&["pvc", "scratch-user-scratch"], "{.metadata.labels.kind}"), "scratch");
    assert_eq!(node.get(&["pvc", "scratch-user-scratch"], "{.spec.storageClassName}"), "local-path");
    assert_eq!(node.exec("default", "scratch-user", "c", "cat /scratch/file").trim(), "written");
    let volume = node.get(&["pvc", "scratch-user-scratch"], "{.spec.volumeName}");
    let dir = node.get(&["pv", &volume], "{.spec.hostPath.path}");
    assert_eq!(std::fs::read_to_string(format!("{dir}/file")).expect("the file on the node").trim(), "written");

    // The garbage collector takes the claim with the pod, and the volume goes.
    node.ok(&["delete", "pod", "scratch-user"]);
    node.eventually("the claim and its volume gone", 60, || {
        !node.kubectl(&["get", "pvc", "scratch-user-scratch"]).0 && !node.kubectl(&["get", "pv", &volume]).0
    });
    assert!(!std::path::Path::new(&dir).exists(), "the volume's directory is left");

    // A claim of that name the pod does not own is not used, and said so.
    node.apply(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: squatter-scratch, namespace: default}\n\
         spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}\n",
    );
    node.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: squatter, namespace: default}}\nspec:\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n  volumes:\n  - name: scratch\n    ephemeral:\n      volumeClaimTemplate:\n        spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 16Mi}}}}}}\n"
    ));
    node.eventually("the FailedBinding event", 30, || {
        node.get(
            &["events", "--field-selector", "involvedObject.name=squatter,reason=FailedBinding"],
            "{.items[*].message}",
        )
        .contains("ephemeral volume scratch: PVC default/squatter-scratch was not created for pod default/squatter (pod is not owner)")
    });
}

#[test]
fn a_selector_less_service_is_reached_through_its_mirrored_endpoints() {
    let node = Node::start(&[]);
    node.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: backend, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sh", "-c", "mkdir -p /www && echo from-backend > /www/index.html && exec httpd -f -p 8080 -h /www"]
---
apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: c, image: "{BUSYBOX}", command: [sleep, "3600"]}}
---
apiVersion: v1
kind: Service
metadata: {{name: external, namespace: default}}
spec:
  ports: [{{name: web, port: 80, targetPort: 8080}}]
"#
    ));
    node.eventually("the pods running", 90, || {
        ["backend", "client"].iter().all(|p| node.get(&["pod", p], "{.status.phase}") == "Running")
    });
    let backend_ip = node.get(&["pod", "backend"], "{.status.podIP}");
    node.apply(&format!(
        "apiVersion: v1\nkind: Endpoints\nmetadata:\n  name: external\n  namespace: default\n  labels: {{team: storage}}\n\
         subsets:\n- addresses: [{{ip: {backend_ip}}}]\n  ports: [{{name: web, port: 8080}}]\n"
    ));
    let slices = |path: &str| {
        node.get(
            &["endpointslices", "-l", "kubernetes.io/service-name=external,endpointslice.kubernetes.io/managed-by=endpointslicemirroring-controller.k8s.io"],
            path,
        )
    };
    node.eventually("the mirrored EndpointSlice", 30, || slices("{.items[*].endpoints[*].addresses[0]}") == backend_ip);
    assert_eq!(slices("{.items[0].addressType}"), "IPv4");
    assert_eq!(slices("{.items[0].ports[0]['name','port','protocol']}"), "web 8080 TCP");
    assert_eq!(slices("{.items[0].metadata.labels.team}"), "storage");
    assert_eq!(slices("{.items[0].metadata.ownerReferences[0]['kind','name']}"), "Endpoints external");
    // The user-visible part: the Service answers through its ClusterIP.
    let cluster_ip = node.get(&["service", "external"], "{.spec.clusterIP}");
    node.eventually("the backend through the ClusterIP", 30, || {
        let (ok, out) =
            node.try_exec("default", "client", "c", &format!("busybox timeout 5 wget -q -O- http://{cluster_ip}/"));
        ok && out.trim() == "from-backend"
    });

    // Skipping the mirror takes the slice away.
    node.ok(&["label", "endpoints", "external", "endpointslice.kubernetes.io/skip-mirror=true"]);
    node.eventually("the mirrored slice gone", 30, || slices("{.items[*].metadata.name}").is_empty());
}

#[test]
fn claims_grow_only_when_their_class_allows_and_never_shrink() {
    let node = Node::start(&[]);
    node.apply(&format!(
        r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: expandable}}
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: grows, namespace: default}}
spec: {{storageClassName: expandable, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 64Mi}}}}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: fixed, namespace: default}}
spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 64Mi}}}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: user, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sleep, "3600"]
    volumeMounts: [{{name: a, mountPath: /a}}, {{name: b, mountPath: /b}}]
  volumes:
  - {{name: a, persistentVolumeClaim: {{claimName: grows}}}}
  - {{name: b, persistentVolumeClaim: {{claimName: fixed}}}}
"#
    ));
    node.eventually("both claims bound", 90, || {
        ["grows", "fixed"].iter().all(|c| node.get(&["pvc", c], "{.status.phase}") == "Bound")
    });
    let resize = |claim: &str, size: &str| {
        let patch = format!(r#"{{"spec":{{"resources":{{"requests":{{"storage":"{size}"}}}}}}}}"#);
        node.kubectl(&["patch", "pvc", claim, "--type=merge", "-p", &patch])
    };
    // The default class does not allow expansion.
    let (ok, out) = resize("fixed", "128Mi");
    assert!(!ok, "grew a claim whose class does not allow it: {out}");
    assert!(
        out.contains("persistentvolumeclaims \"fixed\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"),
        "{out}"
    );
    // Shrinking is refused whatever the class.
    for claim in ["fixed", "grows"] {
        let (ok, out) = resize(claim, "32Mi");
        assert!(!ok, "shrank {claim}: {out}");
        assert!(
            out.contains(&format!("PersistentVolumeClaim \"{claim}\" is invalid: spec.resources.requests.storage: Forbidden: field can not be less than status.capacity")),
            "{out}"
        );
    }
    // Growth where the class allows it is carried out and recorded.
    let (ok, out) = resize("grows", "128Mi");
    assert!(ok, "{out}");
    let volume = node.get(&["pvc", "grows"], "{.spec.volumeName}");
    node.eventually("the expansion recorded", 30, || {
        node.get(&["pvc", "grows"], "{.status.capacity.storage}") == "128Mi"
            && node.get(&["pv", &volume], "{.spec.capacity.storage}") == "128Mi"
    });
    assert_eq!(node.get(&["pvc", "grows"], "{.status.allocatedResources.storage}"), "128Mi");
    assert_eq!(node.get(&["pvc", "grows"], "{.status.allocatedResourceStatuses}"), "");
    assert_eq!(node.get(&["pvc", "grows"], "{.status.conditions}"), "");
    node.eventually("the VolumeResizeSuccessful event", 30, || {
        node.get(
            &["events", "--field-selector", "involvedObject.name=grows,reason=VolumeResizeSuccessful"],
            "{.items[*].message}",
        ) == "ExpandVolume succeeded for volume default/grows"
    });
    // And it may not go back down to where it was.
    let (ok, out) = resize("grows", "64Mi");
    assert!(!ok && out.contains("field can not be less than status.capacity"), "{out}");
}

#[test]
fn service_cidrs_and_the_ip_addresses_of_cluster_ips() {
    let s = ApiServer::start();
    // The default ServiceCIDR is kept by its finalizer and Ready.
    eventually_within("the default ServiceCIDR ready and finalized", Duration::from_secs(20), || {
        jsonpath(&s, &["servicecidr", "kubernetes"], "{.metadata.finalizers[*]}")
            == "networking.k8s.io/service-cidr-finalizer"
            && jsonpath(&s, &["servicecidr", "kubernetes"], "{.status.conditions[?(@.type==\"Ready\")].status}")
                == "True"
    });
    // Every cluster IP has its IPAddress, the kubernetes Service's first.
    let parent = |ip: &str| {
        jsonpath(&s, &["ipaddress", ip], "{.spec.parentRef['resource','namespace','name']} {.metadata.labels}")
    };
    eventually_within("the kubernetes Service's IPAddress", Duration::from_secs(20), || {
        parent("10.43.0.1").starts_with("services default kubernetes")
    });
    assert!(parent("10.43.0.1").contains(r#""ipaddress.kubernetes.io/managed-by":"ipallocator.k8s.io""#));
    create(
        &s,
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec: {ports: [{port: 80}]}\n",
    );
    let ip = jsonpath(&s, &["service", "web"], "{.spec.clusterIP}");
    eventually_within("the Service's IPAddress", Duration::from_secs(20), || {
        parent(&ip).starts_with("services default web")
    });
    ok(&s, &["delete", "service", "web"]);
    eventually_within("the IPAddress released", Duration::from_secs(20), || !exists(&s, &["ipaddress", &ip]));

    // An address someone holds with an IPAddress of their own is taken.
    create(
        &s,
        "apiVersion: networking.k8s.io/v1\nkind: IPAddress\nmetadata: {name: 10.43.200.200}\n\
         spec: {parentRef: {group: gateway.networking.k8s.io, resource: gateways, namespace: default, name: gw}}\n",
    );
    let (taken, out) =
        kubectl(&s, &["create", "service", "clusterip", "squatter", "--tcp=80", "--clusterip=10.43.200.200"]);
    assert!(!taken && out.contains("provided IP is already allocated"), "{out}");

    // Another ServiceCIDR gives more addresses, and stays while one is in use.
    create(
        &s,
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: extra}\nspec: {cidrs: [10.44.0.0/24]}\n",
    );
    eventually_within("the extra ServiceCIDR ready", Duration::from_secs(20), || {
        jsonpath(&s, &["servicecidr", "extra"], "{.status.conditions[?(@.type==\"Ready\")].status}") == "True"
    });
    ok(&s, &["create", "service", "clusterip", "wide", "--tcp=80", "--clusterip=10.44.0.5"]);
    eventually_within("the IPAddress in the extra range", Duration::from_secs(20), || {
        parent("10.44.0.5").starts_with("services default wide")
    });
    ok(&s, &["delete", "servicecidr", "extra", "--wait=false"]);
    eventually_within("the extra ServiceCIDR held", Duration::from_secs(20), || {
        jsonpath(&s, &["servicecidr", "extra"], "{.status.conditions[?(@.type==\"Ready\")]['status','reason']}")
            == "False Terminating"
    });
    ok(&s, &["delete", "service", "wide"]);
    eventually_within("the extra ServiceCIDR gone", Duration::from_secs(40), || !exists(&s, &["servicecidr", "extra"]));
}

#[test]
fn claims_and_volumes_in_use_are_kept_until_released() {
    let s = ApiServer::start();
    create(&s, &fake_node("n1"));
    create(
        &s,
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: manual}\n\
         spec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], persistentVolumeReclaimPolicy: Retain,\n\
         \x20 storageClassName: '', hostPath: {path: /tmp/ferrok-manual}, claimRef: {namespace: default, name: held}}\n\
         ---\n\
         apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: held, namespace: default}\n\
         spec: {storageClassName: '', volumeName: manual, accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n",
    );
    assert_eq!(jsonpath(&s, &["pvc", "held"], "{.metadata.finalizers}"), r#"["kubernetes.io/pvc-protection"]"#);
    assert_eq!(jsonpath(&s, &["pv", "manual"], "{.metadata.finalizers}"), r#"["kubernetes.io/pv-protection"]"#);
    eventually_within("the claim bound", Duration::from_secs(20), || {
        jsonpath(&s, &["pvc", "held"], "{.status.phase}") == "Bound"
    });
    create(
        &s,
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: user, namespace: default}}\nspec:\n  nodeName: n1\n  containers:\n\
             \x20 - {{name: c, image: {BUSYBOX}}}\n  volumes: [{{name: d, persistentVolumeClaim: {{claimName: held}}}}]\n"
        ),
    );
    ok(&s, &["delete", "pvc", "held", "--wait=false"]);
    ok(&s, &["delete", "pv", "manual", "--wait=false"]);
    // Kept while the pod uses the claim and the claim holds the volume.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        assert!(exists(&s, &["pvc", "held"]) && exists(&s, &["pv", "manual"]), "deleted while in use");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(jsonpath(&s, &["pv", "manual"], "{.status.phase}"), "Bound");
    // The pod gone, the claim goes, and then the volume it released.
    ok(&s, &["delete", "pod", "user", "--grace-period=0", "--force"]);
    eventually_within("the claim and the volume gone", Duration::from_secs(30), || {
        !exists(&s, &["pvc", "held"]) && !exists(&s, &["pv", "manual"])
    });
}

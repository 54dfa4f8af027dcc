//! Auditing: `--audit-policy-file` decides per request what
//! `--audit-log-path` records, as audit.k8s.io/v1 Events in JSON lines, and
//! `--audit-log-maxsize`/`--audit-log-maxbackup` keep the log bounded.

mod common;

use std::path::{Path, PathBuf};

use common::{eventually, free_port, kubectl, ApiServer};
use serde_json::Value;

const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  resources:
  - group: ""
    resources: [configmaps]
    resourceNames: [quiet]
- level: RequestResponse
  resources:
  - group: ""
    resources: [configmaps]
- level: Metadata
  resources:
  - group: ""
    resources: [secrets]
- level: Request
  resources:
  - group: ""
    resources: [pods]
  omitStages: [ResponseComplete]
- level: None
"#;

/// A server auditing with `policy` into `<dir>/logs/audit.log`.
fn start(policy: &str, extra: &[&str]) -> (ApiServer, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(&policy_file, policy).expect("policy");
    let log = dir.path().join("logs").join("audit.log");
    let (policy_arg, log_arg) = (policy_file.display().to_string(), log.display().to_string());
    let mut args = vec!["--audit-policy-file", policy_arg.as_str(), "--audit-log-path", log_arg.as_str()];
    args.extend_from_slice(extra);
    (ApiServer::start_with(dir, free_port(), &args), log)
}

/// Every Event in the log (torn or foreign lines fail the test).
fn events(log: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
}

fn about<'a>(events: &'a [Value], resource: &str, name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["objectRef"]["resource"] == resource && e["objectRef"]["name"] == name).collect()
}

#[test]
fn audit_log_records_each_request_at_the_policys_level() {
    let (s, log) = start(POLICY, &[]);
    assert!(kubectl(&s, &["create", "configmap", "loud", "--from-literal=a=b"]).0);
    assert!(kubectl(&s, &["create", "configmap", "quiet", "--from-literal=a=b"]).0);
    assert!(kubectl(&s, &["get", "configmap", "quiet"]).0);
    assert!(kubectl(&s, &["create", "secret", "generic", "hidden", "--from-literal=k=v"]).0);
    assert!(kubectl(&s, &["get", "secret", "absent"]).1.contains("NotFound"));
    for watched in ["pods", "secrets"] {
        let uri = format!("/api/v1/namespaces/default/{watched}?watch=true&timeoutSeconds=1");
        let (ok, out) = kubectl(&s, &["get", "--raw", &uri]);
        assert!(ok, "{out}");
    }
    // The writer runs behind the requests: wait for the last one.
    eventually("the secrets watch's ResponseComplete", || {
        events(&log).iter().any(|e| {
            e["verb"] == "watch" && e["stage"] == "ResponseComplete" && e["objectRef"]["namespace"] == "default"
        })
    });
    let all = events(&log);
    for e in &all {
        assert_eq!((e["kind"].as_str(), e["apiVersion"].as_str()), (Some("Event"), Some("audit.k8s.io/v1")), "{e}");
        assert_ne!(e["stage"], "RequestReceived", "the policy omits RequestReceived: {e}");
        assert!(e["auditID"].as_str().is_some_and(|id| id.len() == 36), "{e}");
        assert!(e["requestReceivedTimestamp"].is_string() && e["stageTimestamp"].is_string(), "{e}");
    }

    // RequestResponse: the request and the stored object.
    let loud = about(&all, "configmaps", "loud");
    assert_eq!(loud.len(), 1, "{loud:?}");
    let e = loud[0];
    assert_eq!(
        (e["level"].as_str(), e["verb"].as_str(), e["stage"].as_str()),
        (Some("RequestResponse"), Some("create"), Some("ResponseComplete"))
    );
    assert_eq!(e["requestURI"].as_str().map(|u| u.starts_with("/api/v1/namespaces/default/configmaps")), Some(true));
    assert_eq!(e["objectRef"]["namespace"], "default");
    assert_eq!(e["objectRef"]["apiVersion"], "v1");
    assert_eq!(e["responseStatus"]["code"], 201);
    assert_eq!(e["requestObject"]["data"]["a"], "b");
    assert!(e["responseObject"]["metadata"]["uid"].is_string(), "{e}");
    assert!(e["user"]["username"].is_string() && e["sourceIPs"][0] == "127.0.0.1", "{e}");
    assert!(e["userAgent"].as_str().is_some_and(|a| a.starts_with("kubectl")), "{e}");
    assert_eq!(e["annotations"]["authorization.k8s.io/decision"], "allow");

    // None for requests naming "quiet"; its create names no object in
    // its path, so (as upstream) resourceNames do not match it.
    let quiet: Vec<_> = about(&all, "configmaps", "quiet").iter().map(|e| e["verb"].as_str()).collect();
    assert_eq!(quiet, [Some("create")]);

    // Metadata: neither object.
    let hidden = about(&all, "secrets", "hidden");
    assert_eq!(hidden.len(), 1, "{hidden:?}");
    assert_eq!(hidden[0]["level"], "Metadata");
    assert!(hidden[0].get("requestObject").is_none() && hidden[0].get("responseObject").is_none());
    let absent = about(&all, "secrets", "absent");
    assert_eq!(absent.len(), 1);
    assert_eq!((absent[0]["verb"].as_str(), absent[0]["responseStatus"]["code"].as_i64()), (Some("get"), Some(404)));
    assert_eq!(absent[0]["responseStatus"]["reason"], "NotFound");

    // A watch starts and completes; the pods rule omits ResponseComplete,
    // so only its start is written.
    let watch_stages = |resource: &str| -> Vec<&str> {
        all.iter()
            .filter(|e| e["verb"] == "watch" && e["objectRef"]["resource"] == resource)
            .filter(|e| e["userAgent"].as_str().is_some_and(|a| a.starts_with("kubectl")))
            .filter_map(|e| e["stage"].as_str())
            .collect()
    };
    assert_eq!(watch_stages("secrets"), ["ResponseStarted", "ResponseComplete"]);
    assert_eq!(watch_stages("pods"), ["ResponseStarted"]);
}

#[test]
fn forbidden_requests_carry_the_decision_and_the_impersonated_user() {
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n  users: [mallory]\n";
    let (s, log) = start(policy, &[]);
    let (ok, out) = kubectl(&s, &["get", "secrets", "--as=mallory"]);
    assert!(!ok && out.contains("Forbidden"), "{out}");
    eventually("mallory's ResponseComplete", || {
        events(&log).iter().any(|e| e["impersonatedUser"]["username"] == "mallory" && e["stage"] == "ResponseComplete")
    });
    let all: Vec<Value> = events(&log).into_iter().filter(|e| e["objectRef"]["resource"] == "secrets").collect();
    let stages: Vec<_> = all.iter().map(|e| e["stage"].as_str().unwrap_or_default()).collect();
    assert_eq!(stages, ["RequestReceived", "ResponseComplete"], "{all:?}");
    let e = &all[1];
    assert_eq!(e["responseStatus"]["code"], 403);
    assert_eq!(e["annotations"]["authorization.k8s.io/decision"], "forbid");
    assert_eq!(e["verb"], "list");
    assert_eq!(e["annotations"]["authorization.k8s.io/reason"], "");
    assert_eq!(all[0]["auditID"], e["auditID"]);

    // Allowed by RBAC: the reason names the binding, as upstream's does.
    let (ok, out) =
        kubectl(&s, &["create", "clusterrolebinding", "mallory-view", "--clusterrole=view", "--user=mallory"]);
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&s, &["get", "configmaps", "--as=mallory"]);
    assert!(ok, "{out}");
    let reason = "RBAC: allowed by ClusterRoleBinding \"mallory-view\" of ClusterRole \"view\" to User \"mallory\"";
    eventually("mallory's allowed list", || {
        events(&log).iter().any(|e| {
            e["objectRef"]["resource"] == "configmaps"
                && e["stage"] == "ResponseComplete"
                && e["annotations"]["authorization.k8s.io/decision"] == "allow"
                && e["annotations"]["authorization.k8s.io/reason"] == reason
        })
    });
}

#[test]
fn audit_log_rotates_by_size_and_keeps_maxbackup_files() {
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: RequestResponse\n  resources:\n  - group: \"\"\n    resources: [configmaps]\n";
    let (s, log) = start(policy, &["--audit-log-maxsize", "1", "--audit-log-maxbackup", "1"]);
    let big = s.dir.path().join("big.txt");
    std::fs::write(&big, "x".repeat(300 * 1024)).expect("big file");
    let from_file = format!("--from-file=big={}", big.display());
    // Each create is a ~600 KiB line (the data in the request and the response).
    for i in 0..8 {
        let (ok, out) = kubectl(&s, &["create", "configmap", &format!("big-{i}"), &from_file]);
        assert!(ok, "{out}");
    }
    eventually("the last create in the current log", || {
        events(&log).iter().any(|e| e["objectRef"]["name"] == "big-7" && e["stage"] == "ResponseComplete")
    });
    let dir = log.parent().expect("log dir");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "the log and one backup: {names:?}");
    assert_eq!(names[1], "audit.log");
    assert!(names[0].starts_with("audit-") && names[0].ends_with(".log"), "{names:?}");
    for n in &names {
        let path = dir.join(n);
        let size = std::fs::metadata(&path).expect("size").len();
        assert!(size <= 1024 * 1024, "{n} is {size} bytes, over --audit-log-maxsize");
        assert!(!events(&path).is_empty(), "{n} holds whole events");
    }
}

/// The ReplicaSet controller acts as its own service account, bound by
/// `system:controller:replicaset-controller`: without the binding its pod
/// creates are refused (and audited as such); with it back, pods come.
#[test]
fn replicaset_controller_is_refused_by_rbac_without_its_binding() {
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  users: [\"system:serviceaccount:kube-system:replicaset-controller\"]\n  resources:\n  - group: \"\"\n    resources: [pods]\n";
    let (s, log) = start(policy, &[]);
    let (ok, out) = kubectl(&s, &["delete", "clusterrolebinding", "system:controller:replicaset-controller"]);
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&s, &["create", "deployment", "web", "--image=busybox:1.36", "--replicas=2"]);
    assert!(ok, "{out}");
    eventually("a refused pod create by the replicaset-controller", || {
        events(&log).iter().any(|e| {
            e["verb"] == "create"
                && e["user"]["username"] == "system:serviceaccount:kube-system:replicaset-controller"
                && e["responseStatus"]["code"] == 403
                && e["responseStatus"]["reason"] == "Forbidden"
        })
    });
    // The Deployment's ReplicaSet exists (the deployment controller is
    // allowed) but has no pods.
    let (ok, out) = kubectl(&s, &["get", "rs", "-l", "app=web", "-o", "name"]);
    assert!(ok && out.contains("replicaset.apps/web-"), "{out}");
    let (_, pods) = kubectl(&s, &["get", "pods", "-l", "app=web", "-o", "name"]);
    assert!(pods.trim().is_empty() || pods.contains("No resources"), "pods created without RBAC: {pods}");
    // The binding back: the controller's retries succeed.
    let (ok, out) = kubectl(
        &s,
        &[
            "create",
            "clusterrolebinding",
            "system:controller:replicaset-controller",
            "--clusterrole=system:controller:replicaset-controller",
            "--serviceaccount=kube-system:replicaset-controller",
        ],
    );
    assert!(ok, "{out}");
    eventually("two pods", || kubectl(&s, &["get", "pods", "-l", "app=web", "-o", "name"]).1.lines().count() == 2);
}

/// The scheduler acts as `system:kube-scheduler`, bound by the role of that
/// name and no longer in system:masters: without its binding it cannot
/// bind pods.
#[test]
fn scheduler_is_refused_by_rbac_without_its_binding() {
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  users: [\"system:kube-scheduler\"]\n  resources:\n  - group: \"\"\n    resources: [pods/binding]\n";
    let (s, log) = start(policy, &[]);
    let (ok, out) = kubectl(&s, &["delete", "clusterrolebinding", "system:kube-scheduler"]);
    assert!(ok, "{out}");
    let node = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"kubernetes.io/hostname":"n1"}},
        "status":{"allocatable":{"cpu":"4","memory":"8Gi","pods":"110"},"capacity":{"cpu":"4","memory":"8Gi","pods":"110"},
        "conditions":[{"type":"Ready","status":"True"}]}}"#;
    common::create(&s, node);
    let (ok, out) = kubectl(&s, &["run", "p", "--image=busybox:1.36"]);
    assert!(ok, "{out}");
    eventually("a refused binding by the scheduler", || {
        events(&log).iter().any(|e| {
            e["objectRef"]["subresource"] == "binding"
                && e["user"]["username"] == "system:kube-scheduler"
                && e["responseStatus"]["code"] == 403
        })
    });
    let node_of = || kubectl(&s, &["get", "pod", "p", "-o", "jsonpath={.spec.nodeName}"]).1;
    assert_eq!(node_of(), "", "bound without RBAC");
    let (ok, out) = kubectl(
        &s,
        &[
            "create",
            "clusterrolebinding",
            "system:kube-scheduler",
            "--clusterrole=system:kube-scheduler",
            "--user=system:kube-scheduler",
        ],
    );
    assert!(ok, "{out}");
    eventually("the pod bound", || node_of() == "n1");
}

/// Every controller acts as its own service account in kube-system (which
/// exists, for all to see), bound by `system:controller:<name>`: without
/// the deployment-controller's binding a Deployment gets no ReplicaSet,
/// and the refusal is audited under that name; with it back, the
/// Deployment progresses. The controller manager itself, whose shared
/// informers and Lease are audited here too, is not in system:masters.
#[test]
fn deployment_controller_is_refused_by_rbac_without_its_binding() {
    let sa = "system:serviceaccount:kube-system:deployment-controller";
    let policy = format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  users: [\"{sa}\"]\n  resources:\n  - group: apps\n    resources: [replicasets]\n- level: Metadata\n  users: [\"system:kube-controller-manager\"]\n  resources:\n  - group: coordination.k8s.io\n    resources: [leases]\n"
    );
    let (s, log) = start(&policy, &[]);
    for name in ["deployment-controller", "replicaset-controller", "node-controller", "generic-garbage-collector"] {
        let (ok, out) = kubectl(&s, &["-n", "kube-system", "get", "serviceaccount", name, "-o", "name"]);
        assert!(ok && out.contains(name), "{out}");
    }
    let (ok, out) = kubectl(&s, &["delete", "clusterrolebinding", "system:controller:deployment-controller"]);
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&s, &["create", "deployment", "web", "--image=busybox:1.36", "--replicas=1"]);
    assert!(ok, "{out}");
    eventually("a refused ReplicaSet create by the deployment-controller", || {
        events(&log).iter().any(|e| {
            e["verb"] == "create"
                && e["user"]["username"] == sa
                && e["objectRef"]["resource"] == "replicasets"
                && e["responseStatus"]["code"] == 403
                && e["annotations"]["authorization.k8s.io/decision"] == "forbid"
        })
    });
    let replicasets = || kubectl(&s, &["get", "rs", "-l", "app=web", "-o", "name"]).1;
    assert!(!replicasets().contains("replicaset.apps/web-"), "a ReplicaSet made without RBAC");
    let (ok, out) = kubectl(
        &s,
        &[
            "create",
            "clusterrolebinding",
            "system:controller:deployment-controller",
            "--clusterrole=system:controller:deployment-controller",
            "--serviceaccount=kube-system:deployment-controller",
        ],
    );
    assert!(ok, "{out}");
    common::eventually_within("the Deployment's ReplicaSet", std::time::Duration::from_secs(60), || {
        replicasets().contains("replicaset.apps/web-")
    });
    eventually("the ReplicaSet's create allowed and audited", || {
        events(&log)
            .iter()
            .any(|e| e["verb"] == "create" && e["user"]["username"] == sa && e["responseStatus"]["code"] == 201)
    });

    // The controller manager's own requests: its name, not system:masters.
    eventually("the controller manager's Lease in the audit log", || {
        events(&log).iter().any(|e| e["user"]["username"] == "system:kube-controller-manager")
    });
    for e in events(&log).iter().filter(|e| e["user"]["username"] == "system:kube-controller-manager") {
        let groups = e["user"]["groups"].as_array().cloned().unwrap_or_default();
        assert!(!groups.iter().any(|g| g == "system:masters"), "the controller manager is in system:masters: {e}");
        assert_eq!(e["annotations"]["authorization.k8s.io/decision"], "allow", "{e}");
    }
}

/// The workloads of one namespace, touching every controller's role.
const WORKLOADS: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: apps/v1, kind: Deployment, metadata: {name: web, namespace: team},
   spec: {replicas: 1, selector: {matchLabels: {app: web}}, template: {metadata: {labels: {app: web}}, spec: {containers: [{name: c, image: busybox}]}}}}
- {apiVersion: apps/v1, kind: StatefulSet, metadata: {name: db, namespace: team},
   spec: {serviceName: db, replicas: 1, selector: {matchLabels: {app: db}}, template: {metadata: {labels: {app: db}}, spec: {containers: [{name: c, image: busybox}]}},
          volumeClaimTemplates: [{metadata: {name: data}, spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}}]}}
- {apiVersion: apps/v1, kind: DaemonSet, metadata: {name: agent, namespace: team},
   spec: {selector: {matchLabels: {app: agent}}, template: {metadata: {labels: {app: agent}}, spec: {containers: [{name: c, image: busybox}]}}}}
- {apiVersion: batch/v1, kind: Job, metadata: {name: once, namespace: team},
   spec: {template: {spec: {restartPolicy: Never, containers: [{name: c, image: busybox}]}}}}
- {apiVersion: batch/v1, kind: CronJob, metadata: {name: tick, namespace: team},
   spec: {schedule: "* * * * *", jobTemplate: {spec: {template: {spec: {restartPolicy: Never, containers: [{name: c, image: busybox}]}}}}}}
- {apiVersion: v1, kind: Service, metadata: {name: web, namespace: team}, spec: {selector: {app: web}, ports: [{port: 80}]}}
- {apiVersion: policy/v1, kind: PodDisruptionBudget, metadata: {name: web, namespace: team}, spec: {minAvailable: 1, selector: {matchLabels: {app: web}}}}
- {apiVersion: v1, kind: ResourceQuota, metadata: {name: q, namespace: team}, spec: {hard: {pods: "10", configmaps: "10"}}}
- {apiVersion: v1, kind: PersistentVolume, metadata: {name: pv1},
   spec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], hostPath: {path: /tmp/pv1}, persistentVolumeReclaimPolicy: Retain}}
- {apiVersion: v1, kind: PersistentVolume, metadata: {name: pv2},
   spec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], hostPath: {path: /tmp/pv2}, persistentVolumeReclaimPolicy: Retain}}
- {apiVersion: v1, kind: PersistentVolumeClaim, metadata: {name: claim, namespace: team},
   spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}, storageClassName: ""}}
"#;

/// In ordinary work no controller is refused: each role covers what its
/// controller does (a rule missing shows here as a 403 in the audit log).
#[test]
fn controllers_are_not_refused_in_ordinary_work() {
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  userGroups: [\"system:serviceaccounts:kube-system\"]\n- level: Metadata\n  users: [\"system:kube-controller-manager\"]\n";
    let (s, log) = start(policy, &[]);
    let node = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"kubernetes.io/hostname":"n1"}},
        "status":{"allocatable":{"cpu":"4","memory":"8Gi","pods":"110"},"capacity":{"cpu":"4","memory":"8Gi","pods":"110"},
        "conditions":[{"type":"Ready","status":"True"}]}}"#;
    common::create(&s, node);
    assert!(kubectl(&s, &["create", "namespace", "team"]).0);
    common::create(&s, WORKLOADS);
    let get = |args: &[&str]| kubectl(&s, args).1;
    eventually("pods of the Deployment, StatefulSet, DaemonSet and Job", || {
        let pods = get(&["get", "pods", "-n", "team", "-o", "name"]);
        ["web-", "db-0", "agent-", "once-"].iter().all(|p| pods.contains(&format!("pod/{p}")))
    });
    eventually("the claim bound", || {
        get(&["get", "pvc", "claim", "-n", "team", "-o", "jsonpath={.status.phase}"]) == "Bound"
    });
    eventually("the Service's EndpointSlice and Endpoints", || {
        get(&["get", "endpointslices", "-n", "team", "-l", "kubernetes.io/service-name=web", "-o", "name"])
            .contains("endpointslice")
            && kubectl(&s, &["get", "endpoints", "web", "-n", "team"]).0
    });
    eventually("the budget's and the quota's status", || {
        !get(&["get", "pdb", "web", "-n", "team", "-o", "jsonpath={.status.observedGeneration}"]).is_empty()
            && !get(&["get", "quota", "q", "-n", "team", "-o", "jsonpath={.status.used.pods}"]).is_empty()
    });
    eventually("the namespace's defaults", || {
        kubectl(&s, &["get", "sa", "default", "-n", "team"]).0
            && kubectl(&s, &["get", "cm", "kube-root-ca.crt", "-n", "team"]).0
    });
    let (ok, out) = kubectl(&s, &["delete", "namespace", "team", "--wait=false"]);
    assert!(ok, "{out}");
    eventually("the namespace's workloads deleted", || {
        get(&["get", "deploy,sts,ds,jobs,cronjobs,svc", "-n", "team", "-o", "name"]).trim().is_empty()
    });
    // Refused by the authorizer (a create in the terminating namespace is a
    // 403 too, but from admission, and its decision is "allow").
    let refused: Vec<Value> =
        events(&log).into_iter().filter(|e| e["annotations"]["authorization.k8s.io/decision"] == "forbid").collect();
    let shown: Vec<String> = refused
        .iter()
        .map(|e| {
            format!("{} {} {}: {}", e["user"]["username"], e["verb"], e["requestURI"], e["responseStatus"]["message"])
        })
        .collect();
    assert!(refused.is_empty(), "controllers refused:\n{}", shown.join("\n"));
    // Each controller was at work under its own name.
    let all = events(&log);
    for name in [
        "deployment-controller",
        "statefulset-controller",
        "daemon-set-controller",
        "job-controller",
        "persistent-volume-binder",
        "endpointslice-controller",
        "namespace-controller",
    ] {
        let user = format!("system:serviceaccount:kube-system:{name}");
        assert!(all.iter().any(|e| e["user"]["username"] == user.as_str()), "no request by {user}");
    }
}

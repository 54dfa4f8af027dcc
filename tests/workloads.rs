//! The ReplicaSet and Deployment controllers driven with kubectl, with the
//! kubelet simulated by patching pod status: creation, scaling, rolling
//! updates within maxSurge / maxUnavailable, rollback, pause and resume,
//! Recreate, the progress deadline, pod replacement and adoption.

mod common;

use common::{apply, eventually, kubectl};

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn ok(s: &common::ApiServer, args: &[&str]) -> String {
    let (ok, out) = kubectl(s, args);
    assert!(ok, "kubectl {args:?} failed: {out}");
    out
}

fn spawn_kubectl(s: &common::ApiServer, args: &[&str]) -> Child {
    Command::new("kubectl")
        .env("KUBECONFIG", s.kubeconfig())
        .env("HOME", s.dir.path())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl")
}

fn jsonpath(s: &common::ApiServer, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let jp = format!("jsonpath={path}");
    args.extend(["-o", jp.as_str()]);
    ok(s, &args).trim().to_string()
}

/// Pods as (name, ready, owner name) with the selector `app=<app>`.
fn pods(s: &common::ApiServer, app: &str) -> Vec<(String, bool, String)> {
    let out = jsonpath(
        s,
        &["pods", "-l", &format!("app={app}")],
        r#"{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status} {.metadata.ownerReferences[0].name}{"\n"}{end}"#,
    );
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[0].to_string(), f.get(1) == Some(&"True"), f.get(2).unwrap_or(&"").to_string())
        })
        .collect()
}

/// What the kubelet would report for a started, ready pod.
fn mark_ready(s: &common::ApiServer, pod: &str) {
    let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let patch = format!(
        r#"{{"status":{{"phase":"Running","conditions":[{{"type":"Ready","status":"True","lastTransitionTime":"{now}"}}]}}}}"#
    );
    let (_, out) = kubectl(s, &["patch", "pod", pod, "--subresource=status", "--type=merge", "-p", &patch]);
    assert!(!out.contains("error") || out.contains("NotFound"), "{out}");
}

fn mark_all_ready(s: &common::ApiServer, app: &str) {
    for (name, ready, _) in pods(s, app) {
        if !ready {
            mark_ready(s, &name);
        }
    }
}

/// ReplicaSets of `app` as (name, spec.replicas, revision).
fn replicasets(s: &common::ApiServer, app: &str) -> Vec<(String, i32, String)> {
    let out = jsonpath(
        s,
        &["rs", "-l", &format!("app={app}")],
        r#"{range .items[*]}{.metadata.name} {.spec.replicas} {.metadata.annotations.deployment\.kubernetes\.io/revision}{"\n"}{end}"#,
    );
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[0].to_string(), f[1].parse().unwrap_or(-1), f.get(2).unwrap_or(&"").to_string())
        })
        .collect()
}

fn deployment(name: &str, replicas: i32, strategy: &str, extra_spec: &str) -> String {
    format!(
        r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"{name}"}},
        "spec":{{"replicas":{replicas},"selector":{{"matchLabels":{{"app":"{name}"}}}},"strategy":{strategy}{extra_spec},
        "template":{{"metadata":{{"labels":{{"app":"{name}"}}}},"spec":{{"containers":[{{"name":"c","image":"nginx:1"}}]}}}}}}}}"#
    )
}

/// Waits for `kubectl rollout status` while acting as the kubelet for new pods.
fn rollout_with_kubelet(s: &common::ApiServer, app: &str, mut each_step: impl FnMut()) -> String {
    let mut status = spawn_kubectl(s, &["rollout", "status", &format!("deploy/{app}"), "--timeout=30s"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(code) = status.try_wait().expect("wait") {
            let out = status.wait_with_output().expect("output");
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            assert!(code.success(), "rollout status failed: {text}");
            return text;
        }
        assert!(Instant::now() < deadline, "rollout did not finish");
        each_step();
        // One pod at a time, so that each step of the rollout is observed.
        if let Some((name, _, _)) = pods(s, app).into_iter().find(|p| !p.1) {
            mark_ready(s, &name);
        }
        std::thread::sleep(Duration::from_millis(150));
    }
}

#[test]
fn deployment_creates_replicaset_and_pods_and_scales() {
    let s = common::ApiServer::start();
    ok(&s, &["create", "deployment", "web", "--image=nginx:1", "--replicas=3"]);
    eventually("three pods", || pods(&s, "web").len() == 3);
    let rs = replicasets(&s, "web");
    assert_eq!(rs.len(), 1, "{rs:?}");
    let (rs_name, _, revision) = &rs[0];
    assert_eq!(revision, "1");
    let hash = jsonpath(&s, &["rs", rs_name], "{.metadata.labels.pod-template-hash}");
    assert_eq!(rs_name, &format!("web-{hash}"));
    assert_eq!(jsonpath(&s, &["rs", rs_name], "{.spec.selector.matchLabels.pod-template-hash}"), hash);
    let owner =
        jsonpath(&s, &["rs", rs_name], "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].controller}");
    assert_eq!(owner, "Deployment/true");
    for (pod, _, owner) in pods(&s, "web") {
        assert_eq!(&owner, rs_name);
        assert!(pod.starts_with(&format!("{rs_name}-")), "{pod}");
        let block = jsonpath(&s, &["pod", &pod], "{.metadata.ownerReferences[0].blockOwnerDeletion}");
        assert_eq!(block, "true");
        assert_eq!(jsonpath(&s, &["pod", &pod], "{.metadata.labels.pod-template-hash}"), hash);
    }

    // Not available until pods are ready; `kubectl wait` sees it become so.
    let wait = spawn_kubectl(&s, &["wait", "--for=condition=Available", "deploy/web", "--timeout=20s"]);
    mark_all_ready(&s, "web");
    let out = wait.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually("status counters", || {
        jsonpath(
            &s,
            &["deploy", "web"],
            "{.status.replicas} {.status.updatedReplicas} {.status.readyReplicas} {.status.availableReplicas}",
        ) == "3 3 3 3"
    });
    let describe = ok(&s, &["describe", "deployment", "web"]);
    assert!(describe.contains(&format!("Scaled up replica set {rs_name} from 0 to 3")), "{describe}");
    assert!(describe.contains("MinimumReplicasAvailable"), "{describe}");
    assert!(describe.contains("NewReplicaSetAvailable"), "{describe}");
    assert!(describe.contains(&format!("NewReplicaSet:   {rs_name} (3/3 replicas created)")), "{describe}");

    ok(&s, &["scale", "deployment", "web", "--replicas=5"]);
    eventually("five pods", || pods(&s, "web").len() == 5);
    ok(&s, &["scale", "deployment", "web", "--replicas=1"]);
    eventually("one pod", || pods(&s, "web").len() == 1);
    assert_eq!(replicasets(&s, "web").len(), 1, "scaling must not make a new replica set");
    eventually("the scale-down event", || {
        ok(&s, &["get", "events"]).contains(&format!("Scaled down replica set {rs_name} from 5 to 1"))
    });
    let events = ok(&s, &["get", "events", "--field-selector", "reason=SuccessfulDelete"]);
    assert!(events.contains("Deleted pod: "), "{events}");
}

#[test]
fn rolling_update_respects_surge_and_unavailability_then_undo() {
    let s = common::ApiServer::start();
    let strategy = r#"{"type":"RollingUpdate","rollingUpdate":{"maxSurge":1,"maxUnavailable":0}}"#;
    apply(&s, &deployment("web", 4, strategy, ""));
    eventually("four pods", || pods(&s, "web").len() == 4);
    mark_all_ready(&s, "web");
    eventually("the first rollout", || jsonpath(&s, &["deploy", "web"], "{.status.availableReplicas}") == "4");
    ok(&s, &["set", "image", "deploy/web", "c=nginx:2"]);
    let out = rollout_with_kubelet(&s, "web", || {
        let sets = replicasets(&s, "web");
        let total: i32 = sets.iter().map(|r| r.1).sum();
        assert!(total <= 5, "more than replicas + maxSurge: {sets:?}");
        let ready = pods(&s, "web").iter().filter(|p| p.1).count();
        assert!(ready >= 4, "fewer than replicas - maxUnavailable ready: {ready}");
    });
    assert!(out.contains("successfully rolled out"), "{out}");
    let sets = replicasets(&s, "web");
    assert_eq!(sets.len(), 2, "{sets:?}");
    let new = sets.iter().find(|r| r.2 == "2").expect("revision 2");
    let old = sets.iter().find(|r| r.2 == "1").expect("revision 1");
    assert_eq!((new.1, old.1), (4, 0));
    assert!(pods(&s, "web").iter().all(|p| p.2 == new.0));
    assert_eq!(jsonpath(&s, &["deploy", "web"], "{.metadata.annotations.deployment\\.kubernetes\\.io/revision}"), "2");

    // Undo: back to the first template, which becomes revision 3.
    let out = ok(&s, &["rollout", "undo", "deploy/web"]);
    assert!(out.contains("rolled back"), "{out}");
    assert_eq!(jsonpath(&s, &["deploy", "web"], "{.spec.template.spec.containers[0].image}"), "nginx:1");
    rollout_with_kubelet(&s, "web", || {});
    let rs = jsonpath(&s, &["rs", &old.0], "{.spec.replicas} {.metadata.annotations.deployment\\.kubernetes\\.io/revision} {.metadata.annotations.deployment\\.kubernetes\\.io/revision-history}");
    assert_eq!(rs, "4 3 1");
    let history = ok(&s, &["rollout", "history", "deploy/web"]);
    assert!(history.contains("\n2 ") && history.contains("\n3 "), "{history}");
    // A restart makes yet another revision.
    ok(&s, &["rollout", "restart", "deploy/web"]);
    rollout_with_kubelet(&s, "web", || {});
    eventually("revision 4", || replicasets(&s, "web").iter().any(|r| r.2 == "4" && r.1 == 4));
}

#[test]
fn paused_deployments_scale_but_do_not_roll_out() {
    let s = common::ApiServer::start();
    ok(&s, &["create", "deployment", "web", "--image=nginx:1", "--replicas=2"]);
    eventually("two pods", || pods(&s, "web").len() == 2);
    mark_all_ready(&s, "web");
    ok(&s, &["rollout", "pause", "deploy/web"]);
    ok(&s, &["set", "image", "deploy/web", "nginx=nginx:2"]);
    eventually("the paused condition", || {
        jsonpath(&s, &["deploy", "web"], r#"{.status.conditions[?(@.type=="Progressing")].reason}"#)
            == "DeploymentPaused"
    });
    ok(&s, &["scale", "deploy/web", "--replicas=3"]);
    eventually("the scaled, observed spec", || {
        jsonpath(&s, &["deploy", "web"], "{.status.observedGeneration}")
            == jsonpath(&s, &["deploy", "web"], "{.metadata.generation}")
            && pods(&s, "web").len() == 3
    });
    assert_eq!(replicasets(&s, "web").len(), 1, "a paused deployment rolled out");
    ok(&s, &["rollout", "resume", "deploy/web"]);
    rollout_with_kubelet(&s, "web", || {});
    let sets = replicasets(&s, "web");
    assert_eq!(sets.len(), 2, "{sets:?}");
    assert!(sets.iter().any(|r| r.1 == 3 && r.2 == "2"), "{sets:?}");
}

#[test]
fn recreate_removes_old_pods_before_new_ones() {
    let s = common::ApiServer::start();
    // Pods bound to a node terminate gracefully: they stay until the kubelet
    // (here the test) removes them, and Recreate must wait for that.
    let body = deployment("web", 2, r#"{"type":"Recreate"}"#, "")
        .replace(r#""containers""#, r#""nodeName":"edge-1","containers""#);
    apply(&s, &body);
    eventually("two pods", || pods(&s, "web").len() == 2);
    mark_all_ready(&s, "web");
    eventually("two available", || jsonpath(&s, &["deploy", "web"], "{.status.availableReplicas}") == "2");
    ok(&s, &["set", "image", "deploy/web", "c=nginx:2"]);
    let terminating = |s: &common::ApiServer| {
        jsonpath(s, &["pods", "-l", "app=web"], "{.items[*].metadata.deletionTimestamp}").split_whitespace().count()
    };
    eventually("the old pods terminating", || terminating(&s) == 2);
    eventually("the old replica set scaled down", || replicasets(&s, "web").iter().all(|r| r.1 == 0));
    let watch_until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < watch_until {
        assert_eq!(replicasets(&s, "web").len(), 1, "a new replica set while old pods still terminate");
        std::thread::sleep(Duration::from_millis(100));
    }
    for (name, _, _) in pods(&s, "web") {
        ok(&s, &["delete", "pod", &name, "--grace-period=0", "--force"]);
    }
    rollout_with_kubelet(&s, "web", || {
        let sets = replicasets(&s, "web");
        let active = sets.iter().filter(|r| r.1 > 0).count();
        assert!(active <= 1, "old and new replica sets both active: {sets:?}");
        let owners: std::collections::HashSet<String> = pods(&s, "web").into_iter().map(|p| p.2).collect();
        assert!(owners.len() <= 1, "old and new pods side by side: {owners:?}");
    });
    let sets = replicasets(&s, "web");
    assert!(sets.iter().any(|r| r.1 == 2 && r.2 == "2") && sets.iter().any(|r| r.1 == 0 && r.2 == "1"), "{sets:?}");
}

#[test]
fn progress_deadline_exceeded() {
    let s = common::ApiServer::start();
    apply(&s, &deployment("stuck", 1, r#"{"type":"RollingUpdate"}"#, r#","progressDeadlineSeconds":1"#));
    eventually("ProgressDeadlineExceeded", || {
        jsonpath(&s, &["deploy", "stuck"], r#"{.status.conditions[?(@.type=="Progressing")].reason}"#)
            == "ProgressDeadlineExceeded"
    });
    let (ok_, out) = kubectl(&s, &["rollout", "status", "deploy/stuck", "--timeout=10s"]);
    assert!(!ok_ && out.contains("exceeded its progress deadline"), "{out}");
    let available = jsonpath(&s, &["deploy", "stuck"], r#"{.status.conditions[?(@.type=="Available")].reason}"#);
    assert_eq!(available, "MinimumReplicasUnavailable");
}

#[test]
fn replicaset_replaces_pods_adopts_orphans_and_releases_strays() {
    let s = common::ApiServer::start();
    apply(
        &s,
        r#"{"apiVersion":"apps/v1","kind":"ReplicaSet","metadata":{"name":"fe"},
        "spec":{"replicas":2,"selector":{"matchLabels":{"app":"fe"}},
        "template":{"metadata":{"labels":{"app":"fe"}},"spec":{"containers":[{"name":"c","image":"nginx:1"}]}}}}"#,
    );
    eventually("two pods", || pods(&s, "fe").len() == 2);
    let first = pods(&s, "fe")[0].0.clone();
    ok(&s, &["delete", "pod", &first, "--wait=false"]);
    eventually("a replacement", || {
        let p = pods(&s, "fe");
        p.len() == 2 && p.iter().all(|p| p.0 != first)
    });
    mark_all_ready(&s, "fe");
    eventually("ready status", || {
        jsonpath(
            &s,
            &["rs", "fe"],
            "{.status.replicas} {.status.readyReplicas} {.status.availableReplicas} {.status.fullyLabeledReplicas}",
        ) == "2 2 2 2"
    });

    // An orphan the selector matches is adopted, and the surplus deleted.
    apply(
        &s,
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"orphan","labels":{"app":"fe"}},
        "spec":{"containers":[{"name":"c","image":"nginx:1"}]}}"#,
    );
    eventually("two pods again", || pods(&s, "fe").len() == 2);
    let (_, orphan) = kubectl(&s, &["get", "pod", "orphan", "-o", "jsonpath={.metadata.ownerReferences[0].name}"]);
    // The orphan was either adopted and kept or adopted and deleted first
    // (it is the unready one), never left alone.
    assert!(orphan.contains("NotFound") || orphan.trim() == "fe", "{orphan}");
    assert!(pods(&s, "fe").iter().all(|p| p.2 == "fe"));
    eventually("SuccessfulDelete", || ok(&s, &["get", "events"]).contains("Deleted pod: "));

    // A pod relabelled out of the selector is released and replaced.
    let kept = pods(&s, "fe")[0].0.clone();
    ok(&s, &["label", "pod", &kept, "app=other", "--overwrite"]);
    eventually("the release", || jsonpath(&s, &["pod", &kept], "{.metadata.ownerReferences}").is_empty());
    eventually("a replacement for the released pod", || pods(&s, "fe").len() == 2);

    // Scaling a bare ReplicaSet down deletes unready pods first.
    mark_all_ready(&s, "fe");
    let ready_one = pods(&s, "fe")[0].0.clone();
    ok(&s, &["scale", "rs", "fe", "--replicas=3"]);
    eventually("three pods", || pods(&s, "fe").len() == 3);
    ok(&s, &["scale", "rs", "fe", "--replicas=2"]);
    eventually("two pods after scaling down", || pods(&s, "fe").len() == 2);
    assert!(pods(&s, "fe").iter().all(|p| p.1), "the unready pod should have gone first");
    assert!(pods(&s, "fe").iter().any(|p| p.0 == ready_one));
}

#[test]
fn quota_failures_show_as_replica_failure() {
    let s = common::ApiServer::start();
    ok(&s, &["create", "quota", "two", "--hard=pods=1"]);
    // As upstream, a quota constrains once the controller has computed its usage.
    eventually("quota usage", || jsonpath(&s, &["quota", "two"], "{.status.used.pods}") == "0");
    ok(&s, &["create", "deployment", "capped", "--image=nginx:1", "--replicas=2"]);
    eventually("ReplicaFailure on the deployment", || {
        jsonpath(&s, &["deploy", "capped"], r#"{.status.conditions[?(@.type=="ReplicaFailure")].reason}"#)
            == "FailedCreate"
    });
    let events = ok(&s, &["get", "events", "--field-selector", "reason=FailedCreate"]);
    assert!(events.contains("Error creating: ") && events.contains("exceeded quota"), "{events}");
    assert_eq!(pods(&s, "capped").len(), 1);
}

#[test]
fn scaling_during_a_rollout_is_proportional() {
    let s = common::ApiServer::start();
    let strategy = r#"{"type":"RollingUpdate","rollingUpdate":{"maxSurge":3,"maxUnavailable":2}}"#;
    apply(&s, &deployment("web", 10, strategy, ""));
    eventually("ten pods", || pods(&s, "web").len() == 10);
    mark_all_ready(&s, "web");
    eventually("ten available", || jsonpath(&s, &["deploy", "web"], "{.status.availableReplicas}") == "10");
    // The new pods never become ready: the rollout stops at 8 old + 5 new.
    ok(&s, &["set", "image", "deploy/web", "c=nginx:2"]);
    let sizes = |s: &common::ApiServer| {
        let mut v: Vec<(String, i32)> = replicasets(s, "web").into_iter().map(|r| (r.2, r.1)).collect();
        v.sort();
        v
    };
    eventually("the stalled rollout", || sizes(&s) == [("1".to_string(), 8), ("2".to_string(), 5)]);
    // 15 replicas with maxSurge 3 allow 18 pods: the 5 more go 3 to the
    // old and 2 to the new ReplicaSet, in proportion to their sizes.
    ok(&s, &["scale", "deploy/web", "--replicas=15"]);
    eventually("proportional sizes", || sizes(&s) == [("1".to_string(), 11), ("2".to_string(), 7)]);
    eventually("18 pods", || pods(&s, "web").len() == 18);
}

#[test]
fn history_limit_and_min_ready_seconds() {
    let s = common::ApiServer::start();
    let extra = r#","revisionHistoryLimit":1,"minReadySeconds":3"#;
    apply(&s, &deployment("web", 1, r#"{"type":"RollingUpdate"}"#, extra));
    eventually("one pod", || pods(&s, "web").len() == 1);
    mark_all_ready(&s, "web");
    // Ready, but available only once it has been ready for minReadySeconds.
    eventually("ready", || jsonpath(&s, &["rs", "-l", "app=web"], "{.items[0].status.readyReplicas}") == "1");
    let available = jsonpath(&s, &["rs", "-l", "app=web"], "{.items[0].status.availableReplicas}");
    assert!(available.is_empty(), "available before minReadySeconds: {available}");
    eventually("available", || jsonpath(&s, &["deploy", "web"], "{.status.availableReplicas}") == "1");
    for image in ["c=nginx:2", "c=nginx:3"] {
        ok(&s, &["set", "image", "deploy/web", image]);
        rollout_with_kubelet(&s, "web", || {});
    }
    // Revision 1 is cleaned up; revision 2 is kept as the one old set.
    eventually("two replica sets", || {
        let mut revs: Vec<String> = replicasets(&s, "web").into_iter().map(|r| r.2).collect();
        revs.sort();
        revs == ["2", "3"]
    });
}

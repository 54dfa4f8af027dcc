//! StatefulSets, DaemonSets, Jobs, CronJobs and finished-Job TTLs against a
//! real `ferrok server`, driven with kubectl; the kubelet is simulated by
//! patching pod status.

mod common;

use common::{apply, eventually, kubectl};

use std::time::Duration;

fn get(s: &common::ApiServer, args: &[&str]) -> String {
    let (ok, out) = kubectl(s, args);
    assert!(ok, "kubectl {args:?}: {out}");
    out
}

/// Pod names matching `selector`, sorted.
fn pods(s: &common::ApiServer, selector: &str) -> Vec<String> {
    let out = get(s, &["get", "pods", "-l", selector, "-o", "jsonpath={.items[*].metadata.name}"]);
    let mut names: Vec<String> = out.split_whitespace().map(str::to_string).collect();
    names.sort();
    names
}

/// What a kubelet would report for a pod.
fn set_phase(s: &common::ApiServer, pod: &str, phase: &str) {
    let ready = if phase == "Running" { "True" } else { "False" };
    let patch = format!(r#"{{"status":{{"phase":"{phase}","conditions":[{{"type":"Ready","status":"{ready}"}}]}}}}"#);
    let (ok, out) = kubectl(s, &["patch", "pod", pod, "--subresource=status", "--type=merge", "-p", &patch]);
    assert!(ok, "{out}");
}

#[test]
fn statefulset_creates_in_order_and_scales_down_from_the_top() {
    let s = common::ApiServer::start();
    apply(
        &s,
        r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: web
  replicas: 3
  persistentVolumeClaimRetentionPolicy: {whenDeleted: Retain, whenScaled: Delete}
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: nginx}]}
  volumeClaimTemplates:
  - metadata: {name: www}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
"#,
    );
    eventually("web-0", || pods(&s, "app=web") == ["web-0"]);
    // web-1 waits until web-0 is Running and Ready.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(pods(&s, "app=web"), ["web-0"]);
    let labels = get(&s, &["get", "pod", "web-0", "-o", "jsonpath={.metadata.labels}"]);
    assert!(labels.contains(r#""statefulset.kubernetes.io/pod-name":"web-0""#), "{labels}");
    assert!(labels.contains(r#""apps.kubernetes.io/pod-index":"0""#), "{labels}");
    assert!(labels.contains(r#""controller-revision-hash":"web-"#), "{labels}");
    assert!(get(&s, &["get", "pvc", "www-web-0", "-o", "name"]).contains("www-web-0"));
    let claim = get(
        &s,
        &["get", "pod", "web-0", "-o", "jsonpath={.spec.volumes[?(@.name=='www')].persistentVolumeClaim.claimName}"],
    );
    assert_eq!(claim.trim(), "www-web-0");
    for i in 0..3 {
        let pod = format!("web-{i}");
        eventually(&pod, || pods(&s, "app=web").contains(&pod));
        set_phase(&s, &pod, "Running");
    }
    let (ok, out) = kubectl(&s, &["rollout", "status", "statefulset/web", "--timeout=15s"]);
    assert!(ok, "{out}");
    let status = get(
        &s,
        &[
            "get",
            "sts",
            "web",
            "-o",
            "jsonpath={.status.readyReplicas}/{.status.currentReplicas}/{.status.updatedReplicas}",
        ],
    );
    assert_eq!(status, "3/3/3");
    let events = get(
        &s,
        &["get", "events", "--field-selector", "involvedObject.name=web", "-o", "jsonpath={.items[*].message}"],
    );
    assert!(events.contains("create Pod web-0 in StatefulSet web successful"), "{events}");
    // RollingUpdate: from the highest ordinal down, each once its successor is Ready.
    get(&s, &["set", "image", "sts/web", "c=nginx:1.27"]);
    let mut update = String::new();
    eventually("a new update revision", || {
        update = get(&s, &["get", "sts", "web", "-o", "jsonpath={.status.updateRevision}"]);
        update != get(&s, &["get", "sts", "web", "-o", "jsonpath={.status.currentRevision}"])
    });
    for i in [2, 1, 0] {
        let pod = format!("web-{i}");
        eventually(&format!("{pod} at the update revision"), || {
            kubectl(&s, &["get", "pod", &pod, "-o", "jsonpath={.metadata.labels.controller-revision-hash}"]).1 == update
        });
        if i > 0 {
            let lower = get(
                &s,
                &[
                    "get",
                    "pod",
                    &format!("web-{}", i - 1),
                    "-o",
                    "jsonpath={.metadata.labels.controller-revision-hash}",
                ],
            );
            assert_ne!(lower, update, "web-{} was updated before {pod} was Ready", i - 1);
        }
        set_phase(&s, &pod, "Running");
    }
    let (ok, out) = kubectl(&s, &["rollout", "status", "statefulset/web", "--timeout=15s"]);
    assert!(ok, "{out}");
    assert_eq!(get(&s, &["get", "sts", "web", "-o", "jsonpath={.status.currentRevision}"]), update);
    // Scale down from the top (the order itself is unit-tested).
    get(&s, &["scale", "sts", "web", "--replicas=1"]);
    eventually("web-2 and web-1 to be deleted", || pods(&s, "app=web") == ["web-0"]);
    let events = get(
        &s,
        &["get", "events", "--field-selector", "involvedObject.name=web", "-o", "jsonpath={.items[*].message}"],
    );
    assert!(events.contains("delete Pod web-2 in StatefulSet web successful"), "{events}");
    // whenScaled: Delete removes the claims of the pods scaled away.
    eventually("the claims of web-1 and web-2 to go", || {
        get(&s, &["get", "pvc", "-o", "jsonpath={.items[*].metadata.name}"]) == "www-web-0"
    });
    eventually("status replicas 1", || get(&s, &["get", "sts", "web", "-o", "jsonpath={.status.replicas}"]) == "1");
    // Orphaned pods are adopted by a new StatefulSet with the same selector.
    let yaml = get(&s, &["get", "sts", "web", "-o", "yaml"]);
    get(&s, &["delete", "sts", "web", "--cascade=orphan"]);
    eventually("web-0 orphaned", || {
        get(&s, &["get", "pod", "web-0", "-o", "jsonpath={.metadata.ownerReferences}"]).trim().is_empty()
    });
    let yaml: String =
        yaml.lines().filter(|l| !l.contains("uid:") && !l.contains("resourceVersion:")).collect::<Vec<_>>().join("\n");
    apply(&s, &yaml);
    let uid = get(&s, &["get", "sts", "web", "-o", "jsonpath={.metadata.uid}"]);
    eventually("web-0 adopted", || {
        get(&s, &["get", "pod", "web-0", "-o", "jsonpath={.metadata.ownerReferences[0].uid}"]) == uid
    });
}

fn node_yaml(name: &str, labels: &str, taints: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}, labels: {{{labels}}}}}\nspec: {{taints: [{taints}]}}\n"
    )
}

/// The node each pod of `selector` is pinned to, sorted.
fn pinned_nodes(s: &common::ApiServer, selector: &str) -> Vec<String> {
    let out = get(
        s,
        &[
            "get",
            "pods",
            "-l",
            selector,
            "-o",
            "jsonpath={range .items[*]}{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values[0]}{\"\\n\"}{end}",
        ],
    );
    let mut nodes: Vec<String> = out.lines().map(str::to_string).filter(|l| !l.is_empty()).collect();
    nodes.sort();
    nodes
}

#[test]
fn daemonset_runs_one_pod_per_fitting_node() {
    let s = common::ApiServer::start();
    apply(&s, &node_yaml("n1", "disk: ssd", ""));
    apply(&s, &node_yaml("n2", "disk: ssd", "{key: node.kubernetes.io/not-ready, effect: NoExecute}"));
    apply(&s, &node_yaml("n3", "disk: ssd", "{key: dedicated, value: db, effect: NoSchedule}"));
    apply(&s, &node_yaml("n4", "disk: hdd", ""));
    apply(
        &s,
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      nodeSelector: {disk: ssd}
      containers: [{name: c, image: busybox}]
"#,
    );
    // n1 fits; n2's not-ready taint is tolerated by default; n3's taint is
    // not tolerated; n4 has the wrong label.
    eventually("pods on n1 and n2", || pinned_nodes(&s, "app=agent") == ["n1", "n2"]);
    let tolerations =
        get(&s, &["get", "pods", "-l", "app=agent", "-o", "jsonpath={.items[0].spec.tolerations[*].key}"]);
    assert!(tolerations.contains("node.kubernetes.io/unreachable"), "{tolerations}");
    let pod_hash = get(
        &s,
        &["get", "pods", "-l", "app=agent", "-o", "jsonpath={.items[0].metadata.labels.controller-revision-hash}"],
    );
    assert!(!pod_hash.is_empty());
    // Its ControllerRevision carries the template's labels and the same
    // hash under the same key, as upstream's (clients find the current
    // revision by it).
    let revision = get(
        &s,
        &[
            "get",
            "controllerrevisions",
            "-l",
            "app=agent",
            "-o",
            "jsonpath={.items[*].metadata.labels.controller-revision-hash}",
        ],
    );
    assert_eq!(revision, pod_hash);
    eventually("desiredNumberScheduled 2", || {
        get(
            &s,
            &["get", "ds", "agent", "-o", "jsonpath={.status.desiredNumberScheduled}/{.status.currentNumberScheduled}"],
        ) == "2/2"
    });
    // A toleration admits n3 too.
    let (ok, out) = kubectl(
        &s,
        &[
            "patch",
            "ds",
            "agent",
            "--type=merge",
            "-p",
            r#"{"spec":{"template":{"spec":{"tolerations":[{"key":"dedicated","operator":"Equal","value":"db","effect":"NoSchedule"}]}}}}"#,
        ],
    );
    assert!(ok, "{out}");
    // Rolling update: the old pods are replaced (one unavailable at a time);
    // pods that never became ready are replaced at once.
    eventually("updated pods on n1, n2 and n3", || {
        pinned_nodes(&s, "app=agent") == ["n1", "n2", "n3"]
            && get(&s, &["get", "ds", "agent", "-o", "jsonpath={.status.updatedNumberScheduled}"]) == "3"
    });
    for pod in pods(&s, "app=agent") {
        set_phase(&s, &pod, "Running");
    }
    let (ok, out) = kubectl(&s, &["rollout", "status", "ds/agent", "--timeout=15s"]);
    assert!(ok, "{out}");
    // A new fitting node gets a pod; a deleted node loses it.
    apply(&s, &node_yaml("n5", "disk: ssd", ""));
    eventually("a pod on n5", || pinned_nodes(&s, "app=agent").contains(&"n5".to_string()));
    get(&s, &["delete", "node", "n1"]);
    eventually("no pod on n1", || pinned_nodes(&s, "app=agent") == ["n2", "n3", "n5"]);
}

fn job_yaml(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: {name}}}\nspec:\n{extra}  template:\n    spec:\n      restartPolicy: Never\n      containers: [{{name: c, image: busybox}}]\n"
    )
}

/// The job's pods that are not finished.
fn running_pods(s: &common::ApiServer, job: &str) -> Vec<String> {
    let out = get(
        s,
        &[
            "get",
            "pods",
            "-l",
            &format!("batch.kubernetes.io/job-name={job}"),
            "-o",
            "jsonpath={range .items[?(@.status.phase=='Pending')]}{.metadata.name}{\"\\n\"}{end}",
        ],
    );
    out.lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
}

#[test]
fn jobs_complete_fail_and_index() {
    let s = common::ApiServer::start();
    // Four completions, two at a time.
    apply(&s, &job_yaml("work", "  completions: 4\n  parallelism: 2\n"));
    let selector = get(&s, &["get", "job", "work", "-o", "jsonpath={.spec.selector.matchLabels}"]);
    assert!(selector.contains("batch.kubernetes.io/controller-uid"), "{selector}");
    let mut done = 0;
    while done < 4 {
        let mut running = Vec::new();
        eventually("two running pods", || {
            running = running_pods(&s, "work");
            running.len() == 2.min(4 - done)
        });
        set_phase(&s, &running[0], "Succeeded");
        done += 1;
        let want = format!("{done}");
        eventually("succeeded count", || {
            get(&s, &["get", "job", "work", "-o", "jsonpath={.status.succeeded}"]) == want
        });
    }
    let (ok, out) = kubectl(&s, &["wait", "--for=condition=complete", "job/work", "--timeout=15s"]);
    assert!(ok, "{out}");
    let conds = get(&s, &["get", "job", "work", "-o", "jsonpath={.status.conditions[*].type}"]);
    assert_eq!(conds, "SuccessCriteriaMet Complete");
    assert!(!get(&s, &["get", "job", "work", "-o", "jsonpath={.status.completionTime}"]).is_empty());
    let events = get(
        &s,
        &["get", "events", "--field-selector", "involvedObject.name=work", "-o", "jsonpath={.items[*].reason}"],
    );
    assert!(events.contains("SuccessfulCreate") && events.contains("Completed"), "{events}");

    // backoffLimit 1: the second failure fails the Job.
    apply(&s, &job_yaml("flaky", "  backoffLimit: 1\n"));
    for _ in 0..2 {
        let mut running = Vec::new();
        eventually("a flaky pod", || {
            running = running_pods(&s, "flaky");
            running.len() == 1
        });
        set_phase(&s, &running[0], "Failed");
    }
    let (ok, out) = kubectl(&s, &["wait", "--for=condition=failed", "job/flaky", "--timeout=15s"]);
    assert!(ok, "{out}");
    let reason = get(&s, &["get", "job", "flaky", "-o", "jsonpath={.status.conditions[?(@.type=='Failed')].reason}"]);
    assert_eq!(reason, "BackoffLimitExceeded");
    assert_eq!(get(&s, &["get", "job", "flaky", "-o", "jsonpath={.status.failed}"]), "2");

    // activeDeadlineSeconds: the Job fails and its pod is deleted.
    apply(&s, &job_yaml("slow", "  activeDeadlineSeconds: 1\n"));
    let (ok, out) = kubectl(&s, &["wait", "--for=condition=failed", "job/slow", "--timeout=15s"]);
    assert!(ok, "{out}");
    let reason = get(&s, &["get", "job", "slow", "-o", "jsonpath={.status.conditions[?(@.type=='Failed')].reason}"]);
    assert_eq!(reason, "DeadlineExceeded");
    eventually("the slow job's pod to go", || running_pods(&s, "slow").is_empty());

    // suspend: no pods until resumed.
    apply(&s, &job_yaml("later", "  suspend: true\n"));
    eventually("the Suspended condition", || {
        get(&s, &["get", "job", "later", "-o", "jsonpath={.status.conditions[?(@.type=='Suspended')].status}"])
            == "True"
    });
    assert!(running_pods(&s, "later").is_empty());
    get(&s, &["patch", "job", "later", "--type=merge", "-p", r#"{"spec":{"suspend":false}}"#]);
    eventually("a pod once resumed", || running_pods(&s, "later").len() == 1);

    // Indexed: one pod per index with its index in annotation, label and env.
    apply(&s, &job_yaml("indexed", "  completions: 3\n  parallelism: 3\n  completionMode: Indexed\n"));
    let mut running = Vec::new();
    eventually("three indexed pods", || {
        running = running_pods(&s, "indexed");
        running.len() == 3
    });
    let indexes = get(
        &s,
        &[
            "get",
            "pods",
            "-l",
            "batch.kubernetes.io/job-name=indexed",
            "-o",
            "jsonpath={.items[*].metadata.annotations.batch\\.kubernetes\\.io/job-completion-index}",
        ],
    );
    let mut indexes: Vec<&str> = indexes.split_whitespace().collect();
    indexes.sort();
    assert_eq!(indexes, ["0", "1", "2"]);
    let env = get(&s, &["get", "pod", &running[0], "-o", "jsonpath={.spec.containers[0].env[*].name}"]);
    assert!(env.contains("JOB_COMPLETION_INDEX"), "{env}");
    let pod1 = get(
        &s,
        &[
            "get",
            "pods",
            "-l",
            "batch.kubernetes.io/job-completion-index=1",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ],
    );
    set_phase(&s, &pod1, "Succeeded");
    eventually("completedIndexes 1", || {
        get(&s, &["get", "job", "indexed", "-o", "jsonpath={.status.completedIndexes}"]) == "1"
    });
    for pod in running_pods(&s, "indexed") {
        set_phase(&s, &pod, "Succeeded");
    }
    let (ok, out) = kubectl(&s, &["wait", "--for=condition=complete", "job/indexed", "--timeout=15s"]);
    assert!(ok, "{out}");
    assert_eq!(get(&s, &["get", "job", "indexed", "-o", "jsonpath={.status.completedIndexes}"]), "0-2");
}

/// The uid of the controller of pod `name`, empty when it has none.
fn controller_uid(s: &common::ApiServer, pod: &str) -> String {
    get(s, &["get", "pod", pod, "-o", "jsonpath={.metadata.ownerReferences[?(@.controller==true)].uid}"])
}

/// A Job adopts a matching pod that lost its controller, and lets go of a
/// pod whose labels stop matching (upstream's ClaimPods).
#[test]
fn job_adopts_matching_orphans_and_releases_pods_that_stop_matching() {
    let s = common::ApiServer::start();
    apply(&s, &job_yaml("adopt-release", "  completions: 2\n  parallelism: 2\n"));
    let uid = get(&s, &["get", "job", "adopt-release", "-o", "jsonpath={.metadata.uid}"]);
    let mut pods = Vec::new();
    eventually("two pods", || {
        pods = running_pods(&s, "adopt-release");
        pods.len() == 2
    });
    let pod = pods[0].clone();
    assert_eq!(controller_uid(&s, &pod), uid);
    let remove = |path: &str| {
        let patch = format!(r#"[{{"op":"remove","path":"{path}"}}]"#);
        get(&s, &["patch", "pod", &pod, "--type=json", "-p", &patch]);
    };
    remove("/metadata/ownerReferences");
    eventually("the orphan adopted again", || controller_uid(&s, &pod) == uid);
    let owner = get(
        &s,
        &[
            "get",
            "pod",
            &pod,
            "-o",
            "jsonpath={.metadata.ownerReferences[0].kind} {.metadata.ownerReferences[0].blockOwnerDeletion}",
        ],
    );
    assert_eq!(owner, "Job true");
    remove("/metadata/labels");
    eventually("the pod released", || {
        get(&s, &["get", "pod", &pod, "-o", "jsonpath={.metadata.ownerReferences}"]).is_empty()
    });
    eventually("a pod in its place", || {
        let now = running_pods(&s, "adopt-release");
        now.len() == 2 && !now.contains(&pod)
    });
}

#[test]
fn cronjob_jobs_and_ttl_after_finished() {
    let s = common::ApiServer::start();
    // A schedule that will not fire during the test; the job is made by hand.
    apply(
        &s,
        r#"
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 0 29 2 *"
  jobTemplate:
    metadata: {labels: {team: ops}}
    spec:
      ttlSecondsAfterFinished: 3
      template:
        spec:
          restartPolicy: OnFailure
          containers: [{name: c, image: busybox}]
"#,
    );
    let (ok, out) = kubectl(&s, &["create", "job", "manual", "--from=cronjob/nightly"]);
    assert!(ok, "{out}");
    let owner = get(
        &s,
        &[
            "get",
            "job",
            "manual",
            "-o",
            "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
        ],
    );
    assert_eq!(owner, "CronJob/nightly");
    let mut running = Vec::new();
    eventually("the manual job's pod", || {
        running = running_pods(&s, "manual");
        running.len() == 1
    });
    set_phase(&s, &running[0], "Succeeded");
    let (ok, out) = kubectl(&s, &["wait", "--for=condition=complete", "job/manual", "--timeout=15s"]);
    assert!(ok, "{out}");
    // ttlSecondsAfterFinished: 3 deletes the Job, and the garbage collector its pod.
    eventually("the finished job to be deleted", || kubectl(&s, &["get", "job", "manual"]).1.contains("NotFound"));
    eventually("its pod to be deleted", || pods(&s, "batch.kubernetes.io/job-name=manual").is_empty());
    // Nothing was scheduled, and the CronJob did not adopt the manual job.
    let status = get(&s, &["get", "cronjob", "nightly", "-o", "jsonpath={.status.lastScheduleTime}{.status.active}"]);
    assert_eq!(status, "");
}

/// A surge rollout with minReadySeconds: the node's old pod goes once the
/// new one has been ready that long, although nothing changes at that
/// moment (the controller must have asked to look again).
#[test]
fn daemonset_surge_removes_the_old_pod_once_the_new_one_is_available() {
    let s = common::ApiServer::start();
    apply(&s, &node_yaml("n1", "", ""));
    apply(
        &s,
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  minReadySeconds: 2
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      containers: [{name: c, image: "agent:1"}]
"#,
    );
    // Ready since now, as a kubelet reports it.
    let ready = |pod: &str| {
        let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let patch = format!(
            r#"{{"status":{{"phase":"Running","conditions":[{{"type":"Ready","status":"True","lastTransitionTime":"{now}"}}]}}}}"#
        );
        get(&s, &["patch", "pod", pod, "--subresource=status", "--type=merge", "-p", &patch]);
    };
    eventually("the daemon pod", || pods(&s, "app=agent").len() == 1);
    let old = pods(&s, "app=agent")[0].clone();
    ready(&old);
    eventually("available", || get(&s, &["get", "ds", "agent", "-o", "jsonpath={.status.numberAvailable}"]) == "1");
    get(&s, &["set", "image", "ds/agent", "c=agent:2"]);
    eventually("a surge pod beside the old one", || pods(&s, "app=agent").len() == 2);
    let new = pods(&s, "app=agent").into_iter().find(|p| *p != old).expect("the new pod");
    ready(&new);
    // Well inside the 40 s after which the node, which sends no heartbeat,
    // would change and wake the controller anyway.
    common::eventually_within("the old pod deleted", Duration::from_secs(12), || {
        let gone = get(&s, &["get", "pod", &old, "--ignore-not-found", "-o", "jsonpath={.metadata.deletionTimestamp}"]);
        !gone.is_empty() || !pods(&s, "app=agent").contains(&old)
    });
}

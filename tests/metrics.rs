//! `/metrics` in the Prometheus text format with upstream's names and
//! labels, readable by `system:monitoring` only; `kubectl get cs`.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use common::{create, eventually, kubectl, ApiServer};

fn curl(s: &ApiServer, path: &str, extra: &[&str]) -> (u16, String, String) {
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "10", "-w", "\n%{http_code}\n%{content_type}"])
        .args(extra)
        .arg(format!("https://127.0.0.1:{}{path}", s.port))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (rest, content_type) = text.rsplit_once('\n').unwrap_or(("", ""));
    let (body, code) = rest.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string(), content_type.to_string())
}

fn tls(s: &ApiServer) -> std::path::PathBuf {
    s.dir.path().join("server").join("tls")
}

/// GET with the certificate `<name>.crt`/`<name>.key` in the server's TLS dir.
fn get_as(s: &ApiServer, name: &str, path: &str) -> (u16, String, String) {
    let (cert, key) = (tls(s).join(format!("{name}.crt")), tls(s).join(format!("{name}.key")));
    curl(s, path, &["--cert", &cert.to_string_lossy(), "--key", &key.to_string_lossy()])
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("openssl is installed");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A client certificate from the cluster's client CA for `subject`.
fn mint(s: &ApiServer, name: &str, subject: &str) {
    let dir = tls(s);
    let (key, csr, crt) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"));
    #[rustfmt::skip]
    openssl(&dir, &["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject]);
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").expect("ext");
    #[rustfmt::skip]
    openssl(&dir, &["x509", "-req", "-in", &csr, "-CA", "client-ca.crt", "-CAkey", "client-ca.key", "-CAcreateserial", "-out", &crt, "-days", "2", "-extfile", "client.ext"]);
}

/// The samples of a scrape: series (name with labels) → value.
fn samples(body: &str) -> HashMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(series, v)| (series.to_string(), v.parse::<f64>().expect("a number")))
        .collect()
}

fn scrape(s: &ApiServer) -> (String, HashMap<String, f64>) {
    let (code, body, content_type) = get_as(s, "client-admin", "/metrics");
    assert_eq!(code, 200, "{body}");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let parsed = samples(&body);
    (body, parsed)
}

fn request_series(verb: &str, group: &str, version: &str, resource: &str, scope: &str, code: u16) -> String {
    format!("apiserver_request_total{{verb=\"{verb}\",dry_run=\"\",group=\"{group}\",version=\"{version}\",resource=\"{resource}\",subresource=\"\",scope=\"{scope}\",component=\"apiserver\",code=\"{code}\"}}")
}

/// Every histogram in the scrape: buckets cumulative, `+Inf` equal to
/// `_count`, and a `_sum` beside it.
fn assert_histograms_well_formed(body: &str, samples: &HashMap<String, f64>) {
    let mut checked = 0;
    let mut groups: HashMap<String, Vec<(f64, f64)>> = HashMap::new();
    for line in body.lines().filter(|l| l.contains("_bucket{")) {
        let (series, value) = line.rsplit_once(' ').expect("sample");
        let (name, labels) = series.split_once('{').expect("labels");
        let (rest, le) = labels.trim_end_matches('}').rsplit_once("le=\"").expect("le label");
        let le = le.trim_end_matches('"');
        let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().expect("bound") };
        let key = format!("{}{{{}}}", name.trim_end_matches("_bucket"), rest.trim_end_matches(','));
        groups.entry(key).or_default().push((bound, value.parse().expect("count")));
    }
    for (series, buckets) in &groups {
        assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{series}: {buckets:?}");
        let (last_bound, total) = *buckets.last().expect("buckets");
        assert!(last_bound.is_infinite(), "{series}");
        let (name, labels) = series.split_once('{').expect("labels");
        assert_eq!(samples.get(&format!("{name}_count{{{labels}")), Some(&total), "{series}");
        assert!(samples.contains_key(&format!("{name}_sum{{{labels}")), "{series}");
        checked += 1;
    }
    assert!(checked > 0, "no histograms");
}

#[test]
fn metrics_count_requests_and_are_for_monitoring_only() {
    let s = ApiServer::start();
    // The root CA publisher creates a ConfigMap in each namespace at start;
    // let it finish before counting creates.
    eventually("kube-root-ca.crt in the four namespaces", || {
        let (_, out) =
            kubectl(&s, &["get", "cm", "-A", "--field-selector=metadata.name=kube-root-ca.crt", "-o", "name"]);
        out.lines().count() == 4
    });
    let (_, before) = scrape(&s);
    let created = request_series("POST", "", "v1", "configmaps", "resource", 201);
    let missing = request_series("GET", "", "v1", "configmaps", "resource", 404);
    create(&s, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: counted\n  namespace: default\n");
    let (ok, out) = kubectl(&s, &["get", "configmap", "nothing-here"]);
    assert!(!ok, "{out}");
    // A Job moves the job controller's work queue.
    create(&s, "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: queued\n  namespace: default\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: c\n        image: busybox\n");

    let (body, after) = scrape(&s);
    let moved = |series: &str| after.get(series).copied().unwrap_or(0.0) - before.get(series).copied().unwrap_or(0.0);
    assert_eq!(moved(&created), 1.0, "{created}\n{body}");
    assert_eq!(moved(&missing), 1.0, "{missing}\n{body}");
    let duration = "apiserver_request_duration_seconds_count{verb=\"POST\",dry_run=\"\",group=\"\",version=\"v1\",resource=\"configmaps\",subresource=\"\",scope=\"resource\",component=\"apiserver\"}";
    assert!(after.get(duration).copied().unwrap_or(0.0) >= 1.0, "{body}");
    assert!(after.keys().any(|k| k.starts_with("apiserver_request_total{verb=\"LIST\"")), "{body}");
    let etcd = "etcd_request_duration_seconds_count{operation=\"create\",type=\"configmaps\"}";
    assert!(after.get(etcd).copied().unwrap_or(0.0) >= 1.0, "{body}");
    assert!(after.get("apiserver_storage_objects{resource=\"configmaps\"}").copied().unwrap_or(0.0) >= 1.0, "{body}");
    assert!(after.get("apiserver_storage_objects{resource=\"jobs.batch\"}").copied() == Some(1.0), "{body}");
    assert_histograms_well_formed(&body, &after);

    eventually("the job controller's work queue to count the Job", || {
        let (_, now) = scrape(&s);
        now.get("workqueue_adds_total{name=\"job\"}").copied().unwrap_or(0.0) >= 1.0
            && now.get("workqueue_work_duration_seconds_count{name=\"job\"}").copied().unwrap_or(0.0) >= 1.0
    });
    let (body, now) = scrape(&s);
    for family in ["workqueue_depth", "workqueue_retries_total", "workqueue_queue_duration_seconds_count"] {
        assert!(now.contains_key(&format!("{family}{{name=\"job\"}}")), "{family}\n{body}");
    }
    // The controllers on kube-runtime's own queue report under upstream's
    // queue names too: a Deployment moves the deployment and replicaset
    // queues (and the garbage collector looks at its owned objects); the
    // namespaces at start moved the others.
    assert!(kubectl(&s, &["create", "deployment", "queued", "--image=busybox"]).0);
    let names = [
        "deployment",
        "replicaset",
        "namespace",
        "serviceaccount",
        "root_ca_cert_publisher",
        "garbage_collector_attempt_to_delete",
    ];
    eventually("the kube-runtime controllers' work queues", || {
        let (_, now) = scrape(&s);
        names.iter().all(|n| {
            now.get(&format!("workqueue_adds_total{{name=\"{n}\"}}")).copied().unwrap_or(0.0) >= 1.0
                && now.get(&format!("workqueue_work_duration_seconds_count{{name=\"{n}\"}}")).copied().unwrap_or(0.0)
                    >= 1.0
        })
    });
    let (body, now) = scrape(&s);
    for n in names {
        for family in ["workqueue_depth", "workqueue_retries_total"] {
            assert!(now.contains_key(&format!("{family}{{name=\"{n}\"}}")), "{family} {n}\n{body}");
        }
    }

    // Anonymous and unprivileged users are refused; system:monitoring reads.
    let (code, body, _) = curl(&s, "/metrics", &[]);
    assert_eq!(code, 403, "{body}");
    mint(&s, "bob", "/CN=bob");
    let (code, body, _) = get_as(&s, "bob", "/metrics");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("cannot get path \\\"/metrics\\\""), "{body}");
    mint(&s, "prometheus", "/CN=prometheus/O=system:monitoring");
    let (code, body, _) = get_as(&s, "prometheus", "/metrics");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("# TYPE apiserver_request_total counter\n"), "{body}");
}

#[test]
fn kubectl_get_componentstatuses_lists_healthy_components() {
    let s = ApiServer::start();
    let mut out = String::new();
    eventually("the leader leases to be held", || {
        let (ok, o) = kubectl(&s, &["get", "cs"]);
        out = o;
        ok && out.lines().filter(|l| l.contains("Healthy") && !l.contains("Unhealthy")).count() == 3
    });
    for name in ["scheduler", "controller-manager", "etcd-0"] {
        assert!(out.lines().any(|l| l.starts_with(&format!("{name} ")) && l.contains("Healthy")), "{name}\n{out}");
    }
    let (ok, out) = kubectl(
        &s,
        &["get", "componentstatus", "etcd-0", "-o", "jsonpath={.conditions[0].type}={.conditions[0].status}"],
    );
    assert!(ok, "{out}");
    assert!(out.starts_with("Healthy=True"), "{out}");
}

//! `/metrics`: the API server's own metrics in the Prometheus text format,
//! under upstream's names and labels, with the controllers' work queue
//! metrics beside them (one process, as kube-controller-manager's would be
//! scraped separately upstream):
//! - `apiserver_request_total{verb,dry_run,group,version,resource,subresource,scope,component,code}`
//! - `apiserver_request_duration_seconds{verb,dry_run,group,version,resource,subresource,scope,component}`
//!   (not for long-running WATCH and CONNECT requests)
//! - `etcd_request_duration_seconds{operation,type}` for every store call
//! - `apiserver_storage_objects{resource}`, counted in the store when scraped
//!
//! The label set of a request is bounded: group, version and resource are
//! only taken from resources the registry serves, the subresource from a
//! fixed list; anything else is recorded with empty labels.
//! Reading `/metrics` needs `get` on that non-resource URL (upstream's
//! `system:monitoring` role).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::request::ResourcePath;
use super::Api;
use crate::metrics::{self, Histogram};
use crate::sync::{LockExt, RwLockExt};

/// The `component` label of everything this API server records.
const COMPONENT: &str = "apiserver";

/// Subresources reported by name; others are reported as "".
const SUBRESOURCES: &[&str] = &[
    "status",
    "scale",
    "binding",
    "eviction",
    "token",
    "approval",
    "finalize",
    "ephemeralcontainers",
    "resize",
    "log",
    "exec",
    "attach",
    "portforward",
    "proxy",
];

/// The labels of one request (without its code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestLabels<'a> {
    pub verb: &'static str,
    pub dry_run: bool,
    pub group: &'a str,
    pub version: &'a str,
    pub resource: &'a str,
    pub subresource: &'static str,
    pub scope: &'static str,
}

impl<'a> RequestLabels<'a> {
    /// Upstream's reported verb and scope for a resource request: `LIST`
    /// and `WATCH` for reads of collections, `APPLY` for server-side apply.
    pub fn of(
        path: &'a ResourcePath,
        method: &Method,
        query: Option<&str>,
        content_type: &str,
        served: bool,
    ) -> RequestLabels<'a> {
        let params = query.unwrap_or_default();
        let has = |k: &str, v: &str| params.split('&').any(|p| p.split_once('=') == Some((k, v)));
        let watching = path.watch_prefix || has("watch", "true") || has("watch", "1");
        let verb = match *method {
            Method::GET if watching => "WATCH",
            Method::GET if path.name.is_none() => "LIST",
            Method::GET => "GET",
            Method::POST => "POST",
            Method::PUT => "PUT",
            Method::PATCH if content_type.starts_with("application/apply-patch") => "APPLY",
            Method::PATCH => "PATCH",
            Method::DELETE => "DELETE",
            Method::HEAD => "HEAD",
            Method::OPTIONS => "OPTIONS",
            _ => "CONNECT",
        };
        let subresource = path
            .subresource
            .as_deref()
            .and_then(|s| SUBRESOURCES.iter().find(|k| **k == s))
            .copied()
            .unwrap_or_default();
        let verb = if matches!(subresource, "log" | "exec" | "attach" | "portforward" | "proxy") && verb != "GET" {
            "CONNECT"
        } else {
            verb
        };
        let scope = if path.name.is_some() || verb == "POST" {
            "resource"
        } else if path.namespace.is_some() {
            "namespace"
        } else {
            "cluster"
        };
        let (group, version, resource) =
            if served { (path.group.as_str(), path.version.as_str(), path.plural.as_str()) } else { ("", "", "") };
        RequestLabels { verb, dry_run: has("dryRun", "All"), group, version, resource, subresource, scope }
    }

    fn long_running(&self) -> bool {
        matches!(self.verb, "WATCH" | "CONNECT")
    }

    fn key(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

/// One request series: its labels, a count per code, and its latencies.
struct RequestSeries {
    owned: (&'static str, bool, String, String, String, &'static str, &'static str),
    labels: String,
    codes: Mutex<Vec<(u16, u64)>>,
    duration: Histogram,
}

impl RequestSeries {
    fn matches(&self, l: &RequestLabels<'_>) -> bool {
        let o = &self.owned;
        o.0 == l.verb
            && o.1 == l.dry_run
            && o.2 == l.group
            && o.3 == l.version
            && o.4 == l.resource
            && o.5 == l.subresource
            && o.6 == l.scope
    }
}

/// The API server's metrics.
#[derive(Default)]
pub struct ApiMetrics {
    requests: RwLock<HashMap<u64, Vec<Arc<RequestSeries>>>>,
    /// Per store-call type (`pods`, `deployments.apps`), one histogram per operation.
    etcd: RwLock<HashMap<String, Arc<EtcdSeries>>>,
}

/// The store operations timed, by upstream's names.
#[derive(Debug, Clone, Copy)]
pub enum Operation {
    Get,
    List,
    Create,
    Update,
    Delete,
    Watch,
}

impl Operation {
    const ALL: [Operation; 6] =
        [Operation::Get, Operation::List, Operation::Create, Operation::Update, Operation::Delete, Operation::Watch];

    fn name(self) -> &'static str {
        match self {
            Operation::Get => "get",
            Operation::List => "list",
            Operation::Create => "create",
            Operation::Update => "update",
            Operation::Delete => "delete",
            Operation::Watch => "watch",
        }
    }
}

struct EtcdSeries([Histogram; 6]);

/// The process's API server metrics (one API server per process, as
/// upstream's legacy registry).
pub fn global() -> &'static ApiMetrics {
    static METRICS: OnceLock<ApiMetrics> = OnceLock::new();
    METRICS.get_or_init(ApiMetrics::default)
}

/// Groups whose names have no dot, so that a key's second segment can be
/// told from a core resource's plural.
const DOTLESS_GROUPS: &[&str] = &["apps", "batch", "policy", "autoscaling"];

/// The `type` label of a store key: `pods` for `/registry/pods/…`,
/// `deployments.apps` for `/registry/apps/deployments/…`.
pub fn storage_type(key: &str) -> &str {
    let rest = key.strip_prefix("/registry/").unwrap_or(key);
    let mut segs = rest.splitn(3, '/');
    let first = segs.next().unwrap_or_default();
    if first.contains('.') || DOTLESS_GROUPS.contains(&first) {
        if let Some(second) = segs.next() {
            // "deployments.apps" spans two segments of the key; the label is
            // written from both when rendered, see `etcd_type_label`.
            let end = first.len() + 1 + second.len();
            return &rest[..end];
        }
    }
    first
}

/// `apps/deployments` → `deployments.apps`.
fn etcd_type_label(t: &str) -> String {
    match t.split_once('/') {
        Some((group, plural)) => format!("{plural}.{group}"),
        None => t.to_string(),
    }
}

impl ApiMetrics {
    /// Records one served request.
    pub fn observe_request(&self, labels: &RequestLabels<'_>, code: u16, elapsed: Duration) {
        let key = labels.key();
        let found = {
            let map = self.requests.read_locked();
            map.get(&key).and_then(|v| v.iter().find(|s| s.matches(labels)).cloned())
        };
        let series = match found {
            Some(s) => s,
            None => {
                let mut map = self.requests.write_locked();
                let slot = map.entry(key).or_default();
                match slot.iter().find(|s| s.matches(labels)) {
                    Some(s) => s.clone(),
                    None => {
                        let s = Arc::new(new_series(labels));
                        slot.push(s.clone());
                        s
                    }
                }
            }
        };
        {
            let mut codes = series.codes.locked();
            match codes.iter_mut().find(|(c, _)| *c == code) {
                Some((_, n)) => *n += 1,
                None => codes.push((code, 1)),
            }
        }
        if !labels.long_running() {
            series.duration.observe(elapsed);
        }
    }

    /// Records one store call on `key` (or a prefix).
    pub fn observe_storage(&self, op: Operation, key: &str, elapsed: Duration) {
        let t = storage_type(key);
        let found = self.etcd.read_locked().get(t).cloned();
        let series = match found {
            Some(s) => s,
            None => self
                .etcd
                .write_locked()
                .entry(t.to_string())
                .or_insert_with(|| {
                    Arc::new(EtcdSeries(Operation::ALL.map(|_| Histogram::new(metrics::APISERVER_BUCKETS))))
                })
                .clone(),
        };
        series.0[op as usize].observe(elapsed);
    }

    /// The count of `apiserver_request_total` for these labels and code.
    pub fn request_count(&self, labels: &RequestLabels<'_>, code: u16) -> u64 {
        let map = self.requests.read_locked();
        map.get(&labels.key())
            .and_then(|v| v.iter().find(|s| s.matches(labels)).cloned())
            .and_then(|s| s.codes.locked().iter().find(|(c, _)| *c == code).map(|p| p.1))
            .unwrap_or(0)
    }

    fn write_requests(&self, out: &mut String) {
        let mut all: Vec<Arc<RequestSeries>> = self.requests.read_locked().values().flatten().cloned().collect();
        all.sort_by(|a, b| a.labels.cmp(&b.labels));
        metrics::write_header(
            out,
            "apiserver_request_total",
            "Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.",
            "counter",
        );
        for s in &all {
            let codes = s.codes.locked().clone();
            for (code, n) in codes {
                out.push_str(&format!("apiserver_request_total{{{},code=\"{code}\"}} {n}\n", s.labels));
            }
        }
        metrics::write_header(
            out,
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.",
            "histogram",
        );
        for s in all.iter().filter(|s| s.duration.count() > 0) {
            s.duration.write(out, "apiserver_request_duration_seconds", &s.labels);
        }
    }

    fn write_storage(&self, out: &mut String) {
        let mut all: Vec<(String, Arc<EtcdSeries>)> =
            self.etcd.read_locked().iter().map(|(k, v)| (etcd_type_label(k), v.clone())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        metrics::write_header(
            out,
            "etcd_request_duration_seconds",
            "Etcd request latency in seconds for each operation and object type.",
            "histogram",
        );
        for (t, s) in &all {
            for op in Operation::ALL {
                let h = &s.0[op as usize];
                if h.count() > 0 {
                    h.write(
                        out,
                        "etcd_request_duration_seconds",
                        &metrics::labels(&[("operation", op.name()), ("type", t)]),
                    );
                }
            }
        }
    }
}

fn new_series(l: &RequestLabels<'_>) -> RequestSeries {
    let labels = metrics::labels(&[
        ("verb", l.verb),
        ("dry_run", if l.dry_run { "All" } else { "" }),
        ("group", l.group),
        ("version", l.version),
        ("resource", l.resource),
        ("subresource", l.subresource),
        ("scope", l.scope),
        ("component", COMPONENT),
    ]);
    RequestSeries {
        owned: (
            l.verb,
            l.dry_run,
            l.group.to_string(),
            l.version.to_string(),
            l.resource.to_string(),
            l.subresource,
            l.scope,
        ),
        labels,
        codes: Mutex::new(Vec::new()),
        duration: Histogram::new(metrics::APISERVER_BUCKETS),
    }
}

/// `apiserver_storage_objects{resource}`: each stored resource's count, read now.
async fn write_storage_objects(api: &Api, out: &mut String) {
    metrics::write_header(
        out,
        "apiserver_storage_objects",
        "Number of stored objects at the time of last check split by kind.",
        "gauge",
    );
    let mut seen = std::collections::HashSet::new();
    for r in api.registry.all() {
        if r.ephemeral || !seen.insert(r.key_prefix()) {
            continue;
        }
        let count = match api.storage.count(&r.key_prefix()).await {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(resource = %r.plural, error = %e, "counting stored objects failed");
                continue;
            }
        };
        let name = if r.group.is_empty() { r.plural.clone() } else { format!("{}.{}", r.plural, r.group) };
        out.push_str(&format!("apiserver_storage_objects{{{}}} {count}\n", metrics::labels(&[("resource", &name)])));
    }
}

/// Serves `GET /metrics` to a caller already allowed to read it.
pub async fn serve(api: &Api) -> Response {
    let mut out = String::with_capacity(64 * 1024);
    let m = global();
    m.write_requests(&mut out);
    m.write_storage(&mut out);
    write_storage_objects(api, &mut out).await;
    crate::metrics::workqueue::write_all(&mut out);
    crate::metrics::scheduler::write_all(&mut out);
    (StatusCode::OK, [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], out).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::request::{parse, Target};

    fn path(p: &str) -> ResourcePath {
        match parse(p) {
            Target::Resource(r) => r,
            other => panic!("{p}: {other:?}"),
        }
    }

    #[test]
    fn verbs_and_scopes_as_upstream_reports_them() {
        let p = path("/api/v1/namespaces/default/pods");
        let l = RequestLabels::of(&p, &Method::GET, None, "", true);
        assert_eq!((l.verb, l.scope, l.resource), ("LIST", "namespace", "pods"));
        let l = RequestLabels::of(&p, &Method::GET, Some("watch=true"), "", true);
        assert_eq!(l.verb, "WATCH");
        let l = RequestLabels::of(&p, &Method::POST, Some("dryRun=All"), "", true);
        assert_eq!((l.verb, l.scope, l.dry_run), ("POST", "resource", true));
        let p = path("/apis/apps/v1/namespaces/x/deployments/web/scale");
        let l = RequestLabels::of(&p, &Method::PATCH, None, "application/apply-patch+yaml", true);
        assert_eq!((l.verb, l.group, l.subresource, l.scope), ("APPLY", "apps", "scale", "resource"));
        let p = path("/api/v1/nodes");
        assert_eq!(RequestLabels::of(&p, &Method::GET, None, "", true).scope, "cluster");
        let p = path("/apis/made.up/v9/things/x/whatever");
        let l = RequestLabels::of(&p, &Method::GET, None, "", false);
        assert_eq!((l.group, l.version, l.resource, l.subresource), ("", "", "", ""));
    }

    #[test]
    fn requests_are_counted_per_code_and_timed() {
        let m = ApiMetrics::default();
        let p = path("/api/v1/namespaces/default/pods/a");
        let l = RequestLabels::of(&p, &Method::GET, None, "", true);
        m.observe_request(&l, 200, Duration::from_millis(3));
        m.observe_request(&l, 200, Duration::from_millis(30));
        m.observe_request(&l, 404, Duration::from_millis(1));
        assert_eq!((m.request_count(&l, 200), m.request_count(&l, 404)), (2, 1));
        let mut out = String::new();
        m.write_requests(&mut out);
        assert!(out.contains("apiserver_request_total{verb=\"GET\",dry_run=\"\",group=\"\",version=\"v1\",resource=\"pods\",subresource=\"\",scope=\"resource\",component=\"apiserver\",code=\"404\"} 1\n"), "{out}");
        assert!(out.contains("apiserver_request_duration_seconds_count{verb=\"GET\",dry_run=\"\",group=\"\",version=\"v1\",resource=\"pods\",subresource=\"\",scope=\"resource\",component=\"apiserver\"} 3\n"), "{out}");
    }

    #[test]
    fn store_keys_name_their_type() {
        assert_eq!(storage_type("/registry/pods/default/a"), "pods");
        assert_eq!(etcd_type_label(storage_type("/registry/apps/deployments/x/y")), "deployments.apps");
        assert_eq!(
            etcd_type_label(storage_type("/registry/rbac.authorization.k8s.io/clusterroles/")),
            "clusterroles.rbac.authorization.k8s.io"
        );
        assert_eq!(storage_type("/registry/health"), "health");
        let m = ApiMetrics::default();
        m.observe_storage(Operation::Get, "/registry/apps/deployments/x/y", Duration::from_millis(2));
        let mut out = String::new();
        m.write_storage(&mut out);
        assert!(
            out.contains("etcd_request_duration_seconds_count{operation=\"get\",type=\"deployments.apps\"} 1\n"),
            "{out}"
        );
    }
}

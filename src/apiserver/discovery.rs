//! Discovery: /api, /apis, per-group and per-version resource lists, the
//! aggregated form (apidiscovery.k8s.io/v2) that current clients ask for
//! first, and /version.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::aggregator::Aggregator;
use super::registry::Registry;
use super::resource::Resource;

const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The Kubernetes version ferrok serves.
pub const KUBE_VERSION: (&str, &str, &str) = ("1", "33", "v1.33.0+ferrok");

fn json_response(body: Value) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').any(|p| {
        let p = p.replace(' ', "");
        p.contains("as=APIGroupDiscoveryList") && p.contains("v=v2") && !p.contains("v=v2beta1")
    })
}

/// A subresource's group, version and kind when it differs from its parent's.
pub type SubKind = Option<(&'static str, &'static str, &'static str)>;

/// Whether `r` (or its subresource `sub`) is served for `verb`: the verbs
/// discovery lists are the only ones routed.
pub fn serves_verb(r: &Resource, sub: Option<&str>, verb: &str) -> bool {
    match sub {
        None => r.verbs.iter().any(|v| v == verb),
        Some(sub) => subresources(r).iter().any(|(s, verbs, _)| s == sub && verbs.contains(&verb)),
    }
}

/// The options kind (core v1) of a connect subresource of a `kind`
/// (`pods/proxy` takes PodProxyOptions), which is also the kind admission
/// reviews for it.
pub fn connect_options_kind(kind: &str, subresource: &str) -> Option<&'static str> {
    Some(match (kind, subresource) {
        ("Pod", "attach") => "PodAttachOptions",
        ("Pod", "exec") => "PodExecOptions",
        ("Pod", "portforward") => "PodPortForwardOptions",
        ("Pod", "proxy") => "PodProxyOptions",
        ("Node", "proxy") => "NodeProxyOptions",
        ("Service", "proxy") => "ServiceProxyOptions",
        _ => return None,
    })
}

fn options_kind(r: &Resource, subresource: &str) -> SubKind {
    connect_options_kind(&r.kind, subresource).map(|kind| ("", "v1", kind))
}

/// Subresources and the verbs they take.
pub fn subresources(r: &Resource) -> Vec<(String, Vec<&'static str>, SubKind)> {
    let mut out = Vec::new();
    if r.status {
        out.push(("status".to_string(), vec!["get", "patch", "update"], None));
    }
    if r.scale.is_some() {
        out.push(("scale".to_string(), vec!["get", "patch", "update"], Some(("autoscaling", "v1", "Scale"))));
    }
    for s in &r.subresources {
        let (verbs, kind): (Vec<&'static str>, Option<(&str, &str, &str)>) = match s.as_str() {
            "binding" => (vec!["create"], Some(("", "v1", "Binding"))),
            "eviction" => (vec!["create"], Some(("policy", "v1", "Eviction"))),
            "token" => (vec!["create"], Some(("authentication.k8s.io", "v1", "TokenRequest"))),
            "log" => (vec!["get"], None),
            "exec" => (vec!["create", "get"], options_kind(r, "exec")),
            "attach" => (vec!["create", "get"], options_kind(r, "attach")),
            "portforward" => (vec!["create", "get"], options_kind(r, "portforward")),
            "proxy" => (vec!["create", "delete", "get", "patch", "update"], options_kind(r, "proxy")),
            "finalize" => (vec!["update"], None),
            "approval" | "ephemeralcontainers" | "resize" => (vec!["get", "patch", "update"], None),
            _ => (vec!["get"], None),
        };
        out.push((s.clone(), verbs, kind));
    }
    out
}

fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let resources = registry.in_version(group, version);
    if resources.is_empty() {
        return None;
    }
    let mut list = Vec::new();
    for r in &resources {
        let mut entry = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": r.verbs,
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        list.push(entry);
        for (sub, verbs, kind) in subresources(r) {
            let mut e = json!({"name": format!("{}/{sub}", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": verbs});
            if let Some((g, v, k)) = kind {
                e["kind"] = json!(k);
                if !g.is_empty() {
                    e["group"] = json!(g);
                }
                e["version"] = json!(v);
            }
            list.push(e);
        }
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}))
}

fn group_object(registry: &Registry, name: &str) -> Option<Value> {
    let g = registry.groups().into_iter().find(|g| g.name == name)?;
    let versions: Vec<Value> =
        g.versions.iter().map(|v| json!({"groupVersion": format!("{}/{v}", g.name), "version": v})).collect();
    let preferred = versions.first().cloned().unwrap_or(json!({}));
    Some(
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": g.name, "versions": versions, "preferredVersion": preferred}),
    )
}

/// The `APIGroup` of a group another server serves (aggregated).
fn remote_group_object(remote: &Aggregator, name: &str) -> Option<Value> {
    let g = remote.groups().into_iter().find(|g| g.name == name)?;
    let versions: Vec<Value> =
        g.versions.iter().map(|v| json!({"groupVersion": format!("{}/{v}", g.name), "version": v})).collect();
    let preferred = versions.first().cloned().unwrap_or(json!({}));
    Some(
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": g.name, "versions": versions, "preferredVersion": preferred}),
    )
}

/// A remote version's resources in aggregated discovery's form, from the
/// `APIResourceList` its server answered with (subresources under their
/// resource).
fn remote_resources(group: &str, version: &str, list: &Value) -> Vec<Value> {
    let entries = list["resources"].as_array().cloned().unwrap_or_default();
    let kind_of = |e: &Value| {
        let mut rk = json!({"version": e["version"].as_str().unwrap_or(version), "kind": e["kind"]});
        let g = e["group"].as_str().unwrap_or(group);
        if !g.is_empty() {
            rk["group"] = json!(g);
        }
        rk
    };
    let mut out: Vec<Value> = Vec::new();
    for e in entries.iter().filter(|e| e["name"].as_str().is_some_and(|n| !n.contains('/'))) {
        let name = e["name"].as_str().unwrap_or_default();
        let mut r = json!({
            "resource": name,
            "responseKind": kind_of(e),
            "scope": if e["namespaced"].as_bool() == Some(true) { "Namespaced" } else { "Cluster" },
            "singularResource": e["singularName"],
            "verbs": e["verbs"],
        });
        for key in ["shortNames", "categories"] {
            if e[key].as_array().is_some_and(|a| !a.is_empty()) {
                r[key] = e[key].clone();
            }
        }
        let subs: Vec<Value> = entries
            .iter()
            .filter_map(|s| {
                let (parent, sub) = s["name"].as_str()?.split_once('/')?;
                (parent == name).then(|| json!({"subresource": sub, "responseKind": kind_of(s), "verbs": s["verbs"]}))
            })
            .collect();
        if !subs.is_empty() {
            r["subresources"] = json!(subs);
        }
        out.push(r);
    }
    out
}

fn aggregated(registry: &Registry, core: bool, remote: &Aggregator) -> Response {
    let mut items = Vec::new();
    let groups: Vec<(String, Vec<String>)> = if core {
        vec![(String::new(), vec!["v1".to_string()])]
    } else {
        registry.groups().into_iter().map(|g| (g.name, g.versions)).collect()
    };
    for (group, versions) in groups {
        let mut vs = Vec::new();
        for v in versions {
            let resources: Vec<Value> = registry
                .in_version(&group, &v)
                .iter()
                .map(|r| {
                    let subs: Vec<Value> = subresources(r)
                        .into_iter()
                        .map(|(s, verbs, kind)| {
                            let (g, ver, k) = kind.unwrap_or((r.group.as_str(), r.version.as_str(), r.kind.as_str()));
                            let mut rk = json!({"version": ver, "kind": k});
                            if !g.is_empty() {
                                rk["group"] = json!(g);
                            }
                            json!({"subresource": s, "responseKind": rk, "verbs": verbs})
                        })
                        .collect();
                    let mut rk = json!({"version": r.version, "kind": r.kind});
                    if !r.group.is_empty() {
                        rk["group"] = json!(r.group);
                    }
                    let mut e = json!({
                        "resource": r.plural,
                        "responseKind": rk,
                        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": r.singular,
                        "verbs": r.verbs,
                    });
                    if !r.short_names.is_empty() {
                        e["shortNames"] = json!(r.short_names);
                    }
                    if !r.categories.is_empty() {
                        e["categories"] = json!(r.categories);
                    }
                    if !subs.is_empty() {
                        e["subresources"] = json!(subs);
                    }
                    e
                })
                .collect();
            vs.push(json!({"version": v, "resources": resources, "freshness": "Current"}));
        }
        let metadata = if group.is_empty() {
            json!({"creationTimestamp": null})
        } else {
            json!({"name": group, "creationTimestamp": null})
        };
        items.push(json!({"metadata": metadata, "versions": vs}));
    }
    if !core {
        for g in remote.groups().into_iter().filter(|g| registry.groups().iter().all(|local| local.name != g.name)) {
            let vs: Vec<Value> = g
                .versions
                .iter()
                .map(|v| match remote.resource_list(&g.name, v) {
                    Some(list) => {
                        json!({"version": v, "resources": remote_resources(&g.name, v, &list), "freshness": "Current"})
                    }
                    None => json!({"version": v, "resources": [], "freshness": "Stale"}),
                })
                .collect();
            items.push(json!({"metadata": {"name": g.name, "creationTimestamp": null}, "versions": vs}));
        }
    }
    let body = json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items});
    (StatusCode::OK, [(header::CONTENT_TYPE, AGGREGATED), (header::VARY, "Accept")], body.to_string()).into_response()
}

fn not_found() -> Response {
    super::status::ApiError::new(404, "NotFound", "the server could not find the requested resource").into_response()
}

pub fn core_versions(registry: &Registry, remote: &Aggregator, accept: &str, server_address: &str) -> Response {
    if wants_aggregated(accept) {
        return aggregated(registry, true, remote);
    }
    json_response(json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }))
}

pub fn groups(registry: &Registry, remote: &Aggregator, accept: &str) -> Response {
    if wants_aggregated(accept) {
        return aggregated(registry, false, remote);
    }
    let local = registry.groups();
    let mut groups: Vec<Value> = local.iter().filter_map(|g| group_object(registry, &g.name)).collect();
    groups.extend(
        remote
            .groups()
            .iter()
            .filter(|g| local.iter().all(|l| l.name != g.name))
            .filter_map(|g| remote_group_object(remote, &g.name)),
    );
    json_response(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
}

pub fn group(registry: &Registry, remote: &Aggregator, name: &str) -> Response {
    match group_object(registry, name).or_else(|| remote_group_object(remote, name)) {
        Some(g) => json_response(g),
        None => not_found(),
    }
}

pub fn resources(registry: &Registry, group: &str, version: &str) -> Response {
    match resource_list(registry, group, version) {
        Some(l) => json_response(l),
        None => not_found(),
    }
}

pub fn version() -> Response {
    let (major, minor, git) = KUBE_VERSION;
    json_response(json!({
        "major": major, "minor": minor, "gitVersion": git,
        "gitCommit": env!("FERROK_GIT_COMMIT"), "gitTreeState": "clean",
        "buildDate": env!("FERROK_BUILD_DATE"), "goVersion": "rust", "compiler": "rustc",
        "platform": format!("linux/{}", if cfg!(target_arch = "x86_64") { "amd64" } else if cfg!(target_arch = "aarch64") { "arm64" } else { std::env::consts::ARCH }),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_verbs_are_served() {
        let registry = Registry::builtin();
        let ns = registry.get("", "v1", "namespaces").expect("namespaces");
        assert!(serves_verb(&ns, None, "delete") && !serves_verb(&ns, None, "deletecollection"));
        assert!(serves_verb(&ns, Some("finalize"), "update") && !serves_verb(&ns, Some("finalize"), "get"));
        let pods = registry.get("", "v1", "pods").expect("pods");
        assert!(serves_verb(&pods, Some("ephemeralcontainers"), "get"));
        assert!(!serves_verb(&pods, Some("status"), "create") && !serves_verb(&pods, Some("nonsense"), "get"));
        let kinds: Vec<(String, SubKind)> = subresources(&pods).into_iter().map(|(s, _, k)| (s, k)).collect();
        assert!(kinds.contains(&("attach".into(), Some(("", "v1", "PodAttachOptions")))));
        assert!(kinds.contains(&("proxy".into(), Some(("", "v1", "PodProxyOptions")))));
        let bindings = registry.get("", "v1", "bindings").expect("bindings");
        assert_eq!((bindings.verbs.as_slice(), bindings.singular.as_str()), (&["create".to_string()][..], "binding"));
    }
}

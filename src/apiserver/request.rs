//! What a request asks for, read off its path: upstream's RequestInfo.

/// A resource request: `/api/v1/namespaces/ns/pods/name/status` and kin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub plural: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// The legacy `/watch/` prefix was used.
    pub watch_prefix: bool,
    /// Of a `proxy` subresource, the path after it (`/` or `/a/b`, as sent).
    pub proxy_path: Option<String>,
}

/// The query string's parameters; of a repeated one the first counts, as
/// upstream's conversions take `values[0]`.
pub fn parse_query(raw: Option<&str>) -> std::collections::HashMap<String, String> {
    use std::collections::HashMap;
    let mut out = HashMap::new();
    for (k, v) in
        raw.map(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).unwrap_or_default()).unwrap_or_default()
    {
        out.entry(k).or_insert(v);
    }
    out
}

/// Upstream's Convert_Slice_string_To_bool: present and not "false" or "0"
/// (in any case) is true, the empty string included.
pub fn parse_bool(value: Option<&str>) -> bool {
    match value {
        None => false,
        Some(v) => !matches!(v.to_ascii_lowercase().as_str(), "false" | "0"),
    }
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/<group>`
    Group(String),
    /// `/api/v1` or `/apis/<group>/<version>`
    Resources {
        group: String,
        version: String,
    },
    Resource(ResourcePath),
    Other,
}

/// The object a field selector names with `metadata.name=…` (or `==`),
/// alone or beside other requirements, as upstream's request info reads it.
pub fn selected_name(selector: &str) -> Option<String> {
    selector.split(',').find_map(|req| {
        let (field, value) = req.split_once("==").or_else(|| req.split_once('='))?;
        (field.trim() == "metadata.name").then(|| value.trim().to_string())
    })
}

/// The verb of a resource request, as upstream's RequestInfo names it;
/// `None` for a method the resource path does not take.
pub fn verb(method: &axum::http::Method, named: bool, watching: bool) -> Option<&'static str> {
    use axum::http::Method;
    Some(match (method, named, watching) {
        (&Method::GET, _, true) => "watch",
        (&Method::GET, true, false) => "get",
        (&Method::GET, false, false) => "list",
        (&Method::POST, _, _) => "create",
        (&Method::PUT, true, _) => "update",
        (&Method::PATCH, true, _) => "patch",
        (&Method::DELETE, true, _) => "delete",
        (&Method::DELETE, false, _) => "deletecollection",
        _ => return None,
    })
}

fn segments(path: &str) -> Vec<&str> {
    path.split('/').filter(|s| !s.is_empty()).collect()
}

pub fn parse(path: &str) -> Target {
    let segs = segments(path);
    let (group, version, rest) = match segs.as_slice() {
        ["api"] => return Target::CoreVersions,
        ["apis"] => return Target::Groups,
        ["apis", g] => return Target::Group(g.to_string()),
        ["api", v, rest @ ..] => (String::new(), v.to_string(), rest),
        ["apis", g, v, rest @ ..] => (g.to_string(), v.to_string(), rest),
        _ => return Target::Other,
    };
    if rest.is_empty() {
        return Target::Resources { group, version };
    }
    let (watch_prefix, rest) = match rest {
        ["watch", tail @ ..] => (true, tail),
        _ => (false, rest),
    };
    let mut p = ResourcePath {
        group,
        version,
        namespace: None,
        plural: String::new(),
        name: None,
        subresource: None,
        watch_prefix,
        proxy_path: None,
    };
    let tail_len = match rest {
        // /namespaces/{ns}/{plural}[/{name}[/{sub}]]
        ["namespaces", ns, plural, tail @ ..] if !is_namespace_subresource(plural, tail) => {
            p.namespace = Some(ns.to_string());
            p.plural = plural.to_string();
            p.name = tail.first().map(|s| s.to_string());
            p.subresource = tail.get(1).map(|s| s.to_string());
            tail.len()
        }
        [plural, tail @ ..] => {
            p.plural = plural.to_string();
            p.name = tail.first().map(|s| s.to_string());
            p.subresource = tail.get(1).map(|s| s.to_string());
            tail.len()
        }
        [] => return Target::Resources { group: p.group, version: p.version },
    };
    if p.subresource.as_deref() == Some("proxy") {
        // Whatever follows `…/{name}/proxy` is the proxied path, as sent.
        let name = p.name.as_deref().unwrap_or_default();
        let marker = format!("/{name}/proxy");
        let rest = path.find(&marker).map(|i| &path[i + marker.len()..]).unwrap_or_default();
        if !rest.is_empty() && !rest.starts_with('/') {
            return Target::Other;
        }
        p.proxy_path = Some(if rest.is_empty() { "/".to_string() } else { rest.to_string() });
    } else if tail_len > 2 {
        return Target::Other;
    }
    Target::Resource(p)
}

/// `/api/v1/namespaces/{name}/status` and `/finalize` are subresources of
/// the namespace, not lists in it.
fn is_namespace_subresource(segment: &str, tail: &[&str]) -> bool {
    tail.is_empty() && (segment == "status" || segment == "finalize")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> ResourcePath {
        match parse(path) {
            Target::Resource(r) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn a_field_selector_may_name_one_object() {
        assert_eq!(selected_name("metadata.name=a").as_deref(), Some("a"));
        assert_eq!(selected_name("spec.x=1,metadata.name==b").as_deref(), Some("b"));
        assert_eq!(selected_name("metadata.name!=a"), None);
        assert_eq!(selected_name("metadata.namespace=a"), None);
    }

    #[test]
    fn proxy_subresources_keep_the_path_after_them() {
        let p = res("/api/v1/namespaces/web/services/web:http/proxy/a/b/");
        assert_eq!((p.name.as_deref(), p.subresource.as_deref()), (Some("web:http"), Some("proxy")));
        assert_eq!(p.proxy_path.as_deref(), Some("/a/b/"));
        assert_eq!(res("/api/v1/nodes/n1/proxy").proxy_path.as_deref(), Some("/"));
        assert_eq!(res("/api/v1/nodes/n1/proxy/stats/summary").proxy_path.as_deref(), Some("/stats/summary"));
        assert_eq!(res("/api/v1/namespaces/d/pods/p").proxy_path, None);
        assert_eq!(parse("/api/v1/namespaces/d/pods/p/log/extra"), Target::Other);
    }

    #[test]
    fn paths() {
        assert_eq!(parse("/api"), Target::CoreVersions);
        assert_eq!(parse("/apis/apps"), Target::Group("apps".into()));
        assert_eq!(parse("/apis/apps/v1"), Target::Resources { group: "apps".into(), version: "v1".into() });
        let r = res("/api/v1/namespaces/default/pods/web/status");
        assert_eq!(
            (r.namespace.as_deref(), r.plural.as_str(), r.name.as_deref(), r.subresource.as_deref()),
            (Some("default"), "pods", Some("web"), Some("status"))
        );
        let r = res("/api/v1/namespaces/kube-system");
        assert_eq!((r.namespace, r.plural.as_str(), r.name.as_deref()), (None, "namespaces", Some("kube-system")));
        let r = res("/api/v1/namespaces/kube-system/status");
        assert_eq!(
            (r.plural.as_str(), r.name.as_deref(), r.subresource.as_deref()),
            ("namespaces", Some("kube-system"), Some("status"))
        );
        let r = res("/apis/apps/v1/watch/namespaces/x/deployments");
        assert!(r.watch_prefix);
        assert_eq!(r.plural, "deployments");
        let r = res("/api/v1/pods");
        assert_eq!((r.namespace, r.name), (None, None));
    }
}

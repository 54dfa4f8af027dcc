//! RBAC: the Roles, ClusterRoles and their bindings, kept in memory from a
//! watch of the store, and the decision whether a user may do a verb on a
//! resource, as upstream's RBAC authorizer makes it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures_util::StreamExt;
use serde_json::Value;

use super::User;
use crate::apiserver::storage::{Change, ReadAt, Storage};

const PREFIX: &str = "/registry/rbac.authorization.k8s.io/";

/// What a request wants to do.
#[derive(Debug, Clone, Default)]
pub struct Attributes {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// For non-resource requests (`/healthz`, `/api`).
    pub path: Option<String>,
}

#[derive(Default)]
pub struct RbacCache {
    /// Store key → object, for every RBAC object.
    objects: RwLock<HashMap<String, Value>>,
}

fn has(list: &Value, want: &str) -> bool {
    list.as_array().is_some_and(|a| a.iter().any(|v| v == "*" || v.as_str() == Some(want)))
}

fn subject_matches(subject: &Value, user: &User, binding_ns: &str) -> bool {
    let name = subject["name"].as_str().unwrap_or_default();
    match subject["kind"].as_str().unwrap_or_default() {
        "User" => name == user.name,
        "Group" => user.in_group(name),
        "ServiceAccount" => {
            let ns = subject["namespace"].as_str().filter(|n| !n.is_empty()).unwrap_or(binding_ns);
            user.name == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

/// Whether one policy rule allows the request.
pub fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    if !has(&rule["verbs"], &a.verb) {
        return false;
    }
    if let Some(path) = &a.path {
        return rule["nonResourceURLs"].as_array().is_some_and(|urls| {
            urls.iter().filter_map(Value::as_str).any(|u| u == "*" || u == path || (u.ends_with('*') && path.starts_with(u.trim_end_matches('*'))))
        });
    }
    if !has(&rule["apiGroups"], &a.group) {
        return false;
    }
    let combined = if a.subresource.is_empty() { a.resource.clone() } else { format!("{}/{}", a.resource, a.subresource) };
    let resource_ok = rule["resources"].as_array().is_some_and(|rs| {
        rs.iter().filter_map(Value::as_str).any(|r| {
            r == "*" || r == combined || (!a.subresource.is_empty() && r == format!("*/{}", a.subresource))
        })
    });
    if !resource_ok {
        return false;
    }
    match rule["resourceNames"].as_array() {
        Some(names) if !names.is_empty() => !a.name.is_empty() && names.iter().any(|n| n.as_str() == Some(a.name.as_str())),
        _ => true,
    }
}

impl RbacCache {
    fn get(&self, key: &str) -> Option<Value> {
        self.objects.read().unwrap_or_else(|e| e.into_inner()).get(key).cloned()
    }

    fn role_rules(&self, role_ref: &Value, binding_ns: Option<&str>) -> Vec<Value> {
        let name = role_ref["name"].as_str().unwrap_or_default();
        let key = match (role_ref["kind"].as_str(), binding_ns) {
            (Some("Role"), Some(ns)) => format!("{PREFIX}roles/{ns}/{name}"),
            _ => format!("{PREFIX}clusterroles/{name}"),
        };
        self.get(&key).and_then(|r| r["rules"].as_array().cloned()).unwrap_or_default()
    }

    /// Every rule that applies to `user` in `namespace` (cluster-wide ones too).
    pub fn rules_for(&self, user: &User, namespace: &str) -> Vec<Value> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        let mut refs: Vec<(Value, Option<String>)> = Vec::new();
        for (key, obj) in objects.iter() {
            let namespaced = key.starts_with(&format!("{PREFIX}rolebindings/"));
            let cluster = key.starts_with(&format!("{PREFIX}clusterrolebindings/"));
            if !namespaced && !cluster {
                continue;
            }
            let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
            if namespaced && (namespace.is_empty() || ns != namespace) {
                continue;
            }
            let subjects = obj["subjects"].as_array().cloned().unwrap_or_default();
            if subjects.iter().any(|s| subject_matches(s, user, ns)) {
                refs.push((obj["roleRef"].clone(), namespaced.then(|| ns.to_string())));
            }
        }
        drop(objects);
        refs.iter().flat_map(|(r, ns)| self.role_rules(r, ns.as_deref())).collect()
    }

    pub fn allows(&self, user: &User, a: &Attributes) -> bool {
        self.rules_for(user, &a.namespace).iter().any(|r| rule_allows(r, a))
    }

    fn apply(&self, change: Change) {
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        let key_of = |o: &Value| -> Option<String> {
            let kind = o["kind"].as_str()?;
            let plural = match kind {
                "Role" => "roles",
                "RoleBinding" => "rolebindings",
                "ClusterRole" => "clusterroles",
                "ClusterRoleBinding" => "clusterrolebindings",
                _ => return None,
            };
            let name = o.pointer("/metadata/name")?.as_str()?;
            Some(match o.pointer("/metadata/namespace").and_then(Value::as_str) {
                Some(ns) => format!("{PREFIX}{plural}/{ns}/{name}"),
                None => format!("{PREFIX}{plural}/{name}"),
            })
        };
        match change {
            Change::Added(s) | Change::Modified { new: s, .. } => {
                if let Some(k) = key_of(&s.object) {
                    objects.insert(k, s.object);
                }
            }
            Change::Deleted(s) => {
                if let Some(k) = key_of(&s.object) {
                    objects.remove(&k);
                }
            }
            Change::Progress(_) => {}
        }
    }

    /// Loads every RBAC object, then follows changes in a task.
    pub async fn start(self: &Arc<Self>, storage: Storage) -> Result<tokio::task::JoinHandle<()>, crate::apiserver::status::ApiError> {
        let rev = self.load(&storage).await?;
        let this = self.clone();
        Ok(tokio::spawn(async move { this.follow(storage, rev).await }))
    }

    async fn load(&self, storage: &Storage) -> Result<i64, crate::apiserver::status::ApiError> {
        let page = storage.list(PREFIX, None, 0, ReadAt::Latest).await?;
        let mut objects = HashMap::new();
        for s in page.items {
            let key = format!(
                "{PREFIX}{}",
                match (s.object["kind"].as_str(), s.object.pointer("/metadata/namespace").and_then(Value::as_str)) {
                    (Some(kind), ns) => {
                        let plural = match kind {
                            "Role" => "roles",
                            "RoleBinding" => "rolebindings",
                            "ClusterRole" => "clusterroles",
                            _ => "clusterrolebindings",
                        };
                        let name = s.object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
                        match ns {
                            Some(ns) => format!("{plural}/{ns}/{name}"),
                            None => format!("{plural}/{name}"),
                        }
                    }
                    _ => continue,
                }
            );
            objects.insert(key, s.object);
        }
        *self.objects.write().unwrap_or_else(|e| e.into_inner()) = objects;
        Ok(page.rev)
    }

    async fn follow(&self, storage: Storage, mut from: i64) {
        loop {
            match storage.watch(PREFIX, false, from, std::time::Duration::from_secs(3600)).await {
                Ok(changes) => {
                    let mut changes = Box::pin(changes);
                    while let Some(change) = changes.next().await {
                        match change {
                            Ok(c) => {
                                if let Change::Added(s) | Change::Deleted(s) | Change::Modified { new: s, .. } = &c {
                                    from = s.rev;
                                }
                                self.apply(c);
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "RBAC watch ended; reloading");
                                break;
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot watch RBAC objects"),
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            match self.load(&storage).await {
                Ok(rev) => from = rev,
                Err(e) => tracing::error!(error = %e, "cannot reload RBAC objects"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules() {
        let rule = json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods", "pods/log"], "resourceNames": []});
        let a = |verb: &str, res: &str, sub: &str| Attributes { verb: verb.into(), resource: res.into(), subresource: sub.into(), ..Default::default() };
        assert!(rule_allows(&rule, &a("get", "pods", "")));
        assert!(rule_allows(&rule, &a("get", "pods", "log")));
        assert!(!rule_allows(&rule, &a("delete", "pods", "")));
        assert!(!rule_allows(&rule, &a("get", "pods", "exec")));
        let named = json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "resourceNames": ["x"]});
        assert!(!rule_allows(&named, &a("get", "secrets", "")));
        let urls = json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/api/*"]});
        let mut n = a("get", "", "");
        n.path = Some("/api/v1".into());
        assert!(rule_allows(&urls, &n));
    }
}

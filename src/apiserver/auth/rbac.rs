//! RBAC: the Roles, ClusterRoles and their bindings, kept in memory from a
//! watch of the store, and the decision whether a user may do a verb on a
//! resource, as upstream's RBAC authorizer makes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::User;
use crate::apiserver::cache::PrefixCache;
use crate::apiserver::meta::namespace_of;
use crate::sync::LockExt;

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

/// A PolicyRule, as the default roles write them.
pub(super) fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
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
            user.name
                .strip_prefix("system:serviceaccount:")
                .and_then(|rest| rest.strip_prefix(ns))
                .and_then(|rest| rest.strip_prefix(':'))
                == Some(name)
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
            urls.iter()
                .filter_map(Value::as_str)
                .any(|u| u == "*" || u == path || (u.ends_with('*') && path.starts_with(u.trim_end_matches('*'))))
        });
    }
    if !has(&rule["apiGroups"], &a.group) {
        return false;
    }
    // `resource`, or `resource/subresource`, or `*/subresource`.
    let names_request = |r: &str| {
        if a.subresource.is_empty() {
            return r == a.resource;
        }
        r.split_once('/').is_some_and(|(res, sub)| (res == a.resource || res == "*") && sub == a.subresource)
    };
    let resource_ok = rule["resources"]
        .as_array()
        .is_some_and(|rs| rs.iter().filter_map(Value::as_str).any(|r| r == "*" || names_request(r)));
    if !resource_ok {
        return false;
    }
    match rule["resourceNames"].as_array() {
        Some(names) if !names.is_empty() => {
            !a.name.is_empty() && names.iter().any(|n| n.as_str() == Some(a.name.as_str()))
        }
        _ => true,
    }
}

/// A binding that allowed a request, as upstream's RBAC authorizer names it.
fn describe(binding: &Value, namespace: Option<&str>, subject: &Value) -> String {
    let name = binding.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let role_kind = binding.pointer("/roleRef/kind").and_then(Value::as_str).unwrap_or_default();
    let role = binding.pointer("/roleRef/name").and_then(Value::as_str).unwrap_or_default();
    let subject_kind = subject["kind"].as_str().unwrap_or_default();
    let subject_name = subject["name"].as_str().unwrap_or_default();
    let who = if subject_kind == "ServiceAccount" {
        let ns = subject["namespace"].as_str().filter(|n| !n.is_empty()).or(namespace).unwrap_or_default();
        format!("{subject_kind} {:?}", format!("{subject_name}/{ns}"))
    } else {
        format!("{subject_kind} {subject_name:?}")
    };
    match namespace {
        Some(ns) => format!("RoleBinding {:?} of {role_kind} {role:?} to {who}", format!("{name}/{ns}")),
        None => format!("ClusterRoleBinding {name:?} of {role_kind} {role:?} to {who}"),
    }
}

/// RBAC decisions over the watch-fed cache of RBAC objects.
pub struct RbacCache {
    objects: Arc<PrefixCache>,
    /// The bindings as of a change count of `objects`, grouped again when
    /// the count moves (RBAC objects change rarely; requests ask at every
    /// call, and each would otherwise visit every Role and ClusterRole).
    bindings: Mutex<(u64, Arc<Bindings>)>,
    changes: tokio::sync::watch::Receiver<u64>,
}

/// The bindings, grouped as `allowed_by` visits them.
#[derive(Default)]
struct Bindings {
    cluster: Vec<Arc<Value>>,
    by_namespace: HashMap<String, Vec<Arc<Value>>>,
    /// The bindings a user (name and groups) is a subject of in a namespace,
    /// in visiting order: a request then looks only at those, not at the
    /// ~60 bootstrap ClusterRoleBindings' subjects. Kept as long as these
    /// bindings are, and emptied when it holds `SUBJECT_MEMO` entries.
    subject_of: Mutex<HashMap<String, Arc<[Matched]>>>,
}

/// A binding that names the user, and which of its subjects does.
struct Matched {
    binding: Arc<Value>,
    namespaced: bool,
    subject: usize,
}

/// How many (user, namespace) pairs `Bindings::subject_of` remembers.
const SUBJECT_MEMO: usize = 4096;

impl Bindings {
    fn of(objects: &[Arc<Value>]) -> Bindings {
        let mut b = Bindings::default();
        for obj in objects {
            match obj["kind"].as_str() {
                Some("ClusterRoleBinding") => b.cluster.push(obj.clone()),
                Some("RoleBinding") => {
                    let ns = namespace_of(obj).unwrap_or_default();
                    b.by_namespace.entry(ns.to_string()).or_default().push(obj.clone());
                }
                _ => {}
            }
        }
        b
    }

    /// The bindings whose subjects include `user` for a request in `namespace`.
    fn matching(&self, user: &User, namespace: &str) -> Arc<[Matched]> {
        let mut key = String::with_capacity(64);
        for part in [namespace, &user.name].into_iter().chain(user.groups.iter().map(String::as_str)) {
            key.push_str(part);
            key.push('\0');
        }
        let mut memo = self.subject_of.locked();
        if let Some(found) = memo.get(&key) {
            return found.clone();
        }
        let in_namespace = match namespace {
            "" => None,
            ns => self.by_namespace.get(ns),
        };
        let mut found = Vec::new();
        for (namespaced, group) in [(false, Some(&self.cluster)), (true, in_namespace)] {
            for binding in group.into_iter().flatten() {
                let ns = namespace_of(binding).unwrap_or_default();
                let subjects = binding["subjects"].as_array().map(Vec::as_slice).unwrap_or_default();
                if let Some(subject) = subjects.iter().position(|s| subject_matches(s, user, ns)) {
                    found.push(Matched { binding: binding.clone(), namespaced, subject });
                }
            }
        }
        let found: Arc<[Matched]> = found.into();
        if memo.len() >= SUBJECT_MEMO {
            memo.clear();
        }
        memo.insert(key, found.clone());
        found
    }
}

impl RbacCache {
    pub fn new(objects: Arc<PrefixCache>) -> Self {
        let changes = objects.subscribe();
        RbacCache { objects, bindings: Mutex::new((u64::MAX, Arc::default())), changes }
    }

    /// The bindings as the cache holds them now.
    fn bindings(&self) -> Arc<Bindings> {
        // Read before the objects: a change applied meanwhile is regrouped
        // at the next call.
        let seen = *self.changes.borrow();
        let mut slot = self.bindings.locked();
        if slot.0 != seen {
            *slot = (seen, Arc::new(Bindings::of(&self.objects.all())));
        }
        slot.1.clone()
    }

    /// The role a binding refers to (its `rules` are what it grants).
    fn role(&self, role_ref: &Value, binding_ns: Option<&str>) -> Option<Arc<Value>> {
        let name = role_ref["name"].as_str().unwrap_or_default();
        let id = match (role_ref["kind"].as_str(), binding_ns) {
            (Some("Role"), Some(ns)) => format!("Role/{ns}/{name}"),
            _ => format!("ClusterRole/{name}"),
        };
        self.objects.get(&id)
    }

    fn role_rules(&self, role_ref: &Value, binding_ns: Option<&str>) -> Vec<Value> {
        self.role(role_ref, binding_ns).and_then(|r| r["rules"].as_array().cloned()).unwrap_or_default()
    }

    /// Every rule that applies to `user` in `namespace` (cluster-wide ones too).
    pub fn rules_for(&self, user: &User, namespace: &str) -> Vec<Value> {
        let mut refs: Vec<(Value, Option<String>)> = Vec::new();
        for obj in self.objects.all() {
            let namespaced = match obj["kind"].as_str() {
                Some("RoleBinding") => true,
                Some("ClusterRoleBinding") => false,
                _ => continue,
            };
            let ns = namespace_of(&obj).unwrap_or_default();
            if namespaced && (namespace.is_empty() || ns != namespace) {
                continue;
            }
            let subjects = obj["subjects"].as_array().map(Vec::as_slice).unwrap_or_default();
            if subjects.iter().any(|s| subject_matches(s, user, ns)) {
                refs.push((obj["roleRef"].clone(), namespaced.then(|| ns.to_string())));
            }
        }
        refs.iter().flat_map(|(r, ns)| self.role_rules(r, ns.as_deref())).collect()
    }

    /// The binding, role and subject that allow the request, in upstream's
    /// words (`ClusterRoleBinding "x" of ClusterRole "y" to Group "z"`);
    /// None when nothing does. ClusterRoleBindings are tried first, then
    /// the RoleBindings of the request's namespace, as upstream visits them.
    pub fn allowed_by(&self, user: &User, a: &Attributes) -> Option<String> {
        let bindings = self.bindings();
        for m in bindings.matching(user, &a.namespace).iter() {
            let ns = namespace_of(&m.binding).unwrap_or_default();
            let Some(role) = self.role(&m.binding["roleRef"], m.namespaced.then_some(ns)) else { continue };
            let rules = role["rules"].as_array().map(Vec::as_slice).unwrap_or_default();
            if rules.iter().any(|r| rule_allows(r, a)) {
                return Some(describe(&m.binding, m.namespaced.then_some(ns), &m.binding["subjects"][m.subject]));
            }
        }
        None
    }

    pub fn allows(&self, user: &User, a: &Attributes) -> bool {
        self.allowed_by(user, a).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules() {
        let rule = json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods", "pods/log"], "resourceNames": []});
        let a = |verb: &str, res: &str, sub: &str| Attributes {
            verb: verb.into(),
            resource: res.into(),
            subresource: sub.into(),
            ..Default::default()
        };
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

    #[test]
    fn decisions_follow_bindings_and_roles_that_change_after_the_first() {
        let objects = PrefixCache::new("/registry/");
        let rbac = RbacCache::new(objects.clone());
        let alice = User { name: "alice".into(), groups: vec!["devs".into()] };
        let get_pods = |ns: &str| Attributes {
            verb: "get".into(),
            resource: "pods".into(),
            namespace: ns.into(),
            ..Default::default()
        };
        assert!(!rbac.allows(&alice, &get_pods("dev")), "no binding yet");
        objects.apply_for_test(&json!({"kind": "ClusterRole", "metadata": {"name": "view"},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]}));
        objects.apply_for_test(&json!({"kind": "RoleBinding", "metadata": {"name": "devs-view", "namespace": "dev"},
            "roleRef": {"kind": "ClusterRole", "name": "view"}, "subjects": [{"kind": "Group", "name": "devs"}]}));
        assert!(rbac.allows(&alice, &get_pods("dev")), "a RoleBinding added after the first decision");
        assert!(!rbac.allows(&alice, &get_pods("prod")), "only in its namespace");
        assert!(!rbac.allows(&alice, &get_pods("")), "not cluster-wide");
        objects.apply_for_test(&json!({"kind": "ClusterRoleBinding", "metadata": {"name": "alice-view"},
            "roleRef": {"kind": "ClusterRole", "name": "view"}, "subjects": [{"kind": "User", "name": "alice"}]}));
        assert_eq!(
            rbac.allowed_by(&alice, &get_pods("prod")).as_deref(),
            Some(r#"ClusterRoleBinding "alice-view" of ClusterRole "view" to User "alice""#)
        );
        objects.apply_for_test(&json!({"kind": "ClusterRole", "metadata": {"name": "view"}, "rules": []}));
        assert!(!rbac.allows(&alice, &get_pods("dev")), "the role's rules as they are now");
    }

    #[test]
    fn the_bindings_remembered_for_a_user_are_those_of_its_groups_and_namespace() {
        let objects = PrefixCache::new("/registry/");
        let rbac = RbacCache::new(objects.clone());
        objects.apply_for_test(&json!({"kind": "ClusterRole", "metadata": {"name": "view"},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]}));
        objects.apply_for_test(&json!({"kind": "RoleBinding", "metadata": {"name": "devs-view", "namespace": "dev"},
            "roleRef": {"kind": "ClusterRole", "name": "view"}, "subjects": [{"kind": "Group", "name": "devs"}]}));
        objects.apply_for_test(&json!({"kind": "RoleBinding", "metadata": {"name": "bot-view", "namespace": "dev"},
            "roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "x"}, {"kind": "ServiceAccount", "name": "bot"}]}));
        let get_pods = |ns: &str| Attributes {
            verb: "get".into(),
            resource: "pods".into(),
            namespace: ns.into(),
            ..Default::default()
        };
        let dev = User { name: "alice".into(), groups: vec!["devs".into()] };
        let other = User { name: "alice".into(), groups: vec!["ops".into()] };
        for _ in 0..2 {
            assert!(rbac.allows(&dev, &get_pods("dev")));
            assert!(!rbac.allows(&other, &get_pods("dev")), "the same name in other groups");
            assert!(!rbac.allows(&dev, &get_pods("prod")), "another namespace");
        }
        let bot = User { name: "system:serviceaccount:dev:bot".into(), groups: vec![] };
        assert_eq!(
            rbac.allowed_by(&bot, &get_pods("dev")).as_deref(),
            Some(r#"RoleBinding "bot-view/dev" of ClusterRole "view" to ServiceAccount "bot/dev""#),
            "the subject that matched, not the first one"
        );
        // Past the memo's size it starts again, and answers the same.
        for i in 0..=SUBJECT_MEMO {
            assert!(!rbac.allows(&dev, &get_pods(&format!("ns-{i}"))));
        }
        assert!(rbac.allows(&dev, &get_pods("dev")));
        assert!(rbac.bindings().subject_of.lock().expect("memo").len() <= SUBJECT_MEMO);
    }

    #[test]
    fn bindings_are_described_as_upstream_does() {
        let rb = json!({"metadata": {"name": "edit-me", "namespace": "dev"}, "roleRef": {"kind": "ClusterRole", "name": "edit"}});
        let sa = json!({"kind": "ServiceAccount", "name": "bot"});
        assert_eq!(
            describe(&rb, Some("dev"), &sa),
            "RoleBinding \"edit-me/dev\" of ClusterRole \"edit\" to ServiceAccount \"bot/dev\""
        );
        let crb = json!({"metadata": {"name": "all"}, "roleRef": {"kind": "ClusterRole", "name": "view"}});
        let group = json!({"kind": "Group", "name": "system:authenticated"});
        assert_eq!(
            describe(&crb, None, &group),
            "ClusterRoleBinding \"all\" of ClusterRole \"view\" to Group \"system:authenticated\""
        );
    }
}

//! How the default RBAC objects are kept at every start, as upstream's
//! RBAC reconciler does it (`pkg/registry/rbac/reconciliation`) in its
//! union mode:
//! - a missing object is created;
//! - an object annotated `rbac.authorization.kubernetes.io/autoupdate:
//!   "false"` is left alone;
//! - otherwise the expected labels and annotations are added (a value the
//!   user changed is kept), and the expected rules that the existing rules
//!   do not cover are appended, broken down into single verb / group /
//!   resource (/ name) rules as upstream's coverage check yields them; rules
//!   the user added stay;
//! - an expected aggregationRule's missing selectors are added; an
//!   aggregationRule where none is expected is removed;
//! - a binding whose roleRef differs is recreated as expected; otherwise
//!   the expected subjects that are missing are appended.

use serde_json::{json, Map, Value};

/// The annotation that opts an object out of reconciliation when "false".
pub const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";

/// What a binding needs.
#[derive(Debug, PartialEq)]
pub enum BindingChange {
    None,
    Update(Value),
    /// The roleRef differs and cannot be changed: delete, then create this.
    Recreate(Value),
}

fn protected(existing: &Value) -> bool {
    existing.pointer("/metadata/annotations").and_then(|a| a.get(AUTOUPDATE)).and_then(Value::as_str) == Some("false")
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

/// Adds the expected labels and annotations the object lacks; a key it
/// has keeps its value. Whether anything was added.
fn merge_metadata(object: &mut Value, expected: &Value) -> bool {
    let mut changed = false;
    for field in ["labels", "annotations"] {
        let Some(want) = expected.pointer(&format!("/metadata/{field}")).and_then(Value::as_object) else {
            continue;
        };
        if want.is_empty() {
            continue;
        }
        let meta = &mut object["metadata"];
        if !meta[field].is_object() {
            meta[field] = Value::Object(Map::new());
        }
        if let Some(have) = meta[field].as_object_mut() {
            for (k, v) in want {
                if !have.contains_key(k) {
                    have.insert(k.clone(), v.clone());
                    changed = true;
                }
            }
        }
    }
    changed
}

/// One rule per verb × group × resource (× name), and per verb × URL: the
/// pieces whose coverage upstream checks one by one.
fn breakdown(rule: &Value) -> Vec<Value> {
    let verbs = strings(&rule["verbs"]);
    let names = strings(&rule["resourceNames"]);
    let mut out = Vec::new();
    for group in strings(&rule["apiGroups"]) {
        for resource in strings(&rule["resources"]) {
            for verb in &verbs {
                if names.is_empty() {
                    out.push(json!({"apiGroups": [group], "resources": [resource], "verbs": [verb]}));
                } else {
                    for name in &names {
                        out.push(json!({
                            "apiGroups": [group], "resources": [resource], "resourceNames": [name], "verbs": [verb],
                        }));
                    }
                }
            }
        }
    }
    for url in strings(&rule["nonResourceURLs"]) {
        for verb in &verbs {
            out.push(json!({"nonResourceURLs": [url], "verbs": [verb]}));
        }
    }
    out
}

fn has_all(set: &[&str], want: &[&str]) -> bool {
    want.iter().all(|w| set.contains(w))
}

fn resources_cover(owner: &[&str], want: &[&str]) -> bool {
    if owner.contains(&"*") || has_all(owner, want) {
        return true;
    }
    want.iter().all(|r| {
        owner.contains(r) || r.split_once('/').is_some_and(|(_, sub)| owner.contains(&format!("*/{sub}").as_str()))
    })
}

fn url_covers(owner: &str, path: &str) -> bool {
    owner == path || (owner.ends_with('*') && path.starts_with(owner.trim_end_matches('*')))
}

/// Whether `owner` allows everything `sub` does (upstream's `ruleCovers`).
fn rule_covers(owner: &Value, sub: &Value) -> bool {
    let (owner_verbs, sub_verbs) = (strings(&owner["verbs"]), strings(&sub["verbs"]));
    let (owner_groups, sub_groups) = (strings(&owner["apiGroups"]), strings(&sub["apiGroups"]));
    let (owner_names, sub_names) = (strings(&owner["resourceNames"]), strings(&sub["resourceNames"]));
    let owner_urls = strings(&owner["nonResourceURLs"]);
    let verbs = owner_verbs.contains(&"*") || has_all(&owner_verbs, &sub_verbs);
    let groups = owner_groups.contains(&"*") || has_all(&owner_groups, &sub_groups);
    let resources = resources_cover(&strings(&owner["resources"]), &strings(&sub["resources"]));
    let urls = strings(&sub["nonResourceURLs"]).iter().all(|p| owner_urls.iter().any(|o| url_covers(o, p)));
    let names = if sub_names.is_empty() {
        owner_names.is_empty()
    } else {
        owner_names.is_empty() || has_all(&owner_names, &sub_names)
    };
    verbs && groups && resources && names && urls
}

/// The pieces of `wanted` that no rule of `owner` covers.
pub fn uncovered(owner: &[Value], wanted: &[Value]) -> Vec<Value> {
    wanted.iter().flat_map(breakdown).filter(|piece| !owner.iter().any(|o| rule_covers(o, piece))).collect()
}

fn rules_of(object: &Value) -> Vec<Value> {
    object["rules"].as_array().cloned().unwrap_or_default()
}

fn selectors_of(object: &Value) -> Option<Vec<Value>> {
    object.get("aggregationRule").filter(|r| !r.is_null()).map(|r| {
        r["clusterRoleSelectors"].as_array().cloned().unwrap_or_default().into_iter().map(normalize_selector).collect()
    })
}

/// A label selector with its empty parts dropped, so that equal selectors
/// compare equal however they were written.
fn normalize_selector(mut selector: Value) -> Value {
    if let Some(map) = selector.as_object_mut() {
        map.retain(|_, v| {
            !(v.is_null() || v.as_object().is_some_and(Map::is_empty) || v.as_array().is_some_and(Vec::is_empty))
        });
    }
    selector
}

/// The existing (Cluster)Role as it must be written, or None when it needs
/// no write (or opted out with autoupdate "false").
pub fn reconcile_role(existing: &Value, expected: &Value) -> Option<Value> {
    if protected(existing) {
        return None;
    }
    let mut role = existing.clone();
    let mut changed = merge_metadata(&mut role, expected);
    let missing = uncovered(&rules_of(existing), &rules_of(expected));
    if !missing.is_empty() {
        let mut rules = rules_of(existing);
        rules.extend(missing);
        role["rules"] = Value::Array(rules);
        changed = true;
    }
    match (selectors_of(existing), selectors_of(expected)) {
        (Some(_), None) => {
            if let Some(map) = role.as_object_mut() {
                map.remove("aggregationRule");
            }
            changed = true;
        }
        (have, Some(want)) => {
            let mut selectors = have.clone().unwrap_or_default();
            let missing: Vec<Value> = want.into_iter().filter(|s| !selectors.contains(s)).collect();
            if have.is_none() || !missing.is_empty() {
                selectors.extend(missing);
                role["aggregationRule"] = json!({"clusterRoleSelectors": selectors});
                changed = true;
            }
        }
        (None, None) => {}
    }
    changed.then_some(role)
}

/// A subject or roleRef with its empty fields dropped (an unset apiGroup
/// and `""` are the same).
fn normalize_ref(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(map) = v.as_object_mut() {
        map.retain(|_, x| !(x.is_null() || x.as_str() == Some("")));
    }
    v
}

/// What the existing (Cluster)RoleBinding needs to become `expected`.
pub fn reconcile_binding(existing: &Value, expected: &Value) -> BindingChange {
    if protected(existing) {
        return BindingChange::None;
    }
    if normalize_ref(&existing["roleRef"]) != normalize_ref(&expected["roleRef"]) {
        return BindingChange::Recreate(expected.clone());
    }
    let mut binding = existing.clone();
    let mut changed = merge_metadata(&mut binding, expected);
    let have: Vec<Value> = existing["subjects"].as_array().into_iter().flatten().map(normalize_ref).collect();
    let missing: Vec<Value> = expected["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| !have.contains(&normalize_ref(s)))
        .cloned()
        .collect();
    if !missing.is_empty() {
        let mut subjects = existing["subjects"].as_array().cloned().unwrap_or_default();
        subjects.extend(missing);
        binding["subjects"] = Value::Array(subjects);
        changed = true;
    }
    if changed {
        BindingChange::Update(binding)
    } else {
        BindingChange::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(rules: Value) -> Value {
        json!({
            "metadata": {"name": "r", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                         "annotations": {AUTOUPDATE: "true"}},
            "rules": rules,
        })
    }

    #[test]
    fn removed_verbs_come_back_as_single_rules_and_user_rules_stay() {
        let expected = role(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]));
        let existing = role(json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            {"apiGroups": ["x.io"], "resources": ["things"], "verbs": ["*"]},
        ]));
        let updated = reconcile_role(&existing, &expected).expect("an update");
        assert_eq!(
            updated["rules"],
            json!([
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                {"apiGroups": ["x.io"], "resources": ["things"], "verbs": ["*"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            ])
        );
        assert_eq!(reconcile_role(&updated, &expected), None);
    }

    #[test]
    fn wildcards_subresource_stars_and_url_prefixes_cover() {
        let owner = vec![
            json!({"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["get"]}),
            json!({"nonResourceURLs": ["/healthz/*"], "verbs": ["*"]}),
        ];
        let wanted = vec![
            json!({"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get"]}),
            json!({"nonResourceURLs": ["/healthz/etcd"], "verbs": ["get"]}),
            json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}),
        ];
        assert_eq!(
            uncovered(&owner, &wanted),
            vec![json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]})]
        );
        // A rule naming objects does not cover one for all objects.
        let named =
            vec![json!({"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["a"], "verbs": ["get"]})];
        let all = vec![json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]})];
        assert_eq!(uncovered(&named, &all).len(), 1);
        assert!(uncovered(&all, &named).is_empty());
    }

    #[test]
    fn autoupdate_false_is_left_alone_and_user_labels_keep_their_values() {
        let expected = role(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]));
        let mut existing = role(json!([]));
        existing["metadata"]["annotations"][AUTOUPDATE] = json!("false");
        assert_eq!(reconcile_role(&existing, &expected), None);
        let mut existing = role(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]));
        existing["metadata"]["labels"] = json!({"kubernetes.io/bootstrapping": "mine"});
        existing["metadata"]["annotations"] = json!({});
        let updated = reconcile_role(&existing, &expected).expect("an update");
        assert_eq!(updated["metadata"]["labels"]["kubernetes.io/bootstrapping"], "mine");
        assert_eq!(updated["metadata"]["annotations"][AUTOUPDATE], "true");
    }

    #[test]
    fn aggregation_rules_gain_missing_selectors_and_keep_the_aggregated_rules() {
        let selector = json!({"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}});
        let mut expected = role(Value::Null);
        expected["aggregationRule"] = json!({"clusterRoleSelectors": [selector]});
        // A role of old without aggregation: the rule is added, its rules kept.
        let existing = role(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]));
        let updated = reconcile_role(&existing, &expected).expect("an update");
        assert_eq!(updated["aggregationRule"]["clusterRoleSelectors"], json!([selector]));
        assert_eq!(updated["rules"], existing["rules"]);
        // Aggregated already, with a selector of the user's: nothing to do.
        let mut mine = updated.clone();
        mine["aggregationRule"]["clusterRoleSelectors"]
            .as_array_mut()
            .expect("selectors")
            .push(json!({"matchLabels": {"mine": "true"}}));
        assert_eq!(reconcile_role(&mine, &expected), None);
        // An aggregationRule where none is expected goes.
        let plain = role(json!([]));
        let updated = reconcile_role(&mine, &plain).expect("an update");
        assert!(updated.get("aggregationRule").is_none());
    }

    #[test]
    fn bindings_gain_missing_subjects_and_are_recreated_for_another_role() {
        let binding = |role: &str, subjects: Value| {
            json!({
                "metadata": {"name": "b", "annotations": {AUTOUPDATE: "true"}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": subjects,
            })
        };
        let sa = json!({"kind": "ServiceAccount", "name": "a", "namespace": "kube-system"});
        let user = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "u"});
        let expected = binding("r", json!([sa, user]));
        let existing =
            binding("r", json!([{"apiGroup": "", "kind": "ServiceAccount", "name": "a", "namespace": "kube-system"}]));
        match reconcile_binding(&existing, &expected) {
            BindingChange::Update(b) => assert_eq!(b["subjects"].as_array().map(Vec::len), Some(2)),
            other => panic!("{other:?}"),
        }
        assert_eq!(reconcile_binding(&expected, &expected), BindingChange::None);
        assert_eq!(reconcile_binding(&binding("other", json!([sa])), &expected), BindingChange::Recreate(expected));
    }
}

//! Strategic merge patch: a JSON merge patch in which lists of objects are
//! merged by their merge key instead of replaced, with the `$patch`,
//! `$retainKeys`, `$setElementOrder` and `$deleteFromPrimitiveList`
//! directives. How each list merges comes from the schema
//! (`x-kubernetes-patch-strategy`, `x-kubernetes-patch-merge-key`; see
//! `patch_meta`); a list the schema says nothing about is replaced. The
//! same merge, keyed by `x-kubernetes-list-map-keys`, lays an apply
//! configuration over the live object.

use serde_json::{Map, Value};

use super::patch_meta::{ListMerge, SchemaNode};

/// Which schema extensions decide how lists merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeRules {
    /// Strategic merge patch: patch strategy and merge key.
    Strategic,
    /// Server-side apply: list type and list map keys.
    Apply,
}

impl MergeRules {
    pub fn list_merge(self, node: &SchemaNode) -> ListMerge {
        match self {
            MergeRules::Strategic => node.patch_list_merge(),
            MergeRules::Apply => node.apply_list_merge(),
        }
    }
}

/// Applies `patch` to `doc` with strategic-merge semantics, lists merging
/// as `node` (the schema of `doc`) says.
pub fn strategic_merge(doc: &mut Value, patch: &Value, node: SchemaNode, rules: MergeRules) {
    let Value::Object(p) = patch else {
        *doc = patch.clone();
        return;
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut clean = p.clone();
            clean.remove("$patch");
            *doc = Value::Object(strip_directives(clean));
            return;
        }
        Some("delete") => {
            *doc = Value::Null;
            return;
        }
        _ => {}
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Value::Object(d) = doc else { return };
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        d.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (key, value) in p {
        if key.starts_with("$setElementOrder/") || key == "$retainKeys" || key == "$patch" {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(gone)) = (d.get_mut(field), value) {
                list.retain(|v| !gone.contains(v));
            }
            continue;
        }
        let child = node.field(key);
        match value {
            Value::Null => {
                d.remove(key);
            }
            Value::Object(_) if child.replaces() => {
                d.insert(key.clone(), clean(value.clone()));
            }
            Value::Object(_) => {
                let slot = d.entry(key.clone()).or_insert(Value::Null);
                strategic_merge(slot, value, child, rules);
                if slot.is_null() {
                    d.remove(key);
                }
            }
            Value::Array(items) => {
                let merged = match (d.get(key), rules.list_merge(&child)) {
                    (Some(Value::Array(existing)), ListMerge::ByKey(keys)) => {
                        merge_by_key(existing, items, &keys, child.items(), rules)
                    }
                    (Some(Value::Array(existing)), ListMerge::Set) => {
                        let mut out = existing.clone();
                        for v in items {
                            if !out.contains(v) {
                                out.push(v.clone());
                            }
                        }
                        out
                    }
                    _ => items.iter().filter(|i| i.get("$patch").is_none()).cloned().map(clean).collect(),
                };
                d.insert(key.clone(), Value::Array(merged));
            }
            other => {
                d.insert(key.clone(), other.clone());
            }
        }
    }
}

fn clean(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(strip_directives(m)),
        Value::Array(a) => Value::Array(a.into_iter().map(clean).collect()),
        other => other,
    }
}

fn strip_directives(m: Map<String, Value>) -> Map<String, Value> {
    m.into_iter().filter(|(k, _)| !k.starts_with('$')).map(|(k, v)| (k, clean(v))).collect()
}

/// Whether two list items have the same values at every key.
pub fn same_item(a: &Value, b: &Value, keys: &[String]) -> bool {
    keys.iter().all(|k| a.get(k).is_some() && a.get(k) == b.get(k))
}

fn merge_by_key(
    existing: &[Value],
    patch: &[Value],
    keys: &[String],
    items: SchemaNode,
    rules: MergeRules,
) -> Vec<Value> {
    let mut out: Vec<Value> = existing.to_vec();
    for item in patch {
        let pos = out.iter().position(|e| same_item(item, e, keys));
        let directive = item.get("$patch").and_then(Value::as_str);
        match (pos, directive) {
            (Some(i), Some("delete")) => {
                out.remove(i);
            }
            (None, Some("delete")) => {}
            (Some(i), Some("replace")) => out[i] = clean(item.clone()),
            (Some(i), _) => strategic_merge(&mut out[i], item, items, rules),
            (None, _) => out.push(clean(item.clone())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::patch::patch_meta::SchemaSet;
    use serde_json::json;

    fn schema<K: schemars::JsonSchema>() -> SchemaSet {
        let mut generator = schemars::generate::SchemaSettings::openapi3().into_generator();
        let _ = generator.subschema_for::<K>();
        let mut components = generator.take_definitions(true);
        crate::apiserver::builtin_schemas::tests::annotate(&mut components);
        SchemaSet::new(K::schema_name().into_owned(), components)
    }

    fn smp<K: schemars::JsonSchema>(doc: &mut Value, patch: &Value) {
        let set = schema::<K>();
        strategic_merge(doc, patch, SchemaNode::root(&set), MergeRules::Strategic);
    }

    #[test]
    fn containers_merge_by_name_and_env_too() {
        let mut doc = json!({"spec": {"containers": [
            {"name": "a", "image": "x:1", "env": [{"name": "A", "value": "1"}]},
            {"name": "b", "image": "y:1"}
        ], "tolerations": [{"key": "k"}]}});
        let patch = json!({"spec": {"containers": [
            {"name": "a", "image": "x:2", "env": [{"name": "B", "value": "2"}]},
            {"name": "b", "$patch": "delete"},
            {"name": "c", "image": "z"}
        ], "tolerations": [{"key": "other"}]}});
        smp::<k8s_openapi::api::core::v1::Pod>(&mut doc, &patch);
        let cs = doc["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[0]["image"], "x:2");
        assert_eq!(cs[0]["env"].as_array().unwrap().len(), 2);
        assert_eq!(cs[1]["name"], "c");
        assert_eq!(doc["spec"]["tolerations"], json!([{"key": "other"}]));
    }

    #[test]
    fn nulls_delete_and_finalizers_union() {
        let mut doc = json!({"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x"]}});
        smp::<k8s_openapi::api::core::v1::Pod>(
            &mut doc,
            &json!({"metadata": {"labels": {"a": null}, "finalizers": ["y"]}}),
        );
        assert_eq!(doc["metadata"]["labels"], json!({"b": "2"}));
        assert_eq!(doc["metadata"]["finalizers"], json!(["x", "y"]));
        smp::<k8s_openapi::api::core::v1::Pod>(
            &mut doc,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}),
        );
        assert_eq!(doc["metadata"]["finalizers"], json!(["y"]));
    }

    #[test]
    fn ports_merge_by_their_own_key_in_each_type() {
        // A Service's ports merge by port, a container's by containerPort.
        let mut svc = json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}});
        smp::<k8s_openapi::api::core::v1::Service>(
            &mut svc,
            &json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}]}}),
        );
        assert_eq!(svc["spec"]["ports"].as_array().map(Vec::len), Some(2), "{svc}");
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080);
        // An unknown field named like a merged list is replaced, not merged.
        let mut cm = json!({"data": {"a": "1"}, "containers": [{"name": "x"}]});
        smp::<k8s_openapi::api::core::v1::ConfigMap>(&mut cm, &json!({"containers": [{"name": "y"}]}));
        assert_eq!(cm["containers"], json!([{"name": "y"}]));
        // readinessGates have no merge key upstream: replaced.
        let mut pod = json!({"spec": {"readinessGates": [{"conditionType": "a"}]}});
        smp::<k8s_openapi::api::core::v1::Pod>(
            &mut pod,
            &json!({"spec": {"readinessGates": [{"conditionType": "b"}]}}),
        );
        assert_eq!(pod["spec"]["readinessGates"], json!([{"conditionType": "b"}]));
        // A PodDisruptionBudget's selector is replaced whole (patchStrategy=replace).
        let mut pdb = json!({"spec": {"selector": {"matchLabels": {"a": "1"}}}});
        smp::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(
            &mut pdb,
            &json!({"spec": {"selector": {"matchLabels": {"b": "2"}}}}),
        );
        assert_eq!(pdb["spec"]["selector"], json!({"matchLabels": {"b": "2"}}));
    }
}

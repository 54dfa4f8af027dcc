//! Strategic merge patch: a JSON merge patch in which lists of objects are
//! merged by their merge key instead of replaced, with the `$patch`,
//! `$retainKeys`, `$setElementOrder` and `$deleteFromPrimitiveList`
//! directives. The merge keys are those of the Kubernetes API types
//! (`x-kubernetes-patch-merge-key` in their schema).

use serde_json::{Map, Value};

/// How a list field merges.
pub enum ListMerge {
    /// Objects merged by this key.
    ByKey(&'static str),
    /// A primitive list merged as a set (finalizers).
    Set,
    /// Replaced as a whole.
    Replace,
}

/// The merge strategy of a list field, from the field's name and its items.
pub fn list_merge(field: &str, items: &[Value]) -> ListMerge {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates"
        | "resizePolicy" => ListMerge::ByKey("name"),
        "volumeMounts" => ListMerge::ByKey("mountPath"),
        "volumeDevices" => ListMerge::ByKey("devicePath"),
        "hostAliases" => ListMerge::ByKey("ip"),
        "conditions" => ListMerge::ByKey("type"),
        "readinessGates" => ListMerge::ByKey("conditionType"),
        "ownerReferences" => ListMerge::ByKey("uid"),
        "topologySpreadConstraints" => ListMerge::ByKey("topologyKey"),
        "ports" => {
            if items.iter().any(|i| i.get("containerPort").is_some()) {
                ListMerge::ByKey("containerPort")
            } else {
                ListMerge::ByKey("port")
            }
        }
        "finalizers" => ListMerge::Set,
        _ => ListMerge::Replace,
    }
}

/// Applies `patch` to `doc` with strategic-merge semantics.
pub fn strategic_merge(doc: &mut Value, patch: &Value) {
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
        match value {
            Value::Null => {
                d.remove(key);
            }
            Value::Object(_) => {
                let slot = d.entry(key.clone()).or_insert(Value::Null);
                strategic_merge(slot, value);
                if slot.is_null() {
                    d.remove(key);
                }
            }
            Value::Array(items) => {
                let merged = match (d.get(key), list_merge(key, items)) {
                    (Some(Value::Array(existing)), ListMerge::ByKey(mk)) => merge_by_key(existing, items, mk),
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
        other => other,
    }
}

fn strip_directives(m: Map<String, Value>) -> Map<String, Value> {
    m.into_iter().filter(|(k, _)| !k.starts_with('$')).map(|(k, v)| (k, clean(v))).collect()
}

fn merge_by_key(existing: &[Value], patch: &[Value], key: &str) -> Vec<Value> {
    let mut out: Vec<Value> = existing.to_vec();
    for item in patch {
        let id = item.get(key);
        let pos = id.and_then(|id| out.iter().position(|e| e.get(key) == Some(id)));
        let directive = item.get("$patch").and_then(Value::as_str);
        match (pos, directive) {
            (Some(i), Some("delete")) => {
                out.remove(i);
            }
            (None, Some("delete")) => {}
            (Some(i), Some("replace")) => out[i] = clean(item.clone()),
            (Some(i), _) => strategic_merge(&mut out[i], item),
            (None, _) => out.push(clean(item.clone())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        strategic_merge(&mut doc, &patch);
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
        strategic_merge(&mut doc, &json!({"metadata": {"labels": {"a": null}, "finalizers": ["y"]}}));
        assert_eq!(doc["metadata"]["labels"], json!({"b": "2"}));
        assert_eq!(doc["metadata"]["finalizers"], json!(["x", "y"]));
        strategic_merge(&mut doc, &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}));
        assert_eq!(doc["metadata"]["finalizers"], json!(["y"]));
    }
}

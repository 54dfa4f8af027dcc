//! Field ownership (`metadata.managedFields`) and server-side apply.
//! Every write records which fields its manager set, in upstream's
//! FieldsV1 form (`f:` fields, `k:` keyed list items, `v:` set members,
//! `.` for an item itself). An apply sets exactly the fields of its
//! configuration, removes the fields its previous apply set and this one
//! does not, and conflicts with other managers that own a field it would
//! change, unless forced.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use super::meta;
use super::patch_meta::{ListMerge, SchemaNode};
use super::status::{ApiError, Cause};
use super::strategic::{strategic_merge, MergeRules};

type Path = Vec<String>;
type FieldSet = BTreeSet<Path>;

/// Metadata fields nobody owns.
const UNOWNED_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "managedFields",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "generateName",
];

/// `k:{"name":"c"}`: a keyed list item (keys in sorted order, as upstream).
fn key_element(keys: &[String], item: &Value) -> Option<String> {
    let mut id = Map::new();
    for k in keys {
        id.insert(k.clone(), item.get(k)?.clone());
    }
    Some(format!("k:{}", Value::Object(id)))
}

/// Adds the fields `v` sets under `prefix`. With `other`, the value at the
/// same place in another version of the object, a field whose value equals
/// the other's is left out with everything under it (inside objects; list
/// items are matched by key, so lists are walked whole).
fn collect(v: &Value, other: Option<&Value>, node: SchemaNode, prefix: &mut Path, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                if prefix.is_empty() && (k == "apiVersion" || k == "kind") {
                    continue;
                }
                if prefix.len() == 1 && prefix[0] == "f:metadata" && UNOWNED_META.contains(&k.as_str()) {
                    continue;
                }
                let counterpart = other.and_then(|o| o.get(k));
                if counterpart == Some(c) {
                    continue;
                }
                prefix.push(format!("f:{k}"));
                collect(c, counterpart, node.field(k), prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => match node.apply_list_merge() {
            ListMerge::ByKey(keys) => {
                for item in items {
                    let Some(el) = key_element(&keys, item) else {
                        out.insert(prefix.clone());
                        return;
                    };
                    prefix.push(el);
                    let mut dot = prefix.clone();
                    dot.push(".".into());
                    out.insert(dot);
                    if let Value::Object(m) = item {
                        for (k, c) in m {
                            prefix.push(format!("f:{k}"));
                            collect(c, None, node.items().field(k), prefix, out);
                            prefix.pop();
                        }
                    }
                    prefix.pop();
                }
            }
            ListMerge::Set => {
                for item in items {
                    prefix.push(format!("v:{item}"));
                    out.insert(prefix.clone());
                    prefix.pop();
                }
            }
            ListMerge::Replace => {
                out.insert(prefix.clone());
            }
        },
        _ => {
            if !prefix.is_empty() {
                out.insert(prefix.clone());
            }
        }
    }
}

/// The fields an object sets.
pub fn field_set(obj: &Value, node: SchemaNode) -> FieldSet {
    let mut out = FieldSet::new();
    collect(obj, None, node, &mut Vec::new(), &mut out);
    out
}

/// The fields `obj` sets whose values may differ from `other`'s: a superset
/// of those that do, without the subtrees the two hold equal.
fn field_set_unlike(obj: &Value, other: &Value, node: SchemaNode) -> FieldSet {
    let mut out = FieldSet::new();
    collect(obj, Some(other), node, &mut Vec::new(), &mut out);
    out
}

/// FieldsV1 JSON of a set.
pub fn encode(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for el in path {
            let next = node.entry(el.clone()).or_insert_with(|| json!({}));
            node = match next {
                Value::Object(m) => m,
                _ => return Value::Object(root),
            };
        }
    }
    Value::Object(root)
}

fn decode_into(node: &Map<String, Value>, prefix: &mut Path, out: &mut FieldSet) {
    for (k, child) in node {
        prefix.push(k.clone());
        match child.as_object() {
            Some(m) if !m.is_empty() => decode_into(m, prefix, out),
            _ => {
                out.insert(prefix.clone());
            }
        }
        prefix.pop();
    }
}

pub fn decode(fields: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    if let Some(m) = fields.as_object() {
        decode_into(m, &mut Vec::new(), &mut out);
    }
    out
}

/// The value a path points at, if present.
fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut v = obj;
    for el in path {
        if el == "." {
            return Some(v);
        }
        if let Some(f) = el.strip_prefix("f:") {
            v = v.get(f)?;
        } else if let Some(k) = el.strip_prefix("k:") {
            let want: Map<String, Value> = serde_json::from_str(k).ok()?;
            v = v.as_array()?.iter().find(|item| want.iter().all(|(wk, wv)| item.get(wk) == Some(wv)))?;
        } else if let Some(m) = el.strip_prefix("v:") {
            let want: Value = serde_json::from_str(m).ok()?;
            return v.as_array()?.iter().find(|x| **x == want);
        } else {
            return None;
        }
    }
    Some(v)
}

/// Removes what a path points at.
fn remove_at(obj: &mut Value, path: &[String]) {
    let Some((last, parent_path)) = path.split_last() else { return };
    if last == "." {
        return remove_at(obj, parent_path);
    }
    let mut v = obj;
    for el in parent_path {
        let next = if let Some(f) = el.strip_prefix("f:") {
            v.get_mut(f)
        } else if let Some(k) = el.strip_prefix("k:") {
            let want: Map<String, Value> = match serde_json::from_str(k) {
                Ok(w) => w,
                Err(_) => return,
            };
            v.as_array_mut()
                .and_then(|a| a.iter_mut().find(|item| want.iter().all(|(wk, wv)| item.get(wk) == Some(wv))))
        } else {
            None
        };
        match next {
            Some(n) => v = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = v.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(k) = last.strip_prefix("k:") {
        if let (Ok(want), Some(a)) = (serde_json::from_str::<Map<String, Value>>(k), v.as_array_mut()) {
            a.retain(|item| !want.iter().all(|(wk, wv)| item.get(wk) == Some(wv)));
        }
    } else if let Some(m) = last.strip_prefix("v:") {
        if let (Ok(want), Some(a)) = (serde_json::from_str::<Value>(m), v.as_array_mut()) {
            a.retain(|x| *x != want);
        }
    }
}

fn path_string(path: &[String]) -> String {
    path.iter()
        .filter(|e| *e != ".")
        .map(|e| {
            if let Some(f) = e.strip_prefix("f:") {
                format!(".{f}")
            } else if let Some(k) = e.strip_prefix("k:") {
                format!("[{}]", k.trim_start_matches('{').trim_end_matches('}').replace('"', "").replace(':', "="))
            } else if let Some(v) = e.strip_prefix("v:") {
                format!("[{v}]")
            } else {
                e.clone()
            }
        })
        .collect()
}

struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    subresource: Option<String>,
    set: FieldSet,
    raw: Value,
}

fn entries(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| Entry {
                    manager: e["manager"].as_str().unwrap_or_default().to_string(),
                    operation: e["operation"].as_str().unwrap_or_default().to_string(),
                    api_version: e["apiVersion"].as_str().unwrap_or_default().to_string(),
                    subresource: e["subresource"].as_str().map(str::to_string),
                    set: decode(&e["fieldsV1"]),
                    raw: e.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn store_entries(obj: &mut Value, list: Vec<Entry>) {
    let values: Vec<Value> = list
        .into_iter()
        .filter(|e| !e.set.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.raw.get("time").cloned().unwrap_or_else(|| json!(meta::now_rfc3339())),
                "fieldsType": "FieldsV1",
                "fieldsV1": encode(&e.set),
            });
            if let Some(s) = e.subresource {
                v["subresource"] = json!(s);
            }
            v
        })
        .collect();
    let m = meta::metadata_mut(obj);
    if values.is_empty() {
        m.remove("managedFields");
    } else {
        m.insert("managedFields".into(), Value::Array(values));
    }
}

/// Who writes, in which version, and the schema of what is written.
#[derive(Clone, Copy)]
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub schema: SchemaNode<'a>,
}

/// Records a non-apply write: the fields `manager` changed become its own.
pub fn record_update(old: Option<&Value>, new: &mut Value, writer: &Writer, subresource: Option<&str>) {
    let Writer { manager, api_version, schema } = *writer;
    let mut list = entries(old.unwrap_or(&Value::Null));
    // Fields in subtrees old and new hold equal are neither changed nor gone:
    // only where they differ is walked.
    let changed: FieldSet = match old {
        None => field_set(new, schema),
        Some(o) => {
            field_set_unlike(new, o, schema).into_iter().filter(|p| value_at(o, p) != value_at(new, p)).collect()
        }
    };
    let gone: FieldSet = old
        .map(|o| field_set_unlike(o, new, schema))
        .unwrap_or_default()
        .into_iter()
        .filter(|p| value_at(new, p).is_none())
        .collect();
    for e in list.iter_mut() {
        e.set.retain(|p| !changed.contains(p) && !gone.contains(p));
    }
    let mine = list
        .iter()
        .position(|e| e.manager == manager && e.operation == "Update" && e.subresource.as_deref() == subresource);
    let idx = match mine {
        Some(i) => i,
        None => {
            list.push(Entry {
                manager: manager.to_string(),
                operation: "Update".into(),
                api_version: api_version.to_string(),
                subresource: subresource.map(str::to_string),
                set: FieldSet::new(),
                raw: json!({}),
            });
            list.len() - 1
        }
    };
    if !changed.is_empty() {
        list[idx].raw = json!({"time": meta::now_rfc3339()});
    }
    list[idx].set.extend(changed);
    store_entries(new, list);
}

/// Server-side apply of `config` by `manager` onto `live` (None: create).
pub fn apply(live: Option<&Value>, config: &Value, writer: &Writer, force: bool) -> Result<Value, ApiError> {
    let Writer { manager, api_version, schema } = *writer;
    let applied = field_set(config, schema);
    let mut list = entries(live.unwrap_or(&Value::Null));
    let mut conflicts = Vec::new();
    if let Some(live) = live {
        for e in &list {
            if e.manager == manager && e.operation == "Apply" {
                continue;
            }
            for p in e.set.intersection(&applied) {
                if p.last().is_some_and(|l| l == ".") {
                    continue;
                }
                if value_at(live, p) != value_at(config, p) {
                    conflicts.push((e.manager.clone(), e.api_version.clone(), p.clone()));
                }
            }
        }
    }
    if !conflicts.is_empty() && !force {
        let causes: Vec<Cause> = conflicts
            .iter()
            .map(|(m, av, p)| Cause {
                reason: "FieldManagerConflict",
                message: format!("conflict with \"{m}\" using {av}"),
                field: path_string(p),
            })
            .collect();
        let lines: Vec<String> = conflicts
            .iter()
            .map(|(m, av, p)| format!("conflict with \"{m}\" using {av}: {}", path_string(p)))
            .collect();
        let message = if lines.len() == 1 {
            format!("Apply failed with 1 conflict: {}", lines[0])
        } else {
            format!("Apply failed with {} conflicts: {}", lines.len(), lines.join("\n"))
        };
        let mut err = ApiError::new(409, "Conflict", message);
        err.causes = causes;
        return Err(err);
    }
    let mut merged = live.cloned().unwrap_or_else(|| json!({}));
    let previous: FieldSet =
        list.iter().filter(|e| e.manager == manager && e.operation == "Apply").flat_map(|e| e.set.clone()).collect();
    let mut config_clean = config.clone();
    if let Some(m) = config_clean.pointer_mut("/metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
        m.remove("resourceVersion");
    }
    strategic_merge(&mut merged, &config_clean, schema, MergeRules::Apply);
    // Fields this manager applied before and no longer does go away,
    // unless someone else owns them too.
    for p in previous.difference(&applied) {
        let others = list.iter().any(|e| !(e.manager == manager && e.operation == "Apply") && e.set.contains(p));
        if !others {
            remove_at(&mut merged, p);
        }
    }
    for e in list.iter_mut() {
        if e.manager == manager && e.operation == "Apply" {
            continue;
        }
        // Forced or equal-valued fields: taken over (forced) or shared (equal).
        let taken: Vec<Path> =
            e.set.intersection(&applied).filter(|p| conflicts.iter().any(|(_, _, c)| c == *p)).cloned().collect();
        for p in taken {
            e.set.remove(&p);
        }
    }
    list.retain(|e| !(e.manager == manager && e.operation == "Apply"));
    list.push(Entry {
        manager: manager.to_string(),
        operation: "Apply".into(),
        api_version: api_version.to_string(),
        subresource: None,
        set: applied,
        raw: json!({"time": meta::now_rfc3339()}),
    });
    store_entries(&mut merged, list);
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer<'a>(set: &'a crate::apiserver::patch_meta::SchemaSet, manager: &'a str) -> Writer<'a> {
        Writer { manager, api_version: "apps/v1", schema: SchemaNode::root(set) }
    }

    fn deployment_schema() -> crate::apiserver::patch_meta::SchemaSet {
        use crate::apiserver::strategy::Strategy;
        let strategy =
            crate::apiserver::strategy::Typed::<k8s_openapi::api::apps::v1::Deployment>::new(Default::default());
        std::sync::Arc::unwrap_or_clone(strategy.patch_schema().expect("schema"))
    }

    fn deploy(replicas: i64, image: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "labels": {"a": "1"}},
               "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "c", "image": image}]}}}})
    }

    #[test]
    fn fields_round_trip_through_fields_v1() {
        let schema = deployment_schema();
        let set = field_set(&deploy(1, "x"), SchemaNode::root(&schema));
        assert!(set.contains(&vec!["f:spec".to_string(), "f:replicas".to_string()]));
        assert!(set.iter().any(|p| p.iter().any(|e| e == "k:{\"name\":\"c\"}")));
        assert_eq!(decode(&encode(&set)), set);
    }

    #[test]
    fn apply_conflicts_and_force() {
        let schema = deployment_schema();
        let (me, scaler) = (writer(&schema, "me"), writer(&schema, "kubectl-scale"));
        let created = apply(None, &deploy(1, "x"), &me, false).unwrap();
        let mut scaled = created.clone();
        scaled["spec"]["replicas"] = json!(5);
        record_update(Some(&created), &mut scaled, &scaler, None);
        let err = apply(Some(&scaled), &deploy(1, "y"), &me, false).unwrap_err();
        assert_eq!(err.code, 409);
        assert!(err.message.contains("conflict with \"kubectl-scale\""), "{}", err.message);
        assert!(err.message.ends_with(".spec.replicas"), "{}", err.message);
        let forced = apply(Some(&scaled), &deploy(1, "y"), &me, true).unwrap();
        assert_eq!(forced["spec"]["replicas"], 1);
        // A field dropped from the configuration is removed.
        let mut smaller = deploy(1, "y");
        smaller["metadata"].as_object_mut().unwrap().remove("labels");
        let after = apply(Some(&forced), &smaller, &me, false).unwrap();
        assert!(after.pointer("/metadata/labels/a").is_none(), "{after}");
    }

    #[test]
    fn updates_take_only_the_fields_they_change_or_remove() {
        let schema = deployment_schema();
        let (creator, editor) = (writer(&schema, "creator"), writer(&schema, "editor"));
        let mut created = deploy(1, "x");
        record_update(None, &mut created, &creator, None);
        let mut edited = created.clone();
        edited["metadata"]["labels"]["b"] = json!("2");
        edited["spec"]["template"]["spec"]["containers"][0]["image"] = json!("y");
        edited["spec"].as_object_mut().unwrap().remove("replicas");
        record_update(Some(&created), &mut edited, &editor, None);
        let owned = |who: &str| -> FieldSet {
            entries(&edited).into_iter().find(|e| e.manager == who).map(|e| e.set).unwrap_or_default()
        };
        let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Path>();
        let image = ["f:spec", "f:template", "f:spec", "f:containers", "k:{\"name\":\"c\"}", "f:image"];
        let editors = owned("editor");
        let item = ["f:spec", "f:template", "f:spec", "f:containers", "k:{\"name\":\"c\"}", "."];
        assert_eq!(
            editors,
            [path(&["f:metadata", "f:labels", "f:b"]), path(&item), path(&image)].into_iter().collect()
        );
        let creators = owned("creator");
        assert!(creators.contains(&path(&["f:metadata", "f:labels", "f:a"])));
        assert!(creators.contains(&path(&[
            "f:spec",
            "f:template",
            "f:spec",
            "f:containers",
            "k:{\"name\":\"c\"}",
            "f:name"
        ])));
        assert!(!creators.contains(&path(&image)));
        assert!(!creators.contains(&path(&["f:spec", "f:replicas"])), "a removed field is no one's");
    }
}

//! Field ownership (`metadata.managedFields`) and server-side apply.
//! Every write records which fields its manager set, in upstream's
//! FieldsV1 form (`f:` fields, `k:` keyed list items, `v:` set members,
//! `.` for an item itself). An apply sets exactly the fields of its
//! configuration, removes the fields its previous apply set and this one
//! does not, and conflicts with other managers that own a field it would
//! change, unless forced.

mod field_set;

use serde_json::{json, Value};

use super::patch_meta::SchemaNode;
use super::strategic::{strategic_merge, MergeRules};
use crate::apiserver::meta;
use crate::apiserver::status::{ApiError, Cause};
use field_set::{
    decode, encode, field_set, field_set_unlike, fields_v1, path_string, remove_at, value_at, FieldSet, Path,
};

struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    subresource: Option<String>,
    set: FieldSet,
    raw: Value,
}

impl Entry {
    /// A stored entry, its fields decoded.
    fn of(raw: Value) -> Entry {
        Entry {
            manager: raw["manager"].as_str().unwrap_or_default().to_string(),
            operation: raw["operation"].as_str().unwrap_or_default().to_string(),
            api_version: raw["apiVersion"].as_str().unwrap_or_default().to_string(),
            subresource: raw["subresource"].as_str().map(str::to_string),
            set: decode(&raw["fieldsV1"]),
            raw,
        }
    }

    /// Its stored form; None when it owns nothing.
    fn stored(self) -> Option<Value> {
        if self.set.is_empty() {
            return None;
        }
        let time = self.raw.get("time").cloned().unwrap_or_else(|| json!(meta::now_rfc3339()));
        let fields = encode(&self.set);
        Some(managed_entry(self.manager, self.operation, self.api_version, time, fields, self.subresource))
    }
}

fn entries(obj: &Value) -> Vec<Entry> {
    stored_entries(obj).iter().cloned().map(Entry::of).collect()
}

fn stored_entries(obj: &Value) -> &[Value] {
    obj.pointer("/metadata/managedFields").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn store_entries(obj: &mut Value, list: Vec<Entry>) {
    let values: Vec<Value> = list.into_iter().filter_map(Entry::stored).collect();
    set_managed_fields(obj, values);
}

/// An entry of an update: kept as stored (it owns none of the fields the
/// update changed or removed) or decoded to be changed.
enum Slot {
    Kept(Value),
    Open(Entry),
}

impl Slot {
    /// Its stored form; None when it owns nothing.
    fn stored(self) -> Option<Value> {
        match self {
            Slot::Kept(raw) => Some(raw),
            Slot::Open(e) => e.stored(),
        }
    }
}

/// Whether the FieldsV1 tree `fields` holds `path` as one of its fields
/// (a leaf, as `decode` finds them).
fn owns(fields: &Value, path: &[String]) -> bool {
    let mut node = fields;
    for el in path {
        match node.get(el) {
            Some(n) => node = n,
            None => return false,
        }
    }
    node.as_object().is_none_or(|m| m.is_empty())
}

/// `old`'s entries: taken from `new` when it holds them unchanged (an
/// update carries the stored managedFields over), copied otherwise.
fn take_entries(new: &mut Value, old: &Value) -> Vec<Value> {
    let stored = old.pointer("/metadata/managedFields");
    match new.pointer_mut("/metadata/managedFields") {
        Some(carried) if Some(&*carried) == stored => match carried.take() {
            Value::Array(a) => a,
            _ => Vec::new(),
        },
        _ => stored_entries(old).to_vec(),
    }
}

/// One entry of `metadata.managedFields`.
fn managed_entry(
    manager: String,
    operation: String,
    api_version: String,
    time: Value,
    fields: Value,
    subresource: Option<String>,
) -> Value {
    // Built in place: `json!` would copy `fields` (to_value of a reference).
    let mut m = serde_json::Map::new();
    m.insert("manager".into(), Value::String(manager));
    m.insert("operation".into(), Value::String(operation));
    m.insert("apiVersion".into(), Value::String(api_version));
    m.insert("time".into(), time);
    m.insert("fieldsType".into(), Value::String("FieldsV1".into()));
    m.insert("fieldsV1".into(), fields);
    if let Some(s) = subresource {
        m.insert("subresource".into(), Value::String(s));
    }
    Value::Object(m)
}

fn set_managed_fields(obj: &mut Value, values: Vec<Value>) {
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
    let Some(old) = old else {
        // A create: every field the object sets is the writer's, recorded
        // without a path per field.
        let fields = fields_v1(new, schema);
        let values = match fields.as_object().is_some_and(|f| !f.is_empty()) {
            true => vec![managed_entry(
                manager.to_string(),
                "Update".into(),
                api_version.to_string(),
                json!(meta::now_rfc3339()),
                fields,
                subresource.map(str::to_string),
            )],
            false => Vec::new(),
        };
        set_managed_fields(new, values);
        return;
    };
    // Fields in subtrees old and new hold equal are neither changed nor gone:
    // only where they differ is walked.
    let changed: FieldSet =
        field_set_unlike(new, old, schema).into_iter().filter(|p| value_at(old, p) != value_at(new, p)).collect();
    let gone: FieldSet =
        field_set_unlike(old, new, schema).into_iter().filter(|p| value_at(new, p).is_none()).collect();
    let is_mine = |manager_of: &str, operation: &str, sub: Option<&str>| {
        manager_of == manager && operation == "Update" && sub == subresource
    };
    // Only the entries that lose a field, and the writer's own when it
    // gains one, are decoded and encoded again; the others (most, for a
    // patch of an annotation) are kept as they were stored.
    let mut writers_kept = false;
    let mut slots = Vec::new();
    for mut raw in take_entries(new, old) {
        let fields = &raw["fieldsV1"];
        let owns_any = fields.as_object().is_some_and(|f| !f.is_empty());
        let loses_any = changed.iter().chain(&gone).any(|p| owns(fields, p));
        let writers = is_mine(
            raw["manager"].as_str().unwrap_or_default(),
            raw["operation"].as_str().unwrap_or_default(),
            raw["subresource"].as_str(),
        );
        if !writers && owns_any && !loses_any {
            slots.push(Slot::Kept(raw));
        } else if writers
            && owns_any
            && changed.iter().all(|p| owns(fields, p))
            && !gone.iter().any(|p| owns(fields, p))
        {
            // The writer changed only fields it owns already (a status
            // written again, an annotation renewed): its fields stay as
            // they are, and only the time moves.
            if !changed.is_empty() || raw.get("time").is_none() {
                raw["time"] = json!(meta::now_rfc3339());
            }
            writers_kept = true;
            slots.push(Slot::Kept(raw));
        } else {
            let mut e = Entry::of(raw);
            e.set.retain(|p| !changed.contains(p) && !gone.contains(p));
            slots.push(Slot::Open(e));
        }
    }
    if writers_kept {
        set_managed_fields(new, slots.into_iter().filter_map(Slot::stored).collect());
        return;
    }
    let mine = slots
        .iter()
        .position(|s| matches!(s, Slot::Open(e) if is_mine(&e.manager, &e.operation, e.subresource.as_deref())));
    let idx = match mine {
        Some(i) => i,
        None => {
            slots.push(Slot::Open(Entry {
                manager: manager.to_string(),
                operation: "Update".into(),
                api_version: api_version.to_string(),
                subresource: subresource.map(str::to_string),
                set: FieldSet::new(),
                raw: json!({}),
            }));
            slots.len() - 1
        }
    };
    if let Slot::Open(e) = &mut slots[idx] {
        if !changed.is_empty() {
            e.raw = json!({"time": meta::now_rfc3339()});
        }
        e.set.extend(changed);
    }
    set_managed_fields(new, slots.into_iter().filter_map(Slot::stored).collect());
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
    // unless someone else owns them too, or they still hold fields that
    // are applied or owned (an empty `data: {}` applied before is the
    // parent of the `data.key1` applied now, not a field to remove).
    let under = |parent: &Path, p: &Path| p.len() >= parent.len() && p[..parent.len()] == parent[..];
    for p in previous.difference(&applied) {
        let others = list
            .iter()
            .any(|e| !(e.manager == manager && e.operation == "Apply") && e.set.iter().any(|owned| under(p, owned)));
        let still_applied = applied.iter().any(|a| under(p, a));
        if !others && !still_applied {
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

    fn writer<'a>(set: &'a crate::apiserver::patch::patch_meta::SchemaSet, manager: &'a str) -> Writer<'a> {
        Writer { manager, api_version: "apps/v1", schema: SchemaNode::root(set) }
    }

    fn deployment_schema() -> crate::apiserver::patch::patch_meta::SchemaSet {
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
    fn a_create_records_the_fields_of_the_whole_object_as_the_path_sets_do() {
        let schemas = deployment_schema();
        let schema = writer(&schemas, "m").schema;
        let mut d = deploy(3, "nginx");
        d["metadata"]["labels"] = json!({"app": "web"});
        d["metadata"]["finalizers"] = json!(["a", "b"]);
        d["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .expect("containers")
            .push(json!({"name": "side", "image": "busybox", "ports": [{"containerPort": 80}, {"containerPort": 80}]}));
        d["spec"]["template"]["spec"]["containers"][0]["env"] = json!([]);
        d["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["a", "b"]);
        d["spec"]["strategy"] = json!({});
        for obj in [d, json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "only-unowned"}}), json!({})] {
            assert_eq!(fields_v1(&obj, schema), encode(&field_set(&obj, schema)), "{obj}");
        }
        // A keyed list with an item lacking its key: the list itself, as with paths.
        let keyless =
            json!({"spec": {"template": {"spec": {"containers": [{"name": "a"}, {"image": "x"}, {"name": "b"}]}}}});
        assert_eq!(fields_v1(&keyless, schema), encode(&field_set(&keyless, schema)));
        let mut created = deploy(1, "nginx");
        record_update(None, &mut created, &writer(&schemas, "kubectl"), None);
        let entry = &created["metadata"]["managedFields"][0];
        assert_eq!((entry["manager"].as_str(), entry["operation"].as_str()), (Some("kubectl"), Some("Update")));
        assert_eq!(entry["fieldsV1"], encode(&field_set(&deploy(1, "nginx"), schema)));
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
    fn an_empty_map_applied_before_is_the_parent_of_what_is_applied_now() {
        use crate::apiserver::strategy::Strategy;
        let strategy =
            crate::apiserver::strategy::Typed::<k8s_openapi::api::core::v1::ConfigMap>::new(Default::default());
        let schema = std::sync::Arc::unwrap_or_clone(strategy.patch_schema().expect("schema"));
        let me = Writer { manager: "m", api_version: "v1", schema: SchemaNode::root(&schema) };
        let cm =
            |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data});
        let mut live = apply(None, &cm(json!({"key1": "a", "key2": "b"})), &me, false).unwrap();
        for (config, want) in [
            (json!({"key2": "b", "key3": "c"}), json!({"key2": "b", "key3": "c"})),
            (json!({}), json!({})),
            (json!({"key1": "new value"}), json!({"key1": "new value"})),
        ] {
            live = apply(Some(&live), &cm(config), &me, false).unwrap();
            assert_eq!(live["data"], want);
        }
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

    /// A writer that changes again only fields it owns keeps its entry as
    /// it was but for the time: the same as decoding and encoding it.
    #[test]
    fn a_writer_renewing_its_own_fields_keeps_its_entry() {
        let schema = deployment_schema();
        let editor = writer(&schema, "editor");
        let mut created = deploy(1, "x");
        record_update(None, &mut created, &writer(&schema, "creator"), None);
        let mut first = created.clone();
        first["metadata"]["labels"]["b"] = json!("1");
        record_update(Some(&created), &mut first, &editor, None);
        let entry = |obj: &Value, who: &str| -> Value {
            stored_entries(obj).iter().find(|e| e["manager"] == who).cloned().unwrap_or_default()
        };
        let mut stale = first.clone();
        for e in stale["metadata"]["managedFields"].as_array_mut().unwrap() {
            if e["manager"] == "editor" {
                e["time"] = json!("2020-01-01T00:00:00Z");
            }
        }
        let mut again = stale.clone();
        again["metadata"]["labels"]["b"] = json!("2");
        record_update(Some(&stale), &mut again, &editor, None);
        let (before, after) = (entry(&stale, "editor"), entry(&again, "editor"));
        assert_eq!(after["fieldsV1"], before["fieldsV1"]);
        assert_ne!(after["time"], before["time"], "the time moves");
        let mut without_time = after.clone();
        without_time["time"] = before["time"].clone();
        assert_eq!(without_time, before, "nothing else of the entry changes");
        assert_eq!(entry(&again, "creator"), entry(&stale, "creator"));
        // A field it did not own yet is added, as before.
        let mut more = again.clone();
        more["metadata"]["labels"]["c"] = json!("3");
        record_update(Some(&again), &mut more, &editor, None);
        let label = |k: &str| vec!["f:metadata".to_string(), "f:labels".to_string(), format!("f:{k}")];
        assert_eq!(decode(&entry(&more, "editor")["fieldsV1"]), [label("b"), label("c")].into_iter().collect());
        // And one it no longer sets leaves its entry.
        let mut fewer = more.clone();
        fewer["metadata"]["labels"].as_object_mut().unwrap().remove("b");
        record_update(Some(&more), &mut fewer, &editor, None);
        assert_eq!(decode(&entry(&fewer, "editor")["fieldsV1"]), [label("c")].into_iter().collect());
    }

    #[test]
    fn entries_that_lose_no_field_are_kept_as_stored() {
        let schema = deployment_schema();
        let entry = |obj: &Value, who: &str| -> Value {
            stored_entries(obj).iter().find(|e| e["manager"] == who).cloned().unwrap_or_default()
        };
        let mut created = deploy(1, "x");
        record_update(None, &mut created, &writer(&schema, "creator"), None);
        // A label nobody owned: the creator's entry is untouched.
        let mut labelled = created.clone();
        labelled["metadata"]["labels"]["b"] = json!("2");
        record_update(Some(&created), &mut labelled, &writer(&schema, "editor"), None);
        assert_eq!(entry(&labelled, "creator"), entry(&created, "creator"));
        let b = vec!["f:metadata".to_string(), "f:labels".to_string(), "f:b".to_string()];
        assert_eq!(decode(&entry(&labelled, "editor")["fieldsV1"]), [b.clone()].into_iter().collect());
        // The creator's label: it leaves the creator's entry; the editor's
        // entry, which loses nothing, stays as it was.
        let mut relabelled = labelled.clone();
        relabelled["metadata"]["labels"]["a"] = json!("3");
        record_update(Some(&labelled), &mut relabelled, &writer(&schema, "other"), None);
        let a = vec!["f:metadata".to_string(), "f:labels".to_string(), "f:a".to_string()];
        assert!(!decode(&entry(&relabelled, "creator")["fieldsV1"]).contains(&a));
        assert!(decode(&entry(&relabelled, "creator")["fieldsV1"]).len() > 1);
        assert_eq!(entry(&relabelled, "editor"), entry(&labelled, "editor"));
        assert_eq!(decode(&entry(&relabelled, "other")["fieldsV1"]), [a].into_iter().collect());
    }
}

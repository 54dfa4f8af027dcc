//! Field sets: the paths of the fields a version of an object sets
//! (`f:` fields, `k:` keyed list items, `v:` set members, `.` for an item
//! itself), as upstream's structured-merge-diff finds them from the
//! schema's list types and keys, and their FieldsV1 JSON form.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use crate::apiserver::patch::patch_meta::{ListMerge, SchemaNode};

pub(super) type Path = Vec<String>;
pub(super) type FieldSet = BTreeSet<Path>;

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

/// Where in an object a field is, for the fields nobody owns.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Top {
    /// The object itself (its apiVersion and kind are unowned).
    Root,
    /// Its top-level metadata (`UNOWNED_META`).
    Metadata,
    Below,
}

impl Top {
    /// Where the fields of the object at `prefix` are.
    fn of(prefix: &[String]) -> Top {
        match prefix {
            [] => Top::Root,
            [m] if m == "f:metadata" => Top::Metadata,
            _ => Top::Below,
        }
    }

    /// Whether field `k` here is owned by nobody.
    fn unowned(self, k: &str) -> bool {
        match self {
            Top::Root => k == "apiVersion" || k == "kind",
            Top::Metadata => UNOWNED_META.contains(&k),
            Top::Below => false,
        }
    }

    /// Where the fields of field `k`'s value are.
    fn below(self, k: &str) -> Top {
        if self == Top::Root && k == "metadata" {
            Top::Metadata
        } else {
            Top::Below
        }
    }
}

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
            let top = Top::of(prefix);
            for (k, c) in m {
                if top.unowned(k) {
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

/// What `fields_of` found at one place of an object.
enum Found {
    /// Nothing owned here (an object of only unowned fields).
    Nothing,
    /// The place itself (a scalar, an empty value, an atomic list).
    Leaf,
    /// The fields under it, in FieldsV1 form.
    Fields(Map<String, Value>),
}

/// Merges `found` into `map[key]` (as two paths through one place merge in
/// `encode`).
fn put(map: &mut Map<String, Value>, key: String, found: Found) {
    let children = match found {
        Found::Nothing => return,
        Found::Leaf => Map::new(),
        Found::Fields(m) => m,
    };
    match map.entry(key) {
        serde_json::map::Entry::Occupied(mut place) => match place.get_mut() {
            Value::Object(existing) => {
                for (k, v) in children {
                    let found = match v {
                        Value::Object(m) if !m.is_empty() => Found::Fields(m),
                        _ => Found::Leaf,
                    };
                    put(existing, k, found);
                }
            }
            other => *other = Value::Object(children),
        },
        serde_json::map::Entry::Vacant(place) => {
            place.insert(Value::Object(children));
        }
    }
}

/// `prefix` followed by `key` (`f:name`), sized once.
fn prefixed(prefix: &str, key: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + key.len());
    s.push_str(prefix);
    s.push_str(key);
    s
}

/// `encode(field_set(v))` built directly, without a path per field: the
/// FieldsV1 of everything `v` sets (`collect` without `other`, in nested
/// form). `top` is where `v` is, for the fields nobody owns.
fn fields_of(v: &Value, node: SchemaNode, top: Top) -> Found {
    match v {
        Value::Object(m) if !m.is_empty() => {
            let mut out = Map::new();
            for (k, c) in m {
                if !top.unowned(k) {
                    put(&mut out, prefixed("f:", k), fields_of(c, node.field(k), top.below(k)));
                }
            }
            if out.is_empty() {
                Found::Nothing
            } else {
                Found::Fields(out)
            }
        }
        Value::Array(items) if !items.is_empty() => match node.apply_list_merge() {
            ListMerge::ByKey(keys) => {
                let mut out = Map::new();
                for item in items {
                    let Some(el) = key_element(&keys, item) else {
                        // As `collect`: the list itself, and no further item.
                        return if out.is_empty() { Found::Leaf } else { Found::Fields(out) };
                    };
                    let mut fields = Map::new();
                    fields.insert(".".into(), json!({}));
                    if let Value::Object(m) = item {
                        for (k, c) in m {
                            put(&mut fields, prefixed("f:", k), fields_of(c, node.items().field(k), Top::Below));
                        }
                    }
                    put(&mut out, el, Found::Fields(fields));
                }
                Found::Fields(out)
            }
            ListMerge::Set => {
                let mut out = Map::new();
                for item in items {
                    out.insert(format!("v:{item}"), json!({}));
                }
                Found::Fields(out)
            }
            ListMerge::Replace => Found::Leaf,
        },
        _ if top == Top::Root => Found::Nothing,
        _ => Found::Leaf,
    }
}

/// FieldsV1 JSON of every field an object sets (`encode(&field_set(..))`).
pub(super) fn fields_v1(obj: &Value, node: SchemaNode) -> Value {
    match fields_of(obj, node, Top::Root) {
        Found::Fields(m) => Value::Object(m),
        Found::Nothing | Found::Leaf => json!({}),
    }
}

/// The fields an object sets.
pub(super) fn field_set(obj: &Value, node: SchemaNode) -> FieldSet {
    let mut out = FieldSet::new();
    collect(obj, None, node, &mut Vec::new(), &mut out);
    out
}

/// The fields `obj` sets whose values may differ from `other`'s: a superset
/// of those that do, without the subtrees the two hold equal.
pub(super) fn field_set_unlike(obj: &Value, other: &Value, node: SchemaNode) -> FieldSet {
    let mut out = FieldSet::new();
    collect(obj, Some(other), node, &mut Vec::new(), &mut out);
    out
}

/// FieldsV1 JSON of a set.
pub(super) fn encode(set: &FieldSet) -> Value {
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

pub(super) fn decode(fields: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    if let Some(m) = fields.as_object() {
        decode_into(m, &mut Vec::new(), &mut out);
    }
    out
}

/// The value a path points at, if present.
pub(super) fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
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
pub(super) fn remove_at(obj: &mut Value, path: &[String]) {
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

pub(super) fn path_string(path: &[String]) -> String {
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

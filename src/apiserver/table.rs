//! `meta.k8s.io/v1` Table answers, which `kubectl get` asks for: a NAME
//! column, the resource's own columns, and each row's object metadata.

use serde_json::{json, Value};

use super::meta;

/// A column of a table.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: &'static str,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub kind: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    /// 0 is shown by default; 1 only with `-o wide`.
    pub priority: i32,
}

impl Column {
    pub const fn new(name: &'static str, kind: &'static str, priority: i32) -> Self {
        Column { name, kind, format: "", description: "", priority }
    }

    pub const fn age() -> Self {
        Column {
            name: "Age",
            kind: "string",
            format: "",
            description: "CreationTimestamp is a timestamp representing the server time when this object was created.",
            priority: 0,
        }
    }
}

/// Whether an Accept header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').any(|part| {
        let p = part.replace(' ', "");
        p.contains("as=Table") && p.contains("g=meta.k8s.io") && (p.contains("v=v1;") || p.ends_with("v=v1"))
    })
}

/// Whether the Accept header asks for a Table and for nothing else that
/// could be served instead (`application/json`, YAML, protobuf or a
/// wildcard without an `as=`): what a resource without table conversion
/// (the reviews, token requests) answers 406 Not Acceptable.
pub fn only_table_accepted(accept: &str) -> bool {
    let plain = accept.split(',').any(|part| {
        let p = part.replace(' ', "");
        let media = p.split(';').next().unwrap_or_default();
        let served = matches!(
            media,
            "application/json" | "application/yaml" | "application/vnd.kubernetes.protobuf" | "application/*" | "*/*"
        );
        served && !p.contains("as=")
    });
    wants_table(accept) && !plain
}

fn definitions(mut own: Vec<Column>) -> Vec<Value> {
    let mut cols = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
    })];
    if own.is_empty() {
        own.push(Column::age());
    }
    for c in own {
        cols.push(json!({"name": c.name, "type": c.kind, "format": c.format, "description": c.description, "priority": c.priority}));
    }
    cols
}

fn row(own_columns: bool, cells_of: &dyn Fn(&Value) -> Vec<Value>, obj: &Value, include: &str) -> Value {
    let mut cells = vec![json!(meta::name_of(obj))];
    if own_columns {
        cells.extend(cells_of(obj));
    } else {
        cells.push(json!(meta::age(obj)));
    }
    let object = match include {
        "None" => Value::Null,
        "Object" => obj.clone(),
        _ => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        }),
    };
    let mut r = json!({"cells": cells});
    if !object.is_null() {
        r["object"] = object;
    }
    r
}

/// A Table of `objects` with a kind's own `columns` (after NAME; AGE alone
/// when it has none) and `cells_of` each object; `list_meta` is the list's
/// metadata.
pub fn table(
    columns: Vec<Column>,
    cells_of: &dyn Fn(&Value) -> Vec<Value>,
    objects: &[Value],
    list_meta: Value,
    include: &str,
) -> Value {
    let own_columns = !columns.is_empty();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": definitions(columns),
        "rows": objects.iter().map(|o| row(own_columns, cells_of, o, include)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers_kubectl_sends() {
        assert!(wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"));
        assert!(!wants_table("application/json"));
    }
}

//! A custom resource version's definition in the OpenAPI v2 (Swagger 2.0)
//! document, as upstream's apiextensions-apiserver publishes it: the
//! version's structural schema cut down to what Swagger 2.0 and old
//! kubectls can read, with `apiVersion`, `kind` and `metadata` added and
//! the kind's `x-kubernetes-group-version-kind`.
//!
//! What the cut removes (upstream's ToStructuralOpenAPIV2, then its
//! publishing without defaults): the junctors (`allOf`, `anyOf`, `oneOf`,
//! `not`) and `default`; a `nullable` value loses its type, properties and
//! items (and is no longer required by its parent); a value that keeps
//! unknown fields loses its properties and items, and its `object` type;
//! an `array` left without items loses its type. A schema that keeps
//! unknown fields at its root is published as a bare `object`: kubectl
//! would otherwise refuse the fields it does not list.

use serde_json::{json, Map, Value};

/// The value-validation and generic keywords of a structural schema that
/// Swagger 2.0 holds (besides type, properties, items, additionalProperties
/// and required, which the conversion looks at).
const KEPT: &[&str] = &[
    "format",
    "title",
    "description",
    "maximum",
    "minimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "multipleOf",
    "maxProperties",
    "minProperties",
];

/// Boolean keywords and extensions, published only when true.
const FLAGS: &[&str] = &[
    "exclusiveMaximum",
    "exclusiveMinimum",
    "uniqueItems",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
];

/// List-valued keywords and extensions, published when not empty.
const LISTS: &[&str] = &["enum", "x-kubernetes-list-map-keys", "x-kubernetes-validations"];

/// String-valued extensions.
const STRINGS: &[&str] = &["x-kubernetes-list-type", "x-kubernetes-map-type"];

/// The properties every object of a kind has, as the built-in kinds
/// describe them: `apiVersion`, `kind`, and `metadata` (a reference to
/// ObjectMeta with its description).
pub struct ObjectProperties {
    pub api_version: Value,
    pub kind: Value,
    pub metadata: Value,
}

fn is_true(m: &Map<String, Value>, key: &str) -> bool {
    m.get(key) == Some(&Value::Bool(true))
}

/// One structural schema node, converted for Swagger 2.0.
fn to_v2(schema: &Value) -> Value {
    let Some(m) = schema.as_object() else { return json!({}) };
    let nullable = is_true(m, "nullable");
    let preserves = is_true(m, "x-kubernetes-preserve-unknown-fields");
    let mut ty = if nullable { "" } else { m.get("type").and_then(Value::as_str).unwrap_or_default() };
    let mut out = Map::new();
    let keeps_children = !nullable && !preserves;
    let items = m.get("items").filter(|i| keeps_children && i.is_object()).map(to_v2);
    if items.is_none() && ty == "array" {
        ty = "";
    }
    if preserves && ty == "object" {
        ty = "";
    }
    if !ty.is_empty() {
        out.insert("type".into(), json!(ty));
    }
    for key in KEPT {
        if let Some(v) = m.get(*key) {
            out.insert(key.to_string(), v.clone());
        }
    }
    for key in FLAGS {
        if is_true(m, key) {
            out.insert(key.to_string(), Value::Bool(true));
        }
    }
    for key in LISTS {
        if let Some(v) = m.get(*key).filter(|v| v.as_array().is_some_and(|a| !a.is_empty())) {
            out.insert(key.to_string(), v.clone());
        }
    }
    for key in STRINGS {
        if let Some(v) = m.get(*key).filter(|v| v.is_string()) {
            out.insert(key.to_string(), v.clone());
        }
    }
    let properties = m.get("properties").and_then(Value::as_object).filter(|_| keeps_children);
    let mut required: Vec<Value> = m.get("required").and_then(Value::as_array).cloned().unwrap_or_default();
    if let Some(props) = properties {
        // A property that may be null cannot be required in Swagger 2.0.
        required.retain(|r| {
            r.as_str().and_then(|name| props.get(name)).is_none_or(|p| p.get("nullable") != Some(&Value::Bool(true)))
        });
        if !props.is_empty() {
            let converted: Map<String, Value> = props.iter().map(|(k, v)| (k.clone(), to_v2(v))).collect();
            out.insert("properties".into(), Value::Object(converted));
        }
    }
    match m.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            out.insert("additionalProperties".into(), Value::Bool(*b));
        }
        Some(additional @ Value::Object(a)) => {
            if a.get("nullable") == Some(&Value::Bool(true)) {
                required.clear();
            }
            out.insert("additionalProperties".into(), to_v2(additional));
        }
        _ => {}
    }
    if !required.is_empty() {
        out.insert("required".into(), Value::Array(required));
    }
    if let Some(items) = items {
        out.insert("items".into(), items);
    }
    Value::Object(out)
}

/// Gives each embedded resource (`x-kubernetes-embedded-resource`) its
/// `apiVersion`, `kind` and `metadata`, the first two required, except
/// where unknown fields are kept (kubectl would refuse the others).
fn add_embedded_properties(schema: &mut Value, object: &ObjectProperties) {
    let Some(m) = schema.as_object_mut() else { return };
    if let Some(Value::Object(props)) = m.get_mut("properties") {
        props.values_mut().for_each(|p| add_embedded_properties(p, object));
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = m.get_mut(key) {
            add_embedded_properties(sub, object);
        }
    }
    if is_true(m, "x-kubernetes-preserve-unknown-fields") || !is_true(m, "x-kubernetes-embedded-resource") {
        return;
    }
    set_object_properties(m, object);
    let required = m.entry("required").or_insert_with(|| json!([]));
    if let Some(list) = required.as_array_mut() {
        for name in ["kind", "apiVersion"] {
            if !list.iter().any(|r| r == name) {
                list.push(json!(name));
            }
        }
    }
}

fn set_object_properties(m: &mut Map<String, Value>, object: &ObjectProperties) {
    let props = m.entry("properties").or_insert_with(|| json!({}));
    if let Some(props) = props.as_object_mut() {
        props.insert("apiVersion".into(), object.api_version.clone());
        props.insert("kind".into(), object.kind.clone());
        props.insert("metadata".into(), object.metadata.clone());
    }
}

/// The definition of a custom resource version whose schema is `schema`
/// (its `openAPIV3Schema`).
pub fn definition(schema: &Value, gvk: [&str; 3], object: &ObjectProperties) -> Value {
    let [group, version, kind] = gvk;
    let root_preserves = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let mut out = if root_preserves {
        json!({"type": "object"})
    } else {
        let mut v = to_v2(schema);
        if let Some(m) = v.as_object_mut() {
            set_object_properties(m, object);
        }
        add_embedded_properties(&mut v, object);
        v
    };
    out["x-kubernetes-group-version-kind"] = json!([{"group": group, "kind": kind, "version": version}]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object() -> ObjectProperties {
        ObjectProperties {
            api_version: json!({"type": "string"}),
            kind: json!({"type": "string"}),
            metadata: json!({"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}),
        }
    }

    fn without_added(mut v: Value) -> Value {
        for p in ["apiVersion", "kind", "metadata"] {
            v["properties"].as_object_mut().map(|m| m.remove(p));
        }
        v.as_object_mut().map(|m| m.remove("x-kubernetes-group-version-kind"));
        v
    }

    #[test]
    fn a_plain_schema_is_published_as_it_is_with_the_object_properties() {
        let schema = json!({"description": "Foo", "type": "object", "properties": {"spec": {"type": "object",
            "properties": {"bars": {"type": "array", "items": {"type": "object", "required": ["name"],
                "properties": {"name": {"type": "string"}, "q": {"type": "string", "pattern": "a|b"}}}}}}}});
        let d = definition(&schema, ["example.com", "v1", "Foo"], &object());
        assert_eq!(
            d["x-kubernetes-group-version-kind"],
            json!([{"group": "example.com", "kind": "Foo", "version": "v1"}])
        );
        assert_eq!(
            d["properties"]["metadata"]["$ref"],
            "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
        assert_eq!(without_added(d), schema);
    }

    #[test]
    fn what_swagger_2_cannot_hold_is_cut() {
        let schema = json!({"type": "object", "required": ["a", "n"], "properties": {
            "a": {"type": "string", "default": "x", "anyOf": [{"pattern": "a"}], "nullable": false},
            "n": {"type": "object", "nullable": true, "properties": {"x": {"type": "string"}}},
            "p": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"x": {"type": "string"}}},
            "l": {"type": "array", "x-kubernetes-preserve-unknown-fields": true, "items": {"type": "string"}},
            "i": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
            "m": {"type": "object", "additionalProperties": {"type": "string"}, "x-kubernetes-map-type": "granular"},
        }});
        let d = without_added(definition(&schema, ["g", "v1", "K"], &object()));
        assert_eq!(
            d,
            json!({"type": "object", "required": ["a"], "properties": {
                "a": {"type": "string"},
                "n": {},
                "p": {"x-kubernetes-preserve-unknown-fields": true},
                "l": {"x-kubernetes-preserve-unknown-fields": true},
                "i": {"x-kubernetes-int-or-string": true},
                "m": {"type": "object", "additionalProperties": {"type": "string"}, "x-kubernetes-map-type": "granular"},
            }})
        );
    }

    #[test]
    fn unknown_fields_at_the_root_publish_a_bare_object() {
        let schema = json!({"type": "object", "description": "d", "x-kubernetes-preserve-unknown-fields": true,
            "properties": {"spec": {"type": "object"}}});
        let d = definition(&schema, ["g", "v1", "K"], &object());
        assert_eq!(
            d,
            json!({"type": "object", "x-kubernetes-group-version-kind": [{"group": "g", "kind": "K", "version": "v1"}]})
        );
    }

    #[test]
    fn embedded_resources_get_their_object_properties() {
        let schema = json!({"type": "object", "properties": {
            "e": {"type": "object", "x-kubernetes-embedded-resource": true, "properties": {"spec": {"type": "object"}}},
            "u": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true},
        }});
        let d = definition(&schema, ["g", "v1", "K"], &object());
        let e = &d["properties"]["e"];
        assert_eq!(e["required"], json!(["kind", "apiVersion"]));
        assert!(e["properties"]["metadata"]["$ref"].is_string() && e["properties"]["spec"].is_object());
        assert_eq!(
            d["properties"]["u"],
            json!({"x-kubernetes-preserve-unknown-fields": true, "x-kubernetes-embedded-resource": true})
        );
    }
}

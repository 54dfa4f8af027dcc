//! The Swagger 2.0 `definitions` of the built-in kinds, made from the same
//! embedded OpenAPI v3 components the v3 documents serve, and the list
//! kinds' definitions, which the components do not hold.
//!
//! From v3 to v2: references point into `#/definitions/`; a reference that
//! v3 wraps in `allOf` to give it a description is a plain `$ref` beside
//! its description, as upstream's v2 document writes it (and as kubectl's
//! v2 reader requires); `oneOf`, which Swagger 2.0 lacks, is dropped (the
//! JSONSchemaProps alternatives become untyped values, as upstream's). A
//! Quantity and an IntOrString are strings in v2.

use serde_json::{json, Value};

use crate::apiserver::crd::openapi_v2::ObjectProperties;

const V3_PREFIX: &str = "#/components/schemas/";
pub const V2_PREFIX: &str = "#/definitions/";

pub const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
pub const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";
const INT_OR_STRING: &str = "io.k8s.apimachinery.pkg.util.intstr.IntOrString";

/// A v3 component as a v2 definition.
pub fn from_component(name: &str, schema: Value) -> Value {
    let mut v2 = convert(schema);
    if name == QUANTITY || name == INT_OR_STRING {
        if let Some(m) = v2.as_object_mut() {
            m.remove("x-kubernetes-int-or-string");
            m.insert("type".into(), json!("string"));
            if name == INT_OR_STRING {
                m.insert("format".into(), json!("int-or-string"));
            }
        }
    }
    v2
}

fn convert(schema: Value) -> Value {
    let Value::Object(mut m) = schema else { return schema };
    if let Some(Value::String(r)) = m.get_mut("$ref") {
        if let Some(name) = r.strip_prefix(V3_PREFIX) {
            *r = format!("{V2_PREFIX}{name}");
        }
    }
    // `{allOf: [{$ref}], description}` is how v3 describes a reference.
    let single_ref = m.get("allOf").and_then(Value::as_array).filter(|a| a.len() == 1 && a[0].get("$ref").is_some());
    if let Some(reference) = single_ref.map(|a| a[0].clone()) {
        m.remove("allOf");
        if let Value::Object(inner) = convert(reference) {
            m.extend(inner);
        }
    }
    m.remove("oneOf");
    if let Some(Value::Object(props)) = m.get_mut("properties") {
        for v in props.values_mut() {
            *v = convert(v.take());
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(v) = m.get_mut(key).filter(|v| v.is_object()) {
            *v = convert(v.take());
        }
    }
    if let Some(Value::Array(all)) = m.get_mut("allOf") {
        for v in all.iter_mut() {
            *v = convert(v.take());
        }
    }
    Value::Object(m)
}

/// A reference to the definition `name`.
pub fn reference(name: &str) -> Value {
    json!({"$ref": format!("{V2_PREFIX}{name}")})
}

/// `apiVersion`, `kind` and `metadata` as the definition of a built-in
/// kind describes them, for the definitions made here.
pub fn object_properties(kind: &Value) -> ObjectProperties {
    let props = kind.get("properties");
    let prop = |name: &str| props.and_then(|p| p.get(name)).cloned();
    let mut metadata = reference(OBJECT_META);
    metadata["description"] = json!("Standard object's metadata.");
    ObjectProperties {
        api_version: prop("apiVersion").unwrap_or_else(|| json!({"type": "string"})),
        kind: prop("kind").unwrap_or_else(|| json!({"type": "string"})),
        metadata: prop("metadata").unwrap_or(metadata),
    }
}

/// The definition of a list kind whose items are the definition `item`.
pub fn list(gvk: [&str; 3], item_kind: &str, item: &str, object: &ObjectProperties) -> Value {
    let [group, version, list_kind] = gvk;
    let mut items = json!({"type": "array", "items": reference(item)});
    items["description"] = json!(format!("The {item_kind} objects of the list."));
    let mut metadata = reference(LIST_META);
    metadata["description"] = json!("Standard list metadata.");
    json!({
        "description": format!("{list_kind} is a list of {item_kind}."),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": object.api_version,
            "items": items,
            "kind": object.kind,
            "metadata": metadata,
        },
        "x-kubernetes-group-version-kind": [{"group": group, "kind": list_kind, "version": version}],
    })
}

/// Adds `gvk` to a definition's `x-kubernetes-group-version-kind` list.
pub fn add_gvk(definition: &mut Value, gvk: [&str; 3]) {
    let [group, version, kind] = gvk;
    let Some(m) = definition.as_object_mut() else { return };
    let entry = json!({"group": group, "kind": kind, "version": version});
    let list = m.entry("x-kubernetes-group-version-kind").or_insert_with(|| json!([]));
    if let Some(list) = list.as_array_mut() {
        if !list.contains(&entry) {
            list.push(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_described_reference_becomes_a_plain_ref_beside_its_description() {
        let v3 = json!({"type": "object", "properties": {
            "metadata": {"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}], "description": "m"},
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/a.B"}},
            "or": {"oneOf": [{"type": "boolean"}, {"$ref": "#/components/schemas/a.B"}], "description": "o"},
        }});
        let v2 = from_component("a.A", v3);
        assert_eq!(
            v2,
            json!({"type": "object", "properties": {
                "metadata": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "description": "m"},
                "items": {"type": "array", "items": {"$ref": "#/definitions/a.B"}},
                "or": {"description": "o"},
            }})
        );
    }

    #[test]
    fn quantities_and_int_or_strings_are_strings() {
        let q = from_component(QUANTITY, json!({"description": "q", "x-kubernetes-int-or-string": true}));
        assert_eq!(q, json!({"description": "q", "type": "string"}));
        let i = from_component(INT_OR_STRING, json!({"x-kubernetes-int-or-string": true}));
        assert_eq!(i, json!({"type": "string", "format": "int-or-string"}));
    }
}

//! Structural schemas of CustomResourceDefinitions: pruning of unknown
//! fields, defaulting, and validation of types, required fields, enums,
//! bounds and lengths, with upstream's field-error wording.

use serde_json::Value;

use crate::apiserver::status::Cause;

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn preserves(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true)
}

fn embedded(schema: &Value) -> bool {
    schema.get("x-kubernetes-embedded-resource").and_then(Value::as_bool) == Some(true)
}

/// Drops fields the schema does not know (unless it preserves them) and
/// returns their paths.
pub fn prune(value: &mut Value, schema: &Value, path: &str, root: bool, dropped: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let keep_all = preserves(schema) && props.is_none() && additional.is_none();
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                let child_path = format!("{path}.{k}");
                if (root || embedded(schema)) && ["apiVersion", "kind", "metadata"].contains(&k.as_str()) {
                    continue;
                }
                let child_schema = props.and_then(|p| p.get(&k)).or(additional.filter(|a| a.is_object()));
                match child_schema {
                    Some(cs) => {
                        if let Some(child) = map.get_mut(&k) {
                            prune(child, cs, &child_path, false, dropped);
                        }
                    }
                    None if keep_all || preserves(schema) || additional.and_then(Value::as_bool) == Some(true) => {}
                    None => {
                        map.remove(&k);
                        dropped.push(child_path);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune(item, item_schema, &format!("{path}[{i}]"), false, dropped);
                }
            }
        }
        _ => {}
    }
}

/// Whether the schema has a `default` anywhere in its structure (the
/// objects of a version without one are served as they are stored).
pub fn has_defaults(schema: &Value) -> bool {
    if schema.get("default").is_some() {
        return true;
    }
    let props = schema.get("properties").and_then(Value::as_object).into_iter().flat_map(|p| p.values());
    let nested = ["items", "additionalProperties"].into_iter().filter_map(|k| schema.get(k)).filter(|s| s.is_object());
    props.chain(nested).any(has_defaults)
}

/// Fills in `default`s of absent properties (and of null ones the schema
/// does not let be null), depth first.
pub fn apply_defaults(value: &mut Value, schema: &Value) {
    match value {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, ps) in props {
                    let nullable = ps.get("nullable").and_then(Value::as_bool) == Some(true);
                    if map.get(k).is_none_or(|v| v.is_null() && !nullable) {
                        if let Some(d) = ps.get("default") {
                            map.insert(k.clone(), d.clone());
                        }
                    }
                    if let Some(child) = map.get_mut(k) {
                        apply_defaults(child, ps);
                    }
                }
            }
            if let Some(add) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for (_, child) in map.iter_mut() {
                    apply_defaults(child, add);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items") {
                for item in items {
                    apply_defaults(item, is);
                }
            }
        }
        _ => {}
    }
}

fn display(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// Validates `value` against `schema`; `path` is the field path so far.
pub fn validate(value: &Value, schema: &Value, path: &str, out: &mut Vec<Cause>) {
    let field = path.trim_start_matches('.');
    if value.is_null() {
        if schema.get("nullable").and_then(Value::as_bool) != Some(true) && schema.get("type").is_some() {
            out.push(Cause {
                reason: "FieldValueTypeInvalid",
                message: format!(
                    "Invalid value: \"null\": {field} in body must be of type {}: \"null\"",
                    schema["type"].as_str().unwrap_or("object")
                ),
                field: field.to_string(),
            });
        }
        return;
    }
    let int_or_string = schema.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true);
    if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let got = type_of(value);
        let ok = got == want
            || (want == "number" && got == "integer")
            || (int_or_string && (got == "integer" || got == "string"));
        if !ok {
            out.push(Cause {
                reason: "FieldValueTypeInvalid",
                message: format!("Invalid value: \"{got}\": {field} in body must be of type {want}: \"{got}\""),
                field: field.to_string(),
            });
            return;
        }
    }
    if let Some(Value::Array(allowed)) = schema.get("enum") {
        if !allowed.contains(value) {
            let list: Vec<String> = allowed.iter().map(display).collect();
            out.push(Cause {
                reason: "FieldValueNotSupported",
                message: format!("Unsupported value: {}: supported values: {}", display(value), list.join(", ")),
                field: field.to_string(),
            });
        }
    }
    match value {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
                if x < min {
                    out.push(Cause::invalid(
                        field,
                        format!("Invalid value: {n}: {field} in body should be greater than or equal to {min}"),
                    ));
                }
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
                if x > max {
                    out.push(Cause::invalid(
                        field,
                        format!("Invalid value: {n}: {field} in body should be less than or equal to {max}"),
                    ));
                }
            }
        }
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
                if len < min {
                    out.push(Cause::invalid(
                        field,
                        format!("Invalid value: {s:?}: {field} in body should be at least {min} chars long"),
                    ));
                }
            }
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
                if len > max {
                    out.push(Cause {
                        reason: "FieldValueTooLong",
                        message: format!("Too long: may not be more than {max} bytes"),
                        field: field.to_string(),
                    });
                }
            }
        }
        Value::Array(items) => {
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
                if (items.len() as u64) < min {
                    out.push(Cause::invalid(
                        field,
                        format!("Invalid value: {}: {field} in body should have at least {min} items", items.len()),
                    ));
                }
            }
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
                if (items.len() as u64) > max {
                    out.push(Cause {
                        reason: "FieldValueTooMany",
                        message: format!("Too many: {}: must have at most {max} items", items.len()),
                        field: field.to_string(),
                    });
                }
            }
            if let Some(is) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate(item, is, &format!("{path}[{i}]"), out);
                }
            }
        }
        Value::Object(map) => {
            if let Some(Value::Array(req)) = schema.get("required") {
                for r in req.iter().filter_map(Value::as_str) {
                    if !map.contains_key(r) {
                        let f = format!("{field}.{r}").trim_start_matches('.').to_string();
                        out.push(Cause::required(f));
                    }
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            for (k, v) in map {
                if path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&k.as_str()) {
                    continue;
                }
                if let Some(ps) = props.and_then(|p| p.get(k)) {
                    validate(v, ps, &format!("{path}.{k}"), out);
                } else if let Some(add) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                    validate(v, add, &format!("{path}.{k}"), out);
                }
            }
        }
        _ => {}
    }
}

/// Reads a simple JSONPath (`.spec.replicas`, `.status.conditions[0].type`).
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut v = obj;
    let trimmed = path.trim().trim_start_matches('{').trim_end_matches('}').trim_start_matches('.');
    if trimmed.is_empty() {
        return Some(obj);
    }
    for part in trimmed.split('.') {
        let (name, index) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        if !name.is_empty() {
            v = v.get(name)?;
        }
        if let Some(i) = index {
            v = v.get(i)?;
        }
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prunes_defaults_and_validates() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 1},
                "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }}
        }});
        let mut obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
            "spec": {"size": 0, "junk": 1, "extra": {"anything": true}}, "top": 2});
        let mut dropped = Vec::new();
        prune(&mut obj, &schema, "", true, &mut dropped);
        assert_eq!(dropped, vec![".spec.junk".to_string(), ".top".to_string()]);
        apply_defaults(&mut obj, &schema);
        assert_eq!(obj["spec"]["mode"], "a");
        assert_eq!(obj["spec"]["extra"]["anything"], true);
        let mut causes = Vec::new();
        validate(&obj, &schema, "", &mut causes);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "spec.size");
        let mut causes = Vec::new();
        validate(&json!({"spec": {"mode": "c"}}), &schema, "", &mut causes);
        assert_eq!(causes.len(), 2);
        assert_eq!(json_path(&obj, ".spec.size"), Some(&json!(0)));
    }

    #[test]
    fn defaults_found_anywhere_and_filling_non_nullable_nulls() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "string", "default": "A"},
            "n": {"type": "string", "nullable": true, "default": "N"},
            "list": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer", "default": 1}}}}
        }});
        assert!(has_defaults(&schema));
        assert!(has_defaults(&schema["properties"]["list"]));
        assert!(!has_defaults(&json!({"type": "object", "properties": {"default": {"type": "string"}}})));
        let mut obj = json!({"a": null, "n": null, "list": [{}, {"x": 2}]});
        apply_defaults(&mut obj, &schema);
        assert_eq!(obj, json!({"a": "A", "n": null, "list": [{"x": 1}, {"x": 2}]}));
    }
}

//! Decoding a typed object from JSON, one way for the whole binary.
//!
//! Every way of decoding a type is a copy of the decoders of all the types
//! it holds: a Pod's are about 0.2 MB of machine code. kube's client
//! decodes its answers with `serde_json::from_str`, so the API server, the
//! informers and everything else that holds a JSON value decode through
//! that same function too: [`from_value`] writes the value out and reads it
//! back. A failed decode is done once more on the value written one field
//! per line, and the error's line gives the field's path (`spec.replicas`,
//! `spec.containers[0].ports[0].containerPort`), which upstream's messages
//! name and a second decoder (such as `serde_path_to_error`'s) would cost a
//! third copy of every decoder for.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A value that does not decode as the type asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}{message}", .path, if .path.is_empty() { "" } else { ": " })]
pub struct DecodeError {
    /// The path of the field that did not decode, as `spec.containers[0].name`;
    /// empty for the value itself.
    pub path: String,
    /// What was wrong with it, in serde's words (`invalid type: string
    /// "x", expected i32`).
    pub message: String,
}

/// `text` decoded as a `T` (the one JSON decoder of each type).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    serde_json::from_str(text)
}

/// `value` decoded as a `T`, with the path of the field that fails.
pub fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, DecodeError> {
    match from_str(&value.to_string()) {
        Ok(decoded) => Ok(decoded),
        Err(compact) => {
            let pretty = serde_json::to_string_pretty(value).unwrap_or_default();
            let error = from_str::<T>(&pretty).err().unwrap_or(compact);
            Err(locate(value, &error))
        }
    }
}

/// The path of the line `error` points at in `value` written pretty.
fn locate(value: &Value, error: &serde_json::Error) -> DecodeError {
    let text = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    let message = text.strip_suffix(&position).unwrap_or(&text).to_string();
    let path = match error.line() {
        0 => String::new(),
        line => {
            let mut paths = vec![String::new()];
            line_paths(value, &mut String::new(), &mut paths);
            paths.get(line - 1).cloned().unwrap_or_default()
        }
    };
    DecodeError { path, message }
}

/// The path of each line `serde_json::to_string_pretty` writes after the
/// first (which is `value`'s own and is already in `out`): a key and its
/// value, or an element, start a line; a non-empty object or array ends on
/// a line of its own, which is the container's.
fn line_paths(value: &Value, path: &mut String, out: &mut Vec<String>) {
    let len = path.len();
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, item) in map {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                out.push(path.clone());
                line_paths(item, path, out);
                path.truncate(len);
            }
            out.push(path.clone());
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                path.push_str(&format!("[{i}]"));
                out.push(path.clone());
                line_paths(item, path, out);
                path.truncate(len);
            }
            out.push(path.clone());
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn error_of(value: Value) -> DecodeError {
        from_value::<Pod>(&value).expect_err("does not decode")
    }

    #[test]
    fn a_value_decodes_as_its_type() {
        let pod: Pod = from_value(&json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]}}))
            .expect("decodes");
        assert_eq!(pod.metadata.name.as_deref(), Some("web"));
        assert_eq!(pod.spec.map(|s| s.containers[0].name.clone()).as_deref(), Some("c"));
    }

    #[test]
    fn a_wrong_type_deep_in_lists_names_its_field() {
        let e = error_of(json!({
            "metadata": {"name": "web", "labels": {"a": "b"}},
            "spec": {"containers": [{"name": "a"}, {"name": "b", "ports": [{"containerPort": "http"}]}]}
        }));
        assert_eq!(e.path, "spec.containers[1].ports[0].containerPort");
        assert_eq!(e.message, "invalid type: string \"http\", expected i32");
        assert_eq!(
            e.to_string(),
            "spec.containers[1].ports[0].containerPort: invalid type: string \"http\", expected i32"
        );
    }

    #[test]
    fn a_missing_field_names_the_object_that_lacks_it() {
        #[derive(serde::Deserialize)]
        struct Port {
            #[allow(dead_code)]
            number: u16,
        }
        #[derive(serde::Deserialize)]
        struct Service {
            #[allow(dead_code)]
            ports: Vec<Port>,
        }
        let e = from_value::<Service>(&json!({"ports": [{"number": 80}, {"name": "x"}]})).err().expect("an error");
        assert_eq!((e.path.as_str(), e.message.as_str()), ("ports[1]", "missing field `number`"));
    }

    #[test]
    fn a_map_where_a_string_belongs_and_a_wrong_top_level_value() {
        let e = error_of(json!({"metadata": {"name": {"x": 1}}}));
        assert_eq!(e.path, "metadata.name");
        assert!(e.message.starts_with("invalid type: map"), "{}", e.message);
        let e = error_of(json!("a pod"));
        assert_eq!((e.path.as_str(), e.to_string().as_str()), ("", "invalid type: string \"a pod\", expected Pod"));
    }

    #[test]
    fn empty_objects_and_lists_take_one_line() {
        let e = error_of(json!({"metadata": {"labels": {}, "finalizers": []}, "spec": {"containers": 3}}));
        assert_eq!(e.path, "spec.containers");
    }
}

//! Upstream's string checks (apimachinery's `util/validation`) with their
//! messages word for word, which clients show and tests compare: qualified
//! names (label keys, annotation keys), label values and DNS subdomains;
//! and the checks every object's labels and annotations pass
//! (`ValidateObjectMeta`).

use serde_json::Value;

use super::status::Cause;

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str =
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str =
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";

/// The most bytes all of an object's annotations may take.
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// Upstream's RegexError: the message, examples and the regular expression.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let shown: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!("{msg} (e.g. {}regex used for validation is '{fmt}')", shown.join(" or "))
}

fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, the whole string.
fn is_qualified_part(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_alphanumeric();
    b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, the whole string (any length).
fn matches_dns1123_label(l: &str) -> bool {
    let b = l.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// An RFC 1123 label of at most 63 characters (namespace and service names).
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && matches_dns1123_label(s)
}

/// Upstream's IsDNS1123Subdomain: what is wrong with `s`, if anything.
pub fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253));
    }
    if !s.split('.').all(matches_dns1123_label) {
        errs.push(regex_error(DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, &["example.com"]));
    }
    errs
}

/// Upstream's IsQualifiedName (label keys; annotation keys lowercased):
/// an optional DNS subdomain prefix and '/', then a name of at most 63
/// characters.
pub fn qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(dns1123_subdomain(prefix).into_iter().map(|m| format!("prefix part {m}")));
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63)));
    }
    if !is_qualified_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
        ));
    }
    errs
}

/// Upstream's IsValidLabelValue: empty, or a qualified name part of at most
/// 63 characters.
pub fn label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !value.is_empty() && !is_qualified_part(value) {
        errs.push(regex_error(LABEL_VALUE_MSG, LABEL_VALUE_FMT, &["MyValue", "my_value", "12345"]));
    }
    errs
}

/// Go's %q for the strings these messages quote.
pub fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// `metadata.labels` and `metadata.annotations` as upstream's
/// ValidateObjectMeta checks them.
pub fn object_meta_maps(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let invalid = |field: &str, value: &str, msg: &str| {
        Cause::invalid(field.to_string(), format!("Invalid value: {}: {msg}", quote(value)))
    };
    if let Some(Value::Object(labels)) = obj.pointer("/metadata/labels") {
        for (k, v) in labels {
            for msg in qualified_name(k) {
                causes.push(invalid("metadata.labels", k, &msg));
            }
            let v = v.as_str().unwrap_or_default();
            for msg in label_value(v) {
                causes.push(invalid("metadata.labels", v, &msg));
            }
        }
    }
    if let Some(Value::Object(annotations)) = obj.pointer("/metadata/annotations") {
        let mut total = 0;
        for (k, v) in annotations {
            for msg in qualified_name(&k.to_ascii_lowercase()) {
                causes.push(invalid("metadata.annotations", k, &msg));
            }
            total += k.len() + v.as_str().map_or(0, str::len);
        }
        if total > TOTAL_ANNOTATION_SIZE_LIMIT {
            causes.push(Cause {
                reason: "FieldValueTooLong",
                message: format!("Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes"),
                field: "metadata.annotations".into(),
            });
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn qualified_names_as_upstream_words_them() {
        assert!(qualified_name("app").is_empty());
        assert!(qualified_name("example.com/My_Name-1").is_empty());
        assert_eq!(
            qualified_name("a b"),
            vec!["name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"]
        );
        assert_eq!(qualified_name("/x"), vec!["prefix part must be non-empty"]);
        assert!(qualified_name("Example.com/x")[0].starts_with("prefix part a lowercase RFC 1123 subdomain"));
        assert!(qualified_name("a/b/c")[0].starts_with("a qualified name must consist"));
        assert_eq!(qualified_name(&"x".repeat(64)), vec!["name part must be no more than 63 characters"]);
    }

    #[test]
    fn label_values() {
        assert!(label_value("").is_empty() && label_value("v1.2_3-x").is_empty());
        assert_eq!(label_value("-x").len(), 1);
        assert_eq!(label_value(&"x".repeat(64)), vec!["must be no more than 63 characters"]);
    }

    #[test]
    fn object_labels_and_annotations() {
        let ok =
            json!({"metadata": {"labels": {"app": "web"}, "annotations": {"Example.com/Note": "anything at all"}}});
        assert!(object_meta_maps(&ok).is_empty());
        let bad = json!({"metadata": {"labels": {"a b": "c d"}}});
        let causes = object_meta_maps(&bad);
        assert_eq!(causes.len(), 2);
        assert!(causes.iter().all(|c| c.field == "metadata.labels"));
        assert!(causes[0].message.starts_with("Invalid value: \"a b\": name part must consist"));
        let big = json!({"metadata": {"annotations": {"k": "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT)}}});
        assert_eq!(object_meta_maps(&big)[0].reason, "FieldValueTooLong");
    }
}

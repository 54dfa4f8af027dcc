//! The query string as upstream decodes it into ListOptions, GetOptions,
//! CreateOptions, UpdateOptions, PatchOptions and DeleteOptions: a value
//! that does not parse is a 400 (`strconv.ParseInt: parsing "abc": invalid
//! syntax`), an unknown enum value a 422 naming the field; never a silent
//! default.

use crate::apiserver::status::{ApiError, ApiResult, Cause};

use super::Call;

/// Integer parameters, by the verbs whose options carry them.
const INTEGERS: &[(&str, &[&str])] = &[
    ("limit", &["list", "watch", "deletecollection"]),
    ("timeoutSeconds", &["list", "watch", "deletecollection"]),
    ("gracePeriodSeconds", &["delete", "deletecollection"]),
];

/// Upstream's Convert_Slice_string_To_int64 and its error text.
pub fn parse_int(value: &str) -> ApiResult<i64> {
    value.parse::<i64>().map_err(|e| {
        let why = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => "value out of range",
            _ => "invalid syntax",
        };
        ApiError::bad_request(format!("strconv.ParseInt: parsing {value:?}: {why}"))
    })
}

/// `field: Unsupported value: "x": supported values: "a", "b"` as a 422
/// of the options kind.
fn unsupported(options: &str, field: &str, shown: String, supported: &[&str]) -> ApiError {
    let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
    let message = format!("Unsupported value: {shown}: supported values: {}", list.join(", "));
    let cause = Cause { reason: "FieldValueNotSupported", message, field: field.into() };
    ApiError::invalid("meta.k8s.io", options, "", vec![cause])
}

/// The options kind a verb's query string decodes into.
fn options_kind(verb: &str) -> &'static str {
    match verb {
        "create" => "CreateOptions",
        "update" => "UpdateOptions",
        "patch" => "PatchOptions",
        "delete" | "deletecollection" => "DeleteOptions",
        "get" => "GetOptions",
        _ => "ListOptions",
    }
}

/// Checks the parameters of a request's query string for `verb`.
pub fn check(call: &Call, verb: &str) -> ApiResult<()> {
    for (name, verbs) in INTEGERS {
        if let (true, Some(v)) = (verbs.contains(&verb), call.query.get(*name)) {
            parse_int(v)?;
        }
    }
    let kind = options_kind(verb);
    if matches!(verb, "list" | "watch") {
        if let Some(m) = call.param("resourceVersionMatch") {
            if !matches!(m, "Exact" | "NotOlderThan") {
                return Err(unsupported(kind, "resourceVersionMatch", format!("{m:?}"), &["Exact", "NotOlderThan"]));
            }
        }
    }
    if matches!(verb, "create" | "update" | "patch" | "delete" | "deletecollection") {
        if let Some(d) = call.query.get("dryRun").filter(|d| d.as_str() != "All") {
            return Err(unsupported(kind, "dryRun", format!("[]string{{{d:?}}}"), &["All"]));
        }
    }
    if matches!(verb, "create" | "update" | "patch") {
        if let Some(f) = call.query.get("fieldValidation") {
            if !matches!(f.as_str(), "" | "Ignore" | "Warn" | "Strict") {
                return Err(unsupported(kind, "fieldValidation", format!("{f:?}"), &["", "Ignore", "Strict", "Warn"]));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::request::parse_bool;

    #[test]
    fn integers_and_bools_as_upstream_decodes_them() {
        assert_eq!(parse_int("42").ok(), Some(42));
        let e = parse_int("abc").unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (400, "strconv.ParseInt: parsing \"abc\": invalid syntax"));
        assert!(parse_int("").is_err());
        assert!(parse_int("99999999999999999999").unwrap_err().message.ends_with("value out of range"));
        assert!(parse_bool(Some("true")) && parse_bool(Some("maybe")) && parse_bool(Some("")));
        assert!(!parse_bool(Some("False")) && !parse_bool(Some("0")) && !parse_bool(None));
    }
}

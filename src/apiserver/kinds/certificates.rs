//! CertificateSigningRequests' strategy beyond their columns, as upstream's
//! (`registry/certificates/certificates/strategy.go` and the validation of
//! `apis/certificates`): approval and issuance are separate concerns, so
//! `approval` changes the conditions only and `status` may neither add,
//! remove nor change an Approved or Denied condition; a condition without
//! times gets them; a condition of type Approved, Denied or Failed is never
//! removed; a certificate, once issued, never changes. And what a request
//! must be: a PKCS#10 request whose signature checks out, known usages, a
//! signer named `<domain>/<path>` (not `kubernetes.io/legacy-unknown`, which
//! only v1beta1 took), at least ten minutes asked for, conditions whose
//! status fits their type, Approved and Denied not both, and a certificate
//! of CERTIFICATE PEM blocks only. What an object stored before already
//! gets wrong is tolerated, as upstream tolerates it.

use base64::Engine;
use serde_json::{json, Value};

use crate::apiserver::meta::{at, now_rfc3339, str_at};
use crate::apiserver::status::Cause;

const APPROVAL_TYPES: [&str; 2] = ["Approved", "Denied"];
/// Condition types that may only be True.
const TRUE_ONLY: [&str; 3] = ["Approved", "Denied", "Failed"];
const USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];
const LEGACY_SIGNER: &str = "kubernetes.io/legacy-unknown";

fn conditions(csr: &Value) -> &[Value] {
    at(csr, &["status", "conditions"]).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default()
}

fn condition_type(c: &Value) -> &str {
    c.get("type").and_then(Value::as_str).unwrap_or_default()
}

fn of_type<'a>(csr: &'a Value, type_: &str) -> Vec<&'a Value> {
    conditions(csr).iter().filter(|c| condition_type(c) == type_).collect()
}

fn certificate(csr: &Value) -> &str {
    str_at(csr, &["status", "certificate"]).unwrap_or_default()
}

/// Gives each condition without them its times: now for `lastUpdateTime`;
/// for `lastTransitionTime` the old one of a condition of the same type and
/// status, or now.
fn populate_condition_times(new: &mut Value, old: &Value) {
    let now = now_rfc3339();
    let old_conditions = conditions(old).to_vec();
    let Some(list) = new.pointer_mut("/status/conditions").and_then(Value::as_array_mut) else { return };
    for c in list.iter_mut().filter(|c| c.is_object()) {
        if c.get("lastUpdateTime").is_none_or(Value::is_null) {
            c["lastUpdateTime"] = json!(now);
        }
        if c.get("lastTransitionTime").is_none_or(Value::is_null) {
            let earlier = old_conditions
                .iter()
                .find(|o| o["type"] == c["type"] && o["status"] == c["status"])
                .and_then(|o| o.get("lastTransitionTime").filter(|t| !t.is_null()));
            c["lastTransitionTime"] = earlier.cloned().unwrap_or_else(|| json!(now));
        }
    }
}

/// `status` and `approval` on top of the generic merge of the status:
/// `status` keeps the old Approved and Denied conditions in the places of
/// the new ones (when as many); `approval` takes the new conditions only.
pub fn csr_subresource_update(subresource: &str, mut new: Value, old: &Value) -> Value {
    match subresource {
        "status" => {
            for type_ in APPROVAL_TYPES {
                let olds = of_type(old, type_);
                let places: Vec<usize> = conditions(&new)
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| condition_type(c) == type_)
                    .map(|(i, _)| i)
                    .collect();
                if olds.len() != places.len() {
                    continue;
                }
                let olds: Vec<Value> = olds.into_iter().cloned().collect();
                if let Some(list) = new.pointer_mut("/status/conditions").and_then(Value::as_array_mut) {
                    for (place, was) in places.into_iter().zip(olds) {
                        list[place] = was;
                    }
                }
            }
            populate_condition_times(&mut new, old);
            new
        }
        "approval" => {
            populate_condition_times(&mut new, old);
            let mut merged = old.clone();
            let new_conditions = new.pointer("/status/conditions").cloned();
            match (merged.get_mut("status").and_then(Value::as_object_mut), new_conditions) {
                (Some(status), Some(c)) => {
                    status.insert("conditions".into(), c);
                }
                (Some(status), None) => {
                    status.remove("conditions");
                }
                (None, Some(c)) => merged["status"] = json!({"conditions": c}),
                (None, None) => {}
            }
            // The metadata is the request's, as for a status update.
            if let Some(meta) = new.get("metadata") {
                merged["metadata"] = meta.clone();
            }
            merged
        }
        _ => new,
    }
}

/// Why a certificate's content is not CERTIFICATE PEM blocks only.
fn certificate_problem(b64: &str) -> Option<String> {
    if b64.is_empty() {
        return None;
    }
    let Ok(pem) = base64::engine::general_purpose::STANDARD.decode(b64) else {
        return Some("must contain at least one CERTIFICATE PEM block".into());
    };
    let mut rest: &[u8] = &pem;
    let mut blocks = 0;
    while let Ok((remaining, block)) = x509_parser::pem::parse_x509_pem(rest) {
        if block.label != "CERTIFICATE" {
            return Some(format!("only CERTIFICATE PEM blocks are allowed, found {:?}", block.label));
        }
        if x509_parser::parse_x509_certificate(&block.contents).is_err() {
            return Some("found CERTIFICATE PEM block containing 0 certificates".into());
        }
        blocks += 1;
        if remaining.len() == rest.len() {
            break;
        }
        rest = remaining;
    }
    (blocks == 0).then(|| "must contain at least one CERTIFICATE PEM block".into())
}

/// Why the request is not a PKCS#10 request whose signature checks out.
fn request_problem(b64: &str) -> Option<String> {
    let pem = base64::engine::general_purpose::STANDARD.decode(b64).unwrap_or_default();
    crate::pki::csr::CertificateRequest::from_pem(&pem).err().map(|e| e.to_string())
}

/// A DNS-1123 label: lower-case alphanumerics and '-', at most 63, not
/// starting or ending with '-'.
fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn signer_name_problem(name: &str) -> Option<String> {
    let Some((domain, path)) = name.split_once('/').filter(|(_, p)| !p.contains('/')) else {
        return Some(format!(
            "Invalid value: {name:?}: must be a fully qualified domain and path of the form 'example.com/signer-name'"
        ));
    };
    if let Some(bad) = domain.split('.').find(|l| !dns_label(l)) {
        return Some(format!("Invalid value: {domain:?}: validating label {bad:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"));
    }
    if !domain.contains('.') {
        return Some(format!(
            "Invalid value: {domain:?}: should be a domain with at least two segments separated by dots"
        ));
    }
    if let Some(bad) = path.split('.').find(|l| !dns_label(l)) {
        return Some(format!("Invalid value: {path:?}: validating label {bad:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"));
    }
    (name.len() > 571).then(|| "Too long: may not be more than 571 bytes".to_string())
}

/// Upstream's checks of a request, each tolerated on an update where the
/// stored object already fails it.
fn validate_request(csr: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let same = |path: &[&str]| old.is_some_and(|o| at(o, path) == at(csr, path));
    let request = str_at(csr, &["spec", "request"]).unwrap_or_default();
    if !same(&["spec", "request"]) {
        if let Some(problem) = request_problem(request) {
            causes.push(Cause::invalid("spec.request", format!("Invalid value: \"<request data>\": {problem}")));
        }
    }
    let usages: Vec<&str> = at(csr, &["spec", "usages"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if usages.is_empty() {
        causes.push(Cause {
            message: "Required value: usages must be provided".into(),
            ..Cause::required("spec.usages")
        });
    }
    if !same(&["spec", "usages"]) {
        for (i, u) in usages.iter().enumerate() {
            if !USAGES.contains(u) {
                let supported: Vec<String> = USAGES.iter().map(|u| format!("{u:?}")).collect();
                causes.push(Cause {
                    reason: "FieldValueNotSupported",
                    message: format!("Unsupported value: {u:?}: supported values: {}", supported.join(", ")),
                    field: format!("spec.usages[{i}]"),
                });
            } else if usages[..i].contains(u) {
                causes.push(Cause {
                    reason: "FieldValueDuplicate",
                    message: format!("Duplicate value: {u:?}"),
                    field: format!("spec.usages[{i}]"),
                });
            }
        }
    }
    let signer = str_at(csr, &["spec", "signerName"]).unwrap_or_default();
    if signer.is_empty() {
        causes.push(Cause {
            message: "Required value: signerName must be provided".into(),
            ..Cause::required("spec.signerName")
        });
    } else if signer == LEGACY_SIGNER && !same(&["spec", "signerName"]) {
        causes.push(Cause::invalid(
            "spec.signerName",
            format!("Invalid value: {signer:?}: the legacy signerName is not allowed via this API version"),
        ));
    } else if let Some(problem) = signer_name_problem(signer).filter(|_| !same(&["spec", "signerName"])) {
        causes.push(Cause::invalid("spec.signerName", problem));
    }
    if let Some(seconds) = at(csr, &["spec", "expirationSeconds"]).and_then(Value::as_i64) {
        if seconds < 600 {
            causes.push(Cause::invalid(
                "spec.expirationSeconds",
                format!("Invalid value: {seconds}: may not specify a duration less than 600 seconds (10 minutes)"),
            ));
        }
    }
    causes
}

fn validate_conditions(csr: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let old_conditions = old.map(conditions).unwrap_or_default();
    let had_both = APPROVAL_TYPES.iter().all(|t| old_conditions.iter().any(|c| condition_type(c) == *t));
    let had_duplicates =
        old_conditions.iter().enumerate().any(|(i, c)| old_conditions[..i].iter().any(|d| d["type"] == c["type"]));
    let (mut approved, mut denied) = (false, false);
    for (i, c) in conditions(csr).iter().enumerate() {
        let field = |f: &str| format!("status.conditions[{i}].{f}");
        let type_ = condition_type(c);
        if type_.is_empty() {
            causes.push(Cause::required(field("type")));
        }
        let status = c.get("status").and_then(Value::as_str).unwrap_or_default();
        let allowed: &[&str] = if TRUE_ONLY.contains(&type_) { &["True"] } else { &["False", "True", "Unknown"] };
        if status.is_empty() {
            causes.push(Cause::required(field("status")));
        } else if !allowed.contains(&status) {
            let list: Vec<String> = allowed.iter().map(|s| format!("{s:?}")).collect();
            causes.push(Cause {
                reason: "FieldValueNotSupported",
                message: format!("Unsupported value: {status:?}: supported values: {}", list.join(", ")),
                field: field("status"),
            });
        }
        if !had_both {
            approved |= type_ == "Approved";
            denied |= type_ == "Denied";
            if approved && denied && APPROVAL_TYPES.contains(&type_) {
                causes.push(Cause::invalid(
                    field("type"),
                    format!("Invalid value: {type_:?}: Approved and Denied conditions are mutually exclusive"),
                ));
            }
        }
        if !had_duplicates && conditions(csr)[..i].iter().any(|d| condition_type(d) == type_) {
            causes.push(Cause {
                reason: "FieldValueDuplicate",
                message: format!("Duplicate value: {type_:?}"),
                field: field("type"),
            });
        }
    }
    causes
}

/// A request's checks on create, and on an update through `subresource`
/// from `old`.
pub fn validate_csr_change(subresource: Option<&str>, new: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = validate_request(new, old);
    causes.extend(validate_conditions(new, old));
    let tolerated_certificate = old.is_some_and(|o| certificate_problem(certificate(o)).is_some());
    if !tolerated_certificate {
        if let Some(problem) = certificate_problem(certificate(new)) {
            causes.push(Cause::invalid(
                "status.certificate",
                format!("Invalid value: \"<certificate data>\": {problem}"),
            ));
        }
    }
    let Some(old) = old else { return causes };
    for type_ in ["Approved", "Denied", "Failed"] {
        if of_type(new, type_).len() < of_type(old, type_).len() {
            causes.push(Cause::forbidden(
                "status.conditions",
                format!("Forbidden: updates may not remove a condition of type {type_:?}"),
            ));
        }
    }
    if subresource != Some("approval") {
        for type_ in APPROVAL_TYPES {
            let (was, is) = (of_type(old, type_), of_type(new, type_));
            if is.len() > was.len() {
                causes.push(Cause::forbidden(
                    "status.conditions",
                    format!("Forbidden: updates may not add a condition of type {type_:?}"),
                ));
            } else if is.len() == was.len() && is != was {
                causes.push(Cause::forbidden(
                    "status.conditions",
                    format!("Forbidden: updates may not modify a condition of type {type_:?}"),
                ));
            }
        }
    }
    if certificate(new) != certificate(old) {
        if subresource != Some("status") {
            causes.push(Cause::forbidden("status.certificate", "Forbidden: updates may not set certificate content"));
        } else if !certificate(old).is_empty() && !tolerated_certificate {
            causes.push(Cause::forbidden(
                "status.certificate",
                "Forbidden: updates may not modify existing certificate content",
            ));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr(conditions: Value, certificate: Option<&str>) -> Value {
        let mut c = json!({"spec": {"request": "", "signerName": "example.com/s", "usages": ["client auth"]},
                           "status": {"conditions": conditions}});
        if let Some(cert) = certificate {
            c["status"]["certificate"] = json!(cert);
        }
        c
    }

    fn fields(causes: &[Cause]) -> Vec<String> {
        causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect()
    }

    #[test]
    fn status_keeps_the_approval_and_approval_keeps_the_rest() {
        let old = csr(json!([{"type": "Approved", "status": "True", "reason": "Human", "lastUpdateTime": "t0"}]), None);
        let tampered = csr(
            json!([{"type": "Approved", "status": "True", "reason": "Forged"}, {"type": "Failed", "status": "True"}]),
            Some("Y2VydA=="),
        );
        let new = csr_subresource_update("status", tampered.clone(), &old);
        assert_eq!(new["status"]["conditions"][0]["reason"], "Human");
        assert!(new["status"]["conditions"][1]["lastUpdateTime"].is_string());
        let mut tampered = tampered;
        tampered["metadata"]["annotations"] = json!({"patched": "true"});
        let approved = csr_subresource_update("approval", tampered, &old);
        assert!(approved["status"].get("certificate").is_none(), "{approved}");
        assert_eq!(approved["metadata"]["annotations"]["patched"], "true");
        assert_eq!(approved["status"]["conditions"][1]["type"], "Failed");
    }

    #[test]
    fn approval_conditions_change_through_approval_only_and_never_go() {
        let old = csr(json!([{"type": "Approved", "status": "True"}]), None);
        let gone = csr(json!([]), None);
        assert!(fields(&validate_csr_change(Some("approval"), &gone, Some(&old)))
            .iter()
            .any(|f| f.contains("may not remove a condition of type \"Approved\"")));
        let denied = csr(json!([{"type": "Denied", "status": "True"}]), None);
        let from_pending = validate_csr_change(Some("status"), &denied, Some(&gone));
        assert!(fields(&from_pending).iter().any(|f| f.contains("may not add a condition of type \"Denied\"")));
        assert!(fields(&validate_csr_change(Some("approval"), &denied, Some(&gone)))
            .iter()
            .all(|f| !f.contains("Denied")));
        let both = csr(json!([{"type": "Approved", "status": "True"}, {"type": "Denied", "status": "True"}]), None);
        assert!(fields(&validate_csr_change(Some("approval"), &both, Some(&old)))
            .iter()
            .any(|f| f.contains("mutually exclusive")));
        let false_approval = csr(json!([{"type": "Approved", "status": "False"}]), None);
        assert!(fields(&validate_csr_change(Some("approval"), &false_approval, Some(&gone)))
            .iter()
            .any(|f| f.starts_with("status.conditions[0].status: Unsupported value")));
    }

    #[test]
    fn certificates_are_pem_and_set_once() {
        assert_eq!(certificate_problem(""), None);
        let garbage = base64::engine::general_purpose::STANDARD.encode("not a certificate");
        assert_eq!(certificate_problem(&garbage).as_deref(), Some("must contain at least one CERTIFICATE PEM block"));
        let ca = crate::pki::Ca::generate("t").unwrap();
        let good = base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem);
        assert_eq!(certificate_problem(&good), None);
        let old = csr(json!([{"type": "Approved", "status": "True"}]), Some(&good));
        let other = base64::engine::general_purpose::STANDARD.encode(crate::pki::Ca::generate("u").unwrap().cert_pem);
        let changed = csr(json!([{"type": "Approved", "status": "True"}]), Some(&other));
        assert!(fields(&validate_csr_change(Some("status"), &changed, Some(&old)))
            .iter()
            .any(|f| f.contains("may not modify existing certificate content")));
        let pending = csr(json!([]), None);
        let set = csr(json!([]), Some(&good));
        assert!(fields(&validate_csr_change(None, &set, Some(&pending)))
            .iter()
            .any(|f| f.contains("may not set certificate content")));
    }

    #[test]
    fn signer_names() {
        assert_eq!(signer_name_problem("example.com/my-signer"), None);
        assert_eq!(signer_name_problem("kubernetes.io/kube-apiserver-client"), None);
        assert!(signer_name_problem("example/s").is_some());
        assert!(signer_name_problem("example.com").is_some());
        assert!(signer_name_problem("example.com/a/b").is_some());
    }
}

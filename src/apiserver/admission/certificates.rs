//! The certificates API's admission plugins, as upstream's:
//! CertificateApproval (approving or denying a request through `approval`
//! needs `approve` on the `signers` resource named after its signer, or
//! `<domain>/*`), CertificateSigning (setting a certificate or a condition
//! through `status` needs `sign` there likewise) and
//! CertificateSubjectRestriction (no request for the
//! `kubernetes.io/kube-apiserver-client` signer may ask for the
//! `system:masters` group).

use base64::Engine;
use serde_json::Value;

use super::Operation;
use crate::apiserver::auth::rbac::Attributes;
use crate::apiserver::call::Call;
use crate::apiserver::status::{ApiError, ApiResult};

const GROUP: &str = "certificates.k8s.io";

fn signer_name(csr: &Value) -> &str {
    csr.pointer("/spec/signerName").and_then(Value::as_str).unwrap_or_default()
}

/// Whether the caller may `verb` the signer, by its name or its domain's
/// wildcard (`example.com/*`).
fn authorized_for_signer(call: &Call, verb: &str, signer: &str) -> bool {
    let attrs = |name: String| Attributes {
        verb: verb.into(),
        group: GROUP.into(),
        resource: "signers".into(),
        name,
        ..Default::default()
    };
    if call.api.allowed(&call.user, &attrs(signer.to_string())) {
        return true;
    }
    let domain = signer.split_once('/').map_or(signer, |(d, _)| d);
    call.api.allowed(&call.user, &attrs(format!("{domain}/*")))
}

fn refuse(obj: &Value, why: String) -> ApiError {
    let name = crate::apiserver::meta::name_of(obj);
    ApiError::forbidden_object(GROUP, "certificatesigningrequests", name, &why)
}

pub fn admit(call: &Call, obj: &Value, old: Option<&Value>, op: Operation) -> ApiResult<()> {
    if call.resource.group != GROUP || call.resource.plural != "certificatesigningrequests" {
        return Ok(());
    }
    match (call.path.subresource.as_deref(), op) {
        (None, Operation::Create) => subject_restriction(obj),
        (Some("approval"), Operation::Update) => {
            let signer = signer_name(obj);
            if !authorized_for_signer(call, "approve", signer) {
                return Err(refuse(obj, format!("user not permitted to approve requests with signerName {signer:?}")));
            }
            Ok(())
        }
        (Some("status"), Operation::Update) => {
            let Some(old) = old else { return Ok(()) };
            let unchanged = |field: &str| obj.pointer(field) == old.pointer(field);
            if unchanged("/status/certificate") && unchanged("/status/conditions") {
                return Ok(());
            }
            let signer = signer_name(old);
            if !authorized_for_signer(call, "sign", signer) {
                return Err(refuse(obj, format!("user not permitted to sign requests with signerName {signer:?}")));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn subject_restriction(obj: &Value) -> ApiResult<()> {
    if signer_name(obj) != "kubernetes.io/kube-apiserver-client" {
        return Ok(());
    }
    let request = obj.pointer("/spec/request").and_then(Value::as_str).unwrap_or_default();
    let text: String = request.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let pem = base64::engine::general_purpose::STANDARD.decode(text).unwrap_or_default();
    let req = crate::pki::csr::CertificateRequest::from_pem(&pem)
        .map_err(|e| refuse(obj, format!("failed to parse CSR: {e}")))?;
    if req.organizations.iter().any(|o| o == "system:masters") {
        return Err(refuse(
            obj,
            "use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed".into(),
        ));
    }
    Ok(())
}

//! The controllers of the certificates API, upstream's
//! `pkg/controller/certificates`, all acting as `certificate-controller`:
//! the signer (csrsigning) issues the certificates of approved requests for
//! the `kubernetes.io/*` signers with the cluster's CAs, the approver
//! (csrapproving) approves kubelets' client certificates after a
//! SubjectAccessReview, and the cleaner (csrcleaner) deletes requests once
//! they are done with. Here: what they share, upstream's reading of a
//! request's conditions and its checks of what each signer may sign.

pub mod approver;
pub mod cleaner;
pub mod signer;

use std::collections::BTreeSet;

use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};

use crate::pki::csr::{CertificateRequest, CsrError};

/// The service account the three controllers act as.
pub const CONTROLLER: &str = "certificate-controller";

pub const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
pub const KUBE_APISERVER_CLIENT_KUBELET: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
pub const LEGACY_UNKNOWN: &str = "kubernetes.io/legacy-unknown";

fn conditions(csr: &CertificateSigningRequest) -> &[CertificateSigningRequestCondition] {
    csr.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default()
}

/// Whether the request carries an Approved and a Denied condition
/// (whatever their status, as upstream reads them).
pub fn approval(csr: &CertificateSigningRequest) -> (bool, bool) {
    let has = |t: &str| conditions(csr).iter().any(|c| c.type_ == t);
    (has("Approved"), has("Denied"))
}

/// Approved and not denied.
pub fn is_approved(csr: &CertificateSigningRequest) -> bool {
    matches!(approval(csr), (true, false))
}

/// Whether a condition of `type_` holds (status True, or none given).
pub fn has_true_condition(csr: &CertificateSigningRequest, type_: &str) -> bool {
    conditions(csr).iter().any(|c| c.type_ == type_ && (c.status.is_empty() || c.status == "True"))
}

/// Whether the request has been issued its certificate.
pub fn is_issued(csr: &CertificateSigningRequest) -> bool {
    csr.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some_and(|c| !c.0.is_empty())
}

pub fn request(csr: &CertificateSigningRequest) -> Result<CertificateRequest, CsrError> {
    CertificateRequest::from_pem(&csr.spec.request.0)
}

fn usage_set(usages: &[String]) -> BTreeSet<&str> {
    usages.iter().map(String::as_str).collect()
}

fn same_set(usages: &BTreeSet<&str>, wanted: &[&str]) -> bool {
    usages.len() == wanted.len() && wanted.iter().all(|u| usages.contains(u))
}

/// Why a signer refuses a request, in upstream's words (the Failed
/// condition's message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("subject organization is not system:nodes")]
    OrganizationNotNodes,
    #[error("subject common name does not begin with system:node:")]
    CommonNameNotNode,
    /// `DNS`, `Email`, `IP` or `URI` names, which the signer does not allow.
    #[error("{0} subjectAltNames are not allowed")]
    SubjectAltNames(&'static str),
    #[error("DNS or IP subjectAltName is required")]
    NoSubjectAltName,
    /// The usages are not the signer's set (named as upstream lists it).
    #[error("usages did not match {0}")]
    Usages(&'static str),
    #[error("invalid usage for client certificate: {0}")]
    InvalidUsage(String),
    #[error("missing required usage for client certificate: client auth")]
    NoClientAuth,
}

fn organization_is_system_nodes(req: &CertificateRequest) -> Result<(), Refused> {
    if req.organizations != ["system:nodes"] {
        return Err(Refused::OrganizationNotNodes);
    }
    Ok(())
}

fn common_name_is_a_node(req: &CertificateRequest) -> Result<(), Refused> {
    if !req.common_name.starts_with("system:node:") {
        return Err(Refused::CommonNameNotNode);
    }
    Ok(())
}

/// A kubelet's client certificate: `system:node:<name>` in exactly
/// `system:nodes`, no names, for client auth and digital signature (and key
/// encipherment, which RSA keys use).
pub fn validate_kubelet_client(req: &CertificateRequest, usages: &[String]) -> Result<(), Refused> {
    organization_is_system_nodes(req)?;
    if !req.dns_names.is_empty() {
        return Err(Refused::SubjectAltNames("DNS"));
    }
    if !req.email_addresses.is_empty() {
        return Err(Refused::SubjectAltNames("Email"));
    }
    if !req.ip_addresses.is_empty() {
        return Err(Refused::SubjectAltNames("IP"));
    }
    if !req.uris.is_empty() {
        return Err(Refused::SubjectAltNames("URI"));
    }
    common_name_is_a_node(req)?;
    let set = usage_set(usages);
    if !same_set(&set, &["digital signature", "key encipherment", "client auth"])
        && !same_set(&set, &["digital signature", "client auth"])
    {
        return Err(Refused::Usages("[client auth digital signature key encipherment]"));
    }
    Ok(())
}

/// A kubelet's serving certificate: `system:node:<name>` in exactly
/// `system:nodes`, at least one DNS name or IP address and no other names,
/// for server auth and digital signature (and key encipherment).
pub fn validate_kubelet_serving(req: &CertificateRequest, usages: &[String]) -> Result<(), Refused> {
    organization_is_system_nodes(req)?;
    if req.dns_names.is_empty() && req.ip_addresses.is_empty() {
        return Err(Refused::NoSubjectAltName);
    }
    if !req.email_addresses.is_empty() {
        return Err(Refused::SubjectAltNames("Email"));
    }
    if !req.uris.is_empty() {
        return Err(Refused::SubjectAltNames("URI"));
    }
    let set = usage_set(usages);
    if !same_set(&set, &["digital signature", "key encipherment", "server auth"])
        && !same_set(&set, &["digital signature", "server auth"])
    {
        return Err(Refused::Usages("[digital signature key encipherment server auth]"));
    }
    common_name_is_a_node(req)
}

/// A client certificate for the API server: client auth, optionally
/// digital signature and key encipherment, nothing else.
pub fn validate_kube_apiserver_client(usages: &[String]) -> Result<(), Refused> {
    let mut client_auth = false;
    for u in usages {
        match u.as_str() {
            "digital signature" | "key encipherment" => {}
            "client auth" => client_auth = true,
            other => return Err(Refused::InvalidUsage(other.to_string())),
        }
    }
    if !client_auth {
        return Err(Refused::NoClientAuth);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(cn: &str, orgs: &[&str], dns: &[&str]) -> CertificateRequest {
        let subject = format!("{}/CN={cn}", orgs.iter().map(|o| format!("/O={o}")).collect::<String>());
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.pem");
        std::fs::write(&key, crate::pki::new_key_pem().unwrap()).unwrap();
        let mut args = vec!["req".to_string(), "-new".into(), "-key".into(), key.display().to_string()];
        args.extend(["-subj".into(), subject]);
        if !dns.is_empty() {
            let names: Vec<String> = dns.iter().map(|d| format!("DNS:{d}")).collect();
            args.extend(["-addext".into(), format!("subjectAltName={}", names.join(","))]);
        }
        let out = std::process::Command::new("openssl").args(&args).output().unwrap();
        assert!(out.status.success());
        CertificateRequest::from_pem(&out.stdout).unwrap()
    }

    fn usages(u: &[&str]) -> Vec<String> {
        u.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn kubelet_client_rules() {
        let good = req("system:node:a", &["system:nodes"], &[]);
        assert!(validate_kubelet_client(&good, &usages(&["digital signature", "client auth"])).is_ok());
        assert!(
            validate_kubelet_client(&good, &usages(&["client auth", "key encipherment", "digital signature"])).is_ok()
        );
        assert_eq!(
            validate_kubelet_client(&good, &usages(&["client auth"])).map_err(|e| e.to_string()),
            Err("usages did not match [client auth digital signature key encipherment]".into())
        );
        let named = req("system:node:a", &["system:nodes"], &["a.example"]);
        assert_eq!(
            validate_kubelet_client(&named, &usages(&["digital signature", "client auth"])).map_err(|e| e.to_string()),
            Err("DNS subjectAltNames are not allowed".into())
        );
        let alice = req("alice", &["system:nodes"], &[]);
        assert!(validate_kubelet_client(&alice, &usages(&["digital signature", "client auth"])).is_err());
        let two = req("system:node:a", &["system:nodes", "x"], &[]);
        assert_eq!(
            validate_kubelet_client(&two, &usages(&["digital signature", "client auth"])).map_err(|e| e.to_string()),
            Err("subject organization is not system:nodes".into())
        );
    }

    #[test]
    fn kubelet_serving_rules() {
        let named = req("system:node:a", &["system:nodes"], &["a.example"]);
        assert!(validate_kubelet_serving(&named, &usages(&["digital signature", "server auth"])).is_ok());
        let bare = req("system:node:a", &["system:nodes"], &[]);
        assert_eq!(
            validate_kubelet_serving(&bare, &usages(&["digital signature", "server auth"])).map_err(|e| e.to_string()),
            Err("DNS or IP subjectAltName is required".into())
        );
        assert!(validate_kubelet_serving(&named, &usages(&["digital signature", "client auth"])).is_err());
    }

    #[test]
    fn apiserver_client_rules() {
        assert!(validate_kube_apiserver_client(&usages(&["client auth"])).is_ok());
        assert_eq!(
            validate_kube_apiserver_client(&usages(&["digital signature", "server auth"])).map_err(|e| e.to_string()),
            Err("invalid usage for client certificate: server auth".into())
        );
        assert_eq!(
            validate_kube_apiserver_client(&usages(&["digital signature"])).map_err(|e| e.to_string()),
            Err("missing required usage for client certificate: client auth".into())
        );
    }
}

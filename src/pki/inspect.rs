//! What a certificate file holds, for people: each certificate of a PEM
//! bundle with its subject, what it is for, and when it expires.

use x509_parser::certificate::X509Certificate;

use super::CertError;

/// One certificate of a file, as `ferrok certificate check` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSummary {
    /// `CN=…,O=…`, the parts that say who holds it.
    pub subject: String,
    /// `CertSign` for a CA, else `ServerAuth` and/or `ClientAuth`.
    pub usages: Vec<&'static str>,
    pub is_ca: bool,
    /// Unix seconds.
    pub not_after: i64,
}

fn summarize(cert: &X509Certificate<'_>) -> CertSummary {
    let subject = cert.subject();
    let mut parts: Vec<String> =
        subject.iter_common_name().filter_map(|cn| cn.as_str().ok()).map(|cn| format!("CN={cn}")).collect();
    parts.extend(subject.iter_organization().filter_map(|o| o.as_str().ok()).map(|o| format!("O={o}")));
    let is_ca = cert.basic_constraints().ok().flatten().is_some_and(|b| b.value.ca);
    let mut usages = Vec::new();
    if is_ca {
        usages.push("CertSign");
    }
    if let Ok(Some(eku)) = cert.extended_key_usage() {
        if eku.value.server_auth {
            usages.push("ServerAuth");
        }
        if eku.value.client_auth {
            usages.push("ClientAuth");
        }
    }
    CertSummary { subject: parts.join(","), usages, is_ca, not_after: cert.validity().not_after.timestamp() }
}

/// Every certificate in a PEM text, in order; other PEM blocks (keys) are skipped.
pub fn summarize_pem(pem: &str) -> Result<Vec<CertSummary>, CertError> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|_| CertError::NotPem)?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let cert = block.parse_x509().map_err(|e| CertError::Parse(e.to_string()))?;
        out.push(summarize(&cert));
    }
    if out.is_empty() {
        return Err(CertError::NotPem);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{Ca, LeafSpec};

    #[test]
    fn a_bundle_of_a_ca_and_its_leaves() {
        let ca = Ca::generate("test-ca").unwrap();
        let server = ca.issue(&LeafSpec::server("kube-apiserver", vec!["localhost".into()], vec![])).unwrap();
        let client = ca.issue(&LeafSpec::client("system:admin", &["system:masters"])).unwrap();
        let bundle = format!("{}{}{}", ca.cert_pem, server.cert_pem, client.key_pem) + &client.cert_pem;
        let all = summarize_pem(&bundle).unwrap();
        assert_eq!(all.len(), 3);
        assert!(all[0].is_ca && all[0].usages == ["CertSign"] && all[0].subject.starts_with("CN=test-ca@"));
        assert_eq!(all[1].usages, ["ServerAuth"]);
        assert_eq!(all[1].subject, "CN=kube-apiserver");
        assert_eq!(all[2].usages, ["ClientAuth"]);
        assert_eq!(all[2].subject, "CN=system:admin,O=system:masters");
        let year = 365 * 86_400;
        let left = all[1].not_after - time::OffsetDateTime::now_utc().unix_timestamp();
        assert!((year - 86_400..=year).contains(&left), "{left}");
        assert!(matches!(summarize_pem("not pem"), Err(CertError::NotPem)));
        assert!(matches!(summarize_pem(&client.key_pem), Err(CertError::NotPem)));
    }
}

//! CA bundles as text. A CA's certificate file holds the CA first; after a
//! rotation (`ferrok certificate rotate-ca`) it also holds the certificate
//! that cross-signs the new CA with the old one, and ends with the old
//! bundle exactly as it was, so that:
//! - leaves are sent with the cross-signed certificate, and whoever trusts
//!   only the old CA still reaches it through that certificate;
//! - a join token, which names the SHA-256 of the bundle it was made for,
//!   still names a trailing part of the new bundle.

use x509_parser::certificate::X509Certificate;

use super::certs::{ca_hash, CertError};

/// The PEM blocks of `text`, each exactly as written (from its `-----BEGIN`
/// line to the end of its `-----END` line).
pub fn blocks(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let from = &rest[start..];
        let Some(end) = from.find("-----END ") else { break };
        let tail = &from[end..];
        let line_end = tail.find('\n').map(|i| i + 1).unwrap_or(tail.len());
        out.push(&from[..end + line_end]);
        rest = &from[end + line_end..];
    }
    out
}

/// The DER of every certificate in `text`, in order.
pub fn certificates(text: &str) -> Result<Vec<Vec<u8>>, CertError> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(text.as_bytes()) {
        let block = block.map_err(|_| CertError::NotPem)?;
        if block.label == "CERTIFICATE" {
            out.push(block.contents);
        }
    }
    Ok(out)
}

pub(super) fn parse(der: &[u8]) -> Result<X509Certificate<'_>, CertError> {
    x509_parser::parse_x509_certificate(der).map(|(_, c)| c).map_err(|e| CertError::Parse(e.to_string()))
}

/// The certificates a leaf is sent with: those of the bundle after the CA
/// itself that are not self-signed (the cross-signed ones), as PEM.
pub fn chain_pem(bundle: &str) -> Result<String, CertError> {
    let mut chain = String::new();
    for block in blocks(bundle).into_iter().skip(1) {
        let Some(der) = certificates(block)?.into_iter().next() else { continue };
        let cert = parse(&der)?;
        let self_signed =
            cert.issuer().as_raw() == cert.subject().as_raw() && cert.verify_signature(Some(cert.public_key())).is_ok();
        if !self_signed {
            chain.push_str(block);
            if !block.ends_with('\n') {
                chain.push('\n');
            }
        }
    }
    Ok(chain)
}

/// The trailing part of `bundle`, from the start of one of its PEM blocks
/// (the whole bundle included), whose SHA-256 is `hash`: the bundle a join
/// token was made for, which a rotation keeps at the end of the new one.
pub fn suffix_with_hash<'a>(bundle: &'a str, hash: &str) -> Option<&'a str> {
    bundle
        .match_indices("-----BEGIN ")
        .map(|(i, _)| i)
        .filter(|&i| i == 0 || bundle.as_bytes()[i - 1] == b'\n')
        .map(|i| &bundle[i..])
        .find(|suffix| ca_hash(suffix.as_bytes()).eq_ignore_ascii_case(hash))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::Ca;

    #[test]
    fn a_rotated_bundle_chains_leaves_and_keeps_the_old_hash() {
        let old = Ca::generate("test-ca").unwrap();
        let (new, cross) = old.successor("test-ca").unwrap();
        let bundle = format!("{}{cross}{}", new.cert_pem, old.cert_pem);
        assert_eq!(blocks(&bundle).len(), 3);
        assert_eq!(certificates(&bundle).unwrap().len(), 3);
        // Only the cross-signed certificate goes with leaves.
        assert_eq!(chain_pem(&bundle).unwrap(), cross);
        assert_eq!(chain_pem(&old.cert_pem).unwrap(), "");
        // The old bundle's hash still names its end; the whole bundle its own.
        let old_hash = ca_hash(old.cert_pem.as_bytes());
        assert_eq!(suffix_with_hash(&bundle, &old_hash), Some(old.cert_pem.as_str()));
        assert_eq!(suffix_with_hash(&bundle, &ca_hash(bundle.as_bytes())), Some(bundle.as_str()));
        assert_eq!(suffix_with_hash(&bundle, &"0".repeat(64)), None);
        // A leaf of the new CA loaded from the bundle carries the chain and
        // was issued by the new CA, not the old one.
        let loaded = Ca::load(format!("{}{cross}{}", new.cert_pem, old.cert_pem), new.key_pem.clone()).unwrap();
        let leaf = loaded.issue(&crate::pki::LeafSpec::client("someone", &[])).unwrap();
        assert_eq!(blocks(&leaf.cert_pem).len(), 2);
        assert!(crate::pki::issued_by(&leaf.cert_pem, &loaded.cert_pem));
        assert!(!crate::pki::issued_by(&leaf.cert_pem, &old.cert_pem));
        // The cross-signed certificate is the old CA's work.
        assert!(crate::pki::issued_by(&cross, &old.cert_pem));
        assert!(!crate::pki::issued_by(&cross, &new.cert_pem));
    }
}

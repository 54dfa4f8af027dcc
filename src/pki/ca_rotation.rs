//! Rotating the cluster's CAs (`ferrok certificate rotate-ca`, k3s'
//! command of that name): a new CA is checked against the current one and
//! becomes the CA's new certificate file, which the next start of each
//! server uses to issue new leaves.
//!
//! Unless forced, the new CA must be signed by the current one, or come
//! with a certificate that cross-signs it (its subject and key, the current
//! CA as issuer); the new file then ends with the current one, so that
//! nodes and kubeconfigs that trust only the current CA keep trusting the
//! servers, and the servers keep trusting their client certificates.
//! Forced, the new CA replaces the current one outright: every node must
//! then join again with the new token, and kubeconfigs be handed out anew.

use std::collections::BTreeMap;

use rcgen::{KeyPair, PublicKeyData};

use super::ca_bundle::{blocks, certificates, parse};
use super::certs::{Ca, CertError};

/// The CAs a rotation may replace, by the base name of their files.
pub const ROTATED_CAS: [(&str, &str); 2] = [("server-ca", "ferrok-server-ca"), ("client-ca", "ferrok-client-ca")];

#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
    #[error(
        "{file}: the new CA is neither signed nor cross-signed by the current CA: add a certificate of it signed by the current CA, or use --force (every node must then join again with the new token)"
    )]
    NotCrossSigned { file: String },
    #[error("{0}")]
    Cert(#[from] CertError),
}

fn invalid(file: &str, message: impl Into<String>) -> RotationError {
    RotationError::Invalid { file: file.to_string(), message: message.into() }
}

/// What replaces one CA: its new certificate file and key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NewCa {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A successor of `current` made here, cross-signed by it.
pub fn generate(current: &Ca, cn: &str) -> Result<NewCa, RotationError> {
    let (new, cross) = current.successor(cn)?;
    Ok(NewCa { cert_pem: format!("{}{cross}", new.cert_pem), key_pem: new.key_pem })
}

/// Checks `new` (the files `<base>.crt` and `<base>.key` of a rotation)
/// against the current CA file `current_bundle`, and returns the new CA
/// file: `new`'s certificates, followed (unless forced) by the current
/// file exactly as it is.
pub fn plan(base: &str, new: &NewCa, current_bundle: &str, force: bool) -> Result<String, RotationError> {
    let crt = format!("{base}.crt");
    let ders = certificates(&new.cert_pem).map_err(|e| invalid(&crt, e.to_string()))?;
    let Some(first_der) = ders.first() else { return Err(invalid(&crt, "no certificate in it")) };
    let first = parse(first_der).map_err(|e| invalid(&crt, e.to_string()))?;
    if !first.basic_constraints().ok().flatten().is_some_and(|b| b.value.ca) {
        return Err(invalid(&crt, "its first certificate is not a CA"));
    }
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    if first.validity().not_after.timestamp() <= now || first.validity().not_before.timestamp() > now + 3600 {
        return Err(invalid(&crt, "the new CA is not valid now"));
    }
    let key = KeyPair::from_pem(&new.key_pem).map_err(|e| invalid(&format!("{base}.key"), e.to_string()))?;
    if key.subject_public_key_info() != first.public_key().raw {
        return Err(invalid(&format!("{base}.key"), format!("the key does not belong to the CA of {crt}")));
    }
    let current_ders = certificates(current_bundle)?;
    let Some(current_der) = current_ders.first() else { return Err(invalid(&crt, "the current CA file is empty")) };
    if current_der == first_der {
        return Err(invalid(&crt, "this is the current CA"));
    }
    let mut bundle = blocks(&new.cert_pem).concat();
    if force {
        return Ok(bundle);
    }
    let current = parse(current_der)?;
    let chained = ders.iter().filter_map(|d| parse(d).ok()).any(|c| {
        c.public_key().raw == first.public_key().raw
            && c.issuer().as_raw() == current.subject().as_raw()
            && c.verify_signature(Some(current.public_key())).is_ok()
    });
    if !chained {
        return Err(RotationError::NotCrossSigned { file: crt });
    }
    if !ders.contains(current_der) {
        bundle.push_str(current_bundle);
    }
    Ok(bundle)
}

/// The files a rotation writes (name → contents) for the new CAs given by
/// base name, each checked against the CA files in `current` (name →
/// contents, as read from the TLS folder).
pub fn files(
    new: &BTreeMap<String, NewCa>,
    current: &BTreeMap<String, String>,
    force: bool,
) -> Result<BTreeMap<String, String>, RotationError> {
    let mut out = BTreeMap::new();
    for (base, ca) in new {
        if !ROTATED_CAS.iter().any(|(b, _)| b == base) {
            return Err(invalid(base, "not a CA that can be rotated (server-ca, client-ca)"));
        }
        let crt = format!("{base}.crt");
        let existing = current.get(&crt).ok_or_else(|| invalid(&crt, "the current CA file is missing"))?;
        out.insert(crt, plan(base, ca, existing, force)?);
        out.insert(format!("{base}.key"), ca.key_pem.clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cross_signed_successor_is_taken_and_keeps_the_old_ca() {
        let old = Ca::generate("ferrok-server-ca").unwrap();
        let new = generate(&old, "ferrok-server-ca").unwrap();
        let bundle = plan("server-ca", &new, &old.cert_pem, false).unwrap();
        assert!(bundle.starts_with(&new.cert_pem) && bundle.ends_with(&old.cert_pem));
        let loaded = Ca::load(bundle.clone(), new.key_pem.clone()).unwrap();
        assert_eq!(loaded.own_cert_pem(), blocks(&new.cert_pem)[0]);
        // Forced, the old CA is not kept.
        assert_eq!(plan("server-ca", &new, &old.cert_pem, true).unwrap(), new.cert_pem);
        // A second rotation keeps the whole chain back to the first CA.
        let newer = generate(&loaded, "ferrok-server-ca").unwrap();
        let again = plan("server-ca", &newer, &bundle, false).unwrap();
        assert!(again.ends_with(&old.cert_pem));
        assert_eq!(blocks(&again).len(), 5);
    }

    #[test]
    fn unrelated_or_broken_cas_are_refused() {
        let old = Ca::generate("ferrok-server-ca").unwrap();
        let stranger = Ca::generate("someone-else").unwrap();
        let unrelated = NewCa { cert_pem: stranger.cert_pem.clone(), key_pem: stranger.key_pem.clone() };
        let e = plan("server-ca", &unrelated, &old.cert_pem, false).unwrap_err();
        assert!(matches!(e, RotationError::NotCrossSigned { .. }), "{e}");
        assert!(plan("server-ca", &unrelated, &old.cert_pem, true).is_ok());
        let wrong_key = NewCa { cert_pem: stranger.cert_pem.clone(), key_pem: old.key_pem.clone() };
        assert!(plan("server-ca", &wrong_key, &old.cert_pem, true).unwrap_err().to_string().contains("server-ca.key"));
        let same = NewCa { cert_pem: old.cert_pem.clone(), key_pem: old.key_pem.clone() };
        assert!(plan("server-ca", &same, &old.cert_pem, true).unwrap_err().to_string().contains("current CA"));
        let leaf = old.issue(&crate::pki::LeafSpec::client("x", &[])).unwrap();
        let not_ca = NewCa { cert_pem: leaf.cert_pem, key_pem: leaf.key_pem };
        assert!(plan("server-ca", &not_ca, &old.cert_pem, true).unwrap_err().to_string().contains("not a CA"));
        let empty = NewCa { cert_pem: String::new(), key_pem: old.key_pem.clone() };
        assert!(plan("server-ca", &empty, &old.cert_pem, true).is_err());
        let mut new = BTreeMap::new();
        new.insert("etcd-ca".to_string(), unrelated);
        assert!(files(&new, &BTreeMap::new(), true).is_err());
    }
}

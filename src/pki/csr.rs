//! Certificates for the certificates API's signers: a PKCS#10 request read
//! as upstream's signers read it (its subject, names and public key, its
//! signature checked), and a certificate for it signed by one of the
//! cluster's CAs under the grant a signer decides (the usages it allows and
//! the validity), upstream's permissive policy: the subject and names are
//! the request's, every extension the request asks for besides is dropped,
//! and the certificate is never a CA.
//!
//! The certificate is written here rather than by rcgen, whose names hold
//! one value per attribute type: a request's subject (a user's several
//! groups are several `O` attributes) is copied byte for byte.

use std::net::IpAddr;

use rcgen::{KeyPair, PublicKeyData, SigningKey};
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use super::certs::Ca;

#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    #[error("PEM block type must be CERTIFICATE REQUEST")]
    NotRequest,
    #[error("{0}")]
    Parse(String),
    #[error("unable to verify certificate request signature")]
    Signature,
    #[error("unrecognized usage values: {0:?}")]
    UnknownUsages(Vec<String>),
    #[error("the signer has expired: NotAfter={0}")]
    SignerExpired(String),
    #[error("the CA key's algorithm cannot sign certificates here")]
    UnsupportedKey,
    #[error("{0}")]
    Key(#[from] rcgen::Error),
}

/// What a request asks for, as upstream's `x509.CertificateRequest` shows it.
#[derive(Debug, Clone)]
pub struct CertificateRequest {
    /// The subject's first common name (empty when it has none).
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub email_addresses: Vec<String>,
    pub uris: Vec<String>,
    /// The subject's DER, copied into the certificate.
    subject: Vec<u8>,
    /// The SubjectPublicKeyInfo's DER.
    public_key: Vec<u8>,
}

impl CertificateRequest {
    /// Reads the first PEM block of `pem`, which must be a `CERTIFICATE
    /// REQUEST` whose signature checks out with its own key.
    pub fn from_pem(pem: &[u8]) -> Result<Self, CsrError> {
        let (_, block) = x509_parser::pem::parse_x509_pem(pem).map_err(|_| CsrError::NotRequest)?;
        if block.label != "CERTIFICATE REQUEST" {
            return Err(CsrError::NotRequest);
        }
        Self::from_der(&block.contents)
    }

    fn from_der(der: &[u8]) -> Result<Self, CsrError> {
        let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(der)
            .map_err(|e| CsrError::Parse(e.to_string()))?;
        csr.verify_signature().map_err(|_| CsrError::Signature)?;
        let info = &csr.certification_request_info;
        let text = |a: &x509_parser::x509::AttributeTypeAndValue| a.as_str().ok().map(str::to_string);
        let mut req = CertificateRequest {
            common_name: info.subject.iter_common_name().next().and_then(text).unwrap_or_default(),
            organizations: info.subject.iter_organization().filter_map(text).collect(),
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            email_addresses: Vec::new(),
            uris: Vec::new(),
            subject: info.subject.as_raw().to_vec(),
            public_key: info.subject_pki.raw.to_vec(),
        };
        for ext in csr.requested_extensions().into_iter().flatten() {
            let ParsedExtension::SubjectAlternativeName(san) = ext else { continue };
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(d) => req.dns_names.push(d.to_string()),
                    GeneralName::RFC822Name(e) => req.email_addresses.push(e.to_string()),
                    GeneralName::URI(u) => req.uris.push(u.to_string()),
                    GeneralName::IPAddress(b) => match b.len() {
                        4 => req.ip_addresses.extend(<[u8; 4]>::try_from(*b).ok().map(IpAddr::from)),
                        16 => req.ip_addresses.extend(<[u8; 16]>::try_from(*b).ok().map(IpAddr::from)),
                        _ => return Err(CsrError::Parse("an IP address of neither 4 nor 16 bytes".into())),
                    },
                    _ => {}
                }
            }
        }
        Ok(req)
    }

    /// Whether the public key is RSA (which may encipher keys).
    pub fn is_rsa(&self) -> bool {
        x509_parser::x509::SubjectPublicKeyInfo::from_der(&self.public_key)
            .is_ok_and(|(_, spki)| spki.algorithm.algorithm == x509_parser::oid_registry::OID_PKCS1_RSAENCRYPTION)
    }
}

/// What a signer grants: the usages (as the certificates API names them)
/// and the validity, in Unix seconds.
#[derive(Debug, Clone)]
pub struct Grant {
    pub usages: Vec<String>,
    pub not_before: i64,
    pub not_after: i64,
}

/// The key usage bits (RFC 5280 order) and extended key usage OIDs that
/// `usages` name, the extended ones in Go's order of them.
fn key_usages(usages: &[String]) -> Result<(u16, Vec<&'static [u64]>), CsrError> {
    const EXTENDED: &[(&str, &[u64])] = &[
        ("any", &[2, 5, 29, 37, 0]),
        ("server auth", &[1, 3, 6, 1, 5, 5, 7, 3, 1]),
        ("client auth", &[1, 3, 6, 1, 5, 5, 7, 3, 2]),
        ("code signing", &[1, 3, 6, 1, 5, 5, 7, 3, 3]),
        ("email protection", &[1, 3, 6, 1, 5, 5, 7, 3, 4]),
        ("s/mime", &[1, 3, 6, 1, 5, 5, 7, 3, 4]),
        ("ipsec end system", &[1, 3, 6, 1, 5, 5, 7, 3, 5]),
        ("ipsec tunnel", &[1, 3, 6, 1, 5, 5, 7, 3, 6]),
        ("ipsec user", &[1, 3, 6, 1, 5, 5, 7, 3, 7]),
        ("timestamping", &[1, 3, 6, 1, 5, 5, 7, 3, 8]),
        ("ocsp signing", &[1, 3, 6, 1, 5, 5, 7, 3, 9]),
        ("microsoft sgc", &[1, 3, 6, 1, 4, 1, 311, 10, 3, 3]),
        ("netscape sgc", &[2, 16, 840, 1, 113730, 4, 1]),
    ];
    let bit = |u: &str| -> Option<u16> {
        Some(match u {
            "signing" | "digital signature" => 0,
            "content commitment" => 1,
            "key encipherment" => 2,
            "data encipherment" => 3,
            "key agreement" => 4,
            "cert sign" => 5,
            "crl sign" => 6,
            "encipher only" => 7,
            "decipher only" => 8,
            _ => return None,
        })
    };
    let mut bits = 0u16;
    let mut extended: Vec<&'static [u64]> = Vec::new();
    let mut unknown = Vec::new();
    for u in usages {
        if let Some(b) = bit(u) {
            bits |= 0x8000 >> b;
        } else if EXTENDED.iter().any(|(name, _)| name == u) {
            for (name, oid) in EXTENDED {
                if name == u && !extended.contains(oid) {
                    extended.push(oid);
                }
            }
        } else {
            unknown.push(u.clone());
        }
    }
    if !unknown.is_empty() {
        return Err(CsrError::UnknownUsages(unknown));
    }
    let rank = |oid: &&[u64]| EXTENDED.iter().position(|(_, o)| o == oid).unwrap_or(usize::MAX);
    extended.sort_by_key(rank);
    Ok((bits, extended))
}

impl Ca {
    /// When this CA's own certificate expires, in Unix seconds.
    pub fn not_after(&self) -> Result<i64, CsrError> {
        let der = super::certs::pem_der(self.own_cert_pem()).map_err(|e| CsrError::Parse(e.to_string()))?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| CsrError::Parse(e.to_string()))?;
        Ok(cert.validity().not_after.timestamp())
    }

    /// A certificate for `req` as `grant` allows, PEM, followed by the
    /// certificates that chain this CA to the CAs before it (if it rotated).
    pub fn sign_certificate_request(&self, req: &CertificateRequest, grant: &Grant) -> Result<String, CsrError> {
        let (bits, extended) = key_usages(&grant.usages)?;
        let ca_der = super::certs::pem_der(self.own_cert_pem()).map_err(|e| CsrError::Parse(e.to_string()))?;
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).map_err(|e| CsrError::Parse(e.to_string()))?;
        let key = KeyPair::from_pem(&self.key_pem)?;
        let algorithm = signature_algorithm(&key)?;

        let mut extensions = Vec::new();
        if bits != 0 {
            extensions.push(extension(&[2, 5, 29, 15], true, &der::bit_string(bits)));
        }
        if !extended.is_empty() {
            let oids: Vec<Vec<u8>> = extended.iter().map(|o| der::oid(o)).collect();
            extensions.push(extension(&[2, 5, 29, 37], false, &der::sequence(&oids)));
        }
        // Basic constraints, not a CA (an empty sequence, as Go writes it).
        extensions.push(extension(&[2, 5, 29, 19], true, &der::sequence(&[])));
        let mut names = Vec::new();
        names.extend(req.email_addresses.iter().map(|e| der::tagged(0x81, e.as_bytes())));
        names.extend(req.dns_names.iter().map(|d| der::tagged(0x82, d.as_bytes())));
        names.extend(req.uris.iter().map(|u| der::tagged(0x86, u.as_bytes())));
        names.extend(req.ip_addresses.iter().map(|ip| match ip {
            IpAddr::V4(v4) => der::tagged(0x87, &v4.octets()),
            IpAddr::V6(v6) => der::tagged(0x87, &v6.octets()),
        }));
        if !names.is_empty() {
            extensions.push(extension(&[2, 5, 29, 17], false, &der::sequence(&names)));
        }
        let ca_key_id = ca.extensions().iter().find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0.to_vec()),
            _ => None,
        });
        if let Some(id) = ca_key_id {
            extensions.push(extension(&[2, 5, 29, 35], false, &der::sequence(&[der::tagged(0x80, &id)])));
        }

        let mut serial = [0u8; 16];
        crate::host::random::fill(&mut serial);
        serial[0] = (serial[0] & 0x7f) | 0x40;
        let tbs = der::sequence(&[
            der::tagged(0xa0, &der::integer(&[2])),
            der::integer(&serial),
            algorithm.clone(),
            ca.subject().as_raw().to_vec(),
            der::sequence(&[der::time(grant.not_before)?, der::time(grant.not_after)?]),
            req.subject.clone(),
            req.public_key.clone(),
            der::tagged(0xa3, &der::sequence(&extensions)),
        ]);
        let signature = key.sign(&tbs)?;
        let cert = der::sequence(&[tbs, algorithm, der::bit_string_bytes(&signature)]);
        Ok(pem("CERTIFICATE", &cert) + self.chain_pem())
    }
}

/// The AlgorithmIdentifier of signatures by `key`.
fn signature_algorithm(key: &KeyPair) -> Result<Vec<u8>, CsrError> {
    let alg = PublicKeyData::algorithm(key);
    let (oid, null_params): (&[u64], bool) = if alg == &rcgen::PKCS_ECDSA_P256_SHA256 {
        (&[1, 2, 840, 10045, 4, 3, 2], false)
    } else if alg == &rcgen::PKCS_ECDSA_P384_SHA384 {
        (&[1, 2, 840, 10045, 4, 3, 3], false)
    } else if alg == &rcgen::PKCS_ED25519 {
        (&[1, 3, 101, 112], false)
    } else if alg == &rcgen::PKCS_RSA_SHA256 {
        (&[1, 2, 840, 113549, 1, 1, 11], true)
    } else {
        return Err(CsrError::UnsupportedKey);
    };
    let mut parts = vec![der::oid(oid)];
    if null_params {
        parts.push(vec![0x05, 0x00]);
    }
    Ok(der::sequence(&parts))
}

fn extension(oid: &[u64], critical: bool, value: &[u8]) -> Vec<u8> {
    let mut parts = vec![der::oid(oid)];
    if critical {
        parts.push(vec![0x01, 0x01, 0xff]);
    }
    parts.push(der::tagged(0x04, value));
    der::sequence(&parts)
}

fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The few DER encodings a certificate needs.
mod der {
    use super::CsrError;

    fn length(len: usize) -> Vec<u8> {
        if len < 0x80 {
            return vec![len as u8];
        }
        let bytes: Vec<u8> = len.to_be_bytes().iter().copied().skip_while(|b| *b == 0).collect();
        let mut out = vec![0x80 | bytes.len() as u8];
        out.extend(bytes);
        out
    }

    pub fn tagged(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        out.extend(length(content.len()));
        out.extend_from_slice(content);
        out
    }

    pub fn sequence(parts: &[Vec<u8>]) -> Vec<u8> {
        tagged(0x30, &parts.concat())
    }

    /// A non-negative INTEGER from its big-endian bytes.
    pub fn integer(be: &[u8]) -> Vec<u8> {
        let trimmed: Vec<u8> = match be.iter().position(|b| *b != 0) {
            Some(i) => be[i..].to_vec(),
            None => vec![0],
        };
        let mut content = Vec::with_capacity(trimmed.len() + 1);
        if trimmed[0] & 0x80 != 0 {
            content.push(0);
        }
        content.extend(trimmed);
        tagged(0x02, &content)
    }

    pub fn oid(arcs: &[u64]) -> Vec<u8> {
        let mut content = Vec::new();
        let first = arcs.first().copied().unwrap_or(0) * 40 + arcs.get(1).copied().unwrap_or(0);
        for arc in std::iter::once(first).chain(arcs.iter().skip(2).copied()) {
            let mut groups = vec![(arc & 0x7f) as u8];
            let mut rest = arc >> 7;
            while rest > 0 {
                groups.push(0x80 | (rest & 0x7f) as u8);
                rest >>= 7;
            }
            content.extend(groups.iter().rev());
        }
        tagged(0x06, &content)
    }

    /// A named bit list (bit 0 the most significant of `bits`), DER's
    /// shortest form.
    pub fn bit_string(bits: u16) -> Vec<u8> {
        let bytes = bits.to_be_bytes();
        let used = if bytes[1] != 0 { 2 } else { 1 };
        let last = bytes[used - 1];
        let unused = if last == 0 { 0 } else { last.trailing_zeros() as u8 };
        let mut content = vec![unused];
        content.extend_from_slice(&bytes[..used]);
        tagged(0x03, &content)
    }

    /// A BIT STRING of whole bytes.
    pub fn bit_string_bytes(bytes: &[u8]) -> Vec<u8> {
        let mut content = vec![0];
        content.extend_from_slice(bytes);
        tagged(0x03, &content)
    }

    /// UTCTime through 2049, GeneralizedTime after, as RFC 5280 wants.
    pub fn time(unix: i64) -> Result<Vec<u8>, CsrError> {
        let at = time::OffsetDateTime::from_unix_timestamp(unix).map_err(|e| CsrError::Parse(e.to_string()))?;
        let (y, mo, d, h, mi, s) = (at.year(), u8::from(at.month()), at.day(), at.hour(), at.minute(), at.second());
        Ok(if (1950..2050).contains(&y) {
            tagged(0x17, format!("{:02}{mo:02}{d:02}{h:02}{mi:02}{s:02}Z", y % 100).as_bytes())
        } else {
            tagged(0x18, format!("{y:04}{mo:02}{d:02}{h:02}{mi:02}{s:02}Z").as_bytes())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(subject: &str, sans: &[&str]) -> String {
        // openssl is the request's author here, as it is for users.
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.pem");
        std::fs::write(&key, crate::pki::new_key_pem().unwrap()).unwrap();
        let mut args = vec!["req", "-new", "-key", key.to_str().unwrap(), "-subj", subject];
        let san = format!("subjectAltName={}", sans.join(","));
        if !sans.is_empty() {
            args.extend(["-addext", &san]);
        }
        let out = std::process::Command::new("openssl").args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn reads_subject_names_and_checks_the_signature() {
        let pem = request("/O=system:nodes/O=extra/CN=system:node:a", &["DNS:a.example", "IP:10.0.0.1"]);
        let req = CertificateRequest::from_pem(pem.as_bytes()).unwrap();
        assert_eq!(req.common_name, "system:node:a");
        assert_eq!(req.organizations, ["system:nodes", "extra"]);
        assert_eq!(req.dns_names, ["a.example"]);
        assert_eq!(req.ip_addresses, [IpAddr::from([10, 0, 0, 1])]);
        assert!(!req.is_rsa());
        let mut tampered = pem.replace("-----BEGIN CERTIFICATE REQUEST-----\n", "");
        tampered.insert_str(0, "-----BEGIN CERTIFICATE-----\n");
        assert!(matches!(CertificateRequest::from_pem(tampered.as_bytes()), Err(CsrError::NotRequest)));
    }

    #[test]
    fn signs_with_the_granted_usages_and_validity_and_the_requested_subject() {
        let ca = Ca::generate("test-ca").unwrap();
        let req = CertificateRequest::from_pem(request("/O=a/O=b/CN=alice", &["DNS:x.example"]).as_bytes()).unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let grant = Grant {
            usages: vec!["digital signature".into(), "key encipherment".into(), "client auth".into()],
            not_before: now - 300,
            not_after: now + 3600,
        };
        let pem = ca.sign_certificate_request(&req, &grant).unwrap();
        assert!(crate::pki::issued_by(&pem, &ca.cert_pem), "{pem}");
        let der = super::super::certs::pem_der(&pem).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert_eq!(cert.validity().not_after.timestamp(), now + 3600);
        assert_eq!(cert.validity().not_before.timestamp(), now - 300);
        let (cn, orgs) = crate::pki::subject_of(&der).unwrap();
        assert_eq!((cn.as_str(), orgs), ("alice", vec!["a".to_string(), "b".to_string()]));
        let ku = cert.key_usage().unwrap().unwrap().value;
        assert!(ku.digital_signature() && ku.key_encipherment() && !ku.key_cert_sign());
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        assert!(!cert.is_ca());
        let san = cert.subject_alternative_name().unwrap().unwrap().value;
        assert_eq!(san.general_names.len(), 1);
        // openssl reads it, and it verifies against the CA.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), &ca.cert_pem).unwrap();
        std::fs::write(dir.path().join("c.pem"), &pem).unwrap();
        let out = std::process::Command::new("openssl")
            .current_dir(dir.path())
            .args(["verify", "-CAfile", "ca.pem", "-purpose", "sslclient", "c.pem"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn unknown_usages_are_refused() {
        assert!(matches!(key_usages(&["flying".to_string()]), Err(CsrError::UnknownUsages(_))));
        let (bits, ext) = key_usages(&["client auth".into(), "server auth".into(), "decipher only".into()]).unwrap();
        assert_eq!(bits, 0x0080);
        assert_eq!(ext[0], &[1, 3, 6, 1, 5, 5, 7, 3, 1]);
        assert_eq!(der::bit_string(0x8000 | 0x2000), vec![0x03, 0x02, 0x05, 0xa0]);
        assert_eq!(der::bit_string(0x0080), vec![0x03, 0x03, 0x07, 0x00, 0x80]);
    }
}

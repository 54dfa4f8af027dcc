//! Certificates with rcgen: CAs (ten years), leaves (one year), and the
//! checks that decide whether a leaf on disk can be kept.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use sha2::{Digest, Sha256};
use time::{Duration, OffsetDateTime};

const CA_VALIDITY: Duration = Duration::days(3650);
const LEAF_VALIDITY: Duration = Duration::days(365);
/// A leaf this close to expiry is issued anew at start.
const RENEW_BEFORE: Duration = Duration::days(90);
pub const RENEW_BEFORE_SECONDS: i64 = RENEW_BEFORE.whole_seconds();

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("not a PEM certificate")]
    NotPem,
    #[error("cannot parse the certificate: {0}")]
    Parse(String),
}

pub struct Ca {
    /// The CA's certificate file: the CA itself first, then (after a
    /// rotation) the certificates that chain it to the CAs before it.
    pub cert_pem: String,
    pub key_pem: String,
    issuer: Issuer<'static, KeyPair>,
    /// What a leaf is sent with so that holders of an older CA still trust
    /// it: the bundle's cross-signed certificates (see [`super::ca_bundle::chain_pem`]).
    chain_pem: String,
}

pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What a leaf certificate says about its holder.
pub struct LeafSpec {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub server: bool,
}

impl LeafSpec {
    pub fn server(cn: &str, dns: Vec<String>, ips: Vec<IpAddr>) -> Self {
        LeafSpec { common_name: cn.into(), organizations: Vec::new(), dns, ips, server: true }
    }

    pub fn client(cn: &str, orgs: &[&str]) -> Self {
        LeafSpec {
            common_name: cn.into(),
            organizations: orgs.iter().map(|s| s.to_string()).collect(),
            dns: Vec::new(),
            ips: Vec::new(),
            server: false,
        }
    }
}

/// A new ECDSA P-256 key, PKCS#8 PEM.
pub fn new_key() -> Result<String, CertError> {
    Ok(KeyPair::generate()?.serialize_pem())
}

/// The SHA-256 of the CA bundle exactly as `/cacerts` serves it, hex, as
/// join tokens carry it (k3s' `K10<hash>`).
pub fn ca_hash(bundle: &[u8]) -> String {
    Sha256::digest(bundle).iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn pem_der(pem: &str) -> Result<Vec<u8>, CertError> {
    let (_, parsed) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|_| CertError::NotPem)?;
    Ok(parsed.contents)
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

/// A CA's parameters; its common name is `<cn>@<unix time of issue>`.
fn ca_params(cn: &str, stamp: i64) -> Result<CertificateParams, CertError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, format!("{cn}@{stamp}"));
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_before = now() - Duration::hours(1);
    params.not_after = now() + CA_VALIDITY;
    Ok(params)
}

impl Ca {
    pub fn generate(cn: &str) -> Result<Ca, CertError> {
        let key = KeyPair::generate()?;
        let params = ca_params(cn, now().unix_timestamp())?;
        let cert = params.self_signed(&key)?;
        let key_pem = key.serialize_pem();
        Ok(Ca { cert_pem: cert.pem(), key_pem, issuer: Issuer::new(params, key), chain_pem: String::new() })
    }

    /// A new CA to rotate to, and the same CA cross-signed by this one (its
    /// subject and key, this CA as issuer), so that whoever trusts this CA
    /// also trusts what the new one signs: `(new CA, cross-signed PEM)`.
    pub fn successor(&self, cn: &str) -> Result<(Ca, String), CertError> {
        let key = KeyPair::generate()?;
        // Never the name of the CA it succeeds: certificates chain by name.
        let mut stamp = now().unix_timestamp();
        let current_cn = pem_der(self.own_cert_pem()).ok().and_then(|der| subject_of(&der)).map(|(cn, _)| cn);
        if current_cn.as_deref() == Some(format!("{cn}@{stamp}").as_str()) {
            stamp += 1;
        }
        let params = ca_params(cn, stamp)?;
        let cert = params.self_signed(&key)?;
        let cross = params.signed_by(&key, &self.issuer)?;
        let key_pem = key.serialize_pem();
        let ca = Ca { cert_pem: cert.pem(), key_pem, issuer: Issuer::new(params, key), chain_pem: String::new() };
        Ok((ca, cross.pem()))
    }

    /// A CA from its certificate file (the CA first, maybe followed by
    /// the certificates of a rotation) and its key.
    pub fn load(cert_pem: String, key_pem: String) -> Result<Ca, CertError> {
        let key = KeyPair::from_pem(&key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)?;
        let chain_pem = super::ca_bundle::chain_pem(&cert_pem)?;
        Ok(Ca { cert_pem, key_pem, issuer, chain_pem })
    }

    /// The PEM of this CA's own certificate (the first of its file).
    pub fn own_cert_pem(&self) -> &str {
        super::ca_bundle::blocks(&self.cert_pem).first().copied().unwrap_or_default()
    }

    /// What a leaf is sent with: the rotation's cross-signed certificates.
    pub(super) fn chain_pem(&self) -> &str {
        &self.chain_pem
    }

    pub fn issue(&self, spec: &LeafSpec) -> Result<Issued, CertError> {
        let key = KeyPair::generate()?;
        let cert = spec.params()?.signed_by(&key, &self.issuer)?;
        Ok(Issued { cert_pem: cert.pem() + &self.chain_pem, key_pem: key.serialize_pem() })
    }

    /// Signs the public key of a PKCS#10 request (its signature checked)
    /// for the holder `spec` describes; what the request itself asks for
    /// (subject, names, usages) is ignored: the signer decides.
    pub fn sign_request(&self, csr_pem: &str, spec: &LeafSpec) -> Result<String, CertError> {
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)?;
        csr.params = spec.params()?;
        Ok(csr.signed_by(&self.issuer)?.pem() + &self.chain_pem)
    }
}

impl LeafSpec {
    fn params(&self) -> Result<CertificateParams, CertError> {
        let spec = self;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut name = DistinguishedName::new();
        for org in &spec.organizations {
            name.push(DnType::OrganizationName, org.clone());
        }
        name.push(DnType::CommonName, spec.common_name.clone());
        params.distinguished_name = name;
        for dns in &spec.dns {
            params.subject_alt_names.push(SanType::DnsName(dns.clone().try_into()?));
        }
        for ip in &spec.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages =
            vec![if spec.server { ExtendedKeyUsagePurpose::ServerAuth } else { ExtendedKeyUsagePurpose::ClientAuth }];
        params.not_before = now() - Duration::hours(1);
        params.not_after = now() + LEAF_VALIDITY;
        params.use_authority_key_identifier_extension = true;
        Ok(params)
    }
}

/// A PKCS#10 request for `cn` signed with the PKCS#8 PEM `key_pem`: the
/// node asks for a certificate without its key leaving it.
pub fn new_request(key_pem: &str, cn: &str) -> Result<String, CertError> {
    let key = KeyPair::from_pem(key_pem)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, cn.to_string());
    params.distinguished_name = name;
    Ok(params.serialize_request(&key)?.pem()?)
}

/// Seconds from now until the certificate expires (negative once it has).
pub fn seconds_left(cert_pem: &str) -> Result<i64, CertError> {
    let der = pem_der(cert_pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| CertError::Parse(e.to_string()))?;
    Ok(cert.validity().not_after.timestamp() - now().unix_timestamp())
}

/// Whether a certificate is far enough from expiry to keep.
pub fn far_from_expiry(cert_pem: &str) -> bool {
    seconds_left(cert_pem).is_ok_and(|s| s >= RENEW_BEFORE.whole_seconds())
}

/// Whether a leaf on disk is far enough from expiry and names what `spec` wants.
pub fn still_good(cert_pem: &str, spec: &LeafSpec) -> Result<bool, CertError> {
    use x509_parser::extensions::GeneralName;
    let der = pem_der(cert_pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| CertError::Parse(e.to_string()))?;
    let not_after = cert.validity().not_after.timestamp();
    if not_after - now().unix_timestamp() < RENEW_BEFORE.whole_seconds() {
        return Ok(false);
    }
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push(d.to_string()),
                GeneralName::IPAddress(b) if b.len() == 4 => {
                    ips.push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default()))
                }
                GeneralName::IPAddress(b) if b.len() == 16 => {
                    ips.push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default()))
                }
                _ => {}
            }
        }
    }
    Ok(spec.dns.iter().all(|d| dns.contains(d)) && spec.ips.iter().all(|i| ips.contains(i)))
}

/// Whether the (first) certificate of `cert_pem` was signed by the CA
/// whose certificate is the first of `ca_pem`: its issuer is that CA's
/// subject and the signature checks out with that CA's key.
pub fn issued_by(cert_pem: &str, ca_pem: &str) -> bool {
    let (Ok(cert), Ok(ca)) = (pem_der(cert_pem), pem_der(ca_pem)) else { return false };
    let (Ok((_, cert)), Ok((_, ca))) =
        (x509_parser::parse_x509_certificate(&cert), x509_parser::parse_x509_certificate(&ca))
    else {
        return false;
    };
    cert.issuer().as_raw() == ca.subject().as_raw() && cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// The user and groups a client certificate names: CN and O, as upstream reads them.
pub fn subject_of(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let cn = subject.iter_common_name().next()?.as_str().ok()?.to_string();
    let orgs = subject.iter_organization().filter_map(|o| o.as_str().ok().map(str::to_string)).collect();
    Some((cn, orgs))
}

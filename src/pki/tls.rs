//! rustls configurations: clients' from PEM (the CA a client trusts and
//! the certificate it presents), and the cipher suite order of clients and
//! servers.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::CipherSuite;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what}: {message}")]
    Pem { what: &'static str, message: String },
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A client that trusts the CAs of `ca_pem`, presents `identity`
/// (certificate chain and key, PEM) when given, and offers `alpn`.
pub fn client_config(
    ca_pem: &str,
    identity: Option<(&str, &str)>,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let pem =
        |what: &'static str| move |e: rustls::pki_types::pem::Error| TlsError::Pem { what, message: e.to_string() };
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.map_err(pem("the CA bundle"))?)?;
    }
    if roots.is_empty() {
        return Err(TlsError::Pem { what: "the CA bundle", message: "no certificate in it".into() });
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider(aes_hardware()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(pem("the client certificate"))?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(pem("the client key"))?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// The ring provider with its cipher suites in the order Go's crypto/tls
/// (kubectl, client-go, upstream's apiserver and kubelet) prefers them:
/// AES-GCM first when `aes_first` (AES-128 before AES-256: four fewer
/// rounds, the same strength in practice), ChaCha20-Poly1305 first
/// otherwise; TLS 1.3 before 1.2.
pub fn provider(aes_first: bool) -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| (s.tls13().is_none(), rank(cipher(s.suite()), aes_first)));
    Arc::new(p)
}

/// Whether this CPU encrypts AES-GCM in hardware (AES and carry-less
/// multiplication instructions), as Go's `hasAESGCMHardwareSupport`; std
/// reads the CPU's features once and caches them.
pub fn aes_hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes") && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Cipher {
    Aes128,
    Aes256,
    ChaCha,
    Other,
}

fn cipher(suite: CipherSuite) -> Cipher {
    use CipherSuite as C;
    match suite {
        C::TLS13_AES_128_GCM_SHA256
        | C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => Cipher::Aes128,
        C::TLS13_AES_256_GCM_SHA384
        | C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
        | C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => Cipher::Aes256,
        C::TLS13_CHACHA20_POLY1305_SHA256
        | C::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        | C::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => Cipher::ChaCha,
        _ => Cipher::Other,
    }
}

fn rank(c: Cipher, aes_first: bool) -> u8 {
    match (c, aes_first) {
        (Cipher::Aes128, true) | (Cipher::ChaCha, false) => 0,
        (Cipher::Aes256, true) | (Cipher::Aes128, false) => 1,
        (Cipher::ChaCha, true) | (Cipher::Aes256, false) => 2,
        (Cipher::Other, _) => 3,
    }
}

/// A server's configuration built in both suite orders, the one for each
/// client chosen as Go's crypto/tls chooses: the server's own order, AES-GCM
/// first when this CPU has AES instructions and the client prefers AES-GCM
/// to ChaCha20-Poly1305 (a client without AES instructions lists ChaCha20
/// first), ChaCha20-Poly1305 first otherwise.
#[derive(Clone)]
pub struct ServerSuites {
    aes_first: Arc<rustls::ServerConfig>,
    chacha_first: Arc<rustls::ServerConfig>,
}

impl ServerSuites {
    /// `build` makes the configuration with the provider it is given.
    pub fn new<E>(build: impl Fn(Arc<CryptoProvider>) -> Result<rustls::ServerConfig, E>) -> Result<Self, E> {
        let order = |aes_first: bool| -> Result<Arc<rustls::ServerConfig>, E> {
            let mut config = build(provider(aes_first))?;
            config.ignore_client_order = true;
            Ok(Arc::new(config))
        };
        Ok(ServerSuites { aes_first: order(true)?, chacha_first: order(false)? })
    }

    /// The configuration for a client that offered `suites`, in its order.
    pub fn for_client(&self, suites: &[CipherSuite]) -> Arc<rustls::ServerConfig> {
        let prefers_aes = suites.iter().map(|s| cipher(*s)).find(|c| *c != Cipher::Other) != Some(Cipher::ChaCha);
        if aes_hardware() && prefers_aes {
            self.aes_first.clone()
        } else {
            self.chacha_first.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(p: &CryptoProvider) -> Vec<Cipher> {
        p.cipher_suites.iter().filter(|s| s.tls13().is_some()).map(|s| cipher(s.suite())).collect()
    }

    #[test]
    fn suites_are_in_go_s_order() {
        assert_eq!(names(&provider(true)), [Cipher::Aes128, Cipher::Aes256, Cipher::ChaCha]);
        assert_eq!(names(&provider(false)), [Cipher::ChaCha, Cipher::Aes128, Cipher::Aes256]);
        assert!(provider(true).cipher_suites.iter().take(3).all(|s| s.tls13().is_some()));
    }

    #[test]
    fn a_client_that_lists_chacha_first_gets_it() {
        let suites = ServerSuites::new(|p| {
            let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).map_err(|e| e.to_string())?;
            let key = PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
            rustls::ServerConfig::builder_with_provider(p)
                .with_safe_default_protocol_versions()
                .and_then(|b| b.with_no_client_auth().with_single_cert(vec![cert.cert.der().clone()], key))
                .map_err(|e| e.to_string())
        })
        .unwrap();
        let first = |c: &rustls::ServerConfig| cipher(c.crypto_provider().cipher_suites[0].suite());
        use CipherSuite as C;
        let chacha_client = suites.for_client(&[C::TLS13_CHACHA20_POLY1305_SHA256, C::TLS13_AES_128_GCM_SHA256]);
        assert_eq!(first(&chacha_client), Cipher::ChaCha);
        let aes_client = suites.for_client(&[C::TLS13_AES_256_GCM_SHA384, C::TLS13_CHACHA20_POLY1305_SHA256]);
        let expected = if aes_hardware() { Cipher::Aes128 } else { Cipher::ChaCha };
        assert_eq!(first(&aes_client), expected);
        assert!(aes_client.ignore_client_order);
    }
}

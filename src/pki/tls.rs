//! rustls client configurations from PEM: the CA a client trusts and the
//! certificate it presents.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

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
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
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

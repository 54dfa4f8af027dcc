//! The kubelet API's serving certificate, read again when its file
//! changes (a renewed certificate is used from the next handshake on,
//! without a restart). One `stat` per handshake.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::ServerError;
use crate::sync::LockExt;

#[derive(Debug)]
pub struct ServingCert {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: Mutex<(Option<SystemTime>, Arc<CertifiedKey>)>,
}

fn modified(path: &PathBuf) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn load(
    cert: &PathBuf,
    key: &PathBuf,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<Arc<CertifiedKey>, ServerError> {
    let pem = |path: &PathBuf, e: &dyn std::fmt::Display| ServerError::Pem {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| pem(cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(cert, &e))?;
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| pem(key, &e))?;
    let signing = provider.key_provider.load_private_key(der).map_err(|e| pem(key, &e))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

impl ServingCert {
    pub fn load(
        cert: PathBuf,
        key: PathBuf,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<ServingCert, ServerError> {
        let stamp = modified(&cert);
        let certified = load(&cert, &key, &provider)?;
        Ok(ServingCert { cert, key, provider, current: Mutex::new((stamp, certified)) })
    }
}

impl rustls::server::ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.locked();
        let stamp = modified(&self.cert);
        if stamp != current.0 {
            match load(&self.cert, &self.key, &self.provider) {
                Ok(fresh) => {
                    tracing::info!(path = %self.cert.display(), "kubelet serving certificate reloaded");
                    *current = (stamp, fresh);
                }
                // A half-written pair: keep serving the old one and look again next time.
                Err(e) => tracing::debug!(error = %e, "cannot reload the kubelet serving certificate yet"),
            }
        }
        Some(current.1.clone())
    }
}

//! Kubeconfig files for the admin and for ferrok's own components.

use std::path::Path;

use base64::Engine;

use super::{write, PkiError};

/// Writes a kubeconfig that reaches `server` with a client certificate.
pub fn write_kubeconfig(
    path: &Path,
    mode: u32,
    server: &str,
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<(), PkiError> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: default
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: default
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: default
  context:
    cluster: default
    user: default
current-context: default
preferences: {{}}
",
        ca = b64(ca_pem),
        cert = b64(cert_pem),
        key = b64(key_pem),
    );
    write(path, &text, mode)
}

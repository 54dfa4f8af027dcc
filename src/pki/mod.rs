//! The cluster's PKI, generated on first start and reused afterwards: a
//! server CA (serving certificates), a client CA (client certificates), a
//! request-header CA (the front proxy's: the API server's client
//! certificate towards aggregated API servers, which trust the headers
//! naming the user only from it), the API server's serving certificate,
//! the admin client certificate, the service-account signing key and the
//! node join token. A leaf certificate
//! within 90 days of expiry, or a serving certificate missing a wanted name,
//! is issued anew at start.

pub mod ca_bundle;
pub mod ca_rotation;
mod certs;
pub mod csr;
pub mod inspect;
pub mod join_token;
mod kubeconfig;
pub mod node_password;
pub mod service_account_key;
pub mod shared_pki;
pub mod tls;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub use certs::{
    ca_hash, far_from_expiry, issued_by, new_request, seconds_left, still_good, subject_of, Ca, CertError, Issued,
    LeafSpec, RENEW_BEFORE_SECONDS,
};
pub use kubeconfig::write_kubeconfig;

/// The user the API server is towards kubelets.
pub const KUBE_APISERVER_USER: &str = "system:kube-apiserver";
/// The name the API server's front-proxy client certificate carries, the
/// one `requestheader-allowed-names` lets aggregated API servers trust (k3s').
pub const AUTH_PROXY_USER: &str = "system:auth-proxy";

/// A new ECDSA P-256 private key, PKCS#8 PEM.
pub fn new_key_pem() -> Result<String, CertError> {
    certs::new_key()
}

/// What the serving certificate must cover besides the built-in names.
#[derive(Debug, Clone, Default)]
pub struct PkiOptions {
    /// `<data-dir>/server/tls`.
    pub dir: PathBuf,
    /// `<data-dir>/server/token`.
    pub token_file: PathBuf,
    /// Extra names and addresses (`--tls-san`, node IPs, hostname).
    pub sans: Vec<String>,
    pub cluster_domain: String,
    /// The first address of the service CIDR (the `kubernetes` Service).
    pub service_ip: Option<IpAddr>,
    /// A token given with `--token`; generated when absent.
    pub token: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot {action} {path}: {source}")]
    Io { action: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Cert { path: PathBuf, source: CertError },
}

/// Paths and contents of what the API server and its clients need.
#[derive(Debug, Clone)]
pub struct Pki {
    pub server_ca_cert: PathBuf,
    pub server_ca_key: PathBuf,
    pub client_ca_cert: PathBuf,
    pub client_ca_key: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    /// The API server's client certificate towards kubelets (`system:kube-apiserver`).
    pub kubelet_client_cert: PathBuf,
    pub kubelet_client_key: PathBuf,
    /// The request-header CA and the front proxy's client certificate
    /// (`system:auth-proxy`) it signed, for aggregated API servers.
    pub request_header_ca_cert: PathBuf,
    pub proxy_client_cert: PathBuf,
    pub proxy_client_key: PathBuf,
    pub service_account_key: PathBuf,
    pub token: String,
}

fn read(path: &Path) -> Result<Option<String>, PkiError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PkiError::Io { action: "read", path: path.to_path_buf(), source }),
    }
}

/// Writes a file atomically; keys are readable by the owner only.
pub(crate) fn write(path: &Path, contents: &str, mode: u32) -> Result<(), PkiError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |action, source| PkiError::Io { action, path: path.to_path_buf(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io("create the folder of", e))?;
    }
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp).map_err(|e| io("create", e))?;
    f.write_all(contents.as_bytes()).map_err(|e| io("write", e))?;
    f.sync_all().map_err(|e| io("sync", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("rename", e))?;
    Ok(())
}

impl Pki {
    /// The server and client CAs, to sign the certificates of joining nodes.
    pub fn load_cas(&self) -> Result<(Ca, Ca), PkiError> {
        let load = |cert: &Path, key: &Path| -> Result<Ca, PkiError> {
            let missing = |path: &Path| PkiError::Io {
                action: "read",
                path: path.to_path_buf(),
                source: std::io::ErrorKind::NotFound.into(),
            };
            let c = read(cert)?.ok_or_else(|| missing(cert))?;
            let k = read(key)?.ok_or_else(|| missing(key))?;
            Ca::load(c, k).map_err(|source| PkiError::Cert { path: cert.to_path_buf(), source })
        };
        Ok((load(&self.server_ca_cert, &self.server_ca_key)?, load(&self.client_ca_cert, &self.client_ca_key)?))
    }

    /// Loads the PKI from `opts.dir`, generating or renewing what is needed.
    pub fn ensure(opts: &PkiOptions) -> Result<Pki, PkiError> {
        let dir = &opts.dir;
        let p = |name: &str| dir.join(name);
        let cert_err = |path: PathBuf| move |source| PkiError::Cert { path, source };

        let server_ca = ensure_ca(&p("server-ca.crt"), &p("server-ca.key"), "ferrok-server-ca")?;
        let client_ca = ensure_ca(&p("client-ca.crt"), &p("client-ca.key"), "ferrok-client-ca")?;
        let request_header_ca =
            ensure_ca(&p("request-header-ca.crt"), &p("request-header-ca.key"), "ferrok-request-header-ca")?;

        let mut dns = vec![
            "localhost".to_string(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            format!("kubernetes.default.svc.{}", opts.cluster_domain),
        ];
        let mut ips: Vec<IpAddr> = vec![IpAddr::from([127, 0, 0, 1]), IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])];
        if let Some(ip) = opts.service_ip {
            ips.push(ip);
        }
        for san in &opts.sans {
            match san.parse::<IpAddr>() {
                Ok(ip) if !ips.contains(&ip) => ips.push(ip),
                Ok(_) => {}
                Err(_) if !dns.contains(san) => dns.push(san.clone()),
                Err(_) => {}
            }
        }
        let serving = certs::LeafSpec::server("kube-apiserver", dns, ips);
        ensure_leaf(&p("serving-kube-apiserver.crt"), &p("serving-kube-apiserver.key"), &serving, &server_ca)?;
        let admin = certs::LeafSpec::client("system:admin", &["system:masters"]);
        ensure_leaf(&p("client-admin.crt"), &p("client-admin.key"), &admin, &client_ca)?;
        // As k3s: a user of its own, bound to system:kubelet-api-admin.
        let kubelet_client = certs::LeafSpec::client(KUBE_APISERVER_USER, &[]);
        ensure_leaf(&p("client-kube-apiserver.crt"), &p("client-kube-apiserver.key"), &kubelet_client, &client_ca)?;
        let proxy_client = certs::LeafSpec::client(AUTH_PROXY_USER, &[]);
        ensure_leaf(&p("client-auth-proxy.crt"), &p("client-auth-proxy.key"), &proxy_client, &request_header_ca)?;

        let sa_key = p("service.key");
        if read(&sa_key)?.is_none() {
            let key = certs::new_key().map_err(cert_err(sa_key.clone()))?;
            write(&sa_key, &key, 0o600)?;
        }

        let hash = certs::ca_hash(server_ca.cert_pem.as_bytes());
        let full = |secret: &str| format!("K10{hash}::server:{secret}");
        let token = match (&opts.token, read(&opts.token_file)?) {
            (Some(t), _) if t.starts_with("K10") => renamed_ca(t, &server_ca.cert_pem),
            (Some(t), _) => full(t),
            (None, Some(existing)) => renamed_ca(existing.trim(), &server_ca.cert_pem),
            (None, None) => new_token(&server_ca.cert_pem),
        };
        if read(&opts.token_file)?.as_deref().map(str::trim) != Some(token.as_str()) {
            write(&opts.token_file, &format!("{token}\n"), 0o600)?;
        }

        Ok(Pki {
            server_ca_cert: p("server-ca.crt"),
            server_ca_key: p("server-ca.key"),
            client_ca_cert: p("client-ca.crt"),
            client_ca_key: p("client-ca.key"),
            serving_cert: p("serving-kube-apiserver.crt"),
            serving_key: p("serving-kube-apiserver.key"),
            admin_cert: p("client-admin.crt"),
            admin_key: p("client-admin.key"),
            kubelet_client_cert: p("client-kube-apiserver.crt"),
            kubelet_client_key: p("client-kube-apiserver.key"),
            request_header_ca_cert: p("request-header-ca.crt"),
            proxy_client_cert: p("client-auth-proxy.crt"),
            proxy_client_key: p("client-auth-proxy.key"),
            service_account_key: sa_key,
            token,
        })
    }
}

/// A full token naming the server CA bundle `bundle` grew from by
/// rotation (see [`ca_bundle`]) made to name `bundle` itself; the secret
/// is unchanged, and any other token is returned as it is.
pub(crate) fn renamed_ca(token: &str, bundle: &str) -> String {
    match k10_parts(token) {
        Some((old, _)) if ca_bundle::suffix_with_hash(bundle, old).is_some() => with_ca_hash(token, bundle),
        _ => token.to_string(),
    }
}

/// `(CA hash, <user>:<secret>)` of a `K10<hash>::<user>:<secret>` token.
fn k10_parts(token: &str) -> Option<(&str, &str)> {
    token.strip_prefix("K10")?.split_once("::")
}

/// A full token made to name the server CA bundle `bundle`, its secret
/// unchanged; a bare secret is returned as it is.
pub(crate) fn with_ca_hash(token: &str, bundle: &str) -> String {
    match k10_parts(token) {
        Some((_, creds)) => format!("K10{}::{creds}", certs::ca_hash(bundle.as_bytes())),
        None => token.to_string(),
    }
}

/// A new join token, `K10<server CA hash>::server:<random secret>`.
pub(crate) fn new_token(server_ca_pem: &str) -> String {
    new_token_for_hash(&certs::ca_hash(server_ca_pem.as_bytes()))
}

/// A new join token naming the server CA of SHA-256 `ca_hash`.
pub(crate) fn new_token_for_hash(ca_hash: &str) -> String {
    format!("K10{ca_hash}::server:{:032x}", crate::host::random::u128())
}

/// The kubelet API's serving certificate of a node (its name and
/// addresses), signed by the server CA of `tls_dir`, as `cert`/`key`:
/// issued when missing, near expiry, or lacking a name.
pub fn ensure_kubelet_serving(
    tls_dir: &Path,
    cert: &Path,
    key: &Path,
    node_name: &str,
    ips: &[IpAddr],
) -> Result<(), PkiError> {
    let ca = ensure_ca(&tls_dir.join("server-ca.crt"), &tls_dir.join("server-ca.key"), "ferrok-server-ca")?;
    let mut dns = vec![node_name.to_string(), "localhost".to_string()];
    dns.dedup();
    let mut all_ips = ips.to_vec();
    for local in [IpAddr::from([127, 0, 0, 1]), IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])] {
        if !all_ips.contains(&local) {
            all_ips.push(local);
        }
    }
    ensure_leaf(cert, key, &certs::LeafSpec::server(node_name, dns, all_ips), &ca)
}

fn ensure_ca(cert: &Path, key: &Path, cn: &str) -> Result<certs::Ca, PkiError> {
    let cert_err = |source| PkiError::Cert { path: cert.to_path_buf(), source };
    if let (Some(c), Some(k)) = (read(cert)?, read(key)?) {
        return certs::Ca::load(c, k).map_err(cert_err);
    }
    let ca = certs::Ca::generate(cn).map_err(cert_err)?;
    write(key, &ca.key_pem, 0o600)?;
    write(cert, &ca.cert_pem, 0o644)?;
    tracing::info!(path = %cert.display(), "generated a certificate authority");
    Ok(ca)
}

fn ensure_leaf(cert: &Path, key: &Path, spec: &certs::LeafSpec, ca: &certs::Ca) -> Result<(), PkiError> {
    let cert_err = |source| PkiError::Cert { path: cert.to_path_buf(), source };
    if let Some(c) = read(cert)? {
        if read(key)?.is_some() && certs::still_good(&c, spec).map_err(cert_err)? && certs::issued_by(&c, &ca.cert_pem)
        {
            return Ok(());
        }
        tracing::info!(
            path = %cert.display(),
            "renewing a certificate that is near expiry, lacks a wanted name, or was issued by another CA"
        );
    }
    let issued = ca.issue(spec).map_err(cert_err)?;
    write(key, &issued.key_pem, 0o600)?;
    write(cert, &issued.cert_pem, 0o644)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_once_and_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let opts = PkiOptions {
            dir: dir.path().join("tls"),
            token_file: dir.path().join("token"),
            sans: vec!["edge.example".into(), "10.1.2.3".into()],
            cluster_domain: "cluster.local".into(),
            service_ip: Some("10.43.0.1".parse().unwrap()),
            token: None,
        };
        let a = Pki::ensure(&opts).unwrap();
        assert!(a.token.starts_with("K10") && a.token.contains("::server:"));
        let first = std::fs::read(&a.serving_cert).unwrap();
        let b = Pki::ensure(&opts).unwrap();
        assert_eq!(first, std::fs::read(&b.serving_cert).unwrap());
        assert_eq!(a.token, b.token);
        // A new --tls-san gets a new serving certificate from the same CA.
        let mut more = opts.clone();
        more.sans.push("other.example".into());
        let c = Pki::ensure(&more).unwrap();
        assert_ne!(first, std::fs::read(&c.serving_cert).unwrap());
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&c.admin_key).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
    }
}

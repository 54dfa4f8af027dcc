//! `ferrok certificate check|rotate|rotate-ca`, as k3s' commands of that
//! name: every certificate this host's ferrok keeps, with what it is for
//! and when it expires; rotation of the leaf certificates (backed up, then
//! removed, so that the next start of ferrok issues new ones; the CAs
//! stay, so nothing that trusts them needs to change); and rotation of the
//! CAs themselves through the running server (src/apiserver/supervisor/ca_rotation.rs).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

use std::collections::BTreeMap;

use crate::apiserver::supervisor::ca_rotation::{CaRotationAnswer, CaRotationRequest, CACERTS_PATH};
use crate::pki::ca_rotation::{NewCa, ROTATED_CAS};
use crate::pki::inspect::{summarize_pem, CertSummary};
use crate::pki::RENEW_BEFORE_SECONDS;

#[derive(Debug, Args)]
pub struct CertificateArgs {
    #[command(subcommand)]
    command: CertificateCommand,
    /// The data dir of the server or agent whose certificates these are.
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum CertificateCommand {
    /// Print every certificate with its subject, usages and expiry; exit 1 if one has expired.
    Check,
    /// Back up and remove leaf certificates; the next start of ferrok issues new ones.
    Rotate {
        /// Only these (comma-separated; default: all).
        #[arg(long, short = 's', value_delimiter = ',', value_enum)]
        service: Vec<Service>,
    },
    /// Replace the cluster's CAs through the running server; servers, then agents, take them when restarted.
    #[command(name = "rotate-ca")]
    RotateCa {
        /// A folder with the new CAs: server-ca.crt/.key and/or client-ca.crt/.key, each new CA signed or
        /// cross-signed by the current one unless --force. Without it, the server makes new CAs cross-signed
        /// by the current ones.
        #[arg(long, value_name = "DIR")]
        path: Option<PathBuf>,
        /// Take CAs that do not chain to the current ones: every node must then join again with the new token.
        #[arg(long)]
        force: bool,
        /// The server to talk to.
        #[arg(long, value_name = "URL", default_value = "https://127.0.0.1:6443")]
        server: String,
    },
}

/// The holders of leaf certificates, in k3s' names where they match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Service {
    /// The admin client certificate of the kubeconfig.
    Admin,
    /// The API server's serving certificate and its client certificate towards kubelets.
    ApiServer,
    /// The node's kubelet client and serving certificates.
    Kubelet,
}

impl Service {
    /// Files (relative to the data dir) without their `.crt`/`.key` ending.
    fn files(self) -> &'static [&'static str] {
        match self {
            Service::Admin => &["server/tls/client-admin"],
            Service::ApiServer => &["server/tls/serving-kube-apiserver", "server/tls/client-kube-apiserver"],
            Service::Kubelet => &["agent/client-kubelet", "agent/serving-kubelet"],
        }
    }
}

/// The `.crt` files directly in `dir`, sorted; none if there is no `dir`.
fn crt_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "crt") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// `364d`, `5h`, `12m`, or `expired 3d ago`.
fn residual(seconds: i64) -> String {
    let span = |s: i64| match s {
        s if s >= 86_400 => format!("{}d", s / 86_400),
        s if s >= 3600 => format!("{}h", s / 3600),
        s => format!("{}m", s / 60),
    };
    if seconds <= 0 {
        format!("expired {} ago", span(-seconds))
    } else {
        span(seconds)
    }
}

fn status(cert: &CertSummary, left: i64) -> &'static str {
    match left {
        l if l <= 0 => "EXPIRED",
        l if !cert.is_ca && l < RENEW_BEFORE_SECONDS => "WARNING: renewed at the next start",
        l if cert.is_ca && l < 365 * 86_400 => "WARNING: the CA expires within a year",
        _ => "OK",
    }
}

fn check(data_dir: &Path) -> anyhow::Result<()> {
    let mut files = crt_files(&data_dir.join("server").join("tls"))?;
    files.extend(crt_files(&data_dir.join("agent"))?);
    if files.is_empty() {
        anyhow::bail!("--data-dir: no certificates in {} (is it ferrok's data dir?)", data_dir.display());
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut rows = Vec::new();
    let mut expired = 0;
    for file in files {
        let pem = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let name = file.strip_prefix(data_dir).unwrap_or(&file).display().to_string();
        let certs = summarize_pem(&pem).with_context(|| file.display().to_string())?;
        for cert in certs {
            let left = cert.not_after - now.as_second();
            expired += usize::from(left <= 0);
            let expires = k8s_openapi::jiff::Timestamp::from_second(cert.not_after)
                .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_else(|_| cert.not_after.to_string());
            rows.push([
                name.clone(),
                cert.subject.clone(),
                cert.usages.join(","),
                expires,
                residual(left),
                status(&cert, left).to_string(),
            ]);
        }
    }
    super::table::print_table(["FILENAME", "SUBJECT", "USAGES", "EXPIRES", "RESIDUAL TIME", "STATUS"], &rows);
    if expired > 0 {
        anyhow::bail!("{expired} certificate(s) have expired; see above");
    }
    Ok(())
}

fn rotate(data_dir: &Path, services: &[Service]) -> anyhow::Result<()> {
    let services = if services.is_empty() { Service::value_variants() } else { services };
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let backup = data_dir.join(format!("tls-backup-{stamp}"));
    let mut moved = 0;
    for service in services {
        for base in service.files() {
            for ending in ["crt", "key"] {
                let relative = format!("{base}.{ending}");
                let from = data_dir.join(&relative);
                if !from.exists() {
                    continue;
                }
                let to = backup.join(&relative);
                if let Some(dir) = to.parent() {
                    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&backup, std::fs::Permissions::from_mode(0o700))
                        .with_context(|| format!("cannot restrict {}", backup.display()))?;
                }
                std::fs::rename(&from, &to)
                    .with_context(|| format!("cannot move {} to {}", from.display(), to.display()))?;
                println!("{relative}: moved to {}", to.display());
                moved += 1;
            }
        }
    }
    if moved == 0 {
        anyhow::bail!("--data-dir: none of the certificates to rotate are in {}", data_dir.display());
    }
    println!("restart ferrok to issue the new certificates; the running process keeps the old ones until then");
    Ok(())
}

/// The new CAs of `dir`: each `<base>.crt` there with its `<base>.key`.
fn new_cas(dir: &Path) -> anyhow::Result<BTreeMap<String, NewCa>> {
    if !dir.is_dir() {
        anyhow::bail!("--path: {} is not a folder", dir.display());
    }
    let mut cas = BTreeMap::new();
    for (base, _) in ROTATED_CAS {
        let cert = dir.join(format!("{base}.crt"));
        let key = dir.join(format!("{base}.key"));
        match (cert.exists(), key.exists()) {
            (false, false) => continue,
            (true, false) => anyhow::bail!("--path: {} has no key beside it ({})", cert.display(), key.display()),
            (false, true) => {
                anyhow::bail!("--path: {} has no certificate beside it ({})", key.display(), cert.display())
            }
            (true, true) => {}
        }
        let read =
            |p: &Path| std::fs::read_to_string(p).with_context(|| format!("--path: cannot read {}", p.display()));
        cas.insert(base.to_string(), NewCa { cert_pem: read(&cert)?, key_pem: read(&key)? });
    }
    if cas.is_empty() {
        anyhow::bail!("--path: no server-ca.crt or client-ca.crt in {}", dir.display());
    }
    Ok(cas)
}

async fn rotate_ca(data_dir: &Path, path: Option<&Path>, force: bool, server: &str) -> anyhow::Result<()> {
    let cas = path.map(new_cas).transpose()?.unwrap_or_default();
    let (client, _) = super::token::admin_client(Some(data_dir), server)?;
    let body = CaRotationRequest { cas, force };
    let req = axum::http::Request::put(CACERTS_PATH)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body)?)?;
    let answer: CaRotationAnswer = match client.request(req).await {
        Ok(a) => a,
        Err(kube::Error::Api(s)) if s.code == 400 => anyhow::bail!("--path: {}", s.message),
        Err(e) => return Err(e).context("cannot rotate the CAs"),
    };
    for file in &answer.written {
        println!("{file}: written");
    }
    println!("the previous files are in {}", answer.backup);
    if let Some(token) = &answer.token {
        println!("join token from the next start: {token}");
    }
    eprintln!(
        "Restart every server, then every agent: each takes the new CAs at its start.{}",
        if force {
            " The new CAs do not chain to the old ones: nodes must join again with the new token, and kubeconfigs be \
             handed out anew."
        } else {
            " Nodes and kubeconfigs that trust the old CA keep working through the cross-signed certificates."
        }
    );
    Ok(())
}

pub async fn run(args: CertificateArgs) -> anyhow::Result<()> {
    let data_dir = args.data_dir.clone().unwrap_or_else(super::default_data_dir);
    match &args.command {
        CertificateCommand::Check => check(&data_dir),
        CertificateCommand::Rotate { service } => rotate(&data_dir, service),
        CertificateCommand::RotateCa { path, force, server } => {
            rotate_ca(&data_dir, path.as_deref(), *force, server).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_times() {
        assert_eq!(residual(364 * 86_400 + 5), "364d");
        assert_eq!(residual(5 * 3600), "5h");
        assert_eq!(residual(600), "10m");
        assert_eq!(residual(-3 * 86_400), "expired 3d ago");
    }

    #[test]
    fn statuses() {
        let leaf = CertSummary { subject: String::new(), usages: vec![], is_ca: false, not_after: 0 };
        let ca = CertSummary { is_ca: true, ..leaf.clone() };
        assert_eq!(status(&leaf, 0), "EXPIRED");
        assert_eq!(status(&leaf, 30 * 86_400), "WARNING: renewed at the next start");
        assert_eq!(status(&leaf, 100 * 86_400), "OK");
        assert_eq!(status(&ca, 100 * 86_400), "WARNING: the CA expires within a year");
        assert_eq!(status(&ca, 3000 * 86_400), "OK");
    }
}

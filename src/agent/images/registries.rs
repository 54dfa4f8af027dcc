//! `<agent-dir>/etc/registries.yaml`, in k3s' format, turned into
//! containerd's registry host configs (`certs.d/<host>/hosts.toml`, the
//! containerd 1.6 format) and into pull credentials for CRI's PullImage.
//!
//! ```yaml
//! mirrors:
//!   docker.io:
//!     endpoint: ["http://127.0.0.1:5000", "https://mirror.example.com"]
//! configs:
//!   "mirror.example.com":
//!     auth: { username: u, password: p }
//!     tls: { ca_file: /ca.pem, cert_file: /c.pem, key_file: /k.pem, insecure_skip_verify: false }
//! ```
//!
//! An `http://` endpoint makes containerd talk plain HTTP to it. The
//! `certs.d` folder is rewritten whole at every start, so an entry removed
//! from the file is gone from containerd too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::reference::{Reference, DEFAULT_DOMAIN};
use crate::agent::containerd::toml_str;
use crate::agent::cri::api::AuthConfig;

#[derive(Debug, thiserror::Error)]
pub enum RegistriesError {
    #[error("{file}: {key}: {message}")]
    Invalid { file: PathBuf, key: String, message: String },
    #[error("cannot {action} {path}: {source}")]
    Io { action: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{file}: {key}: {source}")]
    Endpoint { file: PathBuf, key: String, source: InvalidEndpoint },
}

/// A mirror endpoint that is not an `http(s)://host[:port][/path]` URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidEndpoint {
    #[error("{0:?} is not a URL (http:// or https://)")]
    NotAUrl(String),
    #[error("{0:?}: scheme must be http or https")]
    Scheme(String),
    #[error("{0:?}: invalid host")]
    Host(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registries {
    #[serde(default)]
    pub mirrors: BTreeMap<String, Mirror>,
    #[serde(default)]
    pub configs: BTreeMap<String, RegistryConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mirror {
    #[serde(default)]
    pub endpoint: Vec<String>,
    /// Repository rewrites (regex → replacement). containerd 1.6 cannot
    /// apply them; they are read so a k3s file loads, and warned about.
    #[serde(default)]
    pub rewrite: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    #[serde(default)]
    pub auth: Option<RegistryAuth>,
    #[serde(default)]
    pub tls: Option<RegistryTls>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryAuth {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub password: String,
    /// base64 of `username:password`.
    #[serde(default)]
    pub auth: String,
    #[serde(default)]
    pub identitytoken: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryTls {
    #[serde(default)]
    pub ca_file: Option<String>,
    #[serde(default)]
    pub cert_file: Option<String>,
    #[serde(default)]
    pub key_file: Option<String>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

/// A registry endpoint URL, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub scheme: String,
    /// `host[:port]`
    pub host: String,
    /// The API root when not `/v2` (then containerd's `override_path`).
    pub path: String,
}

impl Endpoint {
    pub fn parse(url: &str) -> Result<Endpoint, InvalidEndpoint> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| InvalidEndpoint::NotAUrl(url.to_string()))?;
        if scheme != "http" && scheme != "https" {
            return Err(InvalidEndpoint::Scheme(url.to_string()));
        }
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if host.is_empty()
            || !host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']' | '_'))
        {
            return Err(InvalidEndpoint::Host(url.to_string()));
        }
        let path = if path == "/v2" { "" } else { path };
        Ok(Endpoint { scheme: scheme.into(), host: host.into(), path: path.into() })
    }

    pub fn url(&self) -> String {
        format!("{}://{}{}", self.scheme, self.host, self.path)
    }
}

impl Registries {
    /// Reads the file; a missing file is an empty configuration.
    pub fn load(path: &Path) -> Result<Registries, RegistriesError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Registries::default()),
            Err(source) => return Err(RegistriesError::Io { action: "read", path: path.into(), source }),
        };
        Registries::parse(path, &text)
    }

    /// Parses `text`, naming `file` and the offending key in errors.
    pub fn parse(file: &Path, text: &str) -> Result<Registries, RegistriesError> {
        if text.trim().is_empty() {
            return Ok(Registries::default());
        }
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let parsed: Registries = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let key = if key == "." { "(top level)".to_string() } else { key };
            let mut message = e.into_inner().to_string();
            // serde_yaml names the (parent) path itself: once is enough.
            if let Some((prefix, rest)) = message.split_once(": ") {
                if key.starts_with(prefix) {
                    message = rest.to_string();
                }
            }
            RegistriesError::Invalid { file: file.into(), key, message }
        })?;
        parsed.validate(file)?;
        Ok(parsed)
    }

    fn validate(&self, file: &Path) -> Result<(), RegistriesError> {
        let invalid = |key: String, message: String| RegistriesError::Invalid { file: file.into(), key, message };
        for (registry, mirror) in &self.mirrors {
            for (i, e) in mirror.endpoint.iter().enumerate() {
                Endpoint::parse(e).map_err(|source| RegistriesError::Endpoint {
                    file: file.into(),
                    key: format!("mirrors.{registry}.endpoint[{i}]"),
                    source,
                })?;
            }
            if !mirror.rewrite.is_empty() {
                tracing::warn!(registry, file = %file.display(), "registries.yaml rewrites are not supported by containerd 1.6; ignored");
            }
        }
        for (host, config) in &self.configs {
            if let Some(tls) = &config.tls {
                if tls.cert_file.is_some() != tls.key_file.is_some() {
                    return Err(invalid(format!("configs.{host}.tls"), "cert_file and key_file go together".into()));
                }
            }
        }
        Ok(())
    }

    /// The host names containerd is configured for (each a `certs.d` folder).
    fn hosts(&self) -> Vec<String> {
        let mut hosts: Vec<String> = self.mirrors.keys().cloned().collect();
        for host in self.configs.keys() {
            if !self.mirrors.contains_key(host) && host != "*" {
                hosts.push(host.clone());
            }
        }
        hosts
    }

    /// containerd's `hosts.toml` for `registry`.
    pub fn hosts_toml(&self, registry: &str) -> String {
        let mut out = String::from("# Written by ferrok from registries.yaml at every start; edits are overwritten.\n");
        let endpoints: Vec<Endpoint> = self
            .mirrors
            .get(registry)
            .map(|m| m.endpoint.iter().filter_map(|e| Endpoint::parse(e).ok()).collect())
            .unwrap_or_default();
        // An endpoint on the registry's own host is the registry itself
        // (how a plain-HTTP registry is declared): it is the server.
        let own = endpoints.iter().find(|e| e.host == registry).cloned();
        let server = match &own {
            Some(e) => e.clone(),
            None if registry == DEFAULT_DOMAIN => {
                Endpoint { scheme: "https".into(), host: "registry-1.docker.io".into(), path: String::new() }
            }
            None => Endpoint { scheme: "https".into(), host: registry.to_string(), path: String::new() },
        };
        if registry != "*" {
            out.push_str(&format!("server = {}\n", toml_str(&server.url())));
            if !server.path.is_empty() {
                out.push_str("override_path = true\n");
            }
            out.push_str(&self.tls_toml(registry, &server));
        }
        // containerd 1.6 drops a hosts.toml without any `[host]` table
        // ("invalid `host` tree") and falls back to HTTPS on the default
        // server, so the registry itself is always listed as a host too.
        let mut listed: Vec<Endpoint> = endpoints.iter().filter(|e| Some(*e) != own.as_ref()).cloned().collect();
        if listed.is_empty() && registry != "*" {
            listed.push(server.clone());
        }
        for e in listed.iter() {
            out.push_str(&format!("\n[host.{}]\n", toml_str(&e.url())));
            out.push_str("  capabilities = [\"pull\", \"resolve\"]\n");
            if !e.path.is_empty() {
                out.push_str("  override_path = true\n");
            }
            for line in self.tls_toml(&e.host, e).lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
        out
    }

    fn tls_toml(&self, host: &str, endpoint: &Endpoint) -> String {
        let mut out = String::new();
        let Some(tls) = self.configs.get(host).and_then(|c| c.tls.as_ref()) else { return out };
        if endpoint.scheme == "http" {
            return out;
        }
        if let Some(ca) = &tls.ca_file {
            out.push_str(&format!("ca = {}\n", toml_str(ca)));
        }
        if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
            out.push_str(&format!("client = [[{}, {}]]\n", toml_str(cert), toml_str(key)));
        }
        if tls.insecure_skip_verify {
            out.push_str("skip_verify = true\n");
        }
        out
    }

    /// Rewrites `certs_d` whole: one `<host>/hosts.toml` per registry
    /// configured (`*` is containerd's `_default`), nothing else.
    pub fn write_hosts(&self, certs_d: &Path) -> Result<(), RegistriesError> {
        let io = |action, path: &Path| {
            let path = path.to_path_buf();
            move |source| RegistriesError::Io { action, path, source }
        };
        if certs_d.exists() {
            std::fs::remove_dir_all(certs_d).map_err(io("clear", certs_d))?;
        }
        std::fs::create_dir_all(certs_d).map_err(io("create", certs_d))?;
        for host in self.hosts() {
            let dir_name = if host == "*" { "_default".to_string() } else { host.replace(['/', '\\'], "_") };
            let dir = certs_d.join(dir_name);
            std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
            let file = dir.join("hosts.toml");
            std::fs::write(&file, self.hosts_toml(&host)).map_err(io("write", &file))?;
        }
        Ok(())
    }

    /// Pull credentials for `image_ref`: those configured for its registry,
    /// else for the first of its mirror endpoints that has some. containerd
    /// hands them only to the host named in `server_address` (a URL: 1.6
    /// parses it and compares its host with the one it is talking to).
    pub fn auth_for(&self, image_ref: &str) -> Option<AuthConfig> {
        let registry = Reference::parse(image_ref).ok()?.domain;
        let mut hosts = vec![registry.clone()];
        for key in [registry.as_str(), "*"] {
            if let Some(m) = self.mirrors.get(key) {
                hosts.extend(m.endpoint.iter().filter_map(|e| Endpoint::parse(e).ok()).map(|e| e.host));
            }
        }
        hosts.into_iter().find_map(|host| {
            let auth = self.configs.get(&host)?.auth.as_ref()?;
            Some(AuthConfig {
                username: auth.username.clone(),
                password: auth.password.clone(),
                auth: auth.auth.clone(),
                identity_token: auth.identitytoken.clone(),
                // containerd 1.6 parses it as a URL and compares its host.
                server_address: format!("https://{host}"),
                registry_token: String::new(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
mirrors:
  docker.io:
    endpoint:
      - "http://127.0.0.1:5000"
      - "https://mirror.example.com/v2"
  "127.0.0.1:5001":
    endpoint: ["http://127.0.0.1:5001"]
  "*":
    endpoint: ["https://any.example.com"]
configs:
  "mirror.example.com":
    auth:
      username: u
      password: p
    tls:
      ca_file: /etc/ca.pem
      cert_file: /etc/c.pem
      key_file: /etc/k.pem
  "127.0.0.1:5001":
    auth:
      auth: dTpw
  "secure.example.com:443":
    tls:
      insecure_skip_verify: true
"#;

    fn sample() -> Registries {
        Registries::parse(Path::new("/r.yaml"), SAMPLE).unwrap()
    }

    #[test]
    fn mirrors_become_hosts_in_order() {
        let toml = sample().hosts_toml("docker.io");
        let server = toml.find(r#"server = "https://registry-1.docker.io""#).unwrap();
        let local = toml.find(r#"[host."http://127.0.0.1:5000"]"#).unwrap();
        let mirror = toml.find(r#"[host."https://mirror.example.com"]"#).unwrap();
        assert!(server < local && local < mirror, "{toml}");
        assert!(toml.contains(r#"  ca = "/etc/ca.pem""#), "{toml}");
        assert!(toml.contains(r#"  client = [["/etc/c.pem", "/etc/k.pem"]]"#), "{toml}");
        assert_eq!(toml.matches("capabilities = [\"pull\", \"resolve\"]").count(), 2);
    }

    #[test]
    fn a_registry_mirrored_to_itself_over_http_is_its_own_server() {
        let toml = sample().hosts_toml("127.0.0.1:5001");
        assert!(toml.contains(r#"server = "http://127.0.0.1:5001""#), "{toml}");
        // containerd 1.6 ignores a hosts.toml without a [host] table.
        assert!(toml.contains("[host.\"http://127.0.0.1:5001\"]\n  capabilities = [\"pull\", \"resolve\"]"), "{toml}");
    }

    #[test]
    fn endpoint_paths_other_than_v2_override_the_api_root() {
        let r = Registries::parse(
            Path::new("/r.yaml"),
            "mirrors:\n  quay.io:\n    endpoint: [\"https://m.example.com/v2/\", \"https://n.example.com/quay/v2\"]\n",
        )
        .unwrap();
        let toml = r.hosts_toml("quay.io");
        assert!(toml.contains("server = \"https://quay.io\"\n"), "{toml}");
        assert!(toml.contains("[host.\"https://m.example.com\"]\n  capabilities"), "{toml}");
        assert!(toml.contains("[host.\"https://n.example.com/quay/v2\"]\n  capabilities = [\"pull\", \"resolve\"]\n  override_path = true\n"), "{toml}");
    }

    #[test]
    fn configs_alone_make_a_host_too() {
        let toml = sample().hosts_toml("secure.example.com:443");
        assert!(toml.contains(r#"server = "https://secure.example.com:443""#), "{toml}");
        assert!(toml.contains("skip_verify = true"), "{toml}");
    }

    #[test]
    fn the_folder_is_rewritten_whole() {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs.d");
        std::fs::create_dir_all(certs.join("gone.example.com")).unwrap();
        std::fs::write(certs.join("gone.example.com/hosts.toml"), "x").unwrap();
        sample().write_hosts(&certs).unwrap();
        let mut names: Vec<String> =
            std::fs::read_dir(&certs).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        // A host with only a config (here a mirror's) gets its own file too.
        assert_eq!(names, ["127.0.0.1:5001", "_default", "docker.io", "mirror.example.com", "secure.example.com:443"]);
        Registries::default().write_hosts(&certs).unwrap();
        assert_eq!(std::fs::read_dir(&certs).unwrap().count(), 0);
    }

    #[test]
    fn credentials_follow_the_registry_or_its_mirror() {
        let r = sample();
        let a = r.auth_for("127.0.0.1:5001/library/busybox:1").unwrap();
        assert_eq!((a.auth.as_str(), a.server_address.as_str()), ("dTpw", "https://127.0.0.1:5001"));
        let a = r.auth_for("busybox").unwrap();
        assert_eq!(
            (a.username.as_str(), a.password.as_str(), a.server_address.as_str()),
            ("u", "p", "https://mirror.example.com")
        );
        assert!(r.auth_for("quay.io/x/y").is_none());
    }

    #[test]
    fn malformed_files_name_the_file_and_key() {
        let cases = [
            ("mirrors:\n  docker.io:\n    endpoint: 5\n", "mirrors.docker.io.endpoint"),
            ("configs:\n  r:\n    tls:\n      insecure_skip_verify: maybe\n", "configs.r.tls.insecure_skip_verify"),
            ("configs:\n  r:\n    auth:\n      user: x\n", "configs.r.auth.user"),
            ("mirrors:\n  docker.io:\n    endpoint: [\"ftp://x\"]\n", "mirrors.docker.io.endpoint[0]"),
            ("mirror: {}\n", "mirror"),
            ("- a\n", "(top level)"),
        ];
        for (text, key) in cases {
            let err = Registries::parse(Path::new("/etc/r.yaml"), text).unwrap_err().to_string();
            assert!(err.starts_with(&format!("/etc/r.yaml: {key}: ")), "{text:?} gave {err}");
        }
    }

    #[test]
    fn empty_or_missing_files_configure_nothing() {
        assert_eq!(Registries::parse(Path::new("/r"), "").unwrap(), Registries::default());
        assert_eq!(Registries::load(Path::new("/nonexistent/registries.yaml")).unwrap(), Registries::default());
    }
}

//! Image references as Docker and containerd's CRI normalize them:
//! `busybox` is `docker.io/library/busybox:latest`, `ghcr.io/a/b` is
//! `ghcr.io/a/b:latest`, and a digest is kept as `name@sha256:…`.

use std::fmt;

use super::ImageError;

pub const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_REPOSITORY_PREFIX: &str = "library/";
pub const DEFAULT_TAG: &str = "latest";

/// What is wrong with an image reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidReference {
    #[error("empty")]
    Empty,
    #[error("empty registry host")]
    EmptyHost,
    #[error("invalid registry host")]
    InvalidHost,
    #[error("empty repository name")]
    EmptyPath,
    #[error("repository component {0:?} must be lowercase letters, digits and separators")]
    PathComponent(String),
    #[error("invalid tag {0:?}")]
    Tag(String),
    #[error("invalid digest {0:?}")]
    Digest(String),
    /// An image ID prefix that more than one image has.
    #[error("the ID prefix matches several images")]
    AmbiguousId,
}

/// A parsed, normalized image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Registry host, with its port when given (`docker.io`, `127.0.0.1:5000`).
    pub domain: String,
    /// Repository path inside the registry (`library/busybox`).
    pub path: String,
    pub tag: Option<String>,
    /// `sha256:…`
    pub digest: Option<String>,
}

impl Reference {
    /// Parses and normalizes `reference`; a reference with neither tag nor
    /// digest gets `:latest`.
    pub fn parse(reference: &str) -> Result<Reference, ImageError> {
        let bad = |reason: InvalidReference| ImageError::Reference { reference: reference.to_string(), reason };
        if reference.is_empty() {
            return Err(bad(InvalidReference::Empty));
        }
        let (name, digest) = match reference.split_once('@') {
            Some((n, d)) => (n, Some(d)),
            None => (reference, None),
        };
        if let Some(d) = digest {
            validate_digest(d).map_err(bad)?;
        }
        let last_slash = name.rfind('/').map(|i| i + 1).unwrap_or(0);
        let (name, tag) = match name[last_slash..].rfind(':') {
            Some(i) => (&name[..last_slash + i], Some(&name[last_slash + i + 1..])),
            None => (name, None),
        };
        if let Some(t) = tag {
            validate_tag(t).map_err(bad)?;
        }
        let (domain, path) = split_domain(name);
        if domain.is_empty() {
            return Err(bad(InvalidReference::EmptyHost));
        }
        if !domain.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']')) {
            return Err(bad(InvalidReference::InvalidHost));
        }
        validate_path(&path).map_err(bad)?;
        let tag = match (tag, digest) {
            (None, None) => Some(DEFAULT_TAG.to_string()),
            (t, _) => t.map(str::to_string),
        };
        Ok(Reference { domain, path, tag, digest: digest.map(str::to_string) })
    }

    /// `domain/path`, the repository without tag or digest.
    pub fn repository(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.domain, self.path)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// The normalized form of `reference` (`busybox` → `docker.io/library/busybox:latest`).
pub fn normalize(reference: &str) -> Result<String, ImageError> {
    Ok(Reference::parse(reference)?.to_string())
}

/// Whether `s` is an image ID or a prefix of one (`sha256:…` or bare hex),
/// as `crictl rmi` accepts.
pub fn looks_like_id(s: &str) -> bool {
    let hex = s.strip_prefix("sha256:").unwrap_or(s);
    (s.starts_with("sha256:") || hex.len() >= 12)
        && hex.len() <= 64
        && !hex.is_empty()
        && hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn split_domain(name: &str) -> (String, String) {
    let (domain, rest) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':']) || first == "localhost" || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (first.to_string(), rest.to_string())
        }
        _ => (DEFAULT_DOMAIN.to_string(), name.to_string()),
    };
    let domain = if domain == LEGACY_DEFAULT_DOMAIN { DEFAULT_DOMAIN.to_string() } else { domain };
    let path = if domain == DEFAULT_DOMAIN && !rest.contains('/') {
        format!("{OFFICIAL_REPOSITORY_PREFIX}{rest}")
    } else {
        rest
    };
    (domain, path)
}

fn validate_path(path: &str) -> Result<(), InvalidReference> {
    if path.is_empty() {
        return Err(InvalidReference::EmptyPath);
    }
    for component in path.split('/') {
        let ok = !component.is_empty()
            && component
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
            && component.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && component.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
        if !ok {
            return Err(InvalidReference::PathComponent(component.to_string()));
        }
    }
    Ok(())
}

fn validate_tag(tag: &str) -> Result<(), InvalidReference> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && tag.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        && tag.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(InvalidReference::Tag(tag.to_string()))
    }
}

/// `sha256:<64 lowercase hex>` (the only algorithm containerd's store uses here).
pub fn validate_digest(d: &str) -> Result<(), InvalidReference> {
    match d.split_once(':') {
        Some(("sha256", hex))
            if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(())
        }
        Some(("sha512", hex))
            if hex.len() == 128 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(())
        }
        _ => Err(InvalidReference::Digest(d.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_as_docker_does() {
        let d = "sha256:".to_string() + &"a".repeat(64);
        for (input, want) in [
            ("busybox", "docker.io/library/busybox:latest".to_string()),
            ("busybox:1.36", "docker.io/library/busybox:1.36".to_string()),
            ("library/busybox:1", "docker.io/library/busybox:1".to_string()),
            ("index.docker.io/user/app", "docker.io/user/app:latest".to_string()),
            ("ghcr.io/a/b/c:v1", "ghcr.io/a/b/c:v1".to_string()),
            ("localhost/app", "localhost/app:latest".to_string()),
            ("127.0.0.1:5000/library/busybox:1", "127.0.0.1:5000/library/busybox:1".to_string()),
            ("ferrok.local/pause:1", "ferrok.local/pause:1".to_string()),
            (&format!("busybox@{d}"), format!("docker.io/library/busybox@{d}")),
            (&format!("busybox:1@{d}"), format!("docker.io/library/busybox:1@{d}")),
        ] {
            assert_eq!(normalize(input).unwrap(), want, "{input}");
        }
    }

    #[test]
    fn bad_references_say_why() {
        for bad in ["", "Busybox", "busybox:", "busybox:-x", "a//b", "busybox@sha256:abc", "ferrok.local/"] {
            let err = normalize(bad).unwrap_err().to_string();
            assert!(err.contains("invalid image reference"), "{bad}: {err}");
        }
    }

    #[test]
    fn parts_are_kept() {
        let r = Reference::parse("127.0.0.1:5000/x/y:2").unwrap();
        assert_eq!(r.domain, "127.0.0.1:5000");
        assert_eq!(r.path, "x/y");
        assert_eq!(r.tag.as_deref(), Some("2"));
        assert_eq!(r.repository(), "127.0.0.1:5000/x/y");
    }

    #[test]
    fn ids_are_recognised() {
        assert!(looks_like_id("sha256:abcdef"));
        assert!(looks_like_id("0123456789ab"));
        assert!(!looks_like_id("busybox"));
        assert!(!looks_like_id("abc"));
    }
}

//! The URLs of httpGet probes and hooks: built from scheme, host, port and
//! path as upstream's `formatURL`, printed as Go prints them (messages
//! quote them), and joined with a redirect's `Location`.

use std::fmt;

use super::text::join_host_port;

/// A `Location` a probe or hook cannot follow, in Go's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("unsupported URL {0:?}")]
    Opaque(String),
    #[error("missing ']' in host {0:?}")]
    MissingBracket(String),
    /// The port with its colon (`:port`).
    #[error("invalid port {0:?} after host")]
    InvalidPort(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// `http` or `https` (anything else fails when sent, as in Go).
    pub scheme: String,
    /// A host name or an IP address, without brackets.
    pub host: String,
    pub port: u16,
    /// Path and query, escaped for a request line; empty or starting with `/`.
    pub path: String,
}

impl HttpUrl {
    /// `path` as a probe spec gives it: may hold a query; a fragment is dropped.
    pub fn new(scheme: &str, host: &str, port: u16, path: &str) -> HttpUrl {
        let path = path.split('#').next().unwrap_or_default();
        let mut escaped = escape(path);
        if !escaped.is_empty() && !escaped.starts_with('/') {
            escaped.insert(0, '/');
        }
        HttpUrl { scheme: scheme.to_string(), host: host.to_string(), port, path: escaped }
    }

    /// The request target (`/healthz?x=1`; `/` for an empty path).
    pub fn request_target(&self) -> &str {
        if self.path.is_empty() {
            "/"
        } else {
            &self.path
        }
    }

    /// `host:port`, with brackets for IPv6: the `Host` header and dial address.
    pub fn authority(&self) -> String {
        join_host_port(&self.host, self.port)
    }

    fn default_port(scheme: &str) -> u16 {
        if scheme == "https" {
            443
        } else {
            80
        }
    }

    /// The URL a `Location` header points to, relative to this one.
    pub fn join(&self, location: &str) -> Result<HttpUrl, UrlError> {
        let location = location.split('#').next().unwrap_or_default();
        let scheme_end = scheme_len(location);
        let (scheme, rest) = match scheme_end {
            Some(i) => (location[..i].to_ascii_lowercase(), &location[i + 1..]),
            None => (self.scheme.clone(), location),
        };
        if let Some(net) = rest.strip_prefix("//") {
            let end = net.find(['/', '?']).unwrap_or(net.len());
            let (authority, path) = net.split_at(end);
            let (host, port) = parse_authority(authority, Self::default_port(&scheme))?;
            return Ok(HttpUrl::new(&scheme, &host, port, path));
        }
        if scheme_end.is_some() {
            // `http:foo`: an opaque URL, which no probe target can be.
            return Err(UrlError::Opaque(location.to_string()));
        }
        let path = if rest.is_empty() {
            self.path.clone()
        } else if rest.starts_with('/') {
            rest.to_string()
        } else if rest.starts_with('?') {
            let base = self.path.split('?').next().unwrap_or_default();
            format!("{base}{rest}")
        } else {
            let base = self.path.split('?').next().unwrap_or_default();
            let dir = match base.rfind('/') {
                Some(i) => &base[..=i],
                None => "/",
            };
            format!("{dir}{rest}")
        };
        let (p, q) = match path.split_once('?') {
            Some((p, q)) => (p.to_string(), Some(q)),
            None => (path.clone(), None),
        };
        let mut resolved = remove_dot_segments(&p);
        if let Some(q) = q {
            resolved.push('?');
            resolved.push_str(q);
        }
        Ok(HttpUrl::new(&self.scheme, &self.host, self.port, &resolved))
    }
}

impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority(), self.path)
    }
}

/// Whether a `Location` names a scheme (Go's `URL.IsAbs`).
pub fn has_scheme(location: &str) -> bool {
    scheme_len(location).is_some()
}

fn scheme_len(location: &str) -> Option<usize> {
    location.find(':').filter(|&i| {
        let s = &location[..i];
        s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    })
}

fn parse_authority(authority: &str, default_port: u16) -> Result<(String, u16), UrlError> {
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, rest) = v6.split_once(']').ok_or_else(|| UrlError::MissingBracket(authority.to_string()))?;
        (host, rest.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        None | Some("") => default_port,
        Some(p) => p.parse::<u16>().map_err(|_| UrlError::InvalidPort(format!(":{p}")))?,
    };
    Ok((host.to_string(), port))
}

/// RFC 3986 section 5.2.4.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let trailing = path.ends_with("/.") || path.ends_with("/..") || path.ends_with('/');
    for seg in path.split('/') {
        match seg {
            "." | "" => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let mut joined = format!("/{}", out.join("/"));
    if trailing && joined.len() > 1 {
        joined.push('/');
    }
    joined
}

/// Percent-escapes what may not stand in a request line (spaces,
/// controls, non-ASCII); keeps what is already escaped.
fn escape(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b);
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> HttpUrl {
        HttpUrl::new("http", "10.42.0.5", 8080, "/a/b?x=1")
    }

    #[test]
    fn urls_print_as_go() {
        assert_eq!(base().to_string(), "http://10.42.0.5:8080/a/b?x=1");
        let u = HttpUrl::new("http", "10.42.0.5", 80, "");
        assert_eq!(u.to_string(), "http://10.42.0.5:80");
        assert_eq!(u.request_target(), "/");
        assert_eq!(HttpUrl::new("https", "fd00::1", 443, "healthz").to_string(), "https://[fd00::1]:443/healthz");
        assert_eq!(HttpUrl::new("http", "h", 1, "/a b#frag").path, "/a%20b");
    }

    #[test]
    fn locations_resolve_against_the_request() {
        let b = base();
        assert_eq!(b.join("/c").unwrap().to_string(), "http://10.42.0.5:8080/c");
        assert_eq!(b.join("c?y=2").unwrap().to_string(), "http://10.42.0.5:8080/a/c?y=2");
        assert_eq!(b.join("../c").unwrap().to_string(), "http://10.42.0.5:8080/c");
        assert_eq!(b.join("?y").unwrap().to_string(), "http://10.42.0.5:8080/a/b?y");
        assert_eq!(b.join("http://other:81/z").unwrap().to_string(), "http://other:81/z");
        assert_eq!(b.join("https://other/z").unwrap().to_string(), "https://other:443/z");
        assert_eq!(b.join("//10.42.0.5:9090").unwrap().to_string(), "http://10.42.0.5:9090");
        assert_eq!(b.join("http://[fd00::2]:8/").unwrap().host, "fd00::2");
        assert!(b.join("http://h:port/").is_err());
    }
}

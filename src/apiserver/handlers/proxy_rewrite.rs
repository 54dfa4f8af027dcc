//! The links of a proxied page made to go through the proxy again, as
//! upstream's proxy transport rewrites them (apimachinery's
//! `util/proxy/transport.go`): in an HTML answer, the URL attributes of
//! the tags that carry one (`a href`, `img src`, `form action`, …), and a
//! redirect's `Location`, when they are absolute paths or name the proxied
//! host, get the proxy's path in front (`/rewriteme` from a pod becomes
//! `/api/v1/namespaces/ns/pods/p:80/proxy/rewriteme`). Relative links and
//! links to other hosts are left alone, and so is every other byte of the
//! page.

use std::io::{Read, Write};

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;

use crate::apiserver::proxy::relay;
use crate::apiserver::request::ResourcePath;
use crate::apiserver::status::ApiError;

/// The most of an HTML page read to rewrite its links (upstream reads any
/// size; a bigger page is refused rather than held).
const MAX_PAGE: usize = 32 << 20;

/// The proxy's own path in front of what it proxies:
/// `/api/v1/namespaces/ns/pods/p:80/proxy` (upstream's PathPrepend).
pub fn proxy_prefix(path: &ResourcePath) -> String {
    let base = if path.group.is_empty() {
        format!("/api/{}", path.version)
    } else {
        format!("/apis/{}/{}", path.group, path.version)
    };
    let ns = path.namespace.as_deref().map(|n| format!("/namespaces/{n}")).unwrap_or_default();
    format!("{base}{ns}/{}/{}/proxy", path.plural, path.name.as_deref().unwrap_or_default())
}

/// A proxied server's answer as the proxy's, its links rewritten
/// (`backend` is the `host:port` it was asked of).
pub async fn answer(
    mut resp: hyper::Response<Incoming>,
    upgrade: Option<OnUpgrade>,
    path: &ResourcePath,
    backend: &str,
) -> Response {
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        return relay::answer(resp, upgrade);
    }
    let prepend = proxy_prefix(path);
    let rewriter = Rewriter { prepend: &prepend, backend };
    let location = resp.headers().get(header::LOCATION).and_then(|v| v.to_str().ok()).and_then(|l| rewriter.url(l));
    if let Some(value) = location.and_then(|l| HeaderValue::from_str(&l).ok()) {
        resp.headers_mut().insert(header::LOCATION, value);
    }
    let header_text = |name| resp.headers().get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    let html = header_text(header::CONTENT_TYPE)
        .and_then(|t| t.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/html"));
    let encoding = Encoding::of(header_text(header::CONTENT_ENCODING));
    let (Some(encoding), true) = (encoding, html) else { return relay::answer(resp, upgrade) };
    let (parts, body) = resp.into_parts();
    let bad_gateway = |e: &dyn std::fmt::Display| {
        ApiError::new(502, "BadGateway", format!("error reading the proxied page: {e}")).into_response()
    };
    let page = match http_body_util::Limited::new(body, MAX_PAGE).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return bad_gateway(&e),
    };
    let rewritten = match encoding.decode(&page).and_then(|p| encoding.encode(rewriter.html(&p))) {
        Ok(r) => r,
        Err(e) => return bad_gateway(&e),
    };
    let mut out = Response::new(Body::from(rewritten));
    *out.status_mut() = parts.status;
    *out.headers_mut() = relay::copy_headers(&parts.headers, false);
    out.headers_mut().remove(header::CONTENT_LENGTH);
    out
}

/// The attributes that hold URLs, by tag (upstream's atomsToAttrs).
fn url_attributes(tag: &str) -> &'static [&'static str] {
    match tag {
        "a" | "area" | "base" | "link" => &["href"],
        "applet" => &["codebase"],
        "audio" | "embed" | "script" | "source" => &["src"],
        "blockquote" | "del" | "ins" | "q" => &["cite"],
        "body" => &["background"],
        "button" => &["formaction"],
        "command" => &["icon"],
        "form" => &["action"],
        "frame" | "iframe" => &["longdesc", "src"],
        "head" => &["profile"],
        "html" => &["manifest"],
        "img" => &["longdesc", "src", "usemap"],
        "input" => &["src", "usemap", "formaction"],
        "object" => &["classid", "codebase", "data", "usemap"],
        "video" => &["poster", "src"],
        _ => &[],
    }
}

/// Rewrites the URLs of one proxied answer.
pub struct Rewriter<'a> {
    /// The proxy's own path in front of the proxied one
    /// (`/api/v1/namespaces/ns/pods/p:80/proxy`).
    pub prepend: &'a str,
    /// The proxied server's `host:port`: links naming it are the proxy's too.
    pub backend: &'a str,
}

impl Rewriter<'_> {
    /// A URL as the proxy's client must follow it, or None to leave it.
    pub fn url(&self, url: &str) -> Option<String> {
        let (scheme_host, rest) = split_authority(url)?;
        if let Some(host) = scheme_host {
            if host != self.backend {
                return None;
            }
        }
        let (path, tail) = match rest.find(['?', '#']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if !path.starts_with('/') {
            return None;
        }
        if path.starts_with(self.prepend) {
            return Some(format!("{path}{tail}"));
        }
        let prefix = self.prepend.trim_end_matches('/');
        Some(format!("{prefix}{path}{tail}"))
    }

    /// An HTML page with its links rewritten; every other byte as it was.
    pub fn html(&self, page: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(page.len() + 256);
        let mut i = 0;
        while let Some(lt) = find(page, i, b"<") {
            out.extend_from_slice(&page[i..lt]);
            i = lt;
            if page[i..].starts_with(b"<!--") {
                let end = find(page, i + 4, b"-->").map_or(page.len(), |e| e + 3);
                out.extend_from_slice(&page[i..end]);
                i = end;
                continue;
            }
            let name_len = page[i + 1..].iter().take_while(|b| b.is_ascii_alphanumeric()).count();
            if name_len == 0 || !page[i + 1].is_ascii_alphabetic() {
                // `</x>`, `<!DOCTYPE …>`, `<?…>` or a lone `<`: kept as is.
                out.push(b'<');
                i += 1;
                continue;
            }
            let tag = String::from_utf8_lossy(&page[i + 1..i + 1 + name_len]).to_ascii_lowercase();
            let end = self.start_tag(page, i, i + 1 + name_len, &tag, &mut out);
            i = end;
            // The text of a script or a style is not markup.
            if tag == "script" || tag == "style" {
                let close = format!("</{tag}");
                let stop = find_ignore_case(page, i, close.as_bytes()).unwrap_or(page.len());
                out.extend_from_slice(&page[i..stop]);
                i = stop;
            }
        }
        out.extend_from_slice(&page[i..]);
        out
    }

    /// Copies a start tag from `start` (its `<`) to its `>`, rewriting the
    /// URL attributes of `tag`; returns where it ends.
    fn start_tag(&self, page: &[u8], start: usize, mut i: usize, tag: &str, out: &mut Vec<u8>) -> usize {
        let wanted = url_attributes(tag);
        out.extend_from_slice(&page[start..i]);
        loop {
            let ws = page[i..].iter().take_while(|b| b.is_ascii_whitespace() || **b == b'/').count();
            out.extend_from_slice(&page[i..i + ws]);
            i += ws;
            match page.get(i) {
                None => return i,
                Some(b'>') => {
                    out.push(b'>');
                    return i + 1;
                }
                _ => {}
            }
            let name_len =
                page[i..].iter().take_while(|b| !b.is_ascii_whitespace() && !matches!(b, b'=' | b'>' | b'/')).count();
            if name_len == 0 {
                // A stray `=`: kept, and the scan goes on after it.
                out.push(page[i]);
                i += 1;
                continue;
            }
            let name = String::from_utf8_lossy(&page[i..i + name_len]).to_ascii_lowercase();
            out.extend_from_slice(&page[i..i + name_len]);
            i += name_len;
            let ws = page[i..].iter().take_while(|b| b.is_ascii_whitespace()).count();
            if page.get(i + ws) != Some(&b'=') {
                continue;
            }
            out.extend_from_slice(&page[i..=i + ws]);
            i += ws + 1;
            let ws = page[i..].iter().take_while(|b| b.is_ascii_whitespace()).count();
            out.extend_from_slice(&page[i..i + ws]);
            i += ws;
            let (value_start, value_end, next) = match page.get(i) {
                Some(&q) if q == b'"' || q == b'\'' => {
                    let close = find(page, i + 1, &[q]).unwrap_or(page.len());
                    (i + 1, close, (close + 1).min(page.len()))
                }
                _ => {
                    let len = page[i..].iter().take_while(|b| !b.is_ascii_whitespace() && **b != b'>').count();
                    (i, i + len, i + len)
                }
            };
            out.extend_from_slice(&page[i..value_start]);
            let value = &page[value_start..value_end];
            let rewritten = wanted
                .contains(&name.as_str())
                .then(|| std::str::from_utf8(value).ok())
                .flatten()
                .and_then(|v| self.url(v));
            match rewritten {
                Some(url) => out.extend_from_slice(url.as_bytes()),
                None => out.extend_from_slice(value),
            }
            out.extend_from_slice(&page[value_end..next]);
            i = next;
        }
    }
}

/// A URL's `scheme://host` part (the host, when there is one) and the rest;
/// None for a URL of another scheme (`mailto:`, `javascript:`).
fn split_authority(url: &str) -> Option<(Option<&str>, &str)> {
    let after_scheme = match url.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") => rest,
        Some(_) => return None,
        None => match url.strip_prefix("//") {
            Some(rest) => rest,
            None => {
                let colon = url.find(':');
                let slash = url.find(['/', '?', '#']);
                if colon.is_some_and(|c| slash.is_none_or(|s| c < s)) {
                    return None;
                }
                return Some((None, url));
            }
        },
    };
    let end = after_scheme.find(['/', '?', '#']).unwrap_or(after_scheme.len());
    Some((Some(&after_scheme[..end]), &after_scheme[end..]))
}

fn find(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    hay.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|p| p + from)
}

fn find_ignore_case(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    hay.get(from..)?.windows(needle.len()).position(|w| w.eq_ignore_ascii_case(needle)).map(|p| p + from)
}

/// A body in a content encoding the rewriter can undo and redo, as upstream
/// handles gzip and deflate (others pass unchanged).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Encoding {
    Identity,
    Gzip,
    Deflate,
}

impl Encoding {
    pub fn of(header: Option<&str>) -> Option<Encoding> {
        match header.map(str::trim) {
            None | Some("") => Some(Encoding::Identity),
            Some(e) if e.eq_ignore_ascii_case("gzip") => Some(Encoding::Gzip),
            Some(e) if e.eq_ignore_ascii_case("deflate") => Some(Encoding::Deflate),
            _ => None,
        }
    }

    pub fn decode(self, body: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        match self {
            Encoding::Identity => out.extend_from_slice(body),
            Encoding::Gzip => {
                flate2::read::GzDecoder::new(body).read_to_end(&mut out)?;
            }
            Encoding::Deflate => {
                flate2::read::DeflateDecoder::new(body).read_to_end(&mut out)?;
            }
        }
        Ok(out)
    }

    pub fn encode(self, body: Vec<u8>) -> std::io::Result<Vec<u8>> {
        match self {
            Encoding::Identity => Ok(body),
            Encoding::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(&body)?;
                e.finish()
            }
            Encoding::Deflate => {
                let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(&body)?;
                e.finish()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFIX: &str = "/api/v1/namespaces/ns/pods/p:1080/proxy";

    fn rewriter() -> Rewriter<'static> {
        Rewriter { prepend: PREFIX, backend: "10.42.0.5:1080" }
    }

    #[test]
    fn absolute_paths_and_the_backends_own_urls_go_through_the_proxy() {
        let r = rewriter();
        assert_eq!(r.url("/rewriteme").as_deref(), Some(format!("{PREFIX}/rewriteme").as_str()));
        assert_eq!(r.url("/a/?q=1#f").as_deref(), Some(format!("{PREFIX}/a/?q=1#f").as_str()));
        assert_eq!(r.url("http://10.42.0.5:1080/x").as_deref(), Some(format!("{PREFIX}/x").as_str()));
        assert_eq!(r.url(&format!("{PREFIX}/already")).as_deref(), Some(format!("{PREFIX}/already").as_str()));
        for kept in ["relative/link", "http://example.com/x", "//example.com/x", "mailto:a@b", "javascript:go()"] {
            assert_eq!(r.url(kept), None, "{kept}");
        }
    }

    #[test]
    fn pages_keep_every_byte_but_their_links() {
        let r = rewriter();
        let page = br#"<!DOCTYPE html><a href="/rewriteme">test</a><!-- <a href="/c"> --><IMG SRC='/i.png' alt=x>
<p title="/not-a-link"><form action=/post method=post></form><script>if (a<b) { x = "<a href='/s'>"; }</script><a href=rel>r</a>"#;
        let out = String::from_utf8(r.html(page)).expect("utf-8");
        let want = format!(
            r#"<!DOCTYPE html><a href="{PREFIX}/rewriteme">test</a><!-- <a href="/c"> --><IMG SRC='{PREFIX}/i.png' alt=x>
<p title="/not-a-link"><form action={PREFIX}/post method=post></form><script>if (a<b) {{ x = "<a href='/s'>"; }}</script><a href=rel>r</a>"#
        );
        assert_eq!(out, want);
        // Truncated markup ends without a panic.
        for cut in [&b"<a href=\"/x"[..], b"<a href=", b"<a ", b"<"] {
            let _ = r.html(cut);
        }
    }

    #[test]
    fn encodings_round_trip() {
        for e in [Encoding::Identity, Encoding::Gzip, Encoding::Deflate] {
            let body = e.encode(b"<a href=\"/x\">".to_vec()).expect("encode");
            assert_eq!(e.decode(&body).expect("decode"), b"<a href=\"/x\">");
        }
        assert_eq!(Encoding::of(Some("br")), None);
        assert_eq!(Encoding::of(None), Some(Encoding::Identity));
    }
}

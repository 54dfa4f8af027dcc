//! How upstream's kubelet spells things in the messages users read
//! (`kubectl describe pod`): Go's `%q` quoting, Go's durations, Go's
//! network error texts and `format.Pod`. Probe and hook messages use them
//! so that they read exactly as they do against upstream.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Pod;

/// Go's `strconv.Quote` (what `%q` prints): double quotes, C escapes,
/// `\x` for bytes that are not UTF-8, `\u` for unprintable characters.
pub fn go_quote(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\u{7}' => out.push_str("\\a"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{b}' => out.push_str("\\v"),
                c if (c as u32) < 0x20 || c == '\u{7f}' => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c if is_printable(c) => out.push(c),
                c if (c as u32) < 0x10000 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => {
                    let _ = write!(out, "\\U{:08x}", c as u32);
                }
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out.push('"');
    out
}

/// Go's `unicode.IsPrint` for what pods carry: everything but controls,
/// spaces other than ASCII's, and the invisible format characters.
fn is_printable(c: char) -> bool {
    if c.is_ascii() {
        return (' '..='~').contains(&c);
    }
    let invisible = matches!(c as u32,
        0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e | 0x200b..=0x200f | 0x202a..=0x202e
        | 0x2060..=0x2064 | 0x2066..=0x206f | 0xfeff | 0xfff9..=0xfffb | 0xe000..=0xf8ff
        | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..=0x10ffff);
    !(c.is_control() || c.is_whitespace() || invisible)
}

/// Go's `%q` of a string.
pub fn quote(s: &str) -> String {
    go_quote(s.as_bytes())
}

/// Go's `time.Duration` text (`1s`, `1m30s`, `500ms`, `1h0m0s`).
pub use crate::duration::format as go_duration;

/// The text Go gives an errno (`connection refused`, `no route to host`):
/// the C library's message, lower-cased, without Rust's `(os error N)`.
pub fn errno_text(err: &std::io::Error) -> String {
    let text = match err.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code).to_string(),
        None => err.to_string(),
    };
    let text = match text.rfind(" (os error ") {
        Some(i) => &text[..i],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Go's `net.JoinHostPort`: IPv6 literals get brackets.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The kubelet's `format.Pod`: `name_namespace(uid)`.
pub fn pod_full_name(pod: &Pod) -> String {
    let m = &pod.metadata;
    format!(
        "{}_{}({})",
        m.name.as_deref().unwrap_or_default(),
        m.namespace.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default()
    )
}

/// Go's `%v` of a `[]string` (`[sh -c exit 1]`).
pub fn go_string_slice(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn quotes_as_go_does() {
        assert_eq!(quote(""), r#""""#);
        assert_eq!(quote("a \"b\"\n"), r#""a \"b\"\n""#);
        assert_eq!(quote("tab\there\\"), r#""tab\there\\""#);
        assert_eq!(quote("\u{1}\u{7f}"), r#""\x01\x7f""#);
        assert_eq!(quote("héllo ✓"), "\"héllo ✓\"");
        assert_eq!(quote("\u{a0}"), r#""\u00a0""#);
        assert_eq!(go_quote(b"ok\xff"), r#""ok\xff""#);
    }

    #[test]
    fn invisible_characters_are_escaped() {
        assert_eq!(quote("plain"), "\"plain\"");
        assert_eq!(quote("a\\b"), "\"a\\\\b\"");
        assert_eq!(quote("\u{1}\u{7f}"), "\"\\x01\\x7f\"");
        assert_eq!(quote("日本\u{200b}"), "\"日本\\u200b\"");
        assert_eq!(quote("\u{e0001}"), "\"\\U000e0001\"");
    }

    #[test]
    fn durations_read_as_go() {
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn errno_texts_are_lower_case() {
        let e = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(errno_text(&e), "connection refused");
        let e = std::io::Error::from_raw_os_error(libc::EHOSTUNREACH);
        assert_eq!(errno_text(&e), "no route to host");
    }

    #[test]
    fn hosts_join_with_brackets_for_v6() {
        assert_eq!(join_host_port("10.42.0.5", 80), "10.42.0.5:80");
        assert_eq!(join_host_port("fd00::1", 80), "[fd00::1]:80");
    }
}

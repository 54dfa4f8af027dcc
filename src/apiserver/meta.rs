//! Object metadata helpers: timestamps in upstream's format, uids,
//! generated names, and reading fields of JSON objects.

use serde_json::Value;

/// Seconds since the epoch, now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// `2006-01-02T15:04:05Z` for a Unix time, as metav1.Time encodes.
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

pub fn now_rfc3339() -> String {
    rfc3339(unix_now())
}

/// `2006-01-02T15:04:05.000000Z`, as metav1.MicroTime encodes.
pub fn now_rfc3339_micro() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let base = rfc3339(d.as_secs() as i64);
    format!("{}.{:06}Z", base.trim_end_matches('Z'), d.subsec_micros())
}

/// Parses the date-time forms Kubernetes writes (fractions and offsets allowed).
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || (b[10] != b'T' && b[10] != b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d, h, mi, sec) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.find(|c: char| !c.is_ascii_digit()).unwrap_or(frac.len());
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            sign * (oh * 3600 + om * 60)
        }
    };
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset)
}

// Howard Hinnant's civil calendar algorithms.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// How long ago, as `kubectl get` prints ages (upstream's HumanDuration).
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    let (m, h) = (s / 60, s / 3600);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        if h % 24 == 0 {
            format!("{}d", h / 24)
        } else {
            format!("{}d{}h", h / 24, h % 24)
        }
    } else if h < 24 * 365 * 2 {
        format!("{}d", h / 24)
    } else if h < 24 * 365 * 8 {
        let d = h / 24 % 365;
        if d == 0 {
            format!("{}y", h / 24 / 365)
        } else {
            format!("{}y{}d", h / 24 / 365, d)
        }
    } else {
        format!("{}y", h / 24 / 365)
    }
}

/// The age of an object from its creationTimestamp.
pub fn age(obj: &Value) -> String {
    match str_at(obj, &["metadata", "creationTimestamp"]).and_then(parse_rfc3339) {
        Some(t) => human_duration(unix_now() - t),
        None => "<unknown>".into(),
    }
}

/// A random version-4 UUID.
pub fn new_uid() -> String {
    let mut b = [0u8; 16];
    crate::host::random::fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(36);
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(HEX[usize::from(x >> 4)] as char);
        out.push(HEX[usize::from(x & 0x0f)] as char);
    }
    out
}

/// `generateName` plus five characters from upstream's alphabet.
pub fn generate_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut b = [0u8; 5];
    crate::host::random::fill(&mut b);
    let suffix: String = b.iter().map(|x| ALPHABET[*x as usize % ALPHABET.len()] as char).collect();
    format!("{}{suffix}", truncate_at_char(prefix, 63 - 5))
}

/// The longest prefix of `s` no longer than `max` bytes that ends on a
/// character boundary: user strings may hold multi-byte characters anywhere.
pub fn truncate_at_char(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

pub fn at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut v = obj;
    for p in path {
        v = v.get(p)?;
    }
    Some(v)
}

pub fn str_at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(obj, path)?.as_str()
}

pub fn name_of(obj: &Value) -> &str {
    str_at(obj, &["metadata", "name"]).unwrap_or("")
}

pub fn namespace_of(obj: &Value) -> Option<&str> {
    str_at(obj, &["metadata", "namespace"]).filter(|s| !s.is_empty())
}

/// `metadata` as a mutable map, created when missing (and the object made
/// an object first: a request body may be any JSON value).
pub fn metadata_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Default::default());
    }
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = Value::Object(Default::default());
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20Z"), Some(1_700_000_000));
        assert_eq!(parse_rfc3339("2023-11-14T23:13:20.123456+01:00"), Some(1_700_000_000));
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(185), "3m5s");
        assert_eq!(human_duration(3600 * 5 + 60 * 3), "5h3m");
        assert_eq!(human_duration(86400 * 3), "3d");
        let uid = new_uid();
        assert_eq!(uid.len(), 36);
        assert_eq!(&uid[14..15], "4");
        assert!(matches!(&uid[19..20], "8" | "9" | "a" | "b"), "{uid}");
        for (i, c) in uid.char_indices() {
            let dash = matches!(i, 8 | 13 | 18 | 23);
            assert!(if dash { c == '-' } else { c.is_ascii_hexdigit() && !c.is_ascii_uppercase() }, "{uid}");
        }
        assert_ne!(uid, new_uid());
        assert_eq!(generate_name("web-").len(), 9);
        // A multi-byte character across byte 58 is cut whole, not split.
        let prefix = format!("{}\u{e9}tail", "a".repeat(57));
        let name = generate_name(&prefix);
        assert!(name.starts_with(&"a".repeat(57)) && name.len() == 62, "{name}");
        assert_eq!(truncate_at_char("\u{1f600}", 3), "");
    }
}

//! Go's `time.Duration` as text, the way Kubernetes reads and writes it:
//! `metav1.Duration` fields (`1h0m0s`, `1.5s`, `300ms`), upstream's flags
//! and config files (`--pod-eviction-timeout=5m`), PodMetrics' `window`,
//! and the durations upstream prints in messages (`back-off 5m0s`). One
//! parser and one printer for every component.

use std::time::Duration;

/// Why a text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {text:?}: {why}")]
pub struct ParseError {
    pub text: String,
    pub why: &'static str,
}

fn error(text: &str, why: &'static str) -> ParseError {
    ParseError { text: text.to_string(), why }
}

/// Go's `time.ParseDuration`: a sequence of decimal numbers, each with an
/// optional fraction and a unit (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`),
/// such as `300ms`, `1.5h` or `2h45m`; `0` alone needs no unit. Negative
/// durations, which Go allows, are refused: no Kubernetes duration is
/// negative.
pub fn parse(text: &str) -> Result<Duration, ParseError> {
    let s = text.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(error(text, "must not be negative"));
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(error(text, "empty"));
    }
    let mut nanos: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let int_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (int, after) = rest.split_at(int_end);
        let (frac, after) = match after.strip_prefix('.') {
            Some(f) => {
                let end = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
                f.split_at(end)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(error(text, "expected a number"));
        }
        let unit_end = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(error(text, "missing unit (ns, us, ms, s, m or h)")),
            _ => return Err(error(text, "unknown unit (ns, us, ms, s, m or h)")),
        };
        let int: u128 = if int.is_empty() { 0 } else { int.parse().map_err(|_| error(text, "too large"))? };
        // The fraction's digits beyond a nanosecond are dropped, as Go does.
        let mut part = int.checked_mul(scale).ok_or_else(|| error(text, "too large"))?;
        let mut unit_fraction = scale;
        for digit in frac.bytes() {
            unit_fraction /= 10;
            if unit_fraction == 0 {
                break;
            }
            part += u128::from(digit - b'0') * unit_fraction;
        }
        nanos = nanos.checked_add(part).ok_or_else(|| error(text, "too large"))?;
        rest = after;
    }
    let nanos = u64::try_from(nanos).map_err(|_| error(text, "too large"))?;
    Ok(Duration::from_nanos(nanos))
}

/// `parse`, and a plain number is that many seconds (`30` for `30s`), as
/// ferrok's own flags and environment variables also accept.
pub fn parse_seconds_or_go(text: &str) -> Result<Duration, ParseError> {
    let s = text.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let seconds: f64 = s.parse().map_err(|_| error(text, "expected a number"))?;
        return Duration::try_from_secs_f64(seconds).map_err(|_| error(text, "too large"));
    }
    parse(text)
}

/// Go's `time.Duration.String()`: `0s`, `300ms`, `1.5s`, `1m30s`, `1h0m0s`.
pub fn format(d: Duration) -> String {
    format_nanos(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// `format` of a signed count of nanoseconds (a protobuf `Duration`).
pub fn format_nanos(ns: i64) -> String {
    /// `v / 10^prec` with its fraction, trailing zeros (and a bare point) dropped.
    fn split(v: u64, prec: u32) -> (u64, String) {
        let p = 10u64.pow(prec);
        let frac = v % p;
        if frac == 0 {
            return (v / p, String::new());
        }
        let digits = format!("{frac:0width$}", width = prec as usize);
        (v / p, format!(".{}", digits.trim_end_matches('0')))
    }
    let u = ns.unsigned_abs();
    if u == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    if ns < 0 {
        out.push('-');
    }
    if u < 1_000_000_000 {
        let (prec, unit) = if u < 1_000 {
            (0, "ns")
        } else if u < 1_000_000 {
            (3, "µs")
        } else {
            (6, "ms")
        };
        let (int, frac) = split(u, prec);
        out.push_str(&format!("{int}{frac}{unit}"));
    } else {
        let (secs, frac) = split(u, 9);
        let (mins, s) = (secs / 60, secs % 60);
        if mins > 0 {
            let (h, m) = (mins / 60, mins % 60);
            if h > 0 {
                out.push_str(&format!("{h}h"));
            }
            out.push_str(&format!("{m}m"));
        }
        out.push_str(&format!("{s}{frac}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_go_parses() {
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1m0.5s"), Ok(Duration::from_millis(60_500)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("5m0s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("2h45m"), Ok(Duration::from_secs(9900)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1µs"), Ok(Duration::from_micros(1)));
        assert_eq!(parse("3us5ns"), Ok(Duration::from_nanos(3005)));
        assert_eq!(parse("0.0000000015s"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse("+10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn refuses_what_go_refuses_and_negatives() {
        for bad in ["", "3", "5x", "5 minutes", "s", ".s", "1h-5m", "-1s", "99999999999999999999h"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse("5y").map_err(|e| e.to_string()),
            Err(r#"invalid duration "5y": unknown unit (ns, us, ms, s, m or h)"#.into())
        );
    }

    #[test]
    fn plain_numbers_are_seconds_where_asked() {
        assert_eq!(parse_seconds_or_go("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_seconds_or_go("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_seconds_or_go("1500ms"), Ok(Duration::from_millis(1500)));
        assert!(parse_seconds_or_go("x").is_err());
    }

    #[test]
    fn prints_as_go_prints() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_secs(80), "1m20s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(300), "5m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(3_723_500), "1h2m3.5s"),
        ] {
            assert_eq!(format(d), text);
            assert_eq!(parse(text), Ok(d));
        }
        assert_eq!(format_nanos(-1_500_000_000), "-1.5s");
    }
}

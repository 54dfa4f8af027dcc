//! Durations as flags spell them: `500ms`, `30s`, `10m`, `1h`, or a plain
//! number of seconds.

use std::time::Duration;

pub fn parse(text: &str) -> Result<Duration, String> {
    let d = parse_or_zero(text)?;
    if d.is_zero() {
        return Err(format!("invalid duration {:?}: must be positive", text.trim()));
    }
    Ok(d)
}

/// As `parse`, and zero (`0`, `0s`, ...) is allowed: for flags where zero
/// turns something off.
pub fn parse_or_zero(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("invalid duration {text:?}"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("invalid duration {text:?}: unit must be ms, s, m or h")),
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(format!("invalid duration {text:?}: must be positive"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("3"), Ok(Duration::from_secs(3)));
        assert!(parse("5y").is_err());
        assert!(parse("0s").is_err());
        assert_eq!(parse_or_zero("0"), Ok(Duration::ZERO));
        assert_eq!(parse_or_zero("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_or_zero("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_or_zero("-1s").is_err());
        assert!(parse_or_zero("0y").is_err());
    }
}

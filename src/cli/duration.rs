//! Durations as flags spell them: Go's (`500ms`, `30s`, `10m`, `1h30m`),
//! or a plain number of seconds.

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
    crate::duration::parse_seconds_or_go(text).map_err(|e| e.to_string())
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

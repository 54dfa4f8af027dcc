//! Durations as flags spell them: Go's (`500ms`, `30s`, `10m`, `1h30m`),
//! or a plain number of seconds.

use std::time::Duration;

use crate::duration::ParseError;

/// Why a flag's duration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationFlagError {
    #[error(transparent)]
    Invalid(#[from] ParseError),
    #[error("invalid duration {0:?}: must be positive")]
    NotPositive(String),
}

pub fn parse(text: &str) -> Result<Duration, DurationFlagError> {
    let d = parse_or_zero(text)?;
    if d.is_zero() {
        return Err(DurationFlagError::NotPositive(text.trim().to_string()));
    }
    Ok(d)
}

/// As `parse`, and zero (`0`, `0s`, ...) is allowed: for flags where zero
/// turns something off.
pub fn parse_or_zero(text: &str) -> Result<Duration, ParseError> {
    crate::duration::parse_seconds_or_go(text)
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

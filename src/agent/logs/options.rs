//! The kubelet's `/containerLogs` query as upstream decodes it: a v1
//! `PodLogOptions` (`follow`, `previous`, `timestamps`, `sinceSeconds`,
//! `sinceTime`, `tailLines`, `limitBytes`, and the old `tail`), validated
//! as `ValidatePodLogOptions` does, then turned into what the reader needs
//! (`kuberuntime/logs.NewLogOptions`).

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Why a query is refused; the texts are the kubelet's response bodies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogQueryError {
    /// 400.
    #[error(r#"{{"message": "Unable to decode query."}}"#)]
    Decode,
    /// 422.
    #[error(r#"{{"message": "Invalid request."}}"#)]
    Invalid,
}

/// The decoded `PodLogOptions` fields the kubelet uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodLogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub since_seconds: Option<i64>,
    pub since_time: Option<Timestamp>,
    pub tail_lines: Option<i64>,
    pub limit_bytes: Option<i64>,
}

/// What the reader does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Lines older than this are skipped.
    pub since: Option<Timestamp>,
    /// Lines counted from the end (`None`: all).
    pub tail: Option<u64>,
    /// Bytes written at most, timestamps included (`None`: no limit).
    pub bytes: Option<u64>,
    pub follow: bool,
    pub timestamps: bool,
}

/// Go's `strconv.ParseBool`, which the query decoder uses.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn parse_int(v: &str) -> Result<i64, LogQueryError> {
    v.parse().map_err(|_| LogQueryError::Decode)
}

impl PodLogOptions {
    /// Decodes and validates a query string (without the `?`).
    pub fn from_query(query: Option<&str>) -> Result<PodLogOptions, LogQueryError> {
        let pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(query.unwrap_or_default()).map_err(|_| LogQueryError::Decode)?;
        // The decoder takes the first value of a repeated parameter.
        let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        let mut o = PodLogOptions::default();
        let flag = |key: &str| get(key).map(|v| parse_bool(v).ok_or(LogQueryError::Decode)).transpose();
        o.follow = flag("follow")?.unwrap_or(false);
        o.previous = flag("previous")?.unwrap_or(false);
        o.timestamps = flag("timestamps")?.unwrap_or(false);
        // insecureSkipTLSVerifyBackend only matters to the API server.
        flag("insecureSkipTLSVerifyBackend")?;
        o.since_seconds = get("sinceSeconds").map(parse_int).transpose()?;
        o.limit_bytes = get("limitBytes").map(parse_int).transpose()?;
        // The old `tail` wins over tailLines; `all` means no limit.
        o.tail_lines = match get("tail") {
            Some("all") => None,
            Some(t) => Some(parse_int(t)?),
            None => get("tailLines").map(parse_int).transpose()?,
        };
        o.since_time = get("sinceTime")
            .filter(|v| !v.is_empty())
            .map(|v| v.parse::<Timestamp>().map_err(|_| LogQueryError::Decode))
            .transpose()?;
        o.validate()?;
        Ok(o)
    }

    /// `ValidatePodLogOptions`.
    fn validate(&self) -> Result<(), LogQueryError> {
        let negative = |v: Option<i64>, min: i64| v.is_some_and(|v| v < min);
        if negative(self.tail_lines, 0)
            || negative(self.limit_bytes, 1)
            || negative(self.since_seconds, 1)
            || (self.since_seconds.is_some() && self.since_time.is_some())
        {
            return Err(LogQueryError::Invalid);
        }
        Ok(())
    }

    /// The reader's options at `now` (`NewLogOptions`).
    pub fn log_options(&self, now: Timestamp) -> LogOptions {
        let since = match (self.since_seconds, self.since_time) {
            (Some(s), _) => now.checked_sub(SignedDuration::from_secs(s)).ok(),
            (None, Some(t)) => Some(t),
            (None, None) => None,
        };
        LogOptions {
            since,
            tail: self.tail_lines.map(|t| t as u64),
            bytes: self.limit_bytes.map(|b| b as u64),
            follow: self.follow,
            timestamps: self.timestamps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_query_decodes() {
        let o = PodLogOptions::from_query(Some(
            "follow=true&timestamps=1&tailLines=5&limitBytes=100&sinceTime=2026-11-24T04:00:00Z&previous=False",
        ))
        .unwrap();
        assert!(o.follow && o.timestamps && !o.previous);
        assert_eq!((o.tail_lines, o.limit_bytes), (Some(5), Some(100)));
        let now: Timestamp = "2026-11-24T05:00:00Z".parse().unwrap();
        let lo = o.log_options(now);
        assert_eq!(lo.since, Some("2026-11-24T04:00:00Z".parse().unwrap()));
        assert_eq!((lo.tail, lo.bytes), (Some(5), Some(100)));
    }

    #[test]
    fn since_seconds_counts_back_from_now() {
        let o = PodLogOptions::from_query(Some("sinceSeconds=60")).unwrap();
        let now: Timestamp = "2026-11-24T05:00:00Z".parse().unwrap();
        assert_eq!(o.log_options(now).since, Some("2026-11-24T04:59:00Z".parse().unwrap()));
        assert_eq!(PodLogOptions::from_query(None).unwrap().log_options(now), LogOptions::default());
    }

    #[test]
    fn the_old_tail_parameter_is_honoured() {
        assert_eq!(PodLogOptions::from_query(Some("tail=3&tailLines=9")).unwrap().tail_lines, Some(3));
        assert_eq!(PodLogOptions::from_query(Some("tail=all&tailLines=9")).unwrap().tail_lines, None);
    }

    #[test]
    fn bad_queries_get_the_kubelets_answers() {
        for q in ["follow=yes", "tailLines=x", "sinceTime=yesterday"] {
            assert_eq!(PodLogOptions::from_query(Some(q)), Err(LogQueryError::Decode), "{q}");
        }
        for q in ["tailLines=-1", "limitBytes=0", "sinceSeconds=0", "sinceSeconds=5&sinceTime=2026-11-24T04:00:00Z"] {
            assert_eq!(PodLogOptions::from_query(Some(q)), Err(LogQueryError::Invalid), "{q}");
        }
        assert_eq!(LogQueryError::Invalid.to_string(), r#"{"message": "Invalid request."}"#);
    }
}

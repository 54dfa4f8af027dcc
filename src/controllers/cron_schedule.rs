//! CronJob schedules, in the standard five-field syntax CronJobs accept
//! (minute hour day-of-month month day-of-week, with lists, ranges, steps,
//! month and weekday names, `?`, and the @yearly/@monthly/@weekly/@daily/
//! @hourly descriptors), evaluated in a time zone. As in cron, when both
//! day fields are restricted a day matching either one fires.

use k8s_openapi::jiff::civil::{Date, DateTime, Time};
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{Timestamp, ToSpan};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScheduleError {
    #[error("expected exactly 5 fields, found {0}: {1}")]
    FieldCount(usize, String),
    #[error("failed to parse {0}: {1}")]
    Field(&'static str, String),
    #[error("unrecognized descriptor: {0}")]
    Descriptor(String),
    #[error("unknown time zone {0}")]
    TimeZone(String),
}

/// A parsed schedule: one bit per allowed value of each field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    days_of_week: u64,
    /// Either day field was `*` or `?` (then both must match).
    day_star: bool,
}

struct Bounds {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Bounds = Bounds { name: "minute", min: 0, max: 59, names: &[] };
const HOUR: Bounds = Bounds { name: "hour", min: 0, max: 23, names: &[] };
const DOM: Bounds = Bounds { name: "day of month", min: 1, max: 31, names: &[] };
const MONTH: Bounds = Bounds {
    name: "month",
    min: 1,
    max: 12,
    names: &["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
};
const DOW: Bounds =
    Bounds { name: "day of week", min: 0, max: 7, names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"] };

fn value(s: &str, b: &Bounds) -> Result<u32, ScheduleError> {
    let lower = s.to_ascii_lowercase();
    if let Some(i) = b.names.iter().position(|n| *n == lower) {
        return Ok(i as u32 + if b.min == 1 { 1 } else { 0 });
    }
    let v: u32 = s.parse().map_err(|_| ScheduleError::Field(b.name, format!("invalid value {s:?}")))?;
    if v < b.min || v > b.max {
        return Err(ScheduleError::Field(b.name, format!("{v} is out of range {}-{}", b.min, b.max)));
    }
    Ok(v)
}

/// One field: the bits it allows, and whether it was a bare `*`/`?`.
fn field(expr: &str, b: &Bounds) -> Result<(u64, bool), ScheduleError> {
    let mut bits = 0u64;
    let mut star = false;
    for part in expr.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| ScheduleError::Field(b.name, format!("invalid step {s:?}")))?;
                if step == 0 {
                    return Err(ScheduleError::Field(b.name, "step of zero".into()));
                }
                (r, Some(step))
            }
            None => (part, None),
        };
        let (start, end) = if range == "*" || range == "?" {
            if step.is_none_or(|s| s == 1) {
                star = true;
            }
            (b.min, b.max)
        } else if let Some((lo, hi)) = range.split_once('-') {
            (value(lo, b)?, value(hi, b)?)
        } else {
            let v = value(range, b)?;
            (v, if step.is_some() { b.max } else { v })
        };
        if start > end {
            return Err(ScheduleError::Field(
                b.name,
                format!("beginning of range ({start}) beyond end of range ({end})"),
            ));
        }
        let step = step.unwrap_or(1);
        let mut v = start;
        while v <= end {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok((bits, star))
}

impl Schedule {
    pub fn parse(spec: &str) -> Result<Schedule, ScheduleError> {
        let spec = spec.trim();
        let expanded = match spec {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            s if s.starts_with('@') => return Err(ScheduleError::Descriptor(s.into())),
            s => s,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(ScheduleError::FieldCount(fields.len(), spec.into()));
        }
        let (minutes, _) = field(fields[0], &MINUTE)?;
        let (hours, _) = field(fields[1], &HOUR)?;
        let (days_of_month, dom_star) = field(fields[2], &DOM)?;
        let (months, _) = field(fields[3], &MONTH)?;
        let (mut days_of_week, dow_star) = field(fields[4], &DOW)?;
        if days_of_week & (1 << 7) != 0 {
            days_of_week |= 1;
        }
        Ok(Schedule { minutes, hours, days_of_month, months, days_of_week, day_star: dom_star || dow_star })
    }

    fn day_matches(&self, d: Date) -> bool {
        let dom = self.days_of_month & (1 << d.day()) != 0;
        let dow = self.days_of_week & (1 << d.weekday().to_sunday_zero_offset()) != 0;
        if self.day_star {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The first time after `after` (to the minute) the schedule fires.
    pub fn next(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let local = tz.to_datetime(after);
        let mut t = DateTime::from_parts(local.date(), Time::new(local.hour(), local.minute(), 0, 0).ok()?)
            .checked_add(1.minute())
            .ok()?;
        // Five years is enough for any satisfiable schedule (Feb 29 included).
        let limit = t.date().checked_add(5.years()).ok()?;
        while t.date() < limit {
            if self.months & (1 << t.month()) == 0 {
                let first = Date::new(t.year(), t.month(), 1).ok()?.checked_add(1.month()).ok()?;
                t = first.to_datetime(Time::midnight());
                continue;
            }
            if !self.day_matches(t.date()) {
                t = t.date().checked_add(1.day()).ok()?.to_datetime(Time::midnight());
                continue;
            }
            if self.hours & (1 << t.hour()) == 0 {
                t = DateTime::from_parts(t.date(), Time::new(t.hour(), 0, 0, 0).ok()?).checked_add(1.hour()).ok()?;
                continue;
            }
            if self.minutes & (1 << t.minute()) == 0 {
                t = t.checked_add(1.minute()).ok()?;
                continue;
            }
            let at = tz.to_ambiguous_timestamp(t).compatible().ok()?;
            if at > after {
                return Some(at);
            }
            t = t.checked_add(1.minute()).ok()?;
        }
        None
    }
}

/// The CronJob's time zone: UTC when unset, else from the system's zoneinfo.
pub fn time_zone(name: Option<&str>) -> Result<TimeZone, ScheduleError> {
    let Some(name) = name.filter(|n| !n.is_empty()) else { return Ok(TimeZone::UTC) };
    if matches!(name, "UTC" | "Etc/UTC" | "Etc/GMT" | "GMT" | "Zulu" | "Etc/Zulu") {
        return Ok(TimeZone::UTC);
    }
    let valid = !name.starts_with('/')
        && name.split('/').all(|p| !p.is_empty() && p != "." && p != "..")
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "/_-+".contains(c));
    if !valid {
        return Err(ScheduleError::TimeZone(name.into()));
    }
    for dir in ["/usr/share/zoneinfo", "/usr/lib/zoneinfo", "/usr/share/lib/zoneinfo"] {
        if let Ok(data) = std::fs::read(format!("{dir}/{name}")) {
            return TimeZone::tzif(name, &data).map_err(|_| ScheduleError::TimeZone(name.into()));
        }
    }
    Err(ScheduleError::TimeZone(name.into()))
}

/// What a CronJob should do now: the most recent unmet schedule time in
/// `(earliest, now]` (and how many there were, capped), and the next one.
#[derive(Debug, PartialEq, Eq)]
pub struct Due {
    pub most_recent: Option<Timestamp>,
    pub missed: usize,
    pub next: Option<Timestamp>,
}

/// Schedule times between `earliest` (exclusive) and `now`.
pub fn due(schedule: &Schedule, tz: &TimeZone, earliest: Timestamp, now: Timestamp) -> Due {
    let mut most_recent = None;
    let mut missed = 0;
    let mut t = earliest;
    // A schedule missed for very long (a minutely one for a year) is still
    // walked in well under a second; stop counting past what matters.
    while let Some(n) = schedule.next(t, tz) {
        if n > now {
            return Due { most_recent, missed, next: Some(n) };
        }
        most_recent = Some(n);
        missed += 1;
        t = n;
    }
    Due { most_recent, missed, next: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn next(spec: &str, after: &str) -> String {
        Schedule::parse(spec).unwrap().next(ts(after), &TimeZone::UTC).unwrap().to_string()
    }

    #[test]
    fn parses_fields_names_steps_and_descriptors() {
        assert_eq!(next("* * * * *", "2024-01-01T00:00:30Z"), "2024-01-01T00:01:00Z");
        assert_eq!(next("*/15 * * * *", "2024-01-01T00:16:00Z"), "2024-01-01T00:30:00Z");
        assert_eq!(next("5-10/5 3 * * *", "2024-01-01T03:06:00Z"), "2024-01-01T03:10:00Z");
        assert_eq!(next("0 9 * * MON-FRI", "2024-01-05T10:00:00Z"), "2024-01-08T09:00:00Z");
        assert_eq!(next("0 0 1 JAN *", "2024-03-01T00:00:00Z"), "2025-01-01T00:00:00Z");
        assert_eq!(next("@hourly", "2024-01-01T10:59:59Z"), "2024-01-01T11:00:00Z");
        assert_eq!(next("@daily", "2024-01-01T10:00:00Z"), "2024-01-02T00:00:00Z");
        assert_eq!(next("@weekly", "2024-01-01T10:00:00Z"), "2024-01-07T00:00:00Z");
        assert_eq!(next("0 0 29 2 *", "2024-03-01T00:00:00Z"), "2028-02-29T00:00:00Z");
        assert_eq!(next("0 0 * * 7", "2024-01-01T00:00:00Z"), "2024-01-07T00:00:00Z");
        // Both day fields restricted: either matches (the 13th, or a Friday).
        assert_eq!(next("0 0 13 * 5", "2024-01-01T00:00:00Z"), "2024-01-05T00:00:00Z");
        assert_eq!(next("0 0 13 * 5", "2024-01-12T00:00:00Z"), "2024-01-13T00:00:00Z");
        // 5/20 means 5, 25, 45.
        assert_eq!(next("5/20 * * * *", "2024-01-01T00:26:00Z"), "2024-01-01T00:45:00Z");
        assert!(Schedule::parse("* * * *").is_err());
        assert!(Schedule::parse("60 * * * *").is_err());
        assert!(Schedule::parse("@every 5m").is_err());
        assert!(Schedule::parse("5-1 * * * *").is_err());
    }

    #[test]
    fn time_zones_shift_the_schedule() {
        let s = Schedule::parse("0 9 * * *").unwrap();
        let tz = time_zone(Some("Etc/GMT-2")).unwrap();
        assert_eq!(s.next(ts("2024-01-01T00:00:00Z"), &tz).unwrap().to_string(), "2024-01-01T07:00:00Z");
        assert!(time_zone(Some("../etc/passwd")).is_err());
        assert!(time_zone(Some("Mars/Olympus")).is_err());
        assert_eq!(time_zone(None).unwrap(), TimeZone::UTC);
    }

    #[test]
    fn due_finds_the_most_recent_missed_time() {
        let s = Schedule::parse("*/10 * * * *").unwrap();
        let d = due(&s, &TimeZone::UTC, ts("2024-01-01T00:00:00Z"), ts("2024-01-01T00:35:00Z"));
        assert_eq!(d.most_recent, Some(ts("2024-01-01T00:30:00Z")));
        assert_eq!(d.missed, 3);
        assert_eq!(d.next, Some(ts("2024-01-01T00:40:00Z")));
        let d = due(&s, &TimeZone::UTC, ts("2024-01-01T00:30:00Z"), ts("2024-01-01T00:35:00Z"));
        assert_eq!(d.most_recent, None);
    }
}

//! Points in time as users and Pyroscope clients write them: RFC 3339, unix
//! seconds / ms / µs / ns (told apart by magnitude), `YYYYMMDD`,
//! `HH:MM_YYYYMMDD`, `now`, and `now-1h`-style offsets.

/// A time expression that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// The text matches none of the accepted forms.
    #[error(
        "time {text:?} is not RFC 3339, unix seconds/ms/ns, YYYYMMDD, `now` or `now-<n><unit>`"
    )]
    Unrecognized {
        /// The text given (truncated to 64 bytes).
        text: String,
    },
    /// A relative offset uses a unit that is not known.
    #[error("time {text:?}: unit {unit:?} is not one of ns, us, ms, s, m, h, d, w, y")]
    UnknownUnit {
        /// The text given.
        text: String,
        /// The unit found.
        unit: String,
    },
    /// The time is outside the range Kiln stores (years 1970 to 2262).
    #[error("time {text:?} is out of range")]
    OutOfRange {
        /// The text given.
        text: String,
    },
}

impl TimeError {
    /// A short, fixed name for metrics and logs, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unrecognized { .. } => "time_unrecognized",
            Self::UnknownUnit { .. } => "time_unknown_unit",
            Self::OutOfRange { .. } => "time_out_of_range",
        }
    }
}

/// The current unix time in ms, the `now` every relative time is read from
/// (0 before 1970, saturating far in the future).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The look-back of a query range that names no start: one hour.
pub const DEFAULT_RANGE_MS: i64 = 3_600_000;

/// A query range that cannot be used: a time outside what Kiln stores, or
/// an end not after its start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// `start` or `end` lies before 1970 or past the year 2262. Every time
    /// a request gives is checked before any arithmetic on it, so that a
    /// client's `i64::MAX` cannot overflow a subtraction (a panic in debug
    /// builds, a wrapped range in release builds).
    #[error(
        "{name} ({ms} ms) is out of range: give unix ms from 0 to {MAX_MS} (1970 to 2262), or 0 for the default"
    )]
    OutOfRange {
        /// `start` or `end`.
        name: &'static str,
        /// The time given.
        ms: i64,
    },
    /// The end (after defaults) is not after the start.
    #[error("end ({end_ms} ms) must be after start ({start_ms} ms)")]
    Empty {
        /// The start, defaulted.
        start_ms: i64,
        /// The end, defaulted.
        end_ms: i64,
    },
}

/// The query range `start..=end` in unix ms, where 0 means the default:
/// now for the end, [`DEFAULT_RANGE_MS`] before the end for the start.
/// Both must lie within what Kiln stores (see [`RangeError::OutOfRange`]).
pub fn inclusive_range_ms(
    start: i64,
    end: i64,
) -> Result<kiln_engine::model::TimeRange, RangeError> {
    let check = |name: &'static str, ms: i64| {
        if (0..=MAX_MS).contains(&ms) {
            Ok(ms)
        } else {
            Err(RangeError::OutOfRange { name, ms })
        }
    };
    let end_ms = check("end", if end == 0 { now_ms() } else { end })?;
    let start_ms = if start == 0 {
        // Within 0..=MAX_MS, so this cannot overflow; an end less than an
        // hour after 1970 starts at 1970.
        end_ms.saturating_sub(DEFAULT_RANGE_MS).max(0)
    } else {
        check("start", start)?
    };
    if end_ms <= start_ms {
        return Err(RangeError::Empty { start_ms, end_ms });
    }
    Ok(kiln_engine::model::TimeRange {
        start_ms,
        // MAX_MS + 1 still fits.
        end_ms: end_ms + 1,
    })
}

/// Largest unix ms that still fits in i64 nanoseconds (year 2262).
pub const MAX_MS: i64 = i64::MAX / 1_000_000;

/// Parses `text` into unix milliseconds; `now_ms` anchors `now` and offsets.
pub fn parse_time_ms(text: &str, now_ms: i64) -> Result<i64, TimeError> {
    let trimmed = text.trim();
    let clipped = || trimmed.chars().take(64).collect::<String>();
    let unrecognized = || TimeError::Unrecognized { text: clipped() };
    if trimmed.is_empty() {
        return Err(unrecognized());
    }
    let result = if let Some(rest) = trimmed.strip_prefix("now") {
        now_ms.checked_add(parse_offset_ms(rest, trimmed)?)
    } else if trimmed.starts_with('-') || trimmed.starts_with('+') {
        // Graphite's bare offset: "-1h" means "now-1h".
        now_ms.checked_add(parse_offset_ms(trimmed, trimmed)?)
    } else if let Some(ms) = parse_graphite_clock_date(trimmed) {
        Some(ms)
    } else if trimmed.len() == 8 && trimmed.bytes().all(|b| b.is_ascii_digit()) {
        parse_compact_date(trimmed)
            .ok_or_else(unrecognized)
            .map(Some)?
    } else if trimmed.bytes().all(|b| b.is_ascii_digit()) {
        let n: i64 = trimmed
            .parse()
            .map_err(|_| TimeError::OutOfRange { text: clipped() })?;
        Some(unix_number_to_ms(n))
    } else if let Some((whole, fraction)) = split_decimal_seconds(trimmed) {
        whole
            .checked_mul(1000)
            .and_then(|ms| ms.checked_add(fraction))
    } else {
        Some(parse_rfc3339_ms(trimmed).ok_or_else(unrecognized)?)
    };
    match result {
        Some(ms) if (0..=MAX_MS).contains(&ms) => Ok(ms),
        _ => Err(TimeError::OutOfRange { text: clipped() }),
    }
}

/// Unix time of unknown unit, told apart by magnitude as Pyroscope does by
/// digit count: seconds until the year 5138, then ms, µs, ns.
fn unix_number_to_ms(n: i64) -> i64 {
    if n < 100_000_000_000 {
        n.saturating_mul(1000)
    } else if n < 100_000_000_000_000 {
        n
    } else if n < 100_000_000_000_000_000 {
        n / 1000
    } else {
        n / 1_000_000
    }
}

/// `1795310550.25` -> (1795310550, 250).
fn split_decimal_seconds(text: &str) -> Option<(i64, i64)> {
    let (whole, fraction) = text.split_once('.')?;
    if whole.is_empty()
        || fraction.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: i64 = whole.parse().ok()?;
    let mut ms = 0i64;
    for (i, digit) in fraction.bytes().take(3).enumerate() {
        ms += i64::from(digit - b'0') * 10i64.pow(2 - i as u32);
    }
    Some((whole, ms))
}

/// `-1h`, `+30m`, `-1h30m`, `` (nothing: zero). The offset is a duration in
/// Kiln's one grammar (docs/durations.md) that must carry its unit.
fn parse_offset_ms(rest: &str, whole_text: &str) -> Result<i64, TimeError> {
    use kiln_contract::duration::{DurationError, parse_duration_with_unit};
    let clipped = || whole_text.chars().take(64).collect::<String>();
    if rest.is_empty() {
        return Ok(0);
    }
    let (sign, body) = if let Some(body) = rest.strip_prefix('-') {
        (-1i64, body)
    } else if let Some(body) = rest.strip_prefix('+') {
        (1i64, body)
    } else {
        return Err(TimeError::Unrecognized { text: clipped() });
    };
    let offset = parse_duration_with_unit(body).map_err(|err| match err {
        DurationError::UnknownUnit { unit, .. } => TimeError::UnknownUnit {
            text: clipped(),
            unit,
        },
        DurationError::TooLong { .. } => TimeError::OutOfRange { text: clipped() },
        _ => TimeError::Unrecognized { text: clipped() },
    })?;
    i64::try_from(offset.as_millis())
        .map(|ms| sign * ms)
        .map_err(|_| TimeError::OutOfRange { text: clipped() })
}

/// Graphite's `HH:MM_YYYYMMDD` (UTC).
fn parse_graphite_clock_date(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    if bytes.len() != 14 || bytes[2] != b':' || bytes[5] != b'_' {
        return None;
    }
    let hour: i64 = text.get(0..2)?.parse().ok()?;
    let minute: i64 = text.get(3..5)?.parse().ok()?;
    if hour > 23 || minute > 59 {
        return None;
    }
    let day_ms = parse_compact_date(text.get(6..14)?)?;
    Some(day_ms + (hour * 60 + minute) * 60_000)
}

/// `YYYYMMDD` at midnight UTC.
fn parse_compact_date(text: &str) -> Option<i64> {
    let year: i64 = text.get(0..4)?.parse().ok()?;
    let month: u32 = text.get(4..6)?.parse().ok()?;
    let day: u32 = text.get(6..8)?.parse().ok()?;
    days_from_civil(year, month, day).map(|days| days * 86_400_000)
}

/// RFC 3339 (`2026-11-22T01:02:03.456Z`, `+02:00` offsets, `t`/space as
/// separator) or a bare date `2026-11-22`.
fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if bytes.len() < 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return None;
    }
    let year = number(0..4)?;
    let month = u32::try_from(number(5..7)?).ok()?;
    let day = u32::try_from(number(8..10)?).ok()?;
    let days = days_from_civil(year, month, day)?;
    if bytes.len() == 10 {
        return Some(days * 86_400_000);
    }
    if !matches!(bytes[10], b'T' | b't' | b' ') || bytes.len() < 19 {
        return None;
    }
    if bytes[13] != b':' || bytes[16] != b':' {
        return None;
    }
    let hour = number(11..13)?;
    let minute = number(14..16)?;
    let second = number(17..19)?;
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut pos = 19;
    let mut millis = 0i64;
    if bytes.get(pos) == Some(&b'.') {
        pos += 1;
        let start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            if pos - start < 3 {
                millis += i64::from(bytes[pos] - b'0') * 10i64.pow(2 - (pos - start) as u32);
            }
            pos += 1;
        }
        if pos == start {
            return None;
        }
    }
    let offset_minutes = match bytes.get(pos)? {
        b'Z' | b'z' if pos + 1 == bytes.len() => 0,
        sign @ (b'+' | b'-') if pos + 6 == bytes.len() && bytes[pos + 3] == b':' => {
            let hours = number(pos + 1..pos + 3)?;
            let minutes = number(pos + 4..pos + 6)?;
            let total = hours * 60 + minutes;
            if *sign == b'-' { -total } else { total }
        }
        _ => return None,
    };
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1000 + millis)
}

/// Days since 1970-01-01 for a proleptic Gregorian date (Howard Hinnant's
/// civil-from-days inverse), `None` for an impossible date.
fn days_from_civil(year: i64, month: u32, day: u32) -> Option<i64> {
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let m = i64::from(month);
    let month_from_march = if m > 2 { m - 3 } else { m + 9 };
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    Some(era * 146_097 + day_of_era - 719_468)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_795_310_560_000;

    #[test]
    fn unix_numbers_are_read_by_magnitude() {
        assert_eq!(parse_time_ms("1795310550", NOW), Ok(1_795_310_550_000));
        assert_eq!(parse_time_ms("1795310550123", NOW), Ok(1_795_310_550_123));
        assert_eq!(
            parse_time_ms("1795310550123456", NOW),
            Ok(1_795_310_550_123)
        );
        assert_eq!(
            parse_time_ms("1795310550123456789", NOW),
            Ok(1_795_310_550_123)
        );
        assert_eq!(parse_time_ms("1795310550.5", NOW), Ok(1_795_310_550_500));
    }

    #[test]
    fn relative_times_offset_from_now() {
        assert_eq!(parse_time_ms("now", NOW), Ok(NOW));
        assert_eq!(parse_time_ms("now-1h", NOW), Ok(NOW - 3_600_000));
        assert_eq!(parse_time_ms("now-30m", NOW), Ok(NOW - 1_800_000));
        assert_eq!(parse_time_ms("now+15s", NOW), Ok(NOW + 15_000));
        assert_eq!(parse_time_ms("-2d", NOW), Ok(NOW - 2 * 86_400_000));
        assert_eq!(parse_time_ms("now-1w", NOW), Ok(NOW - 7 * 86_400_000));
        assert_eq!(parse_time_ms("now-1h30m", NOW), Ok(NOW - 5_400_000));
        assert_eq!(parse_time_ms("now-2hours", NOW), Ok(NOW - 7_200_000));
        assert_eq!(parse_time_ms("now-1.5s", NOW), Ok(NOW - 1_500));
        // A bare number is no offset: it is more likely a mistyped timestamp.
        assert!(matches!(
            parse_time_ms("now-90", NOW),
            Err(TimeError::Unrecognized { .. })
        ));
    }

    #[test]
    fn rfc3339_with_fractions_and_offsets() {
        assert_eq!(parse_time_ms("1970-01-01T00:00:00Z", NOW), Ok(0));
        assert_eq!(
            parse_time_ms("2026-11-22T01:02:03.456Z", NOW),
            Ok(1_795_309_323_456)
        );
        assert_eq!(
            parse_time_ms("2026-11-22T03:02:03.456+02:00", NOW),
            Ok(1_795_309_323_456)
        );
        assert_eq!(parse_time_ms("2026-11-22", NOW), Ok(1_795_305_600_000));
        assert_eq!(parse_time_ms("20261122", NOW), Ok(1_795_305_600_000));
        assert_eq!(
            parse_time_ms("01:30_20261122", NOW),
            Ok(1_795_305_600_000 + 90 * 60_000)
        );
        assert_eq!(
            parse_time_ms("2024-02-29T00:00:00Z", NOW),
            Ok(1_709_164_800_000)
        );
    }

    #[test]
    fn ranges_from_extreme_integers_are_refused_not_overflowed() {
        for (start, end) in [
            (0, i64::MIN),
            (0, i64::MIN + 1),
            (0, -1),
            (0, i64::MAX),
            (0, MAX_MS + 1),
            (i64::MIN, 1_000),
            (i64::MIN, i64::MAX),
            (i64::MAX, i64::MAX),
            (-1, 1_000),
            (MAX_MS + 1, 0),
        ] {
            let err = inclusive_range_ms(start, end).unwrap_err();
            assert!(
                matches!(err, RangeError::OutOfRange { .. }),
                "{start}..{end}: {err}"
            );
        }
        let range = inclusive_range_ms(0, MAX_MS).unwrap();
        assert_eq!(range.start_ms, MAX_MS - DEFAULT_RANGE_MS);
        assert_eq!(range.end_ms, MAX_MS + 1);
        let range = inclusive_range_ms(0, 1_000).unwrap();
        assert_eq!((range.start_ms, range.end_ms), (0, 1_001));
        assert!(matches!(
            inclusive_range_ms(MAX_MS, 1),
            Err(RangeError::Empty { .. })
        ));
        let range = inclusive_range_ms(1, MAX_MS).unwrap();
        assert_eq!((range.start_ms, range.end_ms), (1, MAX_MS + 1));
    }

    #[test]
    fn extreme_offsets_from_now_are_out_of_range() {
        assert!(matches!(
            parse_time_ms("now-9223372036854775807ms", NOW),
            Err(TimeError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_time_ms("now+9223372036854775807ms", NOW),
            Err(TimeError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_time_ms("now-1h", i64::MIN),
            Err(TimeError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_time_ms("now+1h", i64::MAX),
            Err(TimeError::OutOfRange { .. })
        ));
        // i64::MAX read as nanoseconds is the last ms Kiln stores.
        assert_eq!(parse_time_ms("9223372036854775807", NOW), Ok(MAX_MS));
        assert!(matches!(
            parse_time_ms("9223372036854775807.999", NOW),
            Err(TimeError::OutOfRange { .. })
        ));
    }

    #[test]
    fn nonsense_is_refused_with_the_text() {
        let err = parse_time_ms("yesterday", NOW).unwrap_err();
        assert!(err.to_string().contains("\"yesterday\""), "{err}");
        assert!(matches!(
            parse_time_ms("now-3q", NOW),
            Err(TimeError::UnknownUnit { .. })
        ));
        assert!(parse_time_ms("2026-02-30", NOW).is_err());
        assert!(parse_time_ms("2026-11-22T25:00:00Z", NOW).is_err());
        assert!(parse_time_ms("", NOW).is_err());
        assert!(matches!(
            parse_time_ms("99999999999999999999999", NOW),
            Err(TimeError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_time_ms("now-99999999999y", NOW),
            Err(TimeError::OutOfRange { .. })
        ));
    }
}

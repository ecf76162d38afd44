//! The one duration grammar of every Kiln flag, config file, query parameter
//! and relative time (`now-1h`): the store, the agent and the CLI all read
//! durations here, so `1h30m` means the same everywhere. `docs/durations.md`
//! is the user-facing description; a test below keeps its unit table true.
//!
//! ```text
//! duration := number                   seconds (where a bare number is allowed)
//!           | term (" "* term)*        units from largest to smallest
//! term     := number " "* unit
//! number   := digits ("." digits)?
//! ```
//! Surrounding whitespace is ignored. A fraction is exact to the nanosecond
//! (`1.5h` is 90 minutes) and finer digits are cut off.

use std::time::Duration;

/// Every unit, largest first, with its spellings (the short one first) and its
/// length in nanoseconds. A year is 365 days and a week 7 days: durations are
/// spans of time, never calendar arithmetic.
pub const UNITS: &[(&[&str], u64)] = &[
    (&["y", "year", "years"], 365 * DAY_NS),
    (&["w", "week", "weeks"], 7 * DAY_NS),
    (&["d", "day", "days"], DAY_NS),
    (&["h", "hour", "hours"], 3_600 * SECOND_NS),
    (&["m", "min", "mins", "minute", "minutes"], 60 * SECOND_NS),
    (&["s", "sec", "secs", "second", "seconds"], SECOND_NS),
    (&["ms"], 1_000_000),
    (&["us", "µs", "μs"], 1_000),
    (&["ns"], 1),
];

const SECOND_NS: u64 = 1_000_000_000;
const DAY_NS: u64 = 86_400 * SECOND_NS;

/// How much of the text an error repeats, so a huge value cannot fill a log.
const ERROR_TEXT_CHARS: usize = 64;

/// A duration that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing but whitespace.
    #[error("empty duration: write one like 30s, 5m, 1h30m or 14d")]
    Empty,
    /// The text does not have the shape of a duration.
    #[error("{text:?} is not a duration like 30s, 5m, 1h30m or 14d")]
    Malformed {
        /// The text given (its first 64 characters).
        text: String,
    },
    /// A number is followed by a unit that is not known.
    #[error("{text:?}: unit {unit:?} is not one of ns, us, ms, s, m, h, d, w, y")]
    UnknownUnit {
        /// The text given (its first 64 characters).
        text: String,
        /// The unit found (its first 16 characters).
        unit: String,
    },
    /// A number has no unit where one is required: in a sum of terms
    /// (`1h30`), or where a bare number is not taken as seconds.
    #[error("{text:?}: every number needs a unit (ns, us, ms, s, m, h, d, w, y)")]
    MissingUnit {
        /// The text given (its first 64 characters).
        text: String,
    },
    /// The terms of a sum are not from the largest unit to the smallest
    /// (`30m1h`, `1m1m`), which is most likely a typo.
    #[error("{text:?}: write units from the largest to the smallest, each once (like 1h30m)")]
    UnitOrder {
        /// The text given (its first 64 characters).
        text: String,
    },
    /// The duration does not fit in `std::time::Duration` (about 585 billion years).
    #[error("{text:?} is too long a duration")]
    TooLong {
        /// The text given (its first 64 characters).
        text: String,
    },
}

impl DurationError {
    /// A short, fixed name for metrics and logs, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Empty => "duration_empty",
            Self::Malformed { .. } => "duration_malformed",
            Self::UnknownUnit { .. } => "duration_unknown_unit",
            Self::MissingUnit { .. } => "duration_missing_unit",
            Self::UnitOrder { .. } => "duration_unit_order",
            Self::TooLong { .. } => "duration_too_long",
        }
    }
}

/// Reads a duration; a bare number (`90`, `0.5`) is seconds. For flags and
/// config files.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    parse(text, BareNumber::Seconds)
}

/// Reads a duration whose numbers all carry a unit (`90` is refused). For
/// relative times such as `now-1h`, where a bare number would more likely be a
/// mistyped timestamp than a count of seconds.
pub fn parse_duration_with_unit(text: &str) -> Result<Duration, DurationError> {
    parse(text, BareNumber::Refused)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BareNumber {
    Seconds,
    Refused,
}

fn parse(text: &str, bare_number: BareNumber) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(DurationError::Empty);
    }
    let clipped = || trimmed.chars().take(ERROR_TEXT_CHARS).collect::<String>();
    let mut rest = trimmed;
    let mut total_ns: u128 = 0;
    // Index into UNITS of the previous term's unit: each next one must be smaller.
    let mut previous_unit: Option<usize> = None;
    while !rest.is_empty() {
        let (number, after_number) =
            split_number(rest).ok_or_else(|| DurationError::Malformed { text: clipped() })?;
        let after_space = after_number.trim_start();
        let unit_len = after_space
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(after_space.len());
        let (unit, after_unit) = after_space.split_at(unit_len);
        if unit.is_empty() {
            let is_whole_text = previous_unit.is_none() && after_space.is_empty();
            if is_whole_text && bare_number == BareNumber::Seconds {
                return number
                    .nanos(u128::from(SECOND_NS))
                    .and_then(duration_from_nanos)
                    .ok_or_else(|| DurationError::TooLong { text: clipped() });
            }
            return Err(if after_space.is_empty() {
                DurationError::MissingUnit { text: clipped() }
            } else {
                DurationError::Malformed { text: clipped() }
            });
        }
        let unit_index = UNITS
            .iter()
            .position(|(spellings, _)| spellings.contains(&unit))
            .ok_or_else(|| DurationError::UnknownUnit {
                text: clipped(),
                unit: unit.chars().take(16).collect(),
            })?;
        if previous_unit.is_some_and(|previous| previous >= unit_index) {
            return Err(DurationError::UnitOrder { text: clipped() });
        }
        previous_unit = Some(unit_index);
        total_ns = number
            .nanos(u128::from(UNITS[unit_index].1))
            .and_then(|term_ns| total_ns.checked_add(term_ns))
            .ok_or_else(|| DurationError::TooLong { text: clipped() })?;
        rest = after_unit.trim_start();
    }
    duration_from_nanos(total_ns).ok_or_else(|| DurationError::TooLong { text: clipped() })
}

/// A number as written: its whole part and its fraction's digits.
#[derive(Debug, Clone, Copy)]
struct Number<'a> {
    whole: &'a str,
    fraction: &'a str,
}

impl Number<'_> {
    /// The number times `unit_ns`, cut to whole nanoseconds; `None` on overflow.
    fn nanos(self, unit_ns: u128) -> Option<u128> {
        // Digits past the 18th of a fraction are below a nanosecond for every
        // unit up to a year (3.2e16 ns), and 18 digits keep the product in u128.
        let fraction = &self.fraction[..self.fraction.len().min(18)];
        let whole: u128 = self.whole.parse().ok()?;
        let mut total = whole.checked_mul(unit_ns)?;
        if !fraction.is_empty() {
            let numerator: u128 = fraction.parse().ok()?;
            let denominator = 10u128.pow(u32::try_from(fraction.len()).ok()?);
            total = total.checked_add(numerator * unit_ns / denominator)?;
        }
        Some(total)
    }
}

/// Splits a leading `digits ("." digits)?` off `text`.
fn split_number(text: &str) -> Option<(Number<'_>, &str)> {
    let whole_len = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if whole_len == 0 {
        return None;
    }
    let (whole, after_whole) = text.split_at(whole_len);
    let Some(after_point) = after_whole.strip_prefix('.') else {
        return Some((
            Number {
                whole,
                fraction: "",
            },
            after_whole,
        ));
    };
    let fraction_len = after_point
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(after_point.len());
    if fraction_len == 0 {
        return None;
    }
    let (fraction, rest) = after_point.split_at(fraction_len);
    Some((Number { whole, fraction }, rest))
}

fn duration_from_nanos(nanos: u128) -> Option<Duration> {
    let seconds = u64::try_from(nanos / u128::from(SECOND_NS)).ok()?;
    let subsecond = u32::try_from(nanos % u128::from(SECOND_NS)).ok()?;
    Some(Duration::new(seconds, subsecond))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(text: &str) -> Duration {
        match parse_duration(text) {
            Ok(duration) => duration,
            Err(err) => panic!("{text:?} should parse: {err}"),
        }
    }

    #[test]
    fn every_unit_and_spelling_has_its_length() {
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok("7us"), Duration::from_micros(7));
        assert_eq!(ok("7µs"), Duration::from_micros(7));
        assert_eq!(ok("7μs"), Duration::from_micros(7));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("30 seconds"), Duration::from_secs(30));
        assert_eq!(ok("5m"), Duration::from_secs(300));
        assert_eq!(ok("5min"), Duration::from_secs(300));
        assert_eq!(ok("1h"), Duration::from_secs(3_600));
        assert_eq!(ok("2hours"), Duration::from_secs(7_200));
        assert_eq!(ok("14d"), Duration::from_secs(14 * 86_400));
        assert_eq!(ok("2w"), Duration::from_secs(14 * 86_400));
        assert_eq!(ok("1y"), Duration::from_secs(365 * 86_400));
        for (spellings, unit_ns) in UNITS {
            for spelling in *spellings {
                assert_eq!(ok(&format!("1{spelling}")), Duration::from_nanos(*unit_ns));
            }
        }
    }

    #[test]
    fn a_bare_number_is_seconds_unless_a_unit_is_required() {
        assert_eq!(ok("90"), Duration::from_secs(90));
        assert_eq!(ok("0.5"), Duration::from_millis(500));
        assert_eq!(ok(" 90 "), Duration::from_secs(90));
        assert_eq!(
            parse_duration_with_unit("90"),
            Err(DurationError::MissingUnit {
                text: "90".to_owned()
            })
        );
        assert_eq!(parse_duration_with_unit("90s"), Ok(Duration::from_secs(90)));
    }

    #[test]
    fn sums_and_fractions_are_exact() {
        assert_eq!(ok("1h30m"), Duration::from_secs(5_400));
        assert_eq!(ok("1h 30m"), Duration::from_secs(5_400));
        assert_eq!(ok("1.5h"), Duration::from_secs(5_400));
        assert_eq!(ok("2d3h4m5s6ms"), Duration::from_millis(183_845_006));
        assert_eq!(ok("0.1s"), Duration::from_millis(100));
        assert_eq!(ok("1.000000001s"), Duration::new(1, 1));
        // Finer than a nanosecond is cut off, not rounded.
        assert_eq!(ok("1.9ns"), Duration::from_nanos(1));
        assert_eq!(ok("0s"), Duration::ZERO);
    }

    #[test]
    fn what_is_not_a_duration_is_refused_with_the_text() {
        assert_eq!(parse_duration("  "), Err(DurationError::Empty));
        for text in [
            "ten", "s", "-1s", "1.s", ".5s", "1..5s", "1h-30m", "1s!", "1 2s",
        ] {
            let err = parse_duration(text).expect_err(text);
            assert!(err.to_string().contains(&format!("{text:?}")), "{err}");
        }
        assert!(matches!(
            parse_duration("5 parsecs"),
            Err(DurationError::UnknownUnit { unit, .. }) if unit == "parsecs"
        ));
        assert!(matches!(
            parse_duration("1h30"),
            Err(DurationError::MissingUnit { .. })
        ));
        assert!(matches!(
            parse_duration("30m1h"),
            Err(DurationError::UnitOrder { .. })
        ));
        assert!(matches!(
            parse_duration("1m2min"),
            Err(DurationError::UnitOrder { .. })
        ));
        assert!(matches!(
            parse_duration("99999999999999999999999999999999999999999y"),
            Err(DurationError::TooLong { .. })
        ));
        assert!(matches!(
            parse_duration("600000000000y"),
            Err(DurationError::TooLong { .. })
        ));
    }

    #[test]
    fn errors_repeat_at_most_64_characters() {
        let long = format!("{}x", "1".repeat(1_000));
        let err = parse_duration(&long).expect_err("not a duration");
        assert!(err.to_string().len() < 200, "{err}");
        assert_eq!(err.reason(), "duration_unknown_unit");
    }

    /// docs/durations.md is the user's copy of `UNITS`; this keeps it true.
    #[test]
    fn the_documented_unit_table_matches_the_grammar() {
        let docs = include_str!("../../../docs/durations.md");
        for (spellings, _) in UNITS {
            let row = format!(
                "| {} |",
                spellings
                    .iter()
                    .map(|spelling| format!("`{spelling}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            assert!(
                docs.contains(&row),
                "docs/durations.md has no unit row starting {row}"
            );
        }
    }

    /// The cases the UI's copy of this grammar (`parseDurationMs` in
    /// store/ui/assets/js/query_state.js) is tested against as well.
    #[test]
    fn the_cases_shared_with_the_ui_parse_as_listed() {
        #[derive(serde::Deserialize)]
        struct Case {
            text: String,
            ms: Option<u64>,
            #[serde(default)]
            bare: bool,
        }
        let cases: Vec<Case> =
            serde_json::from_str(include_str!("../testdata/duration_cases.json"))
                .expect("valid cases");
        assert!(cases.len() > 40);
        let millis = |parsed: Result<Duration, DurationError>| parsed.ok().map(|d| d.as_millis());
        for case in cases {
            let expected = case.ms.map(u128::from);
            assert_eq!(
                millis(parse_duration(&case.text)),
                expected,
                "{:?}",
                case.text
            );
            let with_unit = if case.bare { None } else { expected };
            assert_eq!(
                millis(parse_duration_with_unit(&case.text)),
                with_unit,
                "{:?}",
                case.text
            );
        }
    }

    proptest! {
        #[test]
        fn any_text_parses_or_is_refused_without_panicking(text in "\\PC{0,40}") {
            let _ = parse_duration(&text);
            let _ = parse_duration_with_unit(&text);
        }

        /// A sum of terms written from the largest unit to the smallest is the
        /// sum of its terms, with or without spaces.
        #[test]
        fn sums_of_terms_add_up(
            terms in proptest::collection::btree_map(0usize..UNITS.len(), 0u64..100_000, 1..5),
            spelled_long in any::<bool>(),
            spaced in any::<bool>(),
        ) {
            let mut text = String::new();
            let mut expected_ns: u128 = 0;
            for (&unit_index, &amount) in &terms {
                let (spellings, unit_ns) = UNITS[unit_index];
                let spelling = if spelled_long { spellings[spellings.len() - 1] } else { spellings[0] };
                if spaced && !text.is_empty() {
                    text.push(' ');
                }
                text.push_str(&format!("{amount}{spelling}"));
                expected_ns += u128::from(amount) * u128::from(unit_ns);
            }
            let parsed = parse_duration(&text).map(|duration| duration.as_nanos());
            prop_assert_eq!(parsed, Ok(expected_ns), "{}", text);
        }

        /// `<n>.<f><unit>` is `n` units plus the fraction, cut to nanoseconds.
        #[test]
        fn fractions_match_integer_arithmetic(
            whole in 0u64..1_000_000,
            fraction in 0u32..1_000,
            unit_index in 0usize..UNITS.len(),
        ) {
            let (spellings, unit_ns) = UNITS[unit_index];
            let text = format!("{whole}.{fraction:03}{}", spellings[0]);
            let expected = u128::from(whole) * u128::from(unit_ns)
                + u128::from(fraction) * u128::from(unit_ns) / 1_000;
            prop_assert_eq!(parse_duration(&text).map(|d| d.as_nanos()), Ok(expected));
        }
    }
}

//! The query string of every HTTP query endpoint (`/api/v1/` and
//! Pyroscope's `/pyroscope/render` and `/pyroscope/label-values`), read
//! one way: the last occurrence of a name wins, and an empty value counts
//! as unset.

use std::collections::HashMap;

use kiln_engine::model::TimeRange;

use crate::error::ApiError;
use crate::wire::time::{DEFAULT_RANGE_MS, now_ms, parse_time_ms};

/// A request's query-string parameters.
#[derive(Debug, Default)]
pub struct Params(HashMap<String, String>);

impl Params {
    /// Reads a raw query string (`None`: no `?` in the URI).
    pub fn parse(query: Option<&str>) -> Self {
        Self(
            form_urlencoded::parse(query.unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The value of `name`, unless absent or empty.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// The first of `names` that is set, as unix ms in any Kiln time form
    /// (Pyroscope's `now-1h` and unix seconds included).
    pub fn time(&self, names: &[&'static str], now_ms: i64) -> Result<Option<i64>, ApiError> {
        for &name in names {
            if let Some(text) = self.get(name) {
                return parse_time_ms(text, now_ms)
                    .map(Some)
                    .map_err(|source| ApiError::Time {
                        parameter: name,
                        source,
                    });
            }
        }
        Ok(None)
    }

    /// The range from `from` (default: an hour before the end) to the
    /// first of `to` that is set (default: now). The end is inclusive for
    /// users (`to=now` must include now); diffs pass their
    /// `left_`/`right_` names.
    pub fn range(&self, from: &'static str, to: [&'static str; 2]) -> Result<TimeRange, ApiError> {
        let now = now_ms();
        let end_ms = self.time(&to, now)?.unwrap_or(now);
        // `time` keeps both within 1970 to 2262, so neither this nor the
        // inclusive end below can overflow; saturating all the same.
        let start_ms = self
            .time(&[from], now)?
            .unwrap_or(end_ms.saturating_sub(DEFAULT_RANGE_MS));
        if end_ms <= start_ms {
            return Err(ApiError::BadParameter {
                parameter: to[0],
                message: format!("the end ({end_ms} ms) must be after `{from}` ({start_ms} ms)"),
            });
        }
        Ok(TimeRange {
            start_ms,
            end_ms: end_ms.saturating_add(1),
        })
    }

    /// A whole number from 1 to `max`, `default` when unset.
    pub fn number(
        &self,
        name: &'static str,
        default: usize,
        max: usize,
    ) -> Result<usize, ApiError> {
        match self.get(name) {
            None => Ok(default),
            Some(text) => match text.parse::<usize>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(ApiError::BadParameter {
                    parameter: name,
                    message: format!("{text:?} is not a whole number from 1 to {max}"),
                }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_occurrence_wins_and_empty_means_unset() {
        let params = Params::parse(Some("query=a&query=b&from=&limit=7"));
        assert_eq!(params.get("query"), Some("b"));
        assert_eq!(params.get("from"), None);
        assert_eq!(params.number("limit", 1, 10).unwrap(), 7);
        assert_eq!(params.number("absent", 3, 10).unwrap(), 3);
        assert!(params.number("limit", 1, 5).is_err());
        assert_eq!(Params::parse(None).get("query"), None);
    }

    #[test]
    fn extreme_times_are_refused_as_parameters() {
        for query in [
            "to=9223372036854775807999",
            "to=now%2B9223372036854775807ms",
            "from=now-9223372036854775807ms",
            "from=-9223372036854775808",
            "to=-9223372036854775808ms",
        ] {
            let err = Params::parse(Some(query))
                .range("from", ["to", "until"])
                .unwrap_err();
            assert!(matches!(err, ApiError::Time { .. }), "{query}: {err}");
        }
        // The last ms Kiln stores is a usable end.
        let range = Params::parse(Some("to=9223372036854775807"))
            .range("from", ["to", "until"])
            .unwrap();
        assert_eq!(range.end_ms, crate::wire::time::MAX_MS + 1);
    }

    #[test]
    fn a_range_includes_its_end_and_must_not_be_empty() {
        let params = Params::parse(Some("from=1700000000&until=1700000060"));
        let range = params.range("from", ["to", "until"]).unwrap();
        assert_eq!(range.start_ms, 1_700_000_000_000);
        assert_eq!(range.end_ms, 1_700_000_060_001);
        let backwards = Params::parse(Some("from=1700000060&to=1700000000"));
        let err = backwards.range("from", ["to", "until"]).unwrap_err();
        assert!(matches!(
            err,
            ApiError::BadParameter {
                parameter: "to",
                ..
            }
        ));
    }
}

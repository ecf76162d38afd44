//! Push over Connect with JSON bodies (`application/json`), as in
//! Pyroscope's curl examples: protobuf JSON mapping, `rawProfile` in base64.
//!
//! The lists are capped while they are parsed: `{"series":[{},{},…]}`
//! costs three bytes a series on the wire and about fifty parsed, so a
//! body of empty entries parsed whole before any count could take many
//! times its size. Series and samples may number no more than the profiles
//! one request may hold, and labels no more than one series may have.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::mem::size_of;

use kiln_api::push::v1::{PushRequest, RawProfileSeries, RawSample};
use kiln_api::types::v1::LabelPair;
use serde::de::{
    DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor,
};

use crate::config::Limits;
use crate::error::ApiError;
use crate::wire::base64;

#[derive(Debug, Default)]
struct JsonSeries {
    labels: Vec<JsonLabel>,
    samples: Vec<JsonSample>,
}

#[derive(Debug, serde::Deserialize)]
struct JsonLabel {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, serde::Deserialize)]
struct JsonSample {
    #[serde(default, alias = "raw_profile")]
    #[serde(rename = "rawProfile")]
    raw_profile: String,
    #[serde(default, rename = "ID", alias = "id")]
    id: String,
}

/// How many entries the lists may still hold.
struct Caps {
    /// Series left in the request.
    series: Cell<usize>,
    /// Samples left in the request.
    samples: Cell<usize>,
    /// Labels one series may have.
    labels_per_series: usize,
}

/// A list of `T`, each entry taken from `left` (the list refused when it
/// runs out).
struct Capped<'c, T> {
    left: &'c Cell<usize>,
    what: &'static str,
    entries: PhantomData<T>,
}

impl<'de, T: serde::Deserialize<'de>> DeserializeSeed<'de> for Capped<'_, T> {
    type Value = Vec<T>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<T>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, T: serde::Deserialize<'de>> Visitor<'de> for Capped<'_, T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a list of {}", self.what)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::new();
        loop {
            let left = self.left.get();
            if left == 0 {
                // One more entry would be over the limit; none more is
                // parsed.
                return match seq.next_element::<IgnoredAny>()? {
                    Some(_) => Err(A::Error::custom(format!("too many {}", self.what))),
                    None => Ok(out),
                };
            }
            match seq.next_element::<T>()? {
                Some(entry) => {
                    self.left.set(left - 1);
                    out.push(entry);
                }
                None => return Ok(out),
            }
        }
    }
}

/// One series, its lists capped.
struct SeriesSeed<'c>(&'c Caps);

impl<'de> DeserializeSeed<'de> for SeriesSeed<'_> {
    type Value = JsonSeries;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<JsonSeries, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for SeriesSeed<'_> {
    type Value = JsonSeries;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a series object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonSeries, A::Error> {
        let mut series = JsonSeries::default();
        let labels_left = Cell::new(self.0.labels_per_series);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "labels" => {
                    series.labels = map.next_value_seed(Capped {
                        left: &labels_left,
                        what: "labels in one series",
                        entries: PhantomData,
                    })?;
                }
                "samples" => {
                    series.samples = map.next_value_seed(Capped {
                        left: &self.0.samples,
                        what: "samples",
                        entries: PhantomData,
                    })?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(series)
    }
}

/// The series list.
struct SeriesList<'c>(&'c Caps);

impl<'de> DeserializeSeed<'de> for SeriesList<'_> {
    type Value = Vec<JsonSeries>;

    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Vec<JsonSeries>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for SeriesList<'_> {
    type Value = Vec<JsonSeries>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of series")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<JsonSeries>, A::Error> {
        let mut out = Vec::new();
        loop {
            let left = self.0.series.get();
            if left == 0 {
                return match seq.next_element::<IgnoredAny>()? {
                    Some(_) => Err(A::Error::custom("too many series")),
                    None => Ok(out),
                };
            }
            match seq.next_element_seed(SeriesSeed(self.0))? {
                Some(series) => {
                    self.0.series.set(left - 1);
                    out.push(series);
                }
                None => return Ok(out),
            }
        }
    }
}

/// The request object.
struct RequestSeed<'c>(&'c Caps);

impl<'de> DeserializeSeed<'de> for RequestSeed<'_> {
    type Value = Vec<JsonSeries>;

    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Vec<JsonSeries>, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RequestSeed<'_> {
    type Value = Vec<JsonSeries>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a PushRequest object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<JsonSeries>, A::Error> {
        let mut series = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "series" {
                series = map.next_value_seed(SeriesList(self.0))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(series)
    }
}

/// What parsing a JSON body of `body_bytes` under `limits` may take at
/// most: its strings and the profiles they decode to (each no longer than
/// the body), and the capped lists' entries.
pub fn push_json_bytes(body_bytes: usize, limits: &Limits) -> usize {
    let profiles = limits.max_profiles_per_request;
    let labels = profiles.saturating_mul(limits.max_labels_per_series);
    let entries = profiles
        .saturating_mul(size_of::<JsonSeries>() + size_of::<RawProfileSeries>())
        .saturating_add(profiles.saturating_mul(size_of::<JsonSample>() + size_of::<RawSample>()))
        .saturating_add(labels.saturating_mul(size_of::<JsonLabel>() + size_of::<LabelPair>()));
    body_bytes.saturating_mul(2).saturating_add(entries)
}

/// Parses a JSON `PushRequest`, its lists capped by `limits`.
pub fn push_request_from_json(body: &[u8], limits: &Limits) -> Result<PushRequest, ApiError> {
    let bad = |message: String| ApiError::BadMessage {
        message_type: "push.v1.PushRequest JSON",
        message,
    };
    let caps = Caps {
        series: Cell::new(limits.max_profiles_per_request),
        samples: Cell::new(limits.max_profiles_per_request),
        labels_per_series: limits.max_labels_per_series,
    };
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let parsed = RequestSeed(&caps)
        .deserialize(&mut deserializer)
        .and_then(|series| deserializer.end().map(|()| series))
        .map_err(|e| bad(e.to_string()))?;
    let mut series = Vec::with_capacity(parsed.len());
    for (series_index, s) in parsed.into_iter().enumerate() {
        let mut samples = Vec::with_capacity(s.samples.len());
        for (sample_index, sample) in s.samples.into_iter().enumerate() {
            let raw_profile = base64::decode(&sample.raw_profile).ok_or_else(|| {
                bad(format!(
                    "series {series_index}, sample {sample_index}: rawProfile is not base64"
                ))
            })?;
            samples.push(RawSample {
                raw_profile,
                id: sample.id,
            });
        }
        series.push(RawProfileSeries {
            labels: s
                .labels
                .into_iter()
                .map(|l| LabelPair {
                    name: l.name,
                    value: l.value,
                })
                .collect(),
            samples,
        });
    }
    Ok(PushRequest { series })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_push_request_maps_fields() {
        let request = push_request_from_json(
            br#"{"series":[{"labels":[{"name":"__name__","value":"process_cpu"}],"samples":[{"rawProfile":"CgA=","ID":"x"}]}],"other":1}"#,
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(request.series[0].labels[0].value, "process_cpu");
        assert_eq!(request.series[0].samples[0].raw_profile, [0x0a, 0x00]);
        assert_eq!(request.series[0].samples[0].id, "x");
        let err = push_request_from_json(b"{\"series\": 3}", &Limits::default()).unwrap_err();
        assert!(
            err.to_string().contains("push.v1.PushRequest JSON"),
            "{err}"
        );
    }

    #[test]
    fn lists_are_refused_as_they_pass_their_caps() {
        let limits = Limits {
            max_profiles_per_request: 2,
            max_labels_per_series: 1,
            ..Limits::default()
        };
        let empties = format!("{{\"series\":[{}{{}}]}}", "{},".repeat(100_000));
        let err = push_request_from_json(empties.as_bytes(), &limits).unwrap_err();
        assert!(err.to_string().contains("too many series"), "{err}");
        let samples = br#"{"series":[{"samples":[{},{}]},{"samples":[{}]}]}"#;
        let err = push_request_from_json(samples, &limits).unwrap_err();
        assert!(err.to_string().contains("too many samples"), "{err}");
        let labels = br#"{"series":[{"labels":[{},{}]}]}"#;
        let err = push_request_from_json(labels, &limits).unwrap_err();
        assert!(err.to_string().contains("too many labels"), "{err}");
        let fits = br#"{"series":[{"labels":[{}],"samples":[{},{}]},{}]}"#;
        assert_eq!(
            push_request_from_json(fits, &limits).unwrap().series.len(),
            2
        );
    }
}

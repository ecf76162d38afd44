//! What every ingest path (WriteRaw, Push, `/ingest`, OTLP) produces:
//! profiles with series labels. This is the one place client-sent series
//! labels are checked (names, duplicates, counts, lengths, `__name__`),
//! once, where each protocol builds its uploads. The store has no label
//! checks of its own; the engine's `check_ingest`, run before logging,
//! applies its limits to the final series label sets (with the labels a
//! profile promotes) and counts series.

use std::collections::HashSet;
use std::sync::Arc;

use kiln_api::parca::profilestore::v1alpha1::WriteRawRequest;
use kiln_api::push::v1::PushRequest;
use kiln_engine::model::{Label, LabelSet, NAME_LABEL};

use crate::config::Limits;
use crate::ingest::pyroscope::app_name::is_label_name;

/// The label naming the service, as Pyroscope clients set it.
pub const SERVICE_NAME_LABEL: &str = kiln_contract::labels::SERVICE_NAME;

/// One profile to store.
#[derive(Debug, Clone)]
pub struct ProfileUpload {
    /// Series labels, including `__name__`; shared by every profile of one
    /// series (a deep copy per profile let 700 KB of one-byte samples
    /// allocate 19 GiB).
    pub labels: Arc<LabelSet>,
    /// Profile time, unix ms (`None`: the pprof's own, else now).
    pub time_ms: Option<i64>,
    /// Covered duration in ns (`None`: the pprof's own).
    pub duration_nanos: Option<i64>,
    /// pprof bytes, gzipped or not: what the store logs.
    pub pprof: bytes::Bytes,
    /// What `pprof` decodes to, when the server has decoded or built the
    /// profile itself (`/ingest`), so the store does not decode it again.
    pub decoded: Option<kiln_pprof::DecodedProfile>,
}

/// Series labels or batch shape that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UploadError {
    /// The request holds no profiles at all.
    #[error("the request contains no profiles")]
    Empty,
    /// A series has no `__name__` label.
    #[error("series {series}: the `__name__` label (profile name, e.g. process_cpu) is required")]
    MissingName {
        /// Index of the series in the request.
        series: usize,
    },
    /// A label name is not `[A-Za-z_][A-Za-z0-9_.]*`.
    #[error(
        "series {series}: label name {name:?} must start with a letter or `_` and contain only letters, digits, `_` and `.`"
    )]
    BadLabelName {
        /// Index of the series in the request.
        series: usize,
        /// The name (truncated).
        name: String,
    },
    /// A label name appears twice in one series.
    #[error("series {series}: label {name:?} appears more than once")]
    DuplicateLabel {
        /// Index of the series in the request.
        series: usize,
        /// The name.
        name: String,
    },
    /// A series has more labels than allowed.
    #[error("series {series}: {count} labels, over the limit of {limit}")]
    TooManyLabels {
        /// Index of the series in the request.
        series: usize,
        /// Labels given.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// A label name or value is longer than allowed.
    #[error("series {series}: label {name:?} is {bytes} bytes long, over the limit of {limit}")]
    LabelTooLong {
        /// Index of the series in the request.
        series: usize,
        /// The label name (truncated).
        name: String,
        /// Its name or value length.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The request carries more profiles than allowed.
    #[error("the request contains more than {limit} profiles")]
    TooManyProfiles {
        /// The limit.
        limit: usize,
    },
    /// The request carries more series (or idempotency keys) than the
    /// store takes at once: every series must hold a profile, so no more
    /// than the profiles allowed.
    #[error("the request contains more than {limit} {what}")]
    TooManySeries {
        /// What was counted: `series` or `idempotency keys`.
        what: &'static str,
        /// The limit.
        limit: usize,
    },
    /// A series holds no profile.
    #[error("series {series} contains no profiles")]
    EmptySeries {
        /// Index of the series in the request.
        series: usize,
    },
    /// A series' idempotency key is empty, too long or not printable.
    #[error("series {series}: bad idempotency key: {message}")]
    BadIdempotencyKey {
        /// Index of the series in the request.
        series: usize,
        /// What is wrong with it.
        message: String,
    },
    /// A sample carries no profile bytes.
    #[error("series {series}, sample {sample}: raw_profile is empty")]
    EmptyProfile {
        /// Index of the series in the request.
        series: usize,
        /// Index of the sample in the series.
        sample: usize,
    },
}

impl UploadError {
    /// A short, fixed name for metrics and logs, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Empty => "empty_request",
            Self::MissingName { .. } => "missing_name",
            Self::BadLabelName { .. } => "bad_label_name",
            Self::DuplicateLabel { .. } => "duplicate_label",
            Self::TooManyLabels { .. } => "too_many_labels",
            Self::LabelTooLong { .. } => "label_too_long",
            Self::EmptyProfile { .. } => "empty_profile",
            Self::TooManyProfiles { .. } => "too_many_profiles",
            Self::TooManySeries { .. } => "too_many_series",
            Self::EmptySeries { .. } => "empty_series",
            Self::BadIdempotencyKey { .. } => "invalid_idempotency_key",
        }
    }
}

/// Checks one series' labels and builds the set.
pub fn checked_labels(
    series: usize,
    pairs: impl IntoIterator<Item = (String, String)>,
    limits: &Limits,
) -> Result<LabelSet, UploadError> {
    let mut labels: Vec<Label> = Vec::new();
    let mut names: HashSet<String> = HashSet::new();
    for (name, value) in pairs {
        // Counted first, so a million labels cost one pass up to the limit,
        // not a million checks that would freeze an async worker.
        if labels.len() == limits.max_labels_per_series {
            return Err(UploadError::TooManyLabels {
                series,
                count: labels.len() + 1,
                limit: limits.max_labels_per_series,
            });
        }
        if !is_label_name(&name) {
            return Err(UploadError::BadLabelName {
                series,
                name: name.chars().take(64).collect(),
            });
        }
        for len in [name.len(), value.len()] {
            if len > limits.max_label_bytes {
                return Err(UploadError::LabelTooLong {
                    series,
                    name: name.chars().take(64).collect(),
                    bytes: len,
                    limit: limits.max_label_bytes,
                });
            }
        }
        if !names.insert(name.clone()) {
            return Err(UploadError::DuplicateLabel { series, name });
        }
        labels.push(Label::new(name, value));
    }
    let set = LabelSet::new(labels);
    if set.get(NAME_LABEL).is_none_or(str::is_empty) {
        return Err(UploadError::MissingName { series });
    }
    Ok(set)
}

/// Checks an uploaded label set that came from `/ingest` (built by Kiln from
/// the `name` parameter, so only limits can fail).
pub fn check_label_limits(labels: &LabelSet, limits: &Limits) -> Result<(), UploadError> {
    checked_labels(
        0,
        labels.iter().map(|l| (l.name.clone(), l.value.clone())),
        limits,
    )
    .map(|_| ())
}

/// Pyroscope's Push: one upload per raw sample.
pub fn uploads_from_push(
    request: PushRequest,
    limits: &Limits,
) -> Result<Vec<ProfileUpload>, UploadError> {
    let series = request.series.into_iter().map(|series| {
        let labels = series.labels.into_iter().map(|l| (l.name, l.value));
        let profiles = series.samples.into_iter().map(|s| s.raw_profile);
        (labels, profiles)
    });
    uploads_from_series(series, limits)
}

/// Parca's WriteRaw: one upload per raw sample.
pub fn uploads_from_write_raw(
    request: WriteRawRequest,
    limits: &Limits,
) -> Result<Vec<ProfileUpload>, UploadError> {
    let series = request.series.into_iter().map(|series| {
        let labels = series
            .labels
            .unwrap_or_default()
            .labels
            .into_iter()
            .map(|l| (l.name, l.value));
        let profiles = series.samples.into_iter().map(|s| s.raw_profile);
        (labels, profiles)
    });
    uploads_from_series(series, limits)
}

/// The shape Push and WriteRaw share: series of labels, each with raw
/// profiles. Every series' labels are checked; an empty profile is refused.
fn uploads_from_series<Labels, Profiles>(
    series: impl Iterator<Item = (Labels, Profiles)>,
    limits: &Limits,
) -> Result<Vec<ProfileUpload>, UploadError>
where
    Labels: Iterator<Item = (String, String)>,
    Profiles: Iterator<Item = Vec<u8>>,
{
    let mut uploads = Vec::new();
    for (series_index, (labels, profiles)) in series.enumerate() {
        let labels = Arc::new(checked_labels(series_index, labels, limits)?);
        for (sample_index, raw_profile) in profiles.enumerate() {
            if uploads.len() == limits.max_profiles_per_request {
                return Err(UploadError::TooManyProfiles {
                    limit: limits.max_profiles_per_request,
                });
            }
            if raw_profile.is_empty() {
                return Err(UploadError::EmptyProfile {
                    series: series_index,
                    sample: sample_index,
                });
            }
            uploads.push(ProfileUpload {
                labels: Arc::clone(&labels),
                time_ms: None,
                duration_nanos: None,
                pprof: raw_profile.into(),
                decoded: None,
            });
        }
    }
    if uploads.is_empty() {
        return Err(UploadError::Empty);
    }
    Ok(uploads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_api::parca::profilestore::v1alpha1 as parca;
    use kiln_api::push::v1 as push;
    use kiln_api::types::v1::LabelPair;

    fn pair(name: &str, value: &str) -> LabelPair {
        LabelPair {
            name: name.into(),
            value: value.into(),
        }
    }

    fn push_request(labels: Vec<LabelPair>, profile: &[u8]) -> PushRequest {
        PushRequest {
            series: vec![push::RawProfileSeries {
                labels,
                samples: vec![push::RawSample {
                    raw_profile: profile.to_vec(),
                    id: String::new(),
                }],
            }],
        }
    }

    #[test]
    fn push_series_become_uploads_with_dotted_labels() {
        let uploads = uploads_from_push(
            push_request(
                vec![
                    pair("__name__", "process_cpu"),
                    pair("service_name", "app"),
                    pair("otel.scope.name", "com.grafana.pyroscope/python"),
                ],
                b"\x0a\x00",
            ),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(uploads.len(), 1);
        assert_eq!(
            uploads[0].labels.get("otel.scope.name"),
            Some("com.grafana.pyroscope/python")
        );
    }

    #[test]
    fn bad_series_are_refused_with_what_is_wrong() {
        let limits = Limits {
            max_labels_per_series: 2,
            max_label_bytes: 8,
            ..Limits::default()
        };
        let cases = [
            (
                vec![pair("svc", "a")],
                UploadError::MissingName { series: 0 }.reason(),
            ),
            (
                vec![pair("__name__", "x"), pair("1bad", "v")],
                "bad_label_name",
            ),
            (
                vec![pair("__name__", "x"), pair("__name__", "y")],
                "duplicate_label",
            ),
            (
                vec![pair("__name__", "x"), pair("a", "1"), pair("b", "2")],
                "too_many_labels",
            ),
            (
                vec![pair("__name__", "much_too_long_value")],
                "label_too_long",
            ),
        ];
        for (labels, reason) in cases {
            let err = uploads_from_push(push_request(labels, b"x"), &limits).unwrap_err();
            assert_eq!(err.reason(), reason, "{err}");
        }
        let err = uploads_from_push(
            push_request(vec![pair("__name__", "x")], b""),
            &Limits::default(),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "series 0, sample 0: raw_profile is empty");
        let err = uploads_from_push(PushRequest::default(), &Limits::default()).unwrap_err();
        assert_eq!(err, UploadError::Empty);
    }

    /// A million distinct label names (about 8 MB) used to cost
    /// 5e11 comparisons on an async worker; the count is now checked first.
    #[test]
    fn a_million_labels_are_refused_at_the_limit_without_a_quadratic_check() {
        let labels: Vec<LabelPair> = (0..1_000_000)
            .map(|i| pair(&format!("l{i}"), "v"))
            .collect();
        let started = std::time::Instant::now();
        let err = uploads_from_push(push_request(labels, b"x"), &Limits::default()).unwrap_err();
        assert_eq!(
            err,
            UploadError::TooManyLabels {
                series: 0,
                count: 49,
                limit: 48
            }
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    /// 100k one-byte samples under 48 labels of 2 KiB used to
    /// deep-copy the labels per sample (19 GiB); now the count is capped and
    /// every profile of a series shares one label set.
    #[test]
    fn profiles_of_a_series_share_one_label_set_and_their_count_is_capped() {
        let big = "x".repeat(2048);
        let mut labels = vec![pair("__name__", "process_cpu")];
        labels.extend((0..47).map(|i| pair(&format!("l{i}"), &big)));
        let request = |samples: usize| PushRequest {
            series: vec![push::RawProfileSeries {
                labels: labels.clone(),
                samples: (0..samples)
                    .map(|_| push::RawSample {
                        raw_profile: vec![1],
                        id: String::new(),
                    })
                    .collect(),
            }],
        };
        let err = uploads_from_push(request(100_000), &Limits::default()).unwrap_err();
        assert_eq!(err, UploadError::TooManyProfiles { limit: 1024 });
        let uploads = uploads_from_push(request(1024), &Limits::default()).unwrap();
        assert_eq!(uploads.len(), 1024);
        assert!(
            uploads
                .iter()
                .all(|u| Arc::ptr_eq(&u.labels, &uploads[0].labels))
        );
    }

    #[test]
    fn write_raw_without_labels_is_missing_its_name() {
        let request = parca::WriteRawRequest {
            series: vec![parca::RawProfileSeries {
                labels: None,
                samples: vec![parca::RawSample {
                    raw_profile: vec![1],
                    executable_info: vec![],
                }],
            }],
            ..Default::default()
        };
        let err = uploads_from_write_raw(request, &Limits::default()).unwrap_err();
        assert_eq!(err, UploadError::MissingName { series: 0 });
    }
}

//! Partial batches of WriteRaw and Push: each series of a request
//! is stored or refused on its own, so one tenant's bad labels never cost
//! the other series of the batch, and a client that asked for per-series
//! statuses learns exactly which series were stored, so its retry resends
//! only the rest and never duplicates what is stored. Pure: the request is
//! split here, stored by `state`, answered by `grpc`.

use std::sync::Arc;

use kiln_api::parca::profilestore::v1alpha1::WriteRawRequest;
use kiln_api::push::v1::PushRequest;
use kiln_storage::StorageError;
use kiln_storage::store::{check_key, profile_key};

use crate::config::Limits;
use crate::error::ApiError;
use crate::ingest::upload::{ProfileUpload, UploadError, checked_labels};

/// The gRPC metadata with which a client asks for per-series statuses in
/// the response instead of one gRPC status for the whole request.
pub const SERIES_STATUS_METADATA: &str = "kiln-series-status";

/// One series of a request: its profiles, or why none can be stored.
#[derive(Debug, Clone)]
pub struct SeriesUploads {
    /// Index of the series in the request.
    pub series: usize,
    /// Its profiles, in order; an error when its labels or a profile are
    /// unusable (a client error for this series only).
    pub uploads: Result<Vec<ProfileUpload>, UploadError>,
    /// The client's idempotency key of each profile, if it sent keys.
    pub keys: Vec<Option<String>>,
}

/// Why one series was not stored entirely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesFailure {
    /// Index of the series in the request.
    pub series: usize,
    /// Its profiles stored, in order, before it stopped.
    pub stored_profiles: usize,
    /// The gRPC code of the failure.
    pub code: tonic::Code,
    /// The fixed reason, as in metrics.
    pub reason: &'static str,
    /// What went wrong.
    pub message: String,
}

impl SeriesFailure {
    /// A failure of `series` after `stored_profiles` profiles.
    pub fn new(series: usize, stored_profiles: usize, error: &ApiError) -> Self {
        Self {
            series,
            stored_profiles,
            code: error.grpc_code(),
            reason: error.reason(),
            message: error.to_string(),
        }
    }

    /// Whether sending the rest of the series again can help.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self.code,
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange
        )
    }
}

/// What storing a request did: every series not listed was stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Series in the request.
    pub series: usize,
    /// The series not stored entirely, by index.
    pub failures: Vec<SeriesFailure>,
}

impl BatchReport {
    /// The single gRPC status a client that did not ask for per-series
    /// statuses gets, as Parca and Pyroscope answer: none when everything
    /// was stored; else the first failure that retrying may fix (the store
    /// is overloaded or shutting down), or else the first client error,
    /// naming how many series were not stored.
    pub fn status(&self) -> Option<tonic::Status> {
        let first = self
            .failures
            .iter()
            .find(|f| !f.is_client_error())
            .or_else(|| self.failures.first())?;
        Some(tonic::Status::new(
            first.code,
            format!(
                "{} of {} series not stored; series {}: {}",
                self.failures.len(),
                self.series,
                first.series,
                first.message
            ),
        ))
    }
}

/// A batch being stored series by series: what [`BatchReport`] says so
/// far, and the failure that stopped it, if one did. Every series is
/// handed to [`BatchProgress::series_to_store`] in order; a failure of one
/// of its profiles is told to [`BatchProgress::profile_failed`].
#[derive(Debug)]
pub struct BatchProgress {
    report: BatchReport,
    stop: Option<ApiError>,
}

/// One series to store: its index, profiles and their keys.
pub type SeriesToStore = (usize, Vec<ProfileUpload>, Vec<Option<String>>);

impl BatchProgress {
    /// Nothing stored yet of a request of `series` series.
    pub fn new(series: usize) -> Self {
        Self {
            report: BatchReport {
                series,
                failures: Vec::new(),
            },
            stop: None,
        }
    }

    /// The profiles of `series` to store, or `None` when it is not stored
    /// at all (its own client error, or the request stopped), which the
    /// report then says.
    pub fn series_to_store(&mut self, series: SeriesUploads) -> Option<SeriesToStore> {
        if let Some(error) = &self.stop {
            self.report
                .failures
                .push(SeriesFailure::new(series.series, 0, error));
            return None;
        }
        match series.uploads {
            Ok(uploads) => Some((series.series, uploads, series.keys)),
            Err(error) => {
                let error = ApiError::from(error);
                self.report
                    .failures
                    .push(SeriesFailure::new(series.series, 0, &error));
                None
            }
        }
    }

    /// Series `series` stopped after `stored` profiles, at `error`: a
    /// client error stops that series only; a failure that retrying may fix
    /// (the store is overloaded, shutting down, or failing) stops the
    /// request, and the series from there on are reported as not stored.
    pub fn profile_failed(&mut self, series: usize, stored: usize, error: StorageError) {
        let client_error = error.is_client_error();
        let error = ApiError::from(error);
        self.report
            .failures
            .push(SeriesFailure::new(series, stored, &error));
        if !client_error {
            self.stop = Some(error);
        }
    }

    /// What was stored.
    pub fn finish(self) -> BatchReport {
        self.report
    }
}

/// Splits a WriteRaw request into series. Refused as a whole only when the
/// request holds no profile, or more series or profiles than the store
/// takes at once; a series without profiles is refused alone.
pub fn series_from_write_raw(
    request: WriteRawRequest,
    limits: &Limits,
) -> Result<Vec<SeriesUploads>, UploadError> {
    check_shape(request.series.iter().map(|s| s.samples.len()), limits)?;
    let mut keys = request.kiln_idempotency_keys.into_iter();
    let series = request.series.into_iter().map(|series| {
        let key = keys.next().filter(|k| !k.is_empty());
        let labels: Vec<(String, String)> = series
            .labels
            .unwrap_or_default()
            .labels
            .into_iter()
            .map(|l| (l.name, l.value))
            .collect();
        let profiles: Vec<Vec<u8>> = series.samples.into_iter().map(|s| s.raw_profile).collect();
        (labels, profiles, key)
    });
    Ok(split_series(series, limits))
}

/// Splits a Push request into series, like [`series_from_write_raw`].
pub fn series_from_push(
    request: PushRequest,
    limits: &Limits,
) -> Result<Vec<SeriesUploads>, UploadError> {
    check_shape(request.series.iter().map(|s| s.samples.len()), limits)?;
    let series = request.series.into_iter().map(|series| {
        let labels: Vec<(String, String)> = series
            .labels
            .into_iter()
            .map(|l| (l.name, l.value))
            .collect();
        let profiles: Vec<Vec<u8>> = series.samples.into_iter().map(|s| s.raw_profile).collect();
        (labels, profiles, None)
    });
    Ok(split_series(series, limits))
}

/// Refuses a request, from its series' profile counts alone and before
/// anything is built per series, when it holds no profile, or more series
/// or profiles than one request may. Every series must hold a profile, so
/// a request of millions of empty series is refused here, at no cost.
fn check_shape(
    profiles_per_series: impl ExactSizeIterator<Item = usize>,
    limits: &Limits,
) -> Result<(), UploadError> {
    let limit = limits.max_profiles_per_request;
    if profiles_per_series.len() > limit {
        return Err(UploadError::TooManySeries {
            what: "series",
            limit,
        });
    }
    let profiles = profiles_per_series.fold(0usize, usize::saturating_add);
    if profiles > limit {
        return Err(UploadError::TooManyProfiles { limit });
    }
    if profiles == 0 {
        return Err(UploadError::Empty);
    }
    Ok(())
}

/// Builds each series' uploads; the request's shape was checked
/// ([`check_shape`]).
fn split_series(
    series: impl Iterator<Item = (Vec<(String, String)>, Vec<Vec<u8>>, Option<String>)>,
    limits: &Limits,
) -> Vec<SeriesUploads> {
    let mut out = Vec::new();
    for (index, (labels, profiles, key)) in series.enumerate() {
        let count = profiles.len();
        let keys = (0..count)
            .map(|j| key.as_deref().map(|k| profile_key(k, j, count)))
            .collect();
        // The client's key is checked as sent, before a profile's index
        // lengthens it: any key a client may send keys a series of any
        // length, and one it may not is refused whatever the series holds.
        let bad_key = key.as_deref().and_then(|k| check_key(k).err());
        let uploads = if profiles.is_empty() {
            Err(UploadError::EmptySeries { series: index })
        } else if let Some(message) = bad_key {
            Err(UploadError::BadIdempotencyKey {
                series: index,
                message,
            })
        } else {
            checked_labels(index, labels, limits).and_then(|labels| {
                let labels = Arc::new(labels);
                profiles
                    .into_iter()
                    .enumerate()
                    .map(|(sample, raw_profile)| {
                        if raw_profile.is_empty() {
                            return Err(UploadError::EmptyProfile {
                                series: index,
                                sample,
                            });
                        }
                        Ok(ProfileUpload {
                            labels: Arc::clone(&labels),
                            time_ms: None,
                            duration_nanos: None,
                            pprof: raw_profile.into(),
                            decoded: None,
                        })
                    })
                    .collect()
            })
        };
        out.push(SeriesUploads {
            series: index,
            uploads,
            keys,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_api::parca::profilestore::v1alpha1 as parca;

    fn series(labels: &[(&str, &str)], profiles: &[&[u8]]) -> parca::RawProfileSeries {
        parca::RawProfileSeries {
            labels: Some(parca::LabelSet {
                labels: labels
                    .iter()
                    .map(|(n, v)| parca::Label {
                        name: (*n).into(),
                        value: (*v).into(),
                    })
                    .collect(),
            }),
            samples: profiles
                .iter()
                .map(|p| parca::RawSample {
                    raw_profile: p.to_vec(),
                    executable_info: Vec::new(),
                })
                .collect(),
        }
    }

    fn request(series: Vec<parca::RawProfileSeries>) -> WriteRawRequest {
        WriteRawRequest {
            series,
            ..WriteRawRequest::default()
        }
    }

    #[test]
    fn a_series_with_bad_labels_is_refused_alone() {
        let limits = Limits::default();
        let long = "x".repeat(limits.max_label_bytes + 1);
        let split = series_from_write_raw(
            request(vec![
                series(&[("__name__", "cpu")], &[b"p1"]),
                series(&[("__name__", "cpu"), ("service_name", &long)], &[b"p2"]),
                series(&[("__name__", "cpu"), ("pod", "b")], &[b"p3", b""]),
                series(&[("__name__", "cpu"), ("pod", "c")], &[b"p4", b"p5"]),
            ]),
            &limits,
        )
        .expect("the request as a whole is fine");
        assert_eq!(split.len(), 4);
        assert_eq!(split[0].uploads.as_ref().map(Vec::len), Ok(1));
        assert!(matches!(
            split[1].uploads,
            Err(UploadError::LabelTooLong { series: 1, .. })
        ));
        assert!(matches!(
            split[2].uploads,
            Err(UploadError::EmptyProfile {
                series: 2,
                sample: 1
            })
        ));
        assert_eq!(split[3].uploads.as_ref().map(Vec::len), Ok(2));
    }

    #[test]
    fn each_profile_gets_its_series_key() {
        let limits = Limits::default();
        let mut request = request(vec![
            series(&[("__name__", "cpu")], &[b"p1"]),
            series(&[("__name__", "cpu")], &[b"p2", b"p3"]),
            series(&[("__name__", "cpu")], &[b"p4"]),
        ]);
        request.kiln_idempotency_keys = vec!["k0".into(), "k1".into()];
        let split = series_from_write_raw(request, &limits).expect("fine");
        assert_eq!(split[0].keys, vec![Some("k0".to_string())]);
        assert_eq!(
            split[1].keys,
            vec![Some("k1/0".to_string()), Some("k1/1".to_string())]
        );
        assert_eq!(split[2].keys, vec![None], "no key sent for it");
    }

    #[test]
    fn an_empty_or_oversized_request_is_refused_whole() {
        let limits = Limits {
            max_profiles_per_request: 2,
            ..Limits::default()
        };
        assert_eq!(
            series_from_write_raw(request(vec![]), &limits).err(),
            Some(UploadError::Empty)
        );
        assert_eq!(
            series_from_write_raw(
                request(vec![series(&[("__name__", "cpu")], &[b"a", b"b", b"c"])]),
                &limits
            )
            .err(),
            Some(UploadError::TooManyProfiles { limit: 2 })
        );
    }

    #[test]
    fn empty_series_are_refused_alone_and_too_many_series_whole() {
        let limits = Limits {
            max_profiles_per_request: 3,
            ..Limits::default()
        };
        let split = series_from_write_raw(
            request(vec![
                series(&[("__name__", "cpu")], &[]),
                series(&[("__name__", "cpu")], &[b"p"]),
            ]),
            &limits,
        )
        .expect("one series holds a profile");
        assert_eq!(
            split[0].uploads.as_ref().err(),
            Some(&UploadError::EmptySeries { series: 0 })
        );
        assert_eq!(split[1].uploads.as_ref().map(Vec::len), Ok(1));
        let empties = request((0..4).map(|_| series(&[], &[])).collect());
        assert_eq!(
            series_from_write_raw(empties, &limits).err(),
            Some(UploadError::TooManySeries {
                what: "series",
                limit: 3
            })
        );
    }

    /// Issue 50: the blocking and the async store loops share this; a
    /// client error stops its series, a retryable one the request.
    #[test]
    fn progress_stops_a_series_at_a_client_error_and_the_request_at_a_retryable_one() {
        let split = series_from_write_raw(
            request(vec![
                series(&[("__name__", "cpu")], &[b"p1", b"p2"]),
                series(&[("pod", "no name")], &[b"p3"]),
                series(&[("__name__", "cpu")], &[b"p4"]),
                series(&[("__name__", "cpu")], &[b"p5"]),
            ]),
            &Limits::default(),
        )
        .expect("the request as a whole is fine");
        let mut progress = BatchProgress::new(split.len());
        let mut to_store = Vec::new();
        for (n, series) in split.into_iter().enumerate() {
            let Some((index, uploads, keys)) = progress.series_to_store(series) else {
                continue;
            };
            assert_eq!(keys.len(), uploads.len());
            to_store.push(index);
            match n {
                0 => progress.profile_failed(
                    index,
                    1,
                    StorageError::InvalidIdempotencyKey {
                        message: "bad".into(),
                    },
                ),
                2 => progress.profile_failed(index, 0, StorageError::ShuttingDown),
                _ => {}
            }
        }
        assert_eq!(to_store, [0, 2], "series 1 is refused, series 3 stopped");
        let report = progress.finish();
        let failed: Vec<(usize, usize, &str)> = report
            .failures
            .iter()
            .map(|f| (f.series, f.stored_profiles, f.reason))
            .collect();
        assert_eq!(
            failed,
            [
                (0, 1, "invalid_idempotency_key"),
                (1, 0, "missing_name"),
                (2, 0, "shutting_down"),
                (3, 0, "shutting_down"),
            ]
        );
        assert_eq!(report.series, 4);
    }

    #[test]
    fn the_single_status_prefers_a_retryable_failure_and_counts_the_rest() {
        let refused = ApiError::from(UploadError::MissingName { series: 0 });
        let down = ApiError::from(StorageError::ShuttingDown);
        let report = BatchReport {
            series: 5,
            failures: vec![
                SeriesFailure::new(0, 0, &refused),
                SeriesFailure::new(3, 0, &down),
                SeriesFailure::new(4, 0, &down),
            ],
        };
        let status = report.status().expect("a failure");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status
                .message()
                .starts_with("3 of 5 series not stored; series 3:"),
            "{}",
            status.message()
        );
        let only_refused = BatchReport {
            series: 2,
            failures: vec![SeriesFailure::new(0, 0, &refused)],
        };
        assert_eq!(
            only_refused.status().map(|s| s.code()),
            Some(tonic::Code::InvalidArgument)
        );
        assert!(only_refused.failures[0].is_client_error());
        assert_eq!(BatchReport::default().status().map(|s| s.code()), None);
    }
}

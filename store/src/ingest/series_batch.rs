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
mod tests;

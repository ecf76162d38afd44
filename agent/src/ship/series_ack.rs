//! What a store's per-series answer to a WriteRaw batch means for each
//! profile of it. One refused profile must not cost the rest of the batch
//! (other pods' data on the same node), and a retry after a partial success
//! must not store twice what was already stored. Pure, so every rule is
//! unit-tested.
//!
//! The agent sends one series per profile and asks for per-series statuses
//! (`kiln-series-status: 1`); Kiln lists the series it did not store
//! entirely, and a store that does not know the extension (Parca) lists
//! none, meaning all were stored, which is what its OK says.

use kiln_api::parca::profilestore::v1alpha1 as parca;

/// The metadata asking the store for per-series statuses.
pub const SERIES_STATUS_METADATA: &str = "kiln-series-status";

/// A batch sorted by what to do next with each profile.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settled<T> {
    /// Profiles stored.
    pub stored: usize,
    /// Profiles the store refused as client errors: sending them again
    /// cannot help, so they are dropped (and counted).
    pub rejected: Vec<T>,
    /// Profiles not stored for a reason that may pass (overload, shutdown):
    /// sent again later, alone, so what was stored is never sent twice.
    pub retry: Vec<T>,
}

/// Whether a series' failure code means the profile itself is refused.
fn is_client_error(code: i32) -> bool {
    matches!(
        tonic::Code::from(code),
        tonic::Code::InvalidArgument
            | tonic::Code::OutOfRange
            | tonic::Code::FailedPrecondition
            | tonic::Code::Unimplemented
    )
}

/// Sorts `batch` (series `i` of the request is `batch[i]`, one profile
/// each) by the statuses the store answered.
pub fn settle<T>(batch: Vec<T>, statuses: &[parca::KilnSeriesStatus]) -> Settled<T> {
    let mut settled = Settled {
        stored: 0,
        rejected: Vec::new(),
        retry: Vec::new(),
    };
    for (index, item) in batch.into_iter().enumerate() {
        let status = statuses
            .iter()
            .find(|s| usize::try_from(s.series).is_ok_and(|s| s == index));
        match status {
            // Not listed, or its one profile stored before it stopped.
            None => settled.stored += 1,
            Some(status) if status.stored_profiles >= 1 => settled.stored += 1,
            Some(status) if is_client_error(status.code) => settled.rejected.push(item),
            Some(_) => settled.retry.push(item),
        }
    }
    settled
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(series: u32, code: tonic::Code, stored_profiles: u32) -> parca::KilnSeriesStatus {
        parca::KilnSeriesStatus {
            series,
            stored_profiles,
            code: code as i32,
            reason: "r".into(),
            message: "m".into(),
        }
    }

    #[test]
    fn unlisted_series_are_stored_refused_ones_dropped_and_the_rest_retried() {
        let settled = settle(
            vec!["a", "b", "c", "d", "e"],
            &[
                status(1, tonic::Code::InvalidArgument, 0),
                status(3, tonic::Code::Unavailable, 0),
                status(4, tonic::Code::ResourceExhausted, 0),
            ],
        );
        assert_eq!(
            settled,
            Settled {
                stored: 2,
                rejected: vec!["b"],
                retry: vec!["d", "e"],
            }
        );
    }

    #[test]
    fn a_store_without_the_extension_stored_everything_it_said_ok_to() {
        let settled = settle(vec![1, 2, 3], &[]);
        assert_eq!(settled.stored, 3);
        assert!(settled.rejected.is_empty() && settled.retry.is_empty());
    }

    #[test]
    fn a_series_whose_profile_was_stored_is_never_sent_again() {
        let settled = settle(vec!["a"], &[status(0, tonic::Code::Unavailable, 1)]);
        assert_eq!(settled.stored, 1);
        assert!(settled.retry.is_empty());
    }

    #[test]
    fn statuses_for_series_outside_the_batch_are_ignored() {
        let settled = settle(vec!["a"], &[status(7, tonic::Code::InvalidArgument, 0)]);
        assert_eq!(settled.stored, 1);
    }
}

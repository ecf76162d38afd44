//! Which profile times ingest accepts: a time far in the future
//! would give its block a `max_time` that retention never reaches, and so
//! would every block compacted from it; a time older than retention would
//! be deleted at the next retention pass, so it is refused while the client
//! can still be told. Replay does not check: a logged record was accepted.

use std::time::Duration;

use crate::error::StorageError;
use crate::store::config::millis;

/// The accepted window `[now - retention, now + max_future_skew]`, in unix ms.
pub(super) fn check_profile_time(
    time_ms: i64,
    now_ms: i64,
    retention: Duration,
    max_future_skew: Duration,
) -> Result<(), StorageError> {
    let earliest_ms = now_ms.saturating_sub(millis(retention));
    let latest_ms = now_ms.saturating_add(millis(max_future_skew));
    if (earliest_ms..=latest_ms).contains(&time_ms) {
        return Ok(());
    }
    Err(StorageError::TimeOutOfRange {
        time_ms,
        earliest_ms,
        latest_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000;
    const DAY: Duration = Duration::from_secs(86_400);
    const SKEW: Duration = Duration::from_secs(600);

    #[test]
    fn times_inside_retention_and_skew_are_accepted_up_to_both_edges() {
        for time in [NOW, NOW - 86_400_000, NOW + 600_000, NOW - 1] {
            check_profile_time(time, NOW, DAY, SKEW).expect("inside the window");
        }
    }

    #[test]
    fn times_past_the_skew_or_older_than_retention_are_refused_with_the_window() {
        for time in [NOW + 600_001, NOW - 86_400_001, i64::MAX, i64::MIN, 0] {
            let err = check_profile_time(time, NOW, DAY, SKEW).expect_err("outside the window");
            let StorageError::TimeOutOfRange {
                time_ms,
                earliest_ms,
                latest_ms,
            } = err
            else {
                panic!("unexpected error {err}");
            };
            assert_eq!(
                (time_ms, earliest_ms, latest_ms),
                (time, NOW - 86_400_000, NOW + 600_000)
            );
        }
        let message = check_profile_time(NOW + 3_600_000, NOW, DAY, SKEW)
            .expect_err("an hour ahead")
            .to_string();
        assert!(message.contains("in the future"), "{message}");
    }
}

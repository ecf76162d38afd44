//! Stopping a query's scan part way: a query runs on a blocking thread
//! that nothing can cancel from outside, so a scan of a large head or block
//! would go on (holding a query turn and a core) long after its request
//! passed its deadline or its client went away. The thread that runs a
//! query installs an [`Interrupt`] with [`run_interruptible`]; the scans
//! ask [`check`] between series and stop with [`QueryError::Stopped`] once
//! the deadline has passed or the request was dropped.
//!
//! The same interrupt bounds what a query builds: a merge over a long
//! range of many distinct stacks would otherwise grow its merged profile
//! until the store is killed. The merges ask [`check_held`] with what they
//! hold between series, and stop with [`QueryError::TooLarge`] past the
//! query's share of memory.
//!
//! Thread-local, so the [`crate::Queryable`] methods keep their signatures
//! and a scan with no interrupt installed (compaction, tests) never stops.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::error::QueryError;

/// When a query must stop: at its deadline, or as soon as whoever waits
/// for it sets `cancelled`.
#[derive(Debug, Clone)]
pub struct Interrupt {
    /// The request's deadline.
    pub deadline: Instant,
    /// Set when the request was dropped (its client went away, or an
    /// outer deadline fired first).
    pub cancelled: Arc<AtomicBool>,
    /// Most bytes the query may hold in what it builds (its merged
    /// profile and the sums of the scan in progress).
    pub max_held_bytes: usize,
}

impl Interrupt {
    /// Why the query must stop now, if it must.
    pub fn stopped(&self) -> Option<StopReason> {
        if self.cancelled.load(Ordering::Relaxed) {
            Some(StopReason::Cancelled)
        } else if Instant::now() >= self.deadline {
            Some(StopReason::Deadline)
        } else {
            None
        }
    }
}

/// Why a query stopped part way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Its deadline passed.
    Deadline,
    /// Its request was dropped.
    Cancelled,
}

thread_local! {
    static CURRENT: RefCell<Option<Interrupt>> = const { RefCell::new(None) };
}

/// Runs `work` with `interrupt` installed on this thread, so that every
/// scan it makes stops at the interrupt; the thread's earlier interrupt
/// (if any) is back afterwards, even if `work` panics.
pub fn run_interruptible<R>(interrupt: Interrupt, work: impl FnOnce() -> R) -> R {
    struct Restore(Option<Interrupt>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let earlier = self.0.take();
            CURRENT.with(|current| *current.borrow_mut() = earlier);
        }
    }
    let earlier = CURRENT.with(|current| current.borrow_mut().replace(interrupt));
    let _restore = Restore(earlier);
    work()
}

/// `Err(QueryError::TooLarge)` when `held` bytes are more than the
/// installed interrupt allows; `Ok` when none is installed.
pub fn check_held(held: usize) -> Result<(), QueryError> {
    CURRENT.with(|current| match current.borrow().as_ref() {
        Some(interrupt) if held > interrupt.max_held_bytes => Err(QueryError::TooLarge {
            held_bytes: held,
            limit_bytes: interrupt.max_held_bytes,
        }),
        _ => Ok(()),
    })
}

/// What a scan's sums map of `capacity` entries holds: its key, its value
/// and the map's control byte each.
pub fn sums_bytes(capacity: usize) -> usize {
    capacity.saturating_mul(size_of::<((u32, u32), i64)>() + 1)
}

/// `Err(QueryError::Stopped)` when the interrupt installed on this thread
/// says stop; `Ok` when none is installed.
pub fn check() -> Result<(), QueryError> {
    CURRENT.with(
        |current| match current.borrow().as_ref().and_then(Interrupt::stopped) {
            Some(reason) => Err(QueryError::Stopped { reason }),
            None => Ok(()),
        },
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_scan_stops_at_the_deadline_or_when_cancelled_and_only_where_installed() {
        assert!(check().is_ok(), "nothing installed");
        let cancelled = Arc::new(AtomicBool::new(false));
        let later = Interrupt {
            deadline: Instant::now() + Duration::from_secs(3600),
            cancelled: Arc::clone(&cancelled),
            max_held_bytes: 1 << 20,
        };
        run_interruptible(later, || {
            assert!(check().is_ok());
            assert!(check_held(1 << 20).is_ok());
            assert!(matches!(
                check_held((1 << 20) + 1),
                Err(QueryError::TooLarge {
                    limit_bytes: 1_048_576,
                    ..
                })
            ));
            cancelled.store(true, Ordering::Relaxed);
            assert!(matches!(
                check(),
                Err(QueryError::Stopped {
                    reason: StopReason::Cancelled
                })
            ));
        });
        assert!(check().is_ok(), "restored after the work");
        assert!(check_held(usize::MAX).is_ok(), "restored after the work");
        let past = Interrupt {
            deadline: Instant::now(),
            cancelled: Arc::new(AtomicBool::new(false)),
            max_held_bytes: usize::MAX,
        };
        run_interruptible(past, || {
            assert!(matches!(
                check(),
                Err(QueryError::Stopped {
                    reason: StopReason::Deadline
                })
            ));
        });
    }
}

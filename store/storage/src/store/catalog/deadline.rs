//! One deadline for a whole request. A request may make many store visits
//! (one per group of a grouped query, one per matcher set of a listing);
//! each visit used to start its own clock, so a request of a thousand
//! groups could run for a thousand deadlines, and a visit went on scanning
//! on its blocking thread after the request had given up on it.
//!
//! A request runs its visits inside [`with_request_deadline`]; every visit
//! made within it stops at that deadline (or its own, if sooner), between
//! heads and blocks and inside their scans between series, and stops as
//! soon as the request's future is dropped.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kiln_engine::query::interrupt::Interrupt;

tokio::task_local! {
    static REQUEST_DEADLINE: Instant;
}

/// Runs `request` (any number of store visits) so that every visit in it
/// stops by `deadline`.
pub async fn with_request_deadline<F: Future>(deadline: Instant, request: F) -> F::Output {
    REQUEST_DEADLINE.scope(deadline, request).await
}

/// The deadline of a visit that starts now and may take `timeout`: the
/// request's, when it is sooner.
pub(super) fn visit_deadline(timeout: Duration) -> Instant {
    let own = Instant::now() + timeout;
    REQUEST_DEADLINE
        .try_with(|request| (*request).min(own))
        .unwrap_or(own)
}

/// Sets its flag when dropped: held by the future that waits for a visit's
/// blocking thread, so that the thread learns the request is gone.
pub(super) struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// An interrupt at `deadline` for a query that may hold `max_held_bytes`,
/// and the guard that cancels it when dropped.
pub(super) fn interrupt_at(deadline: Instant, max_held_bytes: usize) -> (Interrupt, CancelOnDrop) {
    let cancelled = Arc::new(AtomicBool::new(false));
    (
        Interrupt {
            deadline,
            cancelled: Arc::clone(&cancelled),
            max_held_bytes,
        },
        CancelOnDrop(cancelled),
    )
}

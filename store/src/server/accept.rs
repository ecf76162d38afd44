//! The accept loop and each connection's watch, so that slow or idle
//! clients cannot hold the port's sockets and memory. `axum::serve`
//! has no connection cap and no header, idle or "first request" timeouts,
//! so slow clients could hold sockets, tasks and buffers for ever.
//!
//! - At most `max_connections` are open; the loop stops accepting at the
//!   cap, so further clients wait in the kernel's accept queue rather than
//!   costing memory here.
//! - HTTP/1 headers must arrive within `header_read_timeout` (hyper's own
//!   timer, which also bounds the wait for the next request on a kept-alive
//!   connection), and every connection must start its first request within
//!   that time, which also covers a stalled HTTP/2 preface.
//! - A connection with no request in flight for `idle_timeout` is shut
//!   down (HTTP/2 sends GOAWAY, so clients know nothing was lost), and
//!   dropped if it has not closed one header timeout later.
//! - At the cap, a client that connects is not left waiting behind idle
//!   connections until their timeout: the connection idle longest (none
//!   in flight) is shut down the same way to make room for it. Thousands
//!   of connections held open, each sending a request now and then, then
//!   cost their holders their connections, not other clients theirs.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError, watch};
use tower::ServiceExt as _;

use crate::config::ConnectionLimits;
use crate::metrics::ConnectionStats;

/// The most bytes hyper buffers for one HTTP/1 request head (hyper's
/// default is about 400 KiB); with the connection cap it bounds what
/// clients sending headers slowly can make the store hold.
pub const MAX_HEADER_BUFFER_BYTES: usize = 32 << 10;

/// Serves `router` on `listener` under `limits` until `shutdown` resolves,
/// then stops accepting, asks every connection to finish and waits for
/// them (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let connections = Arc::new(OpenConnections::default());
    let (closing_tx, closing_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let free_slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => Some(slot),
            Err(TryAcquireError::NoPermits) => None,
            // Never closed; stop serving if it ever is.
            Err(TryAcquireError::Closed) => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    wait_after_accept_error(&error).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let slot = match free_slot {
            Some(slot) => slot,
            None => {
                // At the cap with a client waiting: the connection idle
                // longest makes room. With every connection busy, the
                // client waits for the first to end.
                connections.evict_idlest();
                tokio::select! {
                    slot = Arc::clone(&slots).acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        // NB: without TCP_NODELAY, Nagle's algorithm holds back the small
        // final frames of a gRPC response until the peer's delayed ACK
        // (~40 ms on Linux), which capped each writer at ~25 requests/s.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        tokio::spawn(serve_connection(
            stream,
            router.clone(),
            limits,
            Arc::clone(&stats),
            (slot, Arc::clone(&connections)),
            closing_rx.clone(),
        ));
    }
    drop(listener);
    // Connections shut down gracefully; the receivers may all be gone.
    let _ = closing_tx.send(true);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    // Every connection holds a slot until it ends.
    let _ = slots.acquire_many(all).await;
    Ok(())
}

/// Per-connection errors (the peer reset before accept) are retried at
/// once; others (out of file descriptors) after a pause, as `axum::serve`
/// does, instead of spinning.
async fn wait_after_accept_error(error: &std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::warn!(%error, "accept failed; retrying in 1s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// What a connection's watch reads: requests in flight and when the last
/// one ended.
#[derive(Debug)]
struct Activity {
    opened: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `opened` when the last request ended; `u64::MAX`
    /// until a request has started.
    last_end_ms: AtomicU64,
}

const NO_REQUEST_YET: u64 = u64::MAX;

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_end_ms: AtomicU64::new(NO_REQUEST_YET),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// How long the connection has had no request in flight, in ms at
    /// `now`; `None` while one is.
    fn idle_ms_at(&self, now: u64) -> Option<u64> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        match self.last_end_ms.load(Ordering::SeqCst) {
            NO_REQUEST_YET => Some(now),
            end => Some(now.saturating_sub(end)),
        }
    }

    /// Why the connection should close `now` (ms after it opened), if it
    /// should.
    fn overdue_at(&self, now: u64, limits: &ConnectionLimits) -> Option<Overdue> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        match self.last_end_ms.load(Ordering::SeqCst) {
            NO_REQUEST_YET if now >= millis(limits.header_read_timeout) => Some(Overdue::NoRequest),
            NO_REQUEST_YET => None,
            end if now.saturating_sub(end) >= millis(limits.idle_timeout) => Some(Overdue::Idle),
            _ => None,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Why a connection was closed by its watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overdue {
    /// No request started within the header timeout.
    NoRequest,
    /// No request in flight for the idle timeout.
    Idle,
}

/// The open connections, so that at the cap the one idle longest can be
/// asked to close.
#[derive(Debug, Default)]
struct OpenConnections {
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Tracked>>>,
}

/// One open connection as [`OpenConnections`] sees it.
#[derive(Debug)]
struct Tracked {
    activity: Arc<Activity>,
    /// Wakes the connection's watch to close it.
    evict: Notify,
    /// Already asked: not picked twice.
    evicting: AtomicBool,
}

impl OpenConnections {
    /// Tracks a connection until the returned guard is dropped.
    fn track(self: &Arc<Self>, activity: Arc<Activity>) -> TrackedConnection {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let tracked = Arc::new(Tracked {
            activity,
            evict: Notify::new(),
            evicting: AtomicBool::new(false),
        });
        self.lock().insert(id, Arc::clone(&tracked));
        TrackedConnection {
            id,
            tracked,
            connections: Arc::clone(self),
        }
    }

    /// Asks the connection idle longest to close; `false` when every
    /// connection has a request in flight (or was asked already).
    fn evict_idlest(&self) -> bool {
        let open = self.lock();
        let idlest = open
            .values()
            .filter(|t| !t.evicting.load(Ordering::SeqCst))
            .filter_map(|t| Some((t.activity.idle_ms_at(t.activity.now_ms())?, t)))
            .max_by_key(|(idle_ms, _)| *idle_ms);
        match idlest {
            Some((_, tracked)) => {
                tracked.evicting.store(true, Ordering::SeqCst);
                // Stored if the watch is not waiting right now.
                tracked.evict.notify_one();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Tracked>>> {
        // The map stays whole whatever panicked while holding it.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection in [`OpenConnections`], removed when dropped.
struct TrackedConnection {
    id: u64,
    tracked: Arc<Tracked>,
    connections: Arc<OpenConnections>,
}

impl Drop for TrackedConnection {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.id);
    }
}

/// Counts a request in flight from when hyper hands it over until its
/// response is ready; a response body still being written is bounded by
/// the idle timeout.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.last_end_ms.store(self.0.now_ms(), Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The router, counting requests into the connection's [`Activity`].
#[derive(Clone)]
struct CountedRouter {
    router: Router,
    activity: Arc<Activity>,
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl hyper::service::Service<hyper::Request<Incoming>> for CountedRouter {
    type Response = Response;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let in_flight = InFlight::start(&self.activity);
        let response = self.router.clone().oneshot(request);
        Box::pin(async move {
            let response = response.await;
            drop(in_flight);
            response
        })
    }
}

async fn serve_connection(
    stream: TcpStream,
    router: Router,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    (_slot, connections): (OwnedSemaphorePermit, Arc<OpenConnections>),
    mut closing: watch::Receiver<bool>,
) {
    let _open = stats.opened();
    let activity = Arc::new(Activity::new());
    let tracked = connections.track(Arc::clone(&activity));
    let service = CountedRouter {
        router,
        activity: Arc::clone(&activity),
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_HEADER_BUFFER_BYTES);
    builder.http2().timer(TokioTimer::new());
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    // Checking a few times per timeout closes a connection within a
    // quarter of its timeout past it.
    let period = (limits.header_read_timeout.min(limits.idle_timeout) / 4)
        .clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Set once a graceful shutdown was asked for: the connection is dropped
    // if it has not closed by then.
    let mut shut_down_by: Option<Instant> = None;
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(error) = served {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            _ = ticks.tick() => {
                if shut_down_by.is_some_and(|by| Instant::now() >= by)
                    && activity.in_flight.load(Ordering::SeqCst) == 0
                {
                    return;
                }
                match activity.overdue_at(activity.now_ms(), &limits) {
                    None => {}
                    Some(Overdue::NoRequest) => {
                        // Nothing started, so nothing can be lost.
                        stats.closed_without_request();
                        return;
                    }
                    Some(Overdue::Idle) if shut_down_by.is_none() => {
                        stats.closed_idle();
                        connection.as_mut().graceful_shutdown();
                        shut_down_by = Some(Instant::now() + limits.header_read_timeout);
                    }
                    Some(Overdue::Idle) => {}
                }
            }
            () = tracked.tracked.evict.notified(), if shut_down_by.is_none() => {
                // Idle at the cap while a client waits (see the module docs).
                stats.closed_evicted();
                connection.as_mut().graceful_shutdown();
                shut_down_by = Some(Instant::now() + limits.header_read_timeout);
            }
            _ = closing.wait_for(|closing| *closing), if shut_down_by.is_none() => {
                connection.as_mut().graceful_shutdown();
                // The caller bounds the drain; in-flight requests finish.
                shut_down_by = Some(Instant::now() + Duration::from_secs(3600));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_connection_idle_longest_is_asked_to_close_never_a_busy_one() {
        let connections = Arc::new(OpenConnections::default());
        let activity = |last_end_ms: u64| {
            let activity = Arc::new(Activity::new());
            activity.last_end_ms.store(last_end_ms, Ordering::SeqCst);
            activity
        };
        // Requests ended at 0 ms and 5 ms after opening; one is busy.
        let long_idle = connections.track(activity(0));
        let short_idle = connections.track(activity(5));
        let busy_activity = activity(0);
        let _request = InFlight::start(&busy_activity);
        let busy = connections.track(busy_activity);
        std::thread::sleep(Duration::from_millis(20));
        assert!(connections.evict_idlest());
        assert!(long_idle.tracked.evicting.load(Ordering::SeqCst));
        assert!(connections.evict_idlest());
        assert!(short_idle.tracked.evicting.load(Ordering::SeqCst));
        assert!(
            !connections.evict_idlest(),
            "only a busy connection is left"
        );
        assert!(!busy.tracked.evicting.load(Ordering::SeqCst));
        drop((long_idle, short_idle, busy));
        assert!(
            connections.lock().is_empty(),
            "closed connections are untracked"
        );
    }

    #[test]
    fn a_connection_is_overdue_without_a_first_request_or_when_idle_never_while_busy() {
        let limits = ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            ..ConnectionLimits::default()
        };
        let activity = Arc::new(Activity::new());
        assert_eq!(activity.overdue_at(9_999, &limits), None);
        assert_eq!(
            activity.overdue_at(10_000, &limits),
            Some(Overdue::NoRequest)
        );
        let request = InFlight::start(&activity);
        assert_eq!(activity.overdue_at(500_000, &limits), None, "busy");
        drop(request);
        let ended = activity.last_end_ms.load(Ordering::SeqCst);
        assert_ne!(ended, NO_REQUEST_YET);
        assert_eq!(activity.overdue_at(ended + 119_999, &limits), None);
        assert_eq!(
            activity.overdue_at(ended + 120_000, &limits),
            Some(Overdue::Idle)
        );
    }
}

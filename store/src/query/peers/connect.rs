//! Connecting to a peer within its own, short timeout.
//!
//! A replica whose pod was replaced keeps its stable name, but for a while
//! (the cluster's DNS caching, 30 s in the e2e cluster) the name still
//! resolves to the dead pod's address, and a SYN sent there is swallowed,
//! not refused. Bounded only by the query's deadline, each query then
//! waited three quarters of the query timeout (22.5 s of 30 s, twice for a
//! query that resolves a short profile type first) before answering
//! partial. A live peer takes a connection in a round trip, so the connect
//! gets `--peer-connect-timeout` of its own (2 s by default: one lost SYN,
//! retransmitted after Linux's initial 1 s, still connects).
//!
//! An address that took no connection in that time is remembered for
//! [`UNREACHABLE_KEPT`], and queries in that window mark the peer
//! unanswered at once instead of each paying the timeout again: a dashboard
//! sends several queries at a time, each asking every peer twice. Only
//! swallowed connects are remembered, by address, not by peer name: a
//! refused connect costs nothing to retry, and once the name resolves to
//! the new pod's address that address is tried at once. A peer the window
//! wrongly skips makes answers partial, never wrong, for at most
//! [`UNREACHABLE_KEPT`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

/// How long an address that swallowed a connect is skipped.
pub const UNREACHABLE_KEPT: Duration = Duration::from_secs(10);

/// Addresses that took no connection within the connect timeout, and when
/// that was found.
#[derive(Debug, Default)]
pub struct Unreachable {
    since: Mutex<HashMap<SocketAddr, Instant>>,
}

impl Unreachable {
    /// How long ago `addr` was found unreachable, if within
    /// [`UNREACHABLE_KEPT`] of `now`.
    pub fn recent(&self, addr: SocketAddr, now: Instant) -> Option<Duration> {
        let found = *self.lock().get(&addr)?;
        let ago = now.saturating_duration_since(found);
        (ago < UNREACHABLE_KEPT).then_some(ago)
    }

    /// Remembers that `addr` took no connection, found at `now`; entries
    /// past their window go, so the map holds at most the addresses found
    /// in the last [`UNREACHABLE_KEPT`].
    pub fn remember(&self, addr: SocketAddr, now: Instant) {
        let mut since = self.lock();
        since.retain(|_, found| now.saturating_duration_since(*found) < UNREACHABLE_KEPT);
        since.insert(addr, now);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Instant>> {
        // The map stays consistent whatever a panicking holder did.
        self.since.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Connects to `authority` (`host:port`), resolving it afresh, within
/// `timeout` for resolution and connect together, and before `deadline`.
/// Addresses found unreachable within [`UNREACHABLE_KEPT`] are skipped;
/// one that takes no connection in time is remembered in `unreachable`.
pub async fn connect(
    authority: &str,
    timeout: Duration,
    deadline: Instant,
    unreachable: &Unreachable,
) -> Result<TcpStream, String> {
    let started = Instant::now();
    let until = deadline.min(started + timeout);
    let addrs: Vec<SocketAddr> =
        tokio::time::timeout_at(until.into(), tokio::net::lookup_host(authority))
            .await
            .map_err(|_elapsed| format!("resolving {authority} took more than {timeout:?}"))?
            .map_err(|e| format!("resolve {authority}: {e}"))?
            .collect();
    let mut errors = Vec::new();
    for addr in addrs {
        if let Some(ago) = unreachable.recent(addr, Instant::now()) {
            errors.push(format!(
                "{addr} took no connection within {timeout:?} {:.1} s ago, skipped for {} s from then",
                ago.as_secs_f64(),
                UNREACHABLE_KEPT.as_secs()
            ));
            continue;
        }
        match tokio::time::timeout_at(until.into(), TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(error)) => errors.push(format!("connect to {addr}: {error}")),
            Err(_elapsed) => {
                // Only a connect that ran into the connect timeout says
                // the address swallows SYNs; one the query's own deadline
                // cut short says nothing about it.
                if until < deadline {
                    unreachable.remember(addr, Instant::now());
                }
                errors.push(format!(
                    "connect to {addr}: no answer within {:?}",
                    until.saturating_duration_since(started)
                ));
                break;
            }
        }
    }
    if errors.is_empty() {
        return Err(format!("{authority} resolved to no address"));
    }
    Err(format!("{authority}: {}", errors.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_address_is_skipped_for_its_window_only() {
        let unreachable = Unreachable::default();
        let dead: SocketAddr = "10.0.0.7:7470".parse().unwrap();
        let other: SocketAddr = "10.0.0.8:7470".parse().unwrap();
        let t0 = Instant::now();
        assert_eq!(unreachable.recent(dead, t0), None);
        unreachable.remember(dead, t0);
        let later = t0 + Duration::from_secs(3);
        assert_eq!(
            unreachable.recent(dead, later),
            Some(Duration::from_secs(3))
        );
        // The new pod's address is tried at once.
        assert_eq!(unreachable.recent(other, later), None);
        assert_eq!(unreachable.recent(dead, t0 + UNREACHABLE_KEPT), None);
        // Expired entries go when another is remembered.
        unreachable.remember(other, t0 + UNREACHABLE_KEPT);
        assert_eq!(unreachable.lock().len(), 1);
    }

    /// A listener whose accept queue is full drops further SYNs (Linux
    /// counts them in ListenOverflows): the client's connect hangs as it
    /// does on a dead pod's address, without root.
    #[tokio::test]
    async fn a_swallowed_connect_fails_at_the_connect_timeout_and_is_remembered() {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let _filling = TcpStream::connect(addr).await.unwrap();
        let unreachable = Unreachable::default();
        let timeout = Duration::from_millis(500);
        let deadline = Instant::now() + Duration::from_secs(30);
        let started = Instant::now();
        let error = connect(&addr.to_string(), timeout, deadline, &unreachable)
            .await
            .unwrap_err();
        let took = started.elapsed();
        assert!(error.contains("no answer within"), "{error}");
        assert!(took >= timeout && took < Duration::from_secs(3), "{took:?}");
        assert!(unreachable.recent(addr, Instant::now()).is_some());
        // The next query does not wait again.
        let started = Instant::now();
        let error = connect(&addr.to_string(), timeout, deadline, &unreachable)
            .await
            .unwrap_err();
        assert!(error.contains("took no connection"), "{error}");
        assert!(started.elapsed() < timeout, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_refused_connect_fails_at_once_and_is_not_remembered() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        let unreachable = Unreachable::default();
        let deadline = Instant::now() + Duration::from_secs(30);
        let error = connect(
            &addr.to_string(),
            Duration::from_secs(5),
            deadline,
            &unreachable,
        )
        .await
        .unwrap_err();
        assert!(error.contains("connect to"), "{error}");
        assert_eq!(unreachable.recent(addr, Instant::now()), None);
    }
}

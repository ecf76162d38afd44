//! Which replica of a store an agent ships to.
//!
//! A store of several replicas dedupes a retried upload by its idempotency
//! keys, and each replica knows only the keys of what it stored itself. So
//! an agent sends every batch, and every retry of it, to one replica: the
//! one its node name picks (spreading nodes over replicas), through the
//! replica's stable name under the headless Service. During a rolling
//! restart that replica is away for a while; the agent keeps retrying it
//! (its queue holds the windows), and the restarted replica, which reloads
//! its keys, stores each profile once.
//!
//! Only a replica failing for longer than `failover_after` is left for the
//! next one, so that a replica gone for good loses no data. A batch the
//! first replica stored without answering then reaches the next one as a
//! resend (marked `kiln-retry-attempt`), whose keys the next replica looks
//! up at its peers: it stores nothing the first one can vouch for, and if
//! the first one is down it stores the batch and the first one, when it
//! comes back, drops its copy while replaying its log.
//! Back on the next replica, the agent returns to its own once
//! `return_after` has passed and a batch has been settled whole, so the
//! first batch it sends there is a new one, never a retry.

use std::time::{Duration, Instant};

/// The replica shipping goes to, and how long it has been failing.
#[derive(Debug, Clone)]
pub struct ReplicaChoice {
    endpoints: Vec<String>,
    preferred: usize,
    current: usize,
    failing_since: Option<Instant>,
    moved_at: Option<Instant>,
    failover_after: Duration,
    return_after: Duration,
}

/// A replica failing this long is left for the next: longer than a pod's
/// restart, so a rolling restart moves no agent.
pub const FAILOVER_AFTER: Duration = Duration::from_secs(180);

/// How long an agent stays on another replica before returning to its own.
pub const RETURN_AFTER: Duration = Duration::from_secs(300);

impl ReplicaChoice {
    /// Ships to `endpoints`, starting at the one `node` picks; `None` when
    /// there is none.
    pub fn new(endpoints: Vec<String>, node: &str) -> Option<Self> {
        Self::with_timings(endpoints, node, FAILOVER_AFTER, RETURN_AFTER)
    }

    /// [`ReplicaChoice::new`] with other failover and return delays.
    pub fn with_timings(
        endpoints: Vec<String>,
        node: &str,
        failover_after: Duration,
        return_after: Duration,
    ) -> Option<Self> {
        if endpoints.is_empty() {
            return None;
        }
        let preferred = preferred_index(node, endpoints.len());
        Some(Self {
            endpoints,
            preferred,
            current: preferred,
            failing_since: None,
            moved_at: None,
            failover_after,
            return_after,
        })
    }

    /// Where the next batch, or the retry of the last, goes.
    pub fn endpoint(&self) -> &str {
        self.endpoints.get(self.current).map_or("", String::as_str)
    }

    /// A batch was settled whole. Returns true when the next batch goes
    /// elsewhere (back to the node's own replica).
    pub fn settled(&mut self, now: Instant) -> bool {
        self.failing_since = None;
        let back = self.current != self.preferred
            && self
                .moved_at
                .is_some_and(|at| now.duration_since(at) >= self.return_after);
        if back {
            self.current = self.preferred;
            self.moved_at = None;
        }
        back
    }

    /// A send failed (retryably). Returns true when the retry goes to the
    /// next replica, the current one having failed for `failover_after`.
    pub fn failed(&mut self, now: Instant) -> bool {
        let since = *self.failing_since.get_or_insert(now);
        if self.endpoints.len() < 2 || now.duration_since(since) < self.failover_after {
            return false;
        }
        self.current = (self.current + 1) % self.endpoints.len();
        self.failing_since = None;
        self.moved_at = Some(now);
        true
    }
}

/// The replica `node` ships to among `count`: FNV-1a of its name, so the
/// choice is the same in every agent build and on every restart.
pub fn preferred_index(node: &str, count: usize) -> usize {
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % count.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicas(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("http://kiln-{i}:7470")).collect()
    }

    #[test]
    fn nodes_spread_over_replicas_and_keep_their_choice() {
        let mut counts = [0usize; 3];
        for n in 0..300 {
            counts[preferred_index(&format!("node-{n}"), 3)] += 1;
        }
        assert!(counts.iter().all(|&c| c > 70), "{counts:?}");
        assert_eq!(preferred_index("node-7", 3), preferred_index("node-7", 3));
        assert_eq!(preferred_index("anything", 1), 0);
        assert!(ReplicaChoice::new(Vec::new(), "n").is_none());
    }

    #[test]
    fn a_restarting_replica_is_retried_and_a_gone_one_left() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut choice =
            ReplicaChoice::with_timings(replicas(3), "node-a", s(180), s(300)).unwrap();
        let own = choice.endpoint().to_owned();
        // A rolling restart: a minute of failures, then success.
        assert!(!choice.failed(t0));
        assert!(!choice.failed(t0 + s(60)));
        assert!(!choice.settled(t0 + s(61)));
        assert_eq!(choice.endpoint(), own);
        // Failures for longer than the failover delay move the retry.
        assert!(!choice.failed(t0 + s(100)));
        assert!(!choice.failed(t0 + s(279)));
        assert!(choice.failed(t0 + s(281)));
        let other = choice.endpoint().to_owned();
        assert_ne!(other, own);
        // There it stays until a batch settles after the return delay.
        assert!(!choice.settled(t0 + s(400)));
        assert_eq!(choice.endpoint(), other);
        assert!(choice.settled(t0 + s(600)));
        assert_eq!(choice.endpoint(), own);
    }

    #[test]
    fn one_replica_is_never_left() {
        let t0 = Instant::now();
        let mut choice = ReplicaChoice::with_timings(
            replicas(1),
            "n",
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .unwrap();
        assert!(!choice.failed(t0));
        assert!(!choice.failed(t0 + Duration::from_secs(3600)));
        assert_eq!(choice.endpoint(), "http://kiln-0:7470");
    }
}

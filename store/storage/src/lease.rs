//! Leases in the bucket: which process may act for a replica name (clean
//! up and compact that replica's blocks), and which one process of all
//! replicas runs retention. Without them two processes under one name
//! compact the same sources twice, and every replica applies its own
//! retention to every block.
//!
//! A lease is a chain of objects `leases/<scope>/<generation>.json`, each
//! created with `PutMode::Create` (an `If-None-Match: *` put on S3, a hard
//! link on local disk), so of two processes racing for one generation
//! exactly one wins. The newest generation is the lease: it names its
//! holder (one process, by a ULID drawn at start) and when it expires. The
//! holder renews it by creating the next generation before then; anyone may
//! take it once it has expired, by creating the next generation too. Only
//! creation is needed, which every `object_store` backend Kiln builds
//! supports (a compare-and-swap `PutMode::Update` is not: local disk lacks it).
//!
//! Clocks: the holder trusts the lease until the expiry it wrote, by its
//! own clock; another process waits [`TAKEOVER_GRACE_MS`] past that expiry
//! by its clock before taking over, so clock skew below that is harmless.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::error::StorageError;

/// The bucket prefix under which every lease lives.
pub const LEASES_PREFIX: &str = "leases";

/// How long past a lease's expiry (by the reader's clock) before another
/// process takes it: the clock skew between replicas that is tolerated.
pub const TAKEOVER_GRACE_MS: i64 = 10_000;

/// One generation of a lease, as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseRecord {
    /// The process holding it (a ULID drawn when the store opened).
    pub holder: String,
    /// The holder's replica name, for people reading the bucket.
    pub replica: String,
    /// Unix ms (holder's clock) after which the lease lapses; 0 = released.
    pub expires_at_ms: i64,
}

/// What to do about a lease, given its newest generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseDecision {
    /// Write this generation: the lease is ours to renew, free, or lapsed.
    Write {
        /// The generation to create.
        generation: u64,
    },
    /// Another live process holds it.
    HeldByOther {
        /// Its newest generation.
        generation: u64,
        /// What that generation says.
        record: LeaseRecord,
    },
}

/// Decides whether `holder` may write the next generation after `latest`.
/// Pure, so every rule is unit-tested.
pub fn decide(latest: Option<(u64, &LeaseRecord)>, holder: &str, now_ms: i64) -> LeaseDecision {
    match latest {
        None => LeaseDecision::Write { generation: 0 },
        Some((generation, record))
            if record.holder == holder
                || record.expires_at_ms.saturating_add(TAKEOVER_GRACE_MS) < now_ms =>
        {
            LeaseDecision::Write {
                generation: generation.saturating_add(1),
            }
        }
        Some((generation, record)) => LeaseDecision::HeldByOther {
            generation,
            record: record.clone(),
        },
    }
}

/// The generation an object name holds: `<digits>.json`.
pub fn parse_generation(file_name: &str) -> Option<u64> {
    let digits = file_name.strip_suffix(".json")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Zero-padded, so names sort by generation.
fn generation_name(generation: u64) -> String {
    format!("{generation:020}.json")
}

/// The state of a lease after an attempt to take or renew it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// This process holds it until `until_ms` (its own clock).
    Held {
        /// Expiry written in the lease.
        until_ms: i64,
    },
    /// Another process holds it.
    HeldByOther {
        /// The generation it wrote.
        generation: u64,
        /// What it says.
        record: LeaseRecord,
    },
}

/// One lease as seen by one process.
#[derive(Debug)]
pub struct Lease {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    holder: String,
    replica: String,
    ttl_ms: i64,
    /// Unix ms until which this process holds the lease; 0 when it does not.
    held_until_ms: AtomicI64,
}

fn bucket_err(op: &'static str, path: &Path) -> impl FnOnce(object_store::Error) -> StorageError {
    let path = path.to_string();
    move |source| StorageError::Bucket { op, path, source }
}

impl Lease {
    /// A lease under `leases/<scope>` for process `holder` of `replica`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        scope: &str,
        holder: &str,
        replica: &str,
        ttl: std::time::Duration,
    ) -> Self {
        Self {
            store,
            prefix: Path::from(format!("{LEASES_PREFIX}/{scope}")),
            holder: holder.to_string(),
            replica: replica.to_string(),
            ttl_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
            held_until_ms: AtomicI64::new(0),
        }
    }

    /// True while this process holds the lease by its own clock.
    pub fn is_held(&self, now_ms: i64) -> bool {
        now_ms < self.held_until_ms.load(Ordering::SeqCst)
    }

    /// The newest generation and what it says; `None` when there is none.
    pub async fn latest(&self) -> Result<Option<(u64, LeaseRecord)>, StorageError> {
        // A generation deleted between the listing and the read was
        // superseded by a newer one: list again.
        for _ in 0..3 {
            let Some(generation) = self.newest_generation().await? else {
                return Ok(None);
            };
            let path = self.prefix.clone().join(generation_name(generation));
            let bytes = match self.store.get(&path).await {
                Ok(result) => result.bytes().await.map_err(bucket_err("get", &path))?,
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(source) => return Err(bucket_err("get", &path)(source)),
            };
            let record: LeaseRecord =
                serde_json::from_slice(&bytes).map_err(|source| StorageError::Lease {
                    path: path.to_string(),
                    message: format!("unreadable lease: {source}"),
                })?;
            return Ok(Some((generation, record)));
        }
        Err(StorageError::Lease {
            path: self.prefix.to_string(),
            message: "the lease kept changing while it was read".into(),
        })
    }

    async fn newest_generation(&self) -> Result<Option<u64>, StorageError> {
        Ok(self.generations().await?.into_iter().max())
    }

    async fn generations(&self) -> Result<Vec<u64>, StorageError> {
        let mut generations = Vec::new();
        let mut listing = self.store.list(Some(&self.prefix));
        while let Some(item) = listing.next().await {
            let object = item.map_err(bucket_err("list", &self.prefix))?;
            if let Some(generation) = object.location.filename().and_then(parse_generation) {
                generations.push(generation);
            }
        }
        Ok(generations)
    }

    /// Takes the lease if it is free or lapsed, renews it if it is ours.
    pub async fn acquire(&self, now_ms: i64) -> Result<LeaseState, StorageError> {
        let latest = self.latest().await?;
        let generation = match decide(latest.as_ref().map(|(g, r)| (*g, r)), &self.holder, now_ms) {
            LeaseDecision::Write { generation } => generation,
            LeaseDecision::HeldByOther { generation, record } => {
                self.held_until_ms.store(0, Ordering::SeqCst);
                return Ok(LeaseState::HeldByOther { generation, record });
            }
        };
        let until_ms = now_ms.saturating_add(self.ttl_ms);
        match self.write(generation, until_ms).await {
            Ok(()) => {
                self.held_until_ms.store(until_ms, Ordering::SeqCst);
                self.delete_older_than(generation).await;
                Ok(LeaseState::Held { until_ms })
            }
            Err(StorageError::Bucket {
                source: object_store::Error::AlreadyExists { .. },
                ..
            }) => {
                // Another process wrote this generation first: it holds it.
                self.held_until_ms.store(0, Ordering::SeqCst);
                match self.latest().await? {
                    Some((generation, record)) if record.holder != self.holder => {
                        Ok(LeaseState::HeldByOther { generation, record })
                    }
                    _ => Err(StorageError::Lease {
                        path: self.prefix.to_string(),
                        message: format!("generation {generation} was taken, then vanished"),
                    }),
                }
            }
            Err(err) => Err(err),
        }
    }

    /// Gives the lease up (a generation that has already expired), so the
    /// next process need not wait for it to lapse. Only when held.
    pub async fn release(&self) -> Result<(), StorageError> {
        if self.held_until_ms.swap(0, Ordering::SeqCst) == 0 {
            return Ok(());
        }
        if let Some((generation, record)) = self.latest().await?
            && record.holder == self.holder
        {
            let next = generation.saturating_add(1);
            self.write(next, 0).await?;
            self.delete_older_than(next).await;
        }
        Ok(())
    }

    async fn write(&self, generation: u64, expires_at_ms: i64) -> Result<(), StorageError> {
        let record = LeaseRecord {
            holder: self.holder.clone(),
            replica: self.replica.clone(),
            expires_at_ms,
        };
        let path = self.prefix.clone().join(generation_name(generation));
        let json = serde_json::to_vec(&record).map_err(|source| StorageError::Lease {
            path: path.to_string(),
            message: source.to_string(),
        })?;
        self.store
            .put_opts(
                &path,
                PutPayload::from(json),
                PutOptions {
                    mode: PutMode::Create,
                    ..PutOptions::default()
                },
            )
            .await
            .map_err(bucket_err("put", &path))?;
        Ok(())
    }

    /// Best effort: superseded generations are garbage, and one left behind
    /// changes nothing (only the newest counts).
    async fn delete_older_than(&self, generation: u64) {
        let Ok(generations) = self.generations().await else {
            return;
        };
        for old in generations.into_iter().filter(|g| *g < generation) {
            let path = self.prefix.clone().join(generation_name(old));
            if let Err(err) = self.store.delete(&path).await {
                tracing::debug!(path = %path, error = %err, "cannot delete an old lease generation");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, expires_at_ms: i64) -> LeaseRecord {
        LeaseRecord {
            holder: holder.into(),
            replica: "r".into(),
            expires_at_ms,
        }
    }

    #[test]
    fn a_free_lease_starts_at_generation_zero() {
        assert_eq!(
            decide(None, "me", 5),
            LeaseDecision::Write { generation: 0 }
        );
    }

    #[test]
    fn the_holder_renews_even_after_its_lease_lapsed_if_nobody_took_it() {
        let mine = record("me", 1_000);
        assert_eq!(
            decide(Some((7, &mine)), "me", 500),
            LeaseDecision::Write { generation: 8 }
        );
        assert_eq!(
            decide(Some((7, &mine)), "me", 1_000_000),
            LeaseDecision::Write { generation: 8 }
        );
    }

    #[test]
    fn another_holder_is_waited_for_until_its_expiry_plus_the_grace() {
        let theirs = record("them", 1_000);
        let held = decide(Some((3, &theirs)), "me", 1_000 + TAKEOVER_GRACE_MS);
        assert_eq!(
            held,
            LeaseDecision::HeldByOther {
                generation: 3,
                record: theirs.clone()
            }
        );
        assert_eq!(
            decide(Some((3, &theirs)), "me", 1_001 + TAKEOVER_GRACE_MS),
            LeaseDecision::Write { generation: 4 }
        );
        // Released: expired since the epoch.
        assert_eq!(
            decide(Some((3, &record("them", 0))), "me", TAKEOVER_GRACE_MS + 1),
            LeaseDecision::Write { generation: 4 }
        );
    }

    #[test]
    fn generation_names_sort_and_parse_back() {
        assert_eq!(parse_generation(&generation_name(42)), Some(42));
        assert!(generation_name(9) < generation_name(10));
        assert_eq!(parse_generation("12.json.tmp"), None);
        assert_eq!(parse_generation(".json"), None);
        assert_eq!(parse_generation("-1.json"), None);
    }

    #[tokio::test]
    async fn two_processes_racing_for_a_lease_get_one_holder() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn ObjectStore> = Arc::new(
            object_store::local::LocalFileSystem::new_with_prefix(dir.path()).expect("local"),
        );
        let ttl = std::time::Duration::from_secs(30);
        let a = Lease::new(Arc::clone(&store), "replica/r", "a", "r", ttl);
        let b = Lease::new(Arc::clone(&store), "replica/r", "b", "r", ttl);
        let now = 1_000_000;
        let (ra, rb) = tokio::join!(a.acquire(now), b.acquire(now));
        let (ra, rb) = (ra.expect("a"), rb.expect("b"));
        let held = [&ra, &rb]
            .iter()
            .filter(|s| matches!(s, LeaseState::Held { .. }))
            .count();
        assert_eq!(held, 1, "{ra:?} {rb:?}");
        let (winner, loser) = if a.is_held(now) { (&a, &b) } else { (&b, &a) };
        assert!(!loser.is_held(now));
        // Renewal by the winner; the loser still sees it held.
        assert!(matches!(
            winner.acquire(now + 10_000).await.expect("renew"),
            LeaseState::Held { until_ms } if until_ms == now + 40_000
        ));
        assert!(matches!(
            loser.acquire(now + 10_000).await.expect("retry"),
            LeaseState::HeldByOther { .. }
        ));
        // Released: the other takes it at once.
        winner.release().await.expect("release");
        assert!(!winner.is_held(now + 10_000));
        assert!(matches!(
            loser
                .acquire(now + 10_000 + TAKEOVER_GRACE_MS + 1)
                .await
                .expect("take"),
            LeaseState::Held { .. }
        ));
        // Old generations are cleaned up.
        let left = loser.generations().await.expect("list");
        assert_eq!(left.len(), 1, "{left:?}");
    }
}

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
//! holder (one process, by a ULID drawn at start) and how long it lasts.
//! The holder renews it by creating the next generation; anyone may take
//! it once it has lapsed, by creating the next generation too. Only
//! creation is needed, which every `object_store` backend Kiln builds
//! supports (a compare-and-swap `PutMode::Update` is not: local disk lacks it).
//!
//! Clocks: no process compares its clock with another's. The holder
//! trusts a generation for its time-to-live measured on its own monotonic
//! clock from *before* it began writing it. Another process measures, on
//! its own monotonic clock, how long it has seen that same generation as
//! the newest, and takes over only after the time-to-live plus a third
//! ([`takeover_after`]). Since it can first see a generation only after
//! it was written, the holder's trust ends at least that third earlier,
//! whatever either wall clock says; the third covers clock rates that
//! differ and requests still in flight. (Earlier releases compared a wall
//! clock expiry, so a replica whose clock ran 40 s fast took a live lease.)
//!
//! Fencing: what a holder does with a lease (upload a compacted block,
//! delete its sources, apply retention) runs through [`Lease::fenced`],
//! which refuses when the generation it holds is no longer trusted and
//! stops the request when that trust runs out, so a holder paused past
//! its lease (a long upload, a stopped process) cannot delete once
//! another process may hold the lease. [`Lease::confirm`] also checks the
//! bucket: the newest generation must still be the one held.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::error::StorageError;

/// The bucket prefix under which every lease lives.
pub const LEASES_PREFIX: &str = "leases";

/// How long another process must have seen one generation of a lease,
/// unchanged and not released, before it may take it over: the lease's
/// time-to-live plus a third, for clock rates that differ and requests in
/// flight.
pub fn takeover_after(ttl: Duration) -> Duration {
    ttl.saturating_add(ttl / 3)
}

/// One generation of a lease, as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseRecord {
    /// The process holding it (a ULID drawn when the store opened).
    pub holder: String,
    /// The holder's replica name, for people reading the bucket.
    pub replica: String,
    /// Unix ms by the holder's clock when this generation lapses, for people
    /// reading the bucket; never compared with another clock. 0 = released.
    pub expires_at_ms: i64,
    /// How long this generation lasts without renewal, in ms; 0 in
    /// generations written by earlier releases (the reader's own
    /// time-to-live is used then).
    #[serde(default)]
    pub ttl_ms: u64,
}

impl LeaseRecord {
    /// Given up by its holder: anyone may take it at once.
    pub fn is_released(&self) -> bool {
        self.expires_at_ms == 0
    }
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

/// Decides whether `holder` may write the next generation after `latest`,
/// which this process has seen as the newest for `seen_for` (on its own
/// monotonic clock); `own_ttl` stands in for a generation that names none.
/// Pure, so every rule is unit-tested.
pub fn decide(
    latest: Option<(u64, &LeaseRecord)>,
    holder: &str,
    seen_for: Duration,
    own_ttl: Duration,
) -> LeaseDecision {
    let Some((generation, record)) = latest else {
        return LeaseDecision::Write { generation: 0 };
    };
    let ttl = match record.ttl_ms {
        0 => own_ttl,
        ms => Duration::from_millis(ms),
    };
    if record.holder == holder || record.is_released() || seen_for > takeover_after(ttl) {
        LeaseDecision::Write {
            generation: generation.saturating_add(1),
        }
    } else {
        LeaseDecision::HeldByOther {
            generation,
            record: record.clone(),
        }
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

/// Puts `bytes` at `path` only if nothing is there (`If-None-Match: *` on
/// S3, a hard link on local disk): of two racing creators exactly one
/// succeeds, the other gets `AlreadyExists`. Leases and the bucket's store
/// claim are built on this alone.
pub(crate) async fn create_object(
    store: &dyn ObjectStore,
    path: &Path,
    bytes: Vec<u8>,
) -> Result<(), object_store::Error> {
    store
        .put_opts(
            path,
            PutPayload::from(bytes),
            PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            },
        )
        .await
        .map(|_| ())
}

/// Zero-padded, so names sort by generation.
fn generation_name(generation: u64) -> String {
    format!("{generation:020}.json")
}

/// The state of a lease after an attempt to take or renew it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// This process holds this generation.
    Held {
        /// The generation it wrote.
        generation: u64,
    },
    /// Another process holds it.
    HeldByOther {
        /// The generation it wrote.
        generation: u64,
        /// What it says.
        record: LeaseRecord,
    },
}

/// What one process knows of a lease, on its own monotonic clock.
#[derive(Debug, Default)]
struct LeaseClock {
    /// The generation this process holds and until when it trusts it.
    held: Option<(u64, Instant)>,
    /// The newest generation seen and since when it has been the newest.
    seen: Option<(u64, Instant)>,
}

/// One lease as seen by one process.
#[derive(Debug)]
pub struct Lease {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    holder: String,
    replica: String,
    ttl: Duration,
    clock: Mutex<LeaseClock>,
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
        ttl: Duration,
    ) -> Self {
        Self {
            store,
            prefix: Path::from(format!("{LEASES_PREFIX}/{scope}")),
            holder: holder.to_string(),
            replica: replica.to_string(),
            ttl,
            clock: Mutex::new(LeaseClock::default()),
        }
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, LeaseClock> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long this process may still act on the lease; `None` when it
    /// does not hold it (or no longer trusts the generation it wrote).
    pub fn time_left(&self) -> Option<Duration> {
        let (_, until) = self.clock().held?;
        until
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
    }

    /// True while this process holds the lease with more than `margin` left.
    pub fn is_held(&self, margin: Duration) -> bool {
        self.time_left().is_some_and(|left| left > margin)
    }

    fn forget_held(&self) {
        self.clock().held = None;
    }

    /// How long `generation` has been the newest this process has seen,
    /// starting the count when it is new.
    fn seen_for(&self, generation: u64) -> Duration {
        let now = Instant::now();
        let mut clock = self.clock();
        match clock.seen {
            Some((seen, since)) if seen == generation => now.saturating_duration_since(since),
            _ => {
                clock.seen = Some((generation, now));
                Duration::ZERO
            }
        }
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
    pub async fn acquire(&self) -> Result<LeaseState, StorageError> {
        // Trust in what this call writes counts from before it read the
        // lease, so it ends before anyone who sees the write may take over.
        let started = Instant::now();
        let latest = self.latest().await?;
        let seen_for = latest
            .as_ref()
            .map_or(Duration::ZERO, |(generation, _)| self.seen_for(*generation));
        let decision = decide(
            latest.as_ref().map(|(g, r)| (*g, r)),
            &self.holder,
            seen_for,
            self.ttl,
        );
        let generation = match decision {
            LeaseDecision::Write { generation } => generation,
            LeaseDecision::HeldByOther { generation, record } => {
                self.forget_held();
                return Ok(LeaseState::HeldByOther { generation, record });
            }
        };
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let expires_at_ms = crate::store::now_ms()
            .saturating_add(i64::try_from(ttl_ms).unwrap_or(i64::MAX))
            .max(1);
        match self.write(generation, expires_at_ms, ttl_ms).await {
            Ok(()) => {
                self.clock().held = Some((generation, started + self.ttl));
                self.delete_older_than(generation).await;
                Ok(LeaseState::Held { generation })
            }
            Err(StorageError::Bucket {
                source: object_store::Error::AlreadyExists { .. },
                ..
            }) => {
                // Another process wrote this generation first: it holds it.
                self.forget_held();
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

    /// True when this process still trusts its generation and the bucket
    /// still names it as the newest: the check before a step that must not
    /// happen twice (a compaction's output, its deletion of sources).
    pub async fn confirm(&self) -> Result<bool, StorageError> {
        let Some((held, _)) = self.clock().held else {
            return Ok(false);
        };
        if self.time_left().is_none() {
            return Ok(false);
        }
        let newest = self.latest().await?;
        let ours = matches!(&newest, Some((generation, record)) if *generation == held && record.holder == self.holder);
        if !ours {
            self.forget_held();
        }
        Ok(ours)
    }

    /// Runs `action` (`what`, for the error) only while this process holds
    /// the lease, and stops it when the trust in its generation runs out,
    /// so nothing it does lands after another process may have taken over.
    pub async fn fenced<T, F>(&self, what: &'static str, action: F) -> Result<T, StorageError>
    where
        F: Future<Output = Result<T, StorageError>>,
    {
        let lost = || StorageError::LeaseLost {
            lease: self.prefix.to_string(),
            action: what,
        };
        let left = self.time_left().ok_or_else(lost)?;
        tokio::time::timeout(left, action)
            .await
            .map_err(|_elapsed| lost())?
    }

    /// Gives the lease up (a generation that says it is released), so the
    /// next process need not wait for it to lapse. Only when held.
    pub async fn release(&self) -> Result<(), StorageError> {
        if self.clock().held.take().is_none() {
            return Ok(());
        }
        if let Some((generation, record)) = self.latest().await?
            && record.holder == self.holder
        {
            let next = generation.saturating_add(1);
            self.write(next, 0, 0).await?;
            self.delete_older_than(next).await;
        }
        Ok(())
    }

    async fn write(
        &self,
        generation: u64,
        expires_at_ms: i64,
        ttl_ms: u64,
    ) -> Result<(), StorageError> {
        let record = LeaseRecord {
            holder: self.holder.clone(),
            replica: self.replica.clone(),
            expires_at_ms,
            ttl_ms,
        };
        let path = self.prefix.clone().join(generation_name(generation));
        let json = serde_json::to_vec(&record).map_err(|source| StorageError::Lease {
            path: path.to_string(),
            message: source.to_string(),
        })?;
        create_object(self.store.as_ref(), &path, json)
            .await
            .map_err(bucket_err("put", &path))
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
mod tests;

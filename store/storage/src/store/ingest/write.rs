//! The write path's async entries: ingest (decode, check, log, apply in
//! one blocking hop, see `hop`), with or without an idempotency key.

use std::sync::atomic::Ordering;

use kiln_engine::IngestStats;
use kiln_pprof::DecodedProfile;

use super::idempotency;
use super::wal_dir;
use crate::error::StorageError;
use crate::peer_keys::KeysAtPeers;
use crate::store::{IngestRequest, Store, StoreConfig, lock, now_ms};
use crate::wal::WalRecord;

/// The keys of profiles stored recently, at open: the keys file written by
/// the last flush, plus the keys of every record still in the WAL; and
/// those of the WAL's records apart, which replay may drop (a peer stored
/// them meanwhile).
pub(in crate::store) async fn recover_keys(
    config: &StoreConfig,
) -> Result<(idempotency::RecentKeys, Vec<String>), StorageError> {
    let dir = wal_dir(config);
    tokio::task::spawn_blocking(move || {
        let now = now_ms();
        // Read before recovery creates it, on a store's first start.
        std::fs::create_dir_all(&dir).map_err(|source| StorageError::Wal {
            op: "create directory",
            path: dir.clone(),
            source,
        })?;
        let mut keys = idempotency::RecentKeys::decode(&idempotency::load(&dir)?, now);
        let mut in_wal = Vec::new();
        let segments = crate::wal::list_segments(&dir)?;
        crate::wal::reread(&dir, &segments, |replayed| {
            if let Ok(WalRecord {
                idempotency_key: Some(key),
                ..
            }) = replayed.record
            {
                in_wal.push(key.clone());
                keys.remember(key, now);
            }
        })?;
        Ok((keys, in_wal))
    })
    .await
    .map_err(|e| StorageError::task("idempotency keys", e))?
}

impl Store {
    /// Ingests one profile. Returns once the request is in the WAL on stable
    /// storage and applied to the head, so it survives a crash and is
    /// visible to queries. Every check, series labels included, is the
    /// engine's `check_ingest`, run before the request is logged. Callers
    /// bound concurrent writes and their bodies' memory by admitting each
    /// write first ([`Store::admit_ingest`]).
    pub async fn ingest(&self, request: IngestRequest) -> Result<IngestStats, StorageError> {
        self.ingest_profile(request, None, None).await
    }

    /// [`Store::ingest`] for a request whose pprof the caller has decoded
    /// already (and perhaps edited, then encoded): `profile` is what
    /// `request.pprof` decodes to, which replaying the write-ahead log will
    /// do, so the request is not decoded a second time now. The caller
    /// holds the memory `profile` takes in the ingest budget until this
    /// returns.
    pub async fn ingest_decoded(
        &self,
        request: IngestRequest,
        profile: impl Into<DecodedProfile>,
    ) -> Result<IngestStats, StorageError> {
        self.ingest_profile(request, Some(profile.into()), None)
            .await
    }

    /// Like [`Store::ingest`], for a profile the client named with an
    /// idempotency key (a key that passed [`idempotency::check_key`], or
    /// one [`idempotency::profile_key`] derived from it; else a client error): a profile
    /// with a key stored in
    /// the last 15 minutes is not stored again, and the answer is success
    /// (with empty stats), so a client that resends what it did not hear
    /// acknowledged (a batch cut short by a restart) stores it once instead
    /// of doubling the profiles that did arrive.
    pub async fn ingest_once(
        &self,
        request: IngestRequest,
        key: &str,
    ) -> Result<IngestStats, StorageError> {
        self.ingest_keyed(request, key, None).await
    }

    /// [`Store::ingest_once`], and for a resent profile what the peers
    /// said of its key (`peer_lookup`).
    pub(in crate::store) async fn ingest_keyed(
        &self,
        request: IngestRequest,
        key: &str,
        at_peers: Option<&KeysAtPeers>,
    ) -> Result<IngestStats, StorageError> {
        // The key is client text kept in memory, in the WAL and in the
        // keys file: bounded, and printable, so no key reads as more.
        idempotency::check_profile_key(key)
            .map_err(|message| StorageError::InvalidIdempotencyKey { message })?;
        match lock(&self.shared.ingest.recent_keys).begin(key, now_ms()) {
            idempotency::Begin::Stored => {
                self.count_repeat_here();
                return Ok(IngestStats::default());
            }
            idempotency::Begin::InFlight => {
                return Err(StorageError::IdempotencyKeyInFlight {
                    key: key.to_string(),
                });
            }
            idempotency::Begin::New => {}
        }
        // Not remembered as stored here when a peer holds it: this replica
        // must never tell a peer it holds a profile it does not.
        if let Some(settled) = at_peers.and_then(|found| self.settled_at_peers(key, found)) {
            lock(&self.shared.ingest.recent_keys).abort(key);
            return settled;
        }
        let result = self.ingest_profile(request, None, Some(key)).await;
        let mut keys = lock(&self.shared.ingest.recent_keys);
        match &result {
            Ok(_) => keys.commit(key, now_ms()),
            Err(_) => keys.abort(key),
        }
        result
    }

    /// The write in one blocking hop ([`Store::ingest_in_hop`]), once a
    /// turn is free.
    async fn ingest_profile(
        &self,
        request: IngestRequest,
        decoded: Option<DecodedProfile>,
        idempotency_key: Option<&str>,
    ) -> Result<IngestStats, StorageError> {
        if self.shared.ingest.closed.load(Ordering::SeqCst) {
            return Err(StorageError::ShuttingDown);
        }
        let turn = self.ingest_turn().await?;
        let store = self.clone();
        let key = idempotency_key.map(str::to_owned);
        tokio::task::spawn_blocking(move || {
            store.ingest_in_hop(turn, request, decoded, key.as_deref())
        })
        .await
        .map_err(|e| StorageError::task("ingest", e))?
    }
}

//! Idempotency keys: a client that did not hear whether a profile was
//! stored (the connection broke, the store restarted) sends it again with
//! the same key, and the store stores it once. Without them, resending a
//! batch after a partial success stores its first profiles twice.
//!
//! The keys acknowledged within [`WINDOW_MS`] are remembered, at most
//! [`MAX_KEYS`] of them. They survive a restart twice over: a key is logged
//! with its record (WAL record version 2), so replay knows the keys not yet
//! in a block, and each flush writes the window's keys to
//! `<data dir>/wal/idempotency-keys` before it deletes the WAL segments
//! that held them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::StorageError;

/// How long a key is remembered after its profile was stored.
pub const WINDOW_MS: i64 = 15 * 60 * 1000;
/// At most this many keys are remembered (the oldest are forgotten first).
pub const MAX_KEYS: usize = 200_000;
/// Longest key accepted.
pub const MAX_KEY_BYTES: usize = 128;

const FILE: &str = "idempotency-keys";

/// What [`RecentKeys::begin`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// A new key: store the profile, then [`RecentKeys::commit`] or
    /// [`RecentKeys::abort`].
    New,
    /// Stored already: answer success without storing it again.
    Stored,
    /// The same key is being stored right now by another request.
    InFlight,
}

/// The keys of recently stored profiles. Pure.
#[derive(Debug, Default)]
pub struct RecentKeys {
    stored: HashMap<String, i64>,
    /// Keys in the order they were stored, with when.
    order: VecDeque<(String, i64)>,
    in_flight: HashSet<String>,
}

impl RecentKeys {
    /// Claims `key` for a request about to store its profile.
    pub fn begin(&mut self, key: &str, now_ms: i64) -> Begin {
        self.expire(now_ms);
        if self.stored.contains_key(key) {
            return Begin::Stored;
        }
        if !self.in_flight.insert(key.to_string()) {
            return Begin::InFlight;
        }
        Begin::New
    }

    /// The profile of `key` is stored.
    pub fn commit(&mut self, key: &str, now_ms: i64) {
        self.in_flight.remove(key);
        self.remember(key.to_string(), now_ms);
    }

    /// Storing the profile of `key` failed: a retry may store it.
    pub fn abort(&mut self, key: &str) {
        self.in_flight.remove(key);
    }

    /// Remembers a key stored at `at_ms` (from replay or the keys file).
    pub fn remember(&mut self, key: String, at_ms: i64) {
        if self.stored.insert(key.clone(), at_ms).is_none() {
            self.order.push_back((key, at_ms));
        }
        while self.order.len() > MAX_KEYS {
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        if let Some((key, at)) = self.order.pop_front()
            && self.stored.get(&key) == Some(&at)
        {
            self.stored.remove(&key);
        }
    }

    fn expire(&mut self, now_ms: i64) {
        while self
            .order
            .front()
            .is_some_and(|(_, at)| at.saturating_add(WINDOW_MS) < now_ms)
        {
            self.forget_oldest();
        }
    }

    /// Keys remembered now, oldest first, as the keys file holds them.
    pub fn encode(&mut self, now_ms: i64) -> String {
        self.expire(now_ms);
        let mut out = String::new();
        for (key, at) in &self.order {
            out.push_str(&format!("{at} {key}\n"));
        }
        out
    }

    /// Reads what [`RecentKeys::encode`] wrote; lines that do not parse are
    /// skipped (the file is rewritten whole at each flush).
    pub fn decode(text: &str, now_ms: i64) -> Self {
        let mut keys = Self::default();
        for line in text.lines() {
            if let Some((at, key)) = line.split_once(' ')
                && let Ok(at) = at.parse::<i64>()
                && !key.is_empty()
                && key.len() <= MAX_KEY_BYTES
            {
                keys.remember(key.to_string(), at);
            }
        }
        keys.expire(now_ms);
        keys
    }
}

fn keys_io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StorageError {
    let path = path.to_path_buf();
    move |source| StorageError::Wal { op, path, source }
}

/// Where the keys file of a WAL directory is.
pub fn keys_file(wal_dir: &Path) -> PathBuf {
    wal_dir.join(FILE)
}

/// Writes the keys file durably (temp file, fsync, rename, fsync dir).
pub fn save(wal_dir: &Path, text: &str) -> Result<(), StorageError> {
    let path = keys_file(wal_dir);
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp).map_err(keys_io("create keys", &tmp))?;
    file.write_all(text.as_bytes())
        .map_err(keys_io("write keys", &tmp))?;
    file.sync_all().map_err(keys_io("fsync keys", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(keys_io("rename keys", &path))?;
    std::fs::File::open(wal_dir)
        .and_then(|d| d.sync_all())
        .map_err(keys_io("fsync directory", wal_dir))
}

/// Reads the keys file; none when it does not exist yet.
pub fn load(wal_dir: &Path) -> Result<String, StorageError> {
    let path = keys_file(wal_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(err) => Err(keys_io("read keys", &path)(err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_key_is_answered_as_stored_until_the_window_ends() {
        let mut keys = RecentKeys::default();
        assert_eq!(keys.begin("a", 0), Begin::New);
        assert_eq!(keys.begin("a", 1), Begin::InFlight);
        keys.commit("a", 10);
        assert_eq!(keys.begin("a", 10 + WINDOW_MS), Begin::Stored);
        assert_eq!(keys.begin("a", 11 + WINDOW_MS), Begin::New);
    }

    #[test]
    fn a_failed_store_frees_the_key_for_the_retry() {
        let mut keys = RecentKeys::default();
        assert_eq!(keys.begin("a", 0), Begin::New);
        keys.abort("a");
        assert_eq!(keys.begin("a", 0), Begin::New);
    }

    #[test]
    fn the_oldest_keys_go_first_past_the_count_limit() {
        let mut keys = RecentKeys::default();
        for i in 0..=MAX_KEYS {
            keys.remember(format!("k{i}"), 5);
        }
        assert_eq!(keys.begin("k0", 5), Begin::New, "forgotten");
        assert_eq!(keys.begin("k1", 5), Begin::Stored);
    }

    #[test]
    fn keys_round_trip_through_the_file_text_and_expire_on_load() {
        let mut keys = RecentKeys::default();
        keys.remember("old".into(), 0);
        keys.remember("new".into(), WINDOW_MS);
        let text = keys.encode(WINDOW_MS);
        assert_eq!(text, format!("0 old\n{WINDOW_MS} new\n"));
        let mut loaded = RecentKeys::decode(&format!("{text}junk\n"), WINDOW_MS + 1);
        assert_eq!(loaded.begin("old", WINDOW_MS + 1), Begin::New);
        assert_eq!(loaded.begin("new", WINDOW_MS + 1), Begin::Stored);
    }
}

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
//!
//! A key is client text, so nothing in it may steer how the file is read
//! back: keys are 1 to [`MAX_KEY_BYTES`] bytes without control characters
//! (refused as a client error otherwise), and the file holds one
//! length-prefixed, checksummed entry per key after a format header
//! ([`FILE_MAGIC`]), never a separator a key could contain. Earlier
//! releases wrote one `"<ms> <key>\n"` line per key, into which a key with
//! a newline could add entries (one dated far ahead stopped every later
//! key from expiring); such a file is not trusted: it is discarded with a
//! warning, and the keys still in the WAL are recovered from it as always.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::StorageError;

/// How long a key is remembered after its profile was stored.
pub const WINDOW_MS: i64 = 15 * 60 * 1000;
/// At most this many keys are remembered (the oldest are forgotten first).
pub const MAX_KEYS: usize = 200_000;
/// Longest key a client may send.
pub const MAX_KEY_BYTES: usize = 128;
/// Longest key stored: a client's key, or the key of one profile of a
/// series that carried several, `<client key>/<index>` ([`profile_key`]),
/// whose index takes at most 20 digits. Within the keys file's one-byte
/// length.
pub const MAX_PROFILE_KEY_BYTES: usize = MAX_KEY_BYTES + 1 + 20;
/// First bytes of the keys file, naming its format.
pub const FILE_MAGIC: &[u8; 8] = b"KILNKEY2";

const FILE: &str = "idempotency-keys";
/// Bytes around each key in the file: its length (1), time (8), CRC (4).
const ENTRY_OVERHEAD: usize = 1 + 8 + 4;

/// Checks a client's key: 1 to [`MAX_KEY_BYTES`] bytes of text without
/// control characters. Returns what is wrong, for the client.
pub fn check_key(key: &str) -> Result<(), String> {
    check_key_within(key, MAX_KEY_BYTES)
}

/// Checks a key to store: a client's key that passed [`check_key`], or
/// one derived from it by [`profile_key`], so up to
/// [`MAX_PROFILE_KEY_BYTES`].
pub fn check_profile_key(key: &str) -> Result<(), String> {
    check_key_within(key, MAX_PROFILE_KEY_BYTES)
}

/// The key of profile `index` of the `count` in a series a client keyed
/// `key`: the key itself for a series of one, else `<key>/<index>`. A
/// client's longest key must still be usable on a series of several, so
/// the stored keys may be longer than a client's ([`MAX_PROFILE_KEY_BYTES`]).
pub fn profile_key(key: &str, index: usize, count: usize) -> String {
    if count == 1 {
        key.to_string()
    } else {
        format!("{key}/{index}")
    }
}

fn check_key_within(key: &str, limit: usize) -> Result<(), String> {
    if key.is_empty() || key.len() > limit {
        return Err(format!("{} bytes; a key is 1 to {limit} bytes", key.len()));
    }
    if let Some((at, c)) = key.char_indices().find(|(_, c)| c.is_control()) {
        return Err(format!(
            "control character U+{:04X} at byte {at}; a key is printable text",
            u32::from(c)
        ));
    }
    Ok(())
}

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

    /// What is known of `key` here, without claiming it (a peer asking):
    /// [`Begin::New`] for a key neither stored nor being stored.
    pub fn peek(&mut self, key: &str, now_ms: i64) -> Begin {
        self.expire(now_ms);
        if self.stored.contains_key(key) {
            Begin::Stored
        } else if self.in_flight.contains(key) {
            Begin::InFlight
        } else {
            Begin::New
        }
    }

    /// Forgets `key`: its record was dropped at replay because a peer
    /// stored the profile, so this replica no longer holds it and must not
    /// tell a peer it does. Its entry in the order stays behind, stale:
    /// [`RecentKeys::encode`] skips it, and `forget_oldest` pops it.
    pub fn forget(&mut self, key: &str) {
        self.stored.remove(key);
    }

    /// Remembers a key stored at `at_ms` (from replay or the keys file).
    /// A key remembered again at another time gets an entry for that time:
    /// its earlier one is then stale, skipped when written and when
    /// forgotten, so the key expires with its latest time.
    pub fn remember(&mut self, key: String, at_ms: i64) {
        if self.stored.insert(key.clone(), at_ms) != Some(at_ms) {
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

    /// Keys remembered now, oldest first, as the keys file holds them:
    /// [`FILE_MAGIC`], then per key its length (one byte), its time (i64
    /// LE), the key, and a CRC32 of those three (u32 LE).
    pub fn encode(&mut self, now_ms: i64) -> Vec<u8> {
        self.expire(now_ms);
        let mut out = Vec::with_capacity(FILE_MAGIC.len() + self.order.len() * 64);
        out.extend_from_slice(FILE_MAGIC);
        for (key, at) in &self.order {
            // Forgotten, or stale: the key was remembered again later.
            if self.stored.get(key) != Some(at) {
                continue;
            }
            // Every key passed `check_profile_key`; a longer one cannot be
            // stored.
            let Ok(len) = u8::try_from(key.len()) else {
                continue;
            };
            let start = out.len();
            out.push(len);
            out.extend_from_slice(&at.to_le_bytes());
            out.extend_from_slice(key.as_bytes());
            let crc = crc32fast::hash(&out[start..]);
            out.extend_from_slice(&crc.to_le_bytes());
        }
        out
    }

    /// Reads what [`RecentKeys::encode`] wrote. Reading stops at the first
    /// entry that is cut short or fails its CRC (the file is replaced
    /// whole at each flush, so only a damaged disk does that); a file
    /// without the header (an earlier release's text) is not read at all.
    /// A time ahead of `now_ms` (the clock went back) counts as now, so no
    /// entry outlives its window.
    pub fn decode(bytes: &[u8], now_ms: i64) -> Self {
        let mut keys = Self::default();
        if bytes.is_empty() {
            return keys;
        }
        let Some(mut rest) = bytes.strip_prefix(FILE_MAGIC.as_slice()) else {
            tracing::warn!(
                bytes = bytes.len(),
                "the idempotency keys file is in an earlier format, which a key could write entries into; discarding it (keys still in the WAL are kept)"
            );
            return keys;
        };
        while !rest.is_empty() {
            let len = usize::from(rest[0]);
            let Some(entry) = rest.get(..ENTRY_OVERHEAD + len) else {
                tracing::warn!(
                    "the idempotency keys file ends inside an entry; reading no further"
                );
                break;
            };
            let (body, crc) = entry.split_at(1 + 8 + len);
            if crc32fast::hash(body).to_le_bytes().as_slice() != crc {
                tracing::warn!(
                    "an idempotency keys file entry fails its checksum; reading no further"
                );
                break;
            }
            let mut at = [0u8; 8];
            at.copy_from_slice(&body[1..9]);
            let at = i64::from_le_bytes(at).min(now_ms);
            if let Ok(key) = std::str::from_utf8(&body[9..])
                && check_profile_key(key).is_ok()
            {
                keys.remember(key.to_string(), at);
            }
            rest = &rest[entry.len()..];
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
pub fn save(wal_dir: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let path = keys_file(wal_dir);
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp).map_err(keys_io("create keys", &tmp))?;
    file.write_all(bytes).map_err(keys_io("write keys", &tmp))?;
    file.sync_all().map_err(keys_io("fsync keys", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(keys_io("rename keys", &path))?;
    std::fs::File::open(wal_dir)
        .and_then(|d| d.sync_all())
        .map_err(keys_io("fsync directory", wal_dir))
}

/// Reads the keys file; empty when it does not exist yet.
pub fn load(wal_dir: &Path) -> Result<Vec<u8>, StorageError> {
    let path = keys_file(wal_dir);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(bytes),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
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
    fn keys_round_trip_through_the_file_and_expire_on_load() {
        let mut keys = RecentKeys::default();
        keys.remember("old".into(), 0);
        keys.remember("new".into(), WINDOW_MS);
        let bytes = keys.encode(WINDOW_MS);
        let mut loaded = RecentKeys::decode(&bytes, WINDOW_MS + 1);
        assert_eq!(loaded.begin("old", WINDOW_MS + 1), Begin::New);
        assert_eq!(loaded.begin("new", WINDOW_MS + 1), Begin::Stored);
    }

    #[test]
    fn keys_with_control_characters_or_out_of_bounds_lengths_are_refused() {
        for bad in [
            String::new(),
            "k".repeat(MAX_KEY_BYTES + 1),
            "x\n9223372036854775807 victim".to_owned(),
            "tab\there".to_owned(),
            "nul\0".to_owned(),
            "c1\u{85}".to_owned(),
        ] {
            assert!(check_key(&bad).is_err(), "{bad:?}");
        }
        let longest = "k".repeat(MAX_KEY_BYTES);
        for good in ["agent-1/0001", "k", "日本語のキー", longest.as_str()] {
            assert_eq!(check_key(good), Ok(()), "{good:?}");
        }
    }

    /// A client's longest key names each profile of a series of several,
    /// and those keys are stored, remembered and read back from the file.
    #[test]
    fn the_longest_client_key_keys_every_profile_of_a_long_series() {
        let client = "k".repeat(MAX_KEY_BYTES);
        assert_eq!(check_key(&client), Ok(()));
        let last = profile_key(&client, usize::MAX, 2);
        assert_eq!(last.len(), MAX_PROFILE_KEY_BYTES);
        assert_eq!(check_profile_key(&last), Ok(()));
        assert!(check_key(&last).is_err(), "not a key a client may send");
        let mut keys = RecentKeys::default();
        for index in [0, 1, usize::MAX] {
            let key = profile_key(&client, index, 2);
            assert_eq!(keys.begin(&key, 10), Begin::New);
            keys.commit(&key, 10);
        }
        let file = keys.encode(10);
        let mut loaded = RecentKeys::decode(&file, 11);
        assert_eq!(loaded.begin(&last, 11), Begin::Stored);
        assert_eq!(profile_key("k", 0, 1), "k");
    }

    #[test]
    fn no_key_text_can_add_an_entry_to_the_file() {
        // Whatever bytes a key holds (here a newline, spaces and a time,
        // as if checked by an older release), it comes back as one key.
        let mut keys = RecentKeys::default();
        let hostile = "x\n9223372036854775807 victim".to_owned();
        keys.remember(hostile.clone(), 5);
        keys.remember("plain".into(), 6);
        let bytes = keys.encode(10);
        // `decode` checks keys again: the hostile one is dropped, never
        // split into two.
        let mut loaded = RecentKeys::decode(&bytes, 10);
        assert_eq!(loaded.begin("victim", 10), Begin::New);
        assert_eq!(loaded.begin(&hostile, 10), Begin::New);
        assert_eq!(loaded.begin("plain", 10), Begin::Stored);
        // The one entry past it was read: an entry's length, not its
        // text, says where the next begins.
        assert_eq!(loaded.order.len(), 1);
    }

    #[test]
    fn a_damaged_entry_stops_reading_and_an_old_text_file_is_discarded() {
        let mut keys = RecentKeys::default();
        keys.remember("a".into(), 1);
        keys.remember("b".into(), 2);
        let mut bytes = keys.encode(3);
        // Flip a byte of the second key: its CRC fails.
        let last_key = bytes.len() - 5;
        bytes[last_key] ^= 0xff;
        let mut loaded = RecentKeys::decode(&bytes, 3);
        assert_eq!(loaded.begin("a", 3), Begin::Stored);
        assert_eq!(loaded.begin("b", 3), Begin::New);
        // Cut short inside the first entry.
        let loaded = RecentKeys::decode(&bytes[..FILE_MAGIC.len() + 4], 3);
        assert!(loaded.order.is_empty());
        // An earlier release's text file, with an injected entry.
        let old = format!("1 x\n{} victim\n", i64::MAX);
        let mut loaded = RecentKeys::decode(old.as_bytes(), 3);
        assert_eq!(loaded.begin("victim", 3), Begin::New);
        assert!(loaded.order.is_empty());
    }

    #[test]
    fn a_forgotten_key_is_unknown_here_and_left_out_of_the_file() {
        let mut keys = RecentKeys::default();
        keys.remember("dropped".into(), 5);
        keys.remember("kept".into(), 6);
        assert_eq!(keys.begin("busy", 6), Begin::New);
        assert_eq!(keys.peek("dropped", 7), Begin::Stored);
        assert_eq!(keys.peek("busy", 7), Begin::InFlight);
        assert_eq!(keys.peek("other", 7), Begin::New);
        assert_eq!(keys.begin("other", 7), Begin::New, "peek claims nothing");
        keys.forget("dropped");
        assert_eq!(keys.peek("dropped", 7), Begin::New);
        let mut loaded = RecentKeys::decode(&keys.encode(7), 7);
        assert_eq!(loaded.peek("dropped", 7), Begin::New);
        assert_eq!(loaded.peek("kept", 7), Begin::Stored);
        assert_eq!(loaded.order.len(), 1);
        // Stored again later: written once, at its new time, and known
        // until that time's window ends.
        keys.remember("dropped".into(), 9);
        let mut loaded = RecentKeys::decode(&keys.encode(9), 9);
        assert_eq!(loaded.order.len(), 2);
        assert_eq!(loaded.peek("dropped", 9 + WINDOW_MS), Begin::Stored);
        assert_eq!(loaded.peek("dropped", 10 + WINDOW_MS), Begin::New);
        // A key remembered at a later time (its record replayed after the
        // keys file was read) expires with that time, not the first.
        let mut keys = RecentKeys::default();
        keys.remember("twice".into(), 1);
        keys.remember("twice".into(), 50);
        assert_eq!(keys.peek("twice", 50 + WINDOW_MS), Begin::Stored);
        assert_eq!(keys.peek("twice", 51 + WINDOW_MS), Begin::New);
    }

    #[test]
    fn a_time_ahead_of_the_clock_expires_like_now() {
        let mut keys = RecentKeys::default();
        keys.remember("ahead".into(), i64::MAX);
        let bytes = keys.encode(0);
        let mut loaded = RecentKeys::decode(&bytes, 100);
        assert_eq!(loaded.begin("ahead", 100 + WINDOW_MS), Begin::Stored);
        assert_eq!(loaded.begin("ahead", 101 + WINDOW_MS), Begin::New);
    }
}

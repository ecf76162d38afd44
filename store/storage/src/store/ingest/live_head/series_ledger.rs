//! The census of the series a store retains: those of the live head, of
//! the heads waiting for upload and of the bucket's blocks within
//! retention. The series limits count against it, so a series is new only
//! when nothing retained holds it. Counting the live head alone, a writer
//! could make `max_series` fresh series in every head window, each window
//! flushed to a block and forgotten, and blocks, listings and queries
//! grew without bound until retention.
//!
//! An entry is a 64-bit fingerprint of the series' labels (SipHash under
//! keys drawn at open, so no client can aim a collision at another
//! series), its profile name's and namespace's interned ids, and the
//! newest time it was seen. A fingerprint collision makes a new series
//! look held: at a million series the odds are about 1 in 3×10^7.
//!
//! Pure logic, no IO: the store fills it from the heads it applies to and
//! from the blocks it lists (`catalog::series_census`).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use kiln_engine::SeriesCensus;
use kiln_engine::model::{LabelSet, NAMESPACE_LABEL};

use crate::store::catalog::SeriesCensusStats;

/// Heap bytes of one table slot: the fingerprint and its [`Entry`], plus
/// the table's control byte.
const SLOT_BYTES: usize = std::mem::size_of::<(u64, Entry)>() + 1;

/// The store's retained series, with counts per profile name, per
/// namespace and in all.
#[derive(Debug)]
pub(in crate::store) struct SeriesLedger {
    keys: std::hash::RandomState,
    entries: HashMap<u64, Entry, BuildHasherDefault<Fingerprinted>>,
    names: Tally,
    namespaces: Tally,
    /// Most entries held: past it a series is not recorded (and counted in
    /// `dropped`). At least the store's `max_series`, so a full ledger
    /// holds more series than the limit lets a writer add to, and new
    /// series are refused.
    capacity: usize,
    dropped: u64,
    /// Blocks whose series are counted.
    blocks: HashSet<Box<str>>,
    /// Blocks whose series could not be read (retried at each listing).
    unreadable: HashSet<Box<str>>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    name: u32,
    namespace: u32,
    newest_ms: i64,
}

impl SeriesLedger {
    /// An empty ledger holding at most `capacity` series.
    pub(in crate::store) fn new(capacity: usize) -> Self {
        Self {
            keys: std::hash::RandomState::new(),
            entries: HashMap::default(),
            names: Tally::default(),
            namespaces: Tally::default(),
            capacity,
            dropped: 0,
            blocks: HashSet::new(),
            unreadable: HashSet::new(),
        }
    }

    fn fingerprint(&self, labels: &LabelSet) -> u64 {
        self.keys.hash_one(labels)
    }

    /// Records that the series `labels` of profile `name` holds data as
    /// new as `newest_ms`; a series already held keeps the newer time.
    pub(in crate::store) fn note(&mut self, labels: &LabelSet, name: &str, newest_ms: i64) {
        let key = self.fingerprint(labels);
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.newest_ms = entry.newest_ms.max(newest_ms);
            return;
        }
        if self.entries.len() >= self.capacity {
            self.dropped = self.dropped.saturating_add(1);
            return;
        }
        let entry = Entry {
            name: self.names.add(name),
            namespace: self
                .namespaces
                .add(labels.get(NAMESPACE_LABEL).unwrap_or("")),
            newest_ms,
        };
        self.entries.insert(key, entry);
    }

    /// Forgets the series whose newest data is older than
    /// `oldest_kept_ms` (past retention); returns how many.
    pub(in crate::store) fn expire(&mut self, oldest_kept_ms: i64) -> usize {
        let before = self.entries.len();
        let (names, namespaces) = (&mut self.names, &mut self.namespaces);
        self.entries.retain(|_, entry| {
            let keep = entry.newest_ms >= oldest_kept_ms;
            if !keep {
                names.remove(entry.name);
                namespaces.remove(entry.namespace);
            }
            keep
        });
        // A table that shrank to a quarter gives its memory back.
        if self.entries.capacity() > 4 * self.entries.len().max(1024) {
            self.entries.shrink_to_fit();
        }
        before - self.entries.len()
    }

    /// True when block `id`'s series are counted already.
    pub(in crate::store) fn counts_block(&self, id: &str) -> bool {
        self.blocks.contains(id)
    }

    /// Records that block `id`'s series are counted.
    pub(in crate::store) fn note_block(&mut self, id: &str) {
        self.unreadable.remove(id);
        self.blocks.insert(id.into());
    }

    /// Records that block `id`'s series could not be read.
    pub(in crate::store) fn note_unreadable(&mut self, id: &str) {
        self.unreadable.insert(id.into());
    }

    /// Forgets the blocks for which `listed` is false (deleted by
    /// retention or compaction), so the sets stay as large as the view.
    pub(in crate::store) fn keep_blocks(&mut self, listed: impl Fn(&str) -> bool) {
        self.blocks.retain(|id| listed(id));
        self.unreadable.retain(|id| listed(id));
    }

    /// What the ledger holds, for metrics.
    pub(in crate::store) fn stats(&self) -> SeriesCensusStats {
        SeriesCensusStats {
            series: self.entries.len() as u64,
            namespaces: self.namespaces.live() as u64,
            bytes: self.approx_bytes() as u64,
            unreadable_blocks: self.unreadable.len() as u64,
            dropped_series: self.dropped,
        }
    }

    /// Approximate heap bytes: the table's slots (a table keeps at most
    /// 7 of each 8 slots full) plus the names and block ids.
    pub(in crate::store) fn approx_bytes(&self) -> usize {
        let slots = self.entries.capacity().saturating_mul(8) / 7;
        let ids: usize = self
            .blocks
            .iter()
            .chain(&self.unreadable)
            .map(|id| id.len() + 32)
            .sum();
        slots * SLOT_BYTES + self.names.approx_bytes() + self.namespaces.approx_bytes() + ids
    }
}

impl SeriesCensus for SeriesLedger {
    fn holds_series(&self, labels: &LabelSet) -> bool {
        self.entries.contains_key(&self.fingerprint(labels))
    }

    fn series_total(&self) -> usize {
        self.entries.len()
    }

    fn series_for_name(&self, name: &str) -> usize {
        self.names.count(name)
    }

    fn series_for_namespace(&self, namespace: &str) -> usize {
        self.namespaces.count(namespace)
    }
}

/// Strings interned to ids, with the entries naming each; an id whose
/// count falls to zero is freed, so expired names do not accumulate.
#[derive(Debug, Default)]
struct Tally {
    ids: HashMap<Box<str>, u32>,
    slots: Vec<Slot>,
    free: Vec<u32>,
}

#[derive(Debug, Default)]
struct Slot {
    name: Box<str>,
    count: usize,
}

impl Tally {
    fn add(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            self.slots[id as usize].count += 1;
            return id;
        }
        let slot = Slot {
            name: name.into(),
            count: 1,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = slot;
                id
            }
            None => {
                // Ids are per distinct name, and names per series, which
                // the ledger's capacity bounds far below 2^32.
                let id = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(slot);
                id
            }
        };
        self.ids.insert(name.into(), id);
        id
    }

    fn remove(&mut self, id: u32) {
        let Some(slot) = self.slots.get_mut(id as usize) else {
            return;
        };
        slot.count = slot.count.saturating_sub(1);
        if slot.count == 0 {
            let name = std::mem::take(&mut slot.name);
            self.ids.remove(&name);
            self.free.push(id);
        }
    }

    fn count(&self, name: &str) -> usize {
        self.ids
            .get(name)
            .map_or(0, |&id| self.slots[id as usize].count)
    }

    fn live(&self) -> usize {
        self.ids.len()
    }

    fn approx_bytes(&self) -> usize {
        let names: usize = self.ids.keys().map(|n| 2 * n.len() + 64).sum();
        names + self.slots.capacity() * std::mem::size_of::<Slot>()
    }
}

/// A hasher for keys that are fingerprints already: it passes the key
/// through instead of hashing it again.
#[derive(Debug, Default)]
struct Fingerprinted(u64);

impl Hasher for Fingerprinted {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys reach here; any other input is folded in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_engine::model::Label;

    fn series(namespace: &str, pod: usize) -> LabelSet {
        LabelSet::new(vec![
            Label::new("__name__", "process_cpu"),
            Label::new("namespace", namespace),
            Label::new("pod", format!("pod-{pod}")),
        ])
    }

    #[test]
    fn a_series_noted_twice_counts_once_and_keeps_its_newest_time() {
        let mut ledger = SeriesLedger::new(100);
        ledger.note(&series("shop", 1), "process_cpu", 1_000);
        ledger.note(&series("shop", 1), "process_cpu", 5_000);
        ledger.note(&series("shop", 1), "process_cpu", 2_000);
        assert_eq!(ledger.series_total(), 1);
        assert!(ledger.holds_series(&series("shop", 1)));
        assert!(!ledger.holds_series(&series("shop", 2)));
        assert_eq!(ledger.expire(4_000), 0, "its newest time is 5,000");
        assert_eq!(ledger.expire(6_000), 1);
        assert!(!ledger.holds_series(&series("shop", 1)));
    }

    #[test]
    fn counts_per_name_and_namespace_follow_notes_and_expiry() {
        let mut ledger = SeriesLedger::new(100);
        for pod in 0..3 {
            ledger.note(&series("shop", pod), "process_cpu", 1_000);
        }
        for pod in 0..2 {
            ledger.note(&series("bank", pod), "memory", 9_000);
        }
        let unlabelled = LabelSet::new(vec![Label::new("__name__", "process_cpu")]);
        ledger.note(&unlabelled, "process_cpu", 9_000);
        assert_eq!(ledger.series_total(), 6);
        assert_eq!(ledger.series_for_name("process_cpu"), 4);
        assert_eq!(ledger.series_for_name("memory"), 2);
        assert_eq!(ledger.series_for_namespace("shop"), 3);
        assert_eq!(ledger.series_for_namespace("bank"), 2);
        assert_eq!(ledger.series_for_namespace(""), 1);
        assert_eq!(ledger.stats().namespaces, 3);
        assert_eq!(ledger.expire(5_000), 3);
        assert_eq!(ledger.series_for_namespace("shop"), 0);
        assert_eq!(ledger.series_for_name("process_cpu"), 1);
        assert_eq!(
            ledger.stats().namespaces,
            2,
            "an emptied namespace is freed"
        );
        // A freed id is reused for the next new name.
        ledger.note(&series("fresh", 0), "process_cpu", 9_000);
        assert_eq!(ledger.series_for_namespace("fresh"), 1);
        assert_eq!(ledger.series_for_namespace("bank"), 2);
        assert_eq!(ledger.stats().namespaces, 3);
    }

    #[test]
    fn a_full_ledger_records_no_more_series_and_says_so() {
        let mut ledger = SeriesLedger::new(4);
        for pod in 0..6 {
            ledger.note(&series("shop", pod), "process_cpu", 1_000);
        }
        assert_eq!(ledger.series_total(), 4);
        assert_eq!(ledger.stats().dropped_series, 2);
        // A held series is still refreshed.
        ledger.note(&series("shop", 0), "process_cpu", 9_000);
        assert_eq!(ledger.expire(5_000), 3);
        assert!(ledger.holds_series(&series("shop", 0)));
    }

    #[test]
    fn blocks_are_counted_once_and_forgotten_when_unlisted() {
        let mut ledger = SeriesLedger::new(10);
        ledger.note_unreadable("b1");
        assert!(!ledger.counts_block("b1"));
        assert_eq!(ledger.stats().unreadable_blocks, 1);
        ledger.note_block("b1");
        ledger.note_block("b2");
        assert!(ledger.counts_block("b1"));
        assert_eq!(ledger.stats().unreadable_blocks, 0);
        ledger.note_unreadable("b3");
        ledger.keep_blocks(|id| id == "b2");
        assert!(!ledger.counts_block("b1"));
        assert!(ledger.counts_block("b2"));
        assert_eq!(ledger.stats().unreadable_blocks, 0);
    }

    /// Prints the measured bytes per series (docs/storage-internals.md
    /// quotes it) and checks the estimate stays within its documented range.
    #[test]
    fn a_series_costs_the_ledger_a_few_dozen_bytes() {
        let mut ledger = SeriesLedger::new(usize::MAX);
        let count = 200_000;
        for pod in 0..count {
            ledger.note(
                &series(&format!("ns-{}", pod % 50), pod),
                "process_cpu",
                1_000,
            );
        }
        let per_series = ledger.approx_bytes() as f64 / count as f64;
        println!("ledger: {count} series, {per_series:.1} bytes per series");
        assert!(
            (20.0..80.0).contains(&per_series),
            "{per_series} bytes per series"
        );
    }
}

//! The live head, sharded: ingest applies a profile under one shard's write
//! lock, so profiles bound for different shards apply in parallel instead
//! of queueing on one lock (issue 13). A profile's shard follows its
//! workload: its request labels less those that tell replicas apart
//! (`kiln_engine::model::INSTANCE_LABELS`: pod, node, ...). Replicas run the
//! same code, so their stacks are interned once, in one shard; by the full
//! label set, every shard interned nearly every stack of every workload,
//! and two shards cost 16 % more ingest CPU and 56 % more flush CPU than one
//! (docs/benchmarks/log/2026-11-27-store-cpu-allocators-shards.md). A
//! flush encodes every shard into one block (`kiln_engine::encode_heads`),
//! so shards never show in the bucket.
//!
//! The series limits count against the store's census of retained series
//! (`series_ledger`): every series an apply creates is noted there, so a
//! series flushed to a block still counts, and one a block holds is not
//! new when a writer comes back to it.
//!
//! Where the shards' locks and apply turns sit in the store's lock order is
//! written once, in the `store` module's documentation; the census's lock
//! is a leaf, taken under a shard's write lock by an apply.

mod series_ledger;

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kiln_engine::model::LabelSet;
use kiln_engine::{CheckedIngest, Head, IngestError, IngestLimits};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::store::{lock, now_ms, read, write};
pub(in crate::store) use series_ledger::SeriesLedger;

/// The most shards a store uses, whatever its core count: past this the
/// symbols repeated in every shard cost more memory than the lock saves.
pub(in crate::store) const MAX_SHARDS: usize = 16;

/// The live head's shards and the WAL segment they start at.
#[derive(Debug)]
pub(in crate::store) struct LiveHead {
    shards: Box<[RwLock<Head>]>,
    /// Each shard's `approx_bytes` after its last change, so the size checks
    /// every ingest makes take no lock.
    shard_bytes: Box<[AtomicUsize]>,
    /// One apply turn per shard: an apply waits here for the applies ahead
    /// of it in its shard, holding no ingest turn (on its blocking-pool
    /// thread, which sleeps: a turn held asleep would leave a core idle).
    apply_turns: Box<[Arc<AsyncMutex<()>>]>,
    /// The first WAL segment whose records the live head holds. Moves only
    /// in a cut, which holds every shard's write lock.
    first_segment: AtomicU64,
    /// Keys fixed at open: a request's shard never changes while the store runs.
    hasher: std::hash::RandomState,
    /// Every series the store retains: the shards', the heads' waiting for
    /// upload and the blocks'. The series limits count against it.
    census: Mutex<SeriesLedger>,
}

impl LiveHead {
    /// `shards` shards (at least 1, at most [`MAX_SHARDS`]); shard 0 starts
    /// with `head` (what WAL replay left), the others empty. The census
    /// starts with `head`'s series and holds at most `census_capacity`.
    pub(in crate::store) fn new(
        shards: usize,
        head: Head,
        first_segment: u64,
        census_capacity: usize,
    ) -> Self {
        let count = shards.clamp(1, MAX_SHARDS);
        let mut census = SeriesLedger::new(census_capacity);
        note_series(&mut census, &head, 0);
        let mut heads = Vec::with_capacity(count);
        let mut bytes = Vec::with_capacity(count);
        bytes.push(AtomicUsize::new(head.approx_bytes()));
        heads.push(RwLock::new(head));
        for _ in 1..count {
            heads.push(RwLock::new(Head::new()));
            bytes.push(AtomicUsize::new(0));
        }
        Self {
            shards: heads.into_boxed_slice(),
            shard_bytes: bytes.into_boxed_slice(),
            apply_turns: (0..count).map(|_| Arc::new(AsyncMutex::new(()))).collect(),
            first_segment: AtomicU64::new(first_segment),
            hasher: std::hash::RandomState::new(),
            census: Mutex::new(census),
        }
    }

    /// The census of retained series, locked: a leaf lock, held for a few
    /// lookups or notes.
    pub(in crate::store) fn census(&self) -> MutexGuard<'_, SeriesLedger> {
        lock(&self.census)
    }

    /// Notes every series of `heads` (heads waiting for upload) in the
    /// census, as seen now.
    pub(in crate::store) fn note_heads(&self, heads: &[Head]) {
        let mut census = self.census();
        for head in heads {
            note_series(&mut census, head, 0);
        }
    }

    /// How many shards there are.
    #[cfg(test)]
    pub(in crate::store) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard a request with these labels applies to: the same for
    /// every replica of a workload.
    pub(in crate::store) fn shard_of(&self, labels: &LabelSet) -> usize {
        let mut hasher = self.hasher.build_hasher();
        for label in labels.workload_labels() {
            label.hash(&mut hasher);
        }
        let hash = hasher.finish();
        // The shard count is at most MAX_SHARDS, so the remainder fits.
        usize::try_from(hash % self.shards.len() as u64).unwrap_or(0)
    }

    /// Approximate bytes of every shard together, without a lock.
    pub(in crate::store) fn approx_bytes(&self) -> usize {
        self.shard_bytes
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }

    /// The index of shard `shard`, clamped to the shards there are.
    fn index(&self, shard: usize) -> usize {
        shard.min(self.shards.len() - 1)
    }

    /// Read locks on every shard, in order. Held together, they see the
    /// head between two cuts: a query snapshots the view under them.
    pub(in crate::store) fn read_all(&self) -> Vec<RwLockReadGuard<'_, Head>> {
        self.shards.iter().map(read).collect()
    }

    /// Counts the series `checked` would create in shard `shard` against
    /// `limits`. Most profiles write only series their shard holds already:
    /// those read that one shard, so a check waits for no apply in another
    /// shard. A profile with a new series counts against the store's
    /// census of retained series (which holds every shard's too), as the
    /// limits are the store's and count what it keeps, not only its head.
    pub(in crate::store) fn count_series(
        &self,
        shard: usize,
        checked: &CheckedIngest,
        limits: &IngestLimits,
    ) -> Result<(), IngestError> {
        if checked.writes_only_held_series(&*read(&self.shards[self.index(shard)])) {
            return Ok(());
        }
        checked.count_series(&*self.census(), limits)
    }

    /// Waits for shard `shard`'s apply turn: the applies queued ahead in
    /// that shard have finished, so its write lock is free but for cuts,
    /// queries and checks, which hold it briefly. An ingest waits on its
    /// blocking-pool thread, which sleeps here instead of hopping back to
    /// the runtime to wait.
    ///
    /// Blocking: never call it on an async worker.
    pub(in crate::store) fn apply_turn_blocking(&self, shard: usize) -> OwnedMutexGuard<()> {
        Arc::clone(&self.apply_turns[self.index(shard)]).blocking_lock_owned()
    }

    /// Applies `change` to shard `shard` under its write lock, then records
    /// the shard's new size; returns what `change` returned and that size
    /// summed over all shards.
    pub(in crate::store) fn apply<T>(
        &self,
        shard: usize,
        change: impl FnOnce(&mut Head) -> T,
    ) -> (T, usize) {
        let index = self.index(shard);
        let mut head = write(&self.shards[index]);
        let series_before = head.series_count();
        let result = change(&mut head);
        if head.series_count() > series_before {
            note_series(&mut self.census(), &head, series_before);
        }
        self.shard_bytes[index].store(head.approx_bytes(), Ordering::Relaxed);
        drop(head);
        (result, self.approx_bytes())
    }

    /// True when no shard holds a value.
    pub(in crate::store) fn is_empty(&self) -> bool {
        self.read_all().iter().all(|h| h.is_empty())
    }

    /// Profiles in every shard.
    pub(in crate::store) fn profiles(&self) -> u64 {
        self.read_all().iter().map(|h| h.profiles()).sum()
    }

    /// Takes every shard's contents, leaving empty shards that start at WAL
    /// segment `new_first_segment`; returns the contents and the segment
    /// they started at. `publish` runs while every shard is still
    /// write-locked, so whatever it makes visible (the frozen head) appears
    /// in the same instant the data leaves the live head.
    pub(in crate::store) fn cut(
        &self,
        new_first_segment: u64,
        publish: impl FnOnce(Vec<Head>, u64),
    ) {
        let mut guards: Vec<RwLockWriteGuard<'_, Head>> = self.shards.iter().map(write).collect();
        let heads: Vec<Head> = guards
            .iter_mut()
            .map(|guard| std::mem::take(&mut **guard))
            .collect();
        for bytes in self.shard_bytes.iter() {
            bytes.store(0, Ordering::Relaxed);
        }
        let first = self
            .first_segment
            .swap(new_first_segment, Ordering::Relaxed);
        publish(heads, first);
        drop(guards);
    }
}

/// Notes in `census` the series of `head` from its `first`th on, as seen
/// now: a series written now counts for a retention period from now,
/// whatever its profiles' times.
fn note_series(census: &mut SeriesLedger, head: &Head, first: usize) {
    let newest_ms = head
        .time_bounds()
        .map_or(now_ms(), |(_, max)| max.max(now_ms()));
    for (labels, name) in head.series_from(first) {
        census.note(labels, name, newest_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_engine::model::Label;

    fn labels(service: usize, pod: usize, name: &str) -> LabelSet {
        LabelSet::new(vec![
            Label::new("__name__", name),
            Label::new("namespace", "shop"),
            Label::new("service_name", format!("svc-{service}")),
            Label::new("container", "app"),
            Label::new("pod", format!("svc-{service}-{pod}")),
            Label::new("node", format!("node-{}", pod % 7)),
        ])
    }

    #[test]
    fn replicas_of_a_workload_share_a_shard_and_workloads_spread_over_all() {
        let live = LiveHead::new(4, Head::new(), 1, 1 << 20);
        let mut used = [0usize; 4];
        for service in 0..400 {
            let shard = live.shard_of(&labels(service, 0, "process_cpu"));
            for pod in 1..5 {
                for name in ["process_cpu", "memory"] {
                    assert_eq!(
                        live.shard_of(&labels(service, pod, name)),
                        shard,
                        "svc-{service} pod {pod} {name}"
                    );
                }
            }
            used[shard] += 1;
        }
        assert!(used.iter().all(|&n| n > 50), "uneven spread: {used:?}");
        // A label that names another workload moves it.
        let other = LabelSet::new(vec![Label::new("container", "sidecar")]);
        let moved = (0..64).any(|i| {
            let mut set: Vec<Label> = labels(i, 0, "process_cpu").iter().cloned().collect();
            set.extend(other.iter().cloned());
            live.shard_of(&LabelSet::new(set)) != live.shard_of(&labels(i, 0, "process_cpu"))
        });
        assert!(moved, "the container label is part of the workload");
    }

    /// A one-stack CPU profile.
    fn cpu_profile() -> kiln_pprof::Profile {
        let mut b = kiln_pprof::ProfileBuilder::new(&[("cpu", "nanoseconds")]);
        let f = b.function(&kiln_pprof::FunctionSpec {
            name: "main".into(),
            ..Default::default()
        });
        let loc = b.location(0, 0x1000, &[(f, 1)]);
        b.sample(&[loc], &[10], &[]);
        let bytes = kiln_pprof::encode_gzip(&b.finish());
        kiln_pprof::decode(&bytes, &kiln_pprof::DecodeLimits::default()).expect("decodes")
    }

    fn checked(labels: &LabelSet, limits: &IngestLimits) -> CheckedIngest {
        CheckedIngest::prepare(cpu_profile(), labels, 10_000_000_000, limits).expect("prepare")
    }

    /// Two workloads whose requests apply to different shards of `live`.
    fn workloads_in_two_shards(live: &LiveHead) -> (LabelSet, LabelSet) {
        let first = labels(0, 0, "process_cpu");
        let other = (1..64)
            .map(|service| labels(service, 0, "process_cpu"))
            .find(|l| live.shard_of(l) != live.shard_of(&first))
            .expect("64 workloads span more than one of 4 shards");
        (first, other)
    }

    #[test]
    fn a_profile_of_held_series_is_counted_while_another_shard_is_write_locked() {
        let live = std::sync::Arc::new(LiveHead::new(4, Head::new(), 1, 1 << 20));
        let limits = IngestLimits::default();
        let (held, busy) = workloads_in_two_shards(&live);
        let shard = live.shard_of(&held);
        live.count_series(shard, &checked(&held, &limits), &limits)
            .expect("a first series is within the limits");
        live.apply(shard, |head| {
            head.apply_checked(checked(&held, &limits), 1_000)
        });
        // An apply in another shard holds its write lock all the while.
        let _apply = write(&live.shards[live.shard_of(&busy)]);
        let (sender, answer) = std::sync::mpsc::channel();
        let counter = std::sync::Arc::clone(&live);
        std::thread::spawn(move || {
            let result = counter.count_series(shard, &checked(&held, &limits), &limits);
            let _ = sender.send(result.is_ok());
        });
        let counted = answer.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(
            counted,
            Ok(true),
            "a check of a held series waited on another shard's apply"
        );
    }

    #[test]
    fn a_new_series_counts_against_every_shard() {
        let live = LiveHead::new(4, Head::new(), 1, 1 << 20);
        let limits = IngestLimits {
            max_series: 1,
            ..IngestLimits::default()
        };
        let (first, second) = workloads_in_two_shards(&live);
        let shard = live.shard_of(&first);
        live.apply(shard, |head| {
            head.apply_checked(checked(&first, &limits), 1_000)
        });
        live.count_series(shard, &checked(&first, &limits), &limits)
            .expect("the held series is not new");
        let err = live
            .count_series(live.shard_of(&second), &checked(&second, &limits), &limits)
            .expect_err("a second series is over a store-wide limit of one");
        assert!(err.to_string().contains("series"), "{err}");
    }

    #[test]
    fn a_series_cut_from_the_head_still_counts_and_is_not_new_when_written_again() {
        let live = LiveHead::new(4, Head::new(), 1, 1 << 20);
        let limits = IngestLimits {
            max_series: 1,
            ..IngestLimits::default()
        };
        let (first, second) = workloads_in_two_shards(&live);
        let shard = live.shard_of(&first);
        live.apply(shard, |head| {
            head.apply_checked(checked(&first, &limits), 1_000)
        });
        live.cut(2, |heads, _| assert_eq!(heads.len(), 4));
        assert!(live.is_empty());
        live.count_series(shard, &checked(&first, &limits), &limits)
            .expect("a series the cut head holds is not new");
        let err = live
            .count_series(live.shard_of(&second), &checked(&second, &limits), &limits)
            .expect_err("the cut head's series still counts against a limit of one");
        assert!(
            matches!(err, IngestError::TooManySeriesInStore { .. }),
            "{err}"
        );
    }

    #[test]
    fn an_apply_turn_waits_only_for_applies_in_its_own_shard() {
        let live = LiveHead::new(4, Head::new(), 1, 1 << 20);
        let (first, other) = workloads_in_two_shards(&live);
        let (shard, other_shard) = (live.shard_of(&first), live.shard_of(&other));
        let held = live.apply_turn_blocking(shard);
        // Another shard's turn is free while this one is held.
        drop(live.apply_turn_blocking(other_shard));
        let waited = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| {
                let _turn = live.apply_turn_blocking(shard);
                waited.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(
                !waited.load(Ordering::SeqCst),
                "two applies in one shard had turns at once"
            );
            drop(held);
            waiter.join().expect("the turn came back");
        });
        assert!(waited.load(Ordering::SeqCst));
    }

    #[test]
    fn shard_count_is_clamped() {
        assert_eq!(LiveHead::new(0, Head::new(), 1, 1 << 20).shard_count(), 1);
        assert_eq!(
            LiveHead::new(1000, Head::new(), 1, 1 << 20).shard_count(),
            MAX_SHARDS
        );
    }
}

//! Recorded series beside the blocks: every profile's value is counted
//! exactly once whatever happens to the files holding it — a flush (the
//! head waiting for upload and its file), a crash with points only in the
//! WAL, merges into hours and days, a merge that crashed before deleting
//! its sources, retention, and a flush whose block never arrived.
//!
//! Expected values come from the profiles themselves (the sum of their CPU
//! samples) and are checked against the store's own profile totals too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kiln_engine::model::{MatchOp, Matcher};
use kiln_engine::recording::{FunctionFilter, RecordingRule, RecordingRules, Steps, bucket_of};
use kiln_storage::store::RecordedUpkeep;
use kiln_storage::{Store, StoreConfig};
use kiln_testkit::profiles::*;

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;
const METRIC: &str = "cpu_nanoseconds_by_pod";
const REPLICA: &str = "r1";

/// All CPU time, summed per pod.
fn rule() -> RecordingRule {
    RecordingRule::new(
        METRIC,
        cpu_type(),
        false,
        &[],
        FunctionFilter::Any,
        &["pod".to_owned()],
    )
    .expect("rule compiles")
}

fn recording_config(root: &Path) -> StoreConfig {
    let mut config = config(&root.join("data"), REPLICA);
    config.recording_rules = Arc::new(RecordingRules::new(vec![rule()]).expect("one rule"));
    config
}

async fn open(root: &Path, config: StoreConfig) -> Store {
    Store::open(config, local_bucket(&root.join("bucket")))
        .await
        .expect("open store")
}

/// Ingests one CPU profile for `pod` at `time_ms`; returns its total.
async fn ingest(store: &Store, pod: &str, time_ms: i64, seed: u64) -> i64 {
    let (pprof, total) = cpu_profile(seed, 12);
    store
        .ingest(request(pod, time_ms, pprof))
        .await
        .expect("ingest");
    total
}

/// The rule's points in `[from_ms, to_ms)`, summed per pod.
async fn recorded_by_pod(store: &Store, from_ms: i64, to_ms: i64) -> BTreeMap<String, i64> {
    let matchers = [Matcher {
        name: "__name__".into(),
        op: MatchOp::Equal,
        value: METRIC.into(),
    }];
    let points = store
        .recorded_points(&matchers, Steps::raw(from_ms, to_ms))
        .await
        .expect("recorded points");
    let mut sums = BTreeMap::new();
    for (labels, series) in points.series() {
        let pod = labels.get("pod").unwrap_or_default().to_owned();
        *sums.entry(pod).or_insert(0) += series.values().sum::<i64>();
    }
    sums
}

async fn recorded_sum(store: &Store, from_ms: i64, to_ms: i64) -> i64 {
    recorded_by_pod(store, from_ms, to_ms).await.values().sum()
}

fn recorded_dir(root: &Path) -> PathBuf {
    root.join("bucket/recorded").join(REPLICA)
}

/// The recorded files in the bucket, by name.
fn recorded_files(root: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(recorded_dir(root)) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".krec"))
        .collect();
    names.sort();
    names
}

fn files_of_kind(root: &Path, prefix: &str) -> Vec<String> {
    recorded_files(root)
        .into_iter()
        .filter(|name| name.starts_with(prefix))
        .collect()
}

/// A UTC midnight after the fixtures' base time.
fn day0() -> i64 {
    (BASE_MS.div_euclid(DAY_MS) + 1) * DAY_MS
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_points_survive_flush_and_restart_counted_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open(root.path(), recording_config(root.path())).await;
    let (from, to) = (BASE_MS - DAY_MS, BASE_MS + DAY_MS);
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..9u64 {
        let pod = format!("pod-{}", i % 3);
        let total = ingest(&store, &pod, BASE_MS + i as i64 * 7_000, i).await;
        *expected.entry(pod).or_insert(0) += total;
    }
    let all: i64 = expected.values().sum();
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        all,
        "the profiles' own totals"
    );
    assert_eq!(
        recorded_by_pod(&store, from, to).await,
        expected,
        "live points"
    );
    let counters: i64 = store.recorded_totals().iter().map(|(_, t)| t).sum();
    assert_eq!(counters, all, "counters since start");

    store.flush().await.expect("flush");
    assert_eq!(
        recorded_by_pod(&store, from, to).await,
        expected,
        "after a flush: the file, not also the head it came from"
    );
    let flushed = files_of_kind(root.path(), "f_");
    assert_eq!(flushed.len(), 1, "one flush file: {flushed:?}");
    assert_eq!(recorded_files(root.path()), flushed, "nothing else");

    // More profiles, then a crash: they are only in the WAL.
    for i in 9..14u64 {
        let pod = format!("pod-{}", i % 3);
        let total = ingest(&store, &pod, BASE_MS + i as i64 * 7_000, i).await;
        *expected.entry(pod).or_insert(0) += total;
    }
    let all: i64 = expected.values().sum();
    assert_eq!(recorded_by_pod(&store, from, to).await, expected);
    drop(store);

    let store = open(root.path(), recording_config(root.path())).await;
    assert_eq!(store.replay_report().records, 5, "the unflushed profiles");
    assert_eq!(
        recorded_by_pod(&store, from, to).await,
        expected,
        "after a crash: the file once, the replayed profiles once"
    );
    assert_eq!(total(&store, &all_selector(), everything()).await, all);
    assert_eq!(recorded_files(root.path()), flushed, "the file was kept");

    store.flush().await.expect("flush replayed");
    assert_eq!(files_of_kind(root.path(), "f_").len(), 2);
    assert_eq!(recorded_by_pod(&store, from, to).await, expected);
    store.shutdown().await.expect("shutdown");
    drop(store);

    let store = open(root.path(), recording_config(root.path())).await;
    assert_eq!(store.replay_report().records, 0);
    assert_eq!(recorded_by_pod(&store, from, to).await, expected);
    assert_eq!(
        recorded_sum(&store, bucket_of(BASE_MS + 9 * 7_000), to).await,
        (9..14u64).map(|i| cpu_profile(i, 12).1).sum::<i64>(),
        "a range picks the points of its own times"
    );
}

/// Ingests profiles at `hours` of the day starting at `day_ms`, a few
/// minutes apart, flushing after each hour; returns their total.
async fn ingest_hours(store: &Store, day_ms: i64, hours: &[i64], seed: u64) -> i64 {
    let mut sum = 0;
    for &hour in hours {
        for k in 0..3i64 {
            let time = day_ms + hour * HOUR_MS + k * 5 * 60_000;
            let pod = format!("pod-{}", k % 2);
            sum += ingest(store, &pod, time, seed + (hour * 3 + k) as u64).await;
        }
        store.flush().await.expect("flush");
    }
    sum
}

/// Two past UTC days of profiles in several flush files, one of them
/// spanning midnight; returns each day's total.
async fn two_days(store: &Store) -> (i64, i64) {
    let day0 = day0();
    let day1 = day0 + DAY_MS;
    let mut first = ingest_hours(store, day0, &[1, 7, 13], 0).await;
    let mut second = ingest_hours(store, day1, &[2, 9, 15], 100).await;
    // One head holding both days: its file spans midnight.
    first += ingest(store, "pod-0", day1 - 60_000, 500).await;
    second += ingest(store, "pod-1", day1 + 60_000, 501).await;
    store.flush().await.expect("flush");
    (first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merging_keeps_totals_and_leaves_one_file_per_period() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open(root.path(), recording_config(root.path())).await;
    let (first, second) = two_days(&store).await;
    let (day0, day1) = (day0(), day0() + DAY_MS);
    let whole = (day0 - DAY_MS, day1 + 2 * DAY_MS);
    assert_eq!(files_of_kind(root.path(), "f_").len(), 7);
    assert_eq!(recorded_sum(&store, whole.0, whole.1).await, first + second);
    let by_pod = recorded_by_pod(&store, whole.0, whole.1).await;

    // Late on day 1: day 0 becomes one file, day 1's past hours one each.
    let upkeep = store
        .maintain_recorded(day1 + 20 * HOUR_MS)
        .await
        .expect("maintain");
    assert_eq!(
        upkeep,
        RecordedUpkeep {
            merged: 5,
            deleted: 7
        },
        "day 0, and day 1's hours 0 (from the file across midnight), 2, 9 and 15: {:?}",
        recorded_files(root.path())
    );
    assert_eq!(recorded_sum(&store, whole.0, whole.1).await, first + second);
    assert_eq!(recorded_sum(&store, day0, day1).await, first);
    assert_eq!(recorded_sum(&store, day1, day1 + DAY_MS).await, second);
    assert_eq!(recorded_by_pod(&store, whole.0, whole.1).await, by_pod);
    assert!(files_of_kind(root.path(), "f_").is_empty());

    // Days later: day 1's hours become its day.
    let now = day1 + 3 * DAY_MS;
    let upkeep = store.maintain_recorded(now).await.expect("maintain");
    assert_eq!(upkeep.merged, 1, "day 1 from its hour files");
    let merged = files_of_kind(root.path(), "m_");
    assert_eq!(recorded_files(root.path()), merged);
    let periods: Vec<(i64, i64)> = merged.iter().map(|name| period_of_file(name)).collect();
    assert_eq!(
        periods,
        vec![(day0, day1), (day1, day1 + DAY_MS)],
        "one file per day: {merged:?}"
    );
    assert_eq!(recorded_sum(&store, whole.0, whole.1).await, first + second);
    assert_eq!(recorded_sum(&store, day0, day1).await, first);
    assert_eq!(recorded_sum(&store, day1, day1 + DAY_MS).await, second);
    assert_eq!(recorded_by_pod(&store, whole.0, whole.1).await, by_pod);
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        first + second
    );

    let again = store.maintain_recorded(now).await.expect("maintain");
    assert_eq!(again, RecordedUpkeep::default(), "nothing left to do");
    assert_eq!(recorded_files(root.path()), merged);
}

/// `m_<ulid>_<start>_<end>.krec` → (start, end).
fn period_of_file(name: &str) -> (i64, i64) {
    let stem = name.trim_end_matches(".krec");
    let mut parts = stem.rsplitn(3, '_');
    let end = parts.next().expect("end").parse().expect("end ms");
    let start = parts.next().expect("start").parse().expect("start ms");
    (start, end)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_interrupted_before_its_deletes_counts_each_point_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open(root.path(), recording_config(root.path())).await;
    let (first, second) = two_days(&store).await;
    let (day0, day1) = (day0(), day0() + DAY_MS);
    let whole = (day0 - DAY_MS, day1 + 2 * DAY_MS);
    // The sources as they were before the merge deleted them.
    let sources: Vec<(String, Vec<u8>)> = recorded_files(root.path())
        .into_iter()
        .map(|name| {
            let bytes = std::fs::read(recorded_dir(root.path()).join(&name)).expect("read");
            (name, bytes)
        })
        .collect();
    let now = day1 + 3 * DAY_MS;
    store.maintain_recorded(now).await.expect("maintain");
    let merged = files_of_kind(root.path(), "m_");
    assert_eq!(merged.len(), 2);

    // A crash after the merged files' puts and before the deletes leaves
    // the sources: one within a day, and the one spanning midnight.
    let spans_midnight = |name: &str| {
        let (start, end) = period_of_file(name);
        start < day1 && day1 < end
    };
    let across = sources
        .iter()
        .find(|(name, _)| spans_midnight(name))
        .expect("a file across midnight");
    let within = sources
        .iter()
        .find(|(name, _)| !spans_midnight(name))
        .expect("a file within a day");
    for (name, bytes) in [within, across] {
        std::fs::write(recorded_dir(root.path()).join(name), bytes).expect("restore source");
    }
    assert_eq!(recorded_files(root.path()).len(), 4);
    assert_eq!(
        recorded_sum(&store, whole.0, whole.1).await,
        first + second,
        "a source beside the merge that names it is not counted again"
    );
    assert_eq!(recorded_sum(&store, day0, day1).await, first);
    assert_eq!(recorded_sum(&store, day1, day1 + DAY_MS).await, second);
    // A new store reads them cold, without any cached decode.
    drop(store);
    let store = open(root.path(), recording_config(root.path())).await;
    assert_eq!(recorded_sum(&store, whole.0, whole.1).await, first + second);

    // The next pass finishes the job.
    let upkeep = store.maintain_recorded(now).await.expect("maintain");
    assert!(upkeep.deleted >= 2, "{upkeep:?}");
    let left = recorded_files(root.path());
    assert!(
        !left.contains(&within.0) && !left.contains(&across.0),
        "sources deleted: {left:?}"
    );
    assert_eq!(left, files_of_kind(root.path(), "m_"));
    assert_eq!(left.len(), 2, "one per day: {left:?}");
    assert_eq!(recorded_sum(&store, whole.0, whole.1).await, first + second);
    assert_eq!(recorded_sum(&store, day0, day1).await, first);
    assert_eq!(recorded_sum(&store, day1, day1 + DAY_MS).await, second);
    assert_eq!(
        store.maintain_recorded(now).await.expect("maintain"),
        RecordedUpkeep::default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_retention_deletes_old_files() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut config = recording_config(root.path());
    config.recorded_retention = Duration::from_secs(24 * 3600);
    let store = open(root.path(), config).await;
    let (first, second) = two_days(&store).await;
    let (day0, day1) = (day0(), day0() + DAY_MS);
    let whole = (day0 - DAY_MS, day1 + 2 * DAY_MS);
    assert_eq!(recorded_sum(&store, whole.0, whole.1).await, first + second);

    // At the end of day 1 day 0's files are past retention, but the one
    // across midnight ends on day 1: it stays, and is merged with day 1's.
    let upkeep = store
        .maintain_recorded(day1 + DAY_MS)
        .await
        .expect("maintain");
    assert_eq!(
        upkeep,
        RecordedUpkeep {
            merged: 2,
            deleted: 7
        },
        "3 expired, 4 merged into day 0 and day 1"
    );
    assert_eq!(recorded_sum(&store, day1, day1 + DAY_MS).await, second);
    let left_of_day0 = recorded_sum(&store, day0, day1).await;
    assert_eq!(
        left_of_day0,
        cpu_profile(500, 12).1,
        "only the point of the file that spans midnight"
    );

    let upkeep = store
        .maintain_recorded(day1 + 10 * DAY_MS)
        .await
        .expect("maintain");
    assert!(upkeep.deleted >= 1, "{upkeep:?}");
    assert_eq!(upkeep.merged, 0);
    assert!(recorded_files(root.path()).is_empty());
    assert_eq!(recorded_sum(&store, whole.0, whole.1).await, 0);
    // Profiles have their own retention: they are untouched.
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        first + second
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_lease_holder_expires_a_gone_replicas_files() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut config = recording_config(root.path());
    config.recorded_retention = Duration::from_secs(24 * 3600);
    let store = open(root.path(), config).await;
    let (_, second) = two_days(&store).await;
    let day1 = day0() + DAY_MS;
    // Every file now belongs to a replica that is gone: no one would
    // merge them, and before, no one deleted them either.
    let gone = root.path().join("bucket/recorded/gone-replica");
    std::fs::rename(recorded_dir(root.path()), &gone).expect("the files change hands");
    // The local bucket removes a folder once its last file is deleted.
    let gone_files = || std::fs::read_dir(&gone).map_or(0, |files| files.count());
    let listed = gone_files();

    let upkeep = store
        .maintain_recorded(day1 + DAY_MS)
        .await
        .expect("maintain");
    assert_eq!(
        upkeep,
        RecordedUpkeep {
            merged: 0,
            deleted: 3
        },
        "day 0's 3 files expired; another replica's files are never merged here"
    );
    assert_eq!(gone_files(), listed - 3);
    assert_eq!(
        recorded_sum(&store, day1, day1 + DAY_MS).await,
        second,
        "the gone replica's files that are not expired still answer"
    );
    store
        .maintain_recorded(day1 + 10 * DAY_MS)
        .await
        .expect("maintain");
    assert_eq!(gone_files(), 0, "every file of the gone replica expired");
}

/// Six profiles of two pods within a minute of the base time; their total.
async fn ingest_six(store: &Store) -> i64 {
    let mut sum = 0;
    for i in 0..6u64 {
        let pod = format!("pod-{}", i % 2);
        sum += ingest(store, &pod, BASE_MS + i as i64 * 11_000, i).await;
    }
    sum
}

/// Makes every block upload fail: `blocks/<replica>` is a plain file, so
/// no block directory can be made under it; recorded files still go up.
fn break_block_uploads(root: &Path) -> PathBuf {
    let blocks = root.join("bucket/blocks");
    std::fs::create_dir_all(&blocks).expect("blocks dir");
    let blocker = blocks.join(REPLICA);
    std::fs::write(&blocker, b"not a directory").expect("blocker");
    blocker
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_file_whose_block_never_arrived_is_deleted_at_open() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open(root.path(), recording_config(root.path())).await;
    let sum = ingest_six(&store).await;
    let blocker = break_block_uploads(root.path());
    assert!(store.flush().await.is_err(), "the block upload fails");
    let orphan = files_of_kind(root.path(), "f_");
    assert_eq!(orphan.len(), 1, "the points went up first: {orphan:?}");
    assert!(store.blocks().is_empty());
    let (from, to) = (BASE_MS - DAY_MS, BASE_MS + DAY_MS);
    assert_eq!(
        recorded_sum(&store, from, to).await,
        sum,
        "the waiting head's points are read from its file, once"
    );
    // Crash with the block never uploaded.
    drop(store);
    std::fs::remove_file(&blocker).expect("remove blocker");

    let store = open(root.path(), recording_config(root.path())).await;
    assert_eq!(store.replay_report().records, 6, "replayed");
    assert!(
        recorded_files(root.path()).is_empty(),
        "the orphan flush file is deleted: {:?}",
        recorded_files(root.path())
    );
    assert_eq!(recorded_sum(&store, from, to).await, sum);
    store.flush().await.expect("flush");
    assert_eq!(store.blocks().len(), 1);
    let files = files_of_kind(root.path(), "f_");
    assert_eq!(files.len(), 1);
    assert_ne!(files, orphan, "named after the new block");
    assert_eq!(recorded_sum(&store, from, to).await, sum);
    assert_eq!(total(&store, &all_selector(), everything()).await, sum);
}

/// A flush file written before a failed block upload is a past hour's
/// file, but maintenance leaves it while its head waits for upload (a
/// merge would hide it from the query that skips the waiting head, and
/// from recovery, which deletes it by its block's name). Its points are
/// counted once: while the head waits, after a crash before the block
/// goes up, after the upload, and once merged then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_file_merged_before_its_block_arrived_is_counted_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open(root.path(), recording_config(root.path())).await;
    let sum = ingest_six(&store).await;
    let blocker = break_block_uploads(root.path());
    assert!(store.flush().await.is_err(), "the block upload fails");
    assert_eq!(files_of_kind(root.path(), "f_").len(), 1);
    let upkeep = store
        .maintain_recorded(BASE_MS + 3 * DAY_MS)
        .await
        .expect("maintain");
    assert_eq!(
        (upkeep.merged, upkeep.deleted),
        (0, 0),
        "a flush file whose block waits for upload is left as it is"
    );
    let (from, to) = (BASE_MS - DAY_MS, BASE_MS + DAY_MS);
    let while_waiting = recorded_sum(&store, from, to).await;
    // Crash before the block is ever uploaded.
    drop(store);
    std::fs::remove_file(&blocker).expect("remove blocker");
    let store = open(root.path(), recording_config(root.path())).await;
    let after_restart = recorded_sum(&store, from, to).await;
    store.flush().await.expect("flush");
    let after_upload = recorded_sum(&store, from, to).await;
    let upkeep = store
        .maintain_recorded(BASE_MS + 3 * DAY_MS)
        .await
        .expect("maintain");
    assert_eq!(
        upkeep.merged, 1,
        "once its block is up, the file joins its day"
    );
    let merged = recorded_sum(&store, from, to).await;
    assert_eq!(total(&store, &all_selector(), everything()).await, sum);
    assert_eq!(
        (while_waiting, after_restart, after_upload, merged),
        (sum, sum, sum, sum),
        "recorded sums (while the head waits for upload, after a crash and replay, \
         after the replayed head's upload, after the merge) must each equal the \
         profiles' total {sum}"
    );
}

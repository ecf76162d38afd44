use super::*;
use kiln_engine::model::{Label, LabelSet};

fn record(n: usize) -> WalRecord {
    WalRecord {
        labels: LabelSet::new(vec![
            Label::new("__name__", "process_cpu"),
            Label::new("seq", n.to_string()),
        ]),
        time_ms: n as i64,
        duration_nanos: 0,
        pprof: vec![7; 50],
        idempotency_key: None,
    }
}

fn replay(dir: &Path) -> (Wal, ReplayReport, Vec<(u64, WalRecord)>) {
    let mut seen = Vec::new();
    let (wal, report) = Wal::open(dir, 1 << 20, |r| {
        if let Ok(record) = r.record {
            seen.push((r.segment, record));
        }
    })
    .expect("open wal");
    (wal, report, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_are_all_replayed_in_a_later_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (wal, _, _) = replay(dir.path());
    let wal = Arc::new(wal);
    let mut tasks = Vec::new();
    for n in 0..64 {
        let wal = Arc::clone(&wal);
        tasks.push(tokio::spawn(async move { wal.append(&record(n)).await }));
    }
    for task in tasks {
        task.await.expect("join").expect("append");
    }
    drop(wal);
    let (_, report, seen) = replay(dir.path());
    assert_eq!(report.records, 64);
    let mut times: Vec<i64> = seen.iter().map(|(_, r)| r.time_ms).collect();
    times.sort_unstable();
    assert_eq!(times, (0..64).collect::<Vec<_>>());
}

/// The files in the quarantine of `dir`'s log with the extension `ext`.
fn quarantined(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let aside = quarantine_dir(dir);
    let mut files: Vec<PathBuf> = match fs::read_dir(&aside) {
        Ok(entries) => entries
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

#[tokio::test]
async fn a_torn_tail_is_set_aside_whole_and_earlier_records_survive() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("wal");
    let (wal, _, _) = replay(&dir);
    for n in 0..3 {
        wal.append(&record(n)).await.expect("append");
    }
    let segment = wal.current_segment();
    drop(wal);
    // Simulate a crash mid-write: half a frame at the end.
    let path = segment_path(&dir, segment);
    let half = &encode_frame(&record(99))[..20];
    let mut file = OpenOptions::new().append(true).open(&path).expect("open");
    file.write_all(half).expect("write");
    drop(file);
    let damaged = fs::read(&path).expect("read");
    let (wal, report, seen) = replay(&dir);
    assert_eq!(report.records, 3);
    assert_eq!(report.skipped_bytes, 20);
    assert_eq!(report.damaged_segments, 1);
    assert_eq!(report.quarantined_segments, 1);
    assert_eq!(seen.len(), 3);
    // The original, torn tail included, is kept byte for byte; the log
    // holds the records before the tear.
    let kept = quarantined(&dir, "wal");
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(fs::read(&kept[0]).expect("read kept"), damaged);
    assert_eq!(quarantined(&dir, "reason").len(), 1);
    assert_eq!(
        fs::read(&path).expect("read repaired").len(),
        damaged.len() - 20
    );
    // New appends work, and the next open finds nothing damaged.
    wal.append(&record(4)).await.expect("append after recovery");
    drop(wal);
    let (_, report, _) = replay(&dir);
    assert_eq!(report.records, 4);
    assert_eq!(report.damaged_segments, 0);
    assert_eq!(quarantined(&dir, "wal").len(), 1);
}

#[tokio::test]
async fn a_corrupt_frame_mid_segment_keeps_the_records_before_it_and_the_bytes_after() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("wal");
    let (wal, _, _) = replay(&dir);
    for n in 0..3 {
        wal.append(&record(n)).await.expect("append");
    }
    let segment = wal.current_segment();
    drop(wal);
    // A flipped bit in the second frame's payload: its CRC fails, and
    // the third frame after it cannot be trusted to start where the
    // second's length says.
    let path = segment_path(&dir, segment);
    let mut bytes = fs::read(&path).expect("read");
    let second = SEGMENT_MAGIC.len() + encode_frame(&record(0)).len();
    bytes[second + record::FRAME_HEADER_BYTES + 3] ^= 0x40;
    fs::write(&path, &bytes).expect("write");
    let (_, report, seen) = replay(&dir);
    assert_eq!(report.records, 1);
    assert_eq!(report.quarantined_segments, 1);
    assert_eq!(seen.iter().map(|(_, r)| r.time_ms).collect::<Vec<_>>(), [0]);
    let kept = quarantined(&dir, "wal");
    assert_eq!(fs::read(&kept[0]).expect("read kept"), bytes);
    assert_eq!(fs::read(&path).expect("read repaired").len(), second);
}

#[tokio::test]
async fn a_segment_without_a_header_is_moved_aside_not_deleted() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("wal");
    fs::create_dir_all(&dir).expect("dir");
    let foreign = b"not a kiln segment at all".to_vec();
    fs::write(segment_path(&dir, 5), &foreign).expect("write");
    let (wal, report, seen) = replay(&dir);
    assert!(seen.is_empty());
    assert_eq!(report.quarantined_segments, 1);
    assert!(!segment_path(&dir, 5).exists());
    let kept = quarantined(&dir, "wal");
    assert_eq!(fs::read(&kept[0]).expect("read kept"), foreign);
    assert_eq!(wal.current_segment(), 6);
}

#[tokio::test]
async fn rotation_and_removal_drop_only_older_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (wal, _, _) = replay(dir.path());
    wal.append(&record(1)).await.expect("append");
    let next = wal.rotate().expect("rotate");
    wal.append(&record(2)).await.expect("append");
    assert_eq!(wal.remove_segments_before(next).expect("remove"), 1);
    drop(wal);
    let (_, report, seen) = replay(dir.path());
    assert_eq!(report.records, 1);
    assert_eq!(seen[0].1.time_ms, 2);
    assert_eq!(seen[0].0, next);
}

#[tokio::test]
async fn segments_rotate_by_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (wal, _) = Wal::open(dir.path(), 200, |_| {}).expect("open");
    let first = wal.current_segment();
    for n in 0..10 {
        wal.append(&record(n)).await.expect("append");
    }
    assert!(wal.current_segment() > first + 2);
    drop(wal);
    let (_, report, _) = replay(dir.path());
    assert_eq!(report.records, 10);
}

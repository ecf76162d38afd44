use std::time::Instant;

use super::*;
use crate::wal::record::{WalRecord, encode_frame, parse_segment};
use kiln_engine::model::{Label, LabelSet};

fn frame(n: i64) -> Vec<u8> {
    encode_frame(&WalRecord {
        labels: LabelSet::new(vec![Label::new("__name__", "process_cpu")]),
        time_ms: n,
        duration_nanos: 0,
        pprof: vec![1; 10],
        idempotency_key: None,
    })
}

/// A writer thread whose first segment takes no writes: it is open
/// read-only, so the first append fails as a full or dead disk would.
struct Rig {
    dir: tempfile::TempDir,
    status: Arc<Status>,
    commands: Option<std::sync::mpsc::Sender<Command>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Rig {
    fn with_a_failing_segment() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(create_segment(dir.path(), 1).expect("segment 1"));
        let read_only = File::open(segment_path(dir.path(), 1)).expect("open read-only");
        let status = Arc::new(Status::new(1));
        let writer = Writer::new(
            dir.path().to_path_buf(),
            1 << 20,
            Arc::clone(&status),
            read_only,
            1,
        );
        let (commands, receiver) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || writer.run(receiver));
        Self {
            dir,
            status,
            commands: Some(commands),
            thread: Some(thread),
        }
    }

    async fn append(&self, n: i64) -> Result<u64, StorageError> {
        let (done, reply) = oneshot::channel();
        self.commands
            .as_ref()
            .expect("open")
            .send(Command::Append {
                frame: frame(n),
                done,
            })
            .expect("writer alive");
        reply.await.expect("answered")
    }

    fn rotate(&self) -> u64 {
        let (done, reply) = std::sync::mpsc::sync_channel(1);
        self.commands
            .as_ref()
            .expect("open")
            .send(Command::Rotate { done })
            .expect("writer alive");
        reply.recv().expect("answered").expect("rotate")
    }

    fn records_in(&self, segment: u64) -> Vec<i64> {
        let bytes = std::fs::read(segment_path(self.dir.path(), segment)).expect("read");
        let parsed = parse_segment(&bytes);
        assert_eq!(parsed.problem, None, "segment {segment} is whole");
        parsed
            .payloads
            .iter()
            .map(|p| {
                crate::wal::record::decode_payload(p)
                    .expect("parses")
                    .time_ms
            })
            .collect()
    }

    fn stop(mut self) -> tempfile::TempDir {
        self.commands.take();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("writer thread ends cleanly");
        }
        std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"))
    }
}

#[tokio::test]
async fn a_failed_write_is_refused_and_the_next_write_goes_to_a_fresh_segment() {
    let rig = Rig::with_a_failing_segment();
    let err = rig
        .append(1)
        .await
        .expect_err("the segment takes no writes");
    assert!(
        matches!(err, StorageError::Wal { op: "append", .. }),
        "{err}"
    );
    let failure = rig.status.failure().expect("the log reports its failure");
    assert_eq!(failure.reopen_error, None);
    assert_eq!(rig.status.current(), 2, "the next append goes past it");
    assert_eq!(rig.status.failures(), 1);

    assert_eq!(rig.append(2).await.expect("a fresh segment"), 2);
    assert_eq!(rig.append(3).await.expect("and on"), 2);
    assert_eq!(rig.status.failure(), None);
    assert_eq!(rig.status.reopens(), 1);
    let dir = rig.stop();
    let rig = Rig {
        dir,
        status: Arc::new(Status::new(0)),
        commands: None,
        thread: None,
    };
    assert_eq!(
        rig.records_in(1),
        Vec::<i64>::new(),
        "nothing refused is kept"
    );
    assert_eq!(rig.records_in(2), vec![2, 3]);
}

#[tokio::test]
async fn while_no_fresh_segment_can_be_made_the_log_says_so_and_retries_by_itself() {
    let rig = Rig::with_a_failing_segment();
    rig.append(1)
        .await
        .expect_err("the segment takes no writes");
    // The directory goes away (a volume unmounted): no segment can be
    // created, at the next write nor later.
    let away = rig.dir.path().with_extension("away");
    std::fs::rename(rig.dir.path(), &away).expect("move the directory away");
    let err = rig.append(2).await.expect_err("no fresh segment");
    assert!(matches!(err, StorageError::WalFailed { .. }), "{err}");
    let failure = rig.status.failure().expect("failing");
    assert!(failure.reopen_error.is_some(), "{failure:?}");
    // A flush may still cut the head: no append can land below the
    // segment it is told.
    assert_eq!(rig.rotate(), 2);

    // The directory comes back: the log starts a fresh segment within
    // a retry or two, with no write to prompt it.
    std::fs::rename(&away, rig.dir.path()).expect("move it back");
    let started = Instant::now();
    while rig.status.failure().is_some() {
        assert!(
            started.elapsed() < REOPEN_EVERY * 30,
            "the log never retried by itself"
        );
        std::thread::sleep(REOPEN_EVERY / 10);
    }
    println!("retried by itself after {:?}", started.elapsed());
    assert_eq!(rig.append(3).await.expect("takes writes again"), 2);
    rig.stop();
}

#[tokio::test]
async fn a_leftover_file_under_the_next_name_costs_one_id_not_the_log() {
    let rig = Rig::with_a_failing_segment();
    // Something the writer cannot remove sits where segment 2 goes.
    std::fs::create_dir(segment_path(rig.dir.path(), 2)).expect("dir at segment 2");
    rig.append(1)
        .await
        .expect_err("the segment takes no writes");
    rig.append(2)
        .await
        .expect_err("segment 2 cannot be created");
    assert_eq!(rig.status.current(), 3);
    assert_eq!(rig.append(3).await.expect("segment 3"), 3);
    rig.stop();
}

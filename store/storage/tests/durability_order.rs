//! Power-cut durability, checked by the order of the store's own syscalls:
//! a child process (this test binary, re-executed under
//! `strace -f -y -e trace=fsync,fdatasync,unlink,unlinkat,rename,renameat,renameat2`)
//! ingests, flushes twice and compacts into a local bucket; the parent reads
//! the trace and checks that every block's files and directory entries were
//! fsynced before any WAL segment it replaces, or any source block it
//! supersedes, was deleted (issue 13). Page-cache-only block files would
//! lose acknowledged writes on a power cut after the WAL was trimmed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use kiln_engine::model::{Label, LabelSet};
use kiln_storage::{IngestRequest, Store};
use kiln_testkit::profiles::*;

const CHILD_DIR_ENV: &str = "KILN_DURABILITY_CHILD_DIR";
const CHILD_TEST: &str = "child_process_entry_point";

/// Not a test on its own: the body of the traced child. Without the
/// environment variable (a normal test run) it returns at once.
#[test]
fn child_process_entry_point() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let dir = Path::new(&dir);
        let store = Store::open(
            config(&dir.join("data"), "r1"),
            local_bucket(&dir.join("bucket")),
        )
        .await
        .expect("child open");
        // Two level-0 blocks of one hour, then compaction merges them and
        // deletes both sources.
        for round in 0..2u64 {
            for seq in 0..20u64 {
                let (pprof, _) = cpu_profile(seq + round * 100, 10);
                store
                    .ingest(IngestRequest {
                        labels: LabelSet::new(vec![
                            Label::new("__name__", "process_cpu"),
                            Label::new("pod", format!("pod-{}", seq % 3)),
                        ]),
                        time_ms: Some(BASE_MS + (round * 20 + seq) as i64 * 10_000),
                        duration_nanos: Some(DURATION_NANOS),
                        pprof: pprof.into(),
                        writer: Default::default(),
                    })
                    .await
                    .expect("child ingest");
            }
            store.flush().await.expect("child flush");
        }
        let report = store
            .compact(BASE_MS + 3 * 3_600_000)
            .await
            .expect("child compaction");
        assert_eq!(report.written.len(), 1, "one hour block written");
        assert_eq!(report.deleted, 2, "both sources deleted");
    });
}

/// One traced syscall: its name and the paths it names (fd paths from `-y`
/// and quoted path arguments).
#[derive(Debug)]
struct Call {
    name: String,
    paths: Vec<String>,
}

/// Parses `strace -f -y` output: `[pid] name(args...) = ret`, including the
/// `<unfinished ...>` half of interrupted calls (which carries the arguments;
/// the call is ordered where it started).
fn parse_trace(text: &str) -> Vec<Call> {
    let mut calls = Vec::new();
    for line in text.lines() {
        let line = line.trim_start_matches(|c: char| c.is_ascii_digit() || c == ' ');
        if line.starts_with("<...") || line.starts_with("+++") || line.starts_with("---") {
            continue;
        }
        let Some(open) = line.find('(') else { continue };
        let name = line[..open].to_string();
        let args = &line[open + 1..];
        let mut paths = Vec::new();
        // fd annotations: 5</path/to/file>
        let mut rest = args;
        while let Some(start) = rest.find('<') {
            let after = &rest[start + 1..];
            let Some(end) = after.find('>') else { break };
            if after.starts_with('/') {
                paths.push(after[..end].to_string());
            }
            rest = &after[end + 1..];
        }
        // quoted path arguments: "/path/to/file"
        let mut rest = args;
        while let Some(start) = rest.find('"') {
            let after = &rest[start + 1..];
            let Some(end) = after.find('"') else { break };
            if after.starts_with('/') {
                paths.push(after[..end].to_string());
            }
            rest = &after[end + 1..];
        }
        calls.push(Call { name, paths });
    }
    calls
}

fn is_sync(call: &Call) -> bool {
    call.name == "fsync" || call.name == "fdatasync"
}

fn is_unlink(call: &Call) -> bool {
    call.name == "unlink" || call.name == "unlinkat"
}

fn is_rename(call: &Call) -> bool {
    call.name.starts_with("rename")
}

/// Where replica r1 writes its blocks.
const BLOCKS_DIR: &str = "/bucket/blocks/r1";

/// The block id in a path `.../bucket/blocks/r1/<id>[/file]`.
fn block_of(path: &str) -> Option<&str> {
    let (_, after) = path.split_once(&format!("{BLOCKS_DIR}/"))?;
    Some(after.split('/').next().unwrap_or(after))
}

/// Index of the call after which block `id` is durable: its `meta.json`
/// (written last, it makes the block visible) was renamed into place and the
/// block directory fsynced after that; before it, `data` was fsynced and
/// renamed, and the replica's blocks directory (which gained the block's entry) was
/// fsynced.
fn durable_at(calls: &[Call], id: &str) -> Result<usize, String> {
    let dir_suffix = format!("{BLOCKS_DIR}/{id}");
    let find = |from: usize, what: &str, test: &dyn Fn(&Call) -> bool| {
        calls[from..]
            .iter()
            .position(test)
            .map(|i| from + i)
            .ok_or_else(|| format!("block {id}: no {what} in the trace"))
    };
    let data_synced = find(0, "fsync of the staged data file", &|c| {
        is_sync(c)
            && c.paths
                .iter()
                .any(|p| p.contains(&format!("{dir_suffix}/data#")))
    })?;
    let data_renamed = find(data_synced, "rename of data into place", &|c| {
        is_rename(c)
            && c.paths
                .iter()
                .any(|p| p.ends_with(&format!("{dir_suffix}/data")))
    })?;
    let blocks_dir_synced = calls[..data_renamed]
        .iter()
        .any(|c| is_sync(c) && c.paths.iter().any(|p| p.ends_with(BLOCKS_DIR)));
    if !blocks_dir_synced {
        return Err(format!(
            "block {id}: the blocks directory was not fsynced before its data was published"
        ));
    }
    let meta_synced = find(data_renamed, "fsync of the staged meta.json", &|c| {
        is_sync(c)
            && c.paths
                .iter()
                .any(|p| p.contains(&format!("{dir_suffix}/meta.json#")))
    })?;
    let meta_renamed = find(meta_synced, "rename of meta.json into place", &|c| {
        is_rename(c)
            && c.paths
                .iter()
                .any(|p| p.ends_with(&format!("{dir_suffix}/meta.json")))
    })?;
    find(
        meta_renamed,
        "fsync of the block directory after meta.json",
        &|c| is_sync(c) && c.paths.iter().any(|p| p.ends_with(&dir_suffix)),
    )
}

#[test]
fn block_files_and_directories_are_fsynced_before_wal_segments_or_sources_are_deleted() {
    if Command::new("strace").arg("-V").output().is_err() {
        // `./kiln-dev test` installs strace; elsewhere the skip is written
        // past libtest's capture, so it shows.
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "strace is needed in CI"
        );
        let _ = writeln!(
            std::io::stderr(),
            "SKIP: strace is not installed; the syscall order was not checked"
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let trace_path = dir.path().join("trace.txt");
    let exe = std::env::current_exe().expect("test binary path");
    let status = Command::new("strace")
        .args(["-f", "-y", "-qq", "-o"])
        .arg(&trace_path)
        .args([
            "-e",
            "trace=fsync,fdatasync,unlink,unlinkat,rename,renameat,renameat2",
        ])
        .arg(exe)
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir.path())
        .status()
        .expect("run the child under strace");
    assert!(status.success(), "traced child failed: {status}");
    let trace = std::fs::read_to_string(&trace_path).expect("read trace");
    let calls = parse_trace(&trace);

    // Blocks in the order their meta.json was published.
    let mut published: Vec<(usize, String)> = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        if is_rename(call)
            && let Some(path) = call.paths.iter().find(|p| p.ends_with("/meta.json"))
            && let Some(id) = block_of(path)
        {
            published.push((i, id.to_string()));
        }
    }
    assert_eq!(
        published.len(),
        3,
        "two flushed blocks and one compacted block; trace:\n{trace}"
    );
    let mut durable: BTreeMap<String, usize> = BTreeMap::new();
    for (_, id) in &published {
        let at = durable_at(&calls, id).unwrap_or_else(|e| panic!("{e}; trace:\n{trace}"));
        durable.insert(id.clone(), at);
    }

    // Every WAL segment removal follows a block that is durable by then.
    let mut segment_unlinks = 0;
    for (i, call) in calls.iter().enumerate() {
        if !is_unlink(call) || !call.paths.iter().any(|p| p.ends_with(".wal")) {
            continue;
        }
        segment_unlinks += 1;
        let (_, latest) = published
            .iter()
            .rev()
            .find(|(published_at, _)| *published_at < i)
            .unwrap_or_else(|| panic!("WAL segment deleted before any block: {:?}", call.paths));
        assert!(
            durable[latest] < i,
            "WAL segment {:?} deleted at call {i} before block {latest} was durable (call {})",
            call.paths,
            durable[latest]
        );
    }
    assert!(
        segment_unlinks >= 2,
        "each flush trimmed the WAL; trace:\n{trace}"
    );

    // Source blocks are deleted only after the compacted block is durable.
    let (_, compacted) = published.last().expect("three blocks");
    let sources: Vec<&String> = published[..2].iter().map(|(_, id)| id).collect();
    let mut source_unlinks = 0;
    for (i, call) in calls.iter().enumerate() {
        let Some(id) = call
            .paths
            .iter()
            .filter_map(|p| block_of(p))
            .find(|id| sources.iter().any(|s| s == id))
        else {
            continue;
        };
        if is_unlink(call) {
            source_unlinks += 1;
            assert!(
                durable[compacted] < i,
                "source block {id} deleted at call {i} before the compacted block was durable (call {})",
                durable[compacted]
            );
        }
    }
    assert!(
        source_unlinks >= 2,
        "both sources' files were deleted; trace:\n{trace}"
    );
}

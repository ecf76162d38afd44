//! A full disk under the store must not leave it alive and useless. The
//! data directory sits on a small tmpfs that the test fills: a write-ahead
//! log append then fails with ENOSPC for real. The write is refused (never
//! acknowledged), readiness and liveness fail with the reason while not
//! even a fresh segment fits (so a kubelet would restart the store), and
//! once space is freed the log starts a fresh segment by itself: ingest
//! works again without a restart. After a restart, every acknowledged
//! profile is there, no refused one is, and no segment needed setting
//! aside.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kiln_testkit::http::{HttpResponse, enc, get, post_folded};
use kiln_testkit::prerequisites;
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// A tmpfs mounted for this test, unmounted on drop.
struct SmallTmpfs {
    dir: tempfile::TempDir,
}

impl SmallTmpfs {
    /// Mounts one, or reports the missing privilege (a failure under CI).
    fn mount(bytes: u64) -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match output {
            Ok(output) if output.status.success() => Some(Self { dir }),
            Ok(output) => prerequisites::missing(&format!(
                "root, to mount a tmpfs to fill (mount said: {})",
                String::from_utf8_lossy(&output.stderr).trim()
            )),
            Err(err) => prerequisites::missing(&format!("mount(8), to mount a tmpfs: {err}")),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes to a filler file until the filesystem is full; returns it.
    fn fill(&self) -> PathBuf {
        let path = self.dir.path().join("filler");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("open filler");
        let chunk = vec![0u8; 4096];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(err) => {
                    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
                    break;
                }
            }
        }
        path
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn post(store: &StoreProcess, app: &str) -> HttpResponse {
    post_folded(store.addr, app, b"main;work 7")
}

/// One posted profile's total: 7 samples at 100 Hz, in ns.
const ONE_PROFILE: i64 = 70_000_000;

fn total_for(store: &StoreProcess, app: &str) -> i64 {
    let query = enc(&format!(r#"process_cpu{{service_name="{app}"}}"#));
    let response = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-1h"),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()["total"].as_i64().unwrap_or(0)
}

/// Polls `path` until `done` holds for its (status, text), for at most a
/// minute; returns the last answer and how long it took.
#[track_caller]
fn wait_for(
    store: &StoreProcess,
    path: &str,
    done: impl Fn(u16, &str) -> bool,
) -> (u16, String, Duration) {
    let started = Instant::now();
    loop {
        let response = get(store.addr, path);
        let (status, text) = (response.status, response.text());
        if done(status, &text) {
            return (status, text, started.elapsed());
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{path} never changed as expected: {status} {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn metric(store: &StoreProcess, name: &str) -> u64 {
    let text = get(store.addr, "/metrics").text();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

#[test]
fn a_full_disk_refuses_writes_and_fails_liveness_until_space_is_freed_then_ingest_works_again() {
    let Some(disk) = SmallTmpfs::mount(32 << 20) else {
        return;
    };
    let data_dir = tempfile::tempdir_in(disk.path()).expect("data dir on the tmpfs");
    let store = StoreProcess::start_in(KILN_STORE, data_dir, &[]);
    assert_eq!(post(&store, "before").status, 200);
    assert_eq!(get(store.addr, "/healthz").status, 200);

    let filler = disk.fill();
    // The segment's last page may still hold a few small frames.
    let mut stored_during = 0;
    let mut refused = None;
    for _ in 0..500 {
        let response = post(&store, "during");
        if response.status == 200 {
            stored_during += 1;
        } else {
            refused = Some(response);
            break;
        }
    }
    let refused = refused.expect("a full disk never failed a WAL append");
    assert_eq!(refused.status, 500, "{}", refused.text());
    eprintln!(
        "refused after {stored_during} more writes: {}",
        refused.text()
    );
    // Cutting the refused record off again may have freed a page.
    disk.fill();

    // No fresh segment fits either: not ready, and not live, with why.
    let (_, healthz, took) = wait_for(&store, "/healthz", |status, _| status == 503);
    eprintln!("/healthz failed {took:?} after the refused write");
    assert!(healthz.contains("wal_failed: "), "{healthz}");
    assert!(healthz.contains("No space left on device"), "{healthz}");
    let ready = get(store.addr, "/readyz");
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert!(ready.text().contains("wal_failed: "), "{}", ready.text());
    let again = post(&store, "during");
    assert_eq!(again.status, 500, "{}", again.text());
    assert!(again.text().contains("wal_failed"), "{}", again.text());
    // Reads go on meanwhile.
    assert_eq!(total_for(&store, "before"), ONE_PROFILE);
    assert!(metric(&store, "kiln_wal_failed_writes") >= 1);

    // Space comes back: the log starts a fresh segment by itself, with no
    // write (a store that is not ready gets none) and no restart.
    std::fs::remove_file(&filler).expect("free the disk");
    let (_, _, took) = wait_for(&store, "/healthz", |status, _| status == 200);
    eprintln!("/healthz passed {took:?} after space was freed");
    let (_, ready, _) = wait_for(&store, "/readyz", |_, text| !text.contains("wal_failed"));
    eprintln!("/readyz after space was freed: {ready}");
    let after = post(&store, "after");
    assert_eq!(after.status, 200, "{}", after.text());
    assert_eq!(total_for(&store, "after"), ONE_PROFILE);
    assert_eq!(total_for(&store, "during"), stored_during * ONE_PROFILE);

    // A restart replays exactly what was acknowledged, and finds no
    // damaged segment: the refused bytes were cut off, not left torn.
    let data_dir = store.stop();
    let store = StoreProcess::start_in(KILN_STORE, data_dir, &[]);
    assert_eq!(total_for(&store, "before"), ONE_PROFILE);
    assert_eq!(total_for(&store, "during"), stored_during * ONE_PROFILE);
    assert_eq!(total_for(&store, "after"), ONE_PROFILE);
    assert_eq!(metric(&store, "kiln_wal_quarantined_segments"), 0);
    assert_eq!(get(store.addr, "/healthz").status, 200);
}

#[test]
fn a_damaged_segment_is_set_aside_whole_and_counted_and_the_store_opens() {
    let root = tempfile::tempdir().expect("temp dir");
    let store = StoreProcess::start_in(KILN_STORE, root, &[]);
    assert_eq!(post(&store, "kept").status, 200);
    // A clean stop uploads the head and trims the log.
    let data_dir = store.stop();
    // A segment after the last one, with a header and then half a frame,
    // as a crash mid-append (or a damaged disk) leaves it. (That the
    // records before such damage are replayed is the storage crate's
    // test; here the whole binary opens past it.)
    let wal = data_dir.path().join("wal");
    let last = std::fs::read_dir(&wal)
        .expect("wal dir")
        .filter_map(|e| {
            let name = e.expect("entry").file_name();
            name.to_str()?.strip_suffix(".wal")?.parse::<u64>().ok()
        })
        .max()
        .unwrap_or(0);
    let segment = wal.join(format!("{:020}.wal", last + 1));
    let mut damaged = b"KILNWAL1".to_vec();
    damaged.extend_from_slice(&[200, 1, 0, 0, 1, 2, 3, 4, 9, 9]);
    std::fs::write(&segment, &damaged).expect("write damaged segment");

    let store = StoreProcess::start_in(KILN_STORE, data_dir, &[]);
    assert_eq!(total_for(&store, "kept"), ONE_PROFILE);
    assert_eq!(metric(&store, "kiln_wal_quarantined_segments"), 1);
    let aside = store.data_dir.path().join("wal-quarantine/segments");
    let kept: Vec<PathBuf> = std::fs::read_dir(&aside)
        .expect("quarantine directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(std::fs::read(&kept[0]).expect("read kept"), damaged);
    assert_eq!(post(&store, "later").status, 200);
    assert_eq!(total_for(&store, "later"), ONE_PROFILE);
}

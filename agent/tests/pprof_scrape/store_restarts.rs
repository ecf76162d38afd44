//! Shipping across store restarts (issue 50): the store is killed (a crash,
//! an evicted pod) and stopped (a rolling restart) and started again on the
//! same address and data directory, over and over, while the agent scrapes
//! a Go program's allocations and ships them. Allocation deltas are exact
//! here (every allocation recorded, the baseline before the first), so
//! their sum is a ledger: a profile lost makes it short by at least one
//! 64 KiB block, a retry stored twice makes it long by as much.

use std::process::Command;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use kiln_testkit::binaries::built_binary;
use kiln_testkit::http::{free_port, get};
use kiln_testkit::process::KillOnDrop;
use kiln_testkit::store_process::StoreProcess;

use super::{AGENT, GoTarget, top_value};

/// Blocks of 64 KiB the program allocates, one per 5 ms or so: long enough
/// for several restarts.
const BLOCKS: u64 = 3_000;
/// The size of each.
const BLOCK_BYTES: u64 = 65_536;
/// Between two restarts of the store.
const UP_FOR: Duration = Duration::from_millis(2_500);
/// How long the store stays away at each restart: a pod's restart takes
/// longer, but over a second the agent's once-a-second sends meet it away.
const AWAY_FOR: Duration = Duration::from_millis(1_500);
/// Restarts the test insists on before it judges the ledger.
const MIN_RESTARTS: u32 = 4;

/// Every `kiln_agent_ship_errors_total` series added up.
fn ship_errors(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with("kiln_agent_ship_errors_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn scraped_deltas_are_stored_exactly_once_across_store_crashes_and_rolling_restarts() {
    let Some(store_binary) = built_binary("kiln-store", "KILN_STORE_BIN") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(target) = GoTarget::start(dir.path(), BLOCKS, 1) else {
        return;
    };
    let addr = free_port();
    let start =
        |data: tempfile::TempDir| StoreProcess::start_on(&store_binary, addr, data, &[], &[]);
    let mut store = start(tempfile::tempdir().expect("temp dir"));
    let (address, lines) = (&target.address, &target.lines);
    let metrics = free_port();
    let mut agent = KillOnDrop(
        Command::new(AGENT)
            .args([
                "--scrape",
                &format!("http://{address}/debug/pprof"),
                "--scrape-interval",
                "1s",
                "--scrape-timeout",
                "2s",
                "--scrape-service-name",
                "restarted-store",
                "--store",
                &store.url(),
                "--metrics-addr",
                &metrics.to_string(),
                "--node-name",
                "restart-test",
            ])
            .spawn()
            .expect("the agent starts"),
    );

    // Restart the store until the program has allocated everything: odd
    // restarts kill it, even ones stop it with SIGTERM.
    let mut restarts = 0u32;
    let mut next_restart = Instant::now() + UP_FOR;
    let deadline = Instant::now() + Duration::from_secs(180);
    let allocated: u64 = loop {
        assert!(Instant::now() < deadline, "the program never finished");
        match lines.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                if let Some(bytes) = line.strip_prefix("done allocated=") {
                    break bytes.trim().parse().expect("bytes");
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => panic!("the Go program exited"),
        }
        if Instant::now() >= next_restart {
            restarts += 1;
            let data = if restarts % 2 == 1 {
                store.kill()
            } else {
                store.stop()
            };
            std::thread::sleep(AWAY_FOR);
            store = start(data);
            next_restart = Instant::now() + UP_FOR;
        }
    };
    assert_eq!(allocated, BLOCKS * BLOCK_BYTES);
    assert!(
        restarts >= MIN_RESTARTS,
        "only {restarts} restarts while the program allocated"
    );
    // A few scrapes after the last allocation, with the store up, then a
    // clean shutdown that ships what is queued.
    std::thread::sleep(Duration::from_secs(4));
    let text = get(metrics, "/metrics").text();
    let pid = i32::try_from(agent.0.id()).expect("pid fits in pid_t");
    // SAFETY: kill(2) on the agent this test spawned and has not reaped.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let status = agent.0.wait().expect("the agent runs");
    assert!(status.success(), "the agent failed: {status}");

    let query = "memory:alloc_space:bytes:space:bytes:delta{service_name=\"restarted-store\"}";
    let errors = ship_errors(&text);
    let (flat, top) = top_value(store.addr, query, "main.allocateKnown", "flat");
    let flat = flat.unwrap_or_else(|| panic!("main.allocateKnown is not in {top}"));
    eprintln!(
        "{restarts} store restarts, {errors} failed sends retried: {flat} of {allocated} bytes \
         stored under main.allocateKnown"
    );
    // Go also charges the function a few bytes of its own bookkeeping (112
    // here), far less than a block: any profile lost or doubled moves the
    // sum by whole blocks.
    let flat = u64::try_from(flat).expect("a byte count");
    assert!(
        (allocated..allocated + BLOCK_BYTES).contains(&flat),
        "the deltas add up to {flat} bytes, not the {allocated} allocated: {} blocks {}",
        flat.abs_diff(allocated) / BLOCK_BYTES,
        if flat < allocated {
            "lost"
        } else {
            "stored twice"
        }
    );
    assert!(
        errors >= 1,
        "the agent never saw the store away in {restarts} restarts:\n{text}"
    );
}

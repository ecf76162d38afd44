//! A real Go program's heap, goroutines and allocation deltas.

use std::process::Command;
use std::time::Duration;

use kiln_testkit::binaries::built_binary;
use kiln_testkit::http::{enc, get, json_int64};
use kiln_testkit::process::KillOnDrop;
use kiln_testkit::store_process::StoreProcess;

use super::{AGENT, GoTarget, go_pprof_reads, top_value, wait_for_line};

/// Blocks of 64 KiB the Go program allocates in `main.allocateKnown`.
const BLOCKS: u64 = 600;
/// Goroutines it parks in `main.parked`.
const PARKED: i64 = 37;
/// The agent's scrape slots: at most this many requests are in flight at
/// once, each served by a goroutine of its own in the program.
const SLOTS: i64 = 4;

/// The Go program's heap names its allocation site, its goroutine count is
/// the program's own, and the allocation deltas add up to what it
/// allocated (within 10 %); every type exports as pprof `go tool pprof`
/// reads.
#[test]
fn a_go_programs_profiles_are_scraped_into_the_store_as_gauges_and_deltas() {
    let Some(store_binary) = built_binary("kiln-store", "KILN_STORE_BIN") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(target) = GoTarget::start(dir.path(), BLOCKS, PARKED) else {
        return;
    };
    let store = StoreProcess::start(&store_binary, &[]);
    let (address, goroutines, lines) = (&target.address, target.goroutines, &target.lines);

    let mut agent = KillOnDrop(
        Command::new(AGENT)
            .args([
                "--scrape",
                &format!("http://{address}/debug/pprof"),
                "--scrape-interval",
                "2s",
                "--scrape-timeout",
                "2s",
                "--scrape-service-name",
                "pprof-target",
                "--store",
                &store.url(),
                "--metrics-addr",
                "off",
                "--node-name",
                "scrape-test",
                "--duration",
                "20s",
            ])
            .env("KILN_LOG", "kiln_agent=debug")
            .spawn()
            .expect("the agent starts"),
    );
    let allocated: u64 = wait_for_line(lines, "done allocated=", Duration::from_secs(60))
        .parse()
        .expect("bytes");
    assert_eq!(allocated, BLOCKS * 65_536);
    let status = agent.0.wait().expect("the agent runs");
    assert!(status.success(), "the agent failed: {status}");

    let selector = "{service_name=\"pprof-target\"}";
    // Allocations: deltas since the baseline scrape, which came before the
    // program's first allocation, sum to everything it allocated.
    let allocs = format!("memory:alloc_space:bytes:space:bytes:delta{selector}");
    let (flat, top) = top_value(store.addr, &allocs, "main.allocateKnown", "flat");
    let flat = flat.unwrap_or_else(|| panic!("main.allocateKnown is not in {top}"));
    let ratio = flat as f64 / allocated as f64;
    eprintln!("alloc_space deltas of main.allocateKnown: {flat} of {allocated} bytes ({ratio:.4})");
    assert!((0.9..=1.1).contains(&ratio), "{flat} vs {allocated}");

    // The heap, a gauge, names the allocation site of what is live.
    let inuse = format!("memory:inuse_space:bytes:space:bytes{selector}");
    let (flat, top) = top_value(store.addr, &inuse, "main.allocateKnown", "flat");
    assert!(
        flat.is_some_and(|f| f > 0),
        "main.allocateKnown is not live in {top}"
    );

    // Goroutines, a gauge: one scrape per 2 s, so each 1 s step of the
    // timeline holds at most one scrape's count. The program's count plus
    // the goroutines serving scrapes in flight (at most one per slot).
    let goroutine = format!("goroutine:goroutine:count:goroutine:count{selector}");
    let timeline = get(
        store.addr,
        &format!(
            "/api/v1/timeline?query={}&from=now-10m&to=now&step=1s",
            enc(&goroutine)
        ),
    );
    assert_eq!(timeline.status, 200, "{}", timeline.text());
    let timeline = timeline.json();
    let counts: Vec<i64> = timeline["timeline"]["values"]
        .as_array()
        .into_iter()
        .flatten()
        .map(json_int64)
        .filter(|v| *v != 0)
        .collect();
    eprintln!("goroutine counts scraped: {counts:?}; the program counted {goroutines}");
    assert!(counts.len() >= 3, "{timeline}");
    for count in &counts {
        assert!(
            (goroutines..=goroutines + SLOTS).contains(count),
            "{count} goroutines scraped, the program counted {goroutines}"
        );
    }
    // Parked in runtime.gopark, called from main.parked: its cumulative.
    let (parked, top) = top_value(store.addr, &goroutine, "main.parked", "cumulative");
    let parked = parked.unwrap_or_else(|| panic!("main.parked is not in {top}"));
    assert_eq!(parked, PARKED * counts.len() as i64, "{top}");

    for (name, query) in [
        ("allocs", &allocs),
        ("heap", &inuse),
        ("goroutine", &goroutine),
    ] {
        let export = get(
            store.addr,
            &format!("/api/v1/pprof?query={}&from=now-10m&to=now", enc(query)),
        );
        assert_eq!(export.status, 200, "{name}: {}", export.text());
        go_pprof_reads(dir.path(), name, &export.body);
    }
}

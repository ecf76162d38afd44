//! A writer that makes fresh series in every head window: the store's
//! series limits count what it retains (heads and blocks within
//! retention), so a series flushed to a block still counts and the writer
//! cannot add `--max-series-per-namespace` fresh series per flush,
//! forever, growing blocks, listings and queries without bound. A series
//! that a block holds is not new: its writer is still served.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kiln_testkit::clock::now_s;
use kiln_testkit::http::{enc, http};

use super::{Attack, Expect, Hostile};

/// Series the churning namespace may hold.
const CAP: usize = 100;
/// Fresh series sent between two flushes.
const PER_WINDOW: usize = 60;
/// Head windows the writer churns through.
const WINDOWS: usize = 5;
/// How long to wait for a flush to show in `/metrics`.
const FLUSH_WITHIN: Duration = Duration::from_secs(20);

fn ingest_target(pod: usize) -> String {
    let name = format!("churn.cpu{{namespace=\"churn\",pod=\"p{pod}\"}}");
    format!(
        "/ingest?name={}&format=folded&from={}&until={}",
        enc(&name),
        now_s() - 10,
        now_s()
    )
}

/// The blocks the store lists, from `/metrics`.
fn blocks(addr: SocketAddr) -> Option<u64> {
    let response = http(addr, "GET", "/metrics", &[], b"").ok()?;
    response
        .text()
        .lines()
        .find_map(|line| line.strip_prefix("kiln_blocks "))
        .and_then(|value| value.trim().parse().ok())
}

/// Waits until the store's block count moves (a flush, or a compaction
/// of flushed blocks); returns whether it did.
fn wait_for_flush(addr: SocketAddr, before: Option<u64>) -> bool {
    let started = Instant::now();
    while started.elapsed() < FLUSH_WITHIN {
        let now = blocks(addr);
        if now.is_some() && now != before {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn fresh_series_in_every_head_window() {
    let cap = format!("--max-series-per-namespace={CAP}");
    let Some(attack) = Attack::start_with_flags(
        "fresh_series_in_every_head_window",
        &["--flush-interval=1s", &cap],
    ) else {
        return;
    };
    attack.run(|addr| {
        let mut hostile = Vec::new();
        let mut flushes = 0;
        let mut accepted = 0;
        for window in 0..WINDOWS {
            let before = blocks(addr);
            for i in 0..PER_WINDOW {
                let pod = window * PER_WINDOW + i;
                // Until the cap, a fresh series may be stored; past it,
                // whatever the head has forgotten, it must be refused.
                let expect = if pod < CAP {
                    Expect::ServedOrRefused
                } else {
                    Expect::Refused
                };
                let sent = Hostile::http(
                    format!("fresh series {pod} (head window {window})"),
                    expect,
                    addr,
                    "POST",
                    &ingest_target(pod),
                    &[],
                    b"main;work 1\n",
                );
                if sent.answer.short() == "200" {
                    accepted += 1;
                }
                hostile.push(sent);
            }
            if wait_for_flush(addr, before) {
                flushes += 1;
            }
        }
        eprintln!(
            "fresh series: {} sent over {flushes} flushes, {accepted} accepted (cap {CAP})",
            WINDOWS * PER_WINDOW
        );
        hostile.push(Hostile::http(
            format!("a series stored before the cap, after {flushes} flushes"),
            Expect::Served,
            addr,
            "POST",
            &ingest_target(0),
            &[],
            b"main;work 1\n",
        ));
        hostile
    });
}

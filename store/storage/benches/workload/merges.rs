//! The workload's merge queries: cold and warm merges over 1 h, 24 h and
//! 7 d for one pod and for all pods, after ingest or on a store an earlier
//! run kept (`KILN_BENCH_QUERY_DIR`).

use std::path::Path;
use std::time::{Duration, Instant};

use kiln_engine::model::{MatchOp, Matcher, Selector, TimeRange};
use kiln_storage::Store;
use kiln_storage::planner::{DAY_MS, HOUR_MS};

use super::measure::{mem_trace, process_cpu, reset_hwm, vm_hwm_kib};
use super::{bench_runtime, cpu_type, open_store, pod_name, store_config};

/// Cold and warm (median of 5) latency of one merge, each in wall time and
/// in this process's CPU time.
struct MergeTiming {
    cold_wall: Duration,
    cold_cpu: f64,
    warm_wall: Duration,
    warm_cpu: f64,
    total: i64,
}

async fn timed_merge(store: &Store, selector: &Selector, range: TimeRange) -> MergeTiming {
    let cpu = process_cpu();
    let start = Instant::now();
    let merged = store.merge(selector, range).await.expect("merge");
    let cold_wall = start.elapsed();
    let cold_cpu = process_cpu() - cpu;
    let mut walls = Vec::new();
    let mut cpus = Vec::new();
    for _ in 0..5 {
        let cpu = process_cpu();
        let start = Instant::now();
        let m = store.merge(selector, range).await.expect("merge");
        walls.push(start.elapsed());
        cpus.push(process_cpu() - cpu);
        assert_eq!(m.total(), merged.total(), "repeat merge is stable");
    }
    walls.sort();
    cpus.sort_by(f64::total_cmp);
    MergeTiming {
        cold_wall,
        cold_cpu,
        warm_wall: walls[walls.len() / 2],
        warm_cpu: cpus[cpus.len() / 2],
        total: merged.total(),
    }
}

/// Cold and warm merges over 1 h, 24 h and 7 d before `end_ms`, for one
/// pod and for all pods, printed and added to `summary`; returns the peak
/// RSS (KiB) seen meanwhile.
pub(crate) async fn merge_latencies(store: &Store, end_ms: i64, summary: &mut Vec<String>) -> u64 {
    let mut peak_kib = 0;
    println!(
        "\n== merge latency (cold = first query, blocks fetched + decoded; warm = median of 5)"
    );
    let one = Selector {
        profile_type: cpu_type(),
        matchers: vec![Matcher {
            name: "pod".into(),
            op: MatchOp::Equal,
            value: pod_name(42),
        }],
    };
    let all = Selector {
        profile_type: cpu_type(),
        matchers: vec![],
    };
    for (name, span) in [("1 h", HOUR_MS), ("24 h", DAY_MS), ("7 d", 7 * DAY_MS)] {
        let range = TimeRange {
            start_ms: end_ms - span,
            end_ms,
        };
        for (who, selector) in [("one pod", &one), ("all pods", &all)] {
            let t = timed_merge(store, selector, range).await;
            println!(
                "{name:>5} {who:<9} cold {:>8.2} ms wall {:>8.2} ms CPU | warm {:>8.2} ms wall {:>8.2} ms CPU  (total {})",
                t.cold_wall.as_secs_f64() * 1000.0,
                t.cold_cpu * 1000.0,
                t.warm_wall.as_secs_f64() * 1000.0,
                t.warm_cpu * 1000.0,
                t.total
            );
            summary.push(format!(
                "merge_{}_{}_ms_cpu cold={:.2} warm={:.2}",
                name.replace(' ', ""),
                who.replace(' ', "_"),
                t.cold_cpu * 1000.0,
                t.warm_cpu * 1000.0
            ));
            mem_trace(&format!("after {name} {who} queries"), store);
            peak_kib = peak_kib.max(vm_hwm_kib());
            reset_hwm();
        }
    }
    peak_kib
}

/// Queries a store an earlier run left in `root`, from this fresh process:
/// the same merges as after ingest, on the same blocks, so two builds (or
/// two tries of one) compare cold merges without ingesting again.
pub(crate) fn query_only(root: &Path, end_ms: i64, concurrency: usize) {
    let (config, _) = store_config(root, concurrency);
    bench_runtime().block_on(async move {
        let store = open_store(root, config).await;
        let blocks = store.blocks();
        println!(
            "query only: {} blocks, {:.2} MiB, left by an earlier run in {}",
            blocks.len(),
            blocks.iter().map(|b| b.size_bytes).sum::<u64>() as f64 / 1048576.0,
            root.display()
        );
        reset_hwm();
        let mut summary = Vec::new();
        let peak_kib = merge_latencies(&store, end_ms, &mut summary).await;
        println!(
            "\npeak RSS (VmHWM) of the queries: {:.0} MiB",
            peak_kib as f64 / 1024.0
        );
        println!();
        for line in summary {
            println!("SUMMARY {line}");
        }
    });
}

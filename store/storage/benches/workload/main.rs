//! End-to-end store benchmark on a workload built from the real fixtures in
//! `../shared/testdata/profiles`: 500 pods each sending a 10 s CPU profile,
//! replayed over simulated time through the full `Store` path (pprof decode,
//! WAL append + fsync, head ingest, block encode/upload, compaction), then
//! merge queries over 1 h, 24 h and 7 days.
//!
//! Run: `cargo bench -p kiln-storage --bench workload`
//! Knobs (env): KILN_BENCH_PODS (500), KILN_BENCH_SAMPLES (300 stacks drawn
//! per profile), KILN_BENCH_FULL_HOURS (1: hours at the full 10 s cadence
//! before the end), KILN_BENCH_DAY_STEP_S (600: cadence for the rest of the
//! last 24 h), KILN_BENCH_WEEK_STEP_S (3600: cadence for days 2-7),
//! KILN_BENCH_CONCURRENCY (32 concurrent ingests), KILN_BENCH_HEAD_SHARDS
//! (the store's default: the cores, at most 8), KILN_BENCH_MEMORY_BUDGET
//! (bytes; the store sized as kiln-store sizes it from --memory-budget),
//! KILN_BENCH_FLUSH_S (the store's flush interval, 60 s: how often the
//! simulated clock cuts the head), KILN_BENCH_INGEST_WORKERS (the store's
//! default: the cores; how many ingests decode or apply at once),
//! KILN_BENCH_QUERY_DIR (keep the run's store in this directory; run again
//! on a directory that holds a finished run, it only opens the store and
//! runs the merges, cold from a fresh process: an A/B of two builds'
//! queries on the same blocks).
#![allow(clippy::print_stdout)]

mod measure;
mod merges;
mod payloads;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kiln_engine::model::{Label, LabelSet, ProfileType};
use kiln_pprof::DecodeLimits;
use kiln_storage::planner::{DAY_MS, HOUR_MS};
use kiln_storage::{BucketConfig, IngestRequest, Store, StoreConfig};
use measure::{heap_in_use_bytes, mem_trace, process_cpu, reset_hwm, status_kib, vm_hwm_kib};
use merges::{merge_latencies, query_only};
use payloads::{Frame, Rng, fixture_stacks, reshape};

const STEP_MS: i64 = 10_000;
const FIXTURES: [&str; 4] = [
    "google-pprof/large.cpu.pb.gz",
    "google-pprof/sample.cpu.pb.gz",
    "parca/profile-with-labels.pb.gz",
    "grafana-pyroscope/cpu-unknown.pb.gz",
];
const SERVICES: usize = 20;
const VARIANTS: usize = 6;

fn env_or(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Every file under `dir`, recursively, with its size.
fn files_with_sizes(dir: &Path, out: &mut Vec<(u64, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.metadata() {
            Ok(m) if m.is_dir() => files_with_sizes(&path, out),
            Ok(m) => out.push((m.len(), path)),
            Err(_) => {}
        }
    }
}

/// Where the bytes of the `count` largest blocks in the bucket go, section
/// by section, stored and decompressed: what a cold query that reads a
/// block whole has to fetch, and what of it is symbol tables.
fn print_largest_blocks_sections(bucket_dir: &Path, count: usize) {
    use std::io::Read as _;
    let mut files = Vec::new();
    files_with_sizes(bucket_dir, &mut files);
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    for (size, path) in files.into_iter().take(count) {
        let mut header = vec![0u8; 4096];
        let read = std::fs::File::open(&path).and_then(|mut f| f.read(&mut header));
        let Ok(read) = read else { continue };
        header.truncate(read);
        let Ok(sections) = kiln_engine::block::format::section_sizes(&header) else {
            continue; // not a block (the bucket holds leases and markers too)
        };
        let parts: Vec<String> = sections
            .iter()
            .map(|s| {
                format!(
                    "{} {:.1}/{:.1}",
                    s.kind,
                    s.stored as f64 / 1048576.0,
                    s.raw as f64 / 1048576.0
                )
            })
            .collect();
        println!(
            "block of {:.1} MiB, sections stored/raw MiB: {}",
            size as f64 / 1048576.0,
            parts.join(", ")
        );
    }
}

fn cpu_type() -> ProfileType {
    ProfileType {
        name: "process_cpu".into(),
        sample_type: "cpu".into(),
        sample_unit: "nanoseconds".into(),
        period_type: "cpu".into(),
        period_unit: "nanoseconds".into(),
        delta: true,
    }
}

fn pod_name(p: usize) -> String {
    format!("svc-{:02}-{:04}", p % SERVICES, p)
}

/// Simulated send times: full cadence for the last `full_hours`, `day_step`
/// for the rest of the last 24 h, `week_step` for days 2-7.
fn schedule(end_ms: i64, full_hours: i64, day_step_ms: i64, week_step_ms: i64) -> Vec<i64> {
    let mut times = Vec::new();
    let week_start = end_ms - 7 * DAY_MS;
    let day_start = end_ms - DAY_MS;
    let full_start = end_ms - full_hours * HOUR_MS;
    let mut t = week_start;
    while t < day_start {
        times.push(t);
        t += week_step_ms;
    }
    t = day_start;
    while t < full_start {
        times.push(t);
        t += day_step_ms;
    }
    t = full_start;
    while t < end_ms {
        times.push(t);
        t += STEP_MS;
    }
    times
}

/// The store's configuration for a run kept under `root` (data dir and
/// bucket), and the memory budget it was sized from, if any.
fn store_config(root: &Path, concurrency: usize) -> (StoreConfig, Option<u64>) {
    let mut config = StoreConfig::new(root.join("data"), "bench");
    config.background = false;
    // The workload's profiles carry fixed 2023 timestamps.
    config.accepted_times = kiln_storage::AcceptedTimes::Any;
    config.max_inflight_ingests = concurrency * 2;
    // KILN_BENCH_MEMORY_BUDGET (bytes): the store sized from one memory
    // budget as kiln-store sizes it from --memory-budget, and a head that
    // reaches its cap flushed at once, as the server's background loop
    // does. Without it: StoreConfig's defaults (a 256 MiB head) and room
    // for every block in the cache, so warm queries measure merging.
    let memory_budget = std::env::var("KILN_BENCH_MEMORY_BUDGET")
        .ok()
        .map(|v| v.parse::<u64>().expect("KILN_BENCH_MEMORY_BUDGET is bytes"));
    match memory_budget {
        Some(budget) => config.apply_memory_budget(budget),
        None => config.block_cache_bytes = 1 << 30,
    }
    println!(
        "memory: head cap {} MiB, block cache {} MiB, compaction budget {} MiB",
        config.max_head_bytes >> 20,
        config.block_cache_bytes >> 20,
        config.compaction_memory_bytes >> 20
    );
    if let Ok(shards) = std::env::var("KILN_BENCH_HEAD_SHARDS") {
        config.head_shards = shards.parse().expect("KILN_BENCH_HEAD_SHARDS is a number");
    }
    println!("head shards: {}", config.head_shards);
    if let Ok(workers) = std::env::var("KILN_BENCH_INGEST_WORKERS") {
        config.ingest_workers = workers
            .parse()
            .expect("KILN_BENCH_INGEST_WORKERS is a number");
    }
    println!("ingest workers: {}", config.ingest_workers);
    if let Ok(seconds) = std::env::var("KILN_BENCH_FLUSH_S") {
        let seconds = seconds.parse().expect("KILN_BENCH_FLUSH_S is seconds");
        config.flush_interval = Duration::from_secs(seconds);
    }
    (config, memory_budget)
}

/// The runtime every run drives its store on: two workers, as the VM the
/// figures of record come from has two cores.
fn bench_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The store kept under `root` (its local bucket in `root/bucket`), opened.
async fn open_store(root: &Path, config: StoreConfig) -> Store {
    let bucket = BucketConfig::Local {
        dir: root.join("bucket"),
    }
    .open(None)
    .expect("bucket");
    Store::open(config, bucket).await.expect("open")
}

/// Where a run keeps its store: a temporary directory, or the one
/// KILN_BENCH_QUERY_DIR names, kept for later query-only runs.
enum Root {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

impl Root {
    fn path(&self) -> &Path {
        match self {
            Self::Temp(dir) => dir.path(),
            Self::Kept(dir) => dir,
        }
    }
}

/// The file a finished run leaves in a kept directory: the simulated end
/// of its time axis (unix ms), which the queries are relative to.
const RUN_END_FILE: &str = "workload-end-ms";

/// Single-threaded cost of each ingest stage on the same payloads, to show
/// where the full path's time goes: pprof decode (kiln-pprof, the flat
/// decoder the store's ingest uses), head ingest (kiln-engine) and block
/// encode (kiln-engine).
fn breakdown(payloads: &[Vec<bytes::Bytes>], pods: usize) {
    let n = 3_000;
    let limits = DecodeLimits::default();
    let all: Vec<&bytes::Bytes> = payloads.iter().flatten().collect();
    // Timed in process CPU time: no other thread of ours runs yet, and the
    // machine may be shared.
    let start = process_cpu();
    let mut decoded = Vec::with_capacity(n);
    for i in 0..n {
        decoded.push(kiln_pprof::decode_flat(all[i % all.len()], &limits).expect("decode"));
    }
    let decode_s = process_cpu() - start;
    let labels: Vec<LabelSet> = (0..pods)
        .map(|p| {
            LabelSet::new(vec![
                Label::new("__name__", "process_cpu"),
                Label::new("pod", pod_name(p)),
            ])
        })
        .collect();
    let mut head = kiln_engine::Head::new();
    let ingest_limits = kiln_engine::IngestLimits::default();
    let start = process_cpu();
    let mut values = 0;
    for (i, profile) in decoded.iter().enumerate() {
        let stats = head
            .ingest(
                profile,
                &labels[i % pods],
                1_700_000_000_000 + i as i64,
                10_000_000_000,
                &ingest_limits,
            )
            .expect("ingest");
        values += stats.samples;
    }
    let ingest_s = process_cpu() - start;
    let start = process_cpu();
    let (_, block) =
        kiln_engine::encode_block(&head, &ulid::Ulid::new().to_string(), "bench").expect("encode");
    let encode_s = process_cpu() - start;
    println!("\n== single-thread stage costs over {n} profiles ({values} values), per CPU-second");
    println!(
        "pprof decode (gunzip + wire scan + flat read + validate): {:.0} profiles/s",
        n as f64 / decode_s
    );
    println!(
        "head ingest: {:.0} profiles/s, {:.0} values/s",
        n as f64 / ingest_s,
        values as f64 / ingest_s
    );
    println!(
        "block encode of that head: {:.2} s ({:.1} MiB)",
        encode_s,
        block.len() as f64 / 1048576.0
    );
    println!(
        "decode + ingest + encode per profile: {:.0} profiles/s\n",
        n as f64 / (decode_s + ingest_s + encode_s)
    );
}

/// Ingests `request`, waiting out the store's upload backlog (a head at
/// its cap waiting for the flush), which a client retries.
async fn ingest_retrying(
    store: &Store,
    request: IngestRequest,
) -> Result<kiln_engine::IngestStats, kiln_storage::StorageError> {
    loop {
        match store.ingest(request.clone()).await {
            Err(kiln_storage::StorageError::UploadBacklog { .. }) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => return other,
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let Some(testdata) = kiln_testkit::fixtures::shared_testdata("profiles") else {
        return;
    };
    let pods = env_or("KILN_BENCH_PODS", 500) as usize;
    let samples = env_or("KILN_BENCH_SAMPLES", 300) as usize;
    let full_hours = env_or("KILN_BENCH_FULL_HOURS", 1);
    let day_step_ms = env_or("KILN_BENCH_DAY_STEP_S", 600) * 1000;
    let week_step_ms = env_or("KILN_BENCH_WEEK_STEP_S", 3600) * 1000;
    let concurrency = env_or("KILN_BENCH_CONCURRENCY", 32) as usize;
    if let Some(dir) = std::env::var_os("KILN_BENCH_QUERY_DIR").map(PathBuf::from)
        && let Ok(end) = std::fs::read_to_string(dir.join(RUN_END_FILE))
    {
        let end_ms = end.trim().parse().expect("a run's end in ms");
        query_only(&dir, end_ms, concurrency);
        return;
    }

    // Workload: SERVICES services x VARIANTS distinct 10 s profiles each,
    // reshaped from the fixtures; pod p runs service p % SERVICES.
    let fixture_stacks: Vec<Vec<Vec<Frame>>> = FIXTURES
        .iter()
        .map(|f| fixture_stacks(&testdata.join(f)))
        .collect();
    let mut rng = Rng(42);
    let payloads: Vec<Vec<bytes::Bytes>> = (0..SERVICES)
        .map(|s| {
            (0..VARIANTS)
                .map(|_| reshape(&fixture_stacks[s % FIXTURES.len()], samples, &mut rng).into())
                .collect()
        })
        .collect();
    let pool_bytes: usize = payloads.iter().flatten().map(|p| p.len()).sum();
    println!(
        "workload: {pods} pods, {SERVICES} services x {VARIANTS} profile variants from {} fixtures, {} stacks drawn per profile, mean {} gzipped bytes per profile",
        FIXTURES.len(),
        samples,
        pool_bytes / (SERVICES * VARIANTS)
    );

    // The resolved fixture stacks (full strings per frame) are only needed
    // to build the payloads; keeping them would charge the store's memory
    // figures with a few hundred MiB of harness data.
    drop(fixture_stacks);
    breakdown(&payloads, pods);
    // The breakdown's decoded profiles and head are freed, but glibc keeps
    // the pages; give them back so the RSS figures below are the store's.
    // SAFETY: malloc_trim only releases free allocator memory to the OS.
    unsafe { libc::malloc_trim(0) };
    // Peaks reported below are the store's: start counting from here.
    reset_hwm();
    println!(
        "  mem [after stage breakdown]: RSS {:.0} MiB, peak {:.0} MiB, heap in use {:.0} MiB",
        status_kib("VmRSS") as f64 / 1024.0,
        vm_hwm_kib() as f64 / 1024.0,
        heap_in_use_bytes() as f64 / 1048576.0
    );

    // Simulated time ends at noon on an hour boundary, so the full-cadence
    // hours are complete hours that compaction can merge.
    let end_ms = (1_700_000_000_000 / DAY_MS) * DAY_MS + 12 * HOUR_MS;
    let times = schedule(end_ms, full_hours, day_step_ms, week_step_ms);
    let total_profiles = times.len() * pods;
    println!(
        "schedule: {} send times per pod ({} at 10 s for the last {} h, every {} s for the rest of 24 h, every {} s for days 2-7) = {} profiles",
        times.len(),
        full_hours * 360,
        full_hours,
        day_step_ms / 1000,
        week_step_ms / 1000,
        total_profiles
    );

    let root = match std::env::var_os("KILN_BENCH_QUERY_DIR").map(PathBuf::from) {
        Some(dir) => Root::Kept(dir),
        None => Root::Temp(tempfile::tempdir().expect("tempdir")),
    };
    let bucket_dir = root.path().join("bucket");
    let (config, memory_budget) = store_config(root.path(), concurrency);
    let flush_ms = i64::try_from(config.flush_interval.as_millis())
        .expect("flush interval fits")
        .max(1);
    println!("flush every {} s of simulated time", flush_ms / 1000);
    bench_runtime().block_on(async move {
        let store = open_store(root.path(), config).await;
        // Under a memory budget, what the server's flush loop does on
        // `flush_now`: cut and upload a head that reached its cap. (Its CPU
        // counts as ingest's.)
        let cap_flusher = memory_budget.map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let cap = store.config().max_head_bytes as u64;
                loop {
                    if store.stats().head_bytes >= cap {
                        store.flush().await.expect("flush at the head's cap");
                    } else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            })
        });
        let labels: Vec<LabelSet> = (0..pods)
            .map(|p| {
                LabelSet::new(vec![
                    Label::new("__name__", "process_cpu"),
                    Label::new("namespace", format!("ns-{}", p % 5)),
                    Label::new("service_name", format!("svc-{:02}", p % SERVICES)),
                    Label::new("pod", pod_name(p)),
                    Label::new("node", format!("node-{}", p % 25)),
                    Label::new("container", "app"),
                ])
            })
            .collect();

        // Ingest, flushing at every flush interval of simulated time (the
        // store's default unless KILN_BENCH_FLUSH_S) and compacting as
        // simulated hours complete.
        let cpu0 = process_cpu();
        let wall0 = Instant::now();
        let mut ingested_samples: u64 = 0;
        let mut input_bytes: u64 = 0;
        let mut flush_time = Duration::ZERO;
        let mut compact_time = Duration::ZERO;
        // Process CPU inside flush and compaction calls: nothing else runs
        // then (no background loops, no ingest in flight).
        let mut flush_cpu = 0.0;
        let mut compact_cpu = 0.0;
        let mut last_flush_slot = times[0] / flush_ms;
        let mut last_compact_hour = times[0] / HOUR_MS;
        let mut profiles_done = 0usize;
        // The full-cadence hours (the last KILN_BENCH_FULL_HOURS) are what a
        // store sees in steady state: every pod every 10 s, a flush holding
        // six steps of every pod. The sparse days before them flush after
        // every step, each head holding one profile per pod, which a real
        // store never sees. So the full-cadence hours' CPU, from their first
        // step through the final compaction, is reported on its own.
        let full_start_ms = end_ms - full_hours * HOUR_MS;
        let mut steady_start: Option<(f64, usize)> = None;
        // VmHWM is reset per stage for the trace; the run's peak is the max.
        let mut peak_kib = 0u64;
        let mut compact_peak_kib = 0u64;
        for (step, &t) in times.iter().enumerate() {
            if t / flush_ms != last_flush_slot {
                last_flush_slot = t / flush_ms;
                let (f, c) = (Instant::now(), process_cpu());
                store.flush().await.expect("flush");
                flush_time += f.elapsed();
                flush_cpu += process_cpu() - c;
            }
            if t >= full_start_ms && steady_start.is_none() {
                steady_start = Some((process_cpu(), profiles_done));
            }
            if t / HOUR_MS != last_compact_hour {
                last_compact_hour = t / HOUR_MS;
                peak_kib = peak_kib.max(vm_hwm_kib());
                reset_hwm();
                let (f, c) = (Instant::now(), process_cpu());
                store.compact(t).await.expect("compact");
                compact_time += f.elapsed();
                compact_cpu += process_cpu() - c;
                let hwm = vm_hwm_kib();
                if hwm > compact_peak_kib {
                    compact_peak_kib = hwm;
                    mem_trace("after compaction (new compaction peak)", &store);
                }
                peak_kib = peak_kib.max(hwm);
                reset_hwm();
            }
            let requests = (0..pods).map(|p| {
                let payload = payloads[p % SERVICES][(p + step) % VARIANTS].clone();
                input_bytes += payload.len() as u64;
                IngestRequest {
                    labels: labels[p].clone(),
                    time_ms: Some(t + (p as i64 * 17) % STEP_MS),
                    duration_nanos: Some(10_000_000_000),
                    pprof: payload,
                    writer: Default::default(),
                }
            });
            let mut results = futures::stream::iter(requests.map(|r| ingest_retrying(&store, r)))
                .buffer_unordered(concurrency);
            while let Some(result) = results.next().await {
                ingested_samples += result.expect("ingest").samples;
            }
            profiles_done += pods;
            if step % 200 == 0 {
                println!(
                    "  progress: {profiles_done}/{total_profiles} profiles, {:.0} s",
                    wall0.elapsed().as_secs_f64()
                );
                mem_trace("ingest", &store);
            }
        }
        if let Some(task) = cap_flusher {
            task.abort();
        }
        let (f, c) = (Instant::now(), process_cpu());
        store.flush().await.expect("flush");
        flush_time += f.elapsed();
        flush_cpu += process_cpu() - c;
        let wall = wall0.elapsed().as_secs_f64();
        let cpu = process_cpu() - cpu0;
        mem_trace("after final flush", &store);
        peak_kib = peak_kib.max(vm_hwm_kib());
        let hwm_ingest = peak_kib;
        reset_hwm();
        // The store's background loop compacts again every interval until
        // nothing is left to merge; a merge trimmed to the compaction budget
        // leaves the rest of its window for the next pass. Run those passes
        // here, so the queries below see the blocks a store settles on.
        let compact0 = Instant::now();
        let mut report = store.compact(end_ms + 10 * 60_000).await.expect("compact");
        let mut passes = 1;
        while !report.written.is_empty() && passes < 100 {
            let next = store.compact(end_ms + 10 * 60_000).await.expect("compact");
            passes += 1;
            if next.written.is_empty() {
                break;
            }
            report.written.extend(next.written);
        }
        println!("final compaction: {passes} passes");
        let steady = steady_start.map(|(cpu_mark, done)| {
            ((total_profiles - done) as f64, process_cpu() - cpu_mark)
        });
        compact_time += compact0.elapsed();
        mem_trace("after final compaction", &store);
        let final_compact_kib = vm_hwm_kib();
        peak_kib = peak_kib.max(final_compact_kib);
        reset_hwm();
        let blocks = store.blocks();
        let block_bytes: u64 = blocks.iter().map(|b| b.size_bytes).sum();
        let stored_samples: u64 = blocks.iter().map(|b| b.samples).sum();
        let profiles = total_profiles as f64;
        println!("\n== ingest (full Store path: decode + WAL fsync + head + flushes + hourly compaction)");
        println!("profiles: {total_profiles}, sample values stored: {ingested_samples}, gzipped input: {:.1} MiB", input_bytes as f64 / 1048576.0);
        println!("wall: {wall:.1} s, process CPU: {cpu:.1} s (of which flush {:.1} s wall, compaction {:.1} s wall)", flush_time.as_secs_f64(), compact_time.as_secs_f64());
        println!("process CPU by phase: ingest {:.1} s, flush {flush_cpu:.1} s, compaction {compact_cpu:.1} s", cpu - flush_cpu - compact_cpu);
        println!("throughput per CPU-second: {:.0} profiles/s, {:.0} samples/s", profiles / cpu, ingested_samples as f64 / cpu);
        println!("throughput wall (2 cores): {:.0} profiles/s, {:.0} samples/s", profiles / wall, ingested_samples as f64 / wall);
        if let Some((steady_profiles, steady_cpu)) = steady {
            println!(
                "full-cadence hours (10 s per pod): {steady_profiles:.0} profiles, {steady_cpu:.1} s CPU with their flushes and the final compaction = {:.0} profiles/s per CPU-second",
                steady_profiles / steady_cpu
            );
        }
        println!("peak RSS (VmHWM) after ingest: {:.0} MiB", hwm_ingest as f64 / 1024.0);
        println!("\n== storage after compaction (final pass wrote {} blocks)", report.written.len());
        let levels: Vec<u32> = blocks.iter().map(|b| b.compaction_level).collect();
        println!("blocks: {} (levels {:?})", blocks.len(), levels);
        println!("block bytes: {:.2} MiB for {stored_samples} stored values = {:.2} bytes/value", block_bytes as f64 / 1048576.0, block_bytes as f64 / stored_samples.max(1) as f64);
        println!("fraction of gzipped pprof input: {:.2} %", 100.0 * block_bytes as f64 / input_bytes as f64);
        print_largest_blocks_sections(&bucket_dir, 3);

        // One line per figure, `SUMMARY name value...`, for store/bench/scale.sh.
        let mut summary = vec![
            format!("pods {pods}"),
            format!("profiles {total_profiles}"),
            format!("peak_rss_ingest_mib {:.0}", hwm_ingest as f64 / 1024.0),
            format!(
                "peak_rss_compaction_mib {:.0}",
                compact_peak_kib.max(final_compact_kib) as f64 / 1024.0
            ),
            format!("bytes_per_value {:.2}", block_bytes as f64 / stored_samples.max(1) as f64),
            format!("ingest_profiles_per_cpu_s {:.0}", profiles / cpu),
            format!("ingest_values_per_cpu_s {:.0}", ingested_samples as f64 / cpu),
            format!(
                "ingest_full_cadence_profiles_per_cpu_s {}",
                steady.map_or("none (KILN_BENCH_FULL_HOURS=0)".to_string(), |(profiles, cpu)| {
                    format!("{:.0}", profiles / cpu)
                })
            ),
            format!(
                "ingest_cpu_s_by_phase ingest={:.1} flush={flush_cpu:.1} compaction={compact_cpu:.1}",
                cpu - flush_cpu - compact_cpu
            ),
        ];
        peak_kib = peak_kib.max(merge_latencies(&store, end_ms, &mut summary).await);
        println!("\npeak RSS (VmHWM) at end: {:.0} MiB", peak_kib.max(vm_hwm_kib()) as f64 / 1024.0);
        println!("peak RSS of one hourly/daily compaction (ingest phase): {:.0} MiB", compact_peak_kib as f64 / 1024.0);
        let stats = store.stats();
        println!("store stats: {stats:?}");
        println!();
        for line in summary {
            println!("SUMMARY {line}");
        }
        if let Root::Kept(dir) = &root {
            std::fs::write(dir.join(RUN_END_FILE), end_ms.to_string()).expect("run end written");
            println!("kept for query-only runs: {}", dir.display());
        }
    });
}

//! Store-side symbolization at 500 pods (issue 51): what naming frames at
//! query time costs a flame graph, cold and warm, against the same profiles
//! named at ingest.
//!
//! The binary is the `kiln-store` this bench runs (about 125 MB with its
//! DWARF, a GNU build id). `KILN_BENCH_ADDRESSES` (default 2,000) of its
//! functions' addresses make `KILN_BENCH_PODS` pods' profiles (default
//! 500), each `KILN_BENCH_STACKS` stacks (default 40) of depth 10, as an
//! agent that cannot name a stripped binary sends them: build id, file
//! offset, no name. The same profiles are also ingested named, with the
//! frames the store's symbolizer gives each address (inlined calls, file
//! and line), under another label: an already-symbolized query of the
//! same answer. After `POST
//! /api/v1/debuginfo` of the binary, the bench times the first flame graph
//! over every unnamed pod (cold: every address resolved), then
//! `KILN_BENCH_QUERIES` (default 20) more of each kind, and prints the
//! medians; and, before the upload, the median of as many queries of the
//! unnamed pods left unnamed (what storing frames unnamed costs, apart
//! from naming them). Every answer must hold its kind's total, and the
//! named ones no `Kiln-Partial` and no unnamed frame.
//!
//! Usage: cargo bench -p kiln-store --bench symbols

// A benchmark reports on standard output.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use kiln_pprof::{FunctionSpec, MappingSpec, ProfileBuilder};
use kiln_testkit::clock::now_nanos;
use kiln_testkit::http::{enc, http};
use kiln_testkit::store_process::StoreProcess;
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");
/// Where the bench pretends the binary's code was mapped.
const LOAD_BIAS: u64 = 0x5555_0000_0000;
const DEPTH: usize = 10;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An address in the mapped process, and the frames the debug info gives
/// it (innermost first: inlined calls, then the function they are in).
type NamedAddress = (u64, Vec<kiln_debuginfo::Frame>);

/// The binary's build id, the mapping of its code, and `count` functions
/// spread over it, each named as the store's symbolizer names it.
fn functions(binary: &[u8], count: usize) -> (MappingSpec, Vec<NamedAddress>) {
    let file = object::File::parse(binary).expect("an ELF file");
    let build_id: String = file
        .build_id()
        .expect("notes")
        .expect("kiln-store has a GNU build id")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let code = file
        .segments()
        .max_by_key(|s| s.size())
        .expect("a code segment");
    let (offset, size) = code.file_range();
    let memory_start = LOAD_BIAS + (code.address() & !0xfff);
    let mapping = MappingSpec {
        memory_start,
        memory_limit: memory_start + ((size + 0xfff) & !0xfff),
        file_offset: offset & !0xfff,
        filename: "/usr/local/bin/kiln-store".to_owned(),
        build_id,
        has_functions: false,
    };
    let mut all: Vec<u64> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() >= 16)
        .filter(|s| code.address() <= s.address() && s.address() < code.address() + code.size())
        .map(|s| LOAD_BIAS + s.address() + s.size() / 2)
        .collect();
    all.sort_unstable();
    all.dedup();
    assert!(all.len() >= count, "only {} functions", all.len());
    let debug =
        kiln_debuginfo::DebugFile::parse(binary, kiln_debuginfo::DebugInfoLimits::default())
            .expect("the store's own debug info");
    let step = all.len() / count;
    let chosen = all
        .into_iter()
        .step_by(step)
        .take(count)
        .map(|address| {
            let offset = mapping.file_offset + (address - mapping.memory_start);
            (address, debug.frames(offset, mapping.file_offset))
        })
        .collect();
    (mapping, chosen)
}

/// Pod `pod`'s profile: `stacks` stacks of DEPTH functions drawn from
/// `functions`, named or not; and its sample total.
fn profile(
    pod: usize,
    stacks: usize,
    mapping: &MappingSpec,
    functions: &[NamedAddress],
    named: bool,
) -> (Vec<u8>, i64) {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder.period("cpu", "nanoseconds", 10_000_000);
    builder.time(now_nanos() - 60_000_000_000, 10_000_000_000);
    let mapping_id = builder.mapping(&MappingSpec {
        has_functions: named,
        ..mapping.clone()
    });
    let mut state = pod as u64 * 2_654_435_761 + 7;
    let mut next = |bound: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as usize % bound
    };
    let mut total = 0;
    for _ in 0..stacks {
        let locations: Vec<u64> = (0..DEPTH)
            .map(|_| {
                let (address, frames) = &functions[next(functions.len())];
                let lines: Vec<(u64, i64)> = if named {
                    frames
                        .iter()
                        .map(|frame| {
                            let function = builder.function(&FunctionSpec {
                                name: frame.function.clone(),
                                filename: frame.file.clone(),
                                ..FunctionSpec::default()
                            });
                            (function, i64::from(frame.line))
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                builder.location(mapping_id, *address, &lines)
            })
            .collect();
        let value = 10_000_000 * (1 + next(9) as i64);
        total += value;
        builder.sample(&locations, &[value], &[]);
    }
    (kiln_pprof::encode_gzip(&builder.finish()), total)
}

/// One flame graph over every pod of `kind`: its time, total and partial
/// header. With `named`, every frame it names must be a function's name,
/// not the binary's name and an offset.
fn flame_graph(store: &StoreProcess, kind: &str, named: bool) -> (Duration, i64, Option<String>) {
    let query = format!("process_cpu:cpu{{kind=\"{kind}\"}}");
    let target = format!("/api/v1/flamegraph?query={}&from=now-1h", enc(&query));
    let started = Instant::now();
    let response = http(store.addr, "GET", &target, &[], b"").expect("query");
    let took = started.elapsed();
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    let total = kiln_testkit::http::json_int64(&json["total"]);
    let names = kiln_testkit::http::flamegraph_names(&json);
    assert!(
        names.len() > DEPTH,
        "{kind}: {} names in {json}",
        names.len()
    );
    if let Some(unnamed) = names.iter().find(|n| named && n.contains("+0x")) {
        panic!("{kind}: the frame {unnamed:?} is not named");
    }
    (
        took,
        total,
        response.header("kiln-partial").map(str::to_owned),
    )
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let pods = env_number("KILN_BENCH_PODS", 500);
    let stacks = env_number("KILN_BENCH_STACKS", 40);
    let addresses = env_number("KILN_BENCH_ADDRESSES", 2_000);
    let queries = env_number("KILN_BENCH_QUERIES", 20).max(1);
    let binary = std::fs::read(KILN_STORE).expect("the kiln-store binary");
    let (mapping, functions) = functions(&binary, addresses);
    let store = StoreProcess::start(KILN_STORE, &["--symbolization-wait", "120s"]);

    let mut totals = [0i64; 2];
    for pod in 0..pods {
        for (i, (kind, named)) in [("unnamed", false), ("named", true)]
            .into_iter()
            .enumerate()
        {
            let (pprof, total) = profile(pod, stacks, &mapping, &functions, named);
            totals[i] += total;
            let target = format!(
                "/ingest?name={}&format=pprof",
                enc(&format!("process_cpu{{pod=pod-{pod},kind={kind}}}"))
            );
            let response = http(store.addr, "POST", &target, &[], &pprof).expect("ingest");
            assert_eq!(response.status, 200, "{}", response.text());
        }
    }
    // Before the upload the store has nothing to name them with: what
    // storing and merging unnamed frames costs, apart from naming them.
    let mut unsymbolized = Vec::new();
    for _ in 0..queries {
        let (took, total, _) = flame_graph(&store, "unnamed", false);
        assert_eq!(total, totals[0]);
        unsymbolized.push(took);
    }
    let unsymbolized = median(unsymbolized);
    let started = Instant::now();
    let response = http(store.addr, "POST", "/api/v1/debuginfo", &[], &binary).expect("upload");
    assert_eq!(response.status, 200, "{}", response.text());
    let upload = started.elapsed();

    let (cold, cold_total, partial) = flame_graph(&store, "unnamed", true);
    assert_eq!(partial, None, "the cold query was partial");
    assert_eq!(cold_total, totals[0]);
    let mut warm = Vec::new();
    let mut named = Vec::new();
    for _ in 0..queries {
        let (took, total, partial) = flame_graph(&store, "unnamed", true);
        assert_eq!((total, partial), (totals[0], None));
        warm.push(took);
        let (took, total, partial) = flame_graph(&store, "named", true);
        assert_eq!((total, partial), (totals[1], None));
        named.push(took);
    }
    let (warm, named) = (median(warm), median(named));
    println!(
        "pods={pods} stacks={stacks} depth={DEPTH} addresses={addresses} binary_mb={:.0} \
         upload_s={:.2} cold_s={:.2} warm_ms={:.1} named_ms={:.1} warm_over_named={:+.1}% \
         unsymbolized_ms={:.1}",
        binary.len() as f64 / 1e6,
        upload.as_secs_f64(),
        cold.as_secs_f64(),
        warm.as_secs_f64() * 1e3,
        named.as_secs_f64() * 1e3,
        100.0 * (warm.as_secs_f64() / named.as_secs_f64() - 1.0),
        unsymbolized.as_secs_f64() * 1e3
    );
}

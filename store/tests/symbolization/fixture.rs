//! The test program, its debug file served by a real debuginfod, and the
//! requests every symbolization test makes.

use kiln_pprof::{MappingSpec, ProfileBuilder};
use kiln_testkit::clock::now_nanos;
use kiln_testkit::debuginfod::{Debuginfod, SplitProgram, split_c_program};
use kiln_testkit::http::{HttpResponse, get, http};
use kiln_testkit::store_process::StoreProcess;
use object::{Object, ObjectSegment, ObjectSymbol};

pub const PROGRAM: &str = r#"
#include <stdio.h>
#include <stdlib.h>
static __attribute__((noinline)) unsigned long hot_static_work(unsigned long n) {
    unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++) acc = acc * 31 + i;
    return acc;
}
int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], 0, 10) : 1000;
    printf("%lu\n", hot_static_work(n));
    return 0;
}
"#;

/// A missing build id: debuginfod has nothing for it.
pub const MISSING_BUILD_ID: &str = "00112233445566778899aabbccddeeff00112233";

/// Where the test program's runtime mapping of code starts.
pub const LOAD_BIAS: u64 = 0x5555_5555_4000;

pub fn store_binary() -> &'static str {
    env!("CARGO_BIN_EXE_kiln-store")
}

/// The program, built and split (`kiln_testkit::debuginfod`), and where
/// `hot_static_work` is in a process of its stripped copy.
pub struct Program {
    pub split: SplitProgram,
    /// The code mapping a process of the stripped binary has.
    pub mapping: MappingSpec,
    /// Addresses inside `hot_static_work` in that process.
    pub hot_addresses: Vec<u64>,
}

pub fn build_program() -> Option<Program> {
    let split = split_c_program(PROGRAM, "hot", &["-O1"])?;
    let full = std::fs::read(&split.unstripped).expect("binary");
    let file = object::File::parse(&*full).expect("elf");
    let hot = file
        .symbols()
        .find(|s| s.name() == Ok("hot_static_work"))
        .expect("hot_static_work in the symbol table");
    let code = file
        .segments()
        .find(|s| s.address() <= hot.address() && hot.address() < s.address() + s.size())
        .expect("its segment");
    let (segment_offset, segment_size) = code.file_range();
    let page_offset = segment_offset & !0xfff;
    let memory_start = LOAD_BIAS + (code.address() & !0xfff);
    let mapping = MappingSpec {
        memory_start,
        memory_limit: memory_start + ((segment_size + 0xfff) & !0xfff),
        file_offset: page_offset,
        filename: "/usr/local/bin/hot".to_owned(),
        build_id: split.build_id.clone(),
        has_functions: false,
    };
    let hot_addresses = [4, 8, hot.size() / 2]
        .into_iter()
        .map(|delta| LOAD_BIAS + hot.address() + delta)
        .collect();
    Some(Program {
        split,
        mapping,
        hot_addresses,
    })
}

/// A pprof of `addresses` (leaf first, one stack) in `mapping`, without
/// function names, as an agent that cannot name a stripped binary sends it.
pub fn unsymbolized_pprof(mapping: &MappingSpec, stacks: &[Vec<u64>]) -> Vec<u8> {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder.period("cpu", "nanoseconds", 10_000_000);
    builder.time(now_nanos() - 30_000_000_000, 10_000_000_000);
    let mapping_id = builder.mapping(mapping);
    for stack in stacks {
        let locations: Vec<u64> = stack
            .iter()
            .map(|&address| builder.location(mapping_id, address, &[]))
            .collect();
        builder.sample(&locations, &[10_000_000], &[]);
    }
    kiln_pprof::encode_gzip(&builder.finish())
}

pub fn ingest(store: &StoreProcess, pprof: &[u8], headers: &[(&str, &str)]) {
    let response = http(
        store.addr,
        "POST",
        "/ingest?name=process_cpu%7Bpod%3Dhot%7D&format=pprof",
        headers,
        pprof,
    )
    .expect("ingest");
    assert_eq!(response.status, 200, "{}", response.text());
}

/// The test's series in `/api/v1` selectors.
pub const SERIES: &str = "process_cpu%3Acpu%7Bpod%3D%22hot%22%7D";

/// A GET of `target` that must answer 200.
#[track_caller]
pub fn get_ok(store: &StoreProcess, target: &str) -> HttpResponse {
    let response = get(store.addr, target);
    assert_eq!(response.status, 200, "{target}: {}", response.text());
    response
}

/// The `Kiln-Partial` header of `response`.
pub fn partial(response: &HttpResponse) -> Option<String> {
    response.header("kiln-partial").map(str::to_owned)
}

/// `/api/v1/folded` of the test's series: the answer and its
/// `Kiln-Partial` header.
pub fn folded(store: &StoreProcess) -> (String, Option<String>) {
    let response = get_ok(store, &format!("/api/v1/folded?query={SERIES}&from=now-1h"));
    (response.text(), partial(&response))
}

/// (file, line) of every line of the locations naming `function`.
pub fn function_lines(profile: &kiln_pprof::Profile, function: &str) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for location in profile.locations() {
        for line in &location.line {
            let Some(f) = profile.function(line.function_id) else {
                continue;
            };
            if profile.string(f.name) == function {
                out.push((profile.string(f.filename).to_owned(), line.line));
            }
        }
    }
    out
}

pub fn store_with(extra: &[&str]) -> StoreProcess {
    StoreProcess::start(store_binary(), extra)
}

/// The program built, a debuginfod serving its debug file, and a store
/// that asks it.
pub struct Setup {
    pub program: Program,
    pub server: Debuginfod,
    pub store: StoreProcess,
}

impl Setup {
    /// Builds and starts them, the store waiting `wait` for symbols and
    /// run with `extra`; `None` (said) when a tool is missing.
    pub fn start(wait: &str, extra: &[&str]) -> Option<Self> {
        let program = build_program()?;
        let server = Debuginfod::start(&program.split)?;
        let mut args = vec![
            "--debuginfod-urls",
            &server.url,
            "--symbolization-wait",
            wait,
        ];
        args.extend_from_slice(extra);
        let store = store_with(&args);
        Some(Self {
            program,
            server,
            store,
        })
    }

    /// Ingests one sample of each of `stacks` (leaf first).
    pub fn ingest(&self, stacks: &[Vec<u64>]) {
        ingest(
            &self.store,
            &unsymbolized_pprof(&self.program.mapping, stacks),
            &[],
        );
    }
}

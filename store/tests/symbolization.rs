//! Issue 51: frames that arrive as build id and address only are named at
//! query time. A C program with a static hot function is built here with
//! `gcc -g`, its debug info split off with `objcopy --only-keep-debug`,
//! stripped (its build id kept) and given a debug link. A real `debuginfod`
//! (Debian's) serves the split debug info; a real `kiln-store` gets a pprof
//! whose frames are the stripped binary's addresses of that function (taken
//! from the unstripped binary's symbol table, as a process running the
//! stripped copy would have them), with no function names.
//!
//! Needs gcc, binutils and debuginfod: skipped visibly without them, failed
//! under `CI=true` (./kiln-dev test installs them).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kiln_pprof::{MappingSpec, ProfileBuilder};
use kiln_testkit::binaries::built_binary;
use kiln_testkit::clock::now_nanos;
use kiln_testkit::http::{free_port, http};
use kiln_testkit::prerequisites::missing;
use kiln_testkit::process::KillOnDrop;
use kiln_testkit::store_process::StoreProcess;
use object::{Object, ObjectSegment, ObjectSymbol};

const PROGRAM: &str = r#"
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
const MISSING_BUILD_ID: &str = "00112233445566778899aabbccddeeff00112233";

/// Where the test program's runtime mapping of code starts.
const LOAD_BIAS: u64 = 0x5555_5555_4000;

fn store_binary() -> &'static str {
    env!("CARGO_BIN_EXE_kiln-store")
}

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The program, built: its debug file and its stripped copy (in a
/// directory of their own, for debuginfod to scan), its build id, and
/// where `hot_static_work` is.
struct Program {
    dir: tempfile::TempDir,
    served: PathBuf,
    debug: PathBuf,
    build_id: String,
    /// The code mapping a process of the stripped binary has.
    mapping: MappingSpec,
    /// Addresses inside `hot_static_work` in that process.
    hot_addresses: Vec<u64>,
}

fn build_program() -> Option<Program> {
    for tool in ["gcc", "objcopy", "strip"] {
        if !runs(tool, &["--version"]) {
            return missing(&format!("{tool} (Debian build-essential, binutils)"));
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(path("hot.c"), PROGRAM).expect("write source");
    let served = dir.path().join("served");
    std::fs::create_dir(&served).expect("served dir");
    let debug = served.join("hot.debug");
    let stripped = served.join("hot");
    let (debug_s, stripped_s) = (debug.display().to_string(), stripped.display().to_string());
    assert!(runs(
        "gcc",
        &["-g", "-O1", "-o", &path("hot"), &path("hot.c")]
    ));
    assert!(runs(
        "objcopy",
        &["--only-keep-debug", &path("hot"), &debug_s]
    ));
    assert!(runs("strip", &["-o", &stripped_s, &path("hot")]));
    assert!(runs(
        "objcopy",
        &[&format!("--add-gnu-debuglink={debug_s}"), &stripped_s]
    ));
    let full = std::fs::read(path("hot")).expect("binary");
    let file = object::File::parse(&*full).expect("elf");
    let build_id: String = file
        .build_id()
        .expect("notes")
        .expect("a build id")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
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
        build_id: build_id.clone(),
        has_functions: false,
    };
    let hot_addresses = [4, 8, hot.size() / 2]
        .into_iter()
        .map(|delta| LOAD_BIAS + hot.address() + delta)
        .collect();
    Some(Program {
        dir,
        served,
        debug,
        build_id,
        mapping,
        hot_addresses,
    })
}

/// A real debuginfod scanning `dir`, and its request log.
struct Debuginfod {
    _process: KillOnDrop,
    url: String,
    log: PathBuf,
}

impl Debuginfod {
    fn start(program: &Program) -> Option<Self> {
        if !runs("debuginfod", &["--version"]) {
            return missing("debuginfod (Debian debuginfod)");
        }
        let port = free_port().port();
        let log = program.dir.path().join("debuginfod.log");
        let child = Command::new("debuginfod")
            .arg("-p")
            .arg(port.to_string())
            .arg("-d")
            .arg(program.dir.path().join("debuginfod.sqlite"))
            .arg("-F")
            .arg(&program.served)
            .arg("-v")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("debuginfod starts");
        let server = Self {
            _process: KillOnDrop(child),
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        // Ready once its scan has indexed the debug file (this request is
        // for the found build id, never the missing one counted below).
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let target = format!("/buildid/{}/debuginfo", program.build_id);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if http(addr, "GET", &target, &[], b"").is_ok_and(|r| r.status == 200) {
                return Some(server);
            }
            assert!(
                Instant::now() < deadline,
                "debuginfod never served the debug file"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Requests it logged for `build_id`.
    fn requests_for(&self, build_id: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains(&format!("GET /buildid/{build_id}/")))
            .count()
    }
}

/// A pprof of `addresses` (leaf first, one stack) in `mapping`, without
/// function names, as an agent that cannot name a stripped binary sends it.
fn unsymbolized_pprof(mapping: &MappingSpec, stacks: &[Vec<u64>]) -> Vec<u8> {
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

fn ingest(store: &StoreProcess, pprof: &[u8], headers: &[(&str, &str)]) {
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

/// `/api/v1/folded` of the test's series: the answer and its
/// `Kiln-Partial` header.
fn folded(store: &StoreProcess) -> (String, Option<String>) {
    let response = http(
        store.addr,
        "GET",
        "/api/v1/folded?query=process_cpu%3Acpu%7Bpod%3D%22hot%22%7D&from=now-1h",
        &[],
        b"",
    )
    .expect("query");
    assert_eq!(response.status, 200, "{}", response.text());
    let partial = response.header("kiln-partial").map(str::to_owned);
    (response.text(), partial)
}

/// (file, line) of every line of the locations naming `function`.
fn function_lines(profile: &kiln_pprof::Profile, function: &str) -> Vec<(String, i64)> {
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

fn store_with(extra: &[&str]) -> StoreProcess {
    StoreProcess::start(store_binary(), extra)
}

#[test]
fn a_stripped_binarys_static_function_is_named_from_a_real_debuginfod() {
    let Some(program) = build_program() else {
        return;
    };
    let Some(server) = Debuginfod::start(&program) else {
        return;
    };
    let store = store_with(&[
        "--debuginfod-urls",
        &server.url,
        "--symbolization-wait",
        "30s",
    ]);
    let stacks: Vec<Vec<u64>> = program.hot_addresses.iter().map(|&a| vec![a]).collect();
    ingest(&store, &unsymbolized_pprof(&program.mapping, &stacks), &[]);
    let (text, partial) = folded(&store);
    assert_eq!(partial, None, "{text}");
    assert_eq!(
        text.trim(),
        "hot_static_work 30000000",
        "every address of the function is one frame"
    );

    // The merged pprof carries the file and line.
    let response = http(
        store.addr,
        "GET",
        "/api/v1/pprof?query=process_cpu%3Acpu%7Bpod%3D%22hot%22%7D&from=now-1h",
        &[],
        b"",
    )
    .expect("pprof");
    assert_eq!(response.status, 200);
    let profile = kiln_pprof::decode(&response.body, &kiln_pprof::DecodeLimits::default())
        .expect("the store's pprof decodes");
    let lines = function_lines(&profile, "hot_static_work");
    assert!(!lines.is_empty(), "no lines for hot_static_work");
    for (file, line) in lines {
        assert!(file.ends_with("hot.c"), "{file}");
        assert!((4..=7).contains(&line), "line {line}");
    }
}

/// A query does not wait longer than `--symbolization-wait` for a debug
/// file: the first answer names the frame by module and offset and says
/// `Kiln-Partial: symbols_pending=1`; the fetch goes on, and a later
/// query of the same data names it, complete.
#[test]
fn a_query_answers_before_its_symbols_are_ready_and_says_so() {
    let Some(program) = build_program() else {
        return;
    };
    let Some(server) = Debuginfod::start(&program) else {
        return;
    };
    let store = store_with(&[
        "--debuginfod-urls",
        &server.url,
        "--symbolization-wait",
        "0s",
    ]);
    let stacks = vec![vec![program.hot_addresses[0]]];
    ingest(&store, &unsymbolized_pprof(&program.mapping, &stacks), &[]);
    let (text, partial) = folded(&store);
    assert_eq!(partial.as_deref(), Some("symbols_pending=1"), "{text}");
    assert!(text.starts_with("hot+0x"), "module and offset: {text}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (text, partial) = folded(&store);
        if partial.is_none() && text.starts_with("hot_static_work ") {
            break;
        }
        assert!(Instant::now() < deadline, "never named: {text} {partial:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A build id no server has costs one debuginfod request, not one per
/// query: the miss is remembered for `--symbol-miss-retry` (1h). Its
/// frames read `module+0xoffset`, never a bare address.
#[test]
fn a_missing_build_id_costs_one_debuginfod_lookup() {
    let Some(program) = build_program() else {
        return;
    };
    let Some(server) = Debuginfod::start(&program) else {
        return;
    };
    let store = store_with(&[
        "--debuginfod-urls",
        &server.url,
        "--symbolization-wait",
        "30s",
    ]);
    let mapping = MappingSpec {
        build_id: MISSING_BUILD_ID.to_owned(),
        filename: "/usr/lib/libmissing.so".to_owned(),
        ..program.mapping.clone()
    };
    let address = program.hot_addresses[0];
    ingest(&store, &unsymbolized_pprof(&mapping, &[vec![address]]), &[]);
    let offset = address - mapping.memory_start + mapping.file_offset;
    for _ in 0..5 {
        let (text, partial) = folded(&store);
        assert_eq!(partial, None);
        assert_eq!(text.trim(), format!("libmissing.so+0x{offset:x} 10000000"));
    }
    assert_eq!(
        server.requests_for(MISSING_BUILD_ID),
        1,
        "one lookup, five queries"
    );
}

/// `kiln debuginfo upload` of the split debug info names the frames of data
/// stored before it, in the next query, with no debuginfod at all. The
/// upload needs a write token for any namespace.
#[test]
fn kiln_debuginfo_upload_names_frames_of_earlier_data() {
    let Some(program) = build_program() else {
        return;
    };
    let Some(kiln) = built_binary("kiln", "KILN_CLI") else {
        return;
    };
    let data_dir = tempfile::tempdir().expect("temp dir");
    let store = StoreProcess::start_with_env(
        store_binary(),
        data_dir,
        &["--symbolization-wait", "30s"],
        &[
            ("KILN_WRITE_TOKENS", "agent-token"),
            ("KILN_NAMESPACE_WRITE_TOKENS", "shop:shop-token"),
        ],
    );
    let stacks = vec![vec![program.hot_addresses[0]]];
    let auth = [("Authorization", "Bearer agent-token")];
    ingest(
        &store,
        &unsymbolized_pprof(&program.mapping, &stacks),
        &auth,
    );
    let (before, _) = folded(&store);
    assert!(before.starts_with("hot+0x"), "{before}");

    let upload = |token: &str| {
        Command::new(&kiln)
            .args(["--store", &store.url(), "debuginfo", "upload"])
            .arg(&program.debug)
            .env("KILN_TOKEN", token)
            .output()
            .expect("kiln runs")
    };
    let refused = upload("shop-token");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("any namespace"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let done = upload("agent-token");
    let stdout = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(stdout.contains(&program.build_id), "{stdout}");
    assert!(
        stdout.contains("debug") && stdout.contains("DWARF yes"),
        "{stdout}"
    );

    let (after, partial) = folded(&store);
    assert_eq!(partial, None);
    assert_eq!(after.trim(), "hot_static_work 10000000");

    // Not an ELF file: refused, nothing kept.
    let bogus = program.dir.path().join("bogus");
    std::fs::write(&bogus, b"not an elf file").expect("write");
    let refused = Command::new(&kiln)
        .args(["--store", &store.url(), "debuginfo", "upload"])
        .arg(&bogus)
        .env("KILN_TOKEN", "agent-token")
        .output()
        .expect("kiln runs");
    assert_eq!(refused.status.code(), Some(2), "a rejection");
}

/// `--debuginfo-uploads=false` (the operator's `spec.symbolization.acceptUploads: false`)
/// refuses every upload with 403 before its body is read, whatever the token; the same
/// store with uploads on takes the request as far as reading the file. Needs no tools.
#[test]
fn a_store_with_uploads_off_refuses_every_upload() {
    let upload = |extra: &[&str]| {
        let store = StoreProcess::start_with_env(
            store_binary(),
            tempfile::tempdir().expect("temp dir"),
            extra,
            &[("KILN_WRITE_TOKENS", "agent-token")],
        );
        http(
            store.addr,
            "POST",
            "/api/v1/debuginfo",
            &[("Authorization", "Bearer agent-token")],
            b"not an elf file",
        )
        .expect("upload answered")
    };
    let off = upload(&["--debuginfo-uploads=false"]);
    assert_eq!(off.status, 403, "{}", off.text());
    assert!(
        off.text().contains("--debuginfo-uploads=false"),
        "{}",
        off.text()
    );
    // On (the default), the same request gets as far as reading the file.
    let on = upload(&[]);
    assert_eq!(on.status, 422, "{}", on.text());
}

/// The symbol cache is written to the bucket (`symbol-cache/<replica>`) at
/// shutdown and read back at start: after a restart with no debuginfod
/// and no wait, the same data is named at once, complete, from the cache
/// alone (a lookup would have answered `symbols_pending`).
#[test]
fn resolved_symbols_survive_a_restart() {
    let Some(program) = build_program() else {
        return;
    };
    let Some(server) = Debuginfod::start(&program) else {
        return;
    };
    let store = store_with(&[
        "--replica",
        "kiln-test",
        "--debuginfod-urls",
        &server.url,
        "--symbolization-wait",
        "30s",
    ]);
    let stacks = vec![vec![program.hot_addresses[0]]];
    ingest(&store, &unsymbolized_pprof(&program.mapping, &stacks), &[]);
    assert_eq!(folded(&store).0.trim(), "hot_static_work 10000000");
    let data_dir = store.stop();
    let cache = data_dir.path().join("bucket/symbol-cache/kiln-test");
    assert!(cache.is_file(), "{} was written", cache.display());
    drop(server);
    let store = StoreProcess::start_in(
        store_binary(),
        data_dir,
        &["--replica", "kiln-test", "--symbolization-wait", "0s"],
    );
    let (text, partial) = folded(&store);
    assert_eq!(partial, None, "{text}");
    assert_eq!(text.trim(), "hot_static_work 10000000");
}

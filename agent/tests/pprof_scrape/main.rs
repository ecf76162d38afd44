//! Scraping pprof endpoints (issue 52), without privileges: the real agent
//! in host mode (`--scrape` alone, no BPF) against a real Go program with
//! `net/http/pprof`, shipped to a real `kiln-store`; and against hostile
//! endpoints served by this test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kiln_testkit::binaries::built_binary;
use kiln_testkit::http::{enc, free_port, get, json_int64};
use kiln_testkit::process::KillOnDrop;
use kiln_testkit::store_process::StoreProcess;

const AGENT: &str = env!("CARGO_BIN_EXE_kiln-agent");

/// Blocks of 64 KiB the Go program allocates in `main.allocateKnown`.
const BLOCKS: u64 = 600;
/// Goroutines it parks in `main.parked`.
const PARKED: i64 = 37;
/// The agent's scrape slots: at most this many requests are in flight at
/// once, each served by a goroutine of its own in the program.
const SLOTS: i64 = 4;

/// The lines the program prints, as they come.
fn lines_of(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

#[track_caller]
fn wait_for_line(lines: &mpsc::Receiver<String>, prefix: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.starts_with(prefix) => {
                return line[prefix.len()..].trim().to_owned();
            }
            Ok(_) => {}
            Err(error) => panic!("no {prefix:?} line from the program: {error}"),
        }
    }
}

/// `go tool pprof -raw` reads `bytes` (what the store exported).
#[track_caller]
fn go_pprof_reads(dir: &Path, name: &str, bytes: &[u8]) {
    let path = dir.join(format!("{name}.pb.gz"));
    std::fs::write(&path, bytes).expect("write export");
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(&path)
        .env("HOME", dir)
        .output()
        .expect("go tool pprof runs");
    assert!(
        out.status.success(),
        "go tool pprof cannot read the {name} export: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `column` (`flat` or `cumulative`) of `function` in the store's top
/// table for `query` over the last ten minutes, and the table as text.
#[track_caller]
fn top_value(
    store: SocketAddr,
    query: &str,
    function: &str,
    column: &str,
) -> (Option<i64>, String) {
    let top = get(
        store,
        &format!(
            "/api/v1/top?query={}&from=now-10m&to=now&limit=1000",
            enc(query)
        ),
    );
    assert_eq!(top.status, 200, "{}", top.text());
    let top = top.json();
    let flat = top["top"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|row| row["name"] == function)
        .map(|row| json_int64(&row[column]));
    (flat, top.to_string())
}

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
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/pprof_target.go");
    let Some(program) = kiln_testkit::go_programs::build(&source, dir.path(), "pprof_target")
    else {
        return;
    };
    let store = StoreProcess::start(&store_binary, &[]);
    let mut target = KillOnDrop(
        Command::new(&program)
            .args([BLOCKS.to_string(), PARKED.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("the Go program starts"),
    );
    let lines = lines_of(&mut target.0);
    let address = wait_for_line(&lines, "listening ", Duration::from_secs(30));
    let goroutines: i64 = wait_for_line(&lines, "goroutines ", Duration::from_secs(30))
        .parse()
        .expect("a count");

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
    let allocated: u64 = wait_for_line(&lines, "done allocated=", Duration::from_secs(60))
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

/// What the hostile server does under each path prefix.
fn serve_hostile(mut stream: TcpStream, good: &[u8], bomb: &[u8]) {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&request);
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let head = |status: &str, content_type: &str| {
        format!("HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nConnection: close\r\n")
    };
    let result = if path.starts_with("/hang/") {
        std::thread::sleep(Duration::from_secs(30));
        Ok(())
    } else if path.starts_with("/huge/") {
        // 1 GB announced, streamed until the agent hangs up.
        let chunk = vec![0u8; 1 << 20];
        let mut result = stream.write_all(
            format!(
                "{}Content-Length: {}\r\n\r\n",
                head("200 OK", "application/octet-stream"),
                1u64 << 30
            )
            .as_bytes(),
        );
        for _ in 0..1024 {
            if result.is_err() {
                break;
            }
            result = stream.write_all(&chunk);
        }
        result
    } else if path.starts_with("/chunked/") {
        // No length: the cap is found while reading.
        let chunk = vec![0u8; 1 << 20];
        let mut result = stream
            .write_all(format!("{}\r\n", head("200 OK", "application/octet-stream")).as_bytes());
        for _ in 0..1024 {
            if result.is_err() {
                break;
            }
            result = stream.write_all(&chunk);
        }
        result
    } else if path.starts_with("/redirect/") {
        stream.write_all(
            format!(
                "{}Location: http://169.254.169.254/latest/meta-data/\r\nContent-Length: 0\r\n\r\n",
                head("302 Found", "text/plain")
            )
            .as_bytes(),
        )
    } else if path.starts_with("/bomb/") {
        stream
            .write_all(
                format!(
                    "{}Content-Length: {}\r\n\r\n",
                    head("200 OK", "application/octet-stream"),
                    bomb.len()
                )
                .as_bytes(),
            )
            .and_then(|()| stream.write_all(bomb))
    } else if path.starts_with("/html/") {
        let body = "<html><body>not pprof</body></html>";
        stream.write_all(
            format!(
                "{}Content-Length: {}\r\n\r\n{body}",
                head("200 OK", "text/html"),
                body.len()
            )
            .as_bytes(),
        )
    } else {
        stream
            .write_all(
                format!(
                    "{}Content-Length: {}\r\n\r\n",
                    head("200 OK", "application/octet-stream"),
                    good.len()
                )
                .as_bytes(),
            )
            .and_then(|()| stream.write_all(good))
    };
    let _ = result;
}

/// A small valid profile with every sample type Go's heap profile has, so
/// every profile of the good endpoint keeps something.
fn good_profile() -> Vec<u8> {
    use kiln_pprof::{FunctionSpec, MappingSpec, ProfileBuilder};
    let mut builder = ProfileBuilder::new(&[
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ]);
    builder.period("space", "bytes", 1);
    let mapping = builder.mapping(&MappingSpec::default());
    let function = builder.function(&FunctionSpec {
        name: "main.good".to_owned(),
        ..FunctionSpec::default()
    });
    let location = builder.location(mapping, 0, &[(function, 1)]);
    builder.sample(&[location], &[1, 64, 1, 64], &[]);
    kiln_pprof::encode_gzip(&builder.finish())
}

/// 1 GiB of zeros, gzipped (about 1 MiB).
fn gzip_bomb() -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..1024 {
        encoder.write_all(&zeros).expect("in memory");
    }
    encoder.finish().expect("in memory")
}

/// The value of `name{label}` in Prometheus text.
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Hanging, 1 GB, length-less, redirecting, gzip-bomb and HTML endpoints
/// each cost counted errors and no more than the agent's memory budget,
/// while a good endpoint beside them keeps being scraped.
#[test]
fn hostile_endpoints_cost_a_counted_error_each_and_never_starve_a_good_one() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let good = good_profile();
    let bomb = gzip_bomb();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let (good, bomb) = (good.clone(), bomb.clone());
            std::thread::spawn(move || serve_hostile(stream, &good, &bomb));
        }
    });
    let modes = [
        "hang", "huge", "chunked", "redirect", "bomb", "html", "good",
    ];
    let urls: Vec<String> = modes
        .iter()
        .map(|mode| format!("http://{address}/{mode}/debug/pprof"))
        .collect();
    let out = tempfile::tempdir().expect("temp dir");
    let metrics = free_port();
    let mut agent = KillOnDrop(
        Command::new(AGENT)
            .args([
                "--scrape",
                &urls.join(","),
                "--scrape-interval",
                "1s",
                "--scrape-timeout",
                "2s",
                "--output-dir",
            ])
            .arg(out.path())
            .args(["--metrics-addr", &metrics.to_string(), "--duration", "12s"])
            .spawn()
            .expect("the agent starts"),
    );
    std::thread::sleep(Duration::from_secs(10));
    let text = get(metrics, "/metrics").text();
    let status = agent.0.wait().expect("the agent runs");
    assert!(status.success(), "the agent failed: {status}");

    let errors = |reason: &str| {
        metric(
            &text,
            &format!("kiln_agent_scrape_errors_total{{reason=\"{reason}\"}}"),
        )
    };
    for reason in [
        "timeout",
        "too_large",
        "redirect",
        "decompressed_too_large",
        "content_type",
    ] {
        assert!(errors(reason) >= 1, "no {reason} error counted:\n{text}");
    }
    let peak = metric(&text, "kiln_agent_resident_memory_peak_bytes");
    eprintln!(
        "errors: timeout {} too_large {} redirect {} decompressed_too_large {} content_type {}; \
         peak RSS {} MiB",
        errors("timeout"),
        errors("too_large"),
        errors("redirect"),
        errors("decompressed_too_large"),
        errors("content_type"),
        peak >> 20
    );
    assert!(peak > 0 && peak < 160 << 20, "peak RSS {peak} bytes");

    // The good endpoint's gauges, one per second or so, kept coming.
    let heaps = std::fs::read_dir(out.path())
        .expect("output dir")
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("heap-"))
        .count();
    assert!(
        heaps >= 6,
        "{heaps} heap profiles of the good endpoint in 12 s"
    );
}

//! Hostile pprof endpoints: each costs a counted error, none starves a good one.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use kiln_testkit::http::{free_port, get};
use kiln_testkit::process::KillOnDrop;

use super::{AGENT, metric};

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

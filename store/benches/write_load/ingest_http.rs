//! The `/ingest` side of the load benchmark: writers on their own threads,
//! each with one keep-alive HTTP/1.1 connection, posting pprof bodies the
//! way Pyroscope SDKs do (a plain pprof body, or the multipart form with a
//! `prev_profile`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How a writer sends each profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngestForm {
    /// `POST /ingest?format=pprof` with the gzipped pprof as the body.
    Pprof,
    /// `POST /ingest` as `multipart/form-data` with `profile` and
    /// `prev_profile` (the Go SDK's cumulative upload).
    Multipart,
}

const BOUNDARY: &str = "kiln-bench-boundary-7f3a";

/// How many workloads (namespaces `team-N`) the pods are spread over:
/// `KILN_BENCH_WORKLOADS`, default 10. The store shards its head by
/// workload, so few workloads leave some shards idle and others shared.
pub fn workloads() -> usize {
    std::env::var("KILN_BENCH_WORKLOADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(10)
}

/// One request's head and body for series `target` of a workload among
/// `workloads`.
fn request(
    addr: SocketAddr,
    form: IngestForm,
    target: usize,
    workloads: usize,
    profile: &[u8],
    prev: &[u8],
) -> Vec<u8> {
    let name = format!(
        "checkout-service%7Bnamespace%3Dteam-{}%2Cpod%3Dcheckout-{target}%2Cnode%3Dnode-{}%7D",
        target % workloads,
        target % 7
    );
    let (query, content_type, body) = match form {
        IngestForm::Pprof => (
            format!("name={name}&format=pprof"),
            "application/octet-stream".to_owned(),
            profile.to_vec(),
        ),
        IngestForm::Multipart => {
            let mut body = Vec::new();
            for (field, bytes) in [("profile", profile), ("prev_profile", prev)] {
                write!(
                    body,
                    "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{field}.pprof\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                )
                .expect("writing to a Vec cannot fail");
                body.extend_from_slice(bytes);
                body.extend_from_slice(b"\r\n");
            }
            write!(body, "--{BOUNDARY}--\r\n").expect("writing to a Vec cannot fail");
            (
                format!("name={name}"),
                format!("multipart/form-data; boundary={BOUNDARY}"),
                body,
            )
        }
    };
    let mut out = format!(
        "POST /ingest?{query} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Reads one response; returns its status code.
fn read_response(reader: &mut BufReader<TcpStream>) -> std::io::Result<u16> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = 0usize;
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok(status)
}

/// Runs `writers` threads until `end`; returns each accepted request's
/// latency and the count of refused or failed ones.
pub fn run(
    addr: SocketAddr,
    form: IngestForm,
    writers: usize,
    profiles: &[Vec<u8>],
    end: Instant,
) -> (Vec<Duration>, u64) {
    run_writers(addr, form, 0..writers, writers, profiles, end)
}

/// Runs writers `ids` of `of` writers in all (writer `i` sends as pods
/// `i`, `i + of`, ...), one thread each, until `end`: the whole load in
/// one process, or its share in one of several client processes.
pub fn run_writers(
    addr: SocketAddr,
    form: IngestForm,
    ids: std::ops::Range<usize>,
    of: usize,
    profiles: &[Vec<u8>],
    end: Instant,
) -> (Vec<Duration>, u64) {
    let writers = of;
    let workloads = workloads();
    std::thread::scope(|scope| {
        let tasks: Vec<_> = ids
            .map(|writer| {
                scope.spawn(move || {
                    let stream = TcpStream::connect(addr).expect("connect");
                    stream.set_nodelay(true).expect("nodelay");
                    let mut sender = stream.try_clone().expect("clone stream");
                    let mut reader = BufReader::new(stream);
                    let mut latencies = Vec::new();
                    let mut errors = 0u64;
                    let mut i = writer;
                    while Instant::now() < end {
                        let profile = &profiles[i % profiles.len()];
                        let prev = &profiles[(i + 1) % profiles.len()];
                        let bytes = request(addr, form, i % 500, workloads, profile, prev);
                        let sent = Instant::now();
                        sender.write_all(&bytes).expect("send");
                        match read_response(&mut reader) {
                            Ok(200) => latencies.push(sent.elapsed()),
                            Ok(_) => errors += 1,
                            Err(e) => panic!("connection failed: {e}"),
                        }
                        i += writers;
                    }
                    (latencies, errors)
                })
            })
            .collect();
        let mut latencies = Vec::new();
        let mut errors = 0;
        for task in tasks {
            let (l, e) = task.join().expect("writer thread");
            latencies.extend(l);
            errors += e;
        }
        (latencies, errors)
    })
}

/// One request that must succeed, to know the store is ready.
pub fn warm_up(addr: SocketAddr, form: IngestForm, profile: &[u8]) -> bool {
    let Ok(stream) = TcpStream::connect(addr) else {
        return false;
    };
    let Ok(mut sender) = stream.try_clone() else {
        return false;
    };
    let mut reader = BufReader::new(stream);
    sender
        .write_all(&request(addr, form, 0, workloads(), profile, profile))
        .is_ok()
        && matches!(read_response(&mut reader), Ok(200))
}

//! Shared by the integration tests: a real `kiln-store` process on
//! 127.0.0.1 and a minimal HTTP/1.1 client.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Seconds since the Unix epoch, as `/ingest`'s `from` and `until` take them.
pub fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A running `kiln-store`; killed and cleaned up on drop.
#[derive(Debug)]
pub struct StoreProcess {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub data_dir: tempfile::TempDir,
}

impl StoreProcess {
    /// Starts a store with `extra` flags and waits until `/readyz` is 200.
    #[track_caller]
    pub fn start(extra: &[&str]) -> Self {
        let data_dir = tempfile::tempdir().expect("temp dir");
        Self::start_in(data_dir, extra)
    }

    /// Starts a store on an existing data directory.
    #[track_caller]
    pub fn start_in(data_dir: tempfile::TempDir, extra: &[&str]) -> Self {
        Self::start_with_env(data_dir, extra, &[])
    }

    /// Starts a store with extra environment variables.
    #[track_caller]
    pub fn start_with_env(
        data_dir: tempfile::TempDir,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        let addr = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_kiln-store"))
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--data-dir")
            .arg(data_dir.path())
            .args(extra)
            .env("KILN_LOG", "warn")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn kiln-store");
        let mut store = Self {
            child: Some(child),
            addr,
            data_dir,
        };
        store.wait_for("/readyz");
        store
    }

    /// Starts a store and waits only until it answers `/healthz` (it may
    /// still be recovering).
    #[track_caller]
    pub fn start_live(extra: &[&str], envs: &[(&str, &str)]) -> Self {
        let addr = free_port();
        let data_dir = tempfile::tempdir().expect("temp dir");
        let child = Command::new(env!("CARGO_BIN_EXE_kiln-store"))
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--data-dir")
            .arg(data_dir.path())
            .args(extra)
            .env("KILN_LOG", "warn")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn kiln-store");
        let mut store = Self {
            child: Some(child),
            addr,
            data_dir,
        };
        store.wait_for("/healthz");
        store
    }

    #[track_caller]
    fn wait_for(&mut self, path: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("kiln-store exited early: {status}");
            }
            if let Ok(response) = http(self.addr, "GET", path, &[], b"")
                && response.status == 200
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "kiln-store on {} did not answer {path} with 200 in 30 s",
            self.addr
        );
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sends SIGTERM and waits for a clean exit; returns the data dir.
    pub fn stop(mut self) -> tempfile::TempDir {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) with a pid we spawned and still own (not yet
            // reaped), so it cannot hit an unrelated process.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let status = child.wait().expect("wait for kiln-store");
            assert!(
                status.success(),
                "kiln-store exited with {status} after SIGTERM"
            );
        }
        let dir = tempfile::tempdir().expect("temp dir");
        std::mem::replace(&mut self.data_dir, dir)
    }
}

impl Drop for StoreProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A free loopback port (bound then released).
pub fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr")
}

/// One HTTP response.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON. Flame graph trees nest one object per frame, and
    /// real stacks run past serde_json's default depth of 128 (a peer agent
    /// once sent over a thousand `[unknown]` frames), so the limit is lifted
    /// and the parse gets a stack of its own, as the CLI's does.
    pub fn json(&self) -> serde_json::Value {
        let body = self.body.clone();
        let parsed = std::thread::Builder::new()
            .name("test-json".to_owned())
            .stack_size(256 << 20)
            .spawn(move || {
                let mut deserializer = serde_json::Deserializer::from_slice(&body);
                deserializer.disable_recursion_limit();
                let value = serde::Deserialize::deserialize(&mut deserializer)
                    .and_then(|value: serde_json::Value| deserializer.end().map(|()| value));
                value.map_err(|e| e.to_string())
            })
            .expect("JSON decoder thread")
            .join()
            .expect("JSON decoder thread panicked");
        parsed.unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one HTTP/1.1 request with `Connection: close` and reads the reply.
pub fn http(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    let mut has_length = false;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("content-length") {
            has_length = true;
        }
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !has_length {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> std::io::Result<HttpResponse> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_owned());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("no status line"))?;
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body).ok_or_else(|| bad("bad chunked body"))?;
    }
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

/// GET returning the response, panicking on IO errors.
#[track_caller]
pub fn get(addr: SocketAddr, target: &str) -> HttpResponse {
    http(addr, "GET", target, &[], b"").expect("GET")
}

/// Percent-encodes a query value.
pub fn enc(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// `<repo>/../shared/testdata`, or `None` (with a message) when absent.
pub fn testdata_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/testdata");
    if dir.is_dir() {
        Some(dir)
    } else {
        // Past libtest's capture, so the skip shows in the test output.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {} is not present",
            dir.display()
        );
        None
    }
}

/// True when running in CI, where missing prerequisites must fail.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Fails in CI, prints a skip message locally.
#[track_caller]
pub fn missing_prerequisite(what: &str) {
    if in_ci() {
        panic!("prerequisite missing in CI: {what} (./kiln-dev test installs it)");
    }
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {what} is missing (./kiln-dev test installs it)"
    );
}

/// Every function name in a flamegraph JSON response.
pub fn flamegraph_names(response: &serde_json::Value) -> Vec<String> {
    response["flamegraph"]["names"]
        .as_array()
        .map(|names| {
            names
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

//! A `kiln-store` child process on a free loopback port with a temporary
//! data directory, stopped when dropped.
// Shared by the UI and CLI test crates; each uses only a part.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running store.
pub struct StoreProcess {
    child: Child,
    port: u16,
    log_path: std::path::PathBuf,
    _data: tempfile::TempDir,
}

impl StoreProcess {
    /// Starts `binary` and waits until `/readyz` answers 200.
    pub fn start(binary: &Path) -> Self {
        Self::start_with(binary, &[])
    }

    /// Starts `binary` with extra command-line `args`.
    pub fn start_with(binary: &Path, args: &[&str]) -> Self {
        let data = tempfile::tempdir().expect("temporary data directory");
        // Ask the kernel for a free port, then hand it to the store.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let log_path = data.path().join("store.log");
        let log = std::fs::File::create(&log_path).expect("store log file");
        let child = Command::new(binary)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(data.path().join("data"))
            .args(args)
            .env("KILN_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("kiln-store starts");
        let mut store = Self {
            child,
            port,
            log_path,
            _data: data,
        };
        store.wait_ready();
        store
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What the store wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("kiln-store exited with {status}:\n{}", self.log());
            }
            if http_status(self.port, "/readyz") == Some(200) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "kiln-store was not ready within 60 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The status code of a plain GET, or `None` when nothing answers.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    http_get(port, path).map(|(status, _)| status)
}

/// Status and body of a plain HTTP/1.1 GET (the store sends
/// `Content-Length` bodies), or `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, Vec<u8>)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let status = std::str::from_utf8(response.get(9..12)?)
        .ok()?
        .parse()
        .ok()?;
    let body_start = response.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    Some((status, response.split_off(body_start)))
}

/// Status and body of a plain HTTP/1.1 POST of `body` (ingest), or `None`
/// when nothing answers.
pub fn http_post(port: u16, path: &str, body: &[u8]) -> Option<(u16, Vec<u8>)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .ok()?;
    stream.write_all(body).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let status = std::str::from_utf8(response.get(9..12)?)
        .ok()?
        .parse()
        .ok()?;
    let body_start = response.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    Some((status, response.split_off(body_start)))
}

impl Drop for StoreProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! A `moto_server` (S3) child for the tests, from `$KILN_TOOLS_DIR/venv`
//! (installed by `./kiln-dev test`), that can be paused like a bucket
//! that stops answering and resumed with everything it held.

#![allow(dead_code)] // Each test binary uses its own subset.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::missing_prerequisite;

/// A `moto_server` child, killed on drop.
pub struct Moto {
    child: Child,
    pub port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Environment for a store using moto: fixed test credentials, and a short
/// request timeout so an unanswered request fails in seconds.
pub const AWS_ENV: [(&str, &str); 5] = [
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_REGION", "us-east-1"),
    ("AWS_TIMEOUT", "3s"),
    ("AWS_CONNECT_TIMEOUT", "1s"),
];

/// Starts moto on a free port, or says why it cannot (fails in CI).
pub fn start_moto() -> Option<Moto> {
    let tools = std::env::var("KILN_TOOLS_DIR").unwrap_or_else(|_| "/var/tmp/kiln-tools".into());
    let binary = PathBuf::from(tools).join("venv/bin/moto_server");
    if !binary.is_file() {
        missing_prerequisite(&format!("{} (moto[server])", binary.display()));
        return None;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let child = Command::new(binary)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start moto_server");
    let moto = Moto { child, port };
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "moto_server did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(moto)
}

impl Moto {
    /// Creates a bucket with a plain HTTP PUT (object_store does not create buckets).
    pub fn create_bucket(&self, bucket: &str) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect moto");
        write!(
            stream,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .expect("create bucket");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read");
        assert!(
            response.contains(" 200 "),
            "create bucket failed: {response}"
        );
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops the server (SIGSTOP): connections are still accepted by the
    /// kernel but nothing answers, as with a bucket behind a dead link.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets it answer again (SIGCONT), with every object it held.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).expect("pid fits");
        // SAFETY: kill(2) on a child we spawned and have not waited for.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    /// The flags that point a store at `bucket` on this server.
    pub fn store_flags(&self, bucket: &str) -> Vec<String> {
        [
            "--object-store",
            "s3",
            "--bucket",
            bucket,
            "--bucket-endpoint",
            &self.endpoint(),
            "--bucket-allow-http",
            "true",
        ]
        .map(str::to_owned)
        .to_vec()
    }
}

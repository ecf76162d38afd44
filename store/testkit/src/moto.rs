//! A `moto_server` (S3) child for the tests, from `$KILN_TOOLS_DIR/venv`
//! (installed by `./kiln-dev test`), that can be paused like a bucket
//! that stops answering and resumed with everything it held.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::prerequisites::missing;
use crate::tools::tools_dir;

/// A `moto_server` child, killed on drop.
#[derive(Debug)]
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

/// Starts moto on a port it picks itself, or says why it cannot (fails in
/// CI). Moto binds port 0 and prints the port it got: choosing a free port
/// here and handing it over raced with other tests doing the same (CI saw a
/// second moto lose the port, this one connect to the first, and find it
/// gone when that test ended).
pub fn start_moto() -> Option<Moto> {
    let binary = tools_dir().join("venv/bin/moto_server");
    if !binary.is_file() {
        return missing(&format!("{} (moto[server])", binary.display()));
    }
    let mut child = Command::new(binary)
        .args(["-H", "127.0.0.1", "-p", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start moto_server");
    let stderr = child.stderr.take().expect("piped stderr");
    let (port_tx, port_rx) = mpsc::channel();
    // Reads until moto exits: moto logs every request to stderr and would
    // block on a full pipe.
    std::thread::spawn(move || {
        let mut port_tx = Some(port_tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(port) = listening_port(&line)
                && let Some(tx) = port_tx.take()
            {
                let _ = tx.send(port);
            }
        }
    });
    let mut moto = Moto { child, port: 0 };
    moto.port = port_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("moto_server did not say which port it listens on");
    Some(moto)
}

/// The port in moto's (werkzeug's) ` * Running on http://127.0.0.1:PORT`.
fn listening_port(line: &str) -> Option<u16> {
    let (_, address) = line.split_once("Running on http://")?;
    let (_, port) = address.trim().rsplit_once(':')?;
    port.trim_end_matches('/').parse().ok()
}

impl Moto {
    /// Creates a bucket with a plain HTTP PUT (object_store does not create
    /// buckets). Tried three times: on a loaded machine moto has reset the
    /// connection before answering.
    pub fn create_bucket(&self, bucket: &str) {
        let mut last = String::new();
        for _ in 0..3 {
            match self.put_bucket(bucket) {
                Ok(response) if response.contains(" 200 ") => return,
                Ok(response) => last = response,
                Err(err) => last = err.to_string(),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("create bucket {bucket} failed: {last}");
    }

    fn put_bucket(&self, bucket: &str) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        write!(
            stream,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
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
        s3_store_flags(&self.endpoint(), bucket)
    }
}

/// The flags that point a store at `bucket` on the plain-HTTP S3 endpoint
/// `endpoint` (moto's, SeaweedFS's).
pub fn s3_store_flags(endpoint: &str, bucket: &str) -> Vec<String> {
    [
        "--object-store",
        "s3",
        "--bucket",
        bucket,
        "--bucket-endpoint",
        endpoint,
        "--bucket-allow-http",
        "true",
    ]
    .map(str::to_owned)
    .to_vec()
}

//! A SeaweedFS server (master, volume server, filer and its S3 gateway in
//! one `weed server` process) for the tests, from `$KILN_TOOLS_DIR/seaweedfs`
//! (built by `./kiln-dev test`): a real distributed object store with real
//! consistency and conditional writes, where moto is a mock.
//!
//! Every port is picked here (gRPC ports too, which otherwise default to
//! the HTTP port + 10000), the Iceberg and Lance listeners are off, and
//! logs and sockets stay in the server's own temporary directory. The S3
//! gateway checks signatures against one identity, the `AWS_ENV`
//! credentials of [`crate::moto`].

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http::free_port;
use crate::prerequisites::missing;
use crate::tools::tools_dir;

/// A `weed server` child, killed on drop with its directory.
#[derive(Debug)]
pub struct SeaweedFs {
    child: Child,
    binary: PathBuf,
    /// `host:port.grpcPort`, as `weed shell` takes each.
    master: String,
    filer: String,
    /// The S3 gateway's port.
    pub s3_port: u16,
    dir: tempfile::TempDir,
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The identity the gateway accepts: moto's test credentials.
const S3_CONFIG: &str = r#"{"identities":[{"name":"kiln","credentials":[{"accessKey":"testing","secretKey":"testing"}],"actions":["Admin","Read","Write","List","Tagging"]}]}"#;

/// The `weed` binary `./kiln-dev test` builds.
pub fn weed_binary() -> PathBuf {
    tools_dir().join("seaweedfs/bin/weed")
}

/// Starts SeaweedFS and waits until its S3 gateway answers, or says why it
/// cannot (fails in CI).
pub fn start_seaweedfs() -> Option<SeaweedFs> {
    let binary = weed_binary();
    if !binary.is_file() {
        return missing(&format!("{} (SeaweedFS)", binary.display()));
    }
    let dir = tempfile::tempdir().expect("SeaweedFS directory");
    let config = dir.path().join("s3.json");
    std::fs::write(&config, S3_CONFIG).expect("s3 config");
    let port = || free_port().port();
    let (master, volume, filer, s3) = (port(), port(), port(), port());
    let (master_grpc, filer_grpc) = (port(), port());
    let path = |name: &str| dir.path().join(name).display().to_string();
    std::fs::create_dir_all(dir.path().join("data")).expect("data dir");
    std::fs::create_dir_all(dir.path().join("logs")).expect("log dir");
    let log = std::fs::File::create(dir.path().join("weed.log")).expect("log file");
    let child = Command::new(&binary)
        .arg(format!("-logdir={}", path("logs")))
        .arg("server")
        .args([
            "-ip=127.0.0.1".to_owned(),
            "-ip.bind=127.0.0.1".to_owned(),
            format!("-dir={}", path("data")),
            format!("-master.port={master}"),
            format!("-master.port.grpc={master_grpc}"),
            "-master.volumeSizeLimitMB=64".to_owned(),
            "-master.telemetry=false".to_owned(),
            format!("-volume.port={volume}"),
            format!("-volume.port.grpc={}", port()),
            "-filer".to_owned(),
            format!("-filer.port={filer}"),
            format!("-filer.port.grpc={filer_grpc}"),
            format!("-filer.localSocket={}", path("filer.sock")),
            "-s3".to_owned(),
            format!("-s3.port={s3}"),
            format!("-s3.port.grpc={}", port()),
            "-s3.port.iceberg=0".to_owned(),
            "-s3.port.lance=0".to_owned(),
            format!("-s3.localSocket={}", path("s3.sock")),
            format!("-s3.config={}", config.display()),
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start weed server");
    let server = SeaweedFs {
        child,
        binary,
        master: format!("127.0.0.1:{master}.{master_grpc}"),
        filer: format!("127.0.0.1:{filer}.{filer_grpc}"),
        s3_port: s3,
        dir,
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while TcpStream::connect(("127.0.0.1", s3)).is_err() {
        assert!(
            Instant::now() < deadline,
            "SeaweedFS's S3 gateway did not listen in 90 s:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Some(server)
}

impl SeaweedFs {
    /// Creates a bucket through `weed shell`, retried while the cluster
    /// elects its master and registers its volume server.
    pub fn create_bucket(&self, bucket: &str) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let output = Command::new(&self.binary)
                .args(["shell", &format!("-master={}", self.master)])
                .arg(format!("-filer={}", self.filer))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .and_then(|mut shell| {
                    use std::io::Write;
                    if let Some(mut stdin) = shell.stdin.take() {
                        writeln!(stdin, "s3.bucket.create -name {bucket}")?;
                        writeln!(stdin, "s3.bucket.list")?;
                    }
                    shell.wait_with_output()
                })
                .expect("run weed shell");
            let text = String::from_utf8_lossy(&output.stdout).into_owned();
            if text.lines().any(|l| l.trim().starts_with(bucket)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "creating bucket {bucket} failed:\n{text}\n{}\n{}",
                String::from_utf8_lossy(&output.stderr),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `http://127.0.0.1:<s3 port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3_port)
    }

    /// The flags that point a store at `bucket` on this server (with
    /// [`crate::moto::AWS_ENV`] for the credentials).
    pub fn store_flags(&self, bucket: &str) -> Vec<String> {
        crate::moto::s3_store_flags(&self.endpoint(), bucket)
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default()
    }
}

//! A real `kiln-store` process on a free loopback port with a temporary
//! data directory, killed when dropped. The store's own tests pass
//! `env!("CARGO_BIN_EXE_kiln-store")`; other crates' tests find the binary
//! with [`crate::binaries::built_binary`].
//!
//! The store's stderr goes to a log file: [`StoreProcess::log`] reads it,
//! and a test that panics while the store runs prints it with its failure.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::http::{free_port, http};
use crate::memory_cgroup::LimitedCgroup;

/// How long a store may take to answer its first probe. Generous: CI
/// machines are shared, and a store recovering a WAL under load is slow.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A running `kiln-store`; killed and cleaned up on drop.
#[derive(Debug)]
pub struct StoreProcess {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub data_dir: tempfile::TempDir,
    log_dir: tempfile::TempDir,
}

impl StoreProcess {
    /// Starts `binary` with `extra` flags and waits until `/readyz` is 200.
    #[track_caller]
    pub fn start(binary: impl AsRef<Path>, extra: &[&str]) -> Self {
        let data_dir = tempfile::tempdir().expect("temp dir");
        Self::start_in(binary, data_dir, extra)
    }

    /// Starts a store on an existing data directory.
    #[track_caller]
    pub fn start_in(binary: impl AsRef<Path>, data_dir: tempfile::TempDir, extra: &[&str]) -> Self {
        Self::start_with_env(binary, data_dir, extra, &[])
    }

    /// Starts a store with extra environment variables.
    #[track_caller]
    pub fn start_with_env(
        binary: impl AsRef<Path>,
        data_dir: tempfile::TempDir,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        let mut store = Self::spawn(binary.as_ref(), data_dir, extra, envs);
        store.wait_for("/readyz");
        store
    }

    /// Starts a store listening on `addr` (one its peers were told of
    /// before it started), with extra environment variables.
    #[track_caller]
    pub fn start_on(
        binary: impl AsRef<Path>,
        addr: SocketAddr,
        data_dir: tempfile::TempDir,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        let mut store =
            Self::spawn_command_on(Command::new(binary.as_ref()), addr, data_dir, extra, envs);
        store.wait_for("/readyz");
        store
    }

    /// Starts a store and waits only until it answers `/healthz` (it may
    /// still be recovering).
    #[track_caller]
    pub fn start_live(binary: impl AsRef<Path>, extra: &[&str], envs: &[(&str, &str)]) -> Self {
        let data_dir = tempfile::tempdir().expect("temp dir");
        let mut store = Self::spawn(binary.as_ref(), data_dir, extra, envs);
        store.wait_for("/healthz");
        store
    }

    /// Starts a store on `data_dir` inside a memory cgroup (its pid is the
    /// store's, so [`StoreProcess::pid`] reads the store's own status) and
    /// waits until `/readyz` is 200.
    #[track_caller]
    pub fn start_in_cgroup(
        binary: impl AsRef<Path>,
        cgroup: &LimitedCgroup,
        data_dir: tempfile::TempDir,
        extra: &[&str],
    ) -> Self {
        let mut store = Self::spawn_command(cgroup.command(binary.as_ref()), data_dir, extra, &[]);
        store.wait_for("/readyz");
        store
    }

    #[track_caller]
    fn spawn(
        binary: &Path,
        data_dir: tempfile::TempDir,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        Self::spawn_command(Command::new(binary), data_dir, extra, envs)
    }

    #[track_caller]
    fn spawn_command(
        command: Command,
        data_dir: tempfile::TempDir,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        Self::spawn_command_on(command, free_port(), data_dir, extra, envs)
    }

    #[track_caller]
    fn spawn_command_on(
        mut command: Command,
        addr: SocketAddr,
        data_dir: tempfile::TempDir,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        // Apart from the data directory, which tests inspect and reuse.
        let log_dir = tempfile::tempdir().expect("temp dir for the store's log");
        let log = std::fs::File::create(log_dir.path().join("store.log")).expect("store log file");
        let child = command
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--data-dir")
            .arg(data_dir.path())
            .args(extra)
            .env("KILN_LOG", "warn")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", command.get_program()));
        Self {
            child: Some(child),
            addr,
            data_dir,
            log_dir,
        }
    }

    #[track_caller]
    fn wait_for(&mut self, path: &str) {
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("kiln-store exited early: {status}\n{}", self.log());
            }
            if let Ok(response) = http(self.addr, "GET", path, &[], b"")
                && response.status == 200
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "kiln-store on {} did not answer {path} with 200 in {} s:\n{}",
            self.addr,
            READY_WITHIN.as_secs(),
            self.log()
        );
    }

    /// The store's process id, while it has not been stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How the store exited, if it has (a store that should be serving and
    /// is not shows here, killed or crashed).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What the store wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.log_dir.path().join("store.log")
    }

    /// Kills the store (SIGKILL: no flush, no goodbye) and returns its
    /// data dir, to start it again as a crashed replica restarts.
    pub fn kill(mut self) -> tempfile::TempDir {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let dir = tempfile::tempdir().expect("temp dir");
        std::mem::replace(&mut self.data_dir, dir)
    }

    /// Sends SIGTERM and waits for a clean exit; returns the data dir.
    #[track_caller]
    pub fn stop(mut self) -> tempfile::TempDir {
        if let Some(mut child) = self.child.take() {
            let pid = i32::try_from(child.id()).expect("pid fits in pid_t");
            // SAFETY: kill(2) with a pid we spawned and still own (not yet
            // reaped), so it cannot hit an unrelated process.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
            let status = child.wait().expect("wait for kiln-store");
            assert!(
                status.success(),
                "kiln-store exited with {status} after SIGTERM:\n{}",
                self.log()
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
        if std::thread::panicking() {
            // Captured by libtest and shown with the failing test only.
            eprintln!("kiln-store on {} logged:\n{}", self.addr, self.log());
        }
    }
}

//! A memory cgroup a test creates inside its own (v2 `memory.max`, or v1
//! `memory.limit_in_bytes` on hybrid hosts), for the tests that hold
//! `kiln-store` to its `--memory-budget`: the store runs inside a group of
//! that size, so going over its budget is an OOM kill the test sees.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::prerequisites::missing;

/// A memory cgroup created for this test, removed on drop.
#[derive(Debug)]
pub struct LimitedCgroup {
    dir: PathBuf,
    v2: bool,
}

impl LimitedCgroup {
    /// Creates a child of this process's memory cgroup limited to `limit`
    /// bytes (swap off), or explains why it cannot.
    pub fn create(limit: u64) -> Result<Self, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let v1_path = own.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_owned())
        });
        // One test process may make a group per test, one after another: a
        // group whose removal failed must not block the next one.
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "kiln-memory-limit-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        );
        let (parent, v2) = match v1_path {
            Some(path) => (
                Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')),
                false,
            ),
            None => {
                let path = own
                    .lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .ok_or("no memory cgroup in /proc/self/cgroup")?;
                let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                    .into_iter()
                    .find(|r| {
                        std::fs::read_to_string(Path::new(r).join("cgroup.controllers"))
                            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
                    })
                    .ok_or("no cgroup v2 mount with the memory controller")?;
                (Path::new(root).join(path.trim_start_matches('/')), true)
            }
        };
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let group = Self { dir, v2 };
        let write = |file: &str, value: &str| {
            std::fs::write(group.dir.join(file), value)
                .map_err(|e| format!("cannot write {file}: {e}"))
        };
        if v2 {
            write("memory.max", &limit.to_string())?;
            // Absent without swap accounting; then there is no swap to use.
            let _ = write("memory.swap.max", "0");
        } else {
            write("memory.limit_in_bytes", &limit.to_string())?;
            // memsw is memory + swap; equal to the limit means no swap.
            let _ = write("memory.memsw.limit_in_bytes", &limit.to_string());
        }
        Ok(group)
    }

    /// [`LimitedCgroup::create`], or a missing prerequisite (a failure in
    /// CI, a visible skip elsewhere) when no group can be made here.
    #[track_caller]
    pub fn create_or_skip(limit: u64) -> Option<Self> {
        match Self::create(limit) {
            Ok(group) => Some(group),
            Err(why) => missing(&format!("a memory cgroup ({why})")),
        }
    }

    /// The file a process writes its pid to to join the group.
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// A command that runs `program` inside the group: a wrapper shell
    /// joins it, then becomes the program (so the child's pid is the
    /// program's). Add the program's arguments to it.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(r#"echo $$ > "$1" && shift && exec "$@""#)
            .arg("sh")
            .arg(self.procs_file())
            .arg(program);
        command
    }

    /// OOM kills inside the group so far.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The most memory the group has used at once, in bytes (v1
    /// `memory.max_usage_in_bytes`, v2 `memory.peak`, which kernels before
    /// 5.19 lack), still readable after its process was killed.
    pub fn peak_bytes(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for LimitedCgroup {
    fn drop(&mut self) {
        // Empty once the store has been reaped; removal is best effort.
        if let Err(err) = std::fs::remove_dir(&self.dir) {
            eprintln!("could not remove {}: {err}", self.dir.display());
        }
    }
}

/// A `kB` field of `/proc/<pid>/status` (`VmHWM:`, `VmRSS:`), in KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

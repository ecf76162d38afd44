//! Debug info as distributions ship it, and a real server for it: a C
//! program built with `gcc -g`, its debug info split off with `objcopy
//! --only-keep-debug`, a stripped copy (build id kept, debug link added),
//! and Debian's `debuginfod` serving the split file by build id. The
//! store's symbolization tests send the stripped copy's addresses; the
//! agent's privileged test runs the stripped copy and profiles it.
//!
//! Needs gcc, binutils and debuginfod: a missing tool is a visible skip, or
//! a failure under `CI=true` (`./kiln-dev test` installs them).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::http::{free_port, http};
use crate::prerequisites::missing;
use crate::process::KillOnDrop;

/// A program built and split: the full binary, its debug file and stripped
/// copy (in `served`, a directory of their own for debuginfod to scan), and
/// its GNU build id in hex.
#[derive(Debug)]
pub struct SplitProgram {
    pub dir: tempfile::TempDir,
    pub served: PathBuf,
    pub unstripped: PathBuf,
    pub debug: PathBuf,
    pub stripped: PathBuf,
    pub build_id: String,
}

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Builds `source` (C) as `name` with `gcc -g` and `cflags`, and splits it.
/// `None` (after a visible skip) when gcc or binutils are missing.
#[track_caller]
pub fn split_c_program(source: &str, name: &str, cflags: &[&str]) -> Option<SplitProgram> {
    for tool in ["gcc", "objcopy", "strip", "readelf"] {
        if !runs(tool, &["--version"]) {
            return missing(&format!("{tool} (Debian build-essential, binutils)"));
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let c_file = dir.path().join(format!("{name}.c"));
    std::fs::write(&c_file, source).expect("write source");
    let served = dir.path().join("served");
    std::fs::create_dir(&served).expect("served dir");
    let unstripped = dir.path().join(name);
    let debug = served.join(format!("{name}.debug"));
    let stripped = served.join(name);
    let [c_s, unstripped_s, debug_s, stripped_s] =
        [&c_file, &unstripped, &debug, &stripped].map(|p| p.display().to_string());
    let mut gcc_args = vec!["-g"];
    gcc_args.extend_from_slice(cflags);
    gcc_args.extend(["-o", &unstripped_s, &c_s]);
    assert!(runs("gcc", &gcc_args), "gcc {gcc_args:?} failed");
    assert!(runs(
        "objcopy",
        &["--only-keep-debug", &unstripped_s, &debug_s]
    ));
    assert!(runs("strip", &["-o", &stripped_s, &unstripped_s]));
    assert!(runs(
        "objcopy",
        &[&format!("--add-gnu-debuglink={debug_s}"), &stripped_s]
    ));
    let notes = Command::new("readelf")
        .args(["--notes", &stripped_s])
        .output()
        .expect("readelf runs");
    let build_id = String::from_utf8_lossy(&notes.stdout)
        .lines()
        .find_map(|line| Some(line.trim().strip_prefix("Build ID:")?.trim().to_owned()))
        .expect("gcc gave the program a GNU build id");
    Some(SplitProgram {
        dir,
        served,
        unstripped,
        debug,
        stripped,
        build_id,
    })
}

/// A real `debuginfod` scanning a program's `served` directory, and the
/// log of the requests it answered.
#[derive(Debug)]
pub struct Debuginfod {
    _process: KillOnDrop,
    pub url: String,
    log: PathBuf,
}

impl Debuginfod {
    /// Starts debuginfod on a free port and waits until its scan has
    /// indexed the program's debug file. `None` (after a visible skip) when
    /// debuginfod is not installed.
    #[track_caller]
    pub fn start(program: &SplitProgram) -> Option<Self> {
        if !runs("debuginfod", &["--version"]) {
            return missing("debuginfod (Debian debuginfod)");
        }
        let port = free_port().port();
        let log = program.dir.path().join("debuginfod.log");
        let child = Command::new("debuginfod")
            .arg("-p")
            .arg(port.to_string())
            .arg("-d")
            .arg(program.dir.path().join("debuginfod.sqlite"))
            .arg("-F")
            .arg(&program.served)
            .arg("-v")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("debuginfod starts");
        let server = Self {
            _process: KillOnDrop(child),
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let target = format!("/buildid/{}/debuginfo", program.build_id);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if http(addr, "GET", &target, &[], b"").is_ok_and(|r| r.status == 200) {
                return Some(server);
            }
            assert!(
                Instant::now() < deadline,
                "debuginfod never served the debug file"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Requests it logged for `build_id` (the readiness probe's included).
    pub fn requests_for(&self, build_id: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains(&format!("GET /buildid/{build_id}/")))
            .count()
    }
}

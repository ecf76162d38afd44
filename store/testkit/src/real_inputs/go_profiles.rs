//! Profiles a real Go runtime writes: builds
//! `programs/real_profiles/main.go` with the Go toolchain and runs it once.
//! What each file holds is listed on [`GoProfiles`]; the program's own
//! comment says how it makes each trait.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{program, run};
use crate::go_programs;

/// The functions, labels and depths the program puts in its profiles, for
/// tests to look for.
pub mod expect {
    /// The labelled CPU work; `square` is inlined into it.
    pub const CPU_FUNCTION: &str = "main.spinHash";
    /// The inlined helper: its lines share locations with [`CPU_FUNCTION`].
    pub const INLINED_FUNCTION: &str = "main.square";
    /// The label on the CPU work, with its value.
    pub const LABEL: (&str, &str) = ("phase", "hash");
    /// A label whose value is not valid UTF-8 (`bad\xff\xfeutf8`).
    pub const RAW_LABEL_KEY: &str = "raw";
    /// The functions on the heap profile's thousands of distinct stacks.
    pub const HEAP_FUNCTIONS: [&str; 3] = ["main.descend", "main.branchA", "main.branchB"];
    /// At least this many distinct allocation stacks (4,096 paths).
    pub const MIN_HEAP_SAMPLES: usize = 4_096;
    /// Recursed 300 deep: stacks deeper than the runtime records.
    pub const DEEP_FUNCTION: &str = "main.deepRecursion";
    /// Go records at most this many frames of a stack (Go 1.23 and later).
    pub const MIN_TRUNCATED_DEPTH: usize = 100;
    /// The contended function of the block and mutex profiles.
    pub const CONTENDED_FUNCTION: &str = "main.contend";
}

/// The files the program wrote, all in one directory.
#[derive(Debug, Clone)]
pub struct GoProfiles {
    /// The built program.
    pub binary: PathBuf,
    /// Gzipped pprof: `samples/count, cpu/nanoseconds`, labelled and
    /// inlined frames, one label value that is not valid UTF-8.
    pub cpu: PathBuf,
    /// Gzipped pprof: `alloc_objects, alloc_space, inuse_objects,
    /// inuse_space`, a numeric `bytes` label on each sample, thousands of
    /// samples, stacks truncated at the runtime's depth.
    pub heap: PathBuf,
    /// Gzipped pprof: `contentions/count, delay/nanoseconds`.
    pub block: PathBuf,
    /// Gzipped pprof: `contentions/count, delay/nanoseconds`, holder side.
    pub mutex: PathBuf,
    /// Gzipped pprof: `goroutine/count`.
    pub goroutine: PathBuf,
    /// The legacy text formats (`debug=1`) of the goroutine and block
    /// profiles: real profiles that are not protobuf.
    pub legacy_text: [PathBuf; 2],
}

impl GoProfiles {
    /// Every pprof file, with a short name for messages.
    pub fn pprof_files(&self) -> [(&'static str, &Path); 5] {
        [
            ("go cpu", &self.cpu),
            ("go heap", &self.heap),
            ("go block", &self.block),
            ("go mutex", &self.mutex),
            ("go goroutine", &self.goroutine),
        ]
    }
}

/// Builds and runs the profile writer in `dir` (a second or so of work).
/// `None` (after the house rule) without Go.
pub fn write_go_profiles(dir: &Path) -> Option<GoProfiles> {
    let source = program("real_profiles/main.go");
    let binary = go_programs::build(&source, dir, "real_profiles")?;
    let out = dir.join("profiles");
    std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    run(Command::new(&binary).arg(&out), "the Go profile writer");
    Some(GoProfiles {
        binary,
        cpu: out.join("cpu.pprof"),
        heap: out.join("heap.pprof"),
        block: out.join("block.pprof"),
        mutex: out.join("mutex.pprof"),
        goroutine: out.join("goroutine.pprof"),
        legacy_text: [out.join("goroutine.txt"), out.join("block.txt")],
    })
}

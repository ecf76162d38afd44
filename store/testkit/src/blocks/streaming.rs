//! Shared by the engine's streaming compaction tests: real profiles from a
//! Go program built and run at test time (`store/engine/tests/programs/
//! burner`), hour blocks of them written to files, and block files read by
//! range.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::go_programs::build;

use kiln_engine::{BlockRanges, Head, IngestLimits, Label, LabelSet, encode_block};
use kiln_pprof::{DecodeLimits, FunctionSpec, Profile, ProfileBuilder, decode, encode_gzip};

/// An hour in milliseconds.
pub const HOUR: i64 = 3_600_000;

/// A block file read at offsets, as the store reads a local one.
#[derive(Debug)]
pub struct FileRanges {
    file: File,
    size: u64,
}

impl FileRanges {
    /// Opens the block file at `path`.
    pub fn open(path: &Path) -> FileRanges {
        let file = File::open(path).expect("block file opens");
        let size = file.metadata().expect("block file metadata").len();
        FileRanges { file, size }
    }
}

impl BlockRanges for FileRanges {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_range(&mut self, offset: u64, len: usize, buf: &mut Vec<u8>) -> std::io::Result<()> {
        let start = buf.len();
        buf.resize(start + len, 0);
        self.file.read_exact_at(&mut buf[start..], offset)
    }
}

/// The CPU and heap profiles a real Go runtime writes with `runtime/pprof`
/// while burning CPU and allocating, or `None` (said on stderr; a failure
/// in CI) when Go is not installed.
pub fn go_profiles(tmp: &Path) -> Option<Vec<Profile>> {
    let source =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/programs/burner/main.go");
    let binary = build(&source, tmp, "burner")?;
    let (cpu, heap) = (tmp.join("cpu.pprof"), tmp.join("heap.pprof"));
    let run = Command::new(&binary)
        .arg(&cpu)
        .arg(&heap)
        .output()
        .expect("burner runs");
    assert!(
        run.status.success(),
        "burner failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let mut profiles = Vec::new();
    for path in [cpu, heap] {
        let bytes = std::fs::read(path).expect("profile written");
        profiles.push(decode(&bytes, &DecodeLimits::default()).expect("Go's profile decodes"));
    }
    Some(profiles)
}

/// Writes `hours` hour blocks of `pods` pods, each sending one of
/// `profiles` (rotated per pod and time) every `step_ms`; returns the
/// files and their total size.
pub fn write_hour_blocks(
    dir: &Path,
    profiles: &[Profile],
    pods: usize,
    hours: usize,
    step_ms: i64,
) -> (Vec<PathBuf>, u64) {
    let start = 20_000 * 24 * HOUR;
    let mut paths = Vec::new();
    let mut total = 0;
    for hour in 0..hours {
        let mut head = Head::new();
        let hour_start = start + hour as i64 * HOUR;
        for (step, t) in (hour_start..hour_start + HOUR)
            .step_by(step_ms as usize)
            .enumerate()
        {
            for pod in 0..pods {
                let labels = LabelSet::new(vec![
                    Label::new("__name__", "process_cpu"),
                    Label::new("namespace", format!("ns-{}", pod % 3)),
                    Label::new("pod", format!("pod-{pod}")),
                ]);
                let profile = &profiles[(step + pod) % profiles.len()];
                head.ingest(
                    profile,
                    &labels,
                    t,
                    10_000_000_000,
                    &IngestLimits::default(),
                )
                .expect("real profile ingests");
            }
        }
        let (_, bytes) = encode_block(&head, &format!("hour-{hour}"), "test").expect("encodes");
        total += bytes.len() as u64;
        let path = dir.join(format!("hour-{hour}"));
        std::fs::write(&path, &bytes).expect("block written");
        paths.push(path);
    }
    (paths, total)
}

/// A CPU profile with `stacks` distinct stacks (four frames each, sharing
/// callers as a real program's do), built with the pprof builder: one
/// series of it over many hours is far larger than the Go profiles'.
pub fn wide_profile(stacks: usize) -> Profile {
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    b.time(0, 10_000_000_000);
    let frame = |b: &mut ProfileBuilder, name: String| {
        let function = b.function(&FunctionSpec {
            name: name.clone(),
            system_name: name,
            filename: "wide.rs".into(),
            start_line: 1,
        });
        b.location(0, 0, &[(function, 1)])
    };
    for i in 0..stacks {
        let leaf = frame(&mut b, format!("leaf_{i}"));
        let caller = frame(&mut b, format!("worker_{}", i % 97));
        let service = frame(&mut b, format!("service_{}", i % 13));
        let main = frame(&mut b, "main".into());
        let count = 1 + (i % 7) as i64;
        b.sample(&[leaf, caller, service, main], &[count * 10_000_000], &[]);
    }
    let bytes = encode_gzip(&b.finish());
    decode(&bytes, &DecodeLimits::default()).expect("the built profile decodes")
}

//! `perf record -g` of a real C program (`programs/perf_busy.c`), read back
//! with `perf script`: each sample's call chain and period, the process's
//! executable mappings, and the build IDs perf stored. Two uses:
//!
//! - folded stacks weighted by each sample's period ([`fold_by_period`]),
//!   so the counts are large, as in perf's own collapsed output of events;
//! - unsymbolized frames of a stripped binary: addresses in files with
//!   build IDs, as an eBPF agent sees them ([`PerfRecording::resolve`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{program, run, tool};

/// The functions of the unstripped program's stacks.
pub const FUNCTIONS: [&str; 4] = ["main", "left", "right", "mix"];

/// One frame as `perf script` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfFrame {
    /// The address perf prints: relative to the file for user-space code.
    pub address: u64,
    /// The symbol, `[unknown]` where the file has none.
    pub symbol: String,
    /// The file (or `[kernel.kallsyms]`, `[vdso]`) the address is in.
    pub dso: String,
}

/// One sample: its weight and its stack, leaf first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfSample {
    /// The event period (nanoseconds of `cpu-clock`, or event counts).
    pub period: u64,
    /// Leaf first, as perf prints it.
    pub frames: Vec<PerfFrame>,
}

/// An executable mapping of the recorded process (`PERF_RECORD_MMAP2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfMapping {
    /// Where it was loaded.
    pub start: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The offset in the file of its first byte.
    pub file_offset: u64,
    /// The mapped file.
    pub filename: String,
    /// The GNU build ID perf stored for the file; empty if none.
    pub build_id: String,
}

/// A recording, parsed.
#[derive(Debug, Clone)]
pub struct PerfRecording {
    /// The `perf.data` file itself (a real, non-pprof binary format).
    pub data: PathBuf,
    /// The recorded program, stripped or not.
    pub binary: PathBuf,
    /// Every sample of the recorded program.
    pub samples: Vec<PerfSample>,
    /// The program's executable mappings.
    pub mappings: Vec<PerfMapping>,
}

impl PerfRecording {
    /// The mapping a frame's file was loaded at and the frame's run-time
    /// address in it, or `None` for frames outside the process's mappings
    /// (the kernel's).
    pub fn resolve(&self, frame: &PerfFrame) -> Option<(usize, u64)> {
        // perf prints a user-space address relative to its file; the
        // binaries here load each segment at its file offset's address.
        self.mappings.iter().enumerate().find_map(|(index, m)| {
            let inside = m.filename == frame.dso
                && (m.file_offset..m.file_offset + m.len).contains(&frame.address);
            inside.then(|| (index, m.start + frame.address - m.file_offset))
        })
    }

    /// The sum of every sample's period.
    pub fn total_period(&self) -> u64 {
        self.samples.iter().map(|s| s.period).sum()
    }
}

/// True when `perf` runs; the house rule otherwise.
pub fn perf_available() -> Option<()> {
    tool("perf", &["--version"], "linux-perf")
}

/// Compiles `programs/perf_busy.c` into `dir` (with frame pointers; with
/// `stripped`, without a symbol table), records `seconds` of it with
/// `perf record -g` at 999 Hz, and parses the recording. `None` (after the
/// house rule) without `cc` or `perf`, or where the kernel refuses perf
/// events to this process (said so; a failure in CI).
pub fn record_busy_c_program(dir: &Path, stripped: bool, seconds: f64) -> Option<PerfRecording> {
    tool("cc", &["--version"], "a C compiler, gcc or clang")?;
    perf_available()?;
    let name = if stripped {
        "perf_busy_stripped"
    } else {
        "perf_busy"
    };
    let binary = dir.join(name);
    let mut cc = Command::new("cc");
    // -O0 keeps left and right as frames of their own: optimised, they
    // become tail calls or clones and leave the stacks.
    cc.args(["-O0", "-fno-omit-frame-pointer", "-Wl,--build-id"])
        .arg(program("perf_busy.c"))
        .arg("-o")
        .arg(&binary);
    if stripped {
        cc.arg("-s");
    }
    run(&mut cc, "cc perf_busy.c");

    let data = dir.join(format!("{name}.perf.data"));
    let record = Command::new("perf")
        .args(["record", "-F", "999", "-g", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&binary)
        .arg(seconds.to_string())
        .output()
        .unwrap_or_else(|e| panic!("perf record: cannot start: {e}"));
    if !record.status.success() {
        return crate::prerequisites::missing(&format!(
            "perf record could not sample here ({}): {}",
            record.status,
            String::from_utf8_lossy(&record.stderr).trim()
        ));
    }
    let script = run(
        Command::new("perf")
            .args([
                "script",
                "--show-mmap-events",
                "-F",
                "comm,period,ip,sym,dso",
                "-i",
            ])
            .arg(&data),
        "perf script",
    );
    let build_ids = run(
        Command::new("perf").args(["buildid-list", "-i"]).arg(&data),
        "perf buildid-list",
    );
    let comm: String = name.chars().take(15).collect();
    let (samples, mut mappings) = parse_script(&String::from_utf8_lossy(&script.stdout), &comm);
    let build_ids = parse_build_ids(&String::from_utf8_lossy(&build_ids.stdout));
    for mapping in &mut mappings {
        if let Some(id) = build_ids.get(&mapping.filename) {
            mapping.build_id.clone_from(id);
        }
    }
    Some(PerfRecording {
        data,
        binary,
        samples,
        mappings,
    })
}

/// Folded stacks (`root;…;leaf COUNT`, one line per distinct stack) whose
/// counts are the summed periods of the samples: perf's event weights, not
/// sample counts. Frames are symbols, or `[unknown]`.
pub fn fold_by_period(samples: &[PerfSample]) -> String {
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    for sample in samples {
        let stack: Vec<&str> = sample
            .frames
            .iter()
            .rev()
            .map(|f| f.symbol.as_str())
            .collect();
        *stacks.entry(stack.join(";")).or_default() += sample.period;
    }
    stacks
        .iter()
        .map(|(stack, count)| format!("{stack} {count}\n"))
        .collect()
}

/// Parses `perf script --show-mmap-events -F comm,period,ip,sym,dso`,
/// keeping the samples and executable mappings of the process named `comm`.
fn parse_script(text: &str, comm: &str) -> (Vec<PerfSample>, Vec<PerfMapping>) {
    let mut samples = Vec::new();
    let mut mappings = Vec::new();
    let mut current: Option<PerfSample> = None;
    for line in text.lines() {
        if let Some(frame) = line.strip_prefix('\t') {
            if let (Some(sample), Some(frame)) = (current.as_mut(), parse_frame(frame)) {
                sample.frames.push(frame);
            }
            continue;
        }
        samples.extend(current.take().filter(|s| !s.frames.is_empty()));
        let mut words = line.split_whitespace();
        if words.next() != Some(comm) {
            continue;
        }
        if line.contains("PERF_RECORD_MMAP") {
            mappings.extend(parse_mapping(line));
        } else if let Some(Ok(period)) = words.last().map(str::parse) {
            current = Some(PerfSample {
                period,
                frames: Vec::new(),
            });
        }
    }
    samples.extend(current.filter(|s| !s.frames.is_empty()));
    (samples, mappings)
}

/// `            1274 mix (/tmp/x/perf_busy)`; the symbol may hold spaces.
fn parse_frame(text: &str) -> Option<PerfFrame> {
    let (address, rest) = text.trim_start().split_once(' ')?;
    let (symbol, dso) = rest.rsplit_once(" (")?;
    Some(PerfFrame {
        address: u64::from_str_radix(address, 16).ok()?,
        symbol: symbol.trim().to_owned(),
        dso: dso.strip_suffix(')')?.to_owned(),
    })
}

/// `comm pid PERF_RECORD_MMAP2 pid/tid: [0xSTART(0xLEN) @ 0xOFF ...]: r-xp FILE`;
/// only executable mappings.
fn parse_mapping(line: &str) -> Option<PerfMapping> {
    let hex = |s: &str| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok();
    let (_, rest) = line.split_once(": [")?;
    let (start, rest) = rest.split_once('(')?;
    let (len, rest) = rest.split_once(") @ ")?;
    let offset = rest.split_whitespace().next()?;
    let (_, tail) = rest.split_once("]: ")?;
    let (protection, filename) = tail.split_once(' ')?;
    if !protection.contains('x') {
        return None;
    }
    Some(PerfMapping {
        start: hex(start)?,
        len: hex(len)?,
        file_offset: hex(offset)?,
        filename: filename.trim().to_owned(),
        build_id: String::new(),
    })
}

/// `perf buildid-list`: `BUILD_ID FILE` per line.
fn parse_build_ids(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(id, file)| (file.trim().to_owned(), id.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "\
perf_busy 7 PERF_RECORD_MMAP2 7/7: [0x55eb3b44b000(0x1000) @ 0x1000 fe:00 9980498 2244537998]: r-xp /tmp/x/perf_busy
perf_busy 7 PERF_RECORD_MMAP2 7/7: [0x55eb3b44c000(0x1000) @ 0x2000 fe:00 9980498 2244537998]: r--p /tmp/x/perf_busy
other 8 PERF_RECORD_MMAP2 8/8: [0x1000(0x1000) @ 0 fe:00 1 2]: r-xp /bin/other
perf_busy    1001001 
\t            1274 mix (/tmp/x/perf_busy)
\t           2724a std::vector<int, A>::at (/usr/lib/libc.so.6)

other    5 
\t            10 f (/bin/other)
";

    #[test]
    fn script_output_parses_into_samples_and_executable_mappings() {
        let (samples, mappings) = parse_script(SCRIPT, "perf_busy");
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].period, 1_001_001);
        assert_eq!(samples[0].frames[1].symbol, "std::vector<int, A>::at");
        assert_eq!(samples[0].frames[1].dso, "/usr/lib/libc.so.6");
        assert_eq!(samples[0].frames[0].address, 0x1274);
        assert_eq!(mappings.len(), 1, "{mappings:?}");
        assert_eq!(mappings[0].start, 0x55eb_3b44_b000);
        assert_eq!(mappings[0].file_offset, 0x1000);
        assert_eq!(
            fold_by_period(&samples),
            "std::vector<int, A>::at;mix 1001001\n"
        );
    }
}

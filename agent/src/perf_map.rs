//! Perf maps (`/tmp/perf-PID.map`): the names JIT runtimes give their
//! generated code. Node writes them with `--perf-basic-prof`, HotSpot on
//! `jcmd PID Compiler.perfmap` (17+) or continuously with
//! `-XX:+DumpPerfMapAtExit`-era agents.
//!
//! The file lives in the process's mount namespace and is written by code the
//! agent does not trust, so it is opened beneath the process's root with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`, never following a
//! symlink out of the container, without blocking on a FIFO, only when it is
//! a regular file, and read up to a byte cap. Parsing is pure and bounded.

use std::collections::BTreeMap;
use std::io::{BufRead, Read};
use std::sync::Arc;

/// Caps on one perf map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerfMapLimits {
    /// Bytes read at most; the rest of a longer file is ignored.
    pub max_bytes: u64,
    /// Entries kept at most.
    pub max_entries: usize,
    /// Longest name kept (longer ones are cut).
    pub max_name_bytes: usize,
}

impl Default for PerfMapLimits {
    fn default() -> Self {
        PerfMapLimits {
            max_bytes: 64 * 1024 * 1024,
            max_entries: 500_000,
            max_name_bytes: 1024,
        }
    }
}

/// The symbols of one perf map: address ranges with names. When ranges
/// overlap (code freed and regenerated at the same address), the entry
/// written last wins, as the file is appended in time order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PerfMap {
    by_start: BTreeMap<u64, (u64, Arc<str>)>,
}

impl PerfMap {
    /// Parses perf map text: `START SIZE NAME` per line, START and SIZE in
    /// hex with or without `0x` (HotSpot writes it, Node does not).
    /// Malformed lines are skipped.
    pub fn parse(text: &str, limits: &PerfMapLimits) -> PerfMap {
        let mut map = PerfMap::default();
        for line in text.lines() {
            if !map.add_line(line, limits) {
                break;
            }
        }
        map
    }

    /// Parses perf map lines as they are read, holding one line at a time
    /// (a line longer than the longest name plus its addresses is skipped).
    pub fn parse_reader(reader: impl BufRead, limits: &PerfMapLimits) -> std::io::Result<PerfMap> {
        let mut map = PerfMap::default();
        let max_line = limits.max_name_bytes + 64;
        let mut reader = reader;
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            // Read at most one line, and never more than max_line + 1 bytes of it.
            let read = (&mut reader)
                .take(max_line as u64 + 1)
                .read_until(b'\n', &mut line)?;
            if read == 0 {
                break;
            }
            if line.last() != Some(&b'\n') && line.len() > max_line {
                // Over-long line: skip the rest of it.
                skip_line(&mut reader)?;
                continue;
            }
            if !map.add_line(&String::from_utf8_lossy(&line), limits) {
                break;
            }
        }
        Ok(map)
    }

    /// Adds one line; false once the map is full.
    fn add_line(&mut self, line: &str, limits: &PerfMapLimits) -> bool {
        if self.by_start.len() >= limits.max_entries {
            return false;
        }
        let Some((start, size, name)) = parse_line(line.trim_end_matches('\n')) else {
            return true;
        };
        let Some(end) = start.checked_add(size) else {
            return true;
        };
        let name = truncate(name.trim(), limits.max_name_bytes);
        self.by_start.insert(start, (end, Arc::from(name)));
        true
    }

    /// The name of the code containing `address`.
    pub fn lookup(&self, address: u64) -> Option<Arc<str>> {
        let (_, (end, name)) = self.by_start.range(..=address).next_back()?;
        (address < *end).then(|| Arc::clone(name))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    /// Whether the map has no entries.
    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

/// Consumes the rest of an over-long line.
fn skip_line(reader: &mut impl BufRead) -> std::io::Result<()> {
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok(());
        }
        match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => {
                reader.consume(at + 1);
                return Ok(());
            }
            None => {
                let len = buffer.len();
                reader.consume(len);
            }
        }
    }
}

fn parse_line(line: &str) -> Option<(u64, u64, &str)> {
    let hex = |field: &str| {
        let digits = field.strip_prefix("0x").unwrap_or(field);
        u64::from_str_radix(digits, 16).ok()
    };
    let line = line.trim_start();
    let (start, rest) = line.split_once(' ')?;
    let (size, name) = rest.trim_start().split_once(' ')?;
    Some((hex(start)?, hex(size)?, name))
}

fn truncate(name: &str, max: usize) -> &str {
    if name.len() <= max {
        return name;
    }
    let mut end = max;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// Why a perf map was not read.
#[derive(Debug, thiserror::Error)]
pub enum PerfMapError {
    /// The file (or the process's root) could not be opened beneath the root.
    #[error("cannot open {path} beneath the process root")]
    Open {
        /// The path inside the process's mount namespace.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Something other than a regular file sits at the path.
    #[error("{path} is not a regular file")]
    NotAFile {
        /// The path inside the process's mount namespace.
        path: String,
    },
    /// Reading failed.
    #[error("cannot read {path}")]
    Read {
        /// The path inside the process's mount namespace.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl PerfMapError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PerfMapError::Open { .. } => "perf_map_open",
            PerfMapError::NotAFile { .. } => "perf_map_not_a_file",
            PerfMapError::Read { .. } => "perf_map_read",
        }
    }
}

/// The pid a process knows itself by (innermost PID namespace), from
/// `/proc/PID/status`'s `NSpid` line; perf maps are named with it.
pub fn namespace_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))?
        .split_ascii_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Which version of a perf map file was read: a map whose file has the
/// same identity, size and modification time is not parsed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerfMapVersion {
    device: u64,
    inode: u64,
    len: u64,
    modified_ns: i128,
}

/// What reading a process's perf map found.
#[derive(Debug)]
pub enum PerfMapRead {
    /// The process has no perf map.
    Missing,
    /// The file is the version already read.
    Unchanged,
    /// A new or changed map.
    Read(PerfMap, PerfMapVersion),
}

/// Reads `/tmp/perf-NSPID.map` of process `pid` beneath its root, unless it
/// is the `previous` version (JIT runtimes append to it, so a change shows
/// in its size and modification time).
pub fn read_process_perf_map(
    pid: u32,
    limits: &PerfMapLimits,
    previous: Option<PerfMapVersion>,
) -> Result<PerfMapRead, PerfMapError> {
    use std::os::unix::fs::MetadataExt;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let own_pid = namespace_pid(&status).unwrap_or(pid);
    let path = format!("tmp/perf-{own_pid}.map");
    let root = format!("/proc/{pid}/root");
    let file = match crate::safe_open::open_beneath(&root, &path) {
        Ok(file) => file,
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(PerfMapRead::Missing);
        }
        Err(source) => return Err(PerfMapError::Open { path, source }),
    };
    let metadata = file.metadata().map_err(|source| PerfMapError::Read {
        path: path.clone(),
        source,
    })?;
    if !metadata.is_file() {
        return Err(PerfMapError::NotAFile { path });
    }
    let version = PerfMapVersion {
        device: metadata.dev(),
        inode: metadata.ino(),
        len: metadata.len(),
        modified_ns: i128::from(metadata.mtime()) * 1_000_000_000
            + i128::from(metadata.mtime_nsec()),
    };
    if previous == Some(version) {
        return Ok(PerfMapRead::Unchanged);
    }
    // Streamed line by line (never the whole file in memory), and not
    // trusted to be UTF-8.
    let reader = std::io::BufReader::new(file.take(limits.max_bytes));
    PerfMap::parse_reader(reader, limits)
        .map(|map| PerfMapRead::Read(map, version))
        .map_err(|source| PerfMapError::Read { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hotspot_and_node_formats_parse_and_later_entries_win() {
        let text = "0x00007fafccec7600 0x00000000000000f8 long KilnHot.kilnHotJava(long)\n\
                    7f0000001000 40 LazyCompile:*kilnHotJs /app/busy.js:1\n\
                    not a line\n\
                    0x00007fafccec7600 0x0000000000000010 long KilnHot.recompiled()\n";
        let map = PerfMap::parse(text, &PerfMapLimits::default());
        assert_eq!(
            map.len(),
            2,
            "same start: the later entry replaces the earlier"
        );
        assert_eq!(
            map.lookup(0x7fafccec7605).as_deref(),
            Some("long KilnHot.recompiled()")
        );
        assert_eq!(
            map.lookup(0x7fafccec7620),
            None,
            "past the later entry's end"
        );
        assert_eq!(
            map.lookup(0x7f0000001010).as_deref(),
            Some("LazyCompile:*kilnHotJs /app/busy.js:1")
        );
        assert_eq!(map.lookup(0x1000), None);
    }

    #[test]
    fn caps_bound_entries_and_names() {
        let limits = PerfMapLimits {
            max_bytes: 1 << 20,
            max_entries: 3,
            max_name_bytes: 8,
        };
        let text: String = (0..10)
            .map(|i| format!("{:x} 10 {}\n", 0x1000 + i * 0x100, "é".repeat(10)))
            .collect();
        let map = PerfMap::parse(&text, &limits);
        assert_eq!(map.len(), 3);
        assert_eq!(map.lookup(0x1000).as_deref(), Some("éééé"));
    }

    #[test]
    fn the_streaming_reader_matches_the_text_parser_and_skips_overlong_lines() {
        let limits = PerfMapLimits {
            max_name_bytes: 16,
            ..PerfMapLimits::default()
        };
        let long = format!("3000 10 {}\n", "x".repeat(5000));
        let text = format!("1000 10 first\n{long}2000 10 second\nnot a line\n4000 10 last");
        let streamed = PerfMap::parse_reader(std::io::Cursor::new(text.as_bytes()), &limits)
            .expect("in-memory read");
        assert_eq!(streamed.lookup(0x1004).as_deref(), Some("first"));
        assert_eq!(streamed.lookup(0x2004).as_deref(), Some("second"));
        assert_eq!(
            streamed.lookup(0x3004),
            None,
            "the over-long line is skipped"
        );
        assert_eq!(streamed.lookup(0x4004).as_deref(), Some("last"));
        assert_eq!(streamed.len(), 3);
    }

    #[test]
    fn an_unchanged_map_is_not_parsed_again_and_a_grown_one_is() {
        let pid = std::process::id();
        let path = std::path::PathBuf::from(format!("/tmp/perf-{pid}.map"));
        std::fs::write(&path, "1000 10 first\n").expect("write own perf map");
        let limits = PerfMapLimits::default();
        let version = match read_process_perf_map(pid, &limits, None) {
            Ok(PerfMapRead::Read(map, version)) => {
                assert_eq!(map.lookup(0x1001).as_deref(), Some("first"));
                version
            }
            other => panic!("expected a read, got {other:?}"),
        };
        assert!(matches!(
            read_process_perf_map(pid, &limits, Some(version)),
            Ok(PerfMapRead::Unchanged)
        ));
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("append");
        std::io::Write::write_all(&mut file, b"2000 10 second\n").expect("grow");
        let grown = read_process_perf_map(pid, &limits, Some(version));
        let _ = std::fs::remove_file(&path);
        match grown {
            Ok(PerfMapRead::Read(map, _)) => assert_eq!(map.len(), 2),
            other => panic!("expected a re-read, got {other:?}"),
        }
    }

    #[test]
    fn overflowing_ranges_are_skipped() {
        let map = PerfMap::parse("ffffffffffffffff 10 wrap\n", &PerfMapLimits::default());
        assert!(map.is_empty());
    }

    #[test]
    fn namespace_pid_is_the_innermost() {
        assert_eq!(namespace_pid("Name:\tx\nNSpid:\t4242\t7\n"), Some(7));
        assert_eq!(namespace_pid("Name:\tx\nNSpid:\t4242\n"), Some(4242));
        assert_eq!(namespace_pid("Name:\tx\n"), None);
    }
}

//! `/proc/PID/maps` parsing and address normalization (pure).
//!
//! A user frame is tied to the mapping that contains it, and its address is
//! normalized to a file offset (`addr - start + pgoff`), which together with
//! the file's build id identifies the code independent of where ASLR put it.

/// What backs a mapping.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MappingKind {
    /// A file, by the path the process sees (inside its mount namespace).
    File {
        /// Path as written in `/proc/PID/maps`.
        path: String,
        /// Whether the kernel marked the file ` (deleted)`.
        deleted: bool,
        /// The device the maps line names, encoded as `st_dev` is
        /// (`makedev(major, minor)`), so it compares with `fstat`.
        device: u64,
        /// The file's inode, as the maps line says.
        inode: u64,
    },
    /// A kernel-provided or named anonymous region such as `[vdso]` or `[heap]`.
    Special(String),
    /// Anonymous memory (JIT code lives here; perf maps name it).
    Anonymous,
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    /// Whether the mapping is executable.
    pub executable: bool,
    /// What backs it.
    pub kind: MappingKind,
}

impl MapEntry {
    /// Whether `addr` lies in this mapping.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// The file offset of `addr` (which must lie in the mapping).
    pub fn file_offset_of(&self, addr: u64) -> u64 {
        addr.wrapping_sub(self.start).wrapping_add(self.file_offset)
    }

    /// The mapping's name for pprof: its path or special name.
    pub fn display_name(&self) -> &str {
        match &self.kind {
            MappingKind::File { path, .. } => path,
            MappingKind::Special(name) => name,
            MappingKind::Anonymous => "[anon]",
        }
    }
}

/// A line of `/proc/PID/maps` that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed maps line {line_number}: {line:?}")]
pub struct MapsParseError {
    /// 1-based line number.
    pub line_number: usize,
    /// The line (truncated to 200 bytes).
    pub line: String,
}

/// Parses `/proc/PID/maps`, keeping only executable mappings (the only
/// ones a stack frame can point into), sorted by start address.
pub fn parse_executable_maps(text: &str) -> Result<Vec<MapEntry>, MapsParseError> {
    let mut entries = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let entry = parse_line(line).ok_or_else(|| MapsParseError {
            line_number: index + 1,
            line: line.chars().take(200).collect(),
        })?;
        if entry.executable {
            entries.push(entry);
        }
    }
    entries.sort_by_key(|e| e.start);
    Ok(entries)
}

fn parse_line(line: &str) -> Option<MapEntry> {
    // "start-end perms offset dev inode<spaces>path", path optional and may hold spaces.
    let mut rest = line;
    let mut field = || -> Option<&str> {
        let trimmed = rest.trim_start();
        let end = trimmed.find(' ').unwrap_or(trimmed.len());
        let (value, tail) = trimmed.split_at(end);
        rest = tail;
        (!value.is_empty()).then_some(value)
    };
    let range = field()?;
    let perms = field()?;
    let offset = field()?;
    let device = field()?;
    let inode = field()?;
    let path = rest.trim_start();
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let file_offset = u64::from_str_radix(offset, 16).ok()?;
    let inode: u64 = inode.parse().ok()?;
    let device = parse_device(device)?;
    if end < start || perms.len() < 4 {
        return None;
    }
    let executable = perms.as_bytes().get(2) == Some(&b'x');
    let kind = if path.is_empty() {
        MappingKind::Anonymous
    } else if path.starts_with('[') || inode == 0 {
        MappingKind::Special(path.to_owned())
    } else if let Some(stripped) = path.strip_suffix(" (deleted)") {
        MappingKind::File {
            path: stripped.to_owned(),
            deleted: true,
            device,
            inode,
        }
    } else {
        MappingKind::File {
            path: path.to_owned(),
            deleted: false,
            device,
            inode,
        }
    };
    Some(MapEntry {
        start,
        end,
        file_offset,
        executable,
        kind,
    })
}

/// The `major:minor` device field of a maps line (hexadecimal, as the
/// kernel prints it with `%02x:%02x`; majors above 0xff take more digits).
fn parse_device(field: &str) -> Option<u64> {
    let (major, minor) = field.split_once(':')?;
    let major = u32::from_str_radix(major, 16).ok()?;
    let minor = u32::from_str_radix(minor, 16).ok()?;
    Some(libc::makedev(major, minor))
}

/// Index of the mapping containing `addr` in `entries` (sorted by start).
pub fn find_mapping(entries: &[MapEntry], addr: u64) -> Option<usize> {
    let candidate = entries
        .partition_point(|e| e.start <= addr)
        .checked_sub(1)?;
    entries[candidate].contains(addr).then_some(candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234   /usr/bin/hot
55d0c0a01000-55d0c0a02000 r-xp 00001000 fd:01 1234   /usr/bin/hot
7f0000000000-7f0000100000 r-xp 00028000 fd:01 99     /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000200000-7f0000201000 rwxp 00000000 00:00 0 
7f0000300000-7f0000301000 r-xp 00000000 fd:01 77     /tmp/my lib.so (deleted)
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0      [vdso]
";

    #[test]
    fn parse_keeps_executable_mappings_with_their_kind() {
        let entries = parse_executable_maps(MAPS).expect("valid maps");
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[0].display_name(), "/usr/bin/hot");
        assert_eq!(entries[0].file_offset, 0x1000);
        assert_eq!(entries[2].kind, MappingKind::Anonymous);
        assert_eq!(
            entries[3].kind,
            MappingKind::File {
                path: "/tmp/my lib.so".into(),
                deleted: true,
                device: libc::makedev(0xfd, 0x01),
                inode: 77
            }
        );
        assert_eq!(entries[4].kind, MappingKind::Special("[vdso]".into()));
    }

    #[test]
    fn the_device_is_kept_as_st_dev_encodes_it() {
        use std::os::unix::fs::MetadataExt;
        // 259:3 is an NVMe partition; 0:39 an overlay or other anonymous
        // device; a major over 0xff prints with more than two digits.
        let maps = "\
1000-2000 r-xp 00000000 103:03 11 /a
2000-3000 r-xp 00000000 00:27 12 /b
3000-4000 r-xp 00000000 1ff:100 13 /c
";
        let entries = parse_executable_maps(maps).expect("valid maps");
        let devices: Vec<u64> = entries
            .iter()
            .map(|e| match e.kind {
                MappingKind::File { device, .. } => device,
                _ => panic!("a file mapping"),
            })
            .collect();
        assert_eq!(
            devices,
            vec![
                libc::makedev(259, 3),
                libc::makedev(0, 39),
                libc::makedev(0x1ff, 0x100)
            ]
        );
        assert!(parse_executable_maps("1000-2000 r-xp 0 fd01 1 /a\n").is_err());
        assert!(parse_executable_maps("1000-2000 r-xp 0 fd:zz 1 /a\n").is_err());
        // What the kernel prints for the test binary is its fstat identity.
        let own = std::fs::read_to_string("/proc/self/maps").expect("own maps");
        let exe = std::fs::read_link("/proc/self/exe").expect("exe link");
        let metadata = std::fs::metadata(&exe).expect("stat exe");
        let entries = parse_executable_maps(&own).expect("own maps parse");
        let kind = &entries
            .iter()
            .find(|e| e.display_name() == exe.to_string_lossy())
            .expect("own executable is mapped")
            .kind;
        assert!(matches!(
            kind,
            MappingKind::File { device, inode, .. }
                if *device == metadata.dev() && *inode == metadata.ino()
        ));
    }

    #[test]
    fn addresses_normalize_to_file_offsets_of_their_mapping() {
        let entries = parse_executable_maps(MAPS).expect("valid maps");
        let libc = find_mapping(&entries, 0x7f0000000010).expect("in libc");
        assert_eq!(entries[libc].file_offset_of(0x7f0000000010), 0x28010);
        assert_eq!(
            find_mapping(&entries, 0x55d0c0a00010),
            None,
            "not executable"
        );
        assert_eq!(find_mapping(&entries, 0x10), None);
        assert_eq!(
            find_mapping(&entries, 0x7f0000100000),
            None,
            "end is exclusive"
        );
    }

    #[test]
    fn malformed_lines_are_reported_with_their_number() {
        let err = parse_executable_maps("zz-yy r-xp 0 0 0\n").expect_err("bad range");
        assert_eq!(err.line_number, 1);
        assert!(parse_executable_maps("").expect("empty is fine").is_empty());
    }

    proptest::proptest! {
        #[test]
        fn parsing_arbitrary_text_never_panics(text in "\\PC{0,300}") {
            let _ = parse_executable_maps(&text);
        }
    }
}

//! From a file offset to frames: the address in the ELF, then DWARF's
//! inlined calls with file and line, else the symbol covering it.

use std::borrow::Cow;

use crate::elf::{DebugFile, FileKind, Segment};

/// Most bytes of a function or file name given back; names longer than
/// this are cut (at a character boundary).
const MAX_NAME_BYTES: usize = 4096;

/// The page size mappings are aligned to: a segment is mapped from the
/// page holding its first byte.
const PAGE: u64 = 4096;

/// One frame of an address, innermost first when calls were inlined.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The function, demangled (C++ and Rust).
    pub function: String,
    /// The source file, empty when unknown.
    pub file: String,
    /// The source line, 0 when unknown.
    pub line: u32,
}

impl DebugFile {
    /// The frames of the instruction at `file_offset` in the file that was
    /// mapped, whose mapping started at file offset
    /// `mapping_file_offset`; innermost first, empty when the file does
    /// not know the address.
    pub fn frames(&self, file_offset: u64, mapping_file_offset: u64) -> Vec<Frame> {
        let Some(address) = self.address_of(file_offset, mapping_file_offset) else {
            return Vec::new();
        };
        let symbol = self.symbol_at(address);
        let mut frames = self.dwarf_frames(address);
        if frames.is_empty() {
            if let Some(name) = symbol {
                let (file, line) = self.dwarf_location(address);
                frames.push(Frame {
                    function: demangled(name),
                    file,
                    line,
                });
            }
        } else if let Some(outer) = frames.last_mut()
            && outer.function.is_empty()
            && let Some(name) = symbol
        {
            outer.function = demangled(name);
        }
        frames.retain(|f| !f.function.is_empty());
        frames
    }

    /// The ELF address of a file offset: through the segment holding the
    /// offset when the file records segment offsets (a binary); in a
    /// debug-only file, relative to the start of its executable segment,
    /// which is what a mapping of code starting at `mapping_file_offset`
    /// maps (from the page holding the segment's first byte).
    fn address_of(&self, file_offset: u64, mapping_file_offset: u64) -> Option<u64> {
        match self.kind {
            FileKind::Binary => self
                .segments
                .iter()
                .find(|s| {
                    s.file_size > 0
                        && s.file_offset <= file_offset
                        && file_offset - s.file_offset < s.file_size
                })
                .map(|s| file_offset - s.file_offset + s.address),
            FileKind::DebugOnly => {
                let mut executable = self.segments.iter().filter(|s| s.executable);
                let segment: &Segment = executable.next()?;
                if executable.next().is_some() {
                    // Which one was mapped is not known.
                    return None;
                }
                let into_mapping = file_offset.checked_sub(mapping_file_offset)?;
                let address = (segment.address & !(PAGE - 1)).checked_add(into_mapping)?;
                (segment.address <= address && address - segment.address < segment.memory_size)
                    .then_some(address)
            }
        }
    }

    /// The (mangled) name of the function symbol covering `address`.
    fn symbol_at(&self, address: u64) -> Option<&str> {
        let after = self.symbols.partition_point(|s| s.start <= address);
        let symbol = self.symbols.get(after.checked_sub(1)?)?;
        (address < symbol.end).then_some(&*symbol.name)
    }

    /// DWARF's frames at `address`, innermost first (several for inlined
    /// calls), at most `max_frames_per_address`.
    fn dwarf_frames(&self, address: u64) -> Vec<Frame> {
        let mut frames = Vec::new();
        let Some(dwarf) = &self.dwarf else {
            return frames;
        };
        let Ok(mut iter) = dwarf.find_frames(address).skip_all_loads() else {
            return frames;
        };
        while frames.len() < self.limits.max_frames_per_address {
            let Ok(Some(frame)) = iter.next() else { break };
            let function = frame
                .function
                .as_ref()
                .and_then(|f| f.demangle().ok())
                .map(|name| cut(name.as_ref()))
                .unwrap_or_default();
            let (file, line) = frame.location.as_ref().map_or((String::new(), 0), |l| {
                (cut(l.file.unwrap_or("")), l.line.unwrap_or(0))
            });
            frames.push(Frame {
                function,
                file,
                line,
            });
        }
        frames
    }

    /// The file and line DWARF's line table gives `address`.
    fn dwarf_location(&self, address: u64) -> (String, u32) {
        self.dwarf
            .as_ref()
            .and_then(|d| d.find_location(address).ok().flatten())
            .map_or((String::new(), 0), |l| {
                (cut(l.file.unwrap_or("")), l.line.unwrap_or(0))
            })
    }
}

fn demangled(name: &str) -> String {
    cut(&addr2line::demangle_auto(Cow::Borrowed(name), None))
}

fn cut(name: &str) -> String {
    if name.len() <= MAX_NAME_BYTES {
        return name.to_owned();
    }
    let mut end = MAX_NAME_BYTES;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}

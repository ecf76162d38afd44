//! Reading V8 heap objects of a live process: a frame's function, its
//! `SharedFunctionInfo`, names and scripts.
//!
//! Every object's map is read and its instance type checked (and the map's
//! own map must be the meta map) before a field of the object is trusted,
//! so a stale or forged pointer ends in `None`. Strings are read up to
//! [`MAX_NAME_BYTES`] and through at most [`MAX_STRING_DEPTH`] cons or thin
//! strings; a line table is read only up to [`MAX_LINE_ENDS`] entries.

use std::collections::HashMap;

use super::layout::V8Layout;
use crate::python::memory::ProcessMemory;

/// Longest function or script name kept, in bytes.
pub const MAX_NAME_BYTES: usize = 512;
/// Deepest chain of cons and thin strings followed.
const MAX_STRING_DEPTH: u32 = 8;
/// Most line ends of a script read.
const MAX_LINE_ENDS: usize = 1 << 16;
/// ScopeInfo slots looked through for the function's name and position.
const SCOPE_INFO_SLOTS: usize = 24;
/// Most bytes of a script's source read to count its lines.
const MAX_SOURCE_BYTES: usize = 4 << 20;
/// Bytes of source read per `process_vm_readv`.
const SOURCE_CHUNK_BYTES: usize = 64 << 10;
/// Map types remembered (per window).
const MAX_CACHED_MAPS: usize = 4096;

/// Where heap memory comes from: a live process, or a test's bytes.
pub trait Memory: std::fmt::Debug {
    /// Fills `buffer` from `address`; `false` when any byte is unreadable.
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool;
}

impl Memory for ProcessMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
        ProcessMemory::read(self, address, buffer).is_ok()
    }
}

/// What a JavaScript function shows in a profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionInfo {
    /// Its name; empty for anonymous functions.
    pub name: String,
    /// Its script's name (a path or URL); empty when unknown.
    pub file: String,
    /// The line it starts on (1-based); 0 when unknown.
    pub line: u32,
}

/// Characters still to look at, and the newlines seen in those looked at.
#[derive(Debug)]
struct LineCount {
    left: usize,
    newlines: u32,
}

/// Reads objects of one process with one layout, remembering map types.
#[derive(Debug)]
pub struct Heap<'a, M: Memory> {
    layout: &'a V8Layout,
    memory: &'a M,
    maps: &'a mut HashMap<u64, u16>,
    /// Bytes of source this reader may still read to count lines.
    source_budget: usize,
}

impl<'a, M: Memory> Heap<'a, M> {
    /// A reader; `maps` caches the instance type of maps already checked.
    pub fn new(layout: &'a V8Layout, memory: &'a M, maps: &'a mut HashMap<u64, u16>) -> Self {
        Heap {
            layout,
            memory,
            maps,
            source_budget: MAX_SOURCE_BYTES,
        }
    }

    /// The reader with `bytes` of script source to read at most, in all
    /// (a process's share for a window: a forged position or source then
    /// costs that much, however many functions claim it).
    pub fn with_source_budget(mut self, bytes: usize) -> Self {
        self.source_budget = bytes;
        self
    }

    /// Bytes of source still allowed.
    pub fn source_budget_left(&self) -> usize {
        self.source_budget
    }

    /// Fills `buffer` from `address`; `false` when any byte is unreadable.
    pub(super) fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
        self.memory.read(address, buffer)
    }

    /// The layout objects are read with.
    pub(super) fn layout(&self) -> &'a V8Layout {
        self.layout
    }

    /// The 8-byte word at `address`.
    pub(super) fn word(&self, address: u64) -> Option<u64> {
        let mut bytes = [0u8; 8];
        self.memory
            .read(address, &mut bytes)
            .then(|| u64::from_le_bytes(bytes))
    }

    fn u16_at(&self, address: u64) -> Option<u16> {
        let mut bytes = [0u8; 2];
        self.memory
            .read(address, &mut bytes)
            .then(|| u16::from_le_bytes(bytes))
    }

    /// The untagged address and instance type of the object `tagged`
    /// points to; `None` when it is no heap object with a valid map.
    pub fn object(&mut self, tagged: u64) -> Option<(u64, u16)> {
        let layout = self.layout;
        if !layout.is_heap_object(tagged) {
            return None;
        }
        let address = layout.untag(tagged);
        let map = self.word(address.checked_add(u64::from(layout.fields.map))?)?;
        Some((address, self.map_type(map)?))
    }

    /// The instance type that the map `map` (tagged) describes, once its
    /// own map is checked to be the meta map.
    pub(super) fn map_type(&mut self, map: u64) -> Option<u16> {
        if let Some(&known) = self.maps.get(&map) {
            return Some(known);
        }
        let layout = self.layout;
        if !layout.is_heap_object(map) {
            return None;
        }
        let address = layout.untag(map);
        // A map's map is the meta map, whose instance type is MAP_TYPE.
        let meta = self.word(address.checked_add(u64::from(layout.fields.map))?)?;
        if !layout.is_heap_object(meta) {
            return None;
        }
        let meta_type = self.u16_at(
            layout
                .untag(meta)
                .checked_add(u64::from(layout.fields.map_instance_type))?,
        )?;
        if meta_type != layout.types.map {
            return None;
        }
        let instance_type =
            self.u16_at(address.checked_add(u64::from(layout.fields.map_instance_type))?)?;
        if self.maps.len() >= MAX_CACHED_MAPS {
            self.maps.clear();
        }
        self.maps.insert(map, instance_type);
        Some(instance_type)
    }

    /// The field at `offset` of the object at `address`.
    pub(super) fn field(&self, address: u64, offset: u32) -> Option<u64> {
        self.word(address.checked_add(u64::from(offset))?)
    }

    /// The `SharedFunctionInfo` (untagged address) of the `JSFunction`
    /// `function` points to.
    pub fn shared_of_function(&mut self, function: u64) -> Option<u64> {
        let (address, kind) = self.object(function)?;
        if !self.layout.is_js_function(kind) {
            return None;
        }
        let shared = self.field(address, self.layout.fields.function_shared)?;
        let (shared, kind) = self.object(shared)?;
        (kind == self.layout.types.shared_function_info).then_some(shared)
    }

    /// Name, script and start line of the `SharedFunctionInfo` at `shared`
    /// (untagged, already checked).
    pub fn describe(&mut self, shared: u64) -> FunctionInfo {
        let fields = self.layout.fields;
        let mut info = FunctionInfo {
            name: String::new(),
            file: String::new(),
            line: 0,
        };
        let mut start = None;
        if let Some(name_or_scope) = self.field(shared, fields.shared_name_or_scope_info)
            && let Some((address, kind)) = self.object(name_or_scope)
        {
            if self.layout.is_string(kind) {
                info.name = self.string(name_or_scope).unwrap_or_default();
            } else if kind == self.layout.types.scope_info {
                (info.name, start) = self.scope_info(address);
            }
        }
        if let Some(script) = self.field(shared, fields.shared_script)
            && let Some((address, kind)) = self.object(script)
            && kind == self.layout.types.script
        {
            if let Some(name) = self.field(address, fields.script_name) {
                info.file = self.string(name).unwrap_or_default();
            }
            if let Some(start) = start {
                // V8 computes a script's line ends only when something asks
                // (a stack trace); until then the lines are counted in the
                // source, up to the function's start.
                info.line = fields
                    .script_line_ends
                    .and_then(|offset| self.field(address, offset))
                    .and_then(|ends| self.line_of(ends, start))
                    .or_else(|| {
                        let source = self.field(address, fields.script_source)?;
                        let mut counted = LineCount {
                            left: usize::try_from(start).ok()?,
                            newlines: 0,
                        };
                        self.count_lines(source, &mut counted, MAX_STRING_DEPTH)?;
                        (counted.left == 0).then_some(counted.newlines + 1)
                    })
                    .unwrap_or(0);
            }
        }
        info
    }

    /// The function name and start position a ScopeInfo holds. Its layout
    /// after the context locals has no postmortem constants and changes
    /// between releases: the name is the first string after the locals,
    /// and the position the first pair of Smis `start < end` in the fixed
    /// slots (V8 12.8 and later), else after the name.
    fn scope_info(&mut self, address: u64) -> (String, Option<u32>) {
        let layout = self.layout;
        // ScopeInfo's slots follow its map.
        let Some(data) = address.checked_add(u64::from(layout.fields.map) + 8) else {
            return (String::new(), None);
        };
        let mut bytes = [0u8; SCOPE_INFO_SLOTS * 8];
        if !self.memory.read(data, &mut bytes) {
            return (String::new(), None);
        }
        let slot = |index: usize| -> Option<u64> {
            let bytes = bytes.get(index * 8..index * 8 + 8)?;
            Some(u64::from_le_bytes(bytes.try_into().ok()?))
        };
        let locals = slot(layout.fields.scope_info_context_locals as usize)
            .and_then(|value| layout.smi(value))
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        let mut index =
            (layout.fields.scope_info_first_vars as usize).saturating_add(locals.saturating_mul(2));
        let mut name = String::new();
        while index < SCOPE_INFO_SLOTS {
            let Some(value) = slot(index) else { break };
            index += 1;
            if layout.is_heap_object(value)
                && let Some(found) = self.string(value)
            {
                name = found;
                break;
            }
        }
        // V8 12.8 moved the position into the fixed slots before the
        // variables; earlier releases keep it after the name.
        let fixed = (layout.fields.scope_info_context_locals as usize + 1)
            ..(layout.fields.scope_info_first_vars as usize);
        let mut position = fixed.clone().zip(fixed.skip(1)).find_map(|(a, b)| {
            let (a, b) = (layout.smi(slot(a)?)?, layout.smi(slot(b)?)?);
            (0 <= a && a < b).then(|| u32::try_from(a).ok()).flatten()
        });
        while position.is_none() && index + 1 < SCOPE_INFO_SLOTS {
            let (Some(a), Some(b)) = (
                slot(index).and_then(|v| layout.smi(v)),
                slot(index + 1).and_then(|v| layout.smi(v)),
            ) else {
                index += 1;
                continue;
            };
            if 0 <= a && a < b {
                position = u32::try_from(a).ok();
                break;
            }
            index += 1;
        }
        (name, position)
    }

    /// The 1-based line holding source position `position`, from a
    /// script's line ends (a FixedArray of Smis, when V8 has computed it).
    fn line_of(&mut self, ends: u64, position: u32) -> Option<u32> {
        let (address, kind) = self.object(ends)?;
        if kind != self.layout.types.fixed_array {
            return None;
        }
        let fields = self.layout.fields;
        let length = self
            .layout
            .smi(self.field(address, fields.fixed_array_length)?)?;
        let length = usize::try_from(length).ok()?.min(MAX_LINE_ENDS);
        let data = address.checked_add(u64::from(fields.fixed_array_data))?;
        // Binary search, one word per probe: lines end in increasing order.
        let (mut low, mut high) = (0usize, length);
        while low < high {
            let middle = low + (high - low) / 2;
            let end = self
                .layout
                .smi(self.word(data.checked_add(middle as u64 * 8)?)?)?;
            if end < i64::from(position) {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        u32::try_from(low + 1).ok()
    }

    /// Counts the newlines in the first `counted.left` characters of the
    /// string `tagged` (sequential, cons or thin), reading at most
    /// [`MAX_SOURCE_BYTES`] in chunks; `None` when a part is unreadable or
    /// of another kind.
    fn count_lines(&mut self, tagged: u64, counted: &mut LineCount, depth: u32) -> Option<()> {
        if counted.left == 0 {
            return Some(());
        }
        let (address, kind) = self.object(tagged)?;
        let layout = self.layout;
        if !layout.is_string(kind) || depth == 0 {
            return None;
        }
        let strings = layout.strings;
        let representation = kind & strings.representation_mask;
        if representation == strings.cons {
            let first = self.field(address, strings.cons_first)?;
            let second = self.field(address, strings.cons_second)?;
            self.count_lines(first, counted, depth - 1)?;
            return self.count_lines(second, counted, depth - 1);
        }
        if representation == strings.thin {
            let actual = self.field(address, strings.thin_actual)?;
            return self.count_lines(actual, counted, depth - 1);
        }
        if representation != strings.sequential {
            return None;
        }
        let mut length = [0u8; 4];
        if !self
            .memory
            .read(address.checked_add(u64::from(strings.length))?, &mut length)
        {
            return None;
        }
        let length = usize::try_from(i32::from_le_bytes(length)).ok()?;
        let take = length.min(counted.left);
        let one_byte = kind & strings.encoding_mask == strings.one_byte;
        let (start, width) = if one_byte {
            (strings.one_byte_chars, 1)
        } else {
            (strings.two_byte_chars, 2)
        };
        if take.saturating_mul(width) > self.source_budget.min(MAX_SOURCE_BYTES) {
            return None;
        }
        self.source_budget -= take * width;
        let start = address.checked_add(u64::from(start))?;
        let mut chunk = vec![0u8; SOURCE_CHUNK_BYTES];
        let mut done = 0usize;
        while done < take * width {
            let size = (take * width - done).min(SOURCE_CHUNK_BYTES);
            let bytes = &mut chunk[..size];
            if !self.memory.read(start.checked_add(done as u64)?, bytes) {
                return None;
            }
            let newlines = if one_byte {
                bytes.iter().filter(|&&b| b == b'\n').count()
            } else {
                bytes
                    .chunks_exact(2)
                    .filter(|unit| unit[0] == b'\n' && unit[1] == 0)
                    .count()
            };
            counted.newlines = counted
                .newlines
                .saturating_add(u32::try_from(newlines).unwrap_or(u32::MAX));
            done += size;
        }
        counted.left -= take;
        Some(())
    }

    /// The string `tagged` points to, up to [`MAX_NAME_BYTES`] bytes (a
    /// longer one is cut); `None` for anything that is not a string.
    pub fn string(&mut self, tagged: u64) -> Option<String> {
        let mut out = Vec::new();
        self.append_string(tagged, &mut out, MAX_STRING_DEPTH)?;
        Some(String::from_utf8_lossy(&out).into_owned())
    }

    fn append_string(&mut self, tagged: u64, out: &mut Vec<u8>, depth: u32) -> Option<()> {
        let (address, kind) = self.object(tagged)?;
        let layout = self.layout;
        if !layout.is_string(kind) || depth == 0 {
            return None;
        }
        let strings = layout.strings;
        let representation = kind & strings.representation_mask;
        if representation == strings.cons {
            let first = self.field(address, strings.cons_first)?;
            let second = self.field(address, strings.cons_second)?;
            self.append_string(first, out, depth - 1)?;
            if out.len() < MAX_NAME_BYTES {
                self.append_string(second, out, depth - 1)?;
            }
            return Some(());
        }
        if representation == strings.thin {
            let actual = self.field(address, strings.thin_actual)?;
            return self.append_string(actual, out, depth - 1);
        }
        if representation != strings.sequential {
            // External and sliced strings: not read.
            return None;
        }
        let mut length = [0u8; 4];
        if !self
            .memory
            .read(address.checked_add(u64::from(strings.length))?, &mut length)
        {
            return None;
        }
        let length = usize::try_from(i32::from_le_bytes(length)).ok()?;
        let room = MAX_NAME_BYTES.saturating_sub(out.len());
        let one_byte = kind & strings.encoding_mask == strings.one_byte;
        let take = length.min(room);
        if one_byte {
            let mut chars = vec![0u8; take];
            let start = address.checked_add(u64::from(strings.one_byte_chars))?;
            if !self.memory.read(start, &mut chars) {
                return None;
            }
            // Latin-1: each byte is the code point.
            out.extend(chars.iter().flat_map(|&b| {
                let mut buffer = [0u8; 2];
                char::from(b).encode_utf8(&mut buffer).as_bytes().to_vec()
            }));
        } else {
            let mut units = vec![0u8; take.saturating_mul(2)];
            let start = address.checked_add(u64::from(strings.two_byte_chars))?;
            if !self.memory.read(start, &mut units) {
                return None;
            }
            let units: Vec<u16> = units
                .chunks_exact(2)
                .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
                .collect();
            out.extend(String::from_utf16_lossy(&units).bytes());
        }
        out.truncate(MAX_NAME_BYTES);
        Some(())
    }
}

#[cfg(test)]
mod tests;

//! The code cache: its heaps, and the code blob that holds a pc, found the
//! way HotSpot finds it (`CodeHeap::find_start`): each heap has a segment
//! map with one byte per segment, 0 where a block starts, `n` to step back
//! `n` segments towards it, 0xFF for an unused segment.

use super::layout::{CodeBounds, IntegerField, JvmLayout};
use super::vmstructs::{RemoteMemory, VmStructsError, read_c_string, read_u32, read_u64};

/// A signed integer field of `width` bytes at `address + offset`.
pub fn read_signed(
    memory: &dyn RemoteMemory,
    address: u64,
    (offset, width): IntegerField,
) -> Option<i64> {
    let mut bytes = [0u8; 8];
    let width = usize::from(width).min(8);
    memory
        .read(address.checked_add(offset)?, &mut bytes[..width])
        .ok()?;
    // Sign-extend from the field's width.
    let shift = 64 - 8 * width as u32;
    Some((i64::from_le_bytes(bytes) << shift) >> shift)
}

/// Heaps per code cache at most (HotSpot has 1 or 3).
const MAX_HEAPS: u32 = 16;
/// Steps back through a segment map at most: a blob of 1,024 × 254
/// segments (16 MiB at 64-byte segments) is larger than any method.
const MAX_SEGMENT_HOPS: usize = 1024;
/// Bytes of a segment map read at once: four of the longest steps.
const SEGMENT_MAP_READ: u64 = 1024;
/// Longest blob name read.
const MAX_BLOB_NAME: usize = 64;
/// A segment map byte for a segment that belongs to no block.
const FREE_SEGMENT: u8 = 0xFF;

/// One code heap's memory and segment map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeHeap {
    /// Its committed memory: `[low, high)`.
    pub low: u64,
    pub high: u64,
    /// Its segment map's first byte.
    pub segment_map: u64,
    /// log2 of its segment size.
    pub log2_segment_size: u32,
}

/// What a code blob holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobKind {
    /// A compiled Java method (C1, C2 or a native wrapper): its `Method*`.
    Nmethod { method: u64 },
    /// The template interpreter.
    Interpreter,
    /// Anything else (stubs, adapters), by HotSpot's name for it.
    Stub { name: String },
}

/// A code blob, as much as the unwinder needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeBlob {
    /// The blob's own address.
    pub address: u64,
    pub kind: BlobKind,
    /// Its first instruction, and where its code ends.
    pub code_begin: u64,
    pub code_end: u64,
    /// Where its frame is set up, past the prologue; `None` when unknown.
    pub frame_complete: Option<u64>,
    /// Its frame's size in bytes, return address included (0: none).
    pub frame_bytes: u64,
}

/// Reads the code cache's heaps.
pub fn read_heaps(
    memory: &dyn RemoteMemory,
    layout: &JvmLayout,
) -> Result<Vec<CodeHeap>, VmStructsError> {
    let array = read_u64(memory, layout.code_heaps)?;
    if array == 0 {
        return Err(VmStructsError::NotInitialized {
            table: "code heaps",
        });
    }
    let len = read_u32(memory, array.wrapping_add(layout.array_len))?;
    if len == 0 || len > MAX_HEAPS {
        return Err(VmStructsError::BadLayout {
            table: "code heaps",
            what: format!("{len} heaps"),
        });
    }
    let data = read_u64(memory, array.wrapping_add(layout.array_data))?;
    let mut heaps = Vec::with_capacity(len as usize);
    for i in 0..u64::from(len) {
        let heap = read_u64(memory, data.wrapping_add(i * 8))?;
        let low = read_u64(
            memory,
            heap.wrapping_add(layout.heap_memory.wrapping_add(layout.space_low)),
        )?;
        let high = read_u64(
            memory,
            heap.wrapping_add(layout.heap_memory.wrapping_add(layout.space_high)),
        )?;
        let segment_map = read_u64(
            memory,
            heap.wrapping_add(layout.heap_segmap.wrapping_add(layout.space_low)),
        )?;
        let log2 = read_u32(memory, heap.wrapping_add(layout.heap_log2_segment_size))?;
        if low >= high || !(4..=16).contains(&log2) || segment_map == 0 {
            return Err(VmStructsError::BadLayout {
                table: "code heaps",
                what: format!("heap {low:#x}..{high:#x} with 2^{log2}-byte segments"),
            });
        }
        heaps.push(CodeHeap {
            low,
            high,
            segment_map,
            log2_segment_size: log2,
        });
    }
    Ok(heaps)
}

/// The start of the block that holds `pc` in `heap` (HotSpot's
/// `find_start`); `None` for a free or unused segment, or an unreadable or
/// inconsistent map. The map is read [`SEGMENT_MAP_READ`] bytes at a time
/// back from the segment looked at, so a walk (or a forged map that steps
/// back one segment at a time) costs a few reads, not one per step.
pub fn block_start(memory: &dyn RemoteMemory, heap: &CodeHeap, pc: u64) -> Option<u64> {
    if pc < heap.low || pc >= heap.high {
        return None;
    }
    let mut segment = (pc - heap.low) >> heap.log2_segment_size;
    // The bytes read, for segments `first..first + read.len()`.
    let mut first = 0u64;
    let mut read: Vec<u8> = Vec::new();
    for _ in 0..MAX_SEGMENT_HOPS {
        if segment < first || segment - first >= read.len() as u64 {
            first = segment.saturating_sub(SEGMENT_MAP_READ - 1);
            read = vec![0; usize::try_from(segment - first + 1).ok()?];
            if memory
                .read(heap.segment_map.wrapping_add(first), &mut read)
                .is_err()
            {
                // The bytes before may be unreadable: this one alone.
                first = segment;
                read = vec![0; 1];
                memory
                    .read(heap.segment_map.wrapping_add(segment), &mut read)
                    .ok()?;
            }
        }
        match read[usize::try_from(segment - first).ok()?] {
            0 => return Some(heap.low.wrapping_add(segment << heap.log2_segment_size)),
            FREE_SEGMENT => return None,
            step => segment = segment.checked_sub(u64::from(step))?,
        }
    }
    None
}

/// The code blob that holds `pc`, checked: its code covers `pc`.
pub fn find_blob(
    memory: &dyn RemoteMemory,
    layout: &JvmLayout,
    heaps: &[CodeHeap],
    pc: u64,
) -> Option<CodeBlob> {
    let heap = heaps.iter().find(|h| h.low <= pc && pc < h.high)?;
    let block = block_start(memory, heap, pc)?;
    let mut used = [0u8; 1];
    memory
        .read(block.wrapping_add(layout.block_used), &mut used)
        .ok()?;
    if used[0] == 0 {
        return None;
    }
    let address = block.wrapping_add(layout.heap_block_size);
    let size = u64::from(read_u32(memory, address.wrapping_add(layout.blob_size)).ok()?);
    let (code_begin, code_end) = match layout.blob_code {
        CodeBounds::Pointers { begin, end } => (
            read_u64(memory, address.wrapping_add(begin)).ok()?,
            read_u64(memory, address.wrapping_add(end)).ok()?,
        ),
        CodeBounds::Offsets { code, data } => (
            address.wrapping_add(u64::from(
                read_u32(memory, address.wrapping_add(code)).ok()?,
            )),
            address.wrapping_add(u64::from(
                read_u32(memory, address.wrapping_add(data)).ok()?,
            )),
        ),
    };
    if !(address <= code_begin
        && code_begin <= pc
        && pc < code_end
        && address.checked_add(size).is_some_and(|end| pc < end))
    {
        return None;
    }
    let frame_complete = read_signed(memory, address, layout.blob_frame_complete_offset)?;
    let frame_words = read_signed(memory, address, layout.blob_frame_size)?;
    let name_pointer = read_u64(memory, address.wrapping_add(layout.blob_name)).ok()?;
    let name = read_c_string(memory, name_pointer, MAX_BLOB_NAME)?;
    let kind = match name.as_str() {
        "nmethod" => BlobKind::Nmethod {
            method: read_u64(memory, address.wrapping_add(layout.nmethod_method)).ok()?,
        },
        "Interpreter" => BlobKind::Interpreter,
        _ => BlobKind::Stub { name },
    };
    Some(CodeBlob {
        address,
        kind,
        code_begin,
        code_end,
        frame_complete: u64::try_from(frame_complete)
            .ok()
            .map(|offset| code_begin.wrapping_add(offset)),
        // A frame of over 1 MiB is no frame HotSpot makes.
        frame_bytes: u64::try_from(frame_words)
            .ok()
            .filter(|&words| words < 1 << 17)
            .map_or(0, |words| words * 8),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hotspot::test_memory::FakeMemory;

    fn heap() -> CodeHeap {
        CodeHeap {
            low: 0x10_000,
            high: 0x20_000,
            segment_map: 0x1000,
            log2_segment_size: 6,
        }
    }

    #[test]
    fn the_segment_map_leads_back_to_the_block_start() {
        let mut memory = FakeMemory::default();
        let mut map = vec![FREE_SEGMENT; 0x400];
        // A block of 300 segments at segment 2, in HotSpot's chained steps.
        for (i, byte) in map[2..302].iter_mut().enumerate() {
            *byte = if i == 0 { 0 } else { (i % 254).max(1) as u8 };
        }
        memory.map(0x1000, map);
        let heap = heap();
        let start = 0x10_000 + 2 * 64;
        assert_eq!(block_start(&memory, &heap, start), Some(start));
        assert_eq!(
            block_start(&memory, &heap, start + 299 * 64 + 5),
            Some(start)
        );
        assert_eq!(block_start(&memory, &heap, 0x10_000), None, "free");
        assert_eq!(block_start(&memory, &heap, 0x30_000), None, "outside");
    }

    /// JDK 17's offsets, as its tables give them.
    fn jdk17_layout() -> JvmLayout {
        JvmLayout {
            code_heaps: 0,
            code_low_bound: 0,
            code_high_bound: 0,
            array_len: 0,
            array_data: 8,
            heap_memory: 8,
            heap_segmap: 120,
            heap_log2_segment_size: 256,
            space_low: 16,
            space_high: 24,
            heap_block_size: 16,
            block_used: 8,
            blob_name: 96,
            blob_size: 12,
            blob_frame_complete_offset: (20, 4),
            blob_frame_size: (28, 4),
            blob_code: CodeBounds::Pointers { begin: 32, end: 40 },
            nmethod_method: 112,
            method_const_method: 8,
            const_method_constants: 8,
            const_method_flags: Some((28, 2)),
            const_method_code_size: 32,
            const_method_name_index: 34,
            const_method_signature_index: 36,
            const_method_size: 48,
            pool_holder: 24,
            pool_length: 60,
            pool_source_file_index: Some(54),
            pool_size: 72,
            klass_name: 24,
            symbol_length: 4,
            symbol_body: 6,
            interpreter_method_slot: -3,
            interpreter_sender_sp_slot: -1,
            has_line_number_table: Some(1),
            inline: None,
        }
    }

    /// A heap at 0x10_000 with one used block of 4 segments at segment 2,
    /// holding an nmethod named at 0x9000.
    fn heap_with_nmethod() -> (FakeMemory, CodeHeap, u64) {
        let mut memory = FakeMemory::default();
        let mut map = vec![FREE_SEGMENT; 0x400];
        map[2..6].copy_from_slice(&[0, 1, 2, 3]);
        memory.map(0x1000, map);
        memory.map(0x10_000, vec![0; 0x1000]);
        memory.map(0x9000, vec![0; 0x1000]);
        memory.write(0x9000, b"nmethod\0");
        let block = 0x10_000 + 2 * 64;
        memory.write(block + 8, &[1]);
        let blob = block + 16;
        memory.write(blob + 12, &200u32.to_le_bytes());
        memory.write(blob + 20, &16i32.to_le_bytes());
        memory.write(blob + 28, &6i32.to_le_bytes());
        memory.write_u64(blob + 32, blob + 0x40);
        memory.write_u64(blob + 40, blob + 0xc0);
        memory.write_u64(blob + 96, 0x9000);
        memory.write_u64(blob + 112, 0xABC0);
        (memory, heap(), blob)
    }

    #[test]
    fn a_pc_is_found_in_its_nmethod_with_its_frame() {
        let (memory, heap, blob) = heap_with_nmethod();
        let found = find_blob(&memory, &jdk17_layout(), &[heap], blob + 0x80).expect("found");
        assert_eq!(found.address, blob);
        assert_eq!(found.kind, BlobKind::Nmethod { method: 0xABC0 });
        assert_eq!(found.frame_bytes, 48);
        assert_eq!(found.frame_complete, Some(blob + 0x50));
        // Before the code and past it: the blob does not hold the pc.
        assert_eq!(
            find_blob(&memory, &jdk17_layout(), &[heap], blob + 0x20),
            None
        );
        assert_eq!(
            find_blob(&memory, &jdk17_layout(), &[heap], blob + 0xd0),
            None
        );
    }

    #[test]
    fn a_free_block_or_a_forged_blob_holds_no_code() {
        let (mut memory, heap, blob) = heap_with_nmethod();
        // Code bounds pointing outside the blob.
        memory.write_u64(blob + 32, 0x10);
        assert_eq!(
            find_blob(&memory, &jdk17_layout(), &[heap], blob + 0x80),
            None
        );
        // A freed block.
        let (mut memory, heap, blob) = heap_with_nmethod();
        memory.write(blob - 16 + 8, &[0]);
        assert_eq!(
            find_blob(&memory, &jdk17_layout(), &[heap], blob + 0x80),
            None
        );
        // An absurd frame size is no frame.
        let (mut memory, heap, blob) = heap_with_nmethod();
        memory.write(blob + 28, &i32::MAX.to_le_bytes());
        let found = find_blob(&memory, &jdk17_layout(), &[heap], blob + 0x80).expect("found");
        assert_eq!(found.frame_bytes, 0);
    }

    #[test]
    fn a_forged_map_costs_bounded_steps() {
        let mut memory = FakeMemory::default();
        // Every byte says "one back": the walk reaches segment 0's byte,
        // which steps before the heap.
        memory.map(0x1000, vec![1; 0x400]);
        assert_eq!(block_start(&memory, &heap(), 0x10_000 + 0x3ff * 64), None);
        // An unreadable map.
        assert_eq!(block_start(&FakeMemory::default(), &heap(), 0x10_100), None);
    }
}

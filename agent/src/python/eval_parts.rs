//! The eval loop's out-of-line parts. Pure: bytes in.
//!
//! A compiler that splits a function into hot and cold parts (GCC's
//! `-freorder-blocks-and-partition`, guided by profiles) moves the cold one
//! to a `.text.unlikely` part of its own, `_PyEval_EvalFrameDefault.cold`.
//! Debian forky's CPython 3.13 to 3.15 are built so that most of the eval
//! loop lands there: the exported symbol covers a 1 to 2 KiB entry, and the
//! native frame that runs Python code is in a 77 KiB cold part which, the
//! binary being stripped, no symbol names. The parts are found the way the
//! code reaches them: the entry's direct jumps (`jmp rel32`, `jcc rel32`)
//! into another function's extent, as the `.eh_frame_hdr` search table
//! lists the extents (each part has its own unwind entry).
//!
//! The jumps are found by scanning bytes, not by decoding instructions, so
//! a few are bytes of other instructions. A part therefore counts only when
//! at least two different jumps land inside it, not only at its start: a
//! tail call jumps to the start of another function, and stray bytes seldom
//! agree twice. A wrong part would only place Python frames at the wrong
//! native frame; it reads nothing.

use std::ops::Range;

/// Most out-of-line parts kept per eval loop.
const MAX_PARTS: usize = 4;

/// The function starts of an `.eh_frame_hdr` section at `vaddr`, sorted,
/// if its search table has the encoding every toolchain here emits
/// (`DW_EH_PE_datarel | DW_EH_PE_sdata4`); `None` otherwise.
pub fn function_starts(hdr: &[u8], vaddr: u64) -> Option<Vec<u64>> {
    const VERSION: u8 = 1;
    const PCREL_SDATA4: u8 = 0x1b;
    const UDATA4: u8 = 0x03;
    const DATAREL_SDATA4: u8 = 0x3b;
    let header = hdr.get(..4)?;
    if header != [VERSION, PCREL_SDATA4, UDATA4, DATAREL_SDATA4] {
        return None;
    }
    let count = u32::from_le_bytes(hdr.get(8..12)?.try_into().ok()?) as usize;
    let table = hdr.get(12..12usize.checked_add(count.checked_mul(8)?)?)?;
    let mut starts: Vec<u64> = table
        .chunks_exact(8)
        .map(|pair| {
            let relative = i32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]);
            vaddr.wrapping_add_signed(i64::from(relative))
        })
        .collect();
    // The table is sorted by the format's rules; a forged file need not be.
    starts.sort_unstable();
    Some(starts)
}

/// The extents of the parts of a function, whose code is `code` at
/// `start`, that it jumps into (see the module's docs); `starts` are the
/// sorted function starts of [`function_starts`].
pub fn out_of_line_parts(code: &[u8], start: u64, starts: &[u64]) -> Vec<Range<u64>> {
    let end = start.saturating_add(code.len() as u64);
    // (part, distinct targets inside it, not at its start)
    let mut parts: Vec<(Range<u64>, Vec<u64>)> = Vec::new();
    for (at, window) in code.windows(6).enumerate() {
        let (length, relative) = match window {
            [0xe9, a, b, c, d, _] => (5u64, [*a, *b, *c, *d]),
            [0x0f, 0x80..=0x8f, a, b, c, d] => (6u64, [*a, *b, *c, *d]),
            _ => continue,
        };
        let target = start
            .wrapping_add(at as u64 + length)
            .wrapping_add_signed(i64::from(i32::from_le_bytes(relative)));
        if (start..end).contains(&target) {
            continue;
        }
        let index = starts.partition_point(|&s| s <= target);
        let (Some(&part_start), Some(&part_end)) = (
            index.checked_sub(1).and_then(|i| starts.get(i)),
            starts.get(index),
        ) else {
            continue;
        };
        if target == part_start || part_start == start {
            continue;
        }
        match parts
            .iter_mut()
            .find(|(range, _)| range.start == part_start)
        {
            Some((_, targets)) if !targets.contains(&target) => targets.push(target),
            Some(_) => {}
            None => parts.push((part_start..part_end, vec![target])),
        }
    }
    parts.retain(|(_, targets)| targets.len() >= 2);
    parts.sort_by_key(|(_, targets)| std::cmp::Reverse(targets.len()));
    parts
        .into_iter()
        .take(MAX_PARTS)
        .map(|(range, _)| range)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jmp(from: u64, to: u64) -> [u8; 5] {
        let relative = (to as i64 - (from as i64 + 5)) as i32;
        let mut bytes = [0xe9, 0, 0, 0, 0];
        bytes[1..].copy_from_slice(&relative.to_le_bytes());
        bytes
    }

    fn jne(from: u64, to: u64) -> [u8; 6] {
        let relative = (to as i64 - (from as i64 + 6)) as i32;
        let mut bytes = [0x0f, 0x85, 0, 0, 0, 0];
        bytes[2..].copy_from_slice(&relative.to_le_bytes());
        bytes
    }

    #[test]
    fn the_search_table_gives_sorted_function_starts() {
        let vaddr = 0x10_000u64;
        let mut hdr = vec![1, 0x1b, 0x03, 0x3b, 0, 0, 0, 0];
        hdr.extend_from_slice(&2u32.to_le_bytes());
        for (start, fde) in [(0x100i32, 0x40i32), (-0x200, 0x80)] {
            hdr.extend_from_slice(&start.to_le_bytes());
            hdr.extend_from_slice(&fde.to_le_bytes());
        }
        assert_eq!(function_starts(&hdr, vaddr), Some(vec![0xfe00, 0x10_100]));
        hdr[3] = 0x1b;
        assert_eq!(function_starts(&hdr, vaddr), None, "another encoding");
        let mut short = vec![1, 0x1b, 0x03, 0x3b, 0, 0, 0, 0];
        short.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(function_starts(&short, vaddr), None, "a forged count");
    }

    #[test]
    fn jumps_into_a_cold_part_find_it_and_tail_calls_do_not() {
        // The function at 0x5000; a cold part at 0x1000..0x3000; another
        // function at 0x3000..0x4000 that it tail-calls.
        let start = 0x5000u64;
        let starts = [0x1000, 0x3000, 0x5000, 0x6000];
        let mut code = vec![0x90u8; 64];
        code[0..6].copy_from_slice(&jne(start, 0x1234));
        code[10..15].copy_from_slice(&jmp(start + 10, 0x2000));
        code[20..25].copy_from_slice(&jmp(start + 20, 0x3000));
        code[30..35].copy_from_slice(&jmp(start + 30, 0x3000));
        code[40..45].copy_from_slice(&jmp(start + 40, start + 50));
        assert_eq!(
            out_of_line_parts(&code, start, &starts),
            vec![0x1000..0x3000]
        );
        // One jump is not enough: it may be bytes of another instruction.
        code[10..15].copy_from_slice(&[0x90; 5]);
        assert!(out_of_line_parts(&code, start, &starts).is_empty());
    }

    #[test]
    fn any_bytes_give_bounded_parts_without_panicking() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let code: Vec<u8> = (0..4096)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let starts: Vec<u64> = (0..64).map(|i| i * 0x100_0000).collect();
        assert!(out_of_line_parts(&code, 0x7fff_ffff_0000, &starts).len() <= MAX_PARTS);
        assert!(out_of_line_parts(&code, u64::MAX - 10, &[]).is_empty());
        assert!(out_of_line_parts(&[], 0, &starts).is_empty());
    }
}

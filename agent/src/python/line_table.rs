//! Source lines from a code object's line table, for the three formats of
//! CPython 3.9 and later (each documented in that version's
//! `Objects/lnotab_notes.txt` or `Objects/locations.md`; 3.11's location
//! table is still the format of 3.15). Pure: bytes in.

/// Which line-table format a version uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineTableFormat {
    /// 3.9 `co_lnotab`: (bytecode byte delta, signed line delta) pairs.
    Lnotab,
    /// 3.10 `co_linetable`: (bytecode byte length, signed line delta or -128
    /// for "no line") pairs.
    Pairs310,
    /// 3.11+ `co_linetable`: location entries over code units.
    Locations,
}

impl LineTableFormat {
    /// The format of CPython 3.`minor`.
    pub fn for_minor(minor: u8) -> LineTableFormat {
        match minor {
            0..=9 => LineTableFormat::Lnotab,
            10 => LineTableFormat::Pairs310,
            _ => LineTableFormat::Locations,
        }
    }
}

/// The source line of the instruction at `code_unit` (two-byte units from
/// the start of the bytecode), or `None` when the table has no line for it.
pub fn line_of(
    format: LineTableFormat,
    first_line: i32,
    table: &[u8],
    code_unit: u32,
) -> Option<u32> {
    let line = match format {
        LineTableFormat::Lnotab => lnotab_line(first_line, table, code_unit.saturating_mul(2)),
        LineTableFormat::Pairs310 => pairs_line(first_line, table, code_unit.saturating_mul(2))?,
        LineTableFormat::Locations => locations_line(first_line, table, code_unit)?,
    };
    u32::try_from(line).ok().filter(|&l| l > 0)
}

fn lnotab_line(first_line: i32, table: &[u8], byte_offset: u32) -> i64 {
    let mut line = i64::from(first_line);
    let mut address: u32 = 0;
    for pair in table.chunks_exact(2) {
        address = address.saturating_add(u32::from(pair[0]));
        if address > byte_offset {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    line
}

fn pairs_line(first_line: i32, table: &[u8], byte_offset: u32) -> Option<i64> {
    let mut line = i64::from(first_line);
    let mut end: u32 = 0;
    for pair in table.chunks_exact(2) {
        let start = end;
        end = end.saturating_add(u32::from(pair[0]));
        let delta = pair[1] as i8;
        let range_line = if delta == -128 {
            None
        } else {
            line += i64::from(delta);
            Some(line)
        };
        if (start..end).contains(&byte_offset) {
            return range_line;
        }
    }
    None
}

/// Reads a 3.11 location-table varint: 6 bits per byte, bit 6 continues.
fn varint(bytes: &mut impl Iterator<Item = u8>) -> Option<u32> {
    let mut value: u32 = 0;
    let mut shift = 0u32;
    loop {
        let byte = bytes.next()?;
        value |= u32::from(byte & 63).checked_shl(shift)?;
        if byte & 64 == 0 {
            return Some(value);
        }
        shift += 6;
        if shift > 30 {
            return None;
        }
    }
}

fn signed_varint(bytes: &mut impl Iterator<Item = u8>) -> Option<i64> {
    let raw = varint(bytes)?;
    let magnitude = i64::from(raw >> 1);
    Some(if raw & 1 == 1 { -magnitude } else { magnitude })
}

fn locations_line(first_line: i32, table: &[u8], code_unit: u32) -> Option<i64> {
    let mut line = i64::from(first_line);
    let mut address: u32 = 0;
    let mut bytes = table.iter().copied().peekable();
    while let Some(first) = bytes.next() {
        // Every entry starts with a byte whose top bit is set.
        if first & 0x80 == 0 {
            return None;
        }
        let code = (first >> 3) & 15;
        let length = u32::from(first & 7) + 1;
        let entry_line = match code {
            15 => None,
            14 => {
                line += signed_varint(&mut bytes)?;
                varint(&mut bytes)?; // end line delta
                varint(&mut bytes)?; // column + 1
                varint(&mut bytes)?; // end column + 1
                Some(line)
            }
            13 => {
                line += signed_varint(&mut bytes)?;
                Some(line)
            }
            10..=12 => {
                line += i64::from(code - 10);
                bytes.next()?;
                bytes.next()?;
                Some(line)
            }
            _ => {
                bytes.next()?;
                Some(line)
            }
        };
        let end = address.saturating_add(length);
        if (address..end).contains(&code_unit) {
            return entry_line;
        }
        address = end;
        // Skip anything not starting an entry (never in valid tables).
        while bytes.peek().is_some_and(|b| b & 0x80 == 0) {
            bytes.next();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lnotab_adds_line_deltas_up_to_the_offset() {
        // Lines 10 (bytes 0-5), 12 (6-9), 11 (10-).
        let table = [6, 2, 4, 0xff];
        let at = |unit| line_of(LineTableFormat::Lnotab, 10, &table, unit);
        assert_eq!(at(0), Some(10));
        assert_eq!(at(2), Some(10));
        assert_eq!(at(3), Some(12));
        assert_eq!(at(5), Some(11));
        assert_eq!(at(100), Some(11));
    }

    #[test]
    fn pairs_310_know_ranges_without_a_line() {
        // 4 bytes at +1, 4 bytes without line, 2 bytes at +2.
        let table = [4, 1, 4, 0x80, 2, 2];
        let at = |unit| line_of(LineTableFormat::Pairs310, 5, &table, unit);
        assert_eq!(at(0), Some(6));
        assert_eq!(at(1), Some(6));
        assert_eq!(at(2), None);
        assert_eq!(at(4), Some(8));
        assert_eq!(at(5), None, "past the table");
    }

    #[test]
    fn locations_decode_every_entry_form() {
        let table = [
            0x80 | (13 << 3), // no columns, 1 unit, line delta +2 (svarint 4)
            4,
            0x80 | (11 << 3) | 1, // one-line form +1, 2 units
            0,
            5,
            0x80 | (3 << 3), // short form, same line, 1 unit
            0x11,
            0x80 | (15 << 3), // no location, 1 unit
            0x80 | (14 << 3), // long form, line delta -1 (svarint 3)
            3,
            0,
            1,
            1,
        ];
        let at = |unit| line_of(LineTableFormat::Locations, 20, &table, unit);
        assert_eq!(at(0), Some(22));
        assert_eq!(at(1), Some(23));
        assert_eq!(at(2), Some(23));
        assert_eq!(at(3), Some(23));
        assert_eq!(at(4), None);
        assert_eq!(at(5), Some(22));
        assert_eq!(at(6), None, "past the table");
    }

    #[test]
    fn malformed_tables_give_no_line_rather_than_panicking() {
        for format in [
            LineTableFormat::Lnotab,
            LineTableFormat::Pairs310,
            LineTableFormat::Locations,
        ] {
            for table in [
                &[][..],
                &[0x7f],
                &[0xf0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            ] {
                for unit in [0, 1, 1000, u32::MAX] {
                    let _ = line_of(format, 1, table, unit);
                }
            }
        }
        assert_eq!(line_of(LineTableFormat::Lnotab, -5, &[], 0), None);
    }
}

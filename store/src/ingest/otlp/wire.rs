//! A minimal protobuf wire walker, used only to count dictionary entries
//! before decoding: prost would allocate every entry first.

use super::OtlpError;

/// Dictionary tables by field number (the same numbers in every revision);
/// 6 and 7 are `attribute_table` and `stack_table` (1.7: `attribute_units`).
const TABLES: [(u32, &str); 7] = [
    (1, "mapping_table"),
    (2, "location_table"),
    (3, "function_table"),
    (4, "link_table"),
    (5, "string_table"),
    (6, "attribute_table"),
    (7, "stack_table"),
];

/// One field of a message: its number and, for length-delimited fields, the
/// payload.
struct Field<'a> {
    number: u32,
    payload: Option<&'a [u8]>,
}

fn varint(bytes: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// Walks the top-level fields of `bytes`; `None` on malformed input (left
/// for prost to report with its own message).
fn fields(bytes: &[u8]) -> Option<Vec<Field<'_>>> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < bytes.len() {
        let key = varint(bytes, &mut pos)?;
        let number = u32::try_from(key >> 3).ok()?;
        let payload = match key & 7 {
            0 => {
                varint(bytes, &mut pos)?;
                None
            }
            1 => {
                pos = pos.checked_add(8)?;
                None
            }
            5 => {
                pos = pos.checked_add(4)?;
                None
            }
            2 => {
                let len = usize::try_from(varint(bytes, &mut pos)?).ok()?;
                let end = pos.checked_add(len)?;
                let payload = bytes.get(pos..end)?;
                pos = end;
                Some(payload)
            }
            _ => return None,
        };
        if pos > bytes.len() {
            return None;
        }
        out.push(Field { number, payload });
    }
    Some(out)
}

/// Refuses an export request whose dictionary (field 2) has a table with
/// more than `limit` entries. Malformed bytes pass: decoding reports them.
pub(super) fn check_dictionary_sizes(request: &[u8], limit: usize) -> Result<(), OtlpError> {
    let Some(top) = fields(request) else {
        return Ok(());
    };
    let mut counts = [0usize; TABLES.len()];
    for dictionary in top.iter().filter(|f| f.number == 2) {
        let Some(entries) = dictionary.payload.and_then(fields) else {
            continue;
        };
        for entry in entries {
            if let Some(slot) = TABLES.iter().position(|(n, _)| *n == entry.number) {
                counts[slot] += 1;
            }
        }
    }
    for ((_, table), count) in TABLES.iter().zip(counts) {
        if count > limit {
            return Err(OtlpError::TableTooLarge {
                table,
                count,
                limit,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_string_table_entries_in_the_dictionary() {
        // dictionary { string_table: "", "a", "b" }
        let dictionary = [0x2a, 0x00, 0x2a, 0x01, b'a', 0x2a, 0x01, b'b'];
        let mut request = vec![0x12, dictionary.len() as u8];
        request.extend_from_slice(&dictionary);
        assert!(check_dictionary_sizes(&request, 3).is_ok());
        let err = check_dictionary_sizes(&request, 2).unwrap_err();
        assert_eq!(
            err,
            OtlpError::TableTooLarge {
                table: "string_table",
                count: 3,
                limit: 2
            }
        );
    }

    #[test]
    fn malformed_bytes_are_left_to_the_decoder() {
        assert!(check_dictionary_sizes(&[0x12, 0x7f], 1).is_ok());
        assert!(check_dictionary_sizes(&[0xff], 1).is_ok());
    }
}

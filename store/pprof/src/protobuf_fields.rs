//! Reading a protobuf message's fields straight off the wire, without
//! decoding them: each field's number and where its value lies. The
//! pre-scans that count what a message would allocate before prost decodes
//! it walk messages with this: pprof's here, and the store's scans of its
//! other requests (ingest's outer messages, the querier's bodies).

/// One field's value as found on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireValue<'a> {
    /// A varint (wire type 0).
    Varint,
    /// A fixed 32- or 64-bit value (wire types 5 and 1).
    Fixed,
    /// A length-delimited payload (wire type 2): a message, string, bytes
    /// or packed scalars.
    Bytes(&'a [u8]),
}

/// The fields of one message, as `(field number, value)`; the iteration
/// ends at the end of the message or at the first field that is malformed
/// or of a wire type this reader does not walk (groups), and
/// [`Fields::rest`] then says which.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    /// What is left unread: empty once a whole, well-formed message has
    /// been walked.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = (u64, WireValue<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let (key, after_key) = read_varint(self.rest)?;
        let (value, rest) = match key & 7 {
            0 => (WireValue::Varint, read_varint(after_key)?.1),
            1 => (WireValue::Fixed, after_key.get(8..)?),
            2 => {
                let (len, after_len) = read_varint(after_key)?;
                let len = usize::try_from(len).ok()?;
                (
                    WireValue::Bytes(after_len.get(..len)?),
                    after_len.get(len..)?,
                )
            }
            5 => (WireValue::Fixed, after_key.get(4..)?),
            _ => return None,
        };
        self.rest = rest;
        Some((key >> 3, value))
    }
}

/// The fields of `message`.
pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields { rest: message }
}

/// Entries of one occurrence of a repeated scalar field: one if unpacked,
/// else one per varint (a byte without the continuation bit) in the packed
/// payload. An upper bound for packed fixed-size values too.
pub fn scalar_entries(value: &WireValue<'_>) -> usize {
    match value {
        WireValue::Bytes(packed) => packed.iter().filter(|b| **b & 0x80 == 0).count(),
        WireValue::Varint | WireValue::Fixed => 1,
    }
}

/// One varint off the front of `bytes`, and what follows it.
fn read_varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, bytes.get(i + 1..)?));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_with_their_numbers_and_payloads() {
        // 1: varint 150, 2: "ab", 3: fixed64, 4: fixed32, 5: packed [1, 300].
        let message = b"\x08\x96\x01\x12\x02ab\x19\0\0\0\0\0\0\0\0\x25\0\0\0\0\x2a\x03\x01\xac\x02";
        let mut walked = fields(message);
        let found: Vec<_> = walked.by_ref().collect();
        assert_eq!(
            found,
            vec![
                (1, WireValue::Varint),
                (2, WireValue::Bytes(b"ab")),
                (3, WireValue::Fixed),
                (4, WireValue::Fixed),
                (5, WireValue::Bytes(b"\x01\xac\x02")),
            ]
        );
        assert!(walked.rest().is_empty());
        assert_eq!(scalar_entries(&found[4].1), 2);
        assert_eq!(scalar_entries(&found[0].1), 1);
    }

    #[test]
    fn the_walk_stops_at_a_malformed_field_and_keeps_it_as_rest() {
        for broken in [&b"\x12\x05ab"[..], b"\x80", b"\x0b", b"\x19\0\0"] {
            let mut walked = fields(broken);
            assert!(walked.by_ref().next().is_none(), "{broken:?}");
            assert_eq!(walked.rest(), broken);
        }
        let mut walked = fields(b"\x08\x01\x0b");
        assert_eq!(walked.next(), Some((1, WireValue::Varint)));
        assert_eq!(walked.next(), None);
        assert_eq!(walked.rest(), b"\x0b");
    }
}

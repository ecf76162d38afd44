//! The protobuf wire rules prost applies, over a byte slice, without
//! allocating: varints (at most 10 bytes, no overflow past 64 bits), keys
//! (a tag of at least 1 that fits in 32 bits, a known wire type), length
//! prefixes within the input, and unknown fields skipped (groups nested at
//! most as deep as prost's recursion limit).

use crate::error::PprofError;

/// prost's recursion limit: how deep messages and groups may nest.
pub(super) const RECURSION_LIMIT: u32 = 100;

pub(super) const VARINT: u8 = 0;
pub(super) const FIXED64: u8 = 1;
pub(super) const LENGTH_DELIMITED: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
pub(super) const FIXED32: u8 = 5;

pub(super) fn malformed(what: &'static str) -> PprofError {
    PprofError::Wire { what }
}

/// A cursor over one message's bytes.
pub(super) struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    pub(super) fn varint(&mut self) -> Result<u64, PprofError> {
        let mut value = 0u64;
        for (i, &byte) in self.rest.iter().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                // The tenth byte may only carry bit 63.
                if i == 9 && byte >= 0x02 {
                    break;
                }
                self.rest = &self.rest[i + 1..];
                return Ok(value);
            }
        }
        Err(malformed("invalid varint"))
    }

    /// The next field's number and wire type.
    pub(super) fn key(&mut self) -> Result<(u32, u8), PprofError> {
        let key = self.varint()?;
        let key = u32::try_from(key).map_err(|_| malformed("invalid key"))?;
        let wire_type = (key & 7) as u8;
        if wire_type > FIXED32 {
            return Err(malformed("invalid wire type"));
        }
        let field = key >> 3;
        if field == 0 {
            return Err(malformed("invalid tag 0"));
        }
        Ok((field, wire_type))
    }

    pub(super) fn delimited(&mut self) -> Result<&'a [u8], PprofError> {
        let len = self.varint()?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&len| len <= self.rest.len())
            .ok_or_else(|| malformed("length past the end of the buffer"))?;
        let (value, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(value)
    }

    fn advance(&mut self, len: usize) -> Result<(), PprofError> {
        self.rest = self
            .rest
            .get(len..)
            .ok_or_else(|| malformed("field past the end of the buffer"))?;
        Ok(())
    }

    /// Skips an unknown field, as prost does; `depth` is what is left of
    /// the recursion limit.
    pub(super) fn skip(&mut self, field: u32, wire_type: u8, depth: u32) -> Result<(), PprofError> {
        if depth == 0 {
            return Err(malformed("recursion limit reached"));
        }
        match wire_type {
            VARINT => self.varint().map(drop),
            FIXED64 => self.advance(8),
            FIXED32 => self.advance(4),
            LENGTH_DELIMITED => self.delimited().map(drop),
            START_GROUP => loop {
                let (inner, inner_type) = self.key()?;
                if inner_type == END_GROUP {
                    if inner != field {
                        return Err(malformed("unexpected end group tag"));
                    }
                    return Ok(());
                }
                self.skip(inner, inner_type, depth - 1)?;
            },
            _ => Err(malformed("unexpected end group tag")),
        }
    }

    /// A singular scalar field's value (int64, uint64 or bool on the wire).
    pub(super) fn scalar(&mut self, wire_type: u8) -> Result<u64, PprofError> {
        if wire_type != VARINT {
            return Err(malformed("invalid wire type for a varint field"));
        }
        self.varint()
    }

    /// A singular message field's bytes.
    pub(super) fn message(&mut self, wire_type: u8) -> Result<&'a [u8], PprofError> {
        if wire_type != LENGTH_DELIMITED {
            return Err(malformed("invalid wire type for a message field"));
        }
        self.delimited()
    }

    /// A repeated varint field's occurrence, packed or not, into `out`.
    pub(super) fn repeated<T>(
        &mut self,
        wire_type: u8,
        out: &mut Vec<T>,
        convert: impl Fn(u64) -> T,
    ) -> Result<(), PprofError> {
        match wire_type {
            LENGTH_DELIMITED => {
                let mut packed = Cursor::new(self.delimited()?);
                while !packed.is_empty() {
                    out.push(convert(packed.varint()?));
                }
                Ok(())
            }
            VARINT => {
                out.push(convert(self.varint()?));
                Ok(())
            }
            _ => Err(malformed("invalid wire type for a repeated varint field")),
        }
    }
}

/// Two's complement reinterpretation, as protobuf's `int64` is read.
pub(super) fn int64(value: u64) -> i64 {
    value as i64
}

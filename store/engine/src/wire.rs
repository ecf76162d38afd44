//! The block's primitive encoding: LEB128 varints, zigzag for signed values,
//! length-prefixed byte strings. The reader checks every bound and never panics.

/// A read ran past the end of its input or met a malformed varint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WireError;

/// Appends encoded values to a byte vector.
#[derive(Debug, Default, Clone)]
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.buf.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.buf.push(value as u8);
    }

    pub(crate) fn signed(&mut self, value: i64) {
        self.varint(((value << 1) ^ (value >> 63)) as u64);
    }

    pub(crate) fn byte(&mut self, value: u8) {
        self.buf.push(value);
    }

    /// Writes a length-prefixed byte string.
    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        self.varint(bytes.len() as u64);
        self.buf.extend_from_slice(bytes);
    }

    pub(crate) fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    pub(crate) fn u32_le(&mut self, value: u32) {
        self.buf.extend_from_slice(&value.to_le_bytes());
    }

    pub(crate) fn u64_le(&mut self, value: u64) {
        self.buf.extend_from_slice(&value.to_le_bytes());
    }

    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    pub(crate) fn into_vec(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads values written by [`Writer`] from a borrowed slice.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    pub(crate) fn remaining(&self) -> usize {
        self.rest.len()
    }

    pub(crate) fn varint(&mut self) -> Result<u64, WireError> {
        let mut value = 0u64;
        for i in 0..10 {
            let (&byte, rest) = self.rest.split_first().ok_or(WireError)?;
            self.rest = rest;
            if i == 9 && byte > 1 {
                return Err(WireError);
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(WireError)
    }

    pub(crate) fn signed(&mut self) -> Result<i64, WireError> {
        let raw = self.varint()?;
        Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    }

    /// Reads a varint that must fit `u32`.
    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        u32::try_from(self.varint()?).map_err(|_| WireError)
    }

    /// Reads a count of items each taking at least `min_item_bytes`, refusing
    /// counts the remaining input cannot hold (so hostile counts cannot
    /// make us allocate).
    pub(crate) fn count(&mut self, min_item_bytes: usize) -> Result<usize, WireError> {
        let count = usize::try_from(self.varint()?).map_err(|_| WireError)?;
        if count.saturating_mul(min_item_bytes.max(1)) > self.rest.len() && min_item_bytes > 0 {
            return Err(WireError);
        }
        Ok(count)
    }

    pub(crate) fn byte(&mut self) -> Result<u8, WireError> {
        let (&byte, rest) = self.rest.split_first().ok_or(WireError)?;
        self.rest = rest;
        Ok(byte)
    }

    /// Reads a length-prefixed byte string.
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let len = usize::try_from(self.varint()?).map_err(|_| WireError)?;
        self.take(len)
    }

    pub(crate) fn take(&mut self, len: usize) -> Result<&'a [u8], WireError> {
        if len > self.rest.len() {
            return Err(WireError);
        }
        let (head, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(head)
    }

    pub(crate) fn u32_le(&mut self) -> Result<u32, WireError> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes(bytes.try_into().map_err(|_| WireError)?))
    }

    pub(crate) fn u64_le(&mut self) -> Result<u64, WireError> {
        let bytes = self.take(8)?;
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| WireError)?))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn values_round_trip(values in proptest::collection::vec(any::<i64>(), 0..50)) {
            let mut w = Writer::new();
            for &v in &values {
                w.signed(v);
                w.varint(v as u64);
            }
            let bytes = w.into_vec();
            let mut r = Reader::new(&bytes);
            for &v in &values {
                prop_assert_eq!(r.signed().unwrap(), v);
                prop_assert_eq!(r.varint().unwrap(), v as u64);
            }
            prop_assert!(r.is_empty());
        }
    }
}

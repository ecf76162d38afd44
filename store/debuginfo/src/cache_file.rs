//! The symbol cache's persisted form: what addresses were resolved to, and
//! which build ids were looked for and not found (with when to look
//! again), so a restart does not resolve or look up the same ones again.
//!
//! Layout: the magic `KILNSYM1`, the resolved addresses, the missing build
//! ids, then the CRC-32 of everything before it (little-endian). Numbers
//! are LEB128 varints, strings a varint length and UTF-8. Every count is
//! checked against the bytes left before anything is allocated for it.

use crate::{BuildId, DebugInfoError, Frame};

const MAGIC: &[u8; 8] = b"KILNSYM1";

/// One resolved address; no frames means the file was found but does not
/// know the address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedAddress {
    /// The debug file's build id.
    pub build_id: BuildId,
    /// The address as an offset in the mapped file.
    pub file_offset: u64,
    /// Its frames, innermost first.
    pub frames: Vec<Frame>,
}

/// A build id looked for and not found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingBuildId {
    /// The build id.
    pub build_id: BuildId,
    /// When to look again, unix ms.
    pub retry_at_ms: i64,
}

/// Everything the cache keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheContents {
    /// Resolved addresses.
    pub resolved: Vec<ResolvedAddress>,
    /// Build ids not found.
    pub missing: Vec<MissingBuildId>,
}

/// Writes `contents`.
pub fn encode(contents: &CacheContents) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    varint(&mut out, contents.resolved.len() as u64);
    for entry in &contents.resolved {
        string(&mut out, entry.build_id.as_str());
        varint(&mut out, entry.file_offset);
        varint(&mut out, entry.frames.len() as u64);
        for frame in &entry.frames {
            string(&mut out, &frame.function);
            string(&mut out, &frame.file);
            varint(&mut out, u64::from(frame.line));
        }
    }
    varint(&mut out, contents.missing.len() as u64);
    for missing in &contents.missing {
        string(&mut out, missing.build_id.as_str());
        varint(&mut out, missing.retry_at_ms as u64);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads a file [`encode`] wrote, refusing one over `max_bytes`, damaged,
/// or of another format.
pub fn decode(bytes: &[u8], max_bytes: usize) -> Result<CacheContents, DebugInfoError> {
    if bytes.len() > max_bytes {
        return Err(bad(format!("{} bytes is over {max_bytes}", bytes.len())));
    }
    let body_len = bytes
        .len()
        .checked_sub(4)
        .filter(|&n| n >= MAGIC.len())
        .ok_or_else(|| bad("too short".to_owned()))?;
    let (body, crc) = bytes.split_at(body_len);
    let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32fast::hash(body) != crc {
        return Err(bad("checksum mismatch".to_owned()));
    }
    let mut r = Cursor {
        bytes: body,
        at: MAGIC.len(),
    };
    if &body[..MAGIC.len()] != MAGIC {
        return Err(bad("not a symbol cache file".to_owned()));
    }
    // Each entry takes at least 3 bytes, each frame and missing id 3.
    let count = r.count(3)?;
    let mut resolved = Vec::with_capacity(count);
    for _ in 0..count {
        let build_id = BuildId::parse(r.string()?)?;
        let file_offset = r.varint()?;
        let frames_len = r.count(3)?;
        let mut frames = Vec::with_capacity(frames_len);
        for _ in 0..frames_len {
            let function = r.string()?.to_owned();
            let file = r.string()?.to_owned();
            let line = u32::try_from(r.varint()?).map_err(|_| bad("line".to_owned()))?;
            frames.push(Frame {
                function,
                file,
                line,
            });
        }
        resolved.push(ResolvedAddress {
            build_id,
            file_offset,
            frames,
        });
    }
    let count = r.count(3)?;
    let mut missing = Vec::with_capacity(count);
    for _ in 0..count {
        let build_id = BuildId::parse(r.string()?)?;
        let retry_at_ms = r.varint()? as i64;
        missing.push(MissingBuildId {
            build_id,
            retry_at_ms,
        });
    }
    if r.at != body.len() {
        return Err(bad("bytes after the last entry".to_owned()));
    }
    Ok(CacheContents { resolved, missing })
}

fn bad(message: String) -> DebugInfoError {
    DebugInfoError::CacheFile { message }
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn string(out: &mut Vec<u8>, text: &str) {
    varint(out, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn varint(&mut self) -> Result<u64, DebugInfoError> {
        let mut value = 0u64;
        for shift in 0..10 {
            let byte = *self
                .bytes
                .get(self.at)
                .ok_or_else(|| bad("truncated".to_owned()))?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << (7 * shift);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(bad("varint too long".to_owned()))
    }

    /// A count of items of at least `min_bytes` each, refused when the
    /// bytes left cannot hold them.
    fn count(&mut self, min_bytes: usize) -> Result<usize, DebugInfoError> {
        let count = self.varint()?;
        let left = (self.bytes.len() - self.at) as u64;
        if count.saturating_mul(min_bytes as u64) > left {
            return Err(bad(format!("{count} entries in {left} bytes")));
        }
        Ok(count as usize)
    }

    fn string(&mut self) -> Result<&'a str, DebugInfoError> {
        let len = usize::try_from(self.varint()?).map_err(|_| bad("length".to_owned()))?;
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| bad("truncated string".to_owned()))?;
        let text = std::str::from_utf8(&self.bytes[self.at..end])
            .map_err(|_| bad("a string is not UTF-8".to_owned()))?;
        self.at = end;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sample() -> CacheContents {
        CacheContents {
            resolved: vec![ResolvedAddress {
                build_id: BuildId::parse("abb9e2d567ca6567").unwrap(),
                file_offset: 0x1149,
                frames: vec![
                    Frame {
                        function: "hot_static_work".to_owned(),
                        file: "/src/hot.c".to_owned(),
                        line: 5,
                    },
                    Frame {
                        function: "main".to_owned(),
                        file: String::new(),
                        line: 0,
                    },
                ],
            }],
            missing: vec![MissingBuildId {
                build_id: BuildId::parse("00ff").unwrap(),
                retry_at_ms: 1_700_000_000_000,
            }],
        }
    }

    #[test]
    fn a_cache_file_reads_back_what_was_written() {
        let bytes = encode(&sample());
        assert_eq!(decode(&bytes, 1 << 20).unwrap(), sample());
    }

    #[test]
    fn damaged_oversized_and_foreign_files_are_refused() {
        let bytes = encode(&sample());
        assert!(decode(&bytes, 10).is_err());
        let mut flipped = bytes.clone();
        flipped[12] ^= 1;
        assert!(decode(&flipped, 1 << 20).is_err());
        assert!(decode(b"KILNSYM1", 1 << 20).is_err());
        assert!(decode(b"", 1 << 20).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes, 1 << 20);
            let mut framed = MAGIC.to_vec();
            framed.extend_from_slice(&bytes);
            let crc = crc32fast::hash(&framed);
            framed.extend_from_slice(&crc.to_le_bytes());
            let _ = decode(&framed, 1 << 20);
        }
    }
}

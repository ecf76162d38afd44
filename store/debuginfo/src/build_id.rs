//! GNU build ids, as the store keys files and caches by them.

use std::fmt;

use crate::DebugInfoError;

/// Fewest and most bytes of a build id: GNU ids are 20 (SHA-1) or 16
/// (MD5) bytes, `--build-id=0x...` may give any length.
const MIN_BYTES: usize = 2;
const MAX_BYTES: usize = 64;

/// A build id: 2 to 64 bytes, written as lowercase hex. Its text is only
/// ever hex digits, so it is safe inside an object key or a URL path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BuildId(String);

impl BuildId {
    /// Reads hex text (either case).
    pub fn parse(text: &str) -> Result<Self, DebugInfoError> {
        let ok = (MIN_BYTES * 2..=MAX_BYTES * 2).contains(&text.len())
            && text.len().is_multiple_of(2)
            && text.bytes().all(|b| b.is_ascii_hexdigit());
        if ok {
            Ok(Self(text.to_ascii_lowercase()))
        } else {
            Err(DebugInfoError::BadBuildId {
                text: text.chars().take(140).collect(),
            })
        }
    }

    /// From the raw bytes of an ELF note.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DebugInfoError> {
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Self::parse(&text)
    }

    /// The lowercase hex text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Maps keyed by build id are looked up by the text a client sent.
impl std::borrow::Borrow<str> for BuildId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_ids_are_hex_of_two_to_sixty_four_bytes_in_lowercase() {
        let id = BuildId::parse("ABB9e2d567ca6567d52511a241fbdb6b20f61ae5").unwrap();
        assert_eq!(id.as_str(), "abb9e2d567ca6567d52511a241fbdb6b20f61ae5");
        assert_eq!(BuildId::from_bytes(&[0xab, 0x01]).unwrap().as_str(), "ab01");
        for bad in ["", "a", "abc", "../etc", "zz", &"ab".repeat(65), "ab/cd"] {
            assert!(BuildId::parse(bad).is_err(), "{bad:?}");
        }
    }
}

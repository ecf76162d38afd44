//! Queries that see every replica's unflushed data.
//!
//! Replicas share a bucket, but each holds its own live head and the heads
//! it has cut and not yet uploaded. A query answered from one replica's
//! head and the bucket alone misses what the others acknowledged in the
//! last flush interval, and a block another replica uploaded after this
//! one last listed the bucket. So a query asks every peer for a
//! [`PeerHead`]: its selected live data, each pending head (named by the
//! block id it will be uploaded as), and the blocks it uploaded recently.
//!
//! The querier reads its own view first and asks the peers after, so what
//! a peer holds at its answer is, for the querier, exactly one of: in its
//! live data, in a pending head whose block the querier has not listed,
//! or in a block it uploaded (listed by the querier, or in `uploaded`).
//! A pending head whose block the querier already lists (or whose block a
//! compaction the querier lists has replaced) is skipped by id, so nothing
//! is counted twice; see `store/catalog/read.rs`.
//!
//! Why fan-out rather than routing series to owners: agents, Pyroscope
//! SDKs and OTLP exporters send wherever the Service sends them, every
//! replica must take any write (retries after a rolling restart land on
//! another pod), and a peer's data is small (one flush interval), so
//! asking every peer is cheap and keeps writes free of a ring.
//!
//! This module is the contract: the request, the answer and its bytes on
//! the wire, and [`PeerSource`], the transport the server provides.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use bytes::Bytes;
use kiln_engine::model::{BlockMeta, Matcher, TimeRange};

/// What a querier asks each peer for: the series matching `matchers`, with
/// data in `range`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeerScope {
    /// All must match; the profile type is one of them when the query has one.
    pub matchers: Vec<Matcher>,
    /// Inclusive start, unix ms.
    pub start_ms: i64,
    /// Exclusive end, unix ms.
    pub end_ms: i64,
    /// Whether the query reads stacks (merges); listings, timelines and
    /// exemplars read only each profile's total, so peers send only those.
    #[serde(default = "reads_stacks")]
    pub stacks: bool,
}

fn reads_stacks() -> bool {
    true
}

impl PeerScope {
    pub fn new(matchers: Vec<Matcher>, range: TimeRange, stacks: bool) -> Self {
        Self {
            matchers,
            start_ms: range.start_ms,
            end_ms: range.end_ms,
            stacks,
        }
    }

    pub fn range(&self) -> TimeRange {
        TimeRange {
            start_ms: self.start_ms,
            end_ms: self.end_ms,
        }
    }
}

/// One encoded block of a peer's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerBlock {
    /// The block id a pending head will be uploaded as; `None` for live data.
    pub pending: Option<String>,
    /// The block's bytes (kiln-engine's block format).
    pub bytes: Bytes,
}

/// A peer's answer: its selected unflushed data and its recent uploads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerHead {
    /// The answering replica's name.
    pub replica: String,
    pub blocks: Vec<PeerBlock>,
    /// Blocks the peer uploaded in the last [`RECENT_UPLOADS_KEPT`], which
    /// a querier may not have listed yet.
    pub uploaded: Vec<BlockMeta>,
}

/// How long a replica remembers the blocks it uploaded, for peers that
/// have not listed them yet: many relist intervals, so only a querier
/// whose listings have failed that long misses one (and its health says
/// its bucket fails).
pub const RECENT_UPLOADS_KEPT: std::time::Duration = std::time::Duration::from_secs(600);

/// A peer that gave no usable answer within the query's deadline.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UnansweredPeer {
    pub peer: String,
    pub error: String,
}

/// Every peer's answer to one query.
#[derive(Debug, Default)]
pub struct PeerAnswers {
    pub heads: Vec<PeerHead>,
    pub unanswered: Vec<UnansweredPeer>,
}

/// The transport to the peers, provided by the server.
pub trait PeerSource: Send + Sync + Debug {
    /// Asks every peer for `scope`, giving up on each at `deadline`.
    fn ask(
        &self,
        scope: PeerScope,
        deadline: Instant,
    ) -> Pin<Box<dyn Future<Output = PeerAnswers> + Send + '_>>;
}

/// The answer's bytes: `KPH1`, a little-endian u32 header length, the
/// header (JSON), then every block's bytes in header order.
const MAGIC: &[u8; 4] = b"KPH1";

/// Largest header accepted: block ids and metas of recent uploads only.
const MAX_HEADER_BYTES: usize = 16 << 20;

#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    replica: String,
    blocks: Vec<HeaderBlock>,
    uploaded: Vec<BlockMeta>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct HeaderBlock {
    pending: Option<String>,
    len: u64,
}

/// Why a peer's answer could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PeerAnswerError {
    #[error("a peer answer must start with {MAGIC:?}")]
    Magic,
    #[error("a peer answer's header of {len} bytes is past its body or {MAX_HEADER_BYTES} bytes")]
    HeaderLength { len: usize },
    #[error("a peer answer's header is not valid: {source}")]
    Header { source: serde_json::Error },
    #[error("a peer answer's blocks add up to {declared} bytes, its body has {actual}")]
    BlockLengths { declared: u64, actual: usize },
}

impl PeerHead {
    /// The answer's bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let header = Header {
            replica: self.replica.clone(),
            blocks: self
                .blocks
                .iter()
                .map(|b| HeaderBlock {
                    pending: b.pending.clone(),
                    len: b.bytes.len() as u64,
                })
                .collect(),
            uploaded: self.uploaded.clone(),
        };
        // A struct of strings, numbers and metas always serializes.
        let header = serde_json::to_vec(&header).unwrap_or_default();
        let body: usize = self.blocks.iter().map(|b| b.bytes.len()).sum();
        let mut out = Vec::with_capacity(8 + header.len() + body);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        for block in &self.blocks {
            out.extend_from_slice(&block.bytes);
        }
        out
    }

    /// Reads an answer; the blocks share `bytes`' buffer.
    pub fn decode(bytes: Bytes) -> Result<Self, PeerAnswerError> {
        if bytes.len() < 8 || &bytes[..4] != MAGIC {
            return Err(PeerAnswerError::Magic);
        }
        let mut len = [0u8; 4];
        len.copy_from_slice(&bytes[4..8]);
        let header_len = u32::from_le_bytes(len) as usize;
        if header_len > MAX_HEADER_BYTES || header_len > bytes.len() - 8 {
            return Err(PeerAnswerError::HeaderLength { len: header_len });
        }
        let header: Header = serde_json::from_slice(&bytes[8..8 + header_len])
            .map_err(|source| PeerAnswerError::Header { source })?;
        let mut at = 8 + header_len;
        let declared = header
            .blocks
            .iter()
            .fold(0u64, |sum, b| sum.saturating_add(b.len));
        let actual = bytes.len() - at;
        if declared != actual as u64 {
            return Err(PeerAnswerError::BlockLengths { declared, actual });
        }
        let blocks = header
            .blocks
            .into_iter()
            .map(|b| {
                // Within `actual`, checked above.
                let end = at + b.len as usize;
                let block = PeerBlock {
                    pending: b.pending,
                    bytes: bytes.slice(at..end),
                };
                at = end;
                block
            })
            .collect();
        Ok(Self {
            replica: header.replica,
            blocks,
            uploaded: header.uploaded,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(id: &str) -> BlockMeta {
        BlockMeta {
            format_version: 2,
            id: id.into(),
            min_time_ms: 1,
            max_time_ms: 2,
            compaction_level: 1,
            replica: "b".into(),
            sources: vec![],
            series: 1,
            samples: 1,
            profiles: 1,
            size_bytes: 10,
        }
    }

    #[test]
    fn an_answer_reads_back_as_it_was_written() {
        let head = PeerHead {
            replica: "kiln-1".into(),
            blocks: vec![
                PeerBlock {
                    pending: None,
                    bytes: Bytes::from_static(b"live"),
                },
                PeerBlock {
                    pending: Some("01PENDING".into()),
                    bytes: Bytes::from_static(b"pending head"),
                },
            ],
            uploaded: vec![meta("01UP")],
        };
        let bytes = Bytes::from(head.encode());
        assert_eq!(PeerHead::decode(bytes).unwrap(), head);
    }

    #[test]
    fn a_damaged_answer_is_an_error_not_a_panic() {
        let head = PeerHead {
            replica: "kiln-1".into(),
            blocks: vec![PeerBlock {
                pending: None,
                bytes: Bytes::from_static(b"live data"),
            }],
            uploaded: vec![],
        };
        let bytes = head.encode();
        for cut in 0..bytes.len() {
            assert!(PeerHead::decode(Bytes::copy_from_slice(&bytes[..cut])).is_err());
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            PeerHead::decode(Bytes::from(long)),
            Err(PeerAnswerError::BlockLengths { .. })
        ));
        let mut huge = bytes;
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            PeerHead::decode(Bytes::from(huge)),
            Err(PeerAnswerError::HeaderLength { .. })
        ));
    }
}

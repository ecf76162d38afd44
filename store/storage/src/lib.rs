#![doc = include_str!("../README.md")]

pub mod bucket;
pub mod error;
pub mod lease;
pub mod memory_gate;
pub mod peer_keys;
pub mod peers;
pub mod planner;
pub mod store;
pub mod wal;

pub use bucket::{Bucket, BucketConfig, CorruptBlock};
pub use error::{ErrorClass, StorageError};
pub use store::{
    AcceptedTimes, CompactionReport, IngestAdmission, IngestRequest, IngestTurn, Store,
    StoreConfig, StoreStats, WriterScope,
};

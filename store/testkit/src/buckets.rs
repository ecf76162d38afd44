//! Buckets that fail on request, for outages a real server cannot be told
//! to produce: a proxy in front of `moto_server` ([`s3_proxy`]), and an
//! in-process `ObjectStore` behind a switch ([`faulty`], with the
//! `storage` feature).

#[cfg(feature = "storage")]
pub mod faulty;
pub mod s3_proxy;

//! The wall clock in the units the store's APIs take.

use std::time::{SystemTime, UNIX_EPOCH};

fn since_epoch() -> std::time::Duration {
    // A clock before 1970 is a broken machine, not a test failure to explain.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Seconds since the Unix epoch, as `/ingest`'s `from` and `until` take them.
pub fn now_s() -> i64 {
    since_epoch().as_secs() as i64
}

/// Milliseconds since the Unix epoch, as the query APIs take them.
pub fn now_ms() -> i64 {
    since_epoch().as_millis() as i64
}

/// Nanoseconds since the Unix epoch, as pprof and OTLP times are written.
pub fn now_nanos() -> i64 {
    since_epoch().as_nanos() as i64
}

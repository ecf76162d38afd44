//! pprof sample labels that stay on their samples.
//!
//! The store turns a profile's string sample labels into series labels, so
//! that they can be selected and grouped; a label with a new value on every
//! request or every process would instead make a new series each time and
//! spend the series budget. The labels named here stay per sample: they
//! are kept with each stack and come back in pprof exports, but select no
//! series. The agent puts [`PID`], [`TID`] and [`COMM`] on its samples; the
//! store's ingest reads [`PER_SAMPLE_LABELS`].

/// A tracing span's id (Pyroscope's span profiles).
pub const SPAN_ID: &str = "span_id";
/// A profile's id (Pyroscope).
pub const PROFILE_ID: &str = "profile_id";
/// A trace's id.
pub const TRACE_ID: &str = "trace_id";
/// The agent's process id.
pub const PID: &str = "pid";
/// The agent's thread id (with `--record-tid`).
pub const TID: &str = "tid";
/// The agent's process name (`/proc/PID/comm`).
pub const COMM: &str = "comm";

/// String sample labels that the store keeps per sample instead of
/// promoting them to series labels. Numeric labels always stay per sample.
pub const PER_SAMPLE_LABELS: [&str; 6] = [SPAN_ID, PROFILE_ID, TRACE_ID, PID, TID, COMM];

/// Whether a string sample label named `name` stays per sample.
pub fn stays_per_sample(name: &str) -> bool {
    PER_SAMPLE_LABELS.contains(&name)
}

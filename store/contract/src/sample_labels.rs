//! pprof sample labels that stay on their samples.
//!
//! The store turns a profile's string sample labels into series labels, so
//! that they can be selected and grouped; a label with a new value on every
//! request or every process would instead make a new series each time and
//! spend the series budget. The labels named here stay per sample: they
//! are kept with each stack and come back in pprof exports, but select no
//! series. The agent puts [`PID`], [`TID`] and [`COMM`] on its samples; the
//! store's ingest reads [`PER_SAMPLE_LABELS`].

/// A tracing span's id (Pyroscope's span profiles): 16 hex digits, as
/// OpenTelemetry writes a span id (see [`span_id`]).
pub const SPAN_ID: &str = "span_id";
/// The name of the span a sample ran in (its local root span's, as
/// `grafana/otel-profiling-go` sets it).
pub const SPAN_NAME: &str = "span_name";
/// A profile's id (Pyroscope).
pub const PROFILE_ID: &str = "profile_id";
/// A trace's id: 32 hex digits (see [`trace_id`]).
pub const TRACE_ID: &str = "trace_id";
/// The agent's process id.
pub const PID: &str = "pid";
/// The agent's thread id (with `--record-tid`).
pub const TID: &str = "tid";
/// The agent's process name (`/proc/PID/comm`).
pub const COMM: &str = "comm";

/// String sample labels that the store keeps per sample instead of
/// promoting them to series labels. Numeric labels always stay per sample.
pub const PER_SAMPLE_LABELS: [&str; 7] = [SPAN_ID, SPAN_NAME, PROFILE_ID, TRACE_ID, PID, TID, COMM];

/// Whether a string sample label named `name` stays per sample.
pub fn stays_per_sample(name: &str) -> bool {
    PER_SAMPLE_LABELS.contains(&name)
}

/// A span id written as OpenTelemetry and W3C trace context write it: 16
/// hex digits, either case. `None` for anything else, so a query's span
/// ids and a sample's label compare as numbers, whatever their case.
pub fn span_id(text: &str) -> Option<u64> {
    hex_id(text, 16).and_then(|id| u64::try_from(id).ok())
}

/// A trace id as OpenTelemetry writes one: 32 hex digits, either case.
pub fn trace_id(text: &str) -> Option<u128> {
    hex_id(text, 32)
}

fn hex_id(text: &str, digits: usize) -> Option<u128> {
    if text.len() != digits || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::{span_id, trace_id};

    #[test]
    fn span_ids_are_sixteen_hex_digits_of_either_case() {
        assert_eq!(span_id("9a517183f26a089d"), Some(0x9a51_7183_f26a_089d));
        assert_eq!(span_id("9A517183F26A089D"), span_id("9a517183f26a089d"));
        for bad in [
            "",
            "9a517183f26a089",
            "9a517183f26a089d0",
            "+a517183f26a089d",
            "9a517183f26a08 d",
        ] {
            assert_eq!(span_id(bad), None, "{bad:?}");
        }
        assert_eq!(
            trace_id("0af7651916cd43dd8448eb211c80319c"),
            Some(0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c)
        );
        assert_eq!(
            trace_id("9a517183f26a089d"),
            None,
            "a span id is no trace id"
        );
    }
}

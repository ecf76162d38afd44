//! Folded ("collapsed") text stacks into pprof.
//!
//! Folded text is what Brendan Gregg's `stackcollapse-*` scripts, inferno,
//! async-profiler and older Pyroscope clients write: one stack per line,
//! frames root first separated by `;`, then a space and a count:
//!
//! ```text
//! main;run;compute(int, int) 42
//! ```
//!
//! Frames may contain spaces and commas (C++ and Java signatures), so the
//! count is whatever follows the *last* space. Pyroscope's `lines` format is
//! the same without counts: every line is one sample.

use crate::builder::{FunctionSpec, ProfileBuilder};
use crate::proto;

/// How to read the text and what the resulting profile measures.
#[derive(Debug, Clone)]
pub struct FoldedSpec {
    /// Whether lines carry a trailing count (`folded`) or are one sample each (`lines`).
    pub format: FoldedFormat,
    /// The single sample type, e.g. `("cpu", "nanoseconds")` or `("samples", "count")`.
    pub sample_type: (String, String),
    /// Period type, unit and period, e.g. `("cpu", "nanoseconds", 10_000_000)`.
    pub period: Option<(String, String, i64)>,
    /// Each count is multiplied by this, e.g. the sampling period to turn
    /// sample counts into nanoseconds. 1 keeps counts as they are.
    pub value_scale: i64,
    /// Collection time, unix nanoseconds.
    pub time_nanos: i64,
    /// Covered duration in nanoseconds (0 when unknown).
    pub duration_nanos: i64,
    /// At most this many distinct stacks.
    pub max_stacks: usize,
    /// At most this many frames in one stack.
    pub max_depth: usize,
}

impl Default for FoldedSpec {
    fn default() -> Self {
        Self {
            format: FoldedFormat::Folded,
            sample_type: ("samples".to_owned(), "count".to_owned()),
            period: None,
            value_scale: 1,
            time_nanos: 0,
            duration_nanos: 0,
            max_stacks: 1_000_000,
            max_depth: 1024,
        }
    }
}

/// The two text layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoldedFormat {
    /// `frame;frame;frame COUNT` per line.
    Folded,
    /// `frame;frame;frame` per line, each line counting once.
    Lines,
}

/// What parsing the text found besides the profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FoldedStats {
    /// Lines that became samples.
    pub lines: usize,
    /// Lines skipped: without a count (as Pyroscope does) or with count 0.
    pub skipped_lines: usize,
    /// Sum of the (unscaled) counts.
    pub total_count: i64,
}

/// Folded text that cannot become a profile.
#[derive(Debug, thiserror::Error)]
pub enum FoldedError {
    /// The text after the last space is not a non-negative integer.
    #[error("line {line}: count {count:?} is not a non-negative integer")]
    BadCount {
        /// 1-based line number.
        line: usize,
        /// The text found where the count belongs (truncated to 40 bytes).
        count: String,
    },
    /// Scaling or summing counts overflowed 64 bits.
    #[error("line {line}: count overflows a 64-bit integer once scaled by {scale}")]
    CountOverflow {
        /// 1-based line number.
        line: usize,
        /// The scale factor in use.
        scale: i64,
    },
    /// A stack has more frames than allowed.
    #[error("line {line}: stack has {depth} frames, over the limit of {limit}")]
    StackTooDeep {
        /// 1-based line number.
        line: usize,
        /// Frames in the stack.
        depth: usize,
        /// The configured limit.
        limit: usize,
    },
    /// More distinct stacks than allowed.
    #[error("more than {limit} distinct stacks")]
    TooManyStacks {
        /// The configured limit.
        limit: usize,
    },
    /// A line has a count but no frames.
    #[error("line {line}: the stack is empty")]
    EmptyStack {
        /// 1-based line number.
        line: usize,
    },
}

impl FoldedError {
    /// A short, fixed name for metrics and logs, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadCount { .. } => "folded_bad_count",
            Self::CountOverflow { .. } => "folded_count_overflow",
            Self::StackTooDeep { .. } => "folded_stack_too_deep",
            Self::TooManyStacks { .. } => "folded_too_many_stacks",
            Self::EmptyStack { .. } => "folded_empty_stack",
        }
    }
}

/// Converts folded text into a pprof profile with one function and one
/// location per distinct frame name (no mappings, no addresses).
///
/// Invalid UTF-8 in frame names is replaced, never refused: a frame name is
/// only a label for humans.
pub fn folded_to_profile(
    text: &[u8],
    spec: &FoldedSpec,
) -> Result<(proto::Profile, FoldedStats), FoldedError> {
    let (kind, unit) = &spec.sample_type;
    let mut builder = ProfileBuilder::new(&[(kind.as_str(), unit.as_str())]);
    if let Some((period_kind, period_unit, period)) = &spec.period {
        builder.period(period_kind, period_unit, *period);
    }
    builder.time(spec.time_nanos, spec.duration_nanos);
    let mut stats = FoldedStats::default();
    let mut stack: Vec<u64> = Vec::new();
    for (index, raw_line) in text.split(|&b| b == b'\n').enumerate() {
        let line_number = index + 1;
        let line = trim_line_end(raw_line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let (frames, count) = match spec.format {
            FoldedFormat::Lines => (line, 1),
            FoldedFormat::Folded => match split_count(line, line_number)? {
                Some(pair) => pair,
                None => {
                    stats.skipped_lines += 1;
                    continue;
                }
            },
        };
        if count == 0 {
            stats.skipped_lines += 1;
            continue;
        }
        let value = count
            .checked_mul(spec.value_scale)
            .ok_or(FoldedError::CountOverflow {
                line: line_number,
                scale: spec.value_scale,
            })?;
        let depth = frames.split(|&b| b == b';').count();
        if depth > spec.max_depth {
            return Err(FoldedError::StackTooDeep {
                line: line_number,
                depth,
                limit: spec.max_depth,
            });
        }
        if frames.is_empty() {
            return Err(FoldedError::EmptyStack { line: line_number });
        }
        stack.clear();
        // Folded text is root first; pprof wants the leaf first.
        for frame in frames.rsplit(|&b| b == b';') {
            let name = String::from_utf8_lossy(frame);
            let function = builder.function(&FunctionSpec {
                name: name.to_string(),
                system_name: name.to_string(),
                ..FunctionSpec::default()
            });
            stack.push(builder.location(0, 0, &[(function, 0)]));
        }
        builder.sample(&stack, &[value], &[]);
        if builder.sample_count() > spec.max_stacks {
            return Err(FoldedError::TooManyStacks {
                limit: spec.max_stacks,
            });
        }
        stats.lines += 1;
        stats.total_count =
            stats
                .total_count
                .checked_add(count)
                .ok_or(FoldedError::CountOverflow {
                    line: line_number,
                    scale: 1,
                })?;
    }
    Ok((builder.finish(), stats))
}

/// Drops a trailing `\r` and trailing spaces or tabs.
fn trim_line_end(line: &[u8]) -> &[u8] {
    let end = line
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    &line[..end]
}

/// Splits `frames COUNT` at the last space. `None` when there is no space
/// (Pyroscope skips such lines).
fn split_count(line: &[u8], line_number: usize) -> Result<Option<(&[u8], i64)>, FoldedError> {
    let Some(space) = line.iter().rposition(|&b| b == b' ' || b == b'\t') else {
        return Ok(None);
    };
    let count_text = &line[space + 1..];
    let count = std::str::from_utf8(count_text)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .and_then(|n| i64::try_from(n).ok())
        .ok_or_else(|| FoldedError::BadCount {
            line: line_number,
            count: String::from_utf8_lossy(&count_text[..count_text.len().min(40)]).into_owned(),
        })?;
    let frames = trim_line_end(&line[..space]);
    Ok(Some((frames, count)))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn function_names(profile: &proto::Profile, sample: &proto::Sample) -> Vec<String> {
        sample
            .location_id
            .iter()
            .map(|&id| {
                let location = &profile.location[id as usize - 1];
                let function = &profile.function[location.line[0].function_id as usize - 1];
                String::from_utf8_lossy(&profile.string_table[function.name as usize]).into_owned()
            })
            .collect()
    }

    #[test]
    fn count_is_taken_after_the_last_space_so_frames_keep_spaces_and_commas() {
        let text = b"main;compute(int, int) [clone .1] 42\n";
        let (profile, stats) = folded_to_profile(text, &FoldedSpec::default()).unwrap();
        assert_eq!(stats.lines, 1);
        assert_eq!(profile.sample.len(), 1);
        assert_eq!(profile.sample[0].value, vec![42]);
        assert_eq!(
            function_names(&profile, &profile.sample[0]),
            ["compute(int, int) [clone .1]", "main"],
            "leaf first"
        );
    }

    #[test]
    fn identical_stacks_are_summed_and_lines_without_count_are_skipped() {
        let text = b"a;b 1\r\nstart_thread\na;b 2\n\na;c 0\n";
        let (profile, stats) = folded_to_profile(text, &FoldedSpec::default()).unwrap();
        assert_eq!(profile.sample.len(), 1);
        assert_eq!(profile.sample[0].value, vec![3]);
        assert_eq!(stats.skipped_lines, 2);
        assert_eq!(stats.total_count, 3);
    }

    #[test]
    fn bad_count_names_the_line() {
        let err = folded_to_profile(b"a 1\nb;c x12\n", &FoldedSpec::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 2: count \"x12\" is not a non-negative integer"
        );
        assert_eq!(err.reason(), "folded_bad_count");
        let err = folded_to_profile(b"a -3\n", &FoldedSpec::default()).unwrap_err();
        assert!(matches!(err, FoldedError::BadCount { line: 1, .. }));
    }

    #[test]
    fn scaled_counts_that_overflow_are_refused() {
        let spec = FoldedSpec {
            value_scale: 10_000_000,
            ..FoldedSpec::default()
        };
        let err = folded_to_profile(b"a 9223372036854775807\n", &spec).unwrap_err();
        assert!(matches!(err, FoldedError::CountOverflow { line: 1, .. }));
    }

    #[test]
    fn limits_on_depth_and_stack_count_hold() {
        let spec = FoldedSpec {
            max_depth: 2,
            max_stacks: 1,
            ..FoldedSpec::default()
        };
        let err = folded_to_profile(b"a;b;c 1\n", &spec).unwrap_err();
        assert!(matches!(err, FoldedError::StackTooDeep { depth: 3, .. }));
        let err = folded_to_profile(b"a 1\nb 1\n", &spec).unwrap_err();
        assert!(matches!(err, FoldedError::TooManyStacks { limit: 1 }));
    }

    #[test]
    fn lines_format_counts_each_line_once() {
        let spec = FoldedSpec {
            format: FoldedFormat::Lines,
            ..FoldedSpec::default()
        };
        let (profile, stats) = folded_to_profile(b"a;b\na;b\na;c d\n", &spec).unwrap();
        assert_eq!(stats.lines, 3);
        let mut values: Vec<i64> = profile.sample.iter().map(|s| s.value[0]).collect();
        values.sort_unstable();
        assert_eq!(values, [1, 2]);
    }

    #[test]
    fn result_passes_pprof_validation_with_period_and_time() {
        let spec = FoldedSpec {
            sample_type: ("cpu".into(), "nanoseconds".into()),
            period: Some(("cpu".into(), "nanoseconds".into(), 10_000_000)),
            value_scale: 10_000_000,
            time_nanos: 1_700_000_000_000_000_000,
            duration_nanos: 10_000_000_000,
            ..FoldedSpec::default()
        };
        let (profile, _) = folded_to_profile(b"main;work 3\nmain 1", &spec).unwrap();
        let valid =
            crate::Profile::validate(profile, &crate::DecodeLimits::default()).expect("valid");
        let total: i64 = valid.samples().iter().map(|s| s.value[0]).sum();
        assert_eq!(total, 40_000_000);
        assert_eq!(valid.period(), 10_000_000);
    }

    #[test]
    fn invalid_utf8_frames_are_replaced_not_refused() {
        let (profile, _) = folded_to_profile(b"ma\xffin 2\n", &FoldedSpec::default()).unwrap();
        assert_eq!(
            function_names(&profile, &profile.sample[0]),
            ["ma\u{fffd}in"]
        );
    }

    /// The inferno fixtures, with the totals SOURCES.md records for them.
    #[test]
    fn inferno_fixtures_convert_with_their_recorded_totals() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/testdata/profiles/inferno-folded");
        if !dir.is_dir() {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: {} is not present in this checkout; tests/perf_folded.rs \
                 checks folded text perf writes at test time instead",
                dir.display()
            );
            return;
        }
        for (file, total) in [
            ("example-perf-stacks-collapsed.txt", 1315),
            ("perf-rust-Yamakaky-dcpu-collapsed-all.txt", 6_850_637),
            // One line of this file is a bare frame without a count: skipped.
            ("async-profiler-collapsed-part.txt", 3279),
        ] {
            let text = std::fs::read(dir.join(file)).unwrap();
            let (profile, stats) = folded_to_profile(&text, &FoldedSpec::default())
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(stats.total_count, total, "{file}");
            let sum: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
            assert_eq!(sum, total, "{file}");
            crate::Profile::validate(profile, &crate::DecodeLimits::default())
                .unwrap_or_else(|e| panic!("{file}: {e}"));
        }
    }
}

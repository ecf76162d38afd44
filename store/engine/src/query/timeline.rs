//! Timelines: the selection's total per time step.

use crate::error::QueryError;
use crate::model::TimeRange;

/// Most steps one timeline may have.
pub const MAX_TIMELINE_STEPS: i64 = 100_000;

/// How many steps of `step_ms` cover `range`: the step must be positive,
/// the range not empty, and the steps at most [`MAX_TIMELINE_STEPS`].
pub(crate) fn step_count(range: TimeRange, step_ms: i64) -> Result<usize, QueryError> {
    if step_ms <= 0 {
        return Err(QueryError::InvalidStep { step_ms });
    }
    super::check_range(range)?;
    let span = i128::from(range.end_ms) - i128::from(range.start_ms);
    let steps = (span + i128::from(step_ms) - 1) / i128::from(step_ms);
    if steps > i128::from(MAX_TIMELINE_STEPS) {
        return Err(QueryError::TooManySteps {
            steps: i64::try_from(steps).unwrap_or(i64::MAX),
            limit: MAX_TIMELINE_STEPS,
        });
    }
    // At most MAX_TIMELINE_STEPS, so it fits.
    Ok(steps as usize)
}

/// Per-step totals over a range; step `i` covers
/// `[start_ms + i * step_ms, start_ms + (i + 1) * step_ms)`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Timeline {
    /// Start of the first step, unix ms.
    pub start_ms: i64,
    /// Step length in ms.
    pub step_ms: i64,
    /// Sum of profile totals per step.
    pub values: Vec<i64>,
}

impl Timeline {
    /// An all-zero timeline over `range` in steps of `step_ms`.
    pub fn new(range: TimeRange, step_ms: i64) -> Result<Self, QueryError> {
        Ok(Self {
            start_ms: range.start_ms,
            step_ms,
            values: vec![0; step_count(range, step_ms)?],
        })
    }

    /// Adds `value` at `time_ms` (ignored outside the timeline).
    pub fn add(&mut self, time_ms: i64, value: i64) {
        let offset = i128::from(time_ms) - i128::from(self.start_ms);
        if offset < 0 {
            return;
        }
        let step = offset / i128::from(self.step_ms);
        if let Some(slot) = usize::try_from(step)
            .ok()
            .and_then(|s| self.values.get_mut(s))
        {
            *slot = slot.wrapping_add(value);
        }
    }

    /// Adds another timeline of the same shape into this one.
    pub fn merge(&mut self, other: &Timeline) -> Result<(), QueryError> {
        if other.start_ms != self.start_ms
            || other.step_ms != self.step_ms
            || other.values.len() != self.values.len()
        {
            return Err(QueryError::TimelineShape);
        }
        for (a, b) in self.values.iter_mut().zip(&other.values) {
            *a = a.wrapping_add(*b);
        }
        Ok(())
    }

    /// Sum over all steps.
    pub fn total(&self) -> i64 {
        self.values.iter().fold(0i64, |a, b| a.wrapping_add(*b))
    }
}

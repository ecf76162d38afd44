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
    /// Profiles per step (uploads; several of one series at one
    /// millisecond count each), for averages: a gauge (heap in use,
    /// goroutines) summed over a step's scrapes would grow with the step.
    #[serde(skip)]
    pub profiles: Vec<u64>,
}

impl Timeline {
    /// An all-zero timeline over `range` in steps of `step_ms`.
    pub fn new(range: TimeRange, step_ms: i64) -> Result<Self, QueryError> {
        let steps = step_count(range, step_ms)?;
        Ok(Self {
            start_ms: range.start_ms,
            step_ms,
            values: vec![0; steps],
            profiles: vec![0; steps],
        })
    }

    /// Adds `value`, the total of `profiles` profiles, at `time_ms`
    /// (ignored outside the timeline).
    pub fn add(&mut self, time_ms: i64, value: i64, profiles: u64) {
        let offset = i128::from(time_ms) - i128::from(self.start_ms);
        if offset < 0 {
            return;
        }
        let Ok(step) = usize::try_from(offset / i128::from(self.step_ms)) else {
            return;
        };
        if let (Some(slot), Some(count)) = (self.values.get_mut(step), self.profiles.get_mut(step))
        {
            *slot = slot.wrapping_add(value);
            *count = count.saturating_add(profiles);
        }
    }

    /// Each step's mean profile total (0 for a step without profiles):
    /// Pyroscope's `TIME_SERIES_AGGREGATION_TYPE_AVERAGE`.
    pub fn averages(&self) -> Vec<f64> {
        self.values
            .iter()
            .zip(&self.profiles)
            .map(|(&value, &profiles)| match profiles {
                0 => 0.0,
                n => value as f64 / n as f64,
            })
            .collect()
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
        for (a, b) in self.profiles.iter_mut().zip(&other.profiles) {
            *a = a.saturating_add(*b);
        }
        Ok(())
    }

    /// Sum over all steps.
    pub fn total(&self) -> i64 {
        self.values.iter().fold(0i64, |a, b| a.wrapping_add(*b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_divide_each_steps_total_by_its_profiles_across_merges() {
        let range = TimeRange {
            start_ms: 0,
            end_ms: 30,
        };
        let mut head = Timeline::new(range, 10).expect("timeline");
        head.add(1, 100, 1);
        head.add(5, 300, 1);
        head.add(25, 7, 1);
        head.add(-1, 1_000, 1);
        head.add(30, 1_000, 1);
        let mut block = Timeline::new(range, 10).expect("timeline");
        // A compacted row: two profiles at one millisecond.
        block.add(2, 200, 2);
        head.merge(&block).expect("same shape");
        assert_eq!(head.values, vec![600, 0, 7]);
        assert_eq!(head.profiles, vec![4, 0, 1]);
        assert_eq!(head.averages(), vec![150.0, 0.0, 7.0]);
        assert_eq!(head.total(), 607);
    }
}

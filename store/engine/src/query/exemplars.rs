//! Exemplars: per timeline step, the one profile that weighs most, so a
//! chart of totals can point at a single profile to open.
//!
//! A "profile" here is what one series holds at one millisecond: the head
//! keeps each upload as a run, a block keeps one row per series and
//! millisecond, so runs of one series at one millisecond are summed to
//! answer the same as a block does after the cut. A caller opens the
//! exemplar again by merging that series over `[time_ms, time_ms + 1)`.

use crate::error::QueryError;
use crate::model::{LabelSet, TimeRange};

use super::timeline::step_count;

/// One step's heaviest profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileExemplar {
    /// When the profile was taken, unix ms.
    pub time_ms: i64,
    /// Its total, in the profile type's unit.
    pub value: i64,
    /// Its series' labels.
    pub labels: LabelSet,
}

impl ProfileExemplar {
    /// Whether this one is kept over `other`: the larger value, then the
    /// earlier time, then the smaller label set, so the answer does not
    /// depend on the order the head and blocks were visited in.
    fn outweighs(&self, value: i64, time_ms: i64, labels: &LabelSet) -> bool {
        (std::cmp::Reverse(self.value), self.time_ms, &self.labels)
            < (std::cmp::Reverse(value), time_ms, labels)
    }
}

/// Per step of a [`super::Timeline`] of the same range and step, the step's
/// heaviest profile; step `i` covers
/// `[start_ms + i * step_ms, start_ms + (i + 1) * step_ms)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepExemplars {
    /// Start of the first step, unix ms.
    pub start_ms: i64,
    /// Step length in ms.
    pub step_ms: i64,
    /// The heaviest profile per step, `None` where the step has none.
    pub steps: Vec<Option<ProfileExemplar>>,
}

impl StepExemplars {
    /// No exemplar yet, over `range` in steps of `step_ms` (checked as a
    /// timeline's are).
    pub fn new(range: TimeRange, step_ms: i64) -> Result<Self, QueryError> {
        let steps = step_count(range, step_ms)?;
        Ok(Self {
            start_ms: range.start_ms,
            step_ms,
            steps: vec![None; steps],
        })
    }

    /// Offers the profile of `labels` at `time_ms` weighing `value`; it is
    /// kept when it outweighs the step's current one (ignored outside the
    /// range). The labels are cloned only when kept.
    pub fn offer(&mut self, time_ms: i64, value: i64, labels: &LabelSet) {
        let offset = i128::from(time_ms) - i128::from(self.start_ms);
        if offset < 0 {
            return;
        }
        let step = offset / i128::from(self.step_ms);
        let Some(slot) = usize::try_from(step)
            .ok()
            .and_then(|s| self.steps.get_mut(s))
        else {
            return;
        };
        if slot
            .as_ref()
            .is_some_and(|kept| kept.outweighs(value, time_ms, labels))
        {
            return;
        }
        *slot = Some(ProfileExemplar {
            time_ms,
            value,
            labels: labels.clone(),
        });
    }

    /// Keeps, per step, the heavier of this and `other`'s exemplar.
    pub fn merge(&mut self, other: StepExemplars) -> Result<(), QueryError> {
        if other.start_ms != self.start_ms
            || other.step_ms != self.step_ms
            || other.steps.len() != self.steps.len()
        {
            return Err(QueryError::TimelineShape);
        }
        for (mine, theirs) in self.steps.iter_mut().zip(other.steps) {
            let Some(theirs) = theirs else { continue };
            if mine
                .as_ref()
                .is_some_and(|kept| kept.outweighs(theirs.value, theirs.time_ms, &theirs.labels))
            {
                continue;
            }
            *mine = Some(theirs);
        }
        Ok(())
    }
}

/// Offers one series' profiles: `(time_ms, total)` pairs in any order,
/// those at one millisecond summed first (see the module docs).
pub(crate) fn offer_series(
    into: &mut StepExemplars,
    labels: &LabelSet,
    mut profiles: Vec<(i64, i64)>,
) {
    profiles.sort_unstable_by_key(|&(time_ms, _)| time_ms);
    let mut rows = profiles.into_iter().peekable();
    while let Some((time_ms, mut total)) = rows.next() {
        while let Some(&(next_ms, more)) = rows.peek() {
            if next_ms != time_ms {
                break;
            }
            total = total.wrapping_add(more);
            rows.next();
        }
        into.offer(time_ms, total, labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Label;

    fn labels(env: &str) -> LabelSet {
        LabelSet::new(vec![Label::new("env", env)])
    }

    fn range(start_ms: i64, end_ms: i64) -> TimeRange {
        TimeRange { start_ms, end_ms }
    }

    #[test]
    fn each_step_keeps_its_heaviest_profile() {
        let mut exemplars = StepExemplars::new(range(0, 30), 10).expect("shape");
        exemplars.offer(1, 5, &labels("a"));
        exemplars.offer(2, 7, &labels("b"));
        exemplars.offer(3, 6, &labels("c"));
        exemplars.offer(25, 1, &labels("a"));
        exemplars.offer(30, 99, &labels("a"));
        exemplars.offer(-1, 99, &labels("a"));
        let kept: Vec<_> = exemplars
            .steps
            .iter()
            .map(|s| s.as_ref().map(|e| (e.time_ms, e.value, e.labels.clone())))
            .collect();
        assert_eq!(
            kept,
            vec![Some((2, 7, labels("b"))), None, Some((25, 1, labels("a")))]
        );
    }

    #[test]
    fn ties_resolve_the_same_whatever_the_order() {
        let offers = [(4, 7, "b"), (3, 7, "c"), (3, 7, "a"), (5, 2, "z")];
        let mut forward = StepExemplars::new(range(0, 10), 10).expect("shape");
        for (t, v, l) in offers {
            forward.offer(t, v, &labels(l));
        }
        let mut backward = StepExemplars::new(range(0, 10), 10).expect("shape");
        for (t, v, l) in offers.iter().rev() {
            backward.offer(*t, *v, &labels(l));
        }
        assert_eq!(forward, backward);
        assert_eq!(
            forward.steps[0]
                .as_ref()
                .map(|e| (e.time_ms, e.labels.clone())),
            Some((3, labels("a")))
        );
    }

    #[test]
    fn merging_keeps_the_heavier_per_step_and_checks_the_shape() {
        let mut left = StepExemplars::new(range(0, 20), 10).expect("shape");
        left.offer(1, 5, &labels("a"));
        left.offer(11, 9, &labels("a"));
        let mut right = StepExemplars::new(range(0, 20), 10).expect("shape");
        right.offer(2, 8, &labels("b"));
        right.offer(12, 3, &labels("b"));
        left.merge(right).expect("same shape");
        let values: Vec<_> = left.steps.iter().flatten().map(|e| e.value).collect();
        assert_eq!(values, vec![8, 9]);
        let other = StepExemplars::new(range(0, 30), 10).expect("shape");
        assert!(matches!(left.merge(other), Err(QueryError::TimelineShape)));
    }

    #[test]
    fn a_series_profiles_at_one_millisecond_are_one_profile() {
        let mut exemplars = StepExemplars::new(range(0, 10), 10).expect("shape");
        offer_series(&mut exemplars, &labels("a"), vec![(4, 3), (2, 5), (4, 4)]);
        let kept = exemplars.steps[0].as_ref().expect("an exemplar");
        assert_eq!((kept.time_ms, kept.value), (4, 7));
    }

    #[test]
    fn shapes_are_checked_as_timelines_are() {
        assert!(matches!(
            StepExemplars::new(range(0, 10), 0),
            Err(QueryError::InvalidStep { .. })
        ));
        assert!(matches!(
            StepExemplars::new(range(10, 10), 1),
            Err(QueryError::EmptyRange { .. })
        ));
    }
}

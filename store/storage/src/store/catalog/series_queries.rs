//! The questions other than merges: profile types, label names and values,
//! series, and per-step totals and exemplars, each gathered from every
//! head and block in the range ([`Store::visit_all`]).

use std::collections::BTreeSet;

use kiln_engine::model::{LabelSet, Matcher, ProfileType, Selector, TimeRange};
use kiln_engine::{
    CompiledMatcher, CompiledSelector, QueryError, Queryable, StepExemplars, Timeline,
    compile_matchers,
};

use super::peer_head::selector_matchers;
use super::read::{Listing, MAX_LISTED};
use crate::error::StorageError;
use crate::store::Store;

impl Store {
    /// Runs `list` on the head and every block in `range` and returns the
    /// union of what they list, sorted and without repeats: its first
    /// `limit` entries, and whether any were left out.
    ///
    /// Truncated while collected, after each head and block: the set held
    /// never passes `limit` entries plus one part's own list. Collecting
    /// every block's entries and truncating at the end held them all: a
    /// store with millions of series made any listing hold millions of
    /// label sets, whatever `limit` the client asked for.
    async fn sorted_union<C, T, F>(
        &self,
        range: TimeRange,
        scope: Vec<Matcher>,
        compile: impl FnOnce() -> Result<C, QueryError> + Send + 'static,
        list: F,
        limit: usize,
    ) -> Result<Listing<T>, StorageError>
    where
        C: Send + 'static,
        T: Ord + Send + 'static,
        F: Fn(&C, &dyn Queryable) -> Result<Vec<T>, QueryError> + Send + 'static,
    {
        let (all, truncated) = self
            .visit_all(
                range,
                scope,
                compile,
                || (BTreeSet::new(), false),
                move |c, q, (acc, truncated): &mut (BTreeSet<T>, bool)| {
                    acc.extend(list(c, q)?);
                    while acc.len() > limit {
                        acc.pop_last();
                        *truncated = true;
                    }
                    Ok(())
                },
            )
            .await?;
        Ok(Listing {
            entries: all.into_iter().collect(),
            truncated,
        })
    }

    /// Profile types with data in `range`, sorted.
    pub async fn profile_types(&self, range: TimeRange) -> Result<Vec<ProfileType>, StorageError> {
        Ok(self
            .sorted_union(
                range,
                Vec::new(),
                || Ok(()),
                move |(), q| Ok(q.profile_types(range)),
                MAX_LISTED,
            )
            .await?
            .entries)
    }

    /// Label names of series matching `matchers` in `range`, sorted; the
    /// first [`MAX_LISTED`].
    pub async fn label_names(
        &self,
        matchers: &[Matcher],
        range: TimeRange,
    ) -> Result<Vec<String>, StorageError> {
        Ok(self
            .label_names_within(matchers, range, MAX_LISTED)
            .await?
            .entries)
    }

    /// [`Store::label_names`], the first `limit`.
    pub async fn label_names_within(
        &self,
        matchers: &[Matcher],
        range: TimeRange,
        limit: usize,
    ) -> Result<Listing<String>, StorageError> {
        let matchers = matchers.to_vec();
        self.sorted_union(
            range,
            matchers.clone(),
            move || compile_matchers(&matchers),
            move |m: &Vec<CompiledMatcher>, q| q.label_names(m, range),
            limit,
        )
        .await
    }

    /// Values of label `name` among series matching `matchers`, sorted;
    /// the first [`MAX_LISTED`].
    pub async fn label_values(
        &self,
        name: &str,
        matchers: &[Matcher],
        range: TimeRange,
    ) -> Result<Vec<String>, StorageError> {
        Ok(self
            .label_values_within(name, matchers, range, MAX_LISTED)
            .await?
            .entries)
    }

    /// [`Store::label_values`], the first `limit`.
    pub async fn label_values_within(
        &self,
        name: &str,
        matchers: &[Matcher],
        range: TimeRange,
        limit: usize,
    ) -> Result<Listing<String>, StorageError> {
        let matchers = matchers.to_vec();
        let name = name.to_string();
        self.sorted_union(
            range,
            matchers.clone(),
            move || compile_matchers(&matchers),
            move |m: &Vec<CompiledMatcher>, q| q.label_values(&name, m, range),
            limit,
        )
        .await
    }

    /// Label sets of series matching `matchers` in `range`, sorted; the
    /// first [`MAX_LISTED`].
    pub async fn series(
        &self,
        matchers: &[Matcher],
        range: TimeRange,
    ) -> Result<Vec<LabelSet>, StorageError> {
        Ok(self
            .series_within(matchers, range, MAX_LISTED)
            .await?
            .entries)
    }

    /// [`Store::series`], the first `limit`.
    pub async fn series_within(
        &self,
        matchers: &[Matcher],
        range: TimeRange,
        limit: usize,
    ) -> Result<Listing<LabelSet>, StorageError> {
        let matchers = matchers.to_vec();
        self.sorted_union(
            range,
            matchers.clone(),
            move || compile_matchers(&matchers),
            move |m: &Vec<CompiledMatcher>, q| q.series(m, range),
            limit,
        )
        .await
    }

    /// Per-step totals of the selection.
    pub async fn timeline(
        &self,
        selector: &Selector,
        range: TimeRange,
        step_ms: i64,
    ) -> Result<Timeline, StorageError> {
        let selector = selector.clone();
        let timeline =
            Timeline::new(range, step_ms).map_err(|source| StorageError::Query { source })?;
        self.visit_all(
            range,
            selector_matchers(&selector),
            move || CompiledSelector::new(&selector),
            move || timeline.clone(),
            move |s, q, acc| q.timeline_into(s, range, acc),
        )
        .await
    }

    /// Per step of [`Store::timeline`]'s shape, the selection's heaviest
    /// single profile (a series at one millisecond).
    pub async fn exemplars(
        &self,
        selector: &Selector,
        range: TimeRange,
        step_ms: i64,
    ) -> Result<StepExemplars, StorageError> {
        let selector = selector.clone();
        let exemplars =
            StepExemplars::new(range, step_ms).map_err(|source| StorageError::Query { source })?;
        self.visit_all(
            range,
            selector_matchers(&selector),
            move || CompiledSelector::new(&selector),
            move || exemplars.clone(),
            move |s, q, acc| q.exemplars_into(s, range, acc),
        )
        .await
    }
}

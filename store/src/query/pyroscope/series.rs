//! `SelectSeries`: a selection's totals per time step, one series per
//! `group_by` value tuple, for Grafana's timelines.

use super::*;

/// The timeline step: `step` seconds, else the range / 100 (at least 10 s).
pub fn step_ms(step_seconds: f64, range: TimeRange) -> Result<i64, ApiError> {
    if step_seconds.is_nan() || step_seconds < 0.0 {
        return Err(ApiError::BadParameter {
            parameter: "step",
            message: format!("{step_seconds} is not a step in seconds"),
        });
    }
    // Saturating: a step past i64 ms is one bucket, as any step longer
    // than the range is.
    let ms = (step_seconds * 1000.0).round() as i64;
    Ok(if ms > 0 {
        ms
    } else {
        (range.end_ms.saturating_sub(range.start_ms) / 100).max(10_000)
    })
}

/// `SelectSeries`: totals per step, one series per `group_by` value tuple.
pub async fn select_series(
    store: &Store,
    request: q::SelectSeriesRequest,
) -> Result<q::SelectSeriesResponse, ApiError> {
    refuse_stack_trace_selector(request.stack_trace_selector.as_ref())?;
    let exemplar_request = ExemplarRequest::from_wire(request.exemplar_type)?;
    // Average: each step's mean profile total per series, as Pyroscope
    // does, so a gauge (heap in use, goroutines) scraped several times in a
    // step reads as its level, not as the level times the scrapes.
    let average = match request.aggregation {
        None => false,
        Some(a) if a == t::TimeSeriesAggregationType::Sum as i32 => false,
        Some(a) if a == t::TimeSeriesAggregationType::Average as i32 => true,
        Some(other) => {
            return Err(ApiError::BadParameter {
                parameter: "aggregation",
                message: format!("unknown aggregation {other}"),
            });
        }
    };
    let group_by = group_by_list(request.group_by)?;
    let range = range_ms(request.start, request.end)?;
    let step_ms = step_ms(request.step, range)?;
    let selector = selection(
        store,
        &request.profile_type_id,
        &request.label_selector,
        range,
    )
    .await?;
    let groups = if group_by.is_empty() {
        BTreeSet::from([Vec::new()])
    } else {
        series_groups(
            &store.series(&series_matchers(&selector), range).await?,
            &group_by,
        )?
    };
    let mut series = Vec::new();
    for values in groups {
        let group = group_selector(&selector, &group_by, &values);
        let timeline = store.timeline(&group, range, step_ms).await?;
        let exemplars = match exemplar_request {
            ExemplarRequest::Individual => Some(store.exemplars(&group, range, step_ms).await?),
            ExemplarRequest::None => None,
        };
        let step_values: Vec<f64> = if average {
            timeline.averages()
        } else {
            timeline.values.iter().map(|&v| v as f64).collect()
        };
        let points: Vec<t::Point> = step_values
            .iter()
            .enumerate()
            .filter(|&(i, v)| {
                *v != 0.0 || (average && timeline.profiles.get(i).is_some_and(|&n| n > 0))
            })
            .map(|(i, v)| t::Point {
                value: *v,
                // Within the range: the timeline has a bucket per step.
                timestamp: timeline
                    .start_ms
                    .saturating_add((i as i64).saturating_mul(timeline.step_ms)),
                // The same range and step as the timeline: step i is i.
                exemplars: exemplars
                    .as_ref()
                    .and_then(|e| wire_exemplar(e, i))
                    .into_iter()
                    .collect(),
            })
            .collect();
        if points.is_empty() {
            continue;
        }
        let labels = group_by
            .iter()
            .zip(values)
            .filter(|(_, value)| !value.is_empty())
            .map(|(name, value)| t::LabelPair {
                name: name.clone(),
                value,
            })
            .collect();
        series.push(t::Series { labels, points });
    }
    if let Some(limit) = request.limit.filter(|&l| l > 0) {
        let total = |s: &t::Series| s.points.iter().map(|p| p.value).sum::<f64>();
        series.sort_by(|a, b| total(b).total_cmp(&total(a)));
        series.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    Ok(q::SelectSeriesResponse { series })
}

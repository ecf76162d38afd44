use super::*;

#[test]
fn render_exposes_counters_drops_by_reason_and_rss() {
    let metrics = AgentMetrics::default();
    metrics.samples.add(42);
    metrics.add_drop("queue_full", 2);
    metrics.set_drop_total("stack_collision_user", 5);
    let text = metrics.render(Some((1024, 2048)));
    assert!(text.contains("kiln_agent_samples_total 42\n"));
    assert!(text.contains("kiln_agent_dropped_total{reason=\"queue_full\"} 2\n"));
    assert!(text.contains("kiln_agent_dropped_total{reason=\"stack_collision_user\"} 5\n"));
    assert!(text.contains("kiln_agent_resident_memory_bytes 1024\n"));
    assert!(text.contains(
        "# HELP kiln_agent_samples_total Samples of targeted processes counted in the kernel.\n\
         # TYPE kiln_agent_samples_total counter\n"
    ));
    assert!(text.contains("# TYPE kiln_agent_dropped_total counter\n"));
    assert!(text.contains("# TYPE kiln_agent_queue_length gauge\nkiln_agent_queue_length 0\n"));
    // Every sample line is `name{labels} value`, with a HELP and TYPE.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect("name and value");
        let name = series.split('{').next().unwrap_or(series);
        assert!(value.parse::<u64>().is_ok(), "{line}");
        assert!(text.contains(&format!("# TYPE {name} ")), "{line}");
    }
    assert_eq!(metrics.drops("queue_full"), 2);
}

#[test]
fn a_collector_without_progress_past_its_threshold_is_unhealthy() {
    let metrics = AgentMetrics::default();
    assert_eq!(metrics.collector_health(1_000_000), Ok(()), "not started");
    metrics.collector_stall_after_ms.set(60_000);
    metrics.collector_progress_unix_ms.set(1_000_000);
    assert_eq!(metrics.collector_health(1_059_000), Ok(()));
    assert_eq!(metrics.collector_health(1_061_000), Err(61_000));
    assert!(
        metrics
            .render(None)
            .contains("kiln_agent_collector_stalled 1\n")
    );
    metrics.collector_progress_unix_ms.set(unix_ms());
    assert!(
        metrics
            .render(None)
            .contains("kiln_agent_collector_stalled 0\n")
    );
}

#[test]
fn rss_is_parsed_from_proc_status() {
    let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
    assert_eq!(parse_rss(status), Some((1024 * 1024, 2048 * 1024)));
    assert_eq!(parse_rss("Name: x\n"), None);
}

//! A `ProfilingTarget`'s `samplingHz` is what its pods get. Two targets on
//! one node ask for 19 and 99 Hz; the agent runs with its default of 19 Hz,
//! so the 99 Hz target must raise the perf events' rate while the 19 Hz one
//! keeps its own share. Each pod's rate is measured in samples per second
//! of the CPU it used, and its profile's period must say the same.
//!
//! Needs what `cri_e2e.rs` needs; in CI a missing prerequisite fails.

use std::time::Duration;

use crate::SERIAL;
use crate::cri_hostile::{CpuMeter, NAMESPACE, PodNode, TARGETS_FILE, start_agent};
use crate::cri_node;

/// The two targets: (pod and `app` label, Hz).
const TARGETS: [(&str, u32); 2] = [("slow", 19), ("fast", 99)];

fn targets_json() -> String {
    let targets: Vec<String> = TARGETS
        .iter()
        .map(|(app, hz)| {
            format!(
                r#"{{"source":"{NAMESPACE}/{app}","namespace":"{NAMESPACE}","selector":{{"matchLabels":{{"app":"{app}"}}}},"requireAnnotation":false,"samplingHz":{hz}}}"#
            )
        })
        .collect();
    format!(r#"{{"version":1,"targets":[{}]}}"#, targets.join(","))
}

#[test]
fn two_targets_at_19_and_99_hz_are_each_sampled_at_their_own_rate() {
    if !cri_node::prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut node = PodNode::start();
    std::fs::write(node.work.path().join(TARGETS_FILE), targets_json()).expect("targets file");
    let pids: Vec<u32> = TARGETS
        .iter()
        .map(|(app, _)| node.run(app, &["/control"]))
        .collect();

    let meter = CpuMeter::start(&pids);
    let agent = start_agent(&node, Duration::from_secs(12), &["--frequency", "19"]);
    let run = agent.finish(Duration::from_secs(60));
    assert!(run.ok, "the agent failed: {}", run.log);
    assert!(
        run.log.contains("sampling rate of the perf events changes"),
        "the 99 Hz target raised the rate: {}",
        run.log
    );

    let mut rates = Vec::new();
    for (&pid, (app, hz)) in pids.iter().zip(TARGETS) {
        let own: Vec<_> = run
            .samples()
            .filter(|s| s.labels.get("pid") == Some(&pid.to_string()))
            .collect();
        let count: i64 = own.iter().map(|s| s.count).sum();
        let cpu_ns: i64 = own.iter().map(|s| s.cpu_ns).sum();
        let used = meter.used(pid).as_secs_f64();
        let per_cpu_second = count as f64 / used;
        // The profile's own rate: samples per second of the CPU it reports.
        let profile_hz = count as f64 / (cpu_ns as f64 / 1e9);
        eprintln!(
            "target {app} ({hz} Hz, pid {pid}): {count} samples in {used:.2} CPU-s = \
             {per_cpu_second:.1} per CPU-second; its profile's period says {profile_hz:.1} Hz"
        );
        assert!(count > 0, "pod {app} was profiled");
        rates.push((per_cpu_second, profile_hz));
    }
    let (slow, fast) = (rates[0], rates[1]);
    // The base is 99 Hz; the slow target keeps one sample in round(99/19)
    // = 5, 19.8 Hz. The first moments of the run, before discovery, sample
    // neither pod, so the measured rates sit a little below: the ratio is
    // the sharp check, and each rate must be on the right side of the other
    // target's.
    let ratio = fast.0 / slow.0;
    eprintln!("fast / slow = {ratio:.2} (5 expected)");
    assert!((3.5..=7.0).contains(&ratio), "fast / slow = {ratio:.2}");
    assert!(fast.0 > 50.0, "the 99 Hz target got {:.1} Hz", fast.0);
    assert!(slow.0 < 30.0, "the 19 Hz target got {:.1} Hz", slow.0);
    assert!(
        (slow.1 - 99.0 / 5.0).abs() < 0.5 && (fast.1 - 99.0).abs() < 0.5,
        "the profiles' periods say {:.1} and {:.1} Hz",
        slow.1,
        fast.1
    );
}

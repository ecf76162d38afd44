//! One group's samples of a window made into the profile to ship: each
//! process's stacks symbolized with its snapshot, the runtimes' frames put
//! in place, and the profile labelled with the group's busiest runtime.

use std::collections::{BTreeMap, HashMap};

use kiln_contract::labels as label;

use super::{Collector, Snapshots};
use crate::abi::SampleKind;
use crate::aggregate::{GroupKey, StackSample};
use crate::language::{self, Language};
use crate::profile_build::{self, OFF_CPU_PROFILE_NAME, PROFILE_NAME, ResolvedSample, WindowMeta};
use crate::sample_source::SampleSource;
use crate::ship::ShipItem;
use crate::symbolize::{Frame, SymbolizationStats};
use crate::target_set::TargetSource;

impl<S: TargetSource, K: SampleSource> Collector<S, K> {
    pub(super) fn build_group(
        &mut self,
        (kind, group): (SampleKind, GroupKey),
        samples: &[StackSample],
        snapshots: &Snapshots,
        start_unix_ns: i64,
        duration_ns: i64,
        stats: &mut SymbolizationStats,
    ) -> ShipItem {
        // Symbolize per process: snapshots are per process.
        let mut by_process: BTreeMap<(u32, u64), Vec<&StackSample>> = BTreeMap::new();
        for sample in samples {
            by_process
                .entry((sample.pid, sample.start_boottime_ns))
                .or_default()
                .push(sample);
        }
        let mut resolved = Vec::with_capacity(samples.len());
        // Samples per runtime; the group is labelled with the busiest one.
        let mut languages: HashMap<Language, u64> = HashMap::new();
        for ((pid, start), process_samples) in by_process {
            let snapshot = snapshots.get(&(pid, start)).cloned().flatten();
            // Python frames are named by the Python unwinder; the rest by
            // the symbolizer, then put back in place.
            let native_stacks: Vec<Vec<u64>> = process_samples
                .iter()
                .map(|s| crate::v8::frames::native_entries(&s.user))
                .collect();
            let user_stacks: Vec<&[u64]> = native_stacks.iter().map(Vec::as_slice).collect();
            let native_frames =
                self.symbolizer
                    .user_frames(snapshot.as_deref(), &user_stacks, stats);
            let user_frames: Vec<Vec<Frame>> = process_samples
                .iter()
                .zip(native_frames)
                .map(|(sample, native)| {
                    let python = crate::v8::frames::without_js(&sample.user);
                    let woven = self.weave_python_frames(&python, native);
                    crate::v8::weave_frames(self.v8.as_ref(), &sample.user, woven)
                })
                .collect();
            let language = snapshot
                .as_ref()
                .map_or(Language::Native, |s| language::detect(&s.maps));
            *languages.entry(language).or_default() +=
                process_samples.iter().map(|s| s.count).sum::<u64>();
            let comm = snapshot
                .as_ref()
                .map(|s| s.comm.clone())
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| process_samples[0].comm.clone());
            for (sample, user) in process_samples.into_iter().zip(user_frames) {
                let mut frames = self.symbolizer.kernel_frames(&sample.kernel, stats);
                if kind == SampleKind::OffCpu {
                    trim_tracing_frames(&mut frames);
                }
                frames.extend(user);
                resolved.push(ResolvedSample {
                    pid: sample.pid,
                    tid: sample.tid,
                    comm: comm.clone(),
                    language: language.label(),
                    frames,
                    count: sample.count,
                    off_cpu_ns: sample.off_cpu_ns,
                });
            }
        }
        let first = samples.first();
        let entry = first.and_then(|s| self.targets.entry_for(s.pid, s.cgroup_id));
        // The share at the base rate of the window's end: a window in which
        // the base changed is weighed at the new one.
        let base_hz = self.sampler.base_hz();
        let keep_one_in = self.config.rates.keep_one_in(entry, base_hz);
        let meta = WindowMeta {
            period_ns: profile_build::period_ns(base_hz, keep_one_in),
            start_unix_ns,
            duration_ns,
            node: self.config.node.clone(),
            record_tid: self.config.record_tid,
        };
        let (profile, name, prefix) = match kind {
            SampleKind::Cpu => (
                profile_build::build_profile(&meta, &resolved),
                PROFILE_NAME,
                "cpu",
            ),
            SampleKind::OffCpu => (
                profile_build::build_off_cpu_profile(&meta, &resolved),
                OFF_CPU_PROFILE_NAME,
                "offcpu",
            ),
        };
        let pprof_gzip = kiln_pprof::encode_gzip(&profile);

        let mut labels: BTreeMap<String, String> =
            entry.map(|e| e.labels.clone()).unwrap_or_default();
        labels.insert(label::PROFILE_NAME.to_owned(), name.to_owned());
        if let Some((language, _)) = languages
            .iter()
            .max_by_key(|(l, n)| (**n, std::cmp::Reverse(**l)))
        {
            labels.insert(label::LANGUAGE.to_owned(), language.label().to_owned());
        }
        labels.insert(label::NODE.to_owned(), self.config.node.clone());
        // A process's `pid` and `comm` are on its samples only: as series
        // labels they would make a series per process, and one fork-heavy
        // pod would spend the store's series limits for every other pod.
        let stem = match group {
            GroupKey::Process {
                pid,
                start_boottime_ns,
            } => {
                format!(
                    "{prefix}-{}-pid{pid}-{start_boottime_ns}",
                    start_unix_ns / 1_000_000
                )
            }
            GroupKey::Cgroup { cgroup_id } => {
                format!("{prefix}-{}-cgroup{cgroup_id}", start_unix_ns / 1_000_000)
            }
        };
        ShipItem {
            labels: labels.into_iter().collect(),
            pprof_gzip,
            file_stem: stem,
        }
    }
}

/// Drops the tracepoint's own frames from the top of an off-CPU kernel
/// stack. The BPF program skips the two it always has; when another tracer
/// shares `sched_switch` (a second profiler, perf), the kernel calls the
/// probes through `__traceiter_sched_switch`, one frame more, which would
/// lead every off-CPU stack instead of the scheduler.
fn trim_tracing_frames(frames: &mut Vec<crate::symbolize::Frame>) {
    let tracing = frames
        .iter()
        .take_while(|frame| {
            frame.function.as_deref().is_some_and(|name| {
                name.starts_with("__traceiter_")
                    || name.starts_with("__bpf_trace_")
                    || name.starts_with("bpf_trace_run")
            })
        })
        .count();
    frames.drain(..tracing);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn named(name: &str) -> Frame {
        Frame {
            address: 0,
            mapping: None,
            function: Some(Arc::from(name)),
            file: None,
            line: 0,
        }
    }

    #[test]
    fn a_shared_tracepoints_frames_leave_the_top_of_an_off_cpu_stack() {
        let mut frames = vec![
            named("__traceiter_sched_switch"),
            named("__schedule"),
            named("schedule"),
        ];
        trim_tracing_frames(&mut frames);
        let names: Vec<_> = frames.iter().filter_map(|f| f.function.clone()).collect();
        assert_eq!(names, vec![Arc::from("__schedule"), Arc::from("schedule")]);
        let mut plain = vec![named("__schedule"), named("__traceiter_x")];
        trim_tracing_frames(&mut plain);
        assert_eq!(plain.len(), 2, "only leading frames go");
    }
}

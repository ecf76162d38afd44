//! Off-CPU capture rate: the one-in-N of targeted blocks the kernel
//! captures, set from the block rate so the capture cost per second stays
//! bounded and each capture's weight (N) keeps the estimate unbiased.

use std::time::{Duration, Instant};

use super::Collector;
use crate::abi::KernelCounter;
use crate::sample_source::{SampleSource, SamplerError};
use crate::target_set::TargetSource;

/// Off-CPU: the one-in-N to capture targeted blocks by when they come at
/// `blocks_per_cpu_second`, so that on average half the per-CPU budget
/// `captures_per_cpu_second` is used (the other half absorbs bursts before
/// the kernel's hard cap drops blocks unweighed).
pub fn off_cpu_keep_one_in(blocks_per_cpu_second: f64, captures_per_cpu_second: u32) -> u32 {
    let wanted = (f64::from(captures_per_cpu_second) / 2.0).max(1.0);
    let ratio = (blocks_per_cpu_second / wanted).ceil();
    if ratio.is_finite() && ratio > 1.0 {
        // Saturating: a rate past u32::MAX blocks per second is not real.
        ratio.min(f64::from(u32::MAX)) as u32
    } else {
        1
    }
}

/// The kernel's total of chosen blocks at the last look, and the one-in-N
/// they were chosen by since, to rate the next look from.
#[derive(Debug, Clone, Copy)]
pub(super) struct OffCpuRate {
    pub(super) chosen: u64,
    pub(super) keep_one_in: u32,
    pub(super) at: Instant,
}

/// How often the off-CPU block rate is looked at (and the one-in-N set):
/// often, because until N rises a burst of blocks meets the kernel's hard
/// cap, where blocks are dropped unweighed.
const OFF_CPU_LOOK_INTERVAL: Duration = Duration::from_millis(500);

impl<S: TargetSource, K: SampleSource> Collector<S, K> {
    /// Every [`OFF_CPU_LOOK_INTERVAL`] (off-CPU on): reads the kernel's
    /// chosen-block total and adapts the one-in-N to it.
    pub(super) fn look_at_off_cpu_rate(&mut self) -> Result<(), SamplerError> {
        let (Some(captures), Some(last)) = (
            self.config.off_cpu_captures_per_cpu_second,
            self.off_cpu_rate,
        ) else {
            return Ok(());
        };
        if last.at.elapsed() < OFF_CPU_LOOK_INTERVAL {
            return Ok(());
        }
        let chosen = self
            .sampler
            .kernel_counters()?
            .into_iter()
            .find_map(|(counter, total)| (counter == KernelCounter::OffCpuBlocks).then_some(total))
            .unwrap_or(last.chosen);
        self.adapt_off_cpu_keep_one_in(captures, last, chosen)
    }

    /// Off-CPU: sets the one-in-N of captured blocks from the targeted
    /// block rate since the `last` look (the kernel's total of chosen
    /// blocks is now `chosen`; each stood for the N then in force), so the
    /// capture cost per second stays bounded and each capture's weight
    /// unbiased.
    fn adapt_off_cpu_keep_one_in(
        &mut self,
        captures: u32,
        last: OffCpuRate,
        chosen: u64,
    ) -> Result<(), SamplerError> {
        let now = Instant::now();
        let seconds = now.duration_since(last.at).as_secs_f64();
        let cpus = self.sampler.attached_cpu_count().max(1) as f64;
        let since = chosen
            .saturating_sub(last.chosen)
            .saturating_mul(u64::from(last.keep_one_in));
        self.off_cpu_blocks = self.off_cpu_blocks.saturating_add(since);
        self.metrics.off_cpu_blocks.set(self.off_cpu_blocks);
        let blocks = since as f64;
        let keep_one_in = off_cpu_keep_one_in(blocks / seconds / cpus, captures);
        // Rated from here on; the old N stays in force if the write fails.
        self.off_cpu_rate = Some(OffCpuRate {
            chosen,
            keep_one_in: last.keep_one_in,
            at: now,
        });
        self.sampler.set_off_cpu_keep_one_in(keep_one_in)?;
        self.off_cpu_rate = Some(OffCpuRate {
            chosen,
            keep_one_in,
            at: now,
        });
        self.metrics.off_cpu_keep_one_in.set(u64::from(keep_one_in));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::off_cpu_keep_one_in;

    #[test]
    fn off_cpu_keeps_every_block_until_the_rate_passes_half_the_budget() {
        assert_eq!(off_cpu_keep_one_in(0.0, 100), 1);
        assert_eq!(off_cpu_keep_one_in(50.0, 100), 1);
        assert_eq!(off_cpu_keep_one_in(51.0, 100), 2);
        assert_eq!(off_cpu_keep_one_in(50_000.0, 100), 1000);
        assert_eq!(off_cpu_keep_one_in(f64::NAN, 100), 1);
        assert_eq!(off_cpu_keep_one_in(1e30, 1), u32::MAX);
    }
}

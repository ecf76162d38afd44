//! Kiln's node agent: samples on-CPU stacks with eBPF, aggregates them in
//! the kernel per (pid, cgroup, user stack, kernel stack), symbolizes them on
//! the node and ships one pprof per target and window.
//!
//! Pure logic (testable without privileges): [`abi`], [`aggregate`],
//! [`proc_maps`], [`kallsyms`], [`profile_build`], [`target_set`],
//! [`bounded_cache`], the queue and backoff in [`ship`], [`metrics`]
//! rendering and [`preflight`] checks. IO: [`sampler`] (aya; the collector sees it through
//! [`sample_source::SampleSource`], so tests can feed recorded samples), [`process_info`]
//! (`/proc`), [`symbolize`] (blazesym), [`ship`] sinks (files, tonic),
//! [`collector`] (the thread tying them together), [`scrape`] (pprof endpoints;
//! its `delta` module is pure).

pub mod abi;
pub mod aggregate;
pub mod bounded_cache;
pub mod cli_targets;
pub mod collector;
pub mod cri_discovery;
pub mod elf_symbols;
pub mod frame_table;
pub mod go_pclntab;
pub mod hotspot;
pub mod kallsyms;
pub mod language;
pub mod metrics;
pub mod perf_map;
pub mod preflight;
pub mod proc_maps;
pub mod process_info;
pub mod profile_build;
pub mod python;
pub mod ruby;
pub mod runtime_elf;
pub mod runtime_processes;
pub mod safe_open;
pub mod sample_source;
pub mod sampler;
pub mod scrape;
pub mod ship;
pub mod symbol_index;
pub mod symbol_objects;
pub mod symbolize;
pub mod target_set;
pub mod unwind;
pub mod unwind_info;
pub mod v8;

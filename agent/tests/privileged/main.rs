//! The real agent on the real machine: the `kiln-agent` binary samples real
//! programs on the real kernel ([`sampling`], [`unwinding`], [`python_frames`],
//! [`off_cpu`]), and
//! runs in Kubernetes mode against pods on a real containerd ([`cri_e2e`],
//! [`cri_python`], [`cri_hostile_pods`], [`cri_hostile_runtimes`], [`cri_same_path`],
//! [`cri_rates`]); [`store_symbols`] has a real store name a stripped
//! program's frames from a real debuginfod; [`python_offsets`] checks the
//! CPython offsets table against the interpreters' own headers.
//!
//! Most need root, BTF, gcc and, for the CRI tests, containerd. In CI
//! (`CI=true`) a missing prerequisite fails the test; elsewhere the test
//! prints why it is skipped.
//!
//! They are one test target because they share one harness: running the
//! agent and reading its pprof ([`agent_run`]), a containerd with pods
//! ([`cri_node`], [`cri_hostile`]), the Python program and what its profile
//! must show ([`python_program`]), and where the CPython interpreters are
//! ([`interpreters`]). Run one room with a filter, e.g.
//! `cargo test -p kiln-agent --test privileged python_frames::`.

mod agent_run;
mod cri_hostile;
mod cri_node;
mod interpreters;
mod python_program;

mod cri_e2e;
mod cri_hostile_pods;
mod cri_hostile_runtimes;
mod cri_python;
mod cri_rates;
mod cri_same_path;
mod java_frames;
mod node_frames;
mod off_cpu;
mod python_forky;
mod python_frames;
mod python_offsets;
mod ruby_frames;
mod sampling;
mod store_symbols;
mod unwinding;

use std::sync::Mutex;

/// Every test here that samples, or starts containerd, holds this lock: they
/// compete for the machine's cores, and a test that samples counts on its
/// workload getting the CPU.
pub static SERIAL: Mutex<()> = Mutex::new(());

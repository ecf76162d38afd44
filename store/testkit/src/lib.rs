//! Kiln's test kit: the helpers that more than one test crate or test file
//! needs, in one place. It is a dev-dependency only; no shipped crate may
//! import it (`.ci/crate-boundaries` checks).
//!
//! - [`prerequisites`]: the house rule for missing tools (skip visibly
//!   outside CI, fail under `CI=true`); [`tools`] finds node, Go and the
//!   tools directory, [`binaries`] the binaries cargo built.
//! - [`process`]: guards that end child processes when a test ends.
//! - [`store_process`]: a real `kiln-store` on a free loopback port.
//! - [`http`]: free ports and a minimal HTTP/1.1 client; [`silent_address`]:
//!   a loopback address whose connects hang, as a dead pod's address does.
//! - [`clock`]: the wall clock in seconds, milliseconds and nanoseconds.
//! - [`debuginfod`]: a C program split into a stripped copy and its debug
//!   file, and a real `debuginfod` serving that file.
//! - [`fixtures`]: the real fixtures in `../shared/testdata`, when present.
//! - [`moto`]: a pausable `moto_server` (S3); [`seaweedfs`]: a real
//!   distributed object store (SeaweedFS's S3 gateway); [`buckets`]: buckets that
//!   fail on request; [`memory_cgroup`]: a memory cgroup to run a store in.
//! - [`go_programs`]: Go programs built and run for real `runtime/pprof`
//!   profiles; [`recorder`]: a listener that keeps what a real client sends;
//!   [`grafana_client`]: Grafana's own Go querier client, run against a
//!   store.
//! - [`prometheus`]: a real Prometheus server, built from source, scraping
//!   a store.
//! - [`real_inputs`]: real inputs made at test time, the twins of the
//!   `../shared` fixtures: Go `runtime/pprof` profiles of every kind, `perf`
//!   recordings and their folded stacks, a Java Flight Recorder file.
//! - With the `engine` feature, [`blocks`]: engine blocks for compaction
//!   tests; [`service_profiles`]: large profiles shaped like a service's; with `storage`, [`profiles`]: synthetic profiles and `Store`
//!   helpers.
//! - [`wire`]: gzip and protobuf varints for hand-made hostile bodies.

pub mod binaries;
#[cfg(feature = "engine")]
pub mod blocks;
pub mod buckets;
pub mod clock;
pub mod debuginfod;
pub mod fixtures;
pub mod go_programs;
pub mod grafana_client;
pub mod http;
pub mod memory_cgroup;
pub mod moto;
pub mod prerequisites;
pub mod process;
#[cfg(feature = "storage")]
pub mod profiles;
pub mod prometheus;
pub mod prometheus_api_client;
pub mod real_inputs;
pub mod recorder;
#[cfg(feature = "engine")]
pub mod rule_profiles;
pub mod seaweedfs;
#[cfg(feature = "engine")]
pub mod service_profiles;
pub mod silent_address;
pub mod store_process;
pub mod tools;
pub mod wire;

//! Rootless tests on this test process's own stack: it captures its
//! registers and the top of its stack the way the BPF program copies a
//! sampled thread's ([`capture`]), and feeds them to the `.eh_frame`
//! unwinder ([`unwind_snapshots`]) and to the whole collector
//! ([`collector_recorded`]). They are one test target because they share
//! the capture.

mod capture;

mod collector_recorded;
mod unwind_snapshots;

//! A Java Flight Recorder file: the JVM records `programs/JfrSpin.java`.
//! Profilers such as async-profiler write this format too; Pyroscope
//! accepts it at `/ingest?format=jfr`. It is not pprof.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{program, run, tool};

/// Records the Java program (about a third of a second of work, plus the
/// JVM's start) into `dir/recording.jfr` and returns its path. `None`
/// (after the house rule) without `java`.
pub fn record_jfr(dir: &Path) -> Option<PathBuf> {
    tool("java", &["-version"], "a JDK, openjdk-17-jdk-headless")?;
    let recording = dir.join("recording.jfr");
    let mut option =
        std::ffi::OsString::from("-XX:StartFlightRecording=settings=profile,filename=");
    option.push(&recording);
    run(
        Command::new("java")
            .arg(option)
            .arg(program("JfrSpin.java"))
            .env("HOME", dir)
            .current_dir(dir),
        "java with the flight recorder",
    );
    Some(recording)
}

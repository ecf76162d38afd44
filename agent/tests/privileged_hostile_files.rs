//! Privileged tests of the agent against hostile processes (audit G1, G2,
//! G4): JIT-like processes in their own roots (chroot) whose perf map is a
//! FIFO, a symlink to a file outside their root, or a 2 GB file; a
//! process with 60,000 mapped files; a 1 GB executable claiming millions of
//! symbols; and a fork storm. Each is profiled next to a well-behaved
//! process. The agent must finish on time, keep profiling the well-behaved
//! process, never read the file outside the root, and stay within a bounded
//! peak RSS and number of open files.
//!
//! Needs root and gcc with a static libc; in CI a missing prerequisite fails.

#[path = "privileged_harness/agent_run.rs"]
mod agent_run;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_run::{KillOnDrop, SERIAL, flatten, privileged_prerequisites};
use kiln_pprof::DecodeLimits;

fn compile(source: &str, output: &Path, extra: &[&str]) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(source);
    let status = Command::new("gcc")
        .args(["-O1", "-fno-omit-frame-pointer"])
        .args(extra)
        .arg("-o")
        .arg(output)
        .arg(&source)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed on {}", source.display());
}

/// A root holding the static JIT workload, running under chroot.
fn jail(dir: &Path, name: &str, jit: &Path) -> (PathBuf, KillOnDrop) {
    let root = dir.join(name);
    std::fs::create_dir_all(root.join("tmp")).expect("root/tmp");
    std::fs::copy(jit, root.join("jit")).expect("copy workload");
    let child = Command::new("chroot")
        .arg(&root)
        .arg("/jit")
        .stdout(Stdio::null())
        .spawn()
        .expect("chroot starts");
    (root, KillOnDrop(child))
}

/// Waits for `child` with `wait4`, so its own peak RSS comes back; kills it
/// after `limit`. Returns (exited successfully, peak RSS KiB, elapsed).
fn wait_with_rusage(child: &mut std::process::Child, limit: Duration) -> (bool, i64, Duration) {
    let start = Instant::now();
    let pid = i32::try_from(child.id()).expect("pid");
    loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value to overwrite.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 on our own child with valid out-pointers.
        let waited = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if waited == pid {
            let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
            return (ok, usage.ru_maxrss, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            return (false, 0, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn hostile_perf_maps_neither_hang_nor_bloat_nor_leak_host_files() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let jit = dir.path().join("jit_spin");
    compile("jit_spin.c", &jit, &["-static"]);
    let control_bin = dir.path().join("control_spin");
    compile("control_spin.c", &control_bin, &[]);

    // A FIFO where the perf map should be: opening must not block.
    let (fifo_root, fifo_proc) = jail(dir.path(), "fifo", &jit);
    let fifo_path = fifo_root.join(format!("tmp/perf-{}.map", fifo_proc.0.id()));
    let fifo_c = std::ffi::CString::new(fifo_path.to_str().expect("utf-8")).expect("path");
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo_c.as_ptr(), 0o600) }, 0);

    // A symlink to a host file that names every address.
    let host_file = dir.path().join("host-secret.map");
    std::fs::write(&host_file, "0 7fffffffffff kiln_escaped_host_file\n").expect("host file");
    let (link_root, link_proc) = jail(dir.path(), "symlink", &jit);
    std::os::unix::fs::symlink(
        &host_file,
        link_root.join(format!("tmp/perf-{}.map", link_proc.0.id())),
    )
    .expect("symlink");

    // A 2 GB perf map: 1M valid lines (above any user address, so the first
    // line still names the JIT code), then a sparse tail.
    let (big_root, big_proc) = jail(dir.path(), "big", &jit);
    let big_path = big_root.join(format!("tmp/perf-{}.map", big_proc.0.id()));
    {
        let mut big = std::io::BufWriter::new(std::fs::File::create(&big_path).expect("big map"));
        writeln!(big, "0 7fffffffffff kiln_big_jit").expect("write");
        for i in 0..1_000_000u64 {
            writeln!(
                big,
                "{:x} 10 kiln_filler_{i}",
                0xffff_8000_0000_0000u64 + i * 16
            )
            .expect("write");
        }
        big.into_inner()
            .expect("flush")
            .set_len(2 << 30)
            .expect("sparse 2 GB");
    }

    let control = KillOnDrop(
        Command::new(&control_bin)
            .stdout(Stdio::null())
            .spawn()
            .expect("control starts"),
    );
    std::thread::sleep(Duration::from_millis(300));
    let out = dir.path().join("profiles");
    let mut agent = Command::new(env!("CARGO_BIN_EXE_kiln-agent"));
    for pid in [
        fifo_proc.0.id(),
        link_proc.0.id(),
        big_proc.0.id(),
        control.0.id(),
    ] {
        agent.arg("--pid").arg(pid.to_string());
    }
    let mut agent = agent
        .args([
            "--frequency",
            "99",
            "--drain-interval",
            "3s",
            "--duration",
            "12s",
        ])
        .args(["--metrics-addr", "off", "--output-dir"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent starts");
    let (ok, peak_kib, elapsed) = wait_with_rusage(&mut agent, Duration::from_secs(90));
    let mut stderr = String::new();
    if let Some(mut pipe) = agent.stderr.take() {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut stderr);
    }
    eprintln!(
        "agent finished={ok} in {elapsed:?}, peak RSS {} MiB",
        peak_kib / 1024
    );
    assert!(ok, "the agent hung or failed within 90 s: {stderr}");

    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(&out).expect("profiles") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "gz") {
            let bytes = std::fs::read(&path).expect("readable");
            profiles
                .push(kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("valid pprof"));
        }
    }
    let samples = flatten(&profiles);
    let count_for = |pid: u32| -> i64 {
        samples
            .iter()
            .filter(|s| s.labels.get("pid") == Some(&pid.to_string()))
            .map(|s| s.count)
            .sum()
    };
    let control_hot: i64 = samples
        .iter()
        .filter(|s| s.frames.iter().any(|(_, f)| f == "kiln_hostile_control"))
        .map(|s| s.count)
        .sum();
    eprintln!(
        "samples: fifo {} symlink {} big {} control {} (in kiln_hostile_control: {control_hot})",
        count_for(fifo_proc.0.id()),
        count_for(link_proc.0.id()),
        count_for(big_proc.0.id()),
        count_for(control.0.id())
    );
    assert!(
        control_hot >= 100,
        "the well-behaved process was still profiled"
    );
    for pid in [fifo_proc.0.id(), link_proc.0.id(), big_proc.0.id()] {
        assert!(count_for(pid) >= 50, "pid {pid} was profiled");
    }
    assert!(
        !samples
            .iter()
            .any(|s| s.frames.iter().any(|(_, f)| f == "kiln_escaped_host_file")),
        "a perf map outside the process's root was read"
    );
    // The 2 GB map is read up to the 64 MiB cap: its first line names the code.
    assert!(
        samples
            .iter()
            .any(|s| s.frames.iter().any(|(_, f)| f == "kiln_big_jit")),
        "the capped prefix of the big map is used"
    );
    assert!(peak_kib < 128 * 1024, "peak RSS {} MiB", peak_kib / 1024);
}

#[test]
fn a_process_with_sixty_thousand_mapped_files_cannot_exhaust_descriptors() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let many_bin = dir.path().join("many_mappings");
    compile("many_mappings.c", &many_bin, &[]);
    let control_bin = dir.path().join("control_spin");
    compile("control_spin.c", &control_bin, &[]);
    let objects = dir.path().join("objects");
    std::fs::create_dir(&objects).expect("objects dir");
    let many = KillOnDrop(
        Command::new(&many_bin)
            .arg(&objects)
            .arg("60000")
            .stdout(Stdio::null())
            .spawn()
            .expect("workload starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while !objects.join("ready").exists() {
        assert!(
            Instant::now() < deadline,
            "the workload never mapped its files"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let control = KillOnDrop(
        Command::new(&control_bin)
            .stdout(Stdio::null())
            .spawn()
            .expect("control starts"),
    );
    let out = dir.path().join("profiles");
    let budget = 512;
    let mut agent = Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
        .args([
            "--pid",
            &many.0.id().to_string(),
            "--pid",
            &control.0.id().to_string(),
        ])
        .args([
            "--frequency",
            "99",
            "--drain-interval",
            "3s",
            "--duration",
            "12s",
        ])
        .args(["--max-open-files", &budget.to_string()])
        .args(["--metrics-addr", "off", "--output-dir"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent starts");
    // Watch the agent's descriptors while it runs.
    let agent_fds = format!("/proc/{}/fd", agent.id());
    let mut most_fds = 0;
    let watch_until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < watch_until {
        if let Ok(entries) = std::fs::read_dir(&agent_fds) {
            most_fds = most_fds.max(entries.count());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let (ok, peak_kib, elapsed) = wait_with_rusage(&mut agent, Duration::from_secs(120));
    let mut stderr = String::new();
    if let Some(mut pipe) = agent.stderr.take() {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut stderr);
    }
    eprintln!(
        "agent finished={ok} in {elapsed:?}, peak RSS {} MiB, most open descriptors {most_fds}",
        peak_kib / 1024
    );
    assert!(ok, "the agent hung or failed: {stderr}");
    assert!(
        most_fds <= budget + 256,
        "{most_fds} descriptors open, budget {budget}"
    );
    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(&out).expect("profiles") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "gz") {
            let bytes = std::fs::read(&path).expect("readable");
            profiles
                .push(kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("valid pprof"));
        }
    }
    let samples = flatten(&profiles);
    let named = |function: &str| -> i64 {
        samples
            .iter()
            .filter(|s| s.frames.iter().any(|(_, f)| f == function))
            .map(|s| s.count)
            .sum()
    };
    let (control_hot, many_hot) = (
        named("kiln_hostile_control"),
        named("kiln_many_mappings_spin"),
    );
    eprintln!(
        "samples in kiln_hostile_control {control_hot}, in kiln_many_mappings_spin {many_hot}"
    );
    assert!(
        control_hot >= 100,
        "the well-behaved process was still profiled"
    );
    assert!(
        many_hot >= 100,
        "the process with 60,000 mappings was profiled and symbolized"
    );
    assert!(peak_kib < 256 * 1024, "peak RSS {} MiB", peak_kib / 1024);
}

#[test]
fn a_fork_storm_does_not_stop_the_agent_profiling_the_host() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let storm_bin = dir.path().join("fork_storm");
    compile("fork_storm.c", &storm_bin, &["-static"]);
    let control_bin = dir.path().join("control_spin");
    compile("control_spin.c", &control_bin, &[]);
    let control = KillOnDrop(
        Command::new(&control_bin)
            .stdout(Stdio::null())
            .spawn()
            .expect("control starts"),
    );
    let out = dir.path().join("profiles");
    let mut agent = Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
        .args([
            "--all",
            "--frequency",
            "99",
            "--drain-interval",
            "3s",
            "--duration",
            "14s",
        ])
        .args(["--metrics-addr", "off", "--output-dir"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent starts");
    std::thread::sleep(Duration::from_secs(2));
    // One forker per core: as many processes a second as this machine makes.
    let storms: Vec<std::process::Child> = (0..2)
        .map(|_| {
            Command::new(&storm_bin)
                .arg("10")
                .stdout(Stdio::piped())
                .spawn()
                .expect("the storm runs")
        })
        .collect();
    let forked: u64 = storms
        .into_iter()
        .map(|storm| {
            let output = storm.wait_with_output().expect("the storm ends");
            String::from_utf8_lossy(&output.stdout)
                .trim()
                .parse::<u64>()
                .unwrap_or(0)
        })
        .sum();
    let (ok, peak_kib, elapsed) = wait_with_rusage(&mut agent, Duration::from_secs(120));
    let mut stderr = String::new();
    if let Some(mut pipe) = agent.stderr.take() {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut stderr);
    }
    eprintln!(
        "{forked} processes forked in 10 s ({} a second); agent finished={ok} in {elapsed:?}, peak RSS {} MiB",
        forked / 10,
        peak_kib / 1024
    );
    assert!(ok, "the agent hung or failed: {stderr}");
    assert!(forked > 20_000, "the storm forked only {forked} processes");
    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(&out).expect("profiles") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "gz") {
            let bytes = std::fs::read(&path).expect("readable");
            profiles
                .push(kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("valid pprof"));
        }
    }
    let samples = flatten(&profiles);
    let control_pid = control.0.id().to_string();
    let control_hot: i64 = samples
        .iter()
        .filter(|s| s.labels.get("pid") == Some(&control_pid))
        .filter(|s| s.frames.iter().any(|(_, f)| f == "kiln_hostile_control"))
        .map(|s| s.count)
        .sum();
    eprintln!("control samples in kiln_hostile_control: {control_hot}");
    assert!(
        control_hot >= 100,
        "the well-behaved process was still profiled during the storm"
    );
    assert!(peak_kib < 256 * 1024, "peak RSS {} MiB", peak_kib / 1024);
}

/// Rewrites the ELF executable at `path` so its section headers claim a
/// `.symtab` of `symbols` entries in a sparse tail that makes the file 1 GB
/// (program headers, and so the running program, unchanged).
fn inflate_symbol_table(path: &Path, symbols: u64) {
    let mut bytes = std::fs::read(path).expect("read ELF");
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let (shoff, shentsize, shnum) = (
        u64_at(&bytes, 0x28) as usize,
        u16_at(&bytes, 0x3a),
        u16_at(&bytes, 0x3c),
    );
    let headers = bytes[shoff..shoff + shentsize * shnum].to_vec();
    // A string table to link to: the section-name table will do.
    let strtab = u16_at(&bytes, 0x3e) as u32;
    let symtab_offset = 64u64 << 20;
    let mut symtab = vec![0u8; shentsize];
    symtab[4..8].copy_from_slice(&2u32.to_le_bytes()); // SHT_SYMTAB
    symtab[0x18..0x20].copy_from_slice(&symtab_offset.to_le_bytes());
    symtab[0x20..0x28].copy_from_slice(&(symbols * 24).to_le_bytes());
    symtab[0x28..0x2c].copy_from_slice(&strtab.to_le_bytes());
    symtab[0x38..0x40].copy_from_slice(&24u64.to_le_bytes());
    // New section header table at the end of the original file.
    let new_shoff = bytes.len();
    bytes.extend_from_slice(&headers);
    bytes.extend_from_slice(&symtab);
    bytes[0x28..0x30].copy_from_slice(&(new_shoff as u64).to_le_bytes());
    bytes[0x3c..0x3e].copy_from_slice(&((shnum + 1) as u16).to_le_bytes());
    std::fs::write(path, &bytes).expect("write ELF");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("reopen");
    file.set_len(1 << 30).expect("sparse 1 GB");
}

#[test]
fn a_one_gigabyte_elf_claiming_millions_of_symbols_is_not_parsed() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let huge = dir.path().join("huge_symbols");
    compile("control_spin.c", &huge, &[]);
    inflate_symbol_table(&huge, 5_000_000);
    // Built differently, so its build id (the symbol cache's key) differs.
    let control_bin = dir.path().join("control_spin");
    compile("control_spin.c", &control_bin, &["-O2"]);
    let huge_proc = KillOnDrop(
        Command::new(&huge)
            .stdout(Stdio::null())
            .spawn()
            .expect("the inflated program still runs"),
    );
    let control = KillOnDrop(
        Command::new(&control_bin)
            .stdout(Stdio::null())
            .spawn()
            .expect("control starts"),
    );
    std::thread::sleep(Duration::from_millis(300));
    let out = dir.path().join("profiles");
    let mut agent = Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
        .args([
            "--pid",
            &huge_proc.0.id().to_string(),
            "--pid",
            &control.0.id().to_string(),
        ])
        .args([
            "--frequency",
            "99",
            "--drain-interval",
            "3s",
            "--duration",
            "9s",
        ])
        .args(["--metrics-addr", "off", "--output-dir"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env("RUST_LOG", "kiln_agent=info")
        .spawn()
        .expect("agent starts");
    let (ok, peak_kib, elapsed) = wait_with_rusage(&mut agent, Duration::from_secs(90));
    let mut stderr = String::new();
    if let Some(mut pipe) = agent.stderr.take() {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut stderr);
    }
    eprintln!(
        "agent finished={ok} in {elapsed:?}, peak RSS {} MiB",
        peak_kib / 1024
    );
    assert!(ok, "the agent hung or failed: {stderr}");
    assert!(
        stderr.contains("symbol tables over the cap"),
        "the refusal is logged: {stderr}"
    );
    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(&out).expect("profiles") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "gz") {
            let bytes = std::fs::read(&path).expect("readable");
            profiles
                .push(kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("valid pprof"));
        }
    }
    let samples = flatten(&profiles);
    let of = |pid: u32| -> Vec<&agent_run::FlatSample> {
        samples
            .iter()
            .filter(|s| s.labels.get("pid") == Some(&pid.to_string()))
            .collect()
    };
    let huge_samples = of(huge_proc.0.id());
    let huge_total: i64 = huge_samples.iter().map(|s| s.count).sum();
    let huge_named: i64 = huge_samples
        .iter()
        .filter(|s| s.frames.iter().any(|(_, f)| f == "kiln_hostile_control"))
        .map(|s| s.count)
        .sum();
    let control_hot: i64 = of(control.0.id())
        .iter()
        .filter(|s| s.frames.iter().any(|(_, f)| f == "kiln_hostile_control"))
        .map(|s| s.count)
        .sum();
    eprintln!(
        "inflated program: {huge_total} samples, {huge_named} named; control named: {control_hot}"
    );
    assert!(huge_total >= 100, "the inflated program was profiled");
    assert_eq!(huge_named, 0, "its symbol tables were not parsed");
    assert!(
        control_hot >= 100,
        "the well-behaved process was symbolized"
    );
    assert!(peak_kib < 128 * 1024, "peak RSS {} MiB", peak_kib / 1024);
}

//! The agent refuses to start with a clear explanation, not a verifier
//! dump, when it lacks privileges or the kernel lacks BTF.

use std::process::{Command, Output};

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// As root, the test drops every capability and becomes `nobody` with
/// setpriv; unprivileged, it runs the agent as it is.
#[test]
fn without_capabilities_the_agent_names_what_is_missing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    let args = ["--all", "--metrics-addr", "off", "--output-dir"];
    let output = if is_root() {
        let setpriv = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["--inh-caps=-all", "--bounding-set=-all", "--"])
            .arg(env!("CARGO_BIN_EXE_kiln-agent"))
            .args(args)
            .arg(&out)
            .output();
        match setpriv {
            Ok(output) => output,
            Err(error) => {
                if std::env::var("CI").is_ok_and(|v| v == "true") {
                    panic!("setpriv (util-linux) is required in CI: {error}");
                }
                eprintln!("skipping: setpriv is not available: {error}");
                return;
            }
        }
    } else {
        agent().args(args).arg(&out).output().expect("agent runs")
    };
    let message = stderr(&output);
    assert!(
        !output.status.success(),
        "an unprivileged agent started: {message}"
    );
    assert!(
        message.contains("lacks privileges"),
        "unclear refusal: {message}"
    );
    assert!(
        message.contains("CAP_BPF") && message.contains("CAP_PERFMON"),
        "{message}"
    );
    assert!(
        !message.contains("Verifier output"),
        "raw verifier dump: {message}"
    );
    assert!(!out.exists(), "nothing is written before the checks pass");
}

/// A kernel without BTF (simulated with a BTF path that does not exist)
/// is refused with the kernel option to look for.
#[test]
fn without_kernel_btf_the_agent_explains_the_requirement() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = agent()
        .args(["--all", "--metrics-addr", "off", "--btf-path"])
        .arg(dir.path().join("no-such-vmlinux"))
        .arg("--output-dir")
        .arg(dir.path().join("out"))
        .output()
        .expect("agent runs");
    let message = stderr(&output);
    assert!(!output.status.success());
    if is_root() {
        assert!(message.contains("no BTF"), "unclear refusal: {message}");
        assert!(message.contains("CONFIG_DEBUG_INFO_BTF"), "{message}");
    } else {
        // Privileges are checked first; either refusal is explicit.
        assert!(message.contains("lacks privileges"), "{message}");
    }
}

/// A BTF file that exists but is not BTF is refused the same way.
#[test]
fn a_corrupt_btf_file_is_refused_with_the_btf_explanation() {
    if !is_root() {
        eprintln!("skipping: needs root to get past the privilege check");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let fake = dir.path().join("vmlinux");
    std::fs::write(&fake, b"not btf at all").expect("write fake BTF");
    let output = agent()
        .args(["--all", "--metrics-addr", "off", "--btf-path"])
        .arg(&fake)
        .arg("--output-dir")
        .arg(dir.path().join("out"))
        .output()
        .expect("agent runs");
    let message = stderr(&output);
    assert!(!output.status.success());
    assert!(
        message.contains("cannot use kernel BTF"),
        "unclear refusal: {message}"
    );
}

//! Compiles the BPF program in `bpf/` with clang, so the object the agent
//! embeds always matches its source (no checked-in blob to drift).

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() -> Result<(), String> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let bpf_dir = manifest_dir.join("../bpf");
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let source = bpf_dir.join("profile.bpf.c");
    let object = out_dir.join("profile.bpf.o");
    println!("cargo:rerun-if-changed={}", source.display());
    println!(
        "cargo:rerun-if-changed={}",
        bpf_dir.join("kiln.h").display()
    );
    println!("cargo:rerun-if-env-changed=KILN_CLANG");

    // Debian installs versioned clang binaries only; KILN_CLANG overrides.
    let clang = env::var("KILN_CLANG").unwrap_or_else(|_| "clang-16".to_owned());
    let output = Command::new(&clang)
        .args(["-g", "-O2", "-target", "bpf", "-D__TARGET_ARCH_x86"])
        .args(["-Wall", "-Werror"])
        // Debian's multiarch directory holds asm/types.h.
        .arg("-I/usr/include/x86_64-linux-gnu")
        .arg(format!("-I{}", bpf_dir.display()))
        .arg("-c")
        .arg(&source)
        .arg("-o")
        .arg(&object)
        .output()
        .map_err(|e| {
            format!(
                "cannot run {clang} to compile the BPF program ({e}); install clang-16 and \
                 libbpf-dev (./kiln-dev does) or point KILN_CLANG at a clang that targets bpf"
            )
        })?;
    if !output.status.success() {
        return Err(format!(
            "{clang} failed to compile {}:\n{}",
            source.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(())
}

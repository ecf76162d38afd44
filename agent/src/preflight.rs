//! Checks before touching the kernel, so a missing privilege or kernel
//! feature is explained in one sentence instead of a raw verifier dump.

use std::path::Path;

const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// What stops the agent from starting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreflightError {
    /// The process lacks the capabilities to load BPF and open perf events.
    #[error(
        "kiln-agent lacks privileges: it needs {missing} (or CAP_SYS_ADMIN, or root) to load its BPF \
         sampler and open cpu-clock perf events; run it as root or grant them, e.g. \
         `setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_sys_resource+ep kiln-agent`, or in Kubernetes \
         securityContext.capabilities.add: [BPF, PERFMON, SYS_PTRACE, SYS_RESOURCE]"
    )]
    MissingCapabilities {
        /// The capabilities missing, e.g. `CAP_BPF and CAP_PERFMON`.
        missing: String,
    },
    /// The kernel exposes no BTF.
    #[error(
        "the kernel exposes no BTF at {path}: kiln-agent needs a kernel built with CONFIG_DEBUG_INFO_BTF=y \
         (most distributions since Linux 5.4) to relocate its BPF program, or a BTF file for this kernel \
         given with --btf-path"
    )]
    NoBtf {
        /// Where BTF was looked for.
        path: String,
    },
    /// The capability set could not be read.
    #[error("cannot read the process capabilities from /proc/self/status")]
    CapabilitiesUnreadable,
}

impl PreflightError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PreflightError::MissingCapabilities { .. } => "missing_capabilities",
            PreflightError::NoBtf { .. } => "no_btf",
            PreflightError::CapabilitiesUnreadable => "capabilities_unreadable",
        }
    }
}

/// The effective capability mask from `/proc/self/status` text.
pub fn parse_effective_capabilities(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
}

fn has(mask: u64, capability: u32) -> bool {
    mask & (1u64 << capability) != 0
}

/// Whether `mask` allows loading the sampler; names what is missing.
pub fn check_capabilities(mask: u64) -> Result<(), PreflightError> {
    if has(mask, CAP_SYS_ADMIN) {
        return Ok(());
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|&(cap, _)| !has(mask, cap))
        .map(|(_, name)| name)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PreflightError::MissingCapabilities {
            missing: missing.join(" and "),
        })
    }
}

/// Whether `mask` lets the agent read other users' `/proc/PID/maps`
/// (needed to symbolize them; without it frames stay unsymbolized).
pub fn can_read_other_processes(mask: u64) -> bool {
    has(mask, CAP_SYS_PTRACE)
}

/// Runs every check against this process and kernel.
pub fn run(btf_path: &Path) -> Result<u64, PreflightError> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|_| PreflightError::CapabilitiesUnreadable)?;
    let mask =
        parse_effective_capabilities(&status).ok_or(PreflightError::CapabilitiesUnreadable)?;
    check_capabilities(mask)?;
    if !btf_path.is_file() {
        return Err(PreflightError::NoBtf {
            path: btf_path.display().to_string(),
        });
    }
    Ok(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_bpf_plus_perfmon_pass() {
        assert_eq!(check_capabilities(0x000001ffffffffff), Ok(()));
        assert_eq!(
            check_capabilities((1 << CAP_BPF) | (1 << CAP_PERFMON)),
            Ok(())
        );
        assert_eq!(check_capabilities(1 << CAP_SYS_ADMIN), Ok(()));
    }

    #[test]
    fn missing_capabilities_are_named() {
        let err = check_capabilities(0).expect_err("no capabilities");
        assert!(err.to_string().contains("CAP_BPF and CAP_PERFMON"));
        let err = check_capabilities(1 << CAP_BPF).expect_err("no perfmon");
        assert_eq!(
            err,
            PreflightError::MissingCapabilities {
                missing: "CAP_PERFMON".into()
            }
        );
    }

    #[test]
    fn effective_capabilities_parse_from_status() {
        let status = "Name:\tx\nCapPrm:\t0000000000000000\nCapEff:\t000001fffeffffff\n";
        assert_eq!(
            parse_effective_capabilities(status),
            Some(0x000001fffeffffff)
        );
        assert_eq!(parse_effective_capabilities("Name: x"), None);
    }
}

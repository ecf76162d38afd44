//! Checks before touching the kernel, so a missing privilege or kernel
//! feature is explained in one sentence instead of a raw verifier dump.

use std::path::Path;

const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYS_RESOURCE: u32 = 24;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const CAP_CHECKPOINT_RESTORE: u32 = 40;

/// CAP_BPF, CAP_PERFMON and the BPF ring buffer arrived in 5.8.
pub const MIN_KERNEL: KernelVersion = KernelVersion { major: 5, minor: 8 };
/// `bpf_task_pt_regs`, which the eh-frame unwinder needs for samples that
/// hit the kernel, arrived in 5.15.
pub const MIN_KERNEL_EH_FRAME: KernelVersion = KernelVersion {
    major: 5,
    minor: 15,
};
/// CAP_CHECKPOINT_RESTORE (reading `/proc/PID/map_files`) arrived in 5.9.
const CHECKPOINT_RESTORE_KERNEL: KernelVersion = KernelVersion { major: 5, minor: 9 };
/// From 5.11 BPF memory is charged to the cgroup, not RLIMIT_MEMLOCK.
const MEMCG_ACCOUNTING_KERNEL: KernelVersion = KernelVersion {
    major: 5,
    minor: 11,
};

/// A kernel release, as far as features go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion {
    /// e.g. 6 in 6.1.0-18-amd64.
    pub major: u32,
    /// e.g. 1 in 6.1.0-18-amd64.
    pub minor: u32,
}

impl std::fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The version in a release string such as `6.1.0-18-amd64`.
pub fn parse_kernel_release(release: &str) -> Option<KernelVersion> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some(KernelVersion { major, minor })
}

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
    /// The kernel is older than a feature the agent needs.
    #[error("kernel {found} is too old: kiln-agent needs {required} or later for {feature}{hint}")]
    KernelTooOld {
        /// The running kernel.
        found: KernelVersion,
        /// The oldest kernel that has the feature.
        required: KernelVersion,
        /// What needs it.
        feature: &'static str,
        /// What to do instead, if anything.
        hint: &'static str,
    },
    /// The kernel release could not be read or parsed.
    #[error("cannot read the kernel release from /proc/sys/kernel/osrelease")]
    KernelUnreadable,
}

impl PreflightError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PreflightError::MissingCapabilities { .. } => "missing_capabilities",
            PreflightError::NoBtf { .. } => "no_btf",
            PreflightError::CapabilitiesUnreadable => "capabilities_unreadable",
            PreflightError::KernelTooOld { .. } => "kernel_too_old",
            PreflightError::KernelUnreadable => "kernel_unreadable",
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

/// Whether `kernel` runs the sampler, and the eh-frame unwinder if asked.
pub fn check_kernel(kernel: KernelVersion, eh_frame: bool) -> Result<(), PreflightError> {
    if kernel < MIN_KERNEL {
        return Err(PreflightError::KernelTooOld {
            found: kernel,
            required: MIN_KERNEL,
            feature: "CAP_BPF, CAP_PERFMON and the BPF ring buffer",
            hint: "",
        });
    }
    if eh_frame && kernel < MIN_KERNEL_EH_FRAME {
        return Err(PreflightError::KernelTooOld {
            found: kernel,
            required: MIN_KERNEL_EH_FRAME,
            feature: "the eh-frame unwinder (bpf_task_pt_regs)",
            hint: "; run with --unwinder frame-pointer on this kernel",
        });
    }
    Ok(())
}

/// What works less well with the capabilities and kernel at hand, one
/// sentence each; the agent runs regardless and logs them at start-up.
pub fn degradations(mask: u64, kernel: KernelVersion) -> Vec<String> {
    let mut found = Vec::new();
    if has(mask, CAP_SYS_ADMIN) {
        return found;
    }
    if !has(mask, CAP_SYS_PTRACE) {
        found.push(
            "without CAP_SYS_PTRACE, other users' processes cannot be read: their frames stay \
             unsymbolized and their Python frames unnamed"
                .to_owned(),
        );
    }
    if kernel < CHECKPOINT_RESTORE_KERNEL {
        found.push(format!(
            "kernel {kernel} has no CAP_CHECKPOINT_RESTORE: mapped files are opened beneath each \
             process's root instead of through /proc/PID/map_files, so deleted binaries stay \
             unsymbolized"
        ));
    } else if !has(mask, CAP_CHECKPOINT_RESTORE) {
        found.push(
            "without CAP_CHECKPOINT_RESTORE, mapped files are opened beneath each process's root \
             instead of through /proc/PID/map_files, so deleted binaries stay unsymbolized"
                .to_owned(),
        );
    }
    if !has(mask, CAP_DAC_READ_SEARCH) {
        found.push(
            "without CAP_DAC_READ_SEARCH, files other users cannot read stay unsymbolized"
                .to_owned(),
        );
    }
    if kernel < MEMCG_ACCOUNTING_KERNEL && !has(mask, CAP_SYS_RESOURCE) {
        found.push(format!(
            "kernel {kernel} charges BPF maps to RLIMIT_MEMLOCK and without CAP_SYS_RESOURCE the \
             limit cannot be raised: loading the sampler may fail"
        ));
    }
    found
}

/// What the preflight found: the effective capabilities and the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preflight {
    /// The effective capability mask.
    pub capabilities: u64,
    /// The running kernel.
    pub kernel: KernelVersion,
}

/// Runs every check against this process and kernel; `eh_frame` when the
/// eh-frame unwinder will run.
pub fn run(btf_path: &Path, eh_frame: bool) -> Result<Preflight, PreflightError> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|_| PreflightError::CapabilitiesUnreadable)?;
    let mask =
        parse_effective_capabilities(&status).ok_or(PreflightError::CapabilitiesUnreadable)?;
    check_capabilities(mask)?;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .as_deref()
        .and_then(parse_kernel_release)
        .ok_or(PreflightError::KernelUnreadable)?;
    check_kernel(kernel, eh_frame)?;
    if !btf_path.is_file() {
        return Err(PreflightError::NoBtf {
            path: btf_path.display().to_string(),
        });
    }
    Ok(Preflight {
        capabilities: mask,
        kernel,
    })
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
    fn kernel_releases_parse_and_gate_the_unwinder() {
        let debian = parse_kernel_release("6.1.0-18-amd64\n").expect("parses");
        assert_eq!(debian, KernelVersion { major: 6, minor: 1 });
        assert_eq!(
            parse_kernel_release("5.4.0"),
            Some(KernelVersion { major: 5, minor: 4 })
        );
        assert_eq!(parse_kernel_release("garbage"), None);
        assert_eq!(check_kernel(debian, true), Ok(()));
        let old = KernelVersion {
            major: 5,
            minor: 10,
        };
        assert_eq!(check_kernel(old, false), Ok(()));
        let err = check_kernel(old, true).expect_err("no bpf_task_pt_regs");
        assert!(
            err.to_string().contains("--unwinder frame-pointer"),
            "{err}"
        );
        let ancient = KernelVersion {
            major: 4,
            minor: 19,
        };
        assert_eq!(
            check_kernel(ancient, false).map_err(|e| e.reason()),
            Err("kernel_too_old")
        );
    }

    #[test]
    fn every_missing_capability_is_named_once() {
        let kernel = KernelVersion { major: 6, minor: 1 };
        assert!(degradations(1 << CAP_SYS_ADMIN, kernel).is_empty());
        let full = (1 << CAP_BPF)
            | (1 << CAP_PERFMON)
            | (1 << CAP_SYS_PTRACE)
            | (1 << CAP_CHECKPOINT_RESTORE)
            | (1 << CAP_DAC_READ_SEARCH)
            | (1 << CAP_SYS_RESOURCE);
        assert!(degradations(full, kernel).is_empty());
        let bare = degradations((1 << CAP_BPF) | (1 << CAP_PERFMON), kernel);
        assert_eq!(bare.len(), 3, "{bare:?}");
        assert!(bare.iter().any(|d| d.contains("CAP_SYS_PTRACE")));
        assert!(bare.iter().any(|d| d.contains("CAP_CHECKPOINT_RESTORE")));
        assert!(bare.iter().any(|d| d.contains("CAP_DAC_READ_SEARCH")));
        let old = degradations(full, KernelVersion { major: 5, minor: 8 });
        assert_eq!(old.len(), 1, "{old:?}");
        assert!(old[0].contains("no CAP_CHECKPOINT_RESTORE"));
        let memlock = degradations(
            full & !(1 << CAP_SYS_RESOURCE),
            KernelVersion {
                major: 5,
                minor: 10,
            },
        );
        assert!(
            memlock.iter().any(|d| d.contains("RLIMIT_MEMLOCK")),
            "{memlock:?}"
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

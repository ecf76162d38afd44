//! Target sources given on the command line: PIDs, the whole host, or
//! cgroups by path or id. Kubernetes discovery is another [`TargetSource`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_cri::cgroup::cgroup2_mount;

use crate::target_set::{TargetEntry, TargetLabels, TargetSet, TargetSource, TargetSourceError};

/// Where cgroup v2 is usually mounted (pure cgroup2 hosts); hybrid hosts
/// mount it elsewhere (e.g. `/sys/fs/cgroup/unified`), see [`cgroup2_mount`].
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The cgroup2 mount point of this host, [`CGROUP_ROOT`] when not found.
pub fn host_cgroup2_root() -> PathBuf {
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|text| cgroup2_mount(&text))
        .unwrap_or_else(|| PathBuf::from(CGROUP_ROOT))
}

/// A fixed target set from the command line.
#[derive(Debug, Clone)]
pub enum StaticTargets {
    /// Every process.
    All,
    /// These PIDs.
    Pids(Vec<u32>),
    /// These cgroups, by directory (re-resolved on each poll, so a cgroup
    /// that is recreated is followed) and by id.
    Cgroups {
        /// cgroup directories, absolute or relative to the cgroup2 mount.
        paths: Vec<PathBuf>,
        /// cgroup ids (inode numbers of cgroup directories).
        ids: Vec<u64>,
    },
}

/// The cgroup v2 id of a cgroup directory (its inode number); relative
/// paths are taken under the host's cgroup2 mount.
pub fn cgroup_id(path: &Path) -> Result<u64, TargetSourceError> {
    use std::os::unix::fs::MetadataExt;
    let full = if path.is_absolute() {
        path.to_owned()
    } else {
        host_cgroup2_root().join(path)
    };
    std::fs::metadata(&full)
        .map(|m| m.ino())
        .map_err(|source| TargetSourceError::CgroupUnresolvable { path: full, source })
}

impl TargetSource for StaticTargets {
    fn current_targets(&mut self) -> Result<TargetSet, TargetSourceError> {
        Ok(match self {
            StaticTargets::All => TargetSet::All,
            StaticTargets::Pids(pids) => TargetSet::Pids(
                pids.iter()
                    .map(|&pid| (pid, TargetEntry::with_labels(TargetLabels::new())))
                    .collect(),
            ),
            StaticTargets::Cgroups { paths, ids } => {
                let mut cgroups = BTreeMap::new();
                for path in paths.iter() {
                    let id = cgroup_id(path)?;
                    let labels =
                        TargetLabels::from([("cgroup".to_owned(), path.display().to_string())]);
                    cgroups.insert(id, TargetEntry::with_labels(labels));
                }
                for &id in ids.iter() {
                    let labels = TargetLabels::from([("cgroup_id".to_owned(), id.to_string())]);
                    cgroups
                        .entry(id)
                        .or_insert_with(|| TargetEntry::with_labels(labels));
                }
                TargetSet::Cgroups(cgroups)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_resolve_to_directory_inodes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let inode = std::fs::metadata(dir.path()).expect("stat").ino();
        let mut source = StaticTargets::Cgroups {
            paths: vec![dir.path().to_owned()],
            ids: vec![42],
        };
        let TargetSet::Cgroups(cgroups) = source.current_targets().expect("resolvable") else {
            panic!("cgroup mode expected");
        };
        assert!(cgroups.contains_key(&inode));
        assert!(cgroups.contains_key(&42));
    }

    #[test]
    fn a_missing_cgroup_is_an_error_not_an_empty_set() {
        let mut source = StaticTargets::Cgroups {
            paths: vec![PathBuf::from("/nonexistent/kiln-test")],
            ids: vec![],
        };
        let error = source.current_targets().expect_err("missing");
        assert_eq!(error.reason(), "cgroup_unresolvable");
    }
}

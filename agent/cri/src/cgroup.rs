//! Finding a container's cgroup v2 directory and its id (the directory's
//! inode number, which `bpf_get_current_cgroup_id()` returns).
//!
//! Two sources, tried in order: the cgroup2 line (`0::/path`) of
//! `/proc/<pid>/cgroup` for the container's init process, which is the truth
//! for that process whatever the cgroup driver; and the OCI spec's
//! `cgroupsPath` from the verbose container status, translated for the
//! cgroupfs (`/k8s.io/<id>`) or systemd (`slice:prefix:name`) driver.
//! Paths are relative to the cgroup2 mount, found in `/proc/self/mountinfo`
//! (`/sys/fs/cgroup` on pure cgroup2 nodes, `/sys/fs/cgroup/unified` on hybrid ones).

use std::path::{Path, PathBuf};

use crate::error::CriError;
use crate::inventory::ContainerDetails;

/// The cgroup2 mount point from `/proc/self/mountinfo` text.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // "id parent major:minor root mount-point options... - fstype source super-options"
        let (fields, after) = line.split_once(" - ")?;
        if after.split_ascii_whitespace().next()? != "cgroup2" {
            return None;
        }
        fields.split_ascii_whitespace().nth(4).map(PathBuf::from)
    })
}

/// The cgroup2 path (relative to the mount) from `/proc/<pid>/cgroup` text.
/// A path leaving the reader's cgroup namespace (`/../..`) cannot be followed: `None`.
pub fn cgroup2_path_of_process(proc_cgroup: &str) -> Option<PathBuf> {
    proc_cgroup.lines().find_map(|line| {
        let path = line.strip_prefix("0::")?.trim();
        if path.split('/').any(|component| component == "..") {
            return None;
        }
        Some(PathBuf::from(path.trim_start_matches('/')))
    })
}

/// The cgroup directory (relative to the cgroup2 mount) an OCI `cgroupsPath` names.
///
/// cgroupfs driver: an absolute or relative path, used as is. systemd driver:
/// `parent.slice:prefix:name`, which systemd places at
/// `<parent slices expanded>/<prefix>-<name>.scope`, where a slice `a-b-c.slice`
/// lives at `a.slice/a-b.slice/a-b-c.slice`.
pub fn cgroup_dir_of_cgroups_path(cgroups_path: &str) -> Option<PathBuf> {
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    match parts.as_slice() {
        [path] => {
            let relative = path.trim_start_matches('/');
            (!relative.is_empty() && !relative.split('/').any(|c| c == ".."))
                .then(|| PathBuf::from(relative))
        }
        [slice, prefix, name] => {
            if name.is_empty() || name.contains('/') || prefix.contains('/') {
                return None;
            }
            let mut dir = expand_systemd_slice(slice)?;
            let unit = if prefix.is_empty() {
                format!("{name}.scope")
            } else {
                format!("{prefix}-{name}.scope")
            };
            dir.push(unit);
            Some(dir)
        }
        _ => None,
    }
}

fn expand_systemd_slice(slice: &str) -> Option<PathBuf> {
    if slice.is_empty() || slice == "-.slice" {
        return Some(PathBuf::new());
    }
    let stem = slice.strip_suffix(".slice")?;
    if stem.is_empty() || stem.contains('/') || stem.starts_with('-') || stem.ends_with('-') {
        return None;
    }
    let mut dir = PathBuf::new();
    let mut prefix = String::new();
    for (index, component) in stem.split('-').enumerate() {
        if component.is_empty() {
            return None;
        }
        if index > 0 {
            prefix.push('-');
        }
        prefix.push_str(component);
        dir.push(format!("{prefix}.slice"));
    }
    Some(dir)
}

/// Resolves containers to cgroup ids under one cgroup2 mount and one `/proc`.
#[derive(Debug, Clone)]
pub struct CgroupResolver {
    cgroup2_root: PathBuf,
    proc_root: PathBuf,
    /// Off when `/proc/<pid>/cgroup` is relative to another cgroup namespace than the hierarchy read.
    read_process_cgroups: bool,
}

impl CgroupResolver {
    /// A resolver for this host: the cgroup2 mount from `/proc/self/mountinfo`
    /// (`/sys/fs/cgroup` when none is listed) and `/proc`.
    ///
    /// An agent in a container usually has its own cgroup namespace: its
    /// `/sys/fs/cgroup` shows only its own subtree and `/proc/<pid>/cgroup` of
    /// other processes reads `0::/../..`. Then the host's hierarchy is reached
    /// through init's root (`/proc/1/root`, needs `hostPID`) and containers are
    /// found by their runtime `cgroupsPath`, which is in host terms.
    pub fn for_host() -> CgroupResolver {
        let own_namespace = std::fs::read_link("/proc/self/ns/cgroup").ok();
        let init_namespace = std::fs::read_link("/proc/1/ns/cgroup").ok();
        if own_namespace.is_some() && init_namespace.is_some() && own_namespace != init_namespace {
            let init_mount = std::fs::read_to_string("/proc/1/mountinfo")
                .ok()
                .and_then(|text| cgroup2_mount(&text));
            if let Some(mount) = init_mount {
                let relative = mount.strip_prefix("/").unwrap_or(&mount).to_owned();
                let root = Path::new("/proc/1/root").join(relative);
                if root.is_dir() {
                    return CgroupResolver {
                        cgroup2_root: root,
                        proc_root: PathBuf::from("/proc"),
                        read_process_cgroups: false,
                    };
                }
            }
        }
        let cgroup2_root = std::fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|text| cgroup2_mount(&text))
            .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"));
        CgroupResolver::new(cgroup2_root, PathBuf::from("/proc"))
    }

    /// A resolver over explicit roots (tests, or a host `/proc` mounted elsewhere).
    pub fn new(cgroup2_root: PathBuf, proc_root: PathBuf) -> CgroupResolver {
        CgroupResolver {
            cgroup2_root,
            proc_root,
            read_process_cgroups: true,
        }
    }

    /// The cgroup2 mount this resolver reads.
    pub fn cgroup2_root(&self) -> &Path {
        &self.cgroup2_root
    }

    /// The cgroup id of a container: the inode of its cgroup2 directory.
    pub fn resolve(&self, container_id: &str, details: &ContainerDetails) -> Result<u64, CriError> {
        let mut tried = Vec::new();
        if let Some(pid) = details.pid.filter(|_| self.read_process_cgroups) {
            let file = self.proc_root.join(pid.to_string()).join("cgroup");
            match std::fs::read_to_string(&file) {
                Ok(text) => match cgroup2_path_of_process(&text) {
                    Some(relative) => match self.inode(&relative) {
                        Ok(id) => return Ok(id),
                        Err(detail) => tried.push(detail),
                    },
                    None => tried.push(format!("{} has no cgroup2 line", file.display())),
                },
                Err(error) => tried.push(format!("{}: {error}", file.display())),
            }
        }
        if let Some(cgroups_path) = &details.cgroups_path {
            match cgroup_dir_of_cgroups_path(cgroups_path) {
                Some(relative) => match self.inode(&relative) {
                    Ok(id) => return Ok(id),
                    Err(detail) => tried.push(detail),
                },
                None => tried.push(format!("cgroupsPath {cgroups_path:?} is not understood")),
            }
        }
        if tried.is_empty() {
            tried.push("the runtime reported neither a pid nor a cgroupsPath".to_owned());
        }
        Err(CriError::Cgroup {
            container_id: container_id.to_owned(),
            detail: tried.join("; "),
        })
    }

    fn inode(&self, relative: &Path) -> Result<u64, String> {
        use std::os::unix::fs::MetadataExt;
        let dir = self.cgroup2_root.join(relative);
        std::fs::metadata(&dir)
            .map(|metadata| metadata.ino())
            .map_err(|error| format!("{}: {error}", dir.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup2_mount_is_found_in_hybrid_and_pure_layouts() {
        let hybrid = "31 1 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let pure = "30 1 0:27 / /sys/fs/cgroup rw shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(cgroup2_mount("garbage"), None);
    }

    #[test]
    fn process_cgroup2_line_is_picked_among_v1_lines() {
        let text = "12:cpu,cpuacct:/k8s.io/abc\n1:name=systemd:/k8s.io/abc\n0::/k8s.io/abc\n";
        assert_eq!(
            cgroup2_path_of_process(text),
            Some(PathBuf::from("k8s.io/abc"))
        );
        assert_eq!(cgroup2_path_of_process("3:memory:/x\n"), None);
        assert_eq!(cgroup2_path_of_process("0::/../../pod-b/ctr\n"), None);
    }

    #[test]
    fn cgroupfs_paths_are_taken_as_is_and_traversal_is_refused() {
        assert_eq!(
            cgroup_dir_of_cgroups_path("/k8s.io/abc"),
            Some(PathBuf::from("k8s.io/abc"))
        );
        assert_eq!(
            cgroup_dir_of_cgroups_path("/kubepods/burstable/pod1/abc"),
            Some(PathBuf::from("kubepods/burstable/pod1/abc"))
        );
        assert_eq!(cgroup_dir_of_cgroups_path("/"), None);
        assert_eq!(cgroup_dir_of_cgroups_path("/k8s.io/../../etc"), None);
    }

    #[test]
    fn systemd_paths_expand_slices_into_nested_directories() {
        assert_eq!(
            cgroup_dir_of_cgroups_path("kubepods-burstable-pod12.slice:cri-containerd:abc"),
            Some(PathBuf::from(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice/cri-containerd-abc.scope"
            ))
        );
        assert_eq!(
            cgroup_dir_of_cgroups_path("system.slice:crio:abc"),
            Some(PathBuf::from("system.slice/crio-abc.scope"))
        );
        assert_eq!(cgroup_dir_of_cgroups_path("bad--name.slice:p:abc"), None);
        assert_eq!(cgroup_dir_of_cgroups_path("a.slice:p:"), None);
        assert_eq!(cgroup_dir_of_cgroups_path("a:b"), None);
    }

    #[test]
    fn resolver_prefers_the_process_cgroup_then_falls_back_to_cgroups_path() {
        use std::os::unix::fs::MetadataExt;
        let cgroup_root = tempfile::tempdir().expect("temp dir");
        let proc_root = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(cgroup_root.path().join("k8s.io/from-proc")).expect("mkdir");
        std::fs::create_dir_all(cgroup_root.path().join("k8s.io/from-spec")).expect("mkdir");
        std::fs::create_dir_all(proc_root.path().join("77")).expect("mkdir");
        std::fs::write(proc_root.path().join("77/cgroup"), "0::/k8s.io/from-proc\n")
            .expect("write");
        let inode = |p: &str| {
            std::fs::metadata(cgroup_root.path().join(p))
                .expect("stat")
                .ino()
        };
        let resolver =
            CgroupResolver::new(cgroup_root.path().to_owned(), proc_root.path().to_owned());
        let both = ContainerDetails {
            pid: Some(77),
            cgroups_path: Some("/k8s.io/from-spec".to_owned()),
        };
        assert_eq!(
            resolver.resolve("c", &both).expect("resolved"),
            inode("k8s.io/from-proc")
        );
        let exited = ContainerDetails {
            pid: Some(78),
            ..both.clone()
        };
        assert_eq!(
            resolver.resolve("c", &exited).expect("resolved"),
            inode("k8s.io/from-spec")
        );
        let error = resolver
            .resolve("c", &ContainerDetails::default())
            .expect_err("nothing to go on");
        assert_eq!(error.reason(), "cgroup");
    }
}

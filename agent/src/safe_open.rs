//! Opening files on behalf of another process without trusting it: paths
//! are resolved beneath the process's root, so symlinks (absolute ones
//! included) and `..` cannot reach the agent's files, magic links are
//! refused, and a FIFO or device planted at the path never blocks.

use std::fs::File;

/// Opens `relative` beneath the directory `root` as if `root` were `/`:
/// symlinks (absolute ones included) cannot leave it, magic links are
/// refused, and a FIFO does not block the open.
pub fn open_beneath(root: &str, relative: &str) -> std::io::Result<File> {
    use std::ffi::CString;
    use std::os::fd::{FromRawFd, OwnedFd};
    let root_c = CString::new(root).map_err(std::io::Error::other)?;
    let relative_c = CString::new(relative).map_err(std::io::Error::other)?;
    // SAFETY: a plain open(2) of a NUL-terminated path.
    let dir = unsafe {
        libc::open(
            root_c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `dir` is a descriptor this function just opened and owns.
    let dir = unsafe { OwnedFd::from_raw_fd(dir) };
    /// `struct open_how` of openat2(2).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    };
    use std::os::fd::AsRawFd;
    // SAFETY: openat2 with a valid directory descriptor, a NUL-terminated
    // path, and a pointer to an `open_how` of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            relative_c.as_ptr(),
            &how as *const OpenHow,
            size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(std::io::Error::other)?;
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Whether `file`, opened by path, is the file a `/proc/PID/maps` line
/// names by `device` (as `st_dev` encodes it) and `inode`: the process may
/// have replaced the file at that path since it mapped it.
///
/// The inode must always match. The device must match too, except on two
/// filesystems whose `st_dev` is not the device the maps line prints:
/// - overlayfs (every container root): on 6.18 the maps line prints the
///   overlay's device and inode, as `fstat` does (checked by mapping a
///   file of a test overlay), but older kernels print the device of the
///   layer's own file (e.g. `fd:01`) while `fstat` through the overlay
///   reports the overlay's anonymous device (the inode is the layer's when
///   the layers share a filesystem, as containerd's snapshots do);
/// - btrfs, whose `stat` reports a per-subvolume anonymous device, while
///   the maps line prints the superblock's.
///
/// A file swapped in from any other filesystem (a tmpfs, a bind mount)
/// must match on both, so only a file of the same overlay or btrfs with
/// the same inode number could pass, which the process cannot create.
pub fn is_mapped_file(file: &File, device: u64, inode: u64) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let metadata = file.metadata()?;
    if metadata.ino() != inode {
        return Ok(false);
    }
    if metadata.dev() == device {
        return Ok(true);
    }
    Ok(matches!(
        filesystem_magic(file)?,
        OVERLAYFS_MAGIC | BTRFS_MAGIC
    ))
}

/// `f_type` of overlayfs (`OVERLAYFS_SUPER_MAGIC`).
const OVERLAYFS_MAGIC: u32 = 0x794c_7630;
/// `f_type` of btrfs (`BTRFS_SUPER_MAGIC`).
const BTRFS_MAGIC: u32 = 0x9123_683e;

/// The filesystem type of an open file (`fstatfs`'s `f_type`), as the
/// 32-bit magic number the kernel defines (libc's constants differ in
/// sign extension between targets, so the comparison is on the low bits).
fn filesystem_magic(file: &File) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero statfs is a valid value for fstatfs to overwrite.
    let mut stats: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs on a descriptor we own, with a valid out-pointer.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut stats) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Truncation intended: magic numbers are 32-bit.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(stats.f_type as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_the_mapped_one_only_with_its_inode_and_device() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("lib.so");
        std::fs::write(&path, b"\x7fELF").expect("write");
        let file = File::open(&path).expect("open");
        let metadata = file.metadata().expect("stat");
        let (device, inode) = (metadata.dev(), metadata.ino());
        assert!(is_mapped_file(&file, device, inode).expect("fstat"));
        assert!(!is_mapped_file(&file, device, inode + 1).expect("fstat"));
        let other_device = libc::makedev(0x1ff, 0x1ff);
        let tolerant = matches!(
            filesystem_magic(&file).expect("fstatfs"),
            OVERLAYFS_MAGIC | BTRFS_MAGIC
        );
        assert_eq!(
            is_mapped_file(&file, other_device, inode).expect("fstat"),
            tolerant,
            "another device is refused outside overlayfs and btrfs"
        );
        // /proc is neither: its files must match exactly.
        let proc_file = File::open("/proc/self/stat").expect("proc file");
        let proc_meta = proc_file.metadata().expect("stat");
        assert!(!is_mapped_file(&proc_file, other_device, proc_meta.ino()).expect("fstat"));
    }

    #[test]
    fn a_symlink_cannot_leave_the_root_and_a_fifo_is_refused() {
        let root = tempfile::tempdir().expect("temp root");
        let tmp = root.path().join("tmp");
        std::fs::create_dir(&tmp).expect("tmp");
        let outside = tempfile::NamedTempFile::new().expect("outside file");
        std::fs::write(outside.path(), "1000 10 secret\n").expect("write outside");
        std::os::unix::fs::symlink(outside.path(), tmp.join("perf-1.map")).expect("symlink");
        let root_path = root.path().to_str().expect("utf-8 path");
        let error = open_beneath(root_path, "tmp/perf-1.map").expect_err("escape refused");
        assert!(
            matches!(error.raw_os_error(), Some(libc::ENOENT) | Some(libc::ELOOP)),
            "{error}"
        );
        let fifo =
            std::ffi::CString::new(tmp.join("perf-2.map").to_str().expect("utf-8")).expect("path");
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let file =
            open_beneath(root_path, "tmp/perf-2.map").expect("a FIFO opens without blocking");
        assert!(!file.metadata().expect("metadata").is_file());
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

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

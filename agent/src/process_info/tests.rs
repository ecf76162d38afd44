use super::*;

#[test]
fn open_files_stay_within_the_budget_whatever_holds_them() {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("own stat");
    let ticks = parse_stat_start_ticks(&stat).expect("start time");
    let mut table = ProcessTable::new(16, 2);
    let ns = ticks * (1_000_000_000 / table.ticks_per_second);
    let first = table.refresh(std::process::id(), ns).expect("own process");
    let opened = first.files.iter().flatten().count();
    assert!(opened <= 2, "{opened} files open");
    assert!(table.open_files() <= 2);
    let mapped_files = first
        .maps
        .iter()
        .filter(|m| matches!(m.kind, MappingKind::File { .. }))
        .count();
    if mapped_files > 2 {
        assert!(table.take_refused_files() > 0);
    }
    // A second snapshot reuses the open files rather than opening more.
    let second = table.refresh(std::process::id(), ns).expect("own process");
    assert!(table.open_files() <= 2);
    drop((first, second));
}

/// A `/proc` of one process (pid 42) mapping `/lib.so` from its root,
/// with no `map_files`, so the table takes the fallback through the
/// root. Returns the directory, the table and the process's start.
fn fake_proc() -> (tempfile::TempDir, ProcessTable, u64) {
    let proc_root = tempfile::tempdir().expect("temp dir");
    let process = proc_root.path().join("42");
    std::fs::create_dir_all(process.join("root")).expect("root");
    std::fs::write(process.join("root/lib.so"), b"\x7fELF").expect("library");
    std::fs::write(process.join("comm"), "fake\n").expect("comm");
    // Field 22 (start time in ticks) is the 20th after comm.
    let mut fields = vec!["0"; 20];
    fields[19] = "1000";
    let stat = format!("42 (fake) {}", fields.join(" "));
    std::fs::write(process.join("stat"), stat).expect("stat");
    let mut table = ProcessTable::new(4, 4);
    table.proc_root = proc_root.path().to_owned();
    let start_ns = 1000 * (1_000_000_000 / table.ticks_per_second);
    (proc_root, table, start_ns)
}

#[test]
fn the_root_fallback_opens_only_the_device_and_inode_of_the_maps_line() {
    use std::os::unix::fs::MetadataExt;
    let (proc_root, mut table, start_ns) = fake_proc();
    let library = std::fs::metadata(proc_root.path().join("42/root/lib.so")).expect("stat");
    let mut opens = |device: u64, inode: u64| {
        let (major, minor) = (libc::major(device), libc::minor(device));
        let line = format!("1000-2000 r-xp 00000000 {major:x}:{minor:x} {inode} /lib.so\n");
        std::fs::write(proc_root.path().join("42/maps"), line).expect("maps");
        let snapshot = table.refresh(42, start_ns).expect("the fake process reads");
        snapshot.files[0].is_some()
    };
    assert!(
        opens(library.dev(), library.ino()),
        "the file the maps line names opens"
    );
    assert!(
        !opens(library.dev(), library.ino() + 1),
        "another inode is refused"
    );
    let other_device = libc::makedev(0x1ff, 0x1ff);
    let file = File::open(proc_root.path().join("42/root/lib.so")).expect("open");
    let tolerated =
        crate::safe_open::is_mapped_file(&file, other_device, library.ino()).expect("fstat");
    assert_eq!(
        opens(other_device, library.ino()),
        tolerated,
        "another device is refused (but on overlayfs and btrfs)"
    );
}

#[test]
fn a_zombie_keeps_the_mappings_it_had_while_it_lived() {
    let (proc_root, mut table, start_ns) = fake_proc();
    let line = "1000-2000 r-xp 00000000 00:00 0 /lib.so\n";
    std::fs::write(proc_root.path().join("42/maps"), line).expect("maps");
    let alive = table.refresh(42, start_ns).expect("the fake process reads");
    assert_eq!(alive.maps.len(), 1);
    // Exited, not reaped: same pid and start, nothing mapped (issue 52's
    // off-CPU test found its last window unnamed without this).
    std::fs::write(proc_root.path().join("42/maps"), "").expect("maps");
    let zombie = table.snapshot(42, start_ns).expect("still known");
    assert_eq!(zombie.maps.len(), 1, "the living snapshot is kept");
}

#[test]
fn stat_start_time_survives_hostile_comm() {
    let stat = "42 (we ird) ) R 1 42 42 0 -1 4194304 100 0 0 0 5 6 0 0 20 0 1 0 123456 1000 10";
    assert_eq!(parse_stat_start_ticks(stat), Some(123456));
    assert_eq!(parse_stat_start_ticks("42 (x) R 1"), None);
    assert_eq!(parse_stat_start_ticks("no parens"), None);
}

#[test]
fn boottime_converts_to_ticks_like_the_kernel() {
    assert_eq!(boottime_ns_to_ticks(1_234_567_890_123, 100), 123_456);
    assert_eq!(
        boottime_ns_to_ticks(2_500_000_000, 0),
        2,
        "0 Hz is treated as 1 Hz"
    );
}

#[test]
fn a_file_rewritten_in_place_is_another_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("manager");
    let identity = |path: &Path| {
        let file = File::open(path).expect("open");
        FileIdentity::of(&file.metadata().expect("fstat"))
    };
    std::fs::write(&path, b"first binary").expect("write");
    let first = identity(&path);
    assert_eq!(first, identity(&path), "the same file, opened twice");
    // Change times move with the kernel's clock tick: wait one out.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for writing");
    std::io::Write::write_all(&mut &file, b"other binary").expect("rewrite");
    // Same inode, same size, and the old modification time forged back:
    // only the change time, which no process can set, tells them apart.
    file.set_modified(
        std::time::UNIX_EPOCH + std::time::Duration::from_nanos(first.modified_ns as u64),
    )
    .expect("forge mtime");
    drop(file);
    let rewritten = identity(&path);
    assert_eq!((rewritten.inode, rewritten.size), (first.inode, first.size));
    assert_eq!(rewritten.modified_ns, first.modified_ns);
    assert_ne!(rewritten, first);
}

#[test]
fn own_process_reads_with_its_executable_and_build_id() {
    let pid = std::process::id();
    let stat = std::fs::read_to_string("/proc/self/stat").expect("own stat");
    let ticks = parse_stat_start_ticks(&stat).expect("start time");
    let mut table = ProcessTable::new(16, 16);
    // Convert back: any ns within the tick maps to it.
    let ns = ticks * (1_000_000_000 / table.ticks_per_second);
    let snapshot = table.refresh(pid, ns).expect("own process is readable");
    let exe = std::fs::read_link("/proc/self/exe").expect("exe link");
    let exe = exe.to_string_lossy();
    let index = snapshot
        .maps
        .iter()
        .position(|m| m.display_name() == exe)
        .expect("own executable is mapped");
    let file = snapshot.files[index]
        .as_ref()
        .expect("own executable opens");
    assert_eq!(file.build_id.len() % 2, 0);
    assert!(!snapshot.comm.is_empty());
    assert!(matches!(
        table.refresh(pid, ns + 10_000_000_000),
        Err(ProcessReadError::Gone { .. })
    ));
}

//! The calling thread's user registers and the top of its stack, copied the
//! way the BPF program copies a sampled thread's (shared by the rootless
//! unwinding and collector tests).

use kiln_agent::abi::STACK_SNAPSHOT_BYTES;

/// One sample as the kernel copies it.
#[derive(Debug, Clone)]
pub struct CapturedStack {
    /// The thread's id.
    pub tid: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Stack bytes from `sp` up, at most a snapshot's worth.
    pub stack: Vec<u8>,
}

/// Captures the calling thread; its own frame is the leaf.
#[inline(never)]
pub fn capture_own_stack() -> CapturedStack {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: copies three registers into locals; no memory is touched.
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
        );
    }
    // The stack mapping's end bounds the copy, as the kernel's copy stops
    // where the user stack ends.
    let maps = std::fs::read_to_string("/proc/self/maps").expect("own maps");
    let stack_end = maps
        .lines()
        .filter_map(|line| {
            let (start, rest) = line.split_once('-')?;
            let end = rest.split_once(' ')?.0;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            (start <= sp && sp < end).then_some(end)
        })
        .next()
        .expect("the stack pointer lies in a mapping");
    let len = usize::try_from((stack_end - sp).min(STACK_SNAPSHOT_BYTES as u64)).expect("small");
    // SAFETY: [sp, sp + len) is inside this thread's mapped stack and is
    // copied at once, while the frames above stay live.
    let stack = unsafe { std::slice::from_raw_parts(sp as *const u8, len) }.to_vec();
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = u32::try_from(unsafe { libc::syscall(libc::SYS_gettid) }).expect("a tid");
    CapturedStack {
        tid,
        ip,
        sp,
        bp,
        stack,
    }
}

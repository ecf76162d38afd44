/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The kernel <-> user ABI of Kiln's CPU profiler: map keys and values shared
 * by bpf/profile.bpf.c and agent/src/abi.rs. agent/src/abi.rs mirrors every
 * struct with #[repr(C)] and asserts its size at compile time; change both
 * together.
 */
#ifndef KILN_H
#define KILN_H

/* Deepest stack recorded; the kernel's perf_event_max_stack default. */
#define KILN_MAX_STACK_DEPTH 127

/* Indices of the per-CPU counters in the `counters` map. */
enum kiln_counter {
	/* Samples of targeted processes that reached aggregation. */
	KILN_COUNTER_SAMPLES = 0,
	/* User stack not recorded: the stack map bucket held another stack. */
	KILN_COUNTER_USER_STACK_COLLISION = 1,
	/* Kernel stack not recorded: the stack map bucket held another stack. */
	KILN_COUNTER_KERNEL_STACK_COLLISION = 2,
	/* A stack was not recorded for another reason (map full, fault). */
	KILN_COUNTER_STACK_ERROR = 3,
	/* The sample was lost: the counts map of this generation was full. */
	KILN_COUNTER_COUNTS_FULL = 4,
	/* Samples skipped by per-target subsampling (a lower per-target rate). */
	KILN_COUNTER_SUBSAMPLED = 5,
	/* First samples of a process announced to userspace. */
	KILN_COUNTER_NEW_PROCESS = 6,
	/* New-process announcements lost because the ring buffer was full. */
	KILN_COUNTER_NEW_PROCESS_LOST = 7,
	/* Stack snapshots lost because the `samples` ring buffer was full. */
	KILN_COUNTER_SNAPSHOT_LOST = 8,
	/* Python (or Ruby) stacks cut at KILN_PY_MAX_FRAMES interpreter frames. */
	KILN_COUNTER_PY_TRUNCATED = 9,
	/*
	 * Targeted threads that blocked (left the CPU to sleep or wait) and
	 * were chosen by the one-in-off_cpu_keep_one_in draw.
	 */
	KILN_COUNTER_OFF_CPU_BLOCKS = 10,
	/* Blocks captured: their stack held until the thread's wakeup. */
	KILN_COUNTER_OFF_CPU_CAPTURED = 11,
	/* Blocks the per-CPU capture budget had no room for (not weighed). */
	KILN_COUNTER_OFF_CPU_BUDGET_SPENT = 12,
	/* Captured blocks that ended within config.off_cpu_min_ns: not sent. */
	KILN_COUNTER_OFF_CPU_SHORT = 13,
	/* Ended blocks lost because the `samples` ring buffer was full. */
	KILN_COUNTER_OFF_CPU_LOST = 14,
	KILN_COUNTER_COUNT = 15,
};

/* Unwind modes in `struct kiln_config.unwind`. */
enum kiln_unwind {
	/*
	 * Walk user stacks by frame pointer in the kernel (bpf_get_stackid) and
	 * aggregate in the count maps. Cheapest; wrong for code built without
	 * frame pointers.
	 */
	KILN_UNWIND_FRAME_POINTER = 0,
	/*
	 * Copy the user registers and the top of the user stack into the
	 * `samples` ring buffer; userspace unwinds with .eh_frame (falling back
	 * to frame pointers where a module has no unwind info).
	 */
	KILN_UNWIND_STACK_SNAPSHOT = 1,
};

/* Bytes of user stack copied per snapshot, from the stack pointer up. */
#define KILN_STACK_SNAPSHOT_BYTES 16384
/*
 * The copy goes in chunks so that a stack whose top is closer than
 * KILN_STACK_SNAPSHOT_BYTES (the main thread's, below the environment) still
 * yields everything up to the last readable chunk.
 */
#define KILN_STACK_SNAPSHOT_CHUNK 512

/* Most CPython frames (shims included) read per sample; deeper stacks are cut and counted. */
#define KILN_PY_MAX_FRAMES 64
/* Most thread states searched for the sampled thread's. */
#define KILN_PY_MAX_THREADS 64
/* `cframe_current_frame` when the thread state points at the frame itself. */
#define KILN_PY_NO_CFRAME 0xffff

/* How a CPython frame records where it is in its bytecode. */
enum kiln_py_position {
	/* An int instruction index (f_lasti, 3.9-3.10). */
	KILN_PY_POSITION_INDEX = 0,
	/* A pointer into the code object's bytecode (3.11+). */
	KILN_PY_POSITION_POINTER = 1,
};

/* How the frames run by one C call of the eval loop are told apart. */
enum kiln_py_entry {
	/* One eval-loop call per frame (3.9-3.10). */
	KILN_PY_ENTRY_EVERY_FRAME = 0,
	/* A bool on the first frame of each call (3.11 `is_entry`). */
	KILN_PY_ENTRY_FLAG = 1,
	/* A shim frame owned by the C stack between calls (3.12+ `owner`). */
	KILN_PY_ENTRY_SHIM = 2,
};

/*
 * Value of `python_processes` (key: tgid): where the interpreter's state is
 * and the struct offsets of its version, from agent/src/python/offsets.rs.
 */
struct kiln_python_process {
	/* Address of `_PyRuntime` in the process. */
	__u64 runtime;
	__u16 runtime_interpreters_main;
	__u16 interp_threads_head;
	__u16 tstate_next;
	/* PyThreadState.thread_id: pthread_self(), the thread's fs base. */
	__u16 tstate_thread_id;
	/* frame (3.9-3.10), cframe (3.11-3.12) or current_frame (3.13). */
	__u16 tstate_frame;
	/* _PyCFrame.current_frame, or KILN_PY_NO_CFRAME. */
	__u16 cframe_current_frame;
	__u16 frame_previous;
	__u16 frame_code;
	__u16 frame_position;
	/* is_entry (3.11) or owner (3.12+); unused for EVERY_FRAME. */
	__u16 frame_entry;
	/* One of enum kiln_py_position. */
	__u8 position_kind;
	/* One of enum kiln_py_entry. */
	__u8 entry_kind;
	/* `owner` value of shim frames (FRAME_OWNED_BY_CSTACK). */
	__u8 owned_by_cstack;
	/* Low bits cleared from the code pointer (3.14+ tags `f_executable`). */
	__u8 code_tag_mask;
};

/* Set in `kiln_py_frame.flags` on the root-most frame of one eval-loop call. */
#define KILN_PY_FRAME_ENTRY 1
/* A shim frame between two eval-loop calls (3.12+): a boundary, not a frame. */
#define KILN_PY_FRAME_SHIM 2

/* One CPython frame as read at sample time. */
struct kiln_py_frame {
	/* The code object (PyCodeObject *). */
	__u64 code;
	/* Raw position: instruction index or bytecode pointer (position_kind). */
	__u64 position;
	/* KILN_PY_FRAME_* bits. */
	__u32 flags;
	__u32 reserved;
};

/* `kiln_stack_snapshot.py_status`. */
enum kiln_py_status {
	/* Not a registered Python process. */
	KILN_PY_NONE = 0,
	/* Frames read to the thread's first frame. */
	KILN_PY_COMPLETE = 1,
	/* The sampled thread has no thread state (not running Python). */
	KILN_PY_NO_THREAD = 2,
	/* Cut at KILN_PY_MAX_FRAMES. */
	KILN_PY_TRUNCATED = 3,
};

/*
 * Value of `ruby_processes` (key: tgid): how to find the sampled thread's
 * `ruby_current_ec` and the struct offsets of its Ruby version, from
 * agent/src/ruby/offsets.rs. A process is Ruby or Python, never both, so the
 * Ruby walk writes its frames into the snapshot's `py_frames` (iseq pointer
 * as `code`, pc as `position`) and sets `py_status` the same way.
 *
 * `ruby_current_ec` is a thread-local of libruby, which Debian links for the
 * general-dynamic TLS model: its address is the thread's DTV slot for
 * libruby's module id plus the symbol's offset in that module's block. The
 * thread pointer is the task's fs base, the DTV pointer sits in glibc's TCB
 * header, and userspace reads the module id the loader wrote into libruby's
 * GOT (the DTPMOD64 relocation's slot).
 */
struct kiln_ruby_process {
	/* libruby's TLS module id (index into the DTV). */
	__u64 tls_module;
	/* Offset of `ruby_current_ec` in libruby's TLS block. */
	__u64 tls_offset;
	/* Offset of the DTV pointer from the thread pointer (TCB header). */
	__u16 tcb_dtv;
	/* Bytes per DTV entry (the block pointer is its first word). */
	__u16 dtv_entry_size;
	/* rb_execution_context_t: vm_stack, vm_stack_size (in VALUEs), cfp. */
	__u16 ec_vm_stack;
	__u16 ec_vm_stack_size;
	__u16 ec_cfp;
	/* rb_control_frame_t: its size and its pc, iseq and ep fields. */
	__u16 cfp_size;
	__u16 cfp_pc;
	__u16 cfp_iseq;
	__u16 cfp_ep;
	/* Offset back from ep of the method entry slot (ep[-2]). */
	__u16 ep_method_entry;
	/* Frame flags in ep[0]: the first frame of a vm_exec call, a C frame. */
	__u32 frame_flag_finish;
	__u32 frame_flag_cframe;
	__u32 reserved;
};

/* Set in `kiln_py_frame.flags` of a Ruby C frame: `code` is its method entry. */
#define KILN_RB_FRAME_CFUNC 4

/* Filter modes in `struct kiln_config.filter`. */
enum kiln_filter {
	/* Profile every process on the host (idle excluded). */
	KILN_FILTER_ALL = 0,
	/* Profile only processes whose cgroup is in `allowed_cgroups`. */
	KILN_FILTER_CGROUPS = 1,
	/* Profile only processes whose tgid is in `allowed_pids`. */
	KILN_FILTER_PIDS = 2,
};

/* The single entry of the `config` array map, written by userspace. */
struct kiln_config {
	/* Generation (0 or 1) of the count and stack maps samples go into. */
	__u32 generation;
	/* One of enum kiln_filter. */
	__u32 filter;
	/* Record the thread id in the key (opt-in: more keys). */
	__u32 record_tid;
	/* One of enum kiln_unwind. */
	__u32 unwind;
	/*
	 * Off-CPU: capture one targeted block in this many, chosen at random
	 * (userspace raises it with the block rate); 0 turns off-CPU off.
	 */
	__u32 off_cpu_keep_one_in;
	/*
	 * Off-CPU: most blocks captured per CPU per second, whatever the rate
	 * (bursts up to half a second's worth pass).
	 */
	__u32 off_cpu_captures_per_second;
	/* Off-CPU: blocks shorter than this (ns) are dropped in the kernel. */
	__u64 off_cpu_min_ns;
};

/* `kiln_stack_snapshot.kind`. */
enum kiln_sample_kind {
	/* A cpu-clock sample of a running thread. */
	KILN_SAMPLE_CPU = 0,
	/* A thread that blocked, sent when it was woken (off_cpu_ns set). */
	KILN_SAMPLE_OFF_CPU = 1,
};

/* Value of `allowed_cgroups` and `allowed_pids`: how to sample a target. */
struct kiln_target {
	/* Keep one sample in this many (1 keeps all); 0 is treated as 1. */
	__u32 keep_one_in;
	__u32 reserved;
};

/* Key of the `counts0`/`counts1` hash maps: one aggregated stack. */
struct kiln_count_key {
	/* Process id (tgid) in the root PID namespace. */
	__u32 pid;
	/* Thread id, or 0 unless record_tid is set. */
	__u32 tid;
	/* cgroup v2 id (inode of the cgroup directory). */
	__u64 cgroup_id;
	/* Process start (group leader's start_boottime, ns): tells reused PIDs apart. */
	__u64 start_boottime_ns;
	/* Stack id in this generation's stack map, or a negative errno. */
	__s32 user_stack_id;
	/* Stack id in this generation's stack map, or a negative errno. */
	__s32 kernel_stack_id;
};

/* Value of `counts0`/`counts1`. */
struct kiln_count_value {
	/* Number of samples. */
	__u64 samples;
	/* comm of the thread that inserted the key (kept for exited processes). */
	char comm[16];
};

/* Event in the `new_processes` ring buffer: the first sample of a process. */
struct kiln_new_process {
	__u32 pid;
	__u32 reserved;
	__u64 start_boottime_ns;
};

/*
 * Event in the `samples` ring buffer (KILN_UNWIND_STACK_SNAPSHOT): one
 * sample with what userspace needs to unwind it.
 */
struct kiln_stack_snapshot {
	/* Process id (tgid) in the root PID namespace. */
	__u32 pid;
	/* Thread id, or 0 unless record_tid is set. */
	__u32 tid;
	/* cgroup v2 id. */
	__u64 cgroup_id;
	/* Process start (group leader's start_boottime, ns). */
	__u64 start_boottime_ns;
	/* User registers when the sample hit (or at the last kernel entry); ip 0: none (kernel thread). */
	__u64 ip;
	__u64 sp;
	__u64 bp;
	/* Valid entries of kernel_ips. */
	__u32 kernel_depth;
	/* Valid bytes of stack, copied from sp upwards. */
	__u32 stack_len;
	/* comm of the sampled thread. */
	char comm[16];
	/* One of enum kiln_sample_kind. */
	__u32 kind;
	/* Off-CPU: config.off_cpu_keep_one_in when the block was captured. */
	__u32 off_cpu_keep_one_in;
	/* Off-CPU: when the thread left the CPU (bpf_ktime_get_ns). */
	__u64 blocked_at_ns;
	/* Off-CPU: from leaving the CPU to its wakeup, ns. */
	__u64 off_cpu_ns;
	/* Kernel stack, leaf first. */
	__u64 kernel_ips[KILN_MAX_STACK_DEPTH];
	/* Valid entries of py_frames. */
	__u32 py_depth;
	/* One of enum kiln_py_status. */
	__u32 py_status;
	/* CPython frames of the sampled thread, leaf first. */
	struct kiln_py_frame py_frames[KILN_PY_MAX_FRAMES];
	/* User stack memory from sp. */
	__u8 stack[KILN_STACK_SNAPSHOT_BYTES];
};

#endif /* KILN_H */

// SPDX-License-Identifier: GPL-2.0
/*
 * Kiln's on-CPU sampler. Attached to one cpu-clock perf event per online CPU.
 *
 * Per sample: skip idle, check the target filter (one map lookup, and nothing
 * else for processes that are not targets), then, by `config.unwind`:
 * - frame pointers: record user and kernel stacks in this generation's stack
 *   map and count the (pid, cgroup, process start, stacks) key in this
 *   generation's count map. Userspace flips the generation in `config` before
 *   draining, so it reads maps the program no longer writes.
 * - stack snapshot: copy the user registers, the top of the user stack and
 *   the kernel stack into the `samples` ring buffer; userspace unwinds the
 *   user stack with .eh_frame (see ARCHITECTURE.md for why there).
 *
 * Kernel structs are read with CO-RE: the minimal definitions below carry
 * preserve_access_index, so their field offsets are relocated against the
 * running kernel's BTF at load time instead of being fixed at build time.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#include "kiln.h"

char LICENSE[] SEC("license") = "GPL";

#define EEXIST 17
#define EFAULT 14

/* Only the fields read here; CO-RE finds them in the running kernel. */
struct thread_struct {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	struct task_struct *group_leader;
	__u64 start_boottime;
	struct thread_struct thread;
} __attribute__((preserve_access_index));

/* x86-64 register frame, the layout of the kernel's struct pt_regs. */
struct kiln_pt_regs {
	__u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	__u64 ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kiln_config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct kiln_target);
} allowed_cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct kiln_target);
} allowed_pids SEC(".maps");

/* Sized by userspace at load time (`--stack-map-entries`). */
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 8192);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, KILN_MAX_STACK_DEPTH * sizeof(__u64));
} stacks0 SEC(".maps"), stacks1 SEC(".maps");

/* Sized by userspace at load time (`--count-map-entries`). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct kiln_count_key);
	__type(value, struct kiln_count_value);
} counts0 SEC(".maps"), counts1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, KILN_COUNTER_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* Processes already announced, so each one is announced once per start. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} known_processes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} new_processes SEC(".maps");

/* CPython processes among the targets, written by userspace (tgid key). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct kiln_python_process);
} python_processes SEC(".maps");

/* Ruby processes among the targets, written by userspace (tgid key). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct kiln_ruby_process);
} ruby_processes SEC(".maps");

/* Stack snapshots; sized by userspace at load time from CPUs and frequency. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 * 1024 * 1024);
} samples SEC(".maps");

/*
 * Off-CPU: the captured block of each thread (by thread id), from its
 * switch-out until its wakeup sends it. Sized by userspace; when more
 * captured threads sleep at once, the least recently used entry (the
 * longest asleep) is evicted and its block is lost.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 512);
	__type(key, __u32);
	__type(value, struct kiln_stack_snapshot);
} off_cpu_pending SEC(".maps");

/* Off-CPU: a snapshot is filled here first; it is too large for the BPF stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kiln_stack_snapshot);
} off_cpu_scratch SEC(".maps");

/*
 * Off-CPU: this CPU's capture budget, a token bucket. A capture costs
 * KILN_NS_PER_SECOND tokens; tokens come at off_cpu_captures_per_second
 * a nanosecond, up to half a second's worth, so bursts pass and only a
 * sustained rate past the budget (before userspace raises N) is refused.
 */
struct kiln_off_cpu_budget {
	__u64 at_ns;
	__u64 tokens;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kiln_off_cpu_budget);
} off_cpu_budget SEC(".maps");

static __always_inline void bump(__u32 counter)
{
	__u64 *value = bpf_map_lookup_elem(&counters, &counter);
	if (value)
		*value += 1; /* per-CPU slot: no other writer */
}

static __always_inline void count_stack_error(long err, __u32 collision_counter)
{
	if (err == -EEXIST)
		bump(collision_counter);
	else if (err != -EFAULT) /* -EFAULT: no stack of this kind, e.g. a kernel thread's user stack */
		bump(KILN_COUNTER_STACK_ERROR);
}

static __always_inline void announce_process(__u32 pid, __u64 start)
{
	__u64 *known = bpf_map_lookup_elem(&known_processes, &pid);
	if (known && *known == start)
		return;
	bpf_map_update_elem(&known_processes, &pid, &start, BPF_ANY);
	struct kiln_new_process *event =
		bpf_ringbuf_reserve(&new_processes, sizeof(*event), 0);
	if (!event) {
		bump(KILN_COUNTER_NEW_PROCESS_LOST);
		return;
	}
	event->pid = pid;
	event->reserved = 0;
	event->start_boottime_ns = start;
	bpf_ringbuf_submit(event, 0);
	bump(KILN_COUNTER_NEW_PROCESS);
}

/*
 * The user registers of the sampled thread: the interrupted ones when the
 * sample hit user mode, else the ones saved at its last kernel entry.
 * Returns 0 when there are none (kernel threads).
 */
static __always_inline int user_registers(struct bpf_perf_event_data *ctx,
					  struct kiln_pt_regs *out)
{
	struct kiln_pt_regs *regs = (struct kiln_pt_regs *)&ctx->regs;
	if ((regs->cs & 3) == 3) {
		out->ip = regs->ip;
		out->sp = regs->sp;
		out->bp = regs->bp;
		return 1;
	}
	struct task_struct *task = bpf_get_current_task_btf();
	struct kiln_pt_regs *saved = (struct kiln_pt_regs *)bpf_task_pt_regs(task);
	if (!saved || bpf_probe_read_kernel(out, sizeof(*out), saved) != 0)
		return 0;
	/* Kernel threads never entered from user mode: their frame is zero. */
	return (out->cs & 3) == 3 && out->sp != 0;
}

/* A user-space pointer, or 0 when it cannot be read. */
static __always_inline __u64 read_user_u64(__u64 address)
{
	__u64 value = 0;
	if (bpf_probe_read_user(&value, sizeof(value), (void *)address) != 0)
		return 0;
	return value;
}

/*
 * Records the sampled thread's CPython frames, leaf first: finds its thread
 * state in the main interpreter's list by pthread_self() (the thread's fs
 * base), then follows the frame chain. Only the code object and position are
 * read here; userspace reads names and line tables, cached per code object.
 */
static __always_inline void read_python_frames(struct kiln_stack_snapshot *event,
					       __u32 pid)
{
	event->py_depth = 0;
	event->py_status = KILN_PY_NONE;
	struct kiln_python_process *py = bpf_map_lookup_elem(&python_processes, &pid);
	if (!py)
		return;
	event->py_status = KILN_PY_NO_THREAD;

	struct task_struct *task = bpf_get_current_task_btf();
	__u64 fsbase = BPF_CORE_READ(task, thread.fsbase);
	__u64 interp = read_user_u64(py->runtime + py->runtime_interpreters_main);
	if (!interp || !fsbase)
		return;
	__u64 tstate = read_user_u64(interp + py->interp_threads_head);
	__u64 found = 0;
	for (int i = 0; i < KILN_PY_MAX_THREADS && tstate; i++) {
		if (read_user_u64(tstate + py->tstate_thread_id) == fsbase) {
			found = tstate;
			break;
		}
		tstate = read_user_u64(tstate + py->tstate_next);
	}
	if (!found)
		return;
	__u64 frame = read_user_u64(found + py->tstate_frame);
	if (frame && py->cframe_current_frame != KILN_PY_NO_CFRAME)
		frame = read_user_u64(frame + py->cframe_current_frame);

	/*
	 * One slot per frame visited, shim frames included (flagged, dropped by
	 * userspace): the slot index is the loop index, so the verifier sees one
	 * state per iteration instead of one per (iteration, depth) pair.
	 */
	__u32 depth = 0;
	for (__u32 i = 0; i < KILN_PY_MAX_FRAMES; i++) {
		if (!frame)
			break;
		__u32 flags = KILN_PY_FRAME_ENTRY;
		if (py->entry_kind != KILN_PY_ENTRY_EVERY_FRAME) {
			__u8 entry = 0;
			bpf_probe_read_user(&entry, sizeof(entry), (void *)(frame + py->frame_entry));
			if (py->entry_kind == KILN_PY_ENTRY_FLAG)
				flags = entry ? KILN_PY_FRAME_ENTRY : 0;
			else
				flags = entry == py->owned_by_cstack ? KILN_PY_FRAME_SHIM : 0;
		}
		__u64 position = 0;
		if (py->position_kind == KILN_PY_POSITION_INDEX) {
			__s32 index = 0;
			bpf_probe_read_user(&index, sizeof(index), (void *)(frame + py->frame_position));
			position = (__u32)index;
		} else {
			position = read_user_u64(frame + py->frame_position);
		}
		event->py_frames[i].code =
			read_user_u64(frame + py->frame_code) & ~(__u64)py->code_tag_mask;
		event->py_frames[i].position = position;
		event->py_frames[i].flags = flags;
		event->py_frames[i].reserved = 0;
		depth = i + 1;
		frame = read_user_u64(frame + py->frame_previous);
	}
	event->py_status = KILN_PY_COMPLETE;
	if (frame) {
		event->py_status = KILN_PY_TRUNCATED;
		bump(KILN_COUNTER_PY_TRUNCATED);
	}
	event->py_depth = depth;
}

/*
 * Records the sampled thread's Ruby control frames, leaf first, into
 * `py_frames`: finds the thread's execution context through its
 * `ruby_current_ec` thread-local (see struct kiln_ruby_process), then walks
 * from ec->cfp towards the end of the VM stack, where the first frames
 * pushed live. A C frame (Integer#times, a C block) is kept, flagged, with
 * its method entry, and the walk goes on past it to the Ruby frames that
 * called it. Returns 0 when the process is not a registered Ruby process.
 */
static __always_inline int read_ruby_frames(struct kiln_stack_snapshot *event,
					    __u32 pid)
{
	struct kiln_ruby_process *rb = bpf_map_lookup_elem(&ruby_processes, &pid);
	if (!rb)
		return 0;
	event->py_depth = 0;
	event->py_status = KILN_PY_NO_THREAD;

	struct task_struct *task = bpf_get_current_task_btf();
	__u64 fsbase = BPF_CORE_READ(task, thread.fsbase);
	if (!fsbase)
		return 1;
	__u64 dtv = read_user_u64(fsbase + rb->tcb_dtv);
	if (!dtv)
		return 1;
	__u64 block = read_user_u64(dtv + rb->tls_module * rb->dtv_entry_size);
	/* glibc marks a block not yet allocated for this thread with -1. */
	if (!block || block == ~(__u64)0)
		return 1;
	__u64 ec = read_user_u64(block + rb->tls_offset);
	if (!ec)
		return 1;
	__u64 cfp = read_user_u64(ec + rb->ec_cfp);
	__u64 stack = read_user_u64(ec + rb->ec_vm_stack);
	__u64 stack_size = read_user_u64(ec + rb->ec_vm_stack_size);
	/* Control frames grow down from the end of the VM stack. */
	__u64 end = stack + stack_size * 8;
	if (!cfp || !stack || cfp >= end)
		return 1;

	__u32 depth = 0;
	for (__u32 i = 0; i < KILN_PY_MAX_FRAMES; i++) {
		if (cfp + rb->cfp_size > end)
			break;
		__u64 ep = read_user_u64(cfp + rb->cfp_ep);
		__u64 flags = ep ? read_user_u64(ep) : 0;
		__u32 frame_flags = 0;
		if (flags & rb->frame_flag_finish)
			frame_flags |= KILN_PY_FRAME_ENTRY;
		if (flags & rb->frame_flag_cframe) {
			frame_flags |= KILN_RB_FRAME_CFUNC;
			event->py_frames[i].code = ep ? read_user_u64(ep - rb->ep_method_entry) : 0;
			event->py_frames[i].position = 0;
		} else {
			event->py_frames[i].code = read_user_u64(cfp + rb->cfp_iseq);
			event->py_frames[i].position = read_user_u64(cfp + rb->cfp_pc);
		}
		event->py_frames[i].flags = frame_flags;
		event->py_frames[i].reserved = 0;
		depth = i + 1;
		cfp += rb->cfp_size;
	}
	event->py_status = KILN_PY_COMPLETE;
	if (cfp + rb->cfp_size <= end) {
		event->py_status = KILN_PY_TRUNCATED;
		bump(KILN_COUNTER_PY_TRUNCATED);
	}
	event->py_depth = depth;
	return 1;
}

/*
 * Fills `event` for the current thread: identity, kernel stack (from `ctx`,
 * the context of whichever program runs, less its `skip_kernel` leaf-most
 * frames), the user registers in `regs`
 * when `has_user`, up to KILN_STACK_SNAPSHOT_BYTES of user stack from their
 * sp, and any Ruby or Python frames.
 */
static __always_inline void fill_snapshot(void *ctx, struct kiln_stack_snapshot *event,
					  __u32 pid, __u32 tid, __u64 cgroup_id,
					  __u64 start, int has_user,
					  struct kiln_pt_regs *regs, __u64 skip_kernel)
{
	event->pid = pid;
	event->tid = tid;
	event->cgroup_id = cgroup_id;
	event->start_boottime_ns = start;
	event->kind = KILN_SAMPLE_CPU;
	event->off_cpu_keep_one_in = 0;
	event->blocked_at_ns = 0;
	event->off_cpu_ns = 0;
	bpf_get_current_comm(&event->comm, sizeof(event->comm));

	long kernel_bytes = bpf_get_stack(ctx, event->kernel_ips,
					  sizeof(event->kernel_ips), skip_kernel);
	event->kernel_depth = kernel_bytes > 0 ? kernel_bytes / sizeof(__u64) : 0;

	event->stack_len = 0;
	if (has_user) {
		event->ip = regs->ip;
		event->sp = regs->sp;
		event->bp = regs->bp;
		__u32 copied = 0;
		for (__u32 i = 0; i < KILN_STACK_SNAPSHOT_BYTES / KILN_STACK_SNAPSHOT_CHUNK; i++) {
			if (bpf_probe_read_user(&event->stack[i * KILN_STACK_SNAPSHOT_CHUNK],
						KILN_STACK_SNAPSHOT_CHUNK,
						(void *)(regs->sp + i * KILN_STACK_SNAPSHOT_CHUNK)) != 0)
				break;
			copied += KILN_STACK_SNAPSHOT_CHUNK;
		}
		event->stack_len = copied;
	} else {
		event->ip = 0;
		event->sp = 0;
		event->bp = 0;
	}
	if (!read_ruby_frames(event, pid))
		read_python_frames(event, pid);
}

static __always_inline void emit_snapshot(struct bpf_perf_event_data *ctx,
					  __u32 pid, __u32 tid, __u64 cgroup_id,
					  __u64 start)
{
	struct kiln_stack_snapshot *event =
		bpf_ringbuf_reserve(&samples, sizeof(*event), 0);
	if (!event) {
		bump(KILN_COUNTER_SNAPSHOT_LOST);
		return;
	}
	struct kiln_pt_regs regs = {};
	int has_user = user_registers(ctx, &regs);
	fill_snapshot(ctx, event, pid, tid, cgroup_id, start, has_user, &regs, 0);
	bpf_ringbuf_submit(event, 0);
	bump(KILN_COUNTER_SAMPLES);
}

/*
 * The target entry of the current thread, or 0 when it is not a target.
 * `*all` is set when every process is a target (no entry to return).
 */
static __always_inline struct kiln_target *current_target(struct kiln_config *cfg,
							  __u32 pid, __u64 cgroup_id,
							  int *all)
{
	*all = 0;
	if (cfg->filter == KILN_FILTER_CGROUPS)
		return bpf_map_lookup_elem(&allowed_cgroups, &cgroup_id);
	if (cfg->filter == KILN_FILTER_PIDS)
		return bpf_map_lookup_elem(&allowed_pids, &pid);
	*all = 1;
	return 0;
}

SEC("perf_event")
int kiln_profile(struct bpf_perf_event_data *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 pid = pid_tgid >> 32;
	__u32 tid = (__u32)pid_tgid;
	if (pid == 0)
		return 0; /* idle: not CPU use */

	__u32 zero = 0;
	struct kiln_config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg)
		return 0;

	__u64 cgroup_id = bpf_get_current_cgroup_id();
	int all = 0;
	struct kiln_target *target = current_target(cfg, pid, cgroup_id, &all);
	if (!target && !all)
		return 0;
	if (target && target->keep_one_in > 1 &&
	    bpf_get_prandom_u32() % target->keep_one_in != 0) {
		bump(KILN_COUNTER_SUBSAMPLED);
		return 0;
	}

	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct task_struct *leader = BPF_CORE_READ(task, group_leader);
	__u64 start = BPF_CORE_READ(leader, start_boottime);

	announce_process(pid, start);
	if (cfg->unwind == KILN_UNWIND_STACK_SNAPSHOT) {
		emit_snapshot(ctx, pid, cfg->record_tid ? tid : 0, cgroup_id, start);
		return 0;
	}

	struct kiln_count_key key = {};
	key.pid = pid;
	key.tid = cfg->record_tid ? tid : 0;
	key.cgroup_id = cgroup_id;
	key.start_boottime_ns = start;

	__u32 generation = cfg->generation;
	void *counts;
	if (generation == 0) {
		key.user_stack_id = bpf_get_stackid(ctx, &stacks0, BPF_F_USER_STACK);
		key.kernel_stack_id = bpf_get_stackid(ctx, &stacks0, 0);
		counts = &counts0;
	} else {
		key.user_stack_id = bpf_get_stackid(ctx, &stacks1, BPF_F_USER_STACK);
		key.kernel_stack_id = bpf_get_stackid(ctx, &stacks1, 0);
		counts = &counts1;
	}
	if (key.user_stack_id < 0)
		count_stack_error(key.user_stack_id, KILN_COUNTER_USER_STACK_COLLISION);
	if (key.kernel_stack_id < 0)
		count_stack_error(key.kernel_stack_id, KILN_COUNTER_KERNEL_STACK_COLLISION);

	struct kiln_count_value *value = bpf_map_lookup_elem(counts, &key);
	if (value) {
		__sync_fetch_and_add(&value->samples, 1);
		bump(KILN_COUNTER_SAMPLES);
		return 0;
	}
	struct kiln_count_value fresh = {};
	fresh.samples = 1;
	bpf_get_current_comm(&fresh.comm, sizeof(fresh.comm));
	long err = bpf_map_update_elem(counts, &key, &fresh, BPF_NOEXIST);
	if (err == -EEXIST) {
		/* Another CPU inserted the same key between lookup and update. */
		value = bpf_map_lookup_elem(counts, &key);
		if (value)
			__sync_fetch_and_add(&value->samples, 1);
	} else if (err) {
		bump(KILN_COUNTER_COUNTS_FULL);
		return 0;
	}
	bump(KILN_COUNTER_SAMPLES);
	return 0;
}

#define KILN_NS_PER_SECOND 1000000000ULL
/*
 * Kernel frames above the scheduler in a tracepoint program's stack: the
 * program itself and bpf_trace_run4, which would lead every off-CPU stack.
 */
#define KILN_OFF_CPU_SKIP_FRAMES 2
/* TASK_INTERRUPTIBLE | TASK_UNINTERRUPTIBLE: asleep until a wakeup. */
#define KILN_TASK_SLEEPING 3

/*
 * Off-CPU, start of a block. The thread leaving the CPU (`prev`) is still
 * current here, so its user registers, user stack and kernel stack are read
 * as the sampler reads them. Only voluntary sleeps count: a preempted thread
 * is runnable, and its wait for a CPU is not time it spent blocked.
 *
 * Cost per second is bounded whatever the switch rate: one block in
 * `off_cpu_keep_one_in` is chosen at random (userspace raises it with the
 * targeted block rate, and each capture records it, so its weight stays
 * unbiased),
 * and at most `off_cpu_captures_per_second` per CPU are captured
 * (blocks past that are counted, not weighed).
 */
SEC("tp_btf/sched_switch")
int BPF_PROG(kiln_off_cpu_switch, _Bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	if (preempt || !(prev_state & KILN_TASK_SLEEPING))
		return 0;
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 pid = pid_tgid >> 32;
	__u32 tid = (__u32)pid_tgid;
	if (tid == 0)
		return 0;
	__u32 zero = 0;
	struct kiln_config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || cfg->off_cpu_keep_one_in == 0)
		return 0;
	/*
	 * The one-in-N draw comes before the target check: it is independent
	 * of the thread, so the choice stays unbiased, and the costlier lookup
	 * runs for one switch in N only (this runs at every switch of the
	 * node). The counter below is of chosen blocks; userspace multiplies
	 * it by N for the block rate.
	 */
	__u32 keep_one_in = cfg->off_cpu_keep_one_in;
	if (keep_one_in > 1 && bpf_get_prandom_u32() % keep_one_in != 0)
		return 0;
	__u64 cgroup_id = bpf_get_current_cgroup_id();
	int all = 0;
	if (!current_target(cfg, pid, cgroup_id, &all) && !all)
		return 0;
	bump(KILN_COUNTER_OFF_CPU_BLOCKS);

	__u64 now = bpf_ktime_get_ns();
	struct kiln_off_cpu_budget *budget = bpf_map_lookup_elem(&off_cpu_budget, &zero);
	if (!budget)
		return 0;
	/* Per-CPU slot: no other writer. At most a second is refilled at once. */
	__u64 per_second = cfg->off_cpu_captures_per_second;
	__u64 elapsed = now - budget->at_ns;
	if (elapsed > KILN_NS_PER_SECOND)
		elapsed = KILN_NS_PER_SECOND;
	__u64 tokens = budget->tokens + elapsed * per_second;
	if (tokens > per_second * (KILN_NS_PER_SECOND / 2))
		tokens = per_second * (KILN_NS_PER_SECOND / 2);
	budget->at_ns = now;
	if (tokens < KILN_NS_PER_SECOND) {
		budget->tokens = tokens;
		bump(KILN_COUNTER_OFF_CPU_BUDGET_SPENT);
		return 0;
	}
	budget->tokens = tokens - KILN_NS_PER_SECOND;

	struct kiln_stack_snapshot *event = bpf_map_lookup_elem(&off_cpu_scratch, &zero);
	if (!event)
		return 0;
	struct task_struct *task = bpf_get_current_task_btf();
	struct task_struct *leader = BPF_CORE_READ(task, group_leader);
	__u64 start = BPF_CORE_READ(leader, start_boottime);
	announce_process(pid, start);

	/* In the kernel: the user registers are those saved at its entry. */
	struct kiln_pt_regs regs = {};
	struct kiln_pt_regs *saved = (struct kiln_pt_regs *)bpf_task_pt_regs(task);
	int has_user = saved && bpf_probe_read_kernel(&regs, sizeof(regs), saved) == 0 &&
		       (regs.cs & 3) == 3 && regs.sp != 0;
	fill_snapshot(ctx, event, pid, cfg->record_tid ? tid : 0, cgroup_id, start,
		      has_user, &regs, KILN_OFF_CPU_SKIP_FRAMES);
	event->kind = KILN_SAMPLE_OFF_CPU;
	event->off_cpu_keep_one_in = keep_one_in;
	event->blocked_at_ns = now;
	/* A stale entry of this thread (a wakeup never seen) is replaced. */
	if (bpf_map_update_elem(&off_cpu_pending, &tid, event, BPF_ANY) == 0)
		bump(KILN_COUNTER_OFF_CPU_CAPTURED);
	return 0;
}

/*
 * Off-CPU, end of a block: at the wakeup, not at the next switch-in. On
 * some kernels (these VMs among them) sched_switch does not fire when a CPU
 * leaves idle, so the switch-in of a woken thread is often never seen;
 * sched_wakeup always is. The time from wakeup to running is run-queue
 * wait, which on-CPU profiles and scheduler metrics already show.
 */
SEC("tp_btf/sched_wakeup")
int BPF_PROG(kiln_off_cpu_wakeup, struct task_struct *woken)
{
	/*
	 * A plain load: tp_btf arguments are trusted kernel pointers, and this
	 * runs at every wakeup on the node, so no helper call is spent on it.
	 */
	__u32 tid = woken->pid;
	struct kiln_stack_snapshot *event = bpf_map_lookup_elem(&off_cpu_pending, &tid);
	if (!event)
		return 0;
	__u32 zero = 0;
	struct kiln_config *cfg = bpf_map_lookup_elem(&config, &zero);
	__u64 now = bpf_ktime_get_ns();
	__u64 blocked = now > event->blocked_at_ns ? now - event->blocked_at_ns : 0;
	if (!cfg || blocked < cfg->off_cpu_min_ns) {
		bump(KILN_COUNTER_OFF_CPU_SHORT);
	} else {
		event->off_cpu_ns = blocked;
		/*
		 * No wakeup of the reader: it polls every 100 ms, and a wakeup
		 * from inside the scheduler is work best not done there.
		 */
		if (bpf_ringbuf_output(&samples, event, sizeof(*event), BPF_RB_NO_WAKEUP) != 0)
			bump(KILN_COUNTER_OFF_CPU_LOST);
	}
	bpf_map_delete_elem(&off_cpu_pending, &tid);
	return 0;
}

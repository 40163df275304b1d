/* Syscall latency: raw_syscalls sys_enter -> sys_exit as raw tracepoints, one log2 histogram per traced syscall
 * (and per process when PER_PID is defined), with the summed nanoseconds in the same map value.
 *
 * What each syscall costs, in map operations (the per-syscall price is the point of this layout):
 * - enter: one array lookup (`traced`: syscall number -> histogram index; untraced syscalls stop here), the
 *   filters when compiled in (FILTER_PID: one hash lookup of the process id; FILTER_CGROUP: one hash lookup of
 *   the cgroup v2 id; tasks they refuse stop here), then the task's own storage slot (`in_flight`: found
 *   through the task, no hashing, created once per task) gets the start time and the index.
 * - exit: the task's storage slot (a task that is filtered out has none, and stops here), then one per-CPU
 *   array lookup (`hist`, indexed by the histogram index) whose value holds every log2 slot and the sum: one
 *   increment and one add (sloscope_hist_add in hist.h), no hash.
 * Raw tracepoints hand the program the registers and the syscall number directly: no trace record is built
 * per event as for syscalls:sys_enter_* or raw_syscalls:* perf tracepoints.
 */
#include <linux/sched.h>
#include "hist.h"

#define SLOSCOPE_SYSCALL_NR_MAX 1024

struct in_flight {
    u64 start_ns;
    u32 index;  /* 1 + the histogram index of the syscall in flight; 0 = none */
    u32 pad;
};

/* syscall number -> 1 + histogram index; 0 = not traced. Filled from user space after loading. */
BPF_ARRAY(traced, u32, SLOSCOPE_SYSCALL_NR_MAX);
BPF_TASK_STORAGE(in_flight, struct in_flight);

#ifdef PER_PID
struct pid_key {
    u32 index;
    u32 pid;
};
/* not preallocated: 16384 histograms of 520 bytes on every CPU would be reserved up front */
BPF_F_TABLE("percpu_hash", struct pid_key, struct sloscope_hist, hist, 16384, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(empty_hist, struct sloscope_hist, 1);  /* a zero value to create entries from */
#else
BPF_PERCPU_ARRAY(hist, struct sloscope_hist, SLOSCOPE_SYSCALLS);
#endif

#ifdef FILTER_CGROUP
BPF_HASH(cgroup_filter, u64, u8, 1024);
#endif
#ifdef FILTER_PID
BPF_HASH(pid_filter, u32, u8, 4096);
#endif

RAW_TRACEPOINT_PROBE(sys_enter)
{
    u32 nr = ctx->args[1];  /* a negative (invalid) number becomes large and finds nothing */
    u32 *index = traced.lookup(&nr);
    if (!index || *index == 0)
        return 0;
#ifdef FILTER_PID
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!pid_filter.lookup(&tgid))
        return 0;
#endif
#ifdef FILTER_CGROUP
    u64 cg = bpf_get_current_cgroup_id();
    if (!cgroup_filter.lookup(&cg))
        return 0;
#endif
    struct in_flight *f = in_flight.task_storage_get(bpf_get_current_task_btf(), 0,
                                                     BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!f)
        return 0;
    f->index = *index;
    f->start_ns = bpf_ktime_get_ns();
    return 0;
}

RAW_TRACEPOINT_PROBE(sys_exit)
{
    struct in_flight *f = in_flight.task_storage_get(bpf_get_current_task_btf(), 0, 0);
    if (!f || f->index == 0)
        return 0;
    u64 delta = bpf_ktime_get_ns() - f->start_ns;
    u32 index = f->index - 1;
    f->index = 0;
#ifdef PER_PID
    struct pid_key key = {};
    key.index = index;
    key.pid = bpf_get_current_pid_tgid() >> 32;
    u32 zero = 0;
    struct sloscope_hist *blank = empty_hist.lookup(&zero);
    if (!blank)
        return 0;
    struct sloscope_hist *h = hist.lookup_or_try_init(&key, blank);
#else
    struct sloscope_hist *h = hist.lookup(&index);
#endif
    if (!h)
        return 0;
    sloscope_hist_add(h, delta);
    return 0;
}

/* Syscall latency: syscalls:sys_enter_<name> -> syscalls:sys_exit_<name>, one log2 histogram per syscall
 * (and per process when PER_PID is defined), with the summed nanoseconds per syscall beside it.
 *
 * The loader attaches on_sys_enter / on_sys_exit to the enter/exit tracepoints of each configured syscall;
 * the syscall number comes from the tracepoint record (common fields, then int __syscall_nr at offset 8,
 * the same for every syscalls:* event). Optional filters, compiled in only when asked for:
 * FILTER_CGROUP (cgroup v2 ids in cgroup_filter) and FILTER_PID (process ids in pid_filter).
 */
#include <uapi/linux/ptrace.h>
#include "hist.h"

struct syscall_record {
    u64 common;        /* common_type, common_flags, common_preempt_count, common_pid */
    int __syscall_nr;
};

struct hist_key {
    u32 nr;
    u32 pid;
    u32 slot;
    u32 pad;
};

struct sum_key {
    u32 nr;
    u32 pid;
};

/* Syscall start time by thread id; 0 = not in a traced syscall. Entries are rewritten in place rather than
 * inserted and deleted per syscall (that halves the probe's cost); LRU, so exited threads age out. */
BPF_TABLE("lru_hash", u32, u64, start, 65536);
BPF_PERCPU_HASH(hist, struct hist_key, u64, 16384);
BPF_PERCPU_HASH(sums, struct sum_key, u64, 4096);

#ifdef FILTER_CGROUP
BPF_HASH(cgroup_filter, u64, u8, 1024);
#endif
#ifdef FILTER_PID
BPF_HASH(pid_filter, u32, u8, 4096);
#endif

int on_sys_enter(struct syscall_record *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
#ifdef FILTER_PID
    u32 tgid = id >> 32;
    if (!pid_filter.lookup(&tgid))
        return 0;
#endif
#ifdef FILTER_CGROUP
    u64 cg = bpf_get_current_cgroup_id();
    if (!cgroup_filter.lookup(&cg))
        return 0;
#endif
    u32 tid = id;
    u64 ts = bpf_ktime_get_ns();
    u64 *tsp = start.lookup(&tid);
    if (tsp)
        *tsp = ts;
    else
        start.update(&tid, &ts);
    return 0;
}

int on_sys_exit(struct syscall_record *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = id;
    u64 *tsp = start.lookup(&tid);
    if (!tsp || *tsp == 0)
        return 0;
    u64 delta = bpf_ktime_get_ns() - *tsp;
    *tsp = 0;

    struct hist_key hk = {};
    hk.nr = ctx->__syscall_nr;
#ifdef PER_PID
    hk.pid = id >> 32;
#endif
    hk.slot = sloscope_slot(delta);
    u64 zero = 0;
    u64 *count = hist.lookup_or_try_init(&hk, &zero);
    if (count)
        (*count)++;

    struct sum_key sk = {};
    sk.nr = hk.nr;
    sk.pid = hk.pid;
    u64 *sum = sums.lookup_or_try_init(&sk, &zero);
    if (sum)
        *sum += delta;
    return 0;
}

/* Run-queue delay: from the moment a task becomes runnable (sched:sched_wakeup, sched:sched_wakeup_new,
 * or being preempted while still runnable in sched:sched_switch) until sched:sched_switch runs it.
 * One log2 histogram for the node with the summed nanoseconds, in one per-CPU map value (runqlat's method,
 * on stable tracepoints).
 *
 * sched_switch's prev_state carries the task state bits in its low byte (S, D, T, t, X, Z, P, I) and a
 * "preempted" flag above them (TASK_REPORT_MAX, 0x100); no state bit set means still runnable. */
#include "hist.h"

#define SLOSCOPE_TASK_STATE_MASK 0xff

/* Time each thread became runnable; 0 = not waiting. Rewritten in place, not inserted and deleted per
 * switch (sched_switch is hot); LRU, so exited threads age out. */
BPF_TABLE("lru_hash", u32, u64, start, 65536);
BPF_PERCPU_ARRAY(hist, struct sloscope_hist, 1);

static __always_inline int enqueued(u32 tid)
{
    if (tid == 0)
        return 0;
    u64 ts = bpf_ktime_get_ns();
    u64 *tsp = start.lookup(&tid);
    if (tsp)
        *tsp = ts;
    else
        start.update(&tid, &ts);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
    return enqueued(args->pid);
}

TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
    return enqueued(args->pid);
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    if ((args->prev_state & SLOSCOPE_TASK_STATE_MASK) == 0)
        enqueued(args->prev_pid);

    u32 tid = args->next_pid;
    if (tid == 0)
        return 0;
    u64 *tsp = start.lookup(&tid);
    if (!tsp || *tsp == 0)
        return 0;
    u64 delta = bpf_ktime_get_ns() - *tsp;
    *tsp = 0;

    u32 zero = 0;
    struct sloscope_hist *h = hist.lookup(&zero);
    if (h)
        sloscope_hist_add(h, delta);
    return 0;
}

/* Block I/O latency per device: block:block_rq_issue -> block:block_rq_complete.
 *
 * The stable tracepoints expose no request pointer, so an in-flight request is keyed by (device, first
 * sector), as the tracepoint-only tools do; a request is only ever in flight once per sector range.
 * The tracepoint records are read through bcc's TRACEPOINT_PROBE, whose argument struct is generated from
 * the running kernel's tracefs format, so field offsets always match the kernel. */
#include "hist.h"

struct rq_key {
    u32 dev;
    u32 pad;
    u64 sector;
};

BPF_TABLE("lru_hash", struct rq_key, u64, start, 65536);
/* by device; allocated as devices appear, not 256 x 520 bytes per CPU up front */
BPF_F_TABLE("percpu_hash", u32, struct sloscope_hist, hist, 256, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(empty_hist, struct sloscope_hist, 1);  /* a zero value to create entries from */

TRACEPOINT_PROBE(block, block_rq_issue)
{
    struct rq_key key = {};
    key.dev = args->dev;
    key.sector = args->sector;
    u64 ts = bpf_ktime_get_ns();
    start.update(&key, &ts);
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete)
{
    struct rq_key key = {};
    key.dev = args->dev;
    key.sector = args->sector;
    u64 *tsp = start.lookup(&key);
    if (!tsp)
        return 0;
    u64 delta = bpf_ktime_get_ns() - *tsp;
    start.delete(&key);

    u32 zero = 0;
    struct sloscope_hist *blank = empty_hist.lookup(&zero);
    if (!blank)
        return 0;
    u32 dev = key.dev;
    struct sloscope_hist *h = hist.lookup_or_try_init(&dev, blank);
    if (h)
        sloscope_hist_add(h, delta);
    return 0;
}

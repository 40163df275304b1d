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

struct hist_key {
    u32 dev;
    u32 slot;
};

BPF_TABLE("lru_hash", struct rq_key, u64, start, 65536);
BPF_PERCPU_HASH(hist, struct hist_key, u64, 4096);
BPF_PERCPU_HASH(sums, u32, u64, 256);

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

    struct hist_key hk = {};
    hk.dev = key.dev;
    hk.slot = sloscope_slot(delta);
    u64 zero = 0;
    u64 *count = hist.lookup_or_try_init(&hk, &zero);
    if (count)
        (*count)++;
    u32 dev = key.dev;
    u64 *sum = sums.lookup_or_try_init(&dev, &zero);
    if (sum)
        *sum += delta;
    return 0;
}

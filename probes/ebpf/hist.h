/* Shared by sloscope's eBPF programs: duration bucketing.
 *
 * Durations are measured in nanoseconds (bpf_ktime_get_ns) and bucketed, bcc style, with bpf_log2l, but
 * in a binary unit of 2^-30 s (about 0.93 ns) instead of nanoseconds, so that log2 slots are powers of two
 * of a second and map one to one onto OTLP exponential-histogram buckets at scale 0 (probes/sample.py
 * documents the mapping; UNIT_SHIFT there must equal 30).
 *
 * slot 0 holds a duration of 0; slot k >= 1 holds 2^(k-1) <= units < 2^k.
 * units = ns * 2^30 / 10^9 = ns * 2^21 / 5^9. The product overflows 64 bits above 2^43 ns (about 2.4 h);
 * longer durations divide first (losing precision far below one log2 bucket).
 */
#ifndef SLOSCOPE_HIST_H
#define SLOSCOPE_HIST_H

#define SLOSCOPE_HIST_SLOTS 64

/* One histogram as one map value: a probe updates every count and the sum through a single map lookup. */
struct sloscope_hist {
    u64 slots[SLOSCOPE_HIST_SLOTS];
    u64 sum_ns;
};

static __always_inline u64 sloscope_ns_to_units(u64 ns)
{
    if (ns < (1ULL << 43))
        return ns * 2097152ULL / 1953125ULL;
    return ns / 1953125ULL * 2097152ULL;
}

static __always_inline u32 sloscope_slot(u64 ns)
{
    u64 units = sloscope_ns_to_units(ns);
    if (units == 0)
        return 0;
    return bpf_log2l(units);
}

/* Plain increments: the histograms live in per-CPU maps, and a program never runs nested on its own CPU. */
static __always_inline void sloscope_hist_add(struct sloscope_hist *h, u64 ns)
{
    h->slots[sloscope_slot(ns) & (SLOSCOPE_HIST_SLOTS - 1)]++;
    h->sum_ns += ns;
}

#endif

/* TCP round-trip time: the smoothed RTT of the connection a segment arrives on, taken as tcp_rcv_established
 * handles the segment (tcprtt's method), one log2 histogram for the node with the summed nanoseconds, in one
 * per-CPU map value.
 *
 * tcp_rcv_established fires tcp:tcp_probe first thing, and the record carries `srtt`: the socket's srtt_us
 * (microseconds, stored shifted left by 3) shifted back, as tcp_info's tcpi_rtt is, so the netlink fallback
 * (probes/procfs/tcp_info.py) buckets the same whole microseconds. The record is read through bcc's
 * TRACEPOINT_PROBE, whose argument struct comes from the running kernel's tracefs format. Reading srtt_us out of
 * struct tcp_sock instead (from a kprobe or a raw tracepoint) would take its offset from the installed kernel
 * headers, which need not match the running kernel: where they do not, the read returns another field and
 * nothing says so. A kprobe also needs CONFIG_KPROBES, which some kernels leave out.
 *
 * An srtt of 0 means no RTT sample yet on that connection: not a measurement, left out. */
#include "hist.h"

BPF_PERCPU_ARRAY(hist, struct sloscope_hist, 1);

TRACEPOINT_PROBE(tcp, tcp_probe)
{
    u32 srtt_us = args->srtt;
    if (srtt_us == 0)
        return 0;

    u32 zero = 0;
    struct sloscope_hist *h = hist.lookup(&zero);
    if (h)
        sloscope_hist_add(h, (u64)srtt_us * 1000);
    return 0;
}

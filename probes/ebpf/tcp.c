/* TCP: retransmitted skbs (tcp:tcp_retransmit_skb) and state transitions counted by new state
 * (sock:inet_sock_set_state, TCP only). Per-CPU counters; user space sums and differences them. */
#define SLOSCOPE_IPPROTO_TCP 6
#define SLOSCOPE_TCP_STATES 16

BPF_PERCPU_ARRAY(retransmits, u64, 1);
BPF_PERCPU_ARRAY(transitions, u64, SLOSCOPE_TCP_STATES);

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
    u32 zero = 0;
    u64 *count = retransmits.lookup(&zero);
    if (count)
        (*count)++;
    return 0;
}

TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    if (args->protocol != SLOSCOPE_IPPROTO_TCP)
        return 0;
    u32 state = args->newstate;
    u64 *count = transitions.lookup(&state);  /* out-of-range states find nothing */
    if (count)
        (*count)++;
    return 0;
}

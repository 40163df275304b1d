"""eBPF probes (bcc): each a BPF C program in its own .c file beside a small Python loader."""

"""Protocol-faithful stand-ins for parts this machine lacks (an SPDK target, dcgm-exporter, an NVIDIA driver),
built from the documented wire formats so the real client code paths run unchanged against them."""

"""GPU probes: NVML through nvidia-ml-py (imported only when the probe runs, so everything else works on a
host without an NVIDIA driver), dcgm-exporter's Prometheus endpoint, and the GPU memory-leak rule."""

"""GPU probes: NVML through nvidia-ml-py (imported only when the probe runs, so everything else works on a
host without an NVIDIA driver) and dcgm-exporter's Prometheus endpoint. The GPU memory-leak rule is
sloscope.taxonomy.GPU_MEMORY_LEAK, which `sloscope rules` writes as a Prometheus alert."""

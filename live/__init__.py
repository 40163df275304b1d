"""The live demo: the real pipeline (serve, collect with the kernel probes, an instrumented service under load)
with real faults injected one at a time, each attributed by rca and scored against what was injected."""

"""SLO specs that declare a cause and its evidence of their own, and a Prometheus histogram's bounds, shared by
the tests of declared signals on both stores."""

TIERS = """\
default_tier: standard
tiers:
  standard:
    latency: {percentile: 95, threshold_ms: 200}
    availability: 99.5
"""
QUEUE = "causes:\n  batch_queue: {layer: runtime, physical: queued, remediation: 'scale {node}'}\n"
QUEUE_TIME = TIERS + QUEUE + "evidence:\n  - {metric: 'myllm:queue_time_seconds', cause: batch_queue, " \
    "harmful: up}\n"
BOUNDS = [0.3, 0.5, 0.8, 1.0, 2.5, 5.0]

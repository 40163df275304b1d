"""The live demo's settings and its SLO spec, and its clock: naive UTC, as the store keeps times."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

FAULT_NAMES = ("cpu", "disk", "network", "memory")
SLO_YAML = """\
# The live demo's SLO spec: objectives for the small inference service it runs (tens of ms per request),
# and a 5 s SLI step so that an incident (two violating steps) is visible within seconds.
default_tier: standard
tiers:
  p99-latency-critical:
    latency: {{percentile: 99, threshold_ms: {critical_ms}}}
    availability: 99.0
  standard:
    latency: {{percentile: 95, threshold_ms: {standard_ms}}}
    availability: 98.0
window: 30d
resolution: 5s
"""


@dataclass
class LiveConfig:
    dir: Path = Path("var/demo-live")
    node: str = "live-node-1"
    faults: tuple[str, ...] = FAULT_NAMES
    warmup_s: float = 100.0
    fault_s: float = 40.0
    recovery_s: float = 90.0
    baseline_s: float = 60.0
    lookback_s: float = 20.0
    rate: float = 10.0
    critical_share: float = 0.5
    model_kib: int = 6144  # hashed per request: ~4.5 ms of CPU, longer than a scheduler time slice
    burst_factor: float = 10.0
    burst_s: float = 5.0
    interval_s: float = 1.0
    poll_s: float = 5.0
    critical_ms: float = 75.0
    standard_ms: float = 50.0
    loss_percent: int = 25
    cpu_workers_per_cpu: int = 16
    memory_limit_mib: int = 1024  # the service's memory cgroup; its weights and caches take about half
    disk_jobs: int = 4
    service_cpus: str = ""  # default: the last CPU (of several), else all
    system_cpus: str = ""  # serve, collect, load, backend, fio: default the other CPUs (or all)
    python: str = sys.executable

    def slo_yaml(self) -> str:
        return SLO_YAML.format(critical_ms=self.critical_ms, standard_ms=self.standard_ms)


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)

"""/proc/schedstat -> sloscope.cpu.runqueue.delay as a Sum in seconds (deltas of the summed per-CPU run_delay):
the fallback when the eBPF run-queue histogram cannot run. Needs a kernel with CONFIG_SCHEDSTATS."""

from __future__ import annotations

from dataclasses import dataclass

from .common import ProcfsProbe

SIGNAL = "sloscope.cpu.runqueue.delay"
KNOWN_VERSIONS = (15, 16, 17)


@dataclass(frozen=True, slots=True)
class CpuSchedstat:
    cpu_time_ns: int  # time tasks spent running on this CPU
    run_delay_ns: int  # time tasks spent waiting on this CPU's run queue
    timeslices: int


@dataclass(frozen=True, slots=True)
class Schedstat:
    version: int
    timestamp: int
    cpus: dict[int, CpuSchedstat]

    @property
    def run_delay_ns(self) -> int:
        return sum(c.run_delay_ns for c in self.cpus.values())


def parse_schedstat(text: str) -> Schedstat:
    """Documentation/scheduler/sched-stats.rst: 'cpuN' lines carry 9 numbers in versions 15-17, of which the
    7th-9th are rq_cpu_time, run_delay (ns) and pcount; 'domainN' lines are skipped."""
    version, timestamp, cpus = None, 0, {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "version":
            version = int(parts[1])
        elif parts[0] == "timestamp":
            timestamp = int(parts[1])
        elif parts[0].startswith("cpu") and parts[0][3:].isdigit():
            nums = [int(v) for v in parts[1:]]
            if len(nums) < 9:
                raise ValueError(f"schedstat cpu line has {len(nums)} numbers, want 9: {line!r}")
            cpus[int(parts[0][3:])] = CpuSchedstat(cpu_time_ns=nums[6], run_delay_ns=nums[7], timeslices=nums[8])
    if version is None:
        raise ValueError("schedstat text has no version line")
    if version < 15:
        raise ValueError(f"schedstat version {version} is older than 15 (run_delay was in jiffies)")
    return Schedstat(version, timestamp, cpus)


class SchedstatProbe(ProcfsProbe):
    name = "schedstat"
    signals = (SIGNAL,)
    description = "run-queue delay total (/proc/schedstat run_delay)"
    files = ("schedstat",)
    hints = {"schedstat": "kernel built without CONFIG_SCHEDSTATS"}

    def read_counters(self):
        return {(SIGNAL, ()): parse_schedstat(self.read_text("schedstat")).run_delay_ns / 1e9}

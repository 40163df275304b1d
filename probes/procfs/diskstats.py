"""/proc/diskstats -> system.disk.io_time (s the device was busy, deltas), per whole device."""

from __future__ import annotations

import os

from .common import ProcfsProbe

SIGNAL = "system.disk.io_time"

# Documentation/admin-guide/iostats.rst: after major, minor and name, fields 1..17 (4.18+ adds 12-15,
# 5.5+ adds 16-17; older kernels have only 1-11).
FIELDS = ("reads_completed", "reads_merged", "sectors_read", "read_ms", "writes_completed", "writes_merged",
          "sectors_written", "write_ms", "in_flight", "io_ms", "weighted_io_ms", "discards_completed",
          "discards_merged", "sectors_discarded", "discard_ms", "flushes_completed", "flush_ms")


def parse_diskstats(text: str) -> dict[str, dict[str, int]]:
    """device name -> {"major", "minor", field name: value} for as many fields as the kernel reports."""
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 3 + 11:
            raise ValueError(f"diskstats line has {len(parts)} columns, want at least 14: {line!r}")
        stats = {"major": int(parts[0]), "minor": int(parts[1])}
        stats.update(zip(FIELDS, (int(v) for v in parts[3:3 + len(FIELDS)])))
        out[parts[2]] = stats
    return out


def is_partition(name: str, sysfs: str = "/sys") -> bool:
    return os.path.exists(os.path.join(sysfs, "class/block", name.replace("/", "!"), "partition"))


class DiskstatsProbe(ProcfsProbe):
    name = "diskstats"
    signals = (SIGNAL,)
    description = "device busy time (/proc/diskstats field 10)"
    files = ("diskstats",)

    def __init__(self, proc: str = "/proc", *, include_partitions: bool = False, sysfs: str = "/sys", host=None):
        super().__init__(proc, host)
        self.include_partitions = include_partitions
        self.sysfs = sysfs
        self._partitions: dict[str, bool] = {}  # asked of sysfs once per device name, not every collect

    def _is_partition(self, device: str) -> bool:
        if device not in self._partitions:
            self._partitions[device] = is_partition(device, self.sysfs)
        return self._partitions[device]

    def read_counters(self):
        out = {}
        for device, stats in parse_diskstats(self.read_text("diskstats")).items():
            if stats["reads_completed"] == 0 and stats["writes_completed"] == 0 and stats["io_ms"] == 0:
                continue  # never used (idle loop and ram devices)
            if not self.include_partitions and self._is_partition(device):
                continue
            out[(SIGNAL, (("system.device", device),))] = stats["io_ms"] / 1e3
        return out

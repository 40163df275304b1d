"""Syscall latency per syscall (sloscope.syscall.duration), from the raw sys_enter/sys_exit tracepoints.

    probe = SyscallLatencyProbe(syscalls=("read", "write"), cgroups=["/sys/fs/cgroup/unified/job"], pids=[42])

`cgroups` takes cgroup v2 ids or paths of cgroup v2 directories (absolute, or relative to the cgroup2 mount);
`pids` takes process ids (all threads of each process). Both set: a syscall must match both.
`per_pid=True` adds the `process.pid` attribute (one histogram per process and syscall).

The programs hang on the raw tracepoints that every syscall passes (cheaper per event than the per-syscall
trace events); the syscalls:sys_enter_<name> events still tell which syscalls this kernel traces (they exist
exactly where the raw ones do, CONFIG_FTRACE_SYSCALLS) and so decide what is noted and skipped.
"""

from __future__ import annotations

import os
import struct
from typing import Iterable

from ..base import Availability, find_tracefs, tracepoint_exists
from ..sample import UNIT_SHIFT, AnySample, log2_histogram
from .loader import BccProbe, HistogramDeltas, LoadedProgram, read_histograms
from .maps import BpfMap, index_key

SIGNAL = "sloscope.syscall.duration"
DEFAULT_SYSCALLS = ("read", "write", "readv", "writev", "sendmsg", "recvmsg", "sendto", "recvfrom",
                    "fsync", "fdatasync", "openat")
SYSCALL_NR_MAX = 1024  # SLOSCOPE_SYSCALL_NR_MAX in syscall_latency.c
assert UNIT_SHIFT == 30  # hist.h converts ns to 2^-30 s units


def cgroup2_mounts() -> list[str]:
    mounts = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["cgroup2"]:
                    mounts.append(left.split()[4])
    except OSError:
        pass
    return mounts


def cgroup_id(cgroup: int | str) -> int:
    """The cgroup v2 id (the directory's inode number in cgroupfs) of an id or a cgroup2 path."""
    if isinstance(cgroup, int) or (isinstance(cgroup, str) and cgroup.isdigit()):
        return int(cgroup)
    path = str(cgroup)
    if not os.path.isabs(path):
        mounts = cgroup2_mounts()
        if not mounts:
            raise ValueError(f"cgroup {path!r}: no cgroup2 filesystem mounted")
        path = os.path.join(mounts[0], path)
    if not any(os.path.commonpath([path, m]) == m for m in cgroup2_mounts()):
        raise ValueError(f"cgroup {path!r} is not inside a cgroup2 mount ({', '.join(cgroup2_mounts()) or 'none'})")
    return os.stat(path).st_ino


class SyscallLatencyProbe(BccProbe):
    name = "syscall"
    signals = (SIGNAL,)
    description = "syscall latency histograms (eBPF raw tracepoints sys_enter -> sys_exit)"
    c_file = "syscall_latency.c"
    any_tracepoint = True
    maps = ("traced", "hist")

    def __init__(self, syscalls: Iterable[str] = DEFAULT_SYSCALLS, *, cgroups: Iterable[int | str] = (),
                 pids: Iterable[int] = (), per_pid: bool = False, host=None):
        super().__init__(host)
        self.syscalls = tuple(dict.fromkeys(syscalls))
        if not self.syscalls:
            raise ValueError("no syscalls to trace")
        self.cgroups = tuple(cgroups)
        self.pids = tuple(int(p) for p in pids)
        self.per_pid = per_pid
        self._names: dict[int, str] = {}  # histogram index -> syscall name
        self._deltas = HistogramDeltas()
        self.attached: tuple[str, ...] = ()

    def tracepoints(self) -> list[str]:
        return [f"syscalls:sys_{edge}_{s}" for s in self.syscalls for edge in ("enter", "exit")]

    def cflags(self) -> list[str]:
        flags = [f"-DSLOSCOPE_SYSCALLS={len(self.syscalls)}"]
        if self.cgroups:
            flags.append("-DFILTER_CGROUP")
        if self.pids:
            flags.append("-DFILTER_PID")
        if self.per_pid:
            flags.append("-DPER_PID")
        return flags

    def check(self) -> Availability:
        availability = super().check()
        if availability.ok and self.cgroups:
            try:
                [cgroup_id(c) for c in self.cgroups]
            except (OSError, ValueError) as exc:
                return Availability(self.name, (f"cgroup filter: {exc}",), availability.notes)
        return availability

    def map_names(self) -> tuple[str, ...]:
        return self.maps + ("pid_filter",) * bool(self.pids) + ("cgroup_filter",) * bool(self.cgroups)

    def syscalls_to_resolve(self) -> tuple[str, ...]:
        return self.syscalls

    def configure(self, program: LoadedProgram) -> None:
        tracefs, _ = find_tracefs(self.host)
        maps, attached = program.maps, []
        for s in self.syscalls:
            enter, exit_ = f"syscalls:sys_enter_{s}", f"syscalls:sys_exit_{s}"
            if not (tracepoint_exists(self.host, tracefs, enter) and tracepoint_exists(self.host, tracefs, exit_)):
                continue  # already in the availability notes
            nr = program.syscalls.get(s)
            if nr is None or not 0 <= nr < SYSCALL_NR_MAX:
                self._notes.append(f"syscall {s}: number unknown on this architecture, skipped")
                continue
            self._names[len(attached)] = s
            attached.append((s, nr))
        if not attached:
            raise RuntimeError(f"none of the syscalls {', '.join(self.syscalls)} has tracepoints here")
        one = struct.pack("=B", 1)
        for pid in self.pids:
            maps["pid_filter"].update(struct.pack("=I", pid), one)
        for cg in self.cgroups:
            maps["cgroup_filter"].update(struct.pack("=Q", cgroup_id(cg)), one)
        # the index last: until a syscall has one, the programs stop at its first lookup
        for index, (_, nr) in enumerate(attached):
            maps["traced"].update(index_key(nr), struct.pack("=I", index + 1))
        self.attached = tuple(s for s, _ in attached)

    def read(self, maps: dict[str, BpfMap], start_ns: int, now: int) -> list[AnySample]:
        hist = maps["hist"]
        if self.per_pid:
            keys = [(raw, struct.unpack("=II", raw)) for raw in hist.keys()]
        else:
            keys = [(index_key(index), (index, 0)) for index in self._names]
        slots, sums = read_histograms(hist, keys)
        samples: list[AnySample] = []
        for (index, pid), (delta, sum_ns) in sorted(self._deltas.update(slots, sums).items()):
            attributes: dict[str, str | int] = {"syscall.name": self._names.get(index, f"index_{index}")}
            if self.per_pid:
                attributes["process.pid"] = pid
            samples.append(log2_histogram(SIGNAL, attributes, delta, sum_ns / 1e9, start_ns, now))
        return samples

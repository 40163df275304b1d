"""Syscall latency per syscall (sloscope.syscall.duration), from syscalls:sys_enter_*/sys_exit_*.

    probe = SyscallLatencyProbe(syscalls=("read", "write"), cgroups=["/sys/fs/cgroup/unified/job"], pids=[42])

`cgroups` takes cgroup v2 ids or paths of cgroup v2 directories (absolute, or relative to the cgroup2 mount);
`pids` takes process ids (all threads of each process). Both set: a syscall must match both.
`per_pid=True` adds the `process.pid` attribute (one histogram per process and syscall).
"""

from __future__ import annotations

import os
from typing import Iterable

from ..base import Availability
from ..sample import UNIT_SHIFT, AnySample, log2_histogram
from .loader import BccProbe, HistogramDeltas, attach_tracepoints, group_slots, read_map

SIGNAL = "sloscope.syscall.duration"
DEFAULT_SYSCALLS = ("read", "write", "readv", "writev", "sendmsg", "recvmsg", "sendto", "recvfrom",
                    "fsync", "fdatasync", "openat")
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


def syscall_numbers() -> dict[str, int]:
    """Syscall name -> number for this architecture (bcc's table, or ausyscall when installed)."""
    from bcc.syscall import syscalls

    return {name.decode(): nr for nr, name in syscalls.items()}


class SyscallLatencyProbe(BccProbe):
    name = "syscall"
    signals = (SIGNAL,)
    description = "syscall latency histograms (eBPF syscalls:sys_enter_*/sys_exit_*)"
    c_file = "syscall_latency.c"
    any_tracepoint = True

    def __init__(self, syscalls: Iterable[str] = DEFAULT_SYSCALLS, *, cgroups: Iterable[int | str] = (),
                 pids: Iterable[int] = (), per_pid: bool = False, host=None):
        super().__init__(host)
        self.syscalls = tuple(dict.fromkeys(syscalls))
        if not self.syscalls:
            raise ValueError("no syscalls to trace")
        self.cgroups = tuple(cgroups)
        self.pids = tuple(int(p) for p in pids)
        self.per_pid = per_pid
        self._names: dict[int, str] = {}
        self._deltas = HistogramDeltas()
        self.attached: tuple[str, ...] = ()

    def tracepoints(self) -> list[str]:
        return [f"syscalls:sys_{edge}_{s}" for s in self.syscalls for edge in ("enter", "exit")]

    def cflags(self) -> list[str]:
        flags = []
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

    def attach(self, bpf) -> None:
        from ..base import find_tracefs, tracepoint_exists

        numbers = syscall_numbers()
        tracefs, _ = find_tracefs(self.host)
        pairs, attached = [], []
        for s in self.syscalls:
            enter, exit_ = f"syscalls:sys_enter_{s}", f"syscalls:sys_exit_{s}"
            if not (tracepoint_exists(self.host, tracefs, enter) and tracepoint_exists(self.host, tracefs, exit_)):
                continue  # already in the availability notes
            if s not in numbers:
                self._notes += (f"syscall {s}: number unknown on this architecture, skipped",)
                continue
            self._names[numbers[s]] = s
            pairs += [(exit_, "on_sys_exit"), (enter, "on_sys_enter")]
            attached.append(s)
        if not pairs:
            raise RuntimeError(f"none of the syscalls {', '.join(self.syscalls)} has tracepoints here")
        if self.pids:
            table = bpf[b"pid_filter"]
            for pid in self.pids:
                table[table.Key(pid)] = table.Leaf(1)
        if self.cgroups:
            table = bpf[b"cgroup_filter"]
            for cg in self.cgroups:
                table[table.Key(cgroup_id(cg))] = table.Leaf(1)
        # exits first: an enter never waits for an exit program that is not there yet
        attach_tracepoints(bpf, pairs)
        self.attached = tuple(attached)

    def read(self, bpf, start_ns: int, now: int) -> list[AnySample]:
        slots = group_slots(read_map(bpf[b"hist"], lambda k: ((k.nr, k.pid), k.slot)))
        sums = read_map(bpf[b"sums"], lambda k: (k.nr, k.pid))
        samples: list[AnySample] = []
        for (nr, pid), (delta, sum_ns) in sorted(self._deltas.update(slots, sums).items()):
            attributes: dict[str, str | int] = {"syscall.name": self._names.get(nr, f"nr_{nr}")}
            if self.per_pid:
                attributes["process.pid"] = pid
            samples.append(log2_histogram(SIGNAL, attributes, delta, sum_ns / 1e9, start_ns, now))
        return samples

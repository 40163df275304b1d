"""What the procfs probes share: a /proc root (so a network namespace can be read through /proc/PID),
availability as "which file is missing or unreadable", and counter baselines."""

from __future__ import annotations

import errno
import os
from typing import ClassVar, Hashable

from ..base import Availability, Probe, ProbeError, ProbeUnavailable
from ..sample import AnySample, Sample, counter_delta


class ProcfsProbe(Probe):
    source = "procfs"
    files: ClassVar[tuple[str, ...]]  # paths relative to the /proc root, all needed
    optional_files: ClassVar[tuple[str, ...]] = ()
    hints: ClassVar[dict[str, str]] = {}  # file -> why it may be missing

    def __init__(self, proc: str = "/proc", host=None):
        super().__init__(host)
        self.proc = proc
        self._prev: dict[Hashable, float] = {}

    def path(self, rel: str) -> str:
        return os.path.join(self.proc, rel)

    def read_text(self, rel: str) -> str:
        with open(self.path(rel)) as f:
            return f.read()

    def check(self) -> Availability:
        missing = []
        for rel in self.files:
            problem = self._file_problem(rel)
            if problem:
                missing.append(problem)
        return Availability(self.name, tuple(missing))

    def _file_problem(self, rel: str) -> str | None:
        path = self.path(rel)
        hint = self.hints.get(rel, "")
        try:
            with open(path) as f:
                f.read(1)
        except FileNotFoundError:
            return f"{path}: not found" + (f" ({hint})" if hint else "")
        except PermissionError:
            return f"{path}: not readable by euid {os.geteuid()}"
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:
                return f"{path}: not supported by this kernel" + (f" ({hint})" if hint else "")
            return f"{path}: {exc.strerror}"
        return None

    def _start(self) -> None:
        self._require_available()
        try:
            self._prev = self.read_counters()
        except (OSError, ValueError) as exc:
            raise ProbeUnavailable(self.name, [f"reading {self.name} failed: {exc}"]) from exc

    def _collect(self, start_ns: int, now: int) -> list[AnySample]:
        try:
            return self.read_samples(start_ns, now)
        except (OSError, ValueError) as exc:
            raise ProbeError(f"{self.name}: {exc}") from exc

    # Counter probes implement read_counters() -> {(name, attrs as tuple): cumulative value in the
    # signal's unit}; gauge probes override read_samples() instead.
    def read_counters(self) -> dict[Hashable, float]:
        return {}

    def read_samples(self, start_ns: int, now: int) -> list[AnySample]:
        current = self.read_counters()
        samples = []
        for key, value in current.items():
            name, attrs = key
            samples.append(Sample(name, dict(attrs), now, counter_delta(self._prev.get(key, value), value),
                                  "counter_delta", start_ns))
        self._prev = current
        return samples

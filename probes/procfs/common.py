"""What the procfs probes share: a /proc root (so a network namespace can be read through /proc/PID),
availability as "which file is missing or unreadable", and counter baselines."""

from __future__ import annotations

import errno
import os
from typing import ClassVar, Hashable

from ..base import Availability, Probe, ProbeError, ProbeUnavailable, now_ns
from ..sample import AnySample, Sample, counter_delta


class ProcfsProbe(Probe):
    source = "procfs"
    files: ClassVar[tuple[str, ...]]  # paths relative to the /proc root, all needed
    optional_files: ClassVar[tuple[str, ...]] = ()
    hints: ClassVar[dict[str, str]] = {}  # file -> why it may be missing

    def __init__(self, proc: str = "/proc", host=None):
        super().__init__(host)
        self.proc = proc
        self._running = False
        self._last_ns = 0
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

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        if self._running:
            return
        availability = self.check()
        if not availability.ok:
            raise ProbeUnavailable(self.name, availability.missing)
        try:
            self._prev = self.read_counters()
        except (OSError, ValueError) as exc:
            raise ProbeUnavailable(self.name, [f"reading {self.name} failed: {exc}"]) from exc
        self._last_ns = now_ns()
        self._running = True

    def collect(self) -> list[AnySample]:
        if not self._running:
            raise ProbeError(f"probe {self.name!r} is not started")
        now = now_ns()
        try:
            samples = self.read_samples(self._last_ns, now)
        except (OSError, ValueError) as exc:
            raise ProbeError(f"{self.name}: {exc}") from exc
        self._last_ns = now
        return samples

    def stop(self) -> None:
        self._running = False

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

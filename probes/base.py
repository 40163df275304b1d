"""The one probe interface, and how a probe says what it is missing.

Every probe, eBPF or procfs, has the same life: `check()` (never raises: lists what is missing),
`start()` (raises `ProbeUnavailable` with that list, or with the compile/attach error, and leaves nothing
attached), `collect()` (samples since the previous collect: counters and histograms as deltas, gauges as
readings) and `stop()` (detaches everything; idempotent; also run by `with probe:` on Ctrl-C or error).

`Probe` keeps that life once: whether it runs, when the interval began, the refusal to collect unstarted, cleaning
up after a failed start; a probe writes only its own part (`_start`, `_collect`, `_stop`).

The host checks go through `Host`, so a test or a caller can substitute a host that lacks something.
"""

from __future__ import annotations

import abc
import functools
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import ClassVar, Iterable

from sloscope import catalog

from .sample import AnySample

TRACEFS_MOUNTS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
BTF_PATH = "/sys/kernel/btf/vmlinux"
KHEADERS_PATH = "/sys/kernel/kheaders.tar.xz"

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39


class ProbeError(RuntimeError):
    """A started probe failed (e.g. a map could not be read)."""


class ProbeUnavailable(ProbeError):
    """A probe cannot run on this host; `missing` says exactly why, one item per missing thing."""

    def __init__(self, probe: str, missing: Iterable[str]):
        self.probe = probe
        self.missing = tuple(missing)
        super().__init__(f"probe {probe!r} unavailable: " + "; ".join(self.missing))


@dataclass(frozen=True, slots=True)
class Availability:
    probe: str
    missing: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # things that limit the probe without stopping it

    @property
    def ok(self) -> bool:
        return not self.missing

    def explain(self) -> str:
        if self.ok:
            return f"{self.probe}: available" + "".join(f"; {n}" for n in self.notes)
        return f"{self.probe}: unavailable: " + "; ".join(self.missing)


class Host:
    """What the availability checks ask of the machine. Override methods to describe another host."""

    def euid(self) -> int:
        return os.geteuid()

    def effective_capabilities(self) -> int | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("CapEff:"):
                        return int(line.split()[1], 16)
        except OSError:
            pass
        return None

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def accessible(self, path: str) -> bool:
        return os.access(path, os.R_OK | os.X_OK)

    def kernel_release(self) -> str:
        return os.uname().release

    def bcc_import_error(self) -> str | None:
        return bcc_import_error()


@functools.cache
def bcc_import_error() -> str | None:
    """Why `import bcc` fails (ImportError, or libbcc failing to load), asked once of a child interpreter:
    importing bcc maps libbcc with clang and LLVM (about 70 MiB resident), which only the compile needs,
    and the compile runs in a child too (probes/ebpf/compile.py)."""
    try:
        proc = subprocess.run([sys.executable, "-c", "import bcc"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"the interpreter exited with status {proc.returncode}"


def privilege_missing(host: Host) -> str | None:
    caps = host.effective_capabilities()
    uid = host.euid()
    if caps is None:
        ok = uid == 0
    else:
        ok = bool(caps >> CAP_SYS_ADMIN & 1) or bool((caps >> CAP_BPF & 1) and (caps >> CAP_PERFMON & 1))
    if ok:
        return None
    return (f"privilege: loading eBPF needs root (CAP_SYS_ADMIN) or CAP_BPF+CAP_PERFMON; "
            f"this process (euid {uid}) has neither")


def find_tracefs(host: Host) -> tuple[str | None, str | None]:
    """(tracefs root, None) or (None, what is wrong)."""
    present = [m for m in TRACEFS_MOUNTS if host.exists(os.path.join(m, "events"))]
    for m in present:
        if host.accessible(m) and host.accessible(os.path.join(m, "events")):
            return m, None
    if present:
        return None, (f"tracefs: {present[0]} is not readable by euid {host.euid()} "
                      "(tracepoints cannot be listed or attached)")
    return None, ("tracefs: not mounted at " + " or ".join(TRACEFS_MOUNTS)
                  + " (mount -t tracefs tracefs /sys/kernel/tracing)")


def tracepoint_exists(host: Host, tracefs: str, tracepoint: str) -> bool:
    category, event = tracepoint.split(":", 1)
    return host.exists(os.path.join(tracefs, "events", category, event, "format"))


def ebpf_missing(host: Host, tracepoints: Iterable[str], *, any_of: bool = False) -> tuple[list[str], list[str]]:
    """(missing, notes) for a bcc probe needing `tracepoints` (all of them, or with any_of at least one).
    Checks: the bcc module, privilege, BTF, kernel headers, tracefs, each tracepoint."""
    missing: list[str] = []
    notes: list[str] = []
    err = host.bcc_import_error()
    if err:
        missing.append(f"bcc: Python module not importable (Debian package python3-bpfcc): {err}")
    priv = privilege_missing(host)
    if priv:
        missing.append(priv)
    if not host.exists(BTF_PATH):
        missing.append(f"BTF: {BTF_PATH} not found (kernel built without CONFIG_DEBUG_INFO_BTF)")
    release = host.kernel_release()
    build = f"/lib/modules/{release}/build"
    if not (host.exists(os.path.join(build, "include")) or host.exists(KHEADERS_PATH)):
        missing.append(f"kernel headers: {build} not found and no {KHEADERS_PATH} "
                       "(install linux-headers for this kernel, or link /lib/modules/$(uname -r)/build to them)")
    tracefs, problem = find_tracefs(host)
    if problem:
        missing.append(problem)
    else:
        tps = list(tracepoints)
        absent = [tp for tp in tps if not tracepoint_exists(host, tracefs, tp)]
        if absent and (not any_of or len(absent) == len(tps)):
            missing.extend(f"tracepoint {tp}: not in {tracefs}/events (this kernel lacks it)" for tp in absent)
        elif absent:
            notes.extend(f"tracepoint {tp}: not in {tracefs}/events, skipped" for tp in absent)
    return missing, notes


class Probe(abc.ABC):
    """A signal source. Subclasses set `name`, `source` ("ebpf" or "procfs") and `signals` (catalog names),
    and write `check()` and `_collect()`, with `_start()` and `_stop()` where they hold something."""

    name: ClassVar[str]
    source: ClassVar[str]
    signals: ClassVar[tuple[str, ...]]
    description: ClassVar[str] = ""
    # The least time between two reads, for a source that costs much to read and changes slowly: a collect
    # before the next read is due returns nothing. None: read at every collect.
    period_s: ClassVar[float | None] = None

    def __init__(self, host: Host | None = None):
        self.host = host or Host()
        for s in self.signals:
            catalog.signal(s)  # a probe may only emit catalog signals
        self._running = False
        self._last_ns = 0  # where the next collect's interval begins
        self._due_ns = 0  # with a period: when the next read is due
        self._notes: list[str] = []

    @abc.abstractmethod
    def check(self) -> Availability:
        """What this probe lacks on this host; never raises."""

    def start(self) -> None:
        """Attach / take the baseline. Raises ProbeUnavailable (nothing left attached) if it cannot run."""
        if self._running:
            return
        try:
            self._start()
        except BaseException:
            self._stop()  # whatever the failed start opened or attached
            raise
        self._last_ns = now_ns()
        self._running = True

    def collect(self) -> list[AnySample]:
        """Samples since the previous collect (or since start)."""
        if not self._running:
            raise ProbeError(f"probe {self.name!r} is not started")
        now = now_ns()
        if now < self._due_ns:
            return []
        samples = self._collect(self._last_ns, now)
        self._last_ns = now  # a failed collect leaves its interval to the next one
        if self.period_s is not None:
            # Due a little early, so that collects a period apart, give or take their jitter, each read.
            self._due_ns = now + int((self.period_s - min(0.5, self.period_s / 10)) * 1e9)
        return samples

    def stop(self) -> None:
        """Detach everything. Idempotent."""
        self._running = False
        self._stop()

    @property
    def running(self) -> bool:
        return self._running

    # -- what a probe writes ---------------------------------------------------------------------------------
    def _start(self) -> None:
        """Get ready to collect (attach, open, take baselines). Raise ProbeUnavailable if the probe cannot run;
        what was opened is closed by `_stop()`. By default: refuse what `check()` finds missing."""
        self._require_available()

    def _collect(self, start_ns: int, now: int) -> list[AnySample]:
        """The samples of the interval [start_ns, now]; ProbeError when the source fails."""
        raise NotImplementedError(f"{type(self).__name__} does not collect")

    def _stop(self) -> None:
        """Close what `_start()` opened; also after a start that failed half-way, and again (idempotent)."""

    def _require_available(self) -> Availability:
        availability = self.check()
        if not availability.ok:
            raise ProbeUnavailable(self.name, availability.missing)
        return availability

    # -- notes -----------------------------------------------------------------------------------------------
    @property
    def notes(self) -> tuple[str, ...]:
        """What limits a running probe without stopping it (e.g. a syscall without tracepoints here)."""
        return tuple(self._notes)

    def _note(self, text: str, level: int = logging.INFO) -> None:
        """Add a note once, and log it once, on the logger of the probe's module."""
        if text not in self._notes:
            self._notes.append(text)
            logging.getLogger(type(self).__module__).log(level, "%s: %s", self.name, text)

    def missing_signals(self) -> dict[str, str] | None:
        """Signals this running probe cannot produce now, each with what its source lacks (e.g. DCGM fields the
        exporter does not serve); None for a probe whose signals all come whenever it runs."""
        return None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.source}){' running' if self.running else ''}>"


def now_ns() -> int:
    return time.time_ns()

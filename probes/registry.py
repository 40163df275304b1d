"""Probe names, and choosing eBPF with a procfs fallback.

Each eBPF probe names the procfs probes that stand in for it when it cannot run (no root, no BTF, no
tracefs, no kernel headers, or its program fails to compile or attach):

    syscall  -> (nothing: no procfs source has per-syscall latency)
    tcp      -> netstat    (sloscope.tcp.retransmits from /proc/net/snmp RetransSegs; no state transitions)
    block    -> diskstats  (system.disk.io_time instead of the latency histogram)
    runqueue -> schedstat  (sloscope.cpu.runqueue.delay as a Sum in s instead of a histogram)
    tcp_rtt  -> tcp_info   (the same sloscope.tcp.rtt histogram, one sample per connection per 10 s read through
                            netlink sock_diag instead of one per received segment)

GPU and storage probes fall back the same way:

    dcgm     -> nvml       (no dcgm-exporter: the driver's own counters; kernel-busy time, no SM share and
                            no sloscope.gpu.dram.active)
    spdk     -> nvme       (no SPDK target: NVMe temperatures of kernel-attached drives from sysfs)

`ProbeSet` starts the chosen probes, records a `Decision` per requested name (what runs, what is missing,
which signals are lost), collects from all of them (one failing probe never stops the others) and stops
them all, also on Ctrl-C or error (`with ProbeSet(...) as probes:`). A probe that runs can still lack a
signal (a dcgm-exporter without DCGM_FI_PROF_SM_ACTIVE, SPDK with queue-depth sampling off): `health()` adds
a `sloscope.probe.signal.health` gauge per signal of such a probe, naming what it needs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .base import Host, Probe, ProbeUnavailable
from .ebpf.block_io import BlockIoProbe
from .ebpf.runqueue import RunqueueProbe
from .ebpf.syscall_latency import SyscallLatencyProbe
from .ebpf.tcp import TcpProbe
from .ebpf.tcp_rtt import TcpRttProbe
from .gpu.dcgm_exporter import DcgmExporterProbe
from .gpu.nvml import NvmlProbe
from .procfs.diskstats import DiskstatsProbe
from .procfs.netstat import NetstatProbe
from .procfs.pressure import PressureProbe
from .procfs.schedstat import SchedstatProbe
from .procfs.tcp_connections import TcpConnectionsProbe
from .procfs.tcp_info import TcpInfoProbe
from .procfs.vmstat import VmstatProbe
from .sample import AnySample, Sample
from .spdk.nvme_sysfs import NvmeSysfsProbe
from .spdk.spdk import SpdkProbe

log = logging.getLogger(__name__)

PROBES: dict[str, type[Probe]] = {cls.name: cls for cls in (
    SyscallLatencyProbe, TcpProbe, BlockIoProbe, RunqueueProbe, TcpRttProbe,
    PressureProbe, DiskstatsProbe, NetstatProbe, SchedstatProbe, TcpConnectionsProbe, TcpInfoProbe, VmstatProbe,
    NvmlProbe, DcgmExporterProbe, SpdkProbe, NvmeSysfsProbe)}

FALLBACKS: dict[str, tuple[str, ...]] = {
    "syscall": (),
    "tcp": ("netstat",),
    "block": ("diskstats",),
    "runqueue": ("schedstat",),
    "tcp_rtt": ("tcp_info",),
    "dcgm": ("nvml",),
    "spdk": ("nvme",),
}

# What a node runs by default: every eBPF probe (falling back as above) and the procfs probes that are not
# only fallbacks.
NODE_PROBES = ("syscall", "tcp", "block", "runqueue", "tcp_rtt", "pressure", "diskstats", "tcp_connections",
               "vmstat")


def probe_class(name: str) -> type[Probe]:
    try:
        return PROBES[name]
    except KeyError:
        raise KeyError(f"unknown probe {name!r}; known: {', '.join(PROBES)}") from None


@dataclass(frozen=True, slots=True)
class Decision:
    requested: str
    running: tuple[str, ...]  # probe names actually started for this request (itself, or its fallbacks)
    missing: tuple[str, ...] = ()  # why the requested probe itself did not run
    lost_signals: tuple[str, ...] = ()  # catalog signals of the request that nothing produces now
    notes: tuple[str, ...] = ()  # limits of a probe that runs (e.g. syscalls without tracepoints)

    @property
    def fallback(self) -> bool:
        return self.requested not in self.running

    def explain(self) -> str:
        if not self.missing:
            return f"{self.requested}: running" + "".join(f"; {n}" for n in self.notes)
        text = f"{self.requested}: unavailable: " + "; ".join(self.missing)
        if self.running:
            text += f" -> falling back to {', '.join(self.running)}"
        elif FALLBACKS.get(self.requested):
            text += f" -> its fallback {', '.join(FALLBACKS[self.requested])} is unavailable too"
        else:
            text += " -> no fallback"
        if self.lost_signals:
            text += f" (not produced: {', '.join(self.lost_signals)})"
        return text

    def to_dict(self) -> dict:
        return {"requested": self.requested, "running": list(self.running), "missing": list(self.missing),
                "lost_signals": list(self.lost_signals), "notes": list(self.notes)}


class ProbeSet:
    """Start probes by name with fallbacks; collect from all; stop all.

    options: per probe name, keyword arguments for its constructor (e.g. {"syscall": {"pids": [42]}}).
    """

    def __init__(self, names: Iterable[str] = NODE_PROBES, *, options: Mapping[str, Mapping[str, Any]] | None = None,
                 host: Host | None = None):
        self.names = tuple(dict.fromkeys(names))
        for n in self.names:
            probe_class(n)
        self.options = {k: dict(v) for k, v in (options or {}).items()}
        self.host = host
        self.probes: dict[str, Probe] = {}
        self.decisions: list[Decision] = []
        self.errors: dict[str, str] = {}  # probe name -> last collect error

    def _make(self, name: str) -> Probe:
        return probe_class(name)(host=self.host, **self.options.get(name, {}))

    def _try_start(self, name: str) -> tuple[str, ...]:
        """Start `name` unless running; () when it runs, else what is missing."""
        if name in self.probes:
            return ()
        try:
            probe = self._make(name)
            probe.start()
        except ProbeUnavailable as exc:
            return exc.missing or ("unavailable",)
        except Exception as exc:  # a probe must never take the caller down
            log.debug("starting %s failed", name, exc_info=True)
            return (f"start failed: {type(exc).__name__}: {exc}",)
        self.probes[name] = probe
        return ()

    def start(self) -> list[Decision]:
        if self.decisions:
            return self.decisions
        try:
            for name in self.names:
                missing = self._try_start(name)
                if not missing:
                    self.decisions.append(Decision(name, (name,), notes=self.probes[name].notes))
                    continue
                running = tuple(fb for fb in FALLBACKS.get(name, ()) if not self._try_start(fb))
                produced = {s for fb in running for s in PROBES[fb].signals}
                lost = tuple(s for s in PROBES[name].signals if s not in produced)
                decision = Decision(name, running, missing, lost)
                log.warning("%s", decision.explain())
                self.decisions.append(decision)
        except BaseException:
            self.stop()
            raise
        return self.decisions

    def collect(self) -> list[AnySample]:
        samples: list[AnySample] = []
        for name, probe in self.probes.items():
            try:
                samples.extend(probe.collect())
                self.errors.pop(name, None)
            except Exception as exc:
                self.errors[name] = f"{type(exc).__name__}: {exc}"
                log.warning("collecting %s failed: %s", name, exc)
        return samples

    def health(self, time_unix_nano: int) -> list[Sample]:
        """One `sloscope.probe.health` gauge per requested probe: 1 when it runs itself and its last collection
        worked; 0 when it is missing (a fallback may run instead: `probe.running`) or its collection failed."""
        out = []
        for d in self.decisions:
            ok = not d.fallback and not d.missing and d.requested not in self.errors
            out.append(Sample("sloscope.probe.health",
                              {"probe.name": d.requested, "probe.running": ",".join(d.running) or "none"},
                              time_unix_nano, 1.0 if ok else 0.0, "gauge", time_unix_nano))
        return out + self.signal_health(time_unix_nano)

    def signal_health(self, time_unix_nano: int) -> list[Sample]:
        """One `sloscope.probe.signal.health` gauge per signal of each running probe that tracks what its
        source lacks: 1 while produced, 0 with `probe.needs` naming what is missing."""
        out = []
        for name, probe in self.probes.items():
            missing = probe.missing_signals()
            if missing is None:
                continue
            for signal in probe.signals:
                attrs = {"probe.name": name, "sloscope.signal.name": signal}
                if signal in missing:
                    attrs["probe.needs"] = missing[signal]
                out.append(Sample("sloscope.probe.signal.health", attrs, time_unix_nano,
                                  0.0 if signal in missing else 1.0, "gauge", time_unix_nano))
        return out

    def stop(self) -> None:
        probes, self.probes = self.probes, {}
        for name, probe in probes.items():
            try:
                probe.stop()
            except Exception as exc:
                log.warning("stopping %s failed: %s", name, exc)

    def __enter__(self) -> "ProbeSet":
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

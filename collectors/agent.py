"""The node collector's loop: probes -> one OTLP metrics stream, with an on-disk spool so nothing is lost
while the endpoint is down.

Two threads. The main thread wakes every interval, collects from every running probe (a failing probe is
logged and skipped, never fatal), turns the samples into the SDK's `MetricsData` (otlp_metrics.py) and
hands it to the sender (shipper.py), which owns the exporter (otlp_answers.py makes it) and the spool (spool.py). So
the collection loop never waits for the network.

Its own /healthz and /metrics (telemetry.py) are served on `listen` while it runs. Before the probes start, a
root collector that sees no tracefs mounts it (probes/tracefs_mount.py), so that a fresh mount namespace or a
container without the host's tracing mount keeps its eBPF probes.

Shutdown (SIGTERM/SIGINT, --duration, --once): one last collection of the partial interval, probes
detached, queued batches exported (healthy, within `shutdown_grace_s`) or spooled, spool fsynced and closed
(its directory's lock let go).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Mapping

from opentelemetry.sdk.resources import Resource

from sloscope.probes import registry
from sloscope.probes.registry import ProbeSet
from sloscope.probes.tracefs_mount import ensure_tracefs

from .config import CollectorConfig, ConfigError, check_probes
from .otlp_answers import make_exporter
from .otlp_metrics import MetricsBuilder, count_points
from .shipper import RETRY_INITIAL_S, RETRY_MAX_S, SHUTDOWN_GRACE_S, Shipper
from .spool import Spool, SpoolInUse
from .telemetry import TelemetryServer

log = logging.getLogger(__name__)

SERVICE_NAME = "sloscope-collector"


# -- probes ---------------------------------------------------------------------------------------------------

def resolve_probe_names(requested: tuple[str, ...] | list[str], options: Mapping[str, Mapping[str, Any]]
                        ) -> list[str]:
    """Probe names to start. `auto`: the node set (registry.NODE_PROBES) plus every other registered probe
    that is not only a fallback and that is configured (has probe_options) or available here (its check()
    passes: e.g. NVML or an SPDK socket present). `node`: registry.NODE_PROBES. `all`: every probe."""
    check_probes(requested, options)
    out: list[str] = []
    for name in requested:
        if name == "auto":
            out.extend(auto_probes(options))
        elif name == "node":
            out.extend(registry.NODE_PROBES)
        elif name == "all":
            out.extend(registry.PROBES)
        else:
            out.append(name)
    return list(dict.fromkeys(out))


def auto_probes(options: Mapping[str, Mapping[str, Any]]) -> list[str]:
    names = list(registry.NODE_PROBES)
    fallback_only = {fb for fbs in registry.FALLBACKS.values() for fb in fbs}
    for name in registry.PROBES:
        if name in names or name in fallback_only:
            continue
        if name in options:
            log.info("auto: running %s (configured)", name)
            names.append(name)
            continue
        why = []
        for candidate in (name, *registry.FALLBACKS.get(name, ())):  # itself, or what stands in for it
            problem = _unavailable(candidate, options)
            if problem is None:
                log.info("auto: running %s (%s is available here)", name, candidate)
                names.append(name)
                break
            why.append(f"{candidate}: {problem}")
        else:
            log.info("auto: not running %s (%s)", name, "; ".join(why))
    return names


def _unavailable(name: str, options: Mapping[str, Mapping[str, Any]]) -> str | None:
    try:
        availability = registry.PROBES[name](**dict(options.get(name, {}))).check()
    except Exception as exc:  # a probe's check must not stop the agent
        return f"check failed: {exc}"
    return None if availability.ok else "; ".join(availability.missing)


# -- resource -------------------------------------------------------------------------------------------------

def build_resource(cfg: CollectorConfig) -> Resource:
    """Resource attributes, lowest precedence first: host.name as detected (the hostname), the configured
    `resource` attributes, OTEL_RESOURCE_ATTRIBUTES, and last service.name=sloscope-collector and
    k8s.node.name (when known), which nothing overrides. (A DaemonSet pod's hostname is the pod's name:
    set host.name=$(NODE_NAME) in OTEL_RESOURCE_ATTRIBUTES there.)"""
    fixed: dict[str, Any] = {"service.name": SERVICE_NAME}
    if cfg.node_name:
        fixed["k8s.node.name"] = cfg.node_name
    env = Resource.create()  # OTEL_RESOURCE_ATTRIBUTES and the SDK's telemetry.sdk.* attributes
    return (Resource({"host.name": cfg.host_name}).merge(Resource(dict(cfg.resource))).merge(env)
            .merge(Resource(fixed)))


# -- the agent ------------------------------------------------------------------------------------------------

def open_spool(cfg: CollectorConfig) -> Spool:
    try:
        return Spool(cfg.spool_dir, cfg.spool_max_bytes, cfg.spool_max_batches)
    except SpoolInUse as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"spool directory {cfg.spool_dir}: {exc.strerror or exc}") from None


class Agent:
    def __init__(self, cfg: CollectorConfig, *, exporter=None, shutdown_grace_s: float = SHUTDOWN_GRACE_S,
                 retry_initial_s: float = RETRY_INITIAL_S, retry_max_s: float = RETRY_MAX_S):
        self.cfg = cfg
        self._exporter = exporter
        self.shutdown_grace_s = shutdown_grace_s
        self._retry = {"retry_initial_s": retry_initial_s, "retry_max_s": retry_max_s}
        self._stop = threading.Event()
        self.intervals = 0
        self.points = 0
        self.batches = 0
        self.decisions: list = []
        self.shipper: Shipper | None = None
        self.probes: ProbeSet | None = None
        self.telemetry: TelemetryServer | None = None

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> int:
        cfg = self.cfg
        log.info("sloscope collect: %s", cfg.describe())
        names = resolve_probe_names(cfg.probes, cfg.probe_options)
        spool = open_spool(cfg)  # before anything starts: a spool another collector holds is a configuration error
        try:
            return self._run(names, spool)
        finally:
            spool.close()

    def _run(self, names: list[str], spool: Spool) -> int:
        cfg = self.cfg
        exporter = self._exporter if self._exporter is not None else make_exporter(cfg)
        shipper = self.shipper = Shipper(exporter, spool, timeout_s=cfg.timeout_s, **self._retry)
        builder = MetricsBuilder(build_resource(cfg), cfg.temporality)
        probes = self.probes = ProbeSet(names, options=cfg.probe_options)
        telemetry = self.telemetry = TelemetryServer(self, cfg.listen) if cfg.listen else None
        try:
            if telemetry:
                telemetry.start()
            mounted = ensure_tracefs()
            if mounted:
                log.info("%s", mounted)
            self.decisions = probes.start()
            for d in self.decisions:
                (log.info if not d.missing else log.warning)("probe %s", d.explain())
            if not probes.probes:
                log.error("no probe could start on this node; nothing to collect")
                return 1
            shipper.start()
            self._loop(probes, builder, shipper)
        finally:
            probes.stop()
            shipper.close(self.shutdown_grace_s)
            if telemetry:
                telemetry.stop()
            self._log_health(final=True)
        return 0

    def _loop(self, probes: ProbeSet, builder: MetricsBuilder, shipper: Shipper) -> None:
        cfg = self.cfg
        interval = cfg.interval_s
        started = time.monotonic()
        deadline = started + interval if cfg.once else (started + cfg.duration_s if cfg.duration_s else math.inf)
        next_health = started + cfg.health_interval_s
        tick = 0
        while True:
            tick += 1
            now = time.monotonic()
            target = started + tick * interval
            if target < now - interval:  # fell behind (a stalled host): skip the missed ticks
                tick = int((now - started) // interval) + 1
                target = started + tick * interval
            target = min(target, deadline)
            stopped = self._stop.wait(max(0.0, target - now))
            self._collect(probes, builder, shipper)
            if stopped or time.monotonic() >= deadline - 1e-3:
                return
            if time.monotonic() >= next_health:
                self._log_health()
                next_health += cfg.health_interval_s

    def _collect(self, probes: ProbeSet, builder: MetricsBuilder, shipper: Shipper) -> None:
        self.intervals += 1
        try:
            samples = probes.collect()  # one failing probe is logged there and skipped
            samples += probes.health(time.time_ns())
            data = builder.build(samples)
        except Exception:
            log.exception("collection failed in interval %d; continuing", self.intervals)
            return
        if data is None:
            return
        n = count_points(data)
        self.points += n
        self.batches += 1
        shipper.submit(data)

    def _log_health(self, final: bool = False) -> None:
        sh = self.shipper
        if sh is None:
            return
        st, sp = sh.stats, sh.spool.stats()
        state = {None: "not tried yet", True: "up", False: "down"}[sh.endpoint_up]
        errors = self.probes.errors if self.probes else {}
        log.info("%s: %d intervals, %d points in %d batches; exported %d batches (%d points, %d replayed); "
                 "endpoint %s; spool %d batches / %d bytes; dropped %d batches (%d points; %d rejected, %d corrupt, "
                 "%d for a full disk); %d spool read errors%s",
                 "stopped" if final else "health", self.intervals, self.points, self.batches, st.exported_batches,
                 st.exported_points, st.replayed_batches, state, sp.batches, sp.bytes, sp.dropped_batches,
                 sp.dropped_points, sp.rejected_batches, sp.corrupt_batches, sp.disk_full_batches, sp.read_errors,
                 "; probe errors: " + "; ".join(f"{k}: {v}" for k, v in errors.items()) if errors else "")

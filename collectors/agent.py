"""The node collector's loop: probes -> one OTLP metrics stream, with an on-disk spool so nothing is lost
while the endpoint is down.

Two threads. The main thread wakes every interval, collects from every running probe (a failing probe is
logged and skipped, never fatal), turns the samples into the SDK's `MetricsData` (otlp_metrics.py) and
hands it to the sender. The sender thread owns the exporter and the spool:

- healthy (spool empty): export each batch with the SDK exporter's `export()`; a FAILURE (endpoint down,
  slow past the timeout, or a retryable error after the exporter's own retries within its timeout) writes
  the batch to the spool, and the sender turns degraded;
- degraded (spool not empty): every new batch is appended to the spool (order is kept: the spool is a FIFO
  and nothing overtakes it), and the oldest spooled batch is retried with exponential backoff (1 s doubling
  to 30 s); on success the spool is replayed in order, as fast as the endpoint takes it, then the sender is
  healthy again. A restarted collector finds the spool and replays it first.

So the collection loop never waits for the network, and the export stall per attempt is bounded by the
exporter timeout. A spooled batch that fails while the endpoint accepts an empty export request is being
rejected (not a transient failure); after `reject_after` such failures it is moved to the spool's
rejected/ directory, so one bad batch cannot block everything behind it.

Delivery is exactly once when the endpoint refuses connections or answers with an error, and at least once
when an export times out after the receiver took it; the store recognises such a repeat (a cumulative point
not newer than the last stored point of its series is a duplicate).

Shutdown (SIGTERM/SIGINT, --duration, --once): one last collection of the partial interval, probes
detached, queued batches exported (healthy, within `shutdown_grace_s`) or spooled, spool fsynced.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource

from probes import registry
from probes.registry import ProbeSet

from .config import CollectorConfig, ConfigError
from .otlp_metrics import MetricsBuilder, count_points, encode, metrics_data_from_request
from .spool import Spool

log = logging.getLogger(__name__)

SERVICE_NAME = "sloscope-collector"
RETRY_INITIAL_S = 1.0
RETRY_MAX_S = 30.0
REJECT_AFTER = 5
SHUTDOWN_GRACE_S = 5.0


# -- probes ---------------------------------------------------------------------------------------------------

def resolve_probe_names(requested: tuple[str, ...] | list[str], options: Mapping[str, Mapping[str, Any]]
                        ) -> list[str]:
    """Probe names to start. `auto`: the node set (registry.NODE_PROBES) plus every other registered probe
    that is not only a fallback and that is configured (has probe_options) or available here (its check()
    passes: e.g. NVML or an SPDK socket present). `node`: registry.NODE_PROBES. `all`: every probe."""
    out: list[str] = []
    for name in requested:
        if name == "auto":
            out.extend(auto_probes(options))
        elif name == "node":
            out.extend(registry.NODE_PROBES)
        elif name == "all":
            out.extend(registry.PROBES)
        elif name in registry.PROBES:
            out.append(name)
        else:
            raise ConfigError(f"unknown probe {name!r}; known: {', '.join(registry.PROBES)}, auto, node, all")
    unknown = sorted(set(options) - set(registry.PROBES))
    if unknown:
        raise ConfigError(f"probe_options for unknown probes: {', '.join(unknown)}")
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


# -- resource and exporter --------------------------------------------------------------------------------------

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


def make_exporter(cfg: CollectorConfig):
    """The SDK's OTLP metric exporter for cfg.protocol, with the endpoint, headers and timeout given
    explicitly (so the SDK's own reading of OTEL_* variables cannot disagree with ours)."""
    if cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(endpoint=cfg.endpoint, insecure=cfg.endpoint.startswith("http://"),
                                  headers=dict(cfg.headers) or None, timeout=cfg.timeout_s)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(endpoint=cfg.endpoint, headers=dict(cfg.headers) or None, timeout=cfg.timeout_s)


# -- the sender ---------------------------------------------------------------------------------------------------

@dataclass
class _Batch:
    data: MetricsData
    points: int


@dataclass
class ShipperStats:
    exported_batches: int = 0
    exported_points: int = 0
    spooled_batches: int = 0  # batches written to the spool, ever
    replayed_batches: int = 0
    failed_exports: int = 0


class Shipper:
    """Exports batches in order; what fails waits in the spool (see the module docstring)."""

    def __init__(self, exporter, spool: Spool, *, timeout_s: float = 10.0, retry_initial_s: float = RETRY_INITIAL_S,
                 retry_max_s: float = RETRY_MAX_S, reject_after: int = REJECT_AFTER, clock: Callable[[], float] = time.monotonic):
        self.exporter = exporter
        self.spool = spool
        self.timeout_s = timeout_s
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.reject_after = reject_after
        self.clock = clock
        self.stats = ShipperStats()
        self.endpoint_up: bool | None = None  # None until the first attempt
        self._queue: deque[_Batch] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._aborted = False
        self._backoff = retry_initial_s
        self._next_retry = 0.0
        self._rejections: tuple[int, int] = (-1, 0)  # (spool seq, failures while the endpoint was up)
        self._thread = threading.Thread(target=self._run, name="sloscope-export", daemon=True)
        self._exporter_shut = False

    # -- main-thread side

    def start(self) -> None:
        self._thread.start()

    def submit(self, data: MetricsData) -> None:
        with self._cv:
            self._queue.append(_Batch(data, count_points(data)))
            self._cv.notify()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def close(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Export (or spool) what is queued, then stop. Past `grace_s` the exporter is shut down, which
        aborts its retries, and the rest goes to the spool."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(grace_s)
            if self._thread.is_alive():
                log.warning("export still running after %.1f s: aborting it, the rest goes to the spool", grace_s)
                self._aborted = True
                self._shutdown_exporter()
                self._thread.join(self.timeout_s + 5.0)
        if self._thread.is_alive():  # should not happen: every export attempt has a deadline
            log.error("export thread did not stop; %d batches still in memory were lost", len(self._queue))
        else:
            self._spool_queued()  # the thread never started, or something remained
        self._shutdown_exporter()

    def _shutdown_exporter(self) -> None:
        if not self._exporter_shut:
            self._exporter_shut = True
            try:
                self.exporter.shutdown()
            except Exception as exc:
                log.debug("exporter shutdown: %s", exc)

    # -- sender thread

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    if self.spool:
                        wait = self._next_retry - self.clock()
                        if wait <= 0:
                            break
                        self._cv.wait(wait)
                    else:
                        self._cv.wait()
                if self._closing and not self._queue:
                    return
            try:
                self._step()
            except Exception:  # never let the sender die: keep what is queued on disk and go on
                log.exception("export step failed")
                self._next_retry = self.clock() + self._backoff
                try:
                    self._spool_queued()
                except Exception:
                    log.exception("spooling failed")

    def _step(self) -> None:
        if self.spool or self._aborted:
            self._spool_queued()
            if not self._closing and self.clock() >= self._next_retry:
                self._replay()
            return
        with self._cv:
            batch = self._queue.popleft() if self._queue else None
        if batch is None:
            return
        if self._export(batch.data):
            self.stats.exported_batches += 1
            self.stats.exported_points += batch.points
            self._mark_up()
            return
        self._to_spool(batch)
        self._mark_down()

    def _export(self, data: MetricsData) -> bool:
        try:
            result = self.exporter.export(data, timeout_millis=self.timeout_s * 1000)
        except Exception as exc:  # an exporter bug or an encoding error: a failure like any other
            log.warning("export raised %s: %s", type(exc).__name__, exc)
            result = MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self.stats.failed_exports += 1
            return False
        return True

    def _to_spool(self, batch: _Batch) -> None:
        try:
            data = encode(batch.data).SerializeToString()
        except Exception as exc:
            self.spool.dropped_batches += 1
            self.spool.dropped_points += batch.points
            log.error("a batch of %d points could not be encoded and was dropped: %s", batch.points, exc)
            return
        try:
            self.spool.append(data, batch.points)
        except OSError as exc:  # disk full, directory gone: the batch cannot be kept
            self.spool.dropped_batches += 1
            self.spool.dropped_points += batch.points
            log.error("spool %s not writable (%s): dropped a batch of %d points", self.spool.directory, exc,
                      batch.points)
            return
        self.stats.spooled_batches += 1

    def _spool_queued(self) -> None:
        while True:
            with self._cv:
                if not self._queue:
                    return
                batch = self._queue.popleft()
            self._to_spool(batch)

    def _replay(self) -> None:
        replayed = 0
        while self.spool and not self._closing:
            self._spool_queued()  # what arrived meanwhile queues behind, in order, on disk
            head = self.spool.peek()
            if head is None:
                break
            seq, request, _size = head
            try:
                data = metrics_data_from_request(request)
            except Exception as exc:
                self.spool.reject(seq, f"not replayable: {exc}")
                continue
            if self._export(data):
                self.spool.remove(seq)
                replayed += 1
                self.stats.replayed_batches += 1
                self.stats.exported_batches += 1
                self.stats.exported_points += count_points(request)
                if self.endpoint_up is not True:
                    log.info("endpoint is back: replaying %d spooled batches in order", len(self.spool) + 1)
                self._mark_up()
                continue
            if self._accepts_empty():
                last, n = self._rejections
                n = n + 1 if last == seq else 1
                self._rejections = (seq, n)
                log.warning("spooled batch %d failed while the endpoint accepts other requests (%d of %d)",
                            seq, n, self.reject_after)
                if n >= self.reject_after:
                    self.spool.reject(seq, f"failed {n} times while the endpoint was up")
                    continue
            self._mark_down()
            break
        if replayed and not self.spool:
            log.info("spool drained: %d batches replayed", replayed)

    def _accepts_empty(self) -> bool:
        try:
            return self.exporter.export(MetricsData(resource_metrics=[]),
                                        timeout_millis=self.timeout_s * 1000) is MetricExportResult.SUCCESS
        except Exception:
            return False

    def _mark_up(self) -> None:
        self.endpoint_up = True
        self._backoff = self.retry_initial_s

    def _mark_down(self) -> None:
        if self.endpoint_up is not False:
            log.warning("export failed: spooling to %s until the endpoint is back (retry in %.1f s, backing off "
                        "to %g s)", self.spool.directory, self._backoff, self.retry_max_s)
        self.endpoint_up = False
        self._next_retry = self.clock() + self._backoff
        self._backoff = min(self._backoff * 2, self.retry_max_s)


# -- the agent ----------------------------------------------------------------------------------------------------

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

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> int:
        cfg = self.cfg
        log.info("sloscope collect: %s", cfg.describe())
        names = resolve_probe_names(cfg.probes, cfg.probe_options)
        try:
            spool = Spool(cfg.spool_dir, cfg.spool_max_bytes, cfg.spool_max_batches)
        except OSError as exc:
            raise ConfigError(f"spool directory {cfg.spool_dir}: {exc.strerror or exc}") from None
        exporter = self._exporter if self._exporter is not None else make_exporter(cfg)
        shipper = self.shipper = Shipper(exporter, spool, timeout_s=cfg.timeout_s, **self._retry)
        builder = MetricsBuilder(build_resource(cfg), cfg.temporality)
        probes = self.probes = ProbeSet(names, options=cfg.probe_options)
        try:
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
                 "endpoint %s; spool %d batches / %d bytes; dropped %d batches (%d points, %d rejected)%s",
                 "stopped" if final else "health", self.intervals, self.points, self.batches, st.exported_batches,
                 st.exported_points, st.replayed_batches, state, sp.batches, sp.bytes, sp.dropped_batches,
                 sp.dropped_points, sp.rejected_batches,
                 "; probe errors: " + "; ".join(f"{k}: {v}" for k, v in errors.items()) if errors else "")

"""The node collector's own telemetry on `--listen HOST:PORT`: `/healthz` for a kubelet's probes and `/metrics`
(Prometheus text) for a scrape.

/healthz answers 200 while the collection loop runs with at least one probe and the sender thread is alive,
else 503 with the reason. An unreachable endpoint is not unhealthy: batches wait in the spool, and restarting
the collector would not bring the endpoint back (the metrics show it: sloscope_collector_endpoint_up).

Nothing a client sends is echoed back; any path but these two is a 404. The server runs in daemon threads, so
a client that never finishes its request cannot hold up the collector's shutdown.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from sloscope.addresses import address_text, parse_address
from sloscope.exposition import CONTENT_TYPE, render

from sloscope.edge.listening import AnyFamilyHTTPServer

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0


class AgentMetrics(Collector):
    """The agent's state, read at each scrape: counters and gauges as the agent and its shipper keep them."""

    def __init__(self, agent):
        self.agent = agent

    def collect(self):
        yield _probe_up(self.agent.probes)
        yield CounterMetricFamily("sloscope_collector_intervals", "Collection intervals run.",
                                  value=self.agent.intervals)
        if self.agent.shipper is not None:
            yield from _shipper_families(self.agent.shipper)


def exposition(agent) -> bytes:
    """The agent's state as Prometheus text."""
    return render(AgentMetrics(agent))


def _probe_up(probes) -> GaugeMetricFamily:
    up = GaugeMetricFamily("sloscope_collector_probe_up",
                           "1 when the requested probe runs itself and its last collection worked, else 0 (running: "
                           "what runs in its place).", labels=("probe", "running"))
    for decision in (probes.decisions if probes else ()):
        ok = not decision.fallback and not decision.missing and decision.requested not in probes.errors
        up.add_metric((decision.requested, ",".join(decision.running) or "none"), 1 if ok else 0)
    return up


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def _shipper_families(shipper):
    st, sp = shipper.stats, shipper.spool.stats()
    other = sp.dropped_batches - sp.rejected_batches - sp.corrupt_batches - sp.disk_full_batches
    dropped = CounterMetricFamily("sloscope_collector_batches_dropped",
                                  "Batches lost, by reason (rejected by the endpoint, corrupt on disk, disk full, "
                                  "other: past the spool's bounds or not writable).", labels=("reason",))
    for reason, n in (("rejected", sp.rejected_batches), ("corrupt", sp.corrupt_batches),
                      ("disk_full", sp.disk_full_batches), ("other", other)):
        dropped.add_metric((reason,), n)
    return [
        _counter("sloscope_collector_batches_exported", "Batches the endpoint took.", st.exported_batches),
        _counter("sloscope_collector_points_exported", "Data points the endpoint took.", st.exported_points),
        _counter("sloscope_collector_points_rejected",
                 "Data points of batches the endpoint took that it said it did not keep (OTLP partial success).",
                 st.partially_rejected_points),
        _counter("sloscope_collector_batches_spooled", "Batches written to the spool.", st.spooled_batches),
        _counter("sloscope_collector_batches_replayed", "Spooled batches delivered later.", st.replayed_batches),
        dropped,
        _counter("sloscope_collector_export_failures", "Export attempts not delivered.", st.failed_exports),
        GaugeMetricFamily("sloscope_collector_spool_batches", "Batches waiting in the spool.", value=sp.batches),
        GaugeMetricFamily("sloscope_collector_spool_bytes", "Bytes of the spool on disk.", value=sp.bytes),
        GaugeMetricFamily("sloscope_collector_endpoint_up", "1 when the last export attempt was delivered.",
                          value=1 if shipper.endpoint_up else 0),
        _latency_family(st.export_latency),
    ]


def _latency_family(latency) -> HistogramMetricFamily:
    buckets, cumulative = [], 0
    for bound, count in zip(latency.bounds_s, latency.counts):
        cumulative += count
        buckets.append((floatToGoString(bound), cumulative))
    buckets.append(("+Inf", latency.total))
    return HistogramMetricFamily("sloscope_collector_export_duration_seconds",
                                 "Time of one export attempt, answered or not.", buckets=buckets,
                                 sum_value=latency.sum_s)


def health(agent) -> str | None:
    """None when healthy, else why not."""
    if agent.stopping:
        return "stopping"
    if agent.probes is None or not agent.probes.probes:
        return "no probe running"
    if agent.shipper is None or not agent.shipper.alive:
        return "export thread not running"
    return None


class TelemetryServer:
    """/healthz and /metrics for `agent` on HOST:PORT. A port that cannot be bound is logged, not fatal: the
    collector's data matters more than its own telemetry."""

    def __init__(self, agent, listen: str):
        self.agent = agent
        self.listen = listen
        self._server: AnyFamilyHTTPServer | None = None

    def start(self) -> bool:
        try:
            server = AnyFamilyHTTPServer(parse_address(self.listen), _handler(self.agent))
        except OSError as exc:
            log.warning("telemetry: cannot listen on %s (%s): no /healthz or /metrics", self.listen,
                        exc.strerror or exc)
            return False
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="sloscope-telemetry",
                         daemon=True).start()
        log.info("telemetry: /healthz and /metrics on http://%s", address_text(server.server_address[:2]))
        return True

    @property
    def port(self) -> int | None:
        return self._server.server_address[1] if self._server else None

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


def _handler(agent):
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                problem = health(agent)
                return self._answer(503 if problem else 200, f"{problem or 'ok'}\n")
            if path == "/metrics":
                return self._answer(200, exposition(agent), CONTENT_TYPE)
            self._answer(404, "not found: /healthz or /metrics\n")

        def _answer(self, code: int, body: str | bytes, ctype: str = "text/plain; charset=utf-8"):
            body = body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # scrapes every few seconds would drown the collector's log
            pass

    return Handler

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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REQUEST_TIMEOUT_S = 5.0


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _line(name: str, value: float, labels: dict[str, str] | None = None) -> str:
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in (labels or {}).items())
    return f"{name}{{{inner}}} {value:g}" if inner else f"{name} {value:g}"


class Family:
    """One metric family of the exposition: its HELP and TYPE, then its samples."""

    def __init__(self, name: str, kind: str, help_text: str):
        self.name, self.lines = name, [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def add(self, value: float, labels: dict[str, str] | None = None, suffix: str = "") -> "Family":
        self.lines.append(_line(self.name + suffix, value, labels))
        return self


def exposition(agent) -> str:
    """The agent's state as Prometheus text."""
    families = _probe_families(agent.probes) + [
        Family("sloscope_collector_intervals_total", "counter", "Collection intervals run.").add(agent.intervals)]
    shipper = agent.shipper
    if shipper is not None:
        families += _shipper_families(shipper)
    return "\n".join(line for f in families for line in f.lines) + "\n"


def _probe_families(probes) -> list[Family]:
    up = Family("sloscope_collector_probe_up", "gauge",
                "1 when the requested probe runs itself and its last collection worked, else 0 (running: what "
                "runs in its place).")
    for decision in (probes.decisions if probes else ()):
        ok = not decision.fallback and not decision.missing and decision.requested not in probes.errors
        up.add(1 if ok else 0, {"probe": decision.requested, "running": ",".join(decision.running) or "none"})
    return [up]


def _shipper_families(shipper) -> list[Family]:
    st, sp = shipper.stats, shipper.spool.stats()
    other = sp.dropped_batches - sp.rejected_batches - sp.corrupt_batches - sp.disk_full_batches
    dropped = Family("sloscope_collector_batches_dropped_total", "counter",
                     "Batches lost, by reason (rejected by the endpoint, corrupt on disk, disk full, other: past the "
                     "spool's bounds or not writable).")
    for reason, n in (("rejected", sp.rejected_batches), ("corrupt", sp.corrupt_batches),
                      ("disk_full", sp.disk_full_batches), ("other", other)):
        dropped.add(n, {"reason": reason})
    return [
        Family("sloscope_collector_batches_exported_total", "counter", "Batches the endpoint took.")
        .add(st.exported_batches),
        Family("sloscope_collector_points_exported_total", "counter", "Data points the endpoint took.")
        .add(st.exported_points),
        Family("sloscope_collector_points_rejected_total", "counter",
               "Data points of batches the endpoint took that it said it did not keep (OTLP partial success).")
        .add(st.partially_rejected_points),
        Family("sloscope_collector_batches_spooled_total", "counter", "Batches written to the spool.")
        .add(st.spooled_batches),
        Family("sloscope_collector_batches_replayed_total", "counter", "Spooled batches delivered later.")
        .add(st.replayed_batches),
        dropped,
        Family("sloscope_collector_export_failures_total", "counter", "Export attempts not delivered.")
        .add(st.failed_exports),
        Family("sloscope_collector_spool_batches", "gauge", "Batches waiting in the spool.").add(sp.batches),
        Family("sloscope_collector_spool_bytes", "gauge", "Bytes of the spool on disk.").add(sp.bytes),
        Family("sloscope_collector_endpoint_up", "gauge", "1 when the last export attempt was delivered.")
        .add(1 if shipper.endpoint_up else 0),
        _latency_family(st.export_latency),
    ]


def _latency_family(latency) -> Family:
    family = Family("sloscope_collector_export_duration_seconds", "histogram",
                    "Time of one export attempt, answered or not.")
    cumulative = 0
    for bound, count in zip(latency.bounds_s, latency.counts):
        cumulative += count
        family.add(cumulative, {"le": f"{bound:g}"}, "_bucket")
    family.add(latency.total, {"le": "+Inf"}, "_bucket")
    return family.add(latency.sum_s, suffix="_sum").add(latency.total, suffix="_count")


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
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> bool:
        host, _, port = self.listen.rpartition(":")
        try:
            server = ThreadingHTTPServer((host, int(port)), _handler(self.agent))
        except OSError as exc:
            log.warning("telemetry: cannot listen on %s (%s): no /healthz or /metrics", self.listen,
                        exc.strerror or exc)
            return False
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="sloscope-telemetry",
                         daemon=True).start()
        log.info("telemetry: /healthz and /metrics on http://%s:%d", *server.server_address[:2])
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

        def _answer(self, code: int, text: str, ctype: str = "text/plain; charset=utf-8"):
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # scrapes every few seconds would drown the collector's log
            pass

    return Handler

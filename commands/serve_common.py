"""What both sides of `sloscope serve` run alike: the GET pages on the HTTP port, binding the listeners, and serving
until SIGTERM or SIGINT. The writing side (commands/serve.py) and the read side on ClickHouse
(commands/serve_clickhouse.py) both use it, and neither imports the other's module for it."""

from __future__ import annotations

import gc
import logging
import signal
import threading

from sloscope import json_answers
from sloscope.addresses import address_text
from sloscope.analytics.rca import Query, graph_answer, query_parameter
from sloscope.alerts.store_metrics import render, settle
from sloscope.alerts.webhook import WebhookServer
from sloscope.receiver.server import grpc_server, http_server

from sloscope.commands.serve_ops import healthz, readiness_page

log = logging.getLogger("sloscope.serve")


def rca_page(store, spec):
    """GET /rca: `sloscope rca` in this process, on a reader of the database it writes (another process cannot
    open a DuckDB file while it is written), as the JSON of docs/cli-json.md. Query parameters as the command's
    flags: since, until, at, node, top, baseline, lookback."""

    def page(since: str = "", until: str = "", at: str = "", node: str = "", top: str = "5", baseline: str = "10m",
             lookback: str = "1m"):
        if not top.isdigit():
            raise ValueError(f"query parameter top: expected a whole number, got {top[:40]!r}")
        with store.reading() as reader:
            result = Query(since, until, at, node, int(top), baseline, lookback, query_parameter).answer(reader,
                                                                                                      spec)
        return json_answers.dumps(result).encode(), "application/json"

    return page


def graph_page(store):
    """GET /graph: `sloscope graph` in this process. Query parameters as its flags: since, until, at."""

    def page(since: str = "", until: str = "", at: str = ""):
        with store.reading() as reader:
            result = graph_answer(reader, since, until, at, query_parameter)
        return json_answers.dumps(result).encode(), "application/json"

    return page


def pages_of(store, spec, sampling, stopping: threading.Event, writer=None, intake_metrics=None) -> dict:
    """GET endpoints on the OTLP/HTTP port; `writer` and `intake_metrics` where serve writes the store."""
    return {"/metrics": lambda: render(store, spec, intake_metrics), "/sampling": sampling.page,
            "/rca": rca_page(store, spec), "/graph": graph_page(store), "/healthz": healthz, "/readyz": readiness_page(store, writer, stopping)}


def stop_on_signals() -> threading.Event:
    """Set by SIGTERM or SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def serve_until_stopped(listeners, stop: threading.Event, started: str) -> None:
    """Starts the bound listeners, logs `started`, and once `stop` is set closes them (the requests in flight
    answered)."""
    _freeze_start_up_objects()
    listeners.start()
    log.info("%s", started)
    while not stop.wait(0.5):  # a signal taken by another thread only runs its handler once this one wakes
        pass
    log.info("stopping: no new requests")
    listeners.close()


def close_settled(store) -> None:
    """Close the store once no /metrics refresh runs on it; one still running past the wait keeps it open, left
    to the process's exit, since closing a database under a running query may fail or abort the process."""
    if settle(store):
        store.close()
    else:
        log.warning("a /metrics refresh still runs: the store is left open as serve exits")


def _freeze_start_up_objects() -> None:
    """What start-up made (modules: polars, DuckDB, Arrow, gRPC, protobuf; the store, the spec) lasts as long as
    serve. Frozen, a full garbage collection need not walk it: walking it takes half a second, with the
    interpreter lock held, which every request in flight waits out."""
    gc.collect()
    gc.freeze()


def bind_listeners(listeners, addresses, webhook_app, receiver, pages, edge) -> None:
    """Every listener serve is asked for, bound (not yet started); OSError names the one that cannot be."""
    http_addr, grpc_addr, webhook_addr = addresses

    def otlp_http():
        httpd = http_server(receiver, *http_addr, pages=pages, tls=edge.tls, auth=edge.auth)
        return httpd, f"OTLP/HTTP on {edge.scheme()}://{address_text(httpd.server_address[:2])}"

    def otlp_grpc():
        grpcd, port = grpc_server(receiver, *grpc_addr, tls=edge.tls, auth=edge.auth)
        return grpcd, f"OTLP/gRPC on {address_text((grpc_addr[0], port))}{' (TLS)' if edge.tls else ''}"

    def webhook():
        hook = WebhookServer(webhook_addr, webhook_app)
        return hook, f"Alertmanager webhook on http://{address_text(hook.server_address[:2])}{webhook_app.path}"

    for kind, what, address, make in (("http", "OTLP/HTTP", http_addr, otlp_http),
                                      ("grpc", "OTLP/gRPC", grpc_addr, otlp_grpc),
                                      ("http", "the Alertmanager webhook", webhook_addr if webhook_app else None,
                                       webhook)):
        if address:
            listeners.bind(kind, what, address, make)

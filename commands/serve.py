"""`sloscope serve`: the receiving end of the OTLP stream for the embedded default and for an otelcol exporter.

OTLP/HTTP and OTLP/gRPC in, tier enrichment, one writer into the DuckDB store; large requests are decoded in
worker processes (analytics/decode_pool.py). SIGTERM or Ctrl-C stops accepting, writes everything already accepted, and
exits. On a ClickHouse store (--store chdb:// or clickhouse://), the read side of commands/serve_clickhouse.py.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import sys
from pathlib import Path

from sloscope import logs
from sloscope.addresses import parse_address
from sloscope.arguments import above_zero
from sloscope.errors import ConfigError
from sloscope.sizes import size_argument
from sloscope.slo_spec import SpecError

from sloscope.enrich.kube_watch import KubeApi, PodWatch
from sloscope.enrich.pods import PodDirectory
from sloscope.enrich.tiers import TierResolver
from sloscope.enrich.topology import GpuTopology
from sloscope.receiver.server import Receiver
from sloscope.analytics.cli import EXIT_USAGE
from sloscope.analytics.errors import StoreError
from sloscope.analytics.intake import ACKS, LINGER_S, Intake
from sloscope.analytics.intake_log import IntakeLog
from sloscope.analytics.late_placement import LatePlacement
from sloscope.analytics.retention import RetentionSchedule, kept_period
from sloscope.analytics.stores import add_store_arguments, open_url, parse_store_url, store_url
from sloscope.analytics.writer import Writer
from sloscope.alerts.audit import AuditStore
from sloscope.alerts.remediation import Engine
from sloscope.alerts.remediation_config import load_config
from sloscope.alerts.webhook import TokenError, WebhookApp, load_token
from sloscope.sampling.config import load_config as load_sampling_config
from sloscope.sampling.policy import SamplingService

from sloscope.commands import serve_clickhouse
from sloscope.analytics.decode_pool import OFFLOAD_ABOVE_BYTES, DecodePool
from sloscope.commands.serve_common import (bind_listeners, close_settled, pages_of, serve_until_stopped,
                                             stop_on_signals)
from sloscope.commands.serve_ops import (Listeners, add_edge_arguments, add_limit_arguments, edge_of,
                                         intake_collector, limits_of)

log = logging.getLogger("sloscope.serve")


DEFAULT_GRPC = "127.0.0.1:4317"


def register(subparsers) -> None:
    serve = subparsers.add_parser(
        "serve", help="receive OTLP (HTTP and gRPC) into the DuckDB store; or answer /metrics, /rca and "
        "/sampling from a ClickHouse one",
        description="Receive OTLP/HTTP (/v1/traces, /v1/metrics, /v1/logs; protobuf or JSON, plain or in any "
        "compression of the Collector's otlphttp exporter: gzip, zstd, zlib, deflate, snappy, x-snappy-framed, "
        "lz4) and "
        "OTLP/gRPC, resolve request tiers against the SLO spec, and write everything through one writer into "
        "the DuckDB store. When the writer's queue is full, requests get the OTLP retryable answer (HTTP 503 "
        "with Retry-After, gRPC UNAVAILABLE). GET /metrics on the HTTP port is the Prometheus exposition of "
        "the SLIs, physical signals, incident cause scores and ingest counters that `sloscope rules` alerts on. "
        "With --webhook, Alertmanager's webhooks drive allow-listed remediation, audited in the same database. "
        "GET /healthz answers while the process runs; GET /readyz only while the store is open, the writer "
        "can write and serve is not shutting down. SIGTERM writes everything accepted before exiting. "
        "With --store chdb:///PATH or clickhouse://USER@HOST:PORT/DATABASE, serve is the read side of the "
        "OpenTelemetry Collector clickhouseexporter's tables instead: the GET pages only, computed in ClickHouse.")
    add_store_arguments(serve)
    serve.add_argument("--slo", type=Path, metavar="SLO.yaml",
                       help="SLO spec whose tiers are the allow-list (default: as for ingest)")
    serve.add_argument("--http", default="127.0.0.1:4318", metavar="HOST:PORT",
                       help="OTLP/HTTP address (default: %(default)s; 'off' to disable)")
    serve.add_argument("--grpc", metavar="HOST:PORT",
                       help=f"OTLP/gRPC address (default: {DEFAULT_GRPC}; 'off' to disable)")
    serve.add_argument("--queue-rows", type=above_zero(int), default=1_000_000, metavar="N",
                       help="rows accepted but not yet written before requests are refused (default: %(default)s)")
    serve.add_argument("--queue-bytes", type=size_argument, default="256MiB", metavar="SIZE",
                       help="bytes accepted but not yet committed (with --ack log: of the intake log) before "
                       "requests are refused (default: 256MiB)")
    serve.add_argument("--ack", choices=tuple(ACKS), default="log",
                       help="when a request is answered: " + "; ".join(f"{k}: {v}" for k, v in ACKS.items()))
    serve.add_argument("--intake-log", type=Path, metavar="DIR",
                       help="directory of the intake log, with --ack log (default: the database's path with "
                       ".intake added); requests the store refuses after they were acknowledged are kept in "
                       "DIR/rejected/")
    serve.add_argument("--decode-workers", type=int, default=_default_decode_workers(), metavar="N",
                       help="processes that decode large requests (64 KiB and more), so that intake is not bound "
                       "to one core; 0 decodes every request in the server process (default: one per CPU, at "
                       "most 4, none on one CPU: here %(default)s)")
    serve.add_argument("--webhook", default="off", metavar="HOST:PORT",
                       help="also receive Alertmanager webhooks here (POST /alerts; default: off); needs --remediation")
    serve.add_argument("--remediation", type=Path, metavar="REMEDIATION.yaml",
                       help="allow-list of alert -> action for the webhook (see alerts/remediation.example.yaml)")
    serve.add_argument("--webhook-token-file", type=Path, metavar="FILE",
                       help="file holding the webhook's bearer token, 16 characters or more (default: "
                       "$SLOSCOPE_WEBHOOK_TOKEN)")
    serve.add_argument("--sampling", type=Path, metavar="SAMPLING.yaml",
                       help="adaptive sampling config for GET /sampling (budget_spans_per_s, dwell, ...; "
                       "default: 100 spans/s, see sampling/policy.py)")
    serve.add_argument("--kube-api", metavar="URL|in-cluster",
                       help="list and watch the cluster's pods at this Kubernetes API server ('in-cluster': the "
                       "pod's service account), to place spans that name their pod (by name or IP) but no node "
                       "(Envoy sidecars, SDKs without host attributes); needs get/list/watch on pods "
                       "(deploy/rbac-pods.yaml). Default: off (such spans stay on the node 'unknown')")
    serve.add_argument("--retention", type=_retention_period, metavar="DURATION",
                       help="keep this much (e.g. 7d): requests, samples and histograms older than it are deleted "
                       "at start and every hour, between two writes, as `sloscope retention --keep` does; counted "
                       "as retention_runs, retention_deleted_<table> and retention_failures (default: keep "
                       "everything)")
    add_edge_arguments(serve)
    add_limit_arguments(serve)
    logs.add_arguments(serve)
    serve.set_defaults(func=run)


def _retention_period(text: str):
    try:
        return kept_period(text, "")  # argparse names the flag
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _default_decode_workers() -> int:
    cpus = len(os.sched_getaffinity(0))
    return min(cpus, 4) if cpus > 1 else 0


def run(args) -> int:
    """Opens the store once, as its URL says serve uses it (analytics/stores.py): a DuckDB file for writing, the
    intake writing it here; ClickHouse read-only, the Collector's exporter writing it. Then serves that side."""
    faulthandler.enable(sys.__stderr__)  # a fatal error in native code still leaves every thread's stack in the log
    try:
        url = parse_store_url(store_url(args))
        if url.served_read_only:
            serve_clickhouse.refuse_writer_flags(args)  # before anything opens
        store = open_url(url, read_only=url.served_read_only, password_file=args.store_password_file)
    except (StoreError, ValueError) as exc:
        print(f"sloscope serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return serve_clickhouse.serve(args, store) if url.served_read_only else _serve_writing(args, store)


def _serve_writing(args, store) -> int:
    """Receives OTLP into `store`, a DuckDB store open for writing, until SIGTERM or SIGINT; closes it."""
    try:
        spec = store.spec(args.slo)
        http_addr = parse_address(args.http, "--http", may_be_off=True)
        grpc_addr = parse_address(args.grpc or DEFAULT_GRPC, "--grpc", may_be_off=True)
        webhook_addr = parse_address(args.webhook, "--webhook", may_be_off=True)
        webhook_app = _webhook_app(args, store, spec) if webhook_addr else None
        sampling = SamplingService(store.live_reader(), spec, load_sampling_config(args.sampling))
        limits = limits_of(args)
        edge = edge_of(args)
        intake_log = _intake_log(args, store.path)
        kube_api = KubeApi.of(args.kube_api) if args.kube_api else None
    except (SpecError, StoreError, ValueError) as exc:
        store.close()
        print(f"sloscope serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # Read before the writer starts: from then on the store's connection is the writer thread's (retention runs
    # there at once), and a second thread on one DuckDB connection fails or aborts the process.
    topology = GpuTopology(store.gpu_nodes())
    writer = Writer(store, max_queued_rows=args.queue_rows, max_queued_bytes=args.queue_bytes,
                    intake_log=intake_log, linger_s=0.0 if args.ack == "commit" else LINGER_S).start()
    retention = RetentionSchedule(store, writer, args.retention).start() if args.retention else None
    resolver = TierResolver.from_spec(spec)
    pods = PodDirectory()
    watch = PodWatch(kube_api, pods).start() if kube_api else None
    late = LatePlacement(store, writer, pods).start() if kube_api else None
    intake = Intake(writer, resolver, topology, args.ack, pods=pods)
    declared = spec.taxonomy.declared_metrics  # kept beside the catalog's metrics
    pool = DecodePool(args.decode_workers, resolver.allowed, resolver.default_tier, declared) \
        if args.decode_workers else None
    receiver = Receiver(intake, intake.offload(pool) if pool else None, OFFLOAD_ABOVE_BYTES, limits, declared)
    stop = stop_on_signals()
    edge.reload_on_sighup()
    if intake_log is not None:
        _replay(writer)
    listeners = Listeners()
    pages = pages_of(store, spec, sampling, stop, writer, intake_collector(receiver, writer, listeners, watch))
    try:
        bind_listeners(listeners, (http_addr, grpc_addr, webhook_addr), webhook_app, receiver, pages, edge)
    except OSError as exc:
        print(f"sloscope serve: {exc}", file=sys.stderr)
    else:
        serve_until_stopped(listeners, stop, f"writing to {store.path}; tiers {', '.join(spec.tiers)} "
                                             f"(default {spec.default_tier})")
        log.info("writing what was accepted")
    if pool:
        pool.close()
    for part in (watch, late, retention):
        if part:
            part.stop()
    writer.stop()
    close_settled(store)
    if not listeners.started:
        return 1
    log.info("stopped; written: %s; receiver: %s", dict(writer.counts), receiver.snapshot())
    return 0 if not writer.failed else 1


def _webhook_app(args, store, spec):
    """The webhook and its remediation engine, auditing into this process's store."""
    if args.remediation is None:
        raise ValueError("--webhook needs --remediation (the allow-list of alert -> action)")
    try:
        # A cursor of the store's connection at each use: the writer may have reopened it since start-up.
        engine = Engine(load_config(args.remediation), AuditStore(store.cursor), spec.tiers)
        return WebhookApp(engine, load_token(args.webhook_token_file))
    except (ConfigError, TokenError) as exc:
        raise ValueError(str(exc)) from None


def _intake_log(args, db: Path):
    """The intake log that --ack log acknowledges from (None for the other modes); ValueError when it cannot be
    opened."""
    directory = args.intake_log or db.with_name(db.name + ".intake")
    if args.ack != "log":
        if args.intake_log is not None:
            raise ValueError("--intake-log goes with --ack log")
        if any(directory.glob("*.log")):  # acknowledged requests that only a replay stores
            raise ValueError(f"{directory} holds requests acknowledged with --ack log: start with --ack log "
                             "once, to commit them")
        return None
    try:
        return IntakeLog(directory)
    except OSError as exc:
        raise ValueError(f"cannot open the intake log {directory}: {exc.strerror or exc}") from None


def _replay(writer) -> None:
    """Commit what the intake log kept from before this start before new requests (they get 503 until then),
    with the listeners up: /healthz answers while a store that cannot write holds the replay back."""
    replayed = writer.replay()
    if replayed:
        log.info("replaying %d requests from the intake log; until they are written, new ones get 503", replayed)

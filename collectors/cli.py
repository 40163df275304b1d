"""`sloscope collect`: the node collector (probes -> one OTLP metrics stream, spooled while the endpoint is
down)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from dataclasses import asdict

from sloscope import logs
from sloscope.arguments import Parser
from sloscope.durations import parse_duration

from . import config as config_mod
from .agent import Agent

log = logging.getLogger("sloscope.collect")

EPILOG = """\
configuration (flags > environment > --config file > defaults):
  file key          flag                  environment
  endpoint          --endpoint            OTEL_EXPORTER_OTLP_METRICS_ENDPOINT (as is), OTEL_EXPORTER_OTLP_ENDPOINT
  protocol          --protocol            OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL
  headers           --header K=V          OTEL_EXPORTER_OTLP_METRICS_HEADERS, OTEL_EXPORTER_OTLP_HEADERS
  timeout           --timeout             OTEL_EXPORTER_OTLP_METRICS_TIMEOUT, OTEL_EXPORTER_OTLP_TIMEOUT (ms)
  interval          --interval            OTEL_METRIC_EXPORT_INTERVAL (ms)
  probes            --probe
  probe_options     -
  cgroups           --cgroup
  spool.dir         --spool-dir
  spool.max_bytes   --spool-max-bytes
  spool.max_batches --spool-max-batches
  temporality       --temporality
  resource          -                     OTEL_RESOURCE_ATTRIBUTES (below the file's)
  node_name         --node-name           NODE_NAME (a DaemonSet sets it from spec.nodeName)
  health_interval   --health-interval
  compression       --compression         OTEL_EXPORTER_OTLP_METRICS_COMPRESSION, OTEL_EXPORTER_OTLP_COMPRESSION
  certificate       --certificate         OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE, OTEL_EXPORTER_OTLP_CERTIFICATE
  client_key        --client-key          OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY, OTEL_EXPORTER_OTLP_CLIENT_KEY
  client_certificate --client-certificate OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE, ..._CLIENT_CERTIFICATE
  insecure          --insecure            OTEL_EXPORTER_OTLP_METRICS_INSECURE, OTEL_EXPORTER_OTLP_INSECURE
  listen            --listen

  Default endpoint: http://localhost:4317 (grpc) or http://localhost:4318/v1/metrics (http/protobuf).
  For HTTP a base URL gets /v1/metrics appended. Durations: 10, 10s, 500ms, 1m. Sizes: 256MiB (binary), 256MB (decimal), 1.5GiB.
  A gRPC endpoint without a scheme (host:port) takes TLS unless insecure is true; a scheme always wins.
  certificate: PEM bundle to verify the endpoint (default: the system's); client_key and client_certificate:
  PEM pair for mutual TLS; compression: gzip or none (default none).

own telemetry: GET /healthz (200 while probes run and the sender lives, else 503; an unreachable endpoint is
  not unhealthy: the spool holds the data) and GET /metrics (Prometheus text: sloscope_collector_probe_up,
  _batches_exported_total, _batches_spooled_total, _batches_replayed_total, _batches_dropped_total{reason},
  _export_duration_seconds, ...) on --listen, by default 127.0.0.1:9465: on, and on loopback only, as the
  OpenTelemetry Collector serves its own telemetry. 0.0.0.0:9465 for a kubelet and Prometheus; off to disable.

tracefs: where none is mounted (a fresh mount namespace, a container without the host's tracing mount), a
  root collector mounts it in its own mount namespace before the eBPF probes start.

probes: auto (default) = the node set with eBPF where privileged, else the procfs fallbacks, plus every
  other registered probe (GPU, SPDK, ...) that is configured or available here; node; all; or names
  (see `sloscope probe --help`).

resource attributes: service.name=sloscope-collector, host.name, k8s.node.name (when NODE_NAME is set).

export: OTLP metrics (the SDK's data model, sent as OTLP protobuf). Counters and exponential histograms
  (scale 0) are cumulative by default (a running total per series since its fixed start time), gauges as
  read. Retried as the OTLP specification says: HTTP 429, 502, 503, 504 and gRPC UNAVAILABLE, CANCELLED,
  DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, DATA_LOSS, RESOURCE_EXHAUSTED with RetryInfo, after the
  Retry-After / RetryInfo the endpoint asks for; any other error answer is not retried.

no data loss: while the endpoint is down, slow, or busy, batches go to the spool (one checksummed OTLP
  ExportMetricsServiceRequest per file, fsynced, named by sequence number) and are replayed in order when
  it is back, also after a restart. An endpoint slower than the interval spools what waits behind the
  batch in flight. Past spool.max_bytes (the disk the files take, in whole blocks, as du counts it,
  DIR/rejected/ and DIR/corrupt/ included; room is made before a batch is written) / spool.max_batches,
  or on a full disk, the oldest set-aside files go first, then the oldest batches, counted and logged. A
  collector locks its spool directory while it runs: a second one given the same directory stops at once
  (exit status 2). A batch the endpoint refuses twice while it accepts an empty request goes to
  DIR/rejected/; a spool file that fails its checksum, or 5 reads in a row (EIO), goes to DIR/corrupt/.

exit status: 0 after a clean stop (SIGTERM/SIGINT, --duration, --once), 1 when no probe can run,
  2 on a configuration error, 130 when interrupted twice.
"""


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "collect", help="run this node's probes and export their metrics as OTLP (the node collector)",
        description="Run the probes available on this node (eBPF where privileged, else procfs; GPU and SPDK "
        "when present or configured), merge their samples into one OTLP metrics stream and export it over "
        "gRPC or HTTP/protobuf every --interval (a duration: 10s, 500ms), spooling to disk while the endpoint is unavailable.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file (keys below)")
    parser.add_argument("--endpoint", metavar="URL", help="OTLP endpoint (default http://localhost:4317, or "
                        "http://localhost:4318/v1/metrics for http/protobuf)")
    parser.add_argument("--protocol", metavar="P", help="grpc (default) or http/protobuf")
    parser.add_argument("--header", action="append", default=[], metavar="K=V",
                        help="an export request header (repeatable)")
    parser.add_argument("--timeout", metavar="DURATION", help="timeout of one export attempt (default 10s)")
    parser.add_argument("--interval", metavar="DURATION", help="collect and export every DURATION (default 5s)")
    parser.add_argument("--probe", action="append", default=[], metavar="NAME",
                        help="probe to run (repeatable; auto, node, all or a probe name; default auto)")
    parser.add_argument("--cgroup", action="append", default=[], metavar="CGROUP",
                        help="syscall probe: only these cgroup v2 ids or paths (repeatable)")
    parser.add_argument("--spool-dir", metavar="DIR",
                        help="spool directory, one collector's alone (default var/collector-spool)")
    parser.add_argument("--spool-max-bytes", metavar="SIZE",
                        help="spool bound in bytes of disk, whole blocks as du counts them (default 256MiB)")
    parser.add_argument("--spool-max-batches", metavar="N", help="spool bound in batches (default 100000)")
    parser.add_argument("--temporality", choices=("cumulative", "delta"),
                        help="of counters and histograms (default cumulative)")
    parser.add_argument("--node-name", metavar="NAME", help="k8s.node.name (default $NODE_NAME)")
    parser.add_argument("--health-interval", metavar="DURATION",
                        help="log a health line every DURATION (default 60s)")
    parser.add_argument("--compression", choices=config_mod.COMPRESSIONS, help="of export requests (default none)")
    parser.add_argument("--certificate", metavar="PEM", help="CA bundle to verify the endpoint with")
    parser.add_argument("--client-key", metavar="PEM", help="private key for mutual TLS (with --client-certificate)")
    parser.add_argument("--client-certificate", metavar="PEM", help="certificate (chain) for mutual TLS")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="plain text to a gRPC endpoint given without a scheme (default: TLS)")
    parser.add_argument("--listen", metavar="HOST:PORT",
                        help=f"serve /healthz and /metrics here (default {config_mod.DEFAULT_LISTEN}; off to disable)")
    logs.add_arguments(parser)
    bounded = parser.add_mutually_exclusive_group()
    bounded.add_argument("--duration", metavar="DURATION",
                         help="stop after DURATION (default: run until SIGTERM/SIGINT)")
    bounded.add_argument("--once", action="store_true", help="collect one interval, export it, stop")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved configuration as JSON (with where each value came from) and exit")
    parser.set_defaults(func=run)
    return parser


def _flags(args: argparse.Namespace) -> dict:
    parse = config_mod
    headers = {}
    for h in args.header:
        if "=" not in h:
            raise config_mod.ConfigError(f"--header: {h!r} is not K=V")
        k, v = h.split("=", 1)
        headers[k.strip().lower()] = v.strip()
    return {
        "endpoint": args.endpoint,
        "protocol": args.protocol,
        "headers": headers or None,
        "timeout_s": parse_duration(args.timeout, "--timeout") if args.timeout else None,
        "interval_s": parse_duration(args.interval, "--interval") if args.interval else None,
        "probes": tuple(n for p in args.probe for n in p.split(",") if n) or None,
        "cgroups": tuple(args.cgroup) or None,
        "spool_dir": args.spool_dir,
        "spool_max_bytes": parse.parse_size(args.spool_max_bytes, "--spool-max-bytes") if args.spool_max_bytes else None,
        "spool_max_batches": (parse.parse_count(args.spool_max_batches, "--spool-max-batches")
                              if args.spool_max_batches else None),
        "temporality": args.temporality,
        "node_name": args.node_name,
        "health_interval_s": (parse_duration(args.health_interval, "--health-interval")
                              if args.health_interval else None),
        "duration_s": parse_duration(args.duration, "--duration") if args.duration else None,
        "once": True if args.once else None,
        "compression": args.compression,
        "certificate": args.certificate,
        "client_key": args.client_key,
        "client_certificate": args.client_certificate,
        "insecure": args.insecure,
        "listen": args.listen,
    }


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_mod.load(args.config, _flags(args))
    except config_mod.ConfigError as exc:
        print(f"sloscope collect: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        out = asdict(cfg)
        out["headers"] = {k: "<redacted>" for k in cfg.headers}
        print(json.dumps(out, indent=2, default=list))
        return 0
    if not logging.getLogger().handlers:  # run outside `sloscope` (tests, python -m)
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)

    agent = Agent(cfg)
    interrupted = []

    def on_signal(signum, frame):
        if agent.stopping:  # a second signal: stop waiting for the shutdown
            interrupted.append(signum)
            raise KeyboardInterrupt
        log.info("%s: stopping (collecting the last interval, flushing the spool)", signal.Signals(signum).name)
        agent.request_stop()

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            previous[signum] = signal.signal(signum, on_signal)
        except ValueError:  # not the main thread
            pass
    try:
        return agent.run()
    except config_mod.ConfigError as exc:
        print(f"sloscope collect: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="sloscope")
    parser.add_argument("-v", "--verbose", action="store_true")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logs.configure_from(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

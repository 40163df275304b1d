"""What makes `sloscope serve` operable: its limit flags, TLS and authentication at its edge, binding every
listener before any serves, the liveness and readiness pages, and the intake's own families on /metrics."""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

from sloscope.addresses import address_text
from sloscope.arguments import above_zero, zero_or_more
from sloscope.sizes import size_argument, size_text

from sloscope.edge.auth import BearerAuth
from sloscope.edge.http_conn import PER_PEER_OFF, ConnectionCaps, add_caps_arguments
from sloscope.edge.tls import TlsFiles
from sloscope.receiver.limits import Limits
from sloscope.receiver.server import Unavailable
from sloscope.alerts.intake_metrics import IntakeCollector
from sloscope.alerts.webhook import load_token

log = logging.getLogger("sloscope.serve")
TEXT = "text/plain; charset=utf-8"
BEARER_TOKEN_ENV = "SLOSCOPE_BEARER_TOKEN"
OPEN_PAGES = frozenset({"/healthz", "/readyz"})  # the kubelet's probes carry no credentials



def add_limit_arguments(parser) -> None:
    d = Limits()
    group = parser.add_argument_group("limits", "what one client, and all together, may hold of serve's memory "
                                      "and time (sizes in bytes or as Kubernetes quantities: 32Mi and 32MiB binary, "
                                      "32M and 32MB decimal; times in seconds)")
    size, seconds, count = size_argument, above_zero(float), above_zero(int)
    group.add_argument("--max-request-body-size", type=size, default=size_text(d.max_body_bytes), metavar="SIZE",
                       help="largest OTLP/HTTP body, as sent and decompressed; larger is a 413 "
                       "(default: %(default)s)")
    group.add_argument("--max-inflight-bytes", type=size, default=size_text(d.max_inflight_bytes), metavar="SIZE",
                       help="request bodies being read or decoded at once, over HTTP and gRPC; past it, a "
                       "retryable 503 / UNAVAILABLE (default: %(default)s)")
    group.add_argument("--max-header-bytes", type=size, default=size_text(d.max_header_bytes), metavar="SIZE",
                       help="a request's line and headers; more closes the connection (default: %(default)s)")
    group.add_argument("--read-header-timeout", type=seconds, default=d.read_header_timeout_s, metavar="S",
                       help="from a request's first byte to the end of its headers (default: %(default)s)")
    group.add_argument("--read-timeout", type=seconds, default=d.read_timeout_s, metavar="S",
                       help="for a request's whole body; past it, a 408. Over gRPC, a connection's age before "
                       "its GOAWAY, and then its calls' time to finish (default: %(default)s)")
    group.add_argument("--write-timeout", type=seconds, default=d.write_timeout_s, metavar="S",
                       help="for a whole response (default: %(default)s)")
    group.add_argument("--idle-timeout", type=seconds, default=d.idle_timeout_s, metavar="S",
                       help="a keep-alive connection waiting for its next request; over gRPC, a connection "
                       "without calls (default: %(default)s)")
    add_caps_arguments(group, ConnectionCaps(d.max_connections, d.max_connections_per_peer,
                                             d.max_inflight_requests_per_peer), "OTLP/HTTP", "exporters")
    group.add_argument("--grpc-max-recv-msg-size", type=size, default=size_text(d.grpc_max_message_bytes),
                       metavar="SIZE",
                       help="largest OTLP/gRPC message; larger is RESOURCE_EXHAUSTED (default: %(default)s)")
    group.add_argument("--grpc-max-concurrent-rpcs", type=count, default=d.grpc_max_concurrent_rpcs, metavar="N",
                       help="OTLP/gRPC calls in progress at once, over all connections; more are "
                       "UNAVAILABLE, which clients retry (default: %(default)s)")
    group.add_argument("--grpc-max-concurrent-rpcs-per-peer", type=zero_or_more,
                       default=d.grpc_max_concurrent_rpcs_per_peer, metavar="N", help="OTLP/gRPC calls in progress "
                       f"at once from one client address; more are UNAVAILABLE; {PER_PEER_OFF} (default: %(default)s)")
    group.add_argument("--grpc-first-message-timeout", type=seconds, default=d.grpc_first_message_timeout_s,
                       metavar="S", help="from an OTLP/gRPC call's start to its whole message; past it, the call "
                       "is cancelled, which clients retry (default: %(default)s)")
    group.add_argument("--grpc-max-connections", type=count, default=d.grpc_max_connections, metavar="N",
                       help="OTLP/gRPC connections open at once; gRPC closes new ones past it (it can close no "
                       "idle one for them: those close after --idle-timeout without calls) (default: %(default)s)")
    group.add_argument("--grpc-max-concurrent-streams", type=count, default=d.grpc_max_concurrent_streams,
                       metavar="N", help="OTLP/gRPC calls in progress on one connection (HTTP/2 streams); gRPC "
                       "refuses more with REFUSED_STREAM, a retryable UNAVAILABLE (default: %(default)s)")
    past = "counted before it is decoded; more is a 413 / RESOURCE_EXHAUSTED (default: %(default)s)"
    group.add_argument("--max-request-items", type=count, default=d.max_request_items, metavar="N",
                       help="resources, scopes, spans, span events and links, metrics, data points, exemplars and "
                       f"log records in one request, {past}")
    group.add_argument("--max-request-attributes", type=count, default=d.max_request_attributes, metavar="N",
                       help=f"attributes (key-values at every level, values in arrays) in one request, {past}")
    group.add_argument("--max-request-buckets", type=count, default=d.max_request_buckets, metavar="N",
                       help=f"histogram buckets (bucket counts, explicit bounds, summary quantiles) in one request, "
                       f"{past}")


def add_edge_arguments(parser) -> None:
    group = parser.add_argument_group(
        "TLS and authentication", "for OTLP/HTTP (and its GET pages) and OTLP/gRPC, as the OpenTelemetry "
        "Collector's tls settings and bearertokenauth extension. With a token, every request needs "
        "'Authorization: Bearer TOKEN' (gRPC: 'authorization' metadata), else HTTP 401 / UNAUTHENTICATED; as "
        "for a Prometheus exporter's web config, that includes GET /metrics, /rca and /sampling (give Prometheus "
        "the token with authorization.credentials_file); only /healthz and /readyz stay open, for the kubelet. "
        "SIGHUP rereads the certificate files.")
    group.add_argument("--tls-cert-file", type=Path, metavar="FILE",
                       help="PEM certificate (chain) to serve; with --tls-key-file, both listeners take TLS only")
    group.add_argument("--tls-key-file", type=Path, metavar="FILE", help="PEM private key of --tls-cert-file")
    group.add_argument("--tls-client-ca-file", type=Path, metavar="FILE",
                       help="PEM CA bundle: clients must present a certificate it signed (mutual TLS)")
    group.add_argument("--bearer-token-file", type=Path, metavar="FILE",
                       help=f"file whose first line is the token OTLP clients must present, 16 characters or "
                       f"more (default: ${BEARER_TOKEN_ENV} where set; else none is asked for)")


@dataclass(frozen=True)
class Edge:
    tls: object = None  # edge.tls.TlsFiles
    auth: object = None  # edge.auth.BearerAuth

    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def reload_on_sighup(self) -> None:
        if self.tls is not None:
            signal.signal(signal.SIGHUP, lambda *_: self.tls.reload())


def edge_of(args, env: dict | None = None) -> Edge:
    """TLS and the bearer token from the flags (and $SLOSCOPE_BEARER_TOKEN); ValueError says what is wrong."""
    env = os.environ if env is None else env
    if (args.tls_cert_file is None) != (args.tls_key_file is None):
        raise ValueError("--tls-cert-file and --tls-key-file go together")
    if args.tls_client_ca_file is not None and args.tls_cert_file is None:
        raise ValueError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
    tls = TlsFiles(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file) if args.tls_cert_file else None
    auth = None
    if args.bearer_token_file is not None or env.get(BEARER_TOKEN_ENV, "").strip():
        token = load_token(args.bearer_token_file, env, BEARER_TOKEN_ENV)
        if not all(33 <= byte < 127 for byte in token):  # what a client can put in one header value
            raise ValueError("the bearer token must be printable ASCII without spaces")
        auth = BearerAuth(token, OPEN_PAGES)
    return Edge(tls, auth)


def limits_of(args):
    return Limits(max_body_bytes=args.max_request_body_size, max_inflight_bytes=args.max_inflight_bytes,
                  max_header_bytes=args.max_header_bytes,
                  read_header_timeout_s=args.read_header_timeout, read_timeout_s=args.read_timeout,
                  write_timeout_s=args.write_timeout, idle_timeout_s=args.idle_timeout,
                  max_connections=args.max_connections, max_connections_per_peer=args.max_connections_per_peer,
                  max_inflight_requests_per_peer=args.max_inflight_requests_per_peer,
                  grpc_max_message_bytes=args.grpc_max_recv_msg_size,
                  grpc_max_concurrent_rpcs=args.grpc_max_concurrent_rpcs,
                  grpc_max_concurrent_rpcs_per_peer=args.grpc_max_concurrent_rpcs_per_peer,
                  grpc_first_message_timeout_s=args.grpc_first_message_timeout,
                  grpc_max_connections=args.grpc_max_connections,
                  grpc_max_concurrent_streams=args.grpc_max_concurrent_streams,
                  max_request_items=args.max_request_items, max_request_attributes=args.max_request_attributes,
                  max_request_buckets=args.max_request_buckets)


@dataclass
class Listener:
    kind: str  # "http" (socketserver) or "grpc"
    server: object
    shown: str  # for the log: what listens where

    def start(self) -> None:
        if self.kind == "grpc":
            self.server.start()
        else:
            threading.Thread(target=self.server.serve_forever, name=self.shown, daemon=True).start()
        log.info("%s", self.shown)

    def close(self, started: bool) -> None:
        if self.kind == "grpc":
            self.server.stop(grace=5 if started else None).wait()
            return
        if started:
            self.server.drain()  # every connection thread ended: none is left inside the store
        else:
            self.server.server_close()


@dataclass
class Listeners:
    """Every listener bound before any starts, so that an address that cannot be had stops serve before it
    serves anything, with one line saying which."""

    bound: list[Listener] = field(default_factory=list)
    started: bool = False

    def bind(self, kind: str, what: str, address: tuple[str, int], make) -> None:
        """`make()` binds and returns (server, what the log says of it); OSError: this one and those bound before
        are closed, and the error names the address."""
        try:
            server, shown = make()
        except OSError as exc:
            self.close()
            raise OSError(f"cannot listen for {what} on {address_text(address)}: {exc.strerror or exc}") from None
        self.bound.append(Listener(kind, server, shown))

    def start(self) -> None:
        for listener in self.bound:
            listener.start()
        self.started = True

    def close(self) -> None:
        for listener in self.bound:
            listener.close(self.started)
        self.bound = []


def healthz() -> tuple[bytes, str]:
    """Live: the process answers HTTP."""
    return b"ok\n", TEXT


def readiness_page(store, writer, stopping: threading.Event):
    """GET /readyz: 200 while the store is open, the writer (if serve writes) can write and serve is not
    shutting down; else a 503 that says which, so that a load balancer sends exporters elsewhere. The page is
    open to anyone (the kubelet's probes carry no credentials), so it names each problem in its own few words
    only, never the error's text (file paths, the store's messages): that goes to the log, once per change."""
    said = ""

    def page() -> tuple[bytes, str]:
        nonlocal said
        problems = ["shutting down"] if stopping.is_set() else []
        problems += [p for p in (_store_problem(store), writer.health() if writer else None) if p]
        summary = "; ".join(p.split(":", 1)[0] for p in problems)
        if summary != said:
            if problems:
                log.warning("not ready: %s", "; ".join(problems))
            said = summary
        if problems:
            raise Unavailable("not ready: " + summary)
        return b"ready\n", TEXT

    return page


def _store_problem(store) -> str | None:
    try:
        with store.reading() as reader:
            reader.rows("SELECT 1")
    except Exception as exc:  # DuckDB's and ClickHouse's errors alike: the store cannot answer
        return f"store not open: {exc}"
    return None


def intake_collector(receiver, writer, listeners: Listeners, watch=None):
    """The intake's own /metrics families (alerts/intake_metrics.py) for this process's receiver and writer, and
    its pod watch when it has one."""
    def stats() -> dict:
        found = {"receiver": receiver.snapshot(), "inflight_bytes": receiver.inflight.held, "writer": writer.stats(),
                 "writer_health": writer.health(),
                 "open_connections": sum(getattr(b.server, "open_connections", 0) for b in listeners.bound)}
        if watch is not None:
            found["pods"] = {"known": len(watch.directory), "synced": watch.synced.is_set(),
                             "counts": {**watch.counts, **watch.directory.counts}}
        return found

    return IntakeCollector(stats)

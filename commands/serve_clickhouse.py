"""`sloscope serve --store chdb:///PATH | clickhouse://USER@HOST:PORT/DATABASE`: the read side of a fleet whose
OpenTelemetry Collectors write OTLP into ClickHouse with the contrib clickhouseexporter.

On the --http port it serves what Prometheus, the trace samplers and people read: /metrics, /rca, /sampling,
/healthz and /readyz, computed in ClickHouse from the exporter's tables by the queries of analytics/sql/clickhouse/.
It receives no OTLP (the Collector writes the tables), so what serve does only as the writer of its DuckDB file is
refused here with the reason, before the store opens (commands/serve.py opens it, read-only).
"""

from __future__ import annotations

import logging
import sys

from sloscope.addresses import parse_address
from sloscope.slo_spec import SpecError

from sloscope.analytics.cli import EXIT_USAGE
from sloscope.analytics.errors import StoreError
from sloscope.sampling.config import load_config as load_sampling_config
from sloscope.sampling.policy import SamplingService

from sloscope.commands.serve_common import (bind_listeners, close_settled, pages_of, serve_until_stopped,
                                             stop_on_signals)
from sloscope.commands.serve_ops import Listeners, edge_of

log = logging.getLogger("sloscope.serve")

WRITER_LISTENERS = (  # (argument, why it cannot listen here): not given or off, in any case, is what is taken
    ("grpc", "--grpc: no OTLP intake on a ClickHouse store (the Collector's clickhouseexporter writes the tables)"),
    ("webhook", "--webhook: remediation audits into a DuckDB file; run `sloscope webhook --db FILE`"),
)
WRITER_ONLY = (  # (argument, why it cannot be given here)
    ("kube_api", "--kube-api: spans are placed as they are written; give the Collector the k8sattributes processor"),
    ("retention", "--retention: set the exporter's `ttl` (ClickHouse drops old parts itself)"),
)


def refuse_writer_flags(args) -> None:
    """ValueError naming every flag given that only the writer of a DuckDB file acts on (and --http off, which
    leaves nothing to serve)."""
    refused = [why for name, why in WRITER_LISTENERS if _listens(args, name)]
    refused += [why for name, why in WRITER_ONLY if getattr(args, name) is not None]
    if not _listens(args, "http"):
        refused.append("--http off leaves nothing to serve")
    if refused:
        raise ValueError("; ".join(refused))


def _listens(args, name: str) -> bool:
    """Whether --NAME asks for a listener: the grammar reads `off` in any case, so the parsed address is compared,
    not the text."""
    value = getattr(args, name)
    return value is not None and parse_address(value, f"--{name}", may_be_off=True) is not None


def serve(args, store) -> int:
    """Answers the GET pages from `store`, open read-only, until SIGTERM or SIGINT; closes it."""
    try:
        http_addr = parse_address(args.http, "--http", may_be_off=True)
        spec = store.spec(args.slo)
        sampling = SamplingService(store, spec, load_sampling_config(args.sampling))
        edge = edge_of(args)
    except (SpecError, StoreError, ValueError) as exc:
        store.close()
        print(f"sloscope serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    stop = stop_on_signals()
    edge.reload_on_sighup()
    listeners = Listeners()
    try:
        bind_listeners(listeners, (http_addr, None, None), None, None, pages_of(store, spec, sampling, stop), edge)
    except OSError as exc:
        store.close()
        print(f"sloscope serve: {exc}", file=sys.stderr)
        return 1
    serve_until_stopped(listeners, stop, f"reading {store.path}; tiers {', '.join(spec.tiers)} "
                                         f"(default {spec.default_tier})")
    close_settled(store)
    log.info("stopped")
    return 0

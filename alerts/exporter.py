"""Prometheus exposition of the store: a prometheus_client Collector that queries DuckDB at scrape time.

Families (names in alerts/metric_names.py):
- `sloscope_request_duration_seconds` (histogram), `sloscope_requests_total`, `sloscope_request_errors_total`
  per tier, service and node, cumulative over the ingested spans. The bucket bounds include every tier's
  latency threshold, so each tier's "slower than the objective" count is one exact bucket.
- the physical signals the rules use, as gauges: the latest stored value of each series, if it is younger than
  `gauge_max_age_s` (a series that stopped reporting disappears instead of holding its last value).
- `sloscope_incident_cause_score{tier,service,node,cause}`: the top causes of each open incident, from
  analytics.rca.analyse over the last `incident_lookback_s`, computed at most once per `cache_s`.
- `sloscope_ingest_<name>_total`: the store's ingest and rejection counters.
- with `render(..., intake=...)`, `sloscope serve`'s own receiver and writer families (alerts/intake_metrics.py).
- `sloscope_exporter_series_dropped_total{family}`: label sets left out of scrapes because a family reached
  `max_series` (summed over scrapes: a rate above zero means the cap bites);
  `sloscope_exporter_errors_total{part}`: parts of scrapes that failed (logged; the rest is still served).

Queries run on their own cursor (`connect()`, e.g. `store.con.cursor`), never on a connection another thread
uses, so scrapes may run beside the writer of `sloscope serve`.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import weakref
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from analytics.store import Reader
from sloscope.records import HISTOGRAM_BUCKETS, HISTOGRAM_OFFSET

from alerts import metric_names as x

log = logging.getLogger("sloscope.exporter")

try:  # the classic text format every Prometheus 2.x reads; our names never need the 1.0.0 format's escaping
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as CONTENT_TYPE
except ImportError:  # older prometheus_client: its latest is 0.0.4
    from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE

DEFAULT_MAX_SERIES = 10_000


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)


def spec_of(con):
    """The SLO spec recorded with the database, else the built-in one."""
    return Reader(con).slo_spec()


class StoreCollector(Collector):
    def __init__(self, connect: Callable, spec=None, *, max_series: int = DEFAULT_MAX_SERIES,
                 gauge_max_age_s: float | None = 300.0, incident_lookback_s: float = 1800.0,
                 incident_open_s: float | None = None, top_causes: int = 3, cache_s: float = 15.0,
                 clock: Callable[[], float] = time.time):
        self.connect = connect
        if spec is None:
            con = connect()
            try:
                spec = spec_of(con)
            finally:
                con.close()
        self.spec = spec
        self.buckets_s = x.buckets_for(spec)
        self.max_series = max_series
        self.gauge_max_age_s = gauge_max_age_s
        self.incident_lookback_s = incident_lookback_s
        self.incident_open_s = incident_open_s if incident_open_s is not None else max(120.0, 6 * spec.resolution_s)
        self.top_causes = top_causes
        self.cache_s = cache_s
        self.clock = clock
        self.dropped: Counter = Counter()
        self.errors: Counter = Counter()
        self._lock = threading.Lock()  # counters and the incident cache
        self._incidents: tuple[float, list] | None = None
        self._incident_lock = threading.Lock()  # one analysis at a time; other scrapes wait for its result

    def describe(self):
        return []  # families are only known from the data; nothing is collected at registration

    def collect(self):
        con = self.connect()
        try:
            for part, build in (("requests", self._requests), ("gauges", self._gauges),
                                ("counters", self._counters), ("histograms", self._signal_histograms),
                                ("incidents", self._incident_family), ("ingest", self._ingest),
                                ("remediation", self._remediation)):
                try:
                    families = list(build(con))
                except Exception:
                    log.warning("exporter: the %s part of the scrape failed; left out", part, exc_info=True)
                    with self._lock:
                        self.errors[part] += 1
                    continue
                yield from families
        finally:
            con.close()
        yield from self._own()

    # --- parts --------------------------------------------------------------------------------------------------

    def _drop(self, family: str, count: int) -> None:
        if count > 0:
            with self._lock:
                self.dropped[family] += count

    def _requests(self, con):
        bounds_ms = [round(b * 1000, 6) for b in self.buckets_s]
        cols = ", ".join(f"count(*) FILTER (WHERE duration_ms <= {b!r})" for b in bounds_ms)
        rows = con.execute(
            f"SELECT *, count(*) OVER () FROM (SELECT tier, service, node, count(*), "
            f"coalesce(sum(duration_ms), 0) / 1000.0, count(*) FILTER (WHERE failed), {cols} "
            f"FROM requests GROUP BY tier, service, node) ORDER BY tier, service, node LIMIT ?",
            [self.max_series]).fetchall()
        total = rows[0][-1] if rows else 0
        self._drop(x.REQUEST_DURATION, total - len(rows))
        hist = HistogramMetricFamily(x.REQUEST_DURATION, "Duration of requests (SERVER spans) ingested into the "
                                     "store, by SLO tier, service and node; cumulative over the store.",
                                     labels=x.REQUEST_LABELS)
        reqs = CounterMetricFamily(x.REQUESTS, "Requests ingested into the store, by SLO tier, service and node.",
                                   labels=x.REQUEST_LABELS)
        errs = CounterMetricFamily(x.REQUEST_ERRORS, "Failed requests (5xx or span status ERROR) ingested into the "
                                   "store, by SLO tier, service and node.", labels=x.REQUEST_LABELS)
        les = [x.le_label(b) for b in self.buckets_s]
        for row in rows:
            labels = [row[0], row[1], row[2]]
            n, sum_s, failed, cumulative = row[3], row[4], row[5], row[6:-1]
            hist.add_metric(labels, buckets=[*zip(les, cumulative), ("+Inf", n)], sum_value=sum_s)
            reqs.add_metric(labels, n)
            errs.add_metric(labels, failed)
        return [hist, reqs, errs]

    def _gauges(self, con):
        by_signal = {g.signal: g for g in x.GAUGES}
        since = _utc(self.clock() - self.gauge_max_age_s) if self.gauge_max_age_s is not None else datetime(1970, 1, 1)
        placeholders = ", ".join("?" for _ in by_signal)
        excluded, excluded_params = "", []
        for family in x.GAUGES:  # before the cap, so excluded series do not take places
            for attr in family.exclude_if:
                excluded += " AND NOT (metric = ? AND contains(attributes, ?))"
                excluded_params += [family.signal, json.dumps(attr) + ":"]
        rows = con.execute(
            f"SELECT metric, node, attributes, value, total FROM ("
            f"  SELECT metric, node, attributes, arg_max(value, ts) AS value, "
            f"         count(*) OVER (PARTITION BY metric) AS total, "
            f"         row_number() OVER (PARTITION BY metric ORDER BY node, attributes) AS n "
            f"  FROM samples WHERE metric IN ({placeholders}) AND interval_s IS NULL AND ts >= ?{excluded} "
            f"  GROUP BY metric, node, attributes) WHERE n <= ? ORDER BY metric, node, attributes",
            [*by_signal, since, *excluded_params, self.max_series]).fetchall()
        values: dict[str, dict[tuple, float]] = {g.name: {} for g in x.GAUGES}
        totals: dict[str, int] = {}
        for metric, node, attributes, value, total in rows:
            family = by_signal[metric]
            totals[family.name] = total
            try:
                attrs = json.loads(attributes)
            except ValueError:
                attrs = {}
            if not isinstance(attrs, dict) or any(k in attrs for k in family.exclude_if):
                continue
            labels = tuple(node if attr == "node" else str(attrs.get(attr, "")) for _, attr in family.labels)
            series = values[family.name]
            series[labels] = max(value, series.get(labels, value))  # a collision keeps the worse (higher) value
        for family in x.GAUGES:
            self._drop(family.name, totals.get(family.name, 0) - min(totals.get(family.name, 0), self.max_series))
            g = GaugeMetricFamily(family.name, family.help)
            for labels, value in sorted(values[family.name].items()):
                # an empty label is no label (as Prometheus stores it); e.g. NVMe by bdev or by device
                g.add_sample(family.name, {k: v for k, v in zip(family.label_names, labels) if v}, value)
            yield g

    def _labels(self, family, node: str, attributes: str) -> dict:
        try:
            attrs = json.loads(attributes)
        except ValueError:
            attrs = {}
        values = (node if attr == "node" else str(attrs.get(attr, "")) for _, attr in family.labels)
        return {k: v for k, v in zip(family.label_names, values) if v}

    def _capped(self, con, query: str, families, params=()):
        """Rows of `query` (metric, node, attributes, ...) for the families' signals, at most max_series per
        family, in a fixed order so that the kept set does not flap."""
        by_signal = {f.signal: f for f in families}
        placeholders = ", ".join("?" for _ in by_signal)
        rows = con.execute(
            f"SELECT * FROM (SELECT *, count(*) OVER (PARTITION BY metric) AS total, row_number() OVER "
            f"(PARTITION BY metric ORDER BY node, attributes) AS n FROM ({query.format(placeholders)})) "
            f"WHERE n <= ? ORDER BY metric, node, attributes", [*by_signal, *params, self.max_series]).fetchall()
        for family in families:
            total = next((r[-2] for r in rows if r[0] == family.signal), 0)
            self._drop(family.name, total - min(total, self.max_series))
        return by_signal, [r[:-2] for r in rows]

    def _counters(self, con):
        by_signal, rows = self._capped(
            con, "SELECT metric, node, attributes, sum(value) AS value FROM samples WHERE metric IN ({}) "
                 "AND interval_s IS NOT NULL GROUP BY metric, node, attributes", x.COUNTERS)
        families = {f.name: CounterMetricFamily(f.name, f.help) for f in x.COUNTERS}
        for metric, node, attributes, value in rows:
            family = by_signal[metric]
            families[family.name].add_sample(family.name, self._labels(family, node, attributes), value)
        return list(families.values())

    def _signal_histograms(self, con):
        by_signal, rows = self._capped(
            con, "SELECT metric, node, attributes, sum(count) AS count, sum(sum) AS sum, "
                 "list_reduce(list(buckets), lambda a, b: list_transform(list_zip(a, b), lambda p: p[1] + p[2])) AS buckets "
                 "FROM histograms WHERE metric IN ({}) GROUP BY metric, node, attributes", x.SIGNAL_HISTOGRAMS)
        uppers = [2.0 ** (i + HISTOGRAM_OFFSET + 1) for i in range(HISTOGRAM_BUCKETS)]
        les = [x.le_label(b) for b in x.SIGNAL_BUCKETS_S]
        families = {f.name: HistogramMetricFamily(f.name, f.help, labels=f.label_names) for f in x.SIGNAL_HISTOGRAMS}
        for metric, node, attributes, count, total, buckets in rows:
            family = by_signal[metric]
            labels = self._labels(family, node, attributes)
            cumulative = [sum(n for n, upper in zip(buckets, uppers) if upper <= le) for le in x.SIGNAL_BUCKETS_S]
            families[family.name].add_metric([labels.get(k, "") for k in family.label_names],
                                              buckets=[*zip(les, cumulative), ("+Inf", count)], sum_value=total)
        return list(families.values())

    def _remediation(self, con):
        c = CounterMetricFamily(x.REMEDIATION_ACTIONS, "Remediation decisions by alert, action and decision "
                                "(executed, dry_run, refused, failed).", labels=x.REMEDIATION_LABELS)
        exists = con.execute("SELECT count(*) FROM information_schema.tables "
                             "WHERE table_name = 'remediation_audit'").fetchall()[0][0]
        if exists:
            for alert, action, target, decision, n in con.execute(
                    "SELECT alert, coalesce(action, ''), coalesce(target, ''), decision, count(*) "
                    "FROM remediation_audit GROUP BY ALL ORDER BY ALL LIMIT ?", [self.max_series]).fetchall():
                c.add_metric([alert, action, target, decision], n)
        return [c]

    def _incident_family(self, con):
        g = GaugeMetricFamily(x.INCIDENT_CAUSE_SCORE, "Score (0..1) of each of the top causes sloscope's analysis "
                              "ranks for an open SLO incident, by tier, service, node and cause.",
                              labels=x.INCIDENT_LABELS)
        for labels, score in self.incident_scores(con):
            g.add_metric(list(labels), score)
        return [g]

    def incident_scores(self, con) -> list[tuple[tuple[str, str, str, str], float]]:
        with self._incident_lock:
            now = self.clock()
            cached = self._incidents
            if cached is not None and now - cached[0] < self.cache_s:
                return cached[1]
            scores = self._analyse(con, now)
            self._incidents = (now, scores)
            return scores

    def _analyse(self, con, now: float):
        from analytics.rca import analyse, parse_time

        until = _utc(now)
        result = analyse(Reader(con), self.spec, since=until - timedelta(seconds=self.incident_lookback_s),
                         until=until, top=self.top_causes)
        open_after = until - timedelta(seconds=self.incident_open_s)
        best: dict[tuple, float] = {}
        for incident in result["incidents"]:
            if parse_time(incident["end"], None) < open_after:
                continue
            for cause in incident["causes"][: self.top_causes]:
                key = (incident["tier"], incident["service"], incident["node"], cause["cause"])
                best[key] = max(float(cause["score"]), best.get(key, 0.0))
        items = sorted(best.items())
        self._drop(x.INCIDENT_CAUSE_SCORE, len(items) - self.max_series)
        return items[: self.max_series]

    def _ingest(self, con):
        rows = con.execute("SELECT name, value FROM ingest_counters ORDER BY name LIMIT ?",
                           [self.max_series]).fetchall()
        merged: Counter = Counter()
        for name, value in rows:
            merged[re.sub(r"[^a-zA-Z0-9_]", "_", name).strip("_").lower()] += value
        for name, value in sorted(merged.items()):
            if not name:
                continue
            family = CounterMetricFamily(f"{x.INGEST_PREFIX}{name}",
                                         f"Ingest counter {name} of the store (loaded, skipped, rejected, ...).")
            family.add_metric([], value)
            yield family

    def _own(self):
        with self._lock:
            dropped, errors = dict(self.dropped), dict(self.errors)
        d = CounterMetricFamily(x.SERIES_DROPPED, "Label sets left out of scrapes because their family reached the "
                                "exporter's cap, summed over scrapes.", labels=["family"])
        for family in [x.REQUEST_DURATION, *(g.name for g in x.GAUGES), x.INCIDENT_CAUSE_SCORE]:
            d.add_metric([family], dropped.get(family, 0))
        e = CounterMetricFamily(x.EXPORTER_ERRORS, "Parts of scrapes that failed and were left out (see the log).",
                                labels=["part"])
        for part in ("requests", "gauges", "incidents", "ingest"):
            e.add_metric([part], errors.get(part, 0))
        return [d, e]


def registry_for(collector: StoreCollector, *others: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    for each in (collector, *others):
        registry.register(each)
    return registry


_collectors: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_collectors_lock = threading.Lock()


def render(store, spec=None, intake: Collector | None = None, **options) -> tuple[bytes, str]:
    """The /metrics response for `store` (an analytics.store.Store): (body, content type). The collector (and
    its incident cache) is kept per store, so repeated scrapes reuse it. `intake` adds the families of the
    process's own intake (alerts.intake_metrics), which are not in the store."""
    with _collectors_lock:
        entry = _collectors.get(store)
        if entry is None:
            collector = StoreCollector(store.con.cursor, spec, **options)
            entry = (collector, registry_for(collector, *([intake] if intake else [])))
            _collectors[store] = entry
    return generate_latest(entry[1]), CONTENT_TYPE

"""Prometheus exposition of the store: a prometheus_client Collector that queries the store at scrape time.

Families (names in sloscope/metric_names.py):
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

Each scrape reads through `reading()` (a store's `reading`): on DuckDB its own cursor, never a connection another
thread uses, so scrapes may run beside the writer of `sloscope serve`; on ClickHouse the store, whose queries take
turns. The queries are analytics/sql/ files in the store's dialect.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
import weakref
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from sloscope import metric_names
from sloscope import exposition
from sloscope.latency_buckets import bounds_ms
from sloscope.records import HISTOGRAM_BUCKETS, HISTOGRAM_OFFSET
from sloscope.times import parse_rfc3339

from sloscope.analytics.rca import analyse

log = logging.getLogger(__name__)

DEFAULT_MAX_SERIES = 10_000


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)


ALL_TIME = {"since": datetime(1970, 1, 1), "until": datetime(2262, 1, 1)}  # cumulative families: the whole store


class StoreCollector(Collector):
    def __init__(self, reading: Callable, spec=None, *, max_series: int = DEFAULT_MAX_SERIES,
                 gauge_max_age_s: float | None = 300.0, incident_lookback_s: float = 1800.0,
                 incident_open_s: float | None = None, top_causes: int = 3, cache_s: float = 15.0,
                 clock: Callable[[], float] = time.time):
        self.reading = reading
        if spec is None:
            with reading() as reader:
                spec = reader.slo_spec()
        self.spec = spec
        self.buckets_s = metric_names.buckets_for(spec)
        self.bounds_ms = bounds_ms(spec)  # the same bounds, as the store's queries compare them with durations
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
        with self.reading() as reader:
            for part, build in (("requests", self._requests), ("gauges", self._gauges),
                                ("counters", self._counters), ("histograms", self._signal_histograms),
                                ("incidents", self._incident_family), ("ingest", self._ingest),
                                ("remediation", self._remediation)):
                try:
                    families = list(build(reader))
                except Exception:
                    log.warning("/metrics: the %s part of the scrape failed; left out", part, exc_info=True)
                    with self._lock:
                        self.errors[part] += 1
                    continue
                yield from families
        yield from self._own()

    # --- parts --------------------------------------------------------------------------------------------------

    def _drop(self, family: str, count: int) -> None:
        if count > 0:
            with self._lock:
                self.dropped[family] += count

    def _capped(self, family: str, keys: list) -> set:
        """The first max_series of the label sets `keys` (sorted, so that the kept set does not flap); the rest
        is counted as dropped."""
        kept = sorted(set(keys))
        self._drop(family, len(kept) - self.max_series)
        return set(kept[: self.max_series])

    def _requests(self, reader):
        rows = reader.rows(reader.sql("request_totals"),
                           {**reader.tier_params(self.spec), "bounds_ms": self.bounds_ms, **ALL_TIME})
        kept = self._capped(metric_names.REQUEST_DURATION, [tuple(r[:3]) for r in rows])
        per_labels: dict[tuple, list] = {}
        for tier, service, node, bucket, n, seconds, failed in rows:
            if (tier, service, node) in kept:
                per_labels.setdefault((tier, service, node), []).append((bucket, n, seconds, failed))
        # What retention deleted is added to the label sets the store still holds requests of: one whose requests
        # are all gone is no longer exported, as a series that ends (no reset) and leaves room under max_series.
        retired: dict[tuple, list] = {}
        for tier, service, node, *counts in reader.rows(reader.sql("retired_request_totals")):
            retired.setdefault((tier, service, node), []).append(counts)
        request_labels = metric_names.REQUEST_LABELS
        hist = HistogramMetricFamily(metric_names.REQUEST_DURATION, "Duration of requests (SERVER spans) ingested "
                                     "into the store, by SLO tier, service and node; cumulative over the store.",
                                     labels=request_labels)
        reqs = CounterMetricFamily(metric_names.REQUESTS, "Requests ingested into the store, by SLO tier, service "
                                   "and node.", labels=request_labels)
        errs = CounterMetricFamily(metric_names.REQUEST_ERRORS, "Failed requests (5xx or span status ERROR) ingested "
                                   "into the store, by SLO tier, service and node.", labels=request_labels)
        les = [metric_names.le_label(b) for b in self.buckets_s]
        for labels, buckets in sorted(per_labels.items()):
            gone = retired.get(labels, [])
            n, seconds, failed = _retired_at(gone, math.inf)
            n += sum(b[1] for b in buckets)
            cumulative = [sum(count for bucket, count, _, _ in buckets if bucket <= i) + _retired_at(gone, bound)[0]
                          for i, bound in enumerate(self.bounds_ms)]
            hist.add_metric(list(labels), buckets=[*zip(les, cumulative), ("+Inf", n)],
                            sum_value=seconds + sum(b[2] for b in buckets))
            reqs.add_metric(list(labels), n)
            errs.add_metric(list(labels), failed + sum(b[3] for b in buckets))
        return [hist, reqs, errs]

    def _series(self, reader, query: str, families, since: datetime | None = None):
        """Rows (family, labels, rest...) of `query` for the families' signals, each series' labels taken from
        its node and attributes; a series with an attribute its family excludes is left out; at most max_series
        label sets per family."""
        by_signal = {f.signal: f for f in families}
        params = {"metrics": list(by_signal), **ALL_TIME, **({"since": since} if since else {})}
        picked = []
        for metric, node, attributes, *rest in reader.rows(reader.sql(query), params):
            family = by_signal[metric]
            try:
                attrs = json.loads(attributes)
            except ValueError:
                attrs = {}
            if not isinstance(attrs, dict) or any(k in attrs for k in family.exclude_if):
                continue
            labels = tuple(node if attr == "node" else str(attrs.get(attr, "")) for _, attr in family.labels)
            picked.append((family, labels, *rest))
        for family in families:
            kept = self._capped(family.name, [p[1] for p in picked if p[0] is family])
            picked = [p for p in picked if p[0] is not family or p[1] in kept]
        return picked

    @staticmethod
    def _named(family, labels: tuple) -> dict:
        # an empty label is no label (as Prometheus stores it); e.g. NVMe by bdev or by device
        return {k: v for k, v in zip(family.label_names, labels) if v}

    def _gauges(self, reader):
        since = _utc(self.clock() - self.gauge_max_age_s) if self.gauge_max_age_s is not None else None
        values: dict[str, dict[tuple, float]] = {g.name: {} for g in metric_names.GAUGES}
        for family, labels, value in self._series(reader, "latest_gauges", metric_names.GAUGES, since):
            series = values[family.name]
            series[labels] = max(value, series.get(labels, value))  # a collision keeps the worse (higher) value
        for family in metric_names.GAUGES:
            g = GaugeMetricFamily(family.name, family.help)
            for labels, value in sorted(values[family.name].items()):
                g.add_sample(family.name, self._named(family, labels), value)
            yield g

    def _counters(self, reader):
        families = {f.name: CounterMetricFamily(f.name, f.help) for f in metric_names.COUNTERS}
        for family, labels, value in self._series(reader, "counter_totals", metric_names.COUNTERS):
            families[family.name].add_sample(family.name, self._named(family, labels), value)
        return list(families.values())

    def _signal_histograms(self, reader):
        families = {f.name: HistogramMetricFamily(f.name, f.help, labels=f.label_names)
                    for f in metric_names.SIGNAL_HISTOGRAMS}
        uppers = [2.0 ** (i + HISTOGRAM_OFFSET + 1) for i in range(HISTOGRAM_BUCKETS)]
        les = [metric_names.le_label(b) for b in metric_names.SIGNAL_BUCKETS_S]
        for family, labels, count, total, buckets in self._series(reader, "signal_histogram_totals",
                                                                  metric_names.SIGNAL_HISTOGRAMS):
            cumulative = [sum(n for n, upper in zip(buckets, uppers) if upper <= le)
                          for le in metric_names.SIGNAL_BUCKETS_S]
            named = self._named(family, labels)
            families[family.name].add_metric([named.get(k, "") for k in family.label_names],
                                              buckets=[*zip(les, cumulative), ("+Inf", count)], sum_value=total)
        return list(families.values())

    def _remediation(self, reader):
        c = CounterMetricFamily(metric_names.REMEDIATION_ACTIONS, "Remediation decisions by alert, action and "
                                "decision (executed, dry_run, refused, failed, deferred).",
                                labels=metric_names.REMEDIATION_LABELS)
        if "remediation_audit" in reader.tables():
            rows = reader.rows(reader.sql("remediation_decisions"))
            for alert, action, target, decision, n in rows[: self.max_series]:
                c.add_metric([alert, action, target, decision], n)
        return [c]

    def _incident_family(self, reader):
        g = GaugeMetricFamily(metric_names.INCIDENT_CAUSE_SCORE, "Score (0..1) of each of the top causes sloscope's "
                              "analysis ranks for an open SLO incident, by tier, service, node and cause.",
                              labels=metric_names.INCIDENT_LABELS)
        for labels, score in self.incident_scores(reader):
            g.add_metric(list(labels), score)
        return [g]

    def incident_scores(self, reader) -> list[tuple[tuple[str, str, str, str], float]]:
        with self._incident_lock:
            now = self.clock()
            cached = self._incidents
            if cached is not None and now - cached[0] < self.cache_s:
                return cached[1]
            scores = self._analyse(reader, now)
            self._incidents = (now, scores)
            return scores

    def _analyse(self, reader, now: float):
        until = _utc(now)
        result = analyse(reader, self.spec, since=until - timedelta(seconds=self.incident_lookback_s),
                         until=until, top=self.top_causes)
        open_after = until - timedelta(seconds=self.incident_open_s)
        best: dict[tuple, float] = {}
        for incident in result["incidents"]:
            if parse_rfc3339(incident["end"]) < open_after:
                continue
            for cause in incident["causes"][: self.top_causes]:
                key = (incident["tier"], incident["service"], incident["node"], cause["cause"])
                best[key] = max(float(cause["score"]), best.get(key, 0.0))
        items = sorted(best.items())
        self._drop(metric_names.INCIDENT_CAUSE_SCORE, len(items) - self.max_series)
        return items[: self.max_series]

    def _ingest(self, reader):
        rows = sorted(reader.counters().items())[: self.max_series]
        merged: Counter = Counter()
        for name, value in rows:
            merged[re.sub(r"[^a-zA-Z0-9_]", "_", name).strip("_").lower()] += value
        for name, value in sorted(merged.items()):
            if not name:
                continue
            family = CounterMetricFamily(f"{metric_names.INGEST_PREFIX}{name}",
                                         f"Ingest counter {name} of the store (loaded, skipped, rejected, ...).")
            family.add_metric([], value)
            yield family

    def _own(self):
        with self._lock:
            dropped, errors = dict(self.dropped), dict(self.errors)
        d = CounterMetricFamily(metric_names.SERIES_DROPPED, "Label sets left out of scrapes because their family "
                                "reached the cap of /metrics, summed over scrapes.", labels=["family"])
        capped = [metric_names.REQUEST_DURATION, *(g.name for g in metric_names.GAUGES),
                  metric_names.INCIDENT_CAUSE_SCORE]
        for family in capped:
            d.add_metric([family], dropped.get(family, 0))
        e = CounterMetricFamily(metric_names.EXPORTER_ERRORS, "Parts of scrapes that failed and were left out (see "
                                "the log).", labels=["part"])
        for part in ("requests", "gauges", "incidents", "ingest"):
            e.add_metric([part], errors.get(part, 0))
        return [d, e]


_collectors: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_collectors_lock = threading.Lock()


def render(store, spec=None, intake: Collector | None = None, **options) -> tuple[bytes, str]:
    """The /metrics response for `store` (analytics/store_api.py): (body, content type). The collector (and
    its incident cache) is kept per store, so repeated scrapes reuse it. `intake` adds the families of the
    process's own intake (alerts.intake_metrics), which are not in the store."""
    with _collectors_lock:
        collector = _collectors.get(store)
        if collector is None:
            collector = _collectors[store] = StoreCollector(store.reading, spec, **options)
    return exposition.render(collector, *([intake] if intake else [])), exposition.CONTENT_TYPE


def _retired_at(retired: list, bound_ms: float) -> tuple[int, float, int]:
    """(requests, seconds, failed) that retention deleted at or under `bound_ms`, of one label set's
    retired_request_totals rows [(bound_ms, requests, seconds, failed)]: those of the highest bound under it,
    as the retirement counts a bound it has no row for yet (analytics/sql/retire_requests.sql)."""
    under = [counts for bound, *counts in retired if bound <= bound_ms]
    return tuple(max(c[i] for c in under) for i in range(3)) if under else (0, 0.0, 0)

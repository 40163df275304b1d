"""Prometheus exposition of the store: a prometheus_client Collector that queries the store, and the text of its last
run that /metrics serves.

Families (names in sloscope/metric_names.py):
- `sloscope_request_duration_seconds` (histogram), `sloscope_requests_total`, `sloscope_request_errors_total`
  per tier, service and node, cumulative over the ingested spans. The bucket bounds include every tier's
  latency threshold, so each tier's "slower than the objective" count is one exact bucket.
- `sloscope_request_ttft_seconds`, `sloscope_request_tpot_seconds`, `sloscope_request_queue_seconds` (histograms)
  of the inference requests' token timings, per tier, service and node, cumulative as the request families are;
  each over the requests that give that time, with bounds that include every tier's threshold for it. Each
  appears once a stored request gives its time.
- the physical signals the rules use, as gauges: the latest stored value of each series, if it is younger than
  `gauge_max_age_s` (a series that stopped reporting disappears instead of holding its last value).
- `sloscope_incident_cause_score{tier,service,node,cause}`: the top causes of each open incident, from
  analytics.rca.analyse over the last `incident_lookback_s`, computed at most once per `cache_s`.
- `sloscope_ingest_<name>_total`: the store's ingest and rejection counters.
- with `render(..., intake=...)`, `sloscope serve`'s own receiver and writer families (alerts/intake_metrics.py).
- `sloscope_exporter_series_dropped_total{family}`: label sets left out because a family reached `max_series`
  (summed over refreshes: a rate above zero means the cap bites); for the physical signals, counted in stored
  series (node and attributes), each of which gives one label set;
  `sloscope_exporter_errors_total{part}`: parts of refreshes that failed (logged; the rest is still served).

Every query fetches at most `max_series` label sets (or series) of a family, with the number there are: the cap
is applied in SQL, so that what crosses into Python, and is rendered, stays within it whatever the store holds.

/metrics (`render`) serves the text of the last refresh (`Exposition`), so that a scrape costs what it sends, not
what the queries read. A scrape starts a refresh unless one runs or the last ended less than IDLE_RATIO times its
duration ago, which holds refreshes to a share of the time however large the store grows. Where the last refresh
took at most WAIT_S, the scrape waits for the one in flight and is current; otherwise it answers at once with the
last good text, and the refresh goes on in the background. The counters come from the store's cumulative counts,
so they stay monotonic across refreshes and restarts of serve; only this process's own counters (dropped, errors)
start again at zero with it, as Prometheus counters may on a restart.

Each refresh reads through `reading()` (a store's `reading`): on DuckDB its own cursor, never a connection another
thread uses, so refreshes may run beside the writer of `sloscope serve`; on ClickHouse the store, whose queries
take turns. The queries are analytics/sql/ files in the store's dialect.
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
WAIT_S = 1.0  # a scrape waits this long for a refresh where the last one took no longer: a small store's is current
IDLE_RATIO = 3.0  # a refresh starts only after 3 times the last one's duration: at most a quarter of the time
SETTLE_S = 20.0  # how long a stopping serve waits for a refresh in flight: within Kubernetes' 30 s grace period


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)


ALL_TIME = {"since": datetime(1970, 1, 1), "until": datetime(2262, 1, 1)}  # cumulative families: the whole store
# The parts of a refresh, each left out alone where it fails; and the families the cap applies to.
PARTS = ("requests", "tokens", "gauges", "counters", "histograms", "incidents", "ingest", "remediation")
CAPPED = (metric_names.REQUEST_DURATION, *(f.name for f in (*metric_names.TOKEN_FAMILIES, *metric_names.GAUGES,
                                                            *metric_names.COUNTERS, *metric_names.SIGNAL_HISTOGRAMS)),
          metric_names.INCIDENT_CAUSE_SCORE)


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
        # The token families' bounds, each as its `le` labels and as its queries compare them with times
        self.token_les = {f.sli: [metric_names.le_label(b) for b in metric_names.buckets_for(spec, f.sli)]
                          for f in metric_names.TOKEN_FAMILIES}
        self.token_bounds_ms = {f.sli: bounds_ms(spec, f.sli) for f in metric_names.TOKEN_FAMILIES}
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
            for part, build in zip(PARTS, (self._requests, self._tokens, self._gauges, self._counters,
                                           self._signal_histograms, self._incident_family, self._ingest,
                                           self._remediation)):
                try:
                    families = list(build(reader))
                except Exception:
                    log.warning("/metrics: the %s part of the refresh failed; left out", part, exc_info=True)
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

    def _requests(self, reader):
        # The queries keep the first max_series label sets in order, so that the kept set does not flap.
        rows = reader.rows(reader.sql("request_totals"), {**reader.tier_params(self.spec), "bounds_ms": self.bounds_ms,
                                                          "max_series": self.max_series, **ALL_TIME})
        per_labels: dict[tuple, list] = {}
        for tier, service, node, bucket, n, seconds, failed, _ in rows:
            per_labels.setdefault((tier, service, node), []).append((bucket, n, seconds, failed))
        if rows:
            self._drop(metric_names.REQUEST_DURATION, rows[0][-1] - len(per_labels))
        # What retention deleted is added to the label sets the store still holds requests of: one whose requests
        # are all gone is no longer exported, as a series that ends (no reset) and leaves room under max_series.
        exported = {"tiers": [k[0] for k in per_labels], "services": [k[1] for k in per_labels],
                    "nodes": [k[2] for k in per_labels]}
        retired: dict[tuple, list] = {}
        for tier, service, node, *counts in reader.rows(reader.sql("retired_request_totals"), exported):
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
            hist.add_metric(list(labels), buckets=[*zip(les, _cumulative(self.bounds_ms, buckets, gone)), ("+Inf", n)],
                            sum_value=seconds + sum(b[2] for b in buckets))
            reqs.add_metric(list(labels), n)
            errs.add_metric(list(labels), failed + sum(b[3] for b in buckets))
        return [hist, reqs, errs]

    def _tokens(self, reader):
        """The token families, each of the label sets whose requests give its time, as _requests' (the same cap,
        and what retention deleted added); a family without any is left out."""
        params = {f"{sli}_bounds_ms": bounds for sli, bounds in self.token_bounds_ms.items()}
        rows = reader.rows(reader.sql("token_totals"), {**reader.tier_params(self.spec), **params,
                                                        "max_series": self.max_series, **ALL_TIME})
        per_labels: dict[tuple, list] = {}
        stored: dict[str, int] = {}
        for measure, tier, service, node, bucket, n, seconds, label_sets in rows:
            per_labels.setdefault((measure, tier, service, node), []).append((bucket, n, seconds))
            stored[measure] = label_sets
        kept = Counter(labels[0] for labels in per_labels)
        for measure, label_sets in stored.items():
            self._drop(metric_names.TOKEN_FAMILY[measure].name, label_sets - kept[measure])
        exported = {key: [labels[i] for labels in per_labels]
                    for i, key in enumerate(("measures", "tiers", "services", "nodes"))}
        retired: dict[tuple, list] = {}
        for measure, tier, service, node, *counts in reader.rows(reader.sql("retired_token_totals"), exported):
            retired.setdefault((measure, tier, service, node), []).append(counts)
        families = {}
        for (measure, *labels), buckets in sorted(per_labels.items()):
            family = metric_names.TOKEN_FAMILY[measure]
            if measure not in families:
                families[measure] = HistogramMetricFamily(
                    family.name, f"{family.what.capitalize()} of the requests (SERVER spans) ingested into the store "
                    "that give it, by SLO tier, service and node; cumulative over the store.",
                    labels=metric_names.REQUEST_LABELS)
            gone = retired.get((measure, *labels), [])
            n, seconds = _retired_at(gone, math.inf, (0, 0.0))
            cumulative = _cumulative(self.token_bounds_ms[measure], buckets, gone)
            families[measure].add_metric(labels, buckets=[*zip(self.token_les[measure], cumulative),
                                                          ("+Inf", n + sum(b[1] for b in buckets))],
                                         sum_value=seconds + sum(b[2] for b in buckets))
        return list(families.values())

    def _series(self, reader, query: str, families, since: datetime | None = None):
        """Rows (family, labels, rest...) of `query` for the families' signals, each series' labels taken from
        its node and attributes. The query leaves out a series with an attribute its family excludes, and fetches
        the first max_series series of each family with the number there are: those past it are dropped."""
        by_signal = {f.signal: f for f in families}
        params = {"metrics": list(by_signal), "excluded": [list(f.exclude_if) for f in by_signal.values()],
                  "max_series": self.max_series, **ALL_TIME, **({"since": since} if since else {})}
        picked, stored, kept = [], {}, Counter()
        for metric, node, attributes, *rest, series in reader.rows(reader.sql(query), params):
            family = by_signal[metric]
            stored[family.name] = series
            kept[family.name] += 1
            picked.append((family, _labels(family, node, attributes), *rest))
        for name, series in stored.items():
            self._drop(name, series - kept[name])
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
            for alert, action, target, decision, n in reader.rows(reader.sql("remediation_decisions"),
                                                                  {"max_series": self.max_series}):
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
        d = CounterMetricFamily(metric_names.SERIES_DROPPED, "Label sets left out of /metrics because their family "
                                "reached its cap, summed over refreshes.", labels=["family"])
        for family in CAPPED:
            d.add_metric([family], dropped.get(family, 0))
        e = CounterMetricFamily(metric_names.EXPORTER_ERRORS, "Parts of refreshes of /metrics that failed and were "
                                "left out (see the log).", labels=["part"])
        for part in PARTS:
            e.add_metric([part], errors.get(part, 0))
        return [d, e]


class Exposition:
    """The text of a collector's last refresh, refreshed by the scrapes that find it due (see the module's
    docstring): a scrape costs what it sends, and the refreshes at most a 1 / (1 + idle_ratio) share of the time."""

    def __init__(self, collector: Collector, wait_s: float = WAIT_S, idle_ratio: float = IDLE_RATIO,
                 clock: Callable[[], float] = time.monotonic):
        self.collector, self.wait_s, self.idle_ratio, self.clock = collector, wait_s, idle_ratio, clock
        self._body: bytes | None = None
        self._failure: Exception | None = None  # why the last refresh failed, raised while there is no text
        self._took, self._ended, self._refreshing = 0.0, -math.inf, False
        self._changed = threading.Condition()  # a refresh ended

    def body(self) -> bytes:
        """The text of the newest refresh; the first scrape waits for it (a failed one raises its error). A
        refresh always runs in a thread of its own, so that one slower than the last cannot hold a scrape past
        wait_s."""
        with self._changed:
            slow = self._body is not None and self._took > self.wait_s
            start = not self._refreshing and self.clock() - self._ended >= self.idle_ratio * self._took
            self._refreshing = self._refreshing or start
        if start:
            threading.Thread(target=self._refresh, name="metrics-refresh", daemon=True).start()
        with self._changed:
            if not slow:
                self._changed.wait_for(lambda: not self._refreshing, None if self._body is None else self.wait_s)
            if self._body is None:
                raise self._failure
            return self._body

    def settle(self, timeout_s: float) -> bool:
        """Whether no refresh is in flight, having waited up to `timeout_s` for one to end."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._refreshing, timeout_s)

    def _refresh(self) -> None:
        started, body, failure = self.clock(), None, None
        try:
            body = exposition.render(self.collector)
        except Exception as exc:  # the store's reader could not be had: the last good text stays served
            log.warning("/metrics: the refresh failed; the last one is served", exc_info=True)
            failure = exc
        with self._changed:
            self._body, self._failure = body or self._body, failure
            self._took, self._ended, self._refreshing = self.clock() - started, self.clock(), False
            self._changed.notify_all()


_expositions: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_expositions_lock = threading.Lock()


def render(store, spec=None, intake: Collector | None = None, **options) -> tuple[bytes, str]:
    """The /metrics response for `store` (analytics/store_api.py): (body, content type). The exposition (its
    collector's options, its incident cache) is kept per store, so repeated scrapes reuse it. `intake` adds the
    families of the process's own intake (alerts.intake_metrics), which are not in the store, rendered at each
    scrape."""
    with _expositions_lock:
        kept = _expositions.get(store)
        if kept is None:
            kept = _expositions[store] = Exposition(StoreCollector(store.reading, spec, **options))
    return kept.body() + (exposition.render(intake) if intake else b""), exposition.CONTENT_TYPE


def settle(store, timeout_s: float = SETTLE_S) -> bool:
    """Whether no refresh of `store`'s /metrics runs, having waited up to `timeout_s` for one: serve closes the
    store only then, never under a refresh's queries (it calls this once its listeners are closed)."""
    with _expositions_lock:
        kept = _expositions.get(store)
    return kept is None or kept.settle(timeout_s)


def _labels(family, node: str, attributes: str) -> tuple:
    """A series' label values for its family: its node, and the attributes the family's labels name."""
    try:
        attrs = json.loads(attributes)
    except ValueError:
        attrs = {}
    if not isinstance(attrs, dict):
        attrs = {}
    return tuple(node if attr == "node" else str(attrs.get(attr, "")) for _, attr in family.labels)


def _retired_at(retired: list, bound_ms: float, zero: tuple = (0, 0.0, 0)) -> tuple:
    """(requests, seconds, failed) that retention deleted at or under `bound_ms`, of one label set's
    retired_request_totals rows [(bound_ms, requests, seconds, failed)]: those of the highest bound under it,
    as the retirement counts a bound it has no row for yet (analytics/sql/retire_requests.sql). Of
    retired_token_totals rows [(bound_ms, requests, seconds)], with `zero` (0, 0.0): (requests, seconds)."""
    under = [counts for bound, *counts in retired if bound <= bound_ms]
    return tuple(max(c[i] for c in under) for i in range(len(zero))) if under else zero


def _cumulative(bounds_ms: list[float], buckets: list, retired: list) -> list[int]:
    """A histogram's cumulative count at each bound of one label set: its stored requests at or under the bound
    ([(bucket, requests, ...)], a bucket being the number of bounds below the time), and those retention
    deleted there (`retired`, as _retired_at reads it)."""
    return [sum(b[1] for b in buckets if b[0] <= i) + _retired_at(retired, bound, (0,))[0]
            for i, bound in enumerate(bounds_ms)]

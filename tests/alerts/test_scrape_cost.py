"""/metrics' cost follows what it exports, not what the store holds: every query fetches at most the cap of each
family, and a scrape serves the text of the last refresh, which starts only at a bounded share of the time."""

import threading
from contextlib import contextmanager

import pytest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from sloscope import metric_names
from sloscope.alerts.store_metrics import Exposition, StoreCollector
from sloscope.analytics.store import Store
from sloscope.analytics.stores import open_store
from sloscope.commands.cli import main
from tests.alerts.test_store_metrics import SPEC, T0, T0_S, S, ingest, scrape, sid, tid
from tests.otlp_builders import counter, exp_histogram, gauge, metrics, span, traces, write_lines

CAP = 10
# One family of each kind, each given one label set per index by _lines.
FAMILIES = (metric_names.REQUEST_DURATION, metric_names.GPU_UTILIZATION, metric_names.TCP_RETRANSMITS,
            metric_names.SYSCALL_DURATION)


def _lines(indexes, round_=0):
    """Per index: a request of its own service, and a node of its own with a GPU (and a per-process series of it,
    which is no label set), a counter and a histogram; `round_` gives the requests new ids and the points later
    times, so that a later round adds to the label sets of an earlier one."""
    lines = []
    for i in indexes:
        key = round_ * 100_000 + i + 1
        lines.append(traces([span(tid(key), sid(key), T0 + round_ * S, 100 + i, tier="standard",
                                  status=503 if i % 3 == 0 else 200)], service=f"svc-{i:04d}", node="node-a"))
        at = T0 + round_ * S
        lines.append(metrics([
            gauge("hw.gpu.utilization", [(at, 0.5)], {"hw.id": f"GPU-{i:04d}"}),
            gauge("hw.gpu.utilization", [(at, 0.9)], {"hw.id": f"GPU-{i:04d}", "process.pid": 7}),
            counter("sloscope.tcp.retransmits", T0 - S, [(at, 10 * (round_ + 1))]),
            exp_histogram("sloscope.syscall.duration", T0 - S, [(at, 3 * (round_ + 1), 3e-4 * (round_ + 1), -15,
                                                                 [round_ + 1, 2 * (round_ + 1)])],
                          attrs={"syscall.name": "read"}),
        ], node=f"node-{i:04d}"))
    return lines


def _collector(reading, **kw):
    return StoreCollector(reading, SPEC, clock=lambda: T0_S + 60, **kw)


def _label_sets(families, family: str) -> set:
    """The label sets of a family's samples, without a histogram's `le`."""
    name = family.removesuffix("_total")
    return {tuple(kv for kv in labels if kv[0] != "le") for _, labels in families.get(name, {})}


def _dropped(families, family: str) -> float:
    return families["sloscope_exporter_series_dropped"][(metric_names.SERIES_DROPPED, (("family", family),))]


CAPPED_QUERIES = ("request_totals", "retired_request_totals", "latest_gauges", "counter_totals",
                  "signal_histogram_totals")


@contextmanager
def _fetching(store, fetched: list):
    """store.reading, the rows of each query of the capped families also appended to `fetched` as (name, rows)."""
    with store.reading() as reader:
        query, names = reader.rows, {reader.sql(name): name for name in CAPPED_QUERIES}

        def rows(sql, params=None):
            found = query(sql, params)
            if sql in names:
                fetched.append((names[sql], found))
            return found
        reader.rows = rows
        yield reader


def test_past_the_cap_a_refresh_fetches_and_exports_the_first_label_sets_and_counts_the_rest(tmp_path):
    fetched = []
    with Store(tmp_path / "db.duckdb") as store:
        ingest(store, tmp_path, _lines(range(40)))
        collector = _collector(lambda: _fetching(store, fetched), max_series=CAP)
        first = scrape(collector)
        ingest(store, tmp_path, _lines(range(40, 100)), name="more.jsonl")
        fetched.clear()
        second = scrape(collector)
    for family in FAMILIES:
        assert len(_label_sets(first, family)) == len(_label_sets(second, family)) == CAP, family
        assert _dropped(first, family) == 40 - CAP
        assert _dropped(second, family) == (40 - CAP) + (100 - CAP), family  # summed over refreshes
    services = {dict(labels)["service"] for labels in _label_sets(second, metric_names.REQUEST_DURATION)}
    assert services == {f"svc-{i:04d}" for i in range(CAP)}  # the first in order: the kept set does not flap
    # what crossed from the store is within the cap too: a label set per row, or one per bucket of a label set
    assert {name for name, _ in fetched} == set(CAPPED_QUERIES)
    for name, rows in fetched:
        assert len({row[:3] for row in rows}) <= CAP, name
    assert max(len(rows) for _, rows in fetched) <= CAP * (len(metric_names.buckets_for(SPEC)) + 1)


def test_under_the_cap_the_totals_are_the_whole_store_s(tmp_path):
    with Store(tmp_path / "db.duckdb") as store:
        for round_ in range(2):
            ingest(store, tmp_path, _lines(range(30), round_), name=f"in{round_}.jsonl")
        families = scrape(_collector(store.reading))
        requests = store.rows("SELECT service, count(*), sum(duration_ms) / 1000, count(*) FILTER (WHERE failed) "
                              "FROM requests GROUP BY ALL")
        counters = store.rows("SELECT node, sum(value) FROM samples WHERE metric = 'sloscope.tcp.retransmits' "
                              "GROUP BY ALL")
        histograms = store.rows("SELECT node, sum(count), sum(sum) FROM histograms "
                                "WHERE metric = 'sloscope.syscall.duration' GROUP BY ALL")
    assert len(requests) == len(counters) == len(histograms) == 30
    hist = metric_names.REQUEST_DURATION
    for service, n, seconds, failed in requests:
        labels = (("node", "node-a"), ("service", service), ("tier", "standard"))
        assert families["sloscope_requests"][(metric_names.REQUESTS, labels)] == n == 2
        assert families["sloscope_request_errors"][(metric_names.REQUEST_ERRORS, labels)] == failed
        assert families[hist][(hist + "_sum", labels)] == pytest.approx(seconds)
    for node, total in counters:
        tcp = metric_names.TCP_RETRANSMITS
        assert families[tcp.removesuffix("_total")][(tcp, (("node", node),))] == total == 20
    syscalls = metric_names.SYSCALL_DURATION
    for node, count, total in histograms:
        labels = (("node", node), ("syscall", "read"))
        assert families[syscalls][(syscalls + "_count", labels)] == count == 6
        assert families[syscalls][(syscalls + "_sum", labels)] == pytest.approx(total)
    assert all(_dropped(families, family) == 0 for family in FAMILIES)


def _counters(body: bytes) -> dict:
    """Every sample of the counter and histogram families of a text: (name, labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body.decode()) if f.type in ("counter", "histogram")
            for s in f.samples}


def test_counters_never_go_down_across_refreshes_with_ingest_between_and_a_restart(tmp_path):
    db, texts = tmp_path / "db.duckdb", []
    with Store(db) as store:
        exposition = Exposition(_collector(store.reading, max_series=CAP), idle_ratio=0)  # every scrape refreshes
        for round_ in range(4):
            ingest(store, tmp_path, _lines(range(5 * round_ + 8), round_), name=f"in{round_}.jsonl")
            texts.append(exposition.body())
    with Store(db) as store:  # serve started again on the same store
        texts.append(Exposition(_collector(store.reading, max_series=CAP)).body())
    seen = [_counters(text) for text in texts]
    for before, after in zip(seen, seen[1:]):
        restarted = after is seen[-1]  # this process's own counters may start again, as on any restart
        for key, value in before.items():
            if key in after and not (restarted and key[0].startswith("sloscope_exporter_")):
                assert after[key] >= value, key
    first = (metric_names.REQUESTS, (("node", "node-a"), ("service", "svc-0000"), ("tier", "standard")))
    assert [s[first] for s in seen] == [1, 2, 3, 4, 4]
    assert seen[-2][(metric_names.SERIES_DROPPED, (("family", metric_names.REQUEST_DURATION),))] > 0


class _Refreshes(Collector):
    """A counter of its own collections; each takes `took` seconds of `clock`, and waits for `gate` where set."""

    def __init__(self, clock: list, took: float):
        self.clock, self.took, self.count, self.gate, self.fail = clock, took, 0, None, False

    def collect(self):
        if self.gate:
            assert self.gate.wait(10)
        if self.fail:
            raise OSError("the store is gone")
        self.count += 1
        self.clock[0] += self.took
        yield CounterMetricFamily("refreshes", "Collections.", value=self.count)


def _served(exposition) -> float:
    return _counters(exposition.body())[("refreshes_total", ())]


def _wait_for_refresh():
    for thread in threading.enumerate():
        if thread.name == "metrics-refresh":
            thread.join(10)


def test_a_slow_refresh_runs_behind_scrapes_that_serve_the_last_text_at_a_bounded_share_of_the_time():
    clock = [0.0]
    collector = _Refreshes(clock, took=4.0)
    exposition = Exposition(collector, wait_s=1.0, idle_ratio=3.0, clock=lambda: clock[0])
    assert _served(exposition) == 1  # the first scrape waits: there is nothing else to serve
    clock[0] += 11.0  # not yet 3 times the refresh's 4 s since it ended: the store is not read
    assert [_served(exposition) for _ in range(3)] == [1, 1, 1] and collector.count == 1
    clock[0] += 1.0
    collector.gate = threading.Event()
    assert _served(exposition) == 1  # answered at once, the refresh it started held at the gate
    collector.gate.set()
    _wait_for_refresh()
    assert collector.count == 2 and _served(exposition) == 2


def test_a_cheap_refresh_is_waited_for_so_that_a_small_store_s_scrape_is_current():
    clock = [0.0]
    collector = _Refreshes(clock, took=0.01)
    exposition = Exposition(collector, clock=lambda: clock[0])
    assert _served(exposition) == 1
    clock[0] += 0.1
    assert _served(exposition) == 2 and collector.count == 2


def test_a_failed_refresh_keeps_the_last_text_and_a_first_one_raises():
    clock = [0.0]
    collector = _Refreshes(clock, took=0.01)
    collector.fail = True
    with pytest.raises(OSError, match="the store is gone"):
        Exposition(collector, clock=lambda: clock[0]).body()
    collector.fail = False
    exposition = Exposition(collector, clock=lambda: clock[0])
    assert _served(exposition) == 1
    collector.fail = True
    clock[0] += 1.0
    assert _served(exposition) == 1


def test_the_cap_on_clickhouse_keeps_and_counts_what_it_does_on_duckdb(tmp_path):
    pytest.importorskip("chdb")
    path = write_lines(tmp_path / "in.jsonl", _lines(range(25)))
    scraped = {}
    for name, url in (("duckdb", f"duckdb:///{tmp_path}/db.duckdb"), ("chdb", f"chdb:///{tmp_path}/ch")):
        assert main(["ingest", "--store", url, str(path)]) == 0
        with open_store(url) as store:
            scraped[name] = scrape(_collector(store.reading, max_series=CAP))
    for family in FAMILIES:
        name = family.removesuffix("_total")
        assert scraped["chdb"][name] == pytest.approx(scraped["duckdb"][name]), family
        assert len(_label_sets(scraped["duckdb"], family)) == CAP
        assert _dropped(scraped["chdb"], family) == _dropped(scraped["duckdb"], family) == 25 - CAP

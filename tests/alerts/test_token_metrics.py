"""The token families of /metrics (TTFT, TPOT, queue time): histograms per tier, service and node over the requests
that give each time, with every tier's threshold for it a bucket bound, capped as the request families are, the
same on DuckDB and chDB, and monotonic across retention."""

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from sloscope import metric_names
from sloscope.alerts.store_metrics import StoreCollector
from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.retention import apply_retention
from sloscope.analytics.stores import open_store
from sloscope.enrich.tiers import TierResolver
from sloscope.slo_spec import TOKEN_SLIS, parse_spec
from tests.alerts.test_store_metrics import T0, S, scrape, sid, tid, value
from tests.otlp_builders import span, traces, write_lines

SPEC_TEXT = """\
default_tier: standard
tiers:
  chat:
    latency: {percentile: 99, threshold_ms: 120000}
    availability: 99.9
    ttft: {percentile: 99, threshold_ms: 400}
    tpot: {percentile: 95, threshold_ms: 40}
    queue: {percentile: 99, threshold_ms: 300}
  standard:
    latency: {percentile: 95, threshold_ms: 200}
    availability: 99.5
    ttft: {percentile: 90, threshold_ms: 1500}
"""
SPEC = parse_spec(SPEC_TEXT)
TTFT, TPOT, QUEUE = (metric_names.TOKEN_FAMILY[sli].name for sli in TOKEN_SLIS)
CHAT = {"tier": "chat", "service": "vllm", "node": "n1"}
STANDARD = {"tier": "standard", "service": "tgi", "node": "n2"}


def _attrs(ttft=None, output=None, queue=None) -> dict:
    named = {"gen_ai.latency.time_to_first_token": ttft, "gen_ai.usage.completion_tokens": output,
             "gen_ai.latency.time_in_queue": queue}
    return {k: v for k, v in named.items() if v is not None}


def _lines(start_ns: int, first_id: int = 1) -> list[dict]:
    """Four chat requests of a second each: TTFT 0.1, 0.3 and 0.5 s; TPOT (the rest over the tokens after the first)
    90, 700 and 25 ms; queue 10 and 200 ms; the fourth gives none. One standard request with only a TTFT of 1.2 s."""
    chat = [(0.1, 11, 0.01), (0.3, 2, None), (0.5, 21, 0.2), (None, None, None)]
    spans = [span(tid(first_id + i), sid(first_id + i), start_ns + i * S, 1000, tier="chat", extra=_attrs(*timings))
             for i, timings in enumerate(chat)]
    other = span(tid(first_id + 10), sid(first_id + 10), start_ns, 1500, tier="standard", extra=_attrs(1.2))
    return [traces(spans, service="vllm", node="n1"), traces([other], service="tgi", node="n2")]


def _ingest(store, path: Path, lines: list[dict]) -> None:
    report = Ingestor(store, TierResolver.from_spec(SPEC), jobs=1).ingest_files([write_lines(path, lines)])
    assert report.rejected_count == 0, report.rejected


def _collector(store, **kw):
    return StoreCollector(store.reading, SPEC, clock=lambda: T0 / 1e9 + 60, **kw)


def _bucket(families, family: str, le: str, labels: dict) -> float:
    return value(families, family, family + "_bucket", **labels, le=le)


def _token_samples(families) -> dict:
    return {k: v for name in (TTFT, TPOT, QUEUE) for k, v in families.get(name, {}).items()}


@pytest.fixture(params=["duckdb", "chdb"])
def url(request, tmp_path):
    if request.param == "chdb":
        pytest.importorskip("chdb")
        return f"chdb:///{tmp_path}/ch"
    return f"duckdb:///{tmp_path}/db.duckdb"


def test_token_histograms_count_the_requests_that_give_each_time(url, tmp_path):
    with open_store(url) as store:
        _ingest(store, tmp_path / "in.jsonl", _lines(T0))
        f = scrape(_collector(store))
    assert [_bucket(f, TTFT, le, CHAT) for le in ("0.1", "0.25", "0.4", "0.5", "+Inf")] == [1, 1, 2, 3, 3]
    assert value(f, TTFT, TTFT + "_count", **CHAT) == 3  # the fourth request gives no TTFT
    assert value(f, TTFT, TTFT + "_sum", **CHAT) == pytest.approx(0.9)
    assert [_bucket(f, TTFT, le, STANDARD) for le in ("1.0", "1.5", "+Inf")] == [0, 1, 1]
    assert [_bucket(f, TPOT, le, CHAT) for le in ("0.025", "0.04", "0.05", "0.1", "0.5", "1.0")] == [1, 1, 1, 2, 2, 3]
    assert value(f, TPOT, TPOT + "_sum", **CHAT) == pytest.approx(0.815)
    assert [_bucket(f, QUEUE, le, CHAT) for le in ("0.01", "0.25", "0.3", "+Inf")] == [1, 2, 2, 2]
    assert value(f, QUEUE, QUEUE + "_sum", **CHAT) == pytest.approx(0.21)
    # only the label sets whose requests give the time: the standard request gives no TPOT and no queue time
    assert {dict(k[1])["tier"] for k in f[TPOT]} == {dict(k[1])["tier"] for k in f[QUEUE]} == {"chat"}
    # each family's bounds: every tier's threshold for its time, exactly as the rules select it, and no other's
    les = {name: {dict(k[1])["le"] for k in f[name] if k[0] == name + "_bucket"} for name in (TTFT, TPOT, QUEUE)}
    assert {"0.4", "1.5"} <= les[TTFT] and "0.04" not in les[TTFT] and "0.3" not in les[TTFT]
    assert "0.04" in les[TPOT] and "0.4" not in les[TPOT] and "0.3" in les[QUEUE]
    for sli, name in zip(TOKEN_SLIS, (TTFT, TPOT, QUEUE)):
        assert les[name] == {metric_names.le_label(b) for b in metric_names.buckets_for(SPEC, sli)} | {"+Inf"}
    duration = {dict(k[1])["le"] for k in f[metric_names.REQUEST_DURATION]
                if k[0] == metric_names.REQUEST_DURATION + "_bucket"}
    assert "0.4" not in duration and "1.5" not in duration  # the request families keep their bounds


def test_the_token_families_appear_only_with_data_and_keep_the_cap(url, tmp_path):
    with open_store(url) as store:
        _ingest(store, tmp_path / "plain.jsonl", [traces([span(tid(1), sid(1), T0, 100, tier="chat")])])
        f = scrape(_collector(store))
        assert not {TTFT, TPOT, QUEUE} & set(f) and metric_names.REQUEST_DURATION in f
        _ingest(store, tmp_path / "in.jsonl", _lines(T0, first_id=100))
        f = scrape(_collector(store, max_series=1))
    assert {dict(k[1])["tier"] for k in f[TTFT]} == {"chat"}  # the first label set in order
    dropped = "sloscope_exporter_series_dropped"
    assert value(f, dropped, metric_names.SERIES_DROPPED, family=TTFT) == 1
    assert value(f, dropped, metric_names.SERIES_DROPPED, family=TPOT) == 0
    assert value(f, "sloscope_exporter_errors", metric_names.EXPORTER_ERRORS, part="tokens") == 0


def test_the_token_counters_never_go_down_across_retention(tmp_path):
    now = time.time_ns() // S * S
    old, recent = now - 8 * 86_400 * S, now - 86_400 * S
    with open_store(f"duckdb:///{tmp_path}/db.duckdb") as store:
        store.set_meta("slo_spec", SPEC_TEXT)  # retention counts by the bounds of the store's spec
        _ingest(store, tmp_path / "in.jsonl", _lines(old) + _lines(recent, first_id=100))
        before = _token_samples(scrape(_collector(store)))
        apply_retention(store, timedelta(days=7), datetime.now(timezone.utc).replace(tzinfo=None))
        assert store.scalar("SELECT count(*) FROM requests") == 5  # the old ones are gone
        assert store.scalar("SELECT count(DISTINCT measure) FROM retired_token_requests") == 3
        after = _token_samples(scrape(_collector(store)))
        _ingest(store, tmp_path / "more.jsonl", _lines(now, first_id=200))
        apply_retention(store, timedelta(days=7), datetime.now(timezone.utc).replace(tzinfo=None))  # none to delete
        later = _token_samples(scrape(_collector(store)))
    assert after.keys() == before.keys() and after == pytest.approx(before)
    assert later.keys() == before.keys()
    for key, counted in before.items():
        assert later[key] == pytest.approx(counted * 1.5), key  # a third round of the same requests
    assert value({TTFT: later}, TTFT, TTFT + "_count", **CHAT) == 9

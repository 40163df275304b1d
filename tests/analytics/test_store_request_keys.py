"""A request is stored once per (trace id, span id), however the writer's batch repeats it: a retried export can
land in the same batch as its first attempt. Two spans that share only a span id are two requests."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl

from sloscope.analytics.frames import SPAN_COLUMNS, SPAN_SCHEMA, Frames
from sloscope.records import SPAN_KIND_SERVER

from sloscope.analytics.store import Store

T0 = datetime(2026, 12, 1, 10, 0)


def _frames(ids: list[tuple[int, int, int]]) -> Frames:
    rows = [{"trace_hi": hi, "trace_lo": lo, "span_id": span, "start_time": T0 + timedelta(seconds=k),
             "duration_ms": 5.0, "service": "svc", "node": "n1", "tier": "standard", "failed": False,
             "kind": SPAN_KIND_SERVER}
            for k, (hi, lo, span) in enumerate(ids)]
    schema = {**SPAN_SCHEMA, "start_time": pl.Datetime("us"), "duration_ms": pl.Float64}
    requests = pl.DataFrame(rows, schema={name: schema[name] for name in SPAN_COLUMNS})
    empty = Frames.concat([])
    return Frames(requests, empty.points, empty.histograms)


def _stored(store: Store) -> list[tuple]:
    return store.rows("SELECT trace_hi, trace_lo, span_id FROM requests ORDER BY ALL")


def test_a_request_repeated_within_a_batch_is_stored_once(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        counts = store.write(Frames.concat([_frames([(1, 2, 3), (4, 5, 6)]), _frames([(1, 2, 3)])]))
        assert _stored(store) == [(1, 2, 3), (4, 5, 6)]
        assert (counts["requests_loaded"], counts["requests_duplicate"]) == (2, 1)


def test_spans_sharing_only_a_span_id_are_two_requests(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        counts = store.write(_frames([(1, 2, 7), (1, 3, 7), (9, 2, 7)]))
        assert _stored(store) == [(1, 2, 7), (1, 3, 7), (9, 2, 7)]
        assert counts["requests_loaded"] == 3 and not counts["requests_duplicate"]


def test_a_batch_without_repeats_is_stored_whole_and_a_second_write_adds_nothing(tmp_path):
    ids = [(k, k + 1, k + 2) for k in range(0, 3000, 3)]
    batch = Frames.concat([_frames(ids[k:k + 100]) for k in range(0, len(ids), 100)])  # many chunks, as the writer's
    with Store(tmp_path / "s.duckdb") as store:
        assert store.write(batch)["requests_loaded"] == len(ids)
        again = store.write(batch)
        assert (again["requests_loaded"], again["requests_duplicate"]) == (0, len(ids))
        assert _stored(store) == sorted(ids)

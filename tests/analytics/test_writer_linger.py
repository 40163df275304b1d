"""The writer's linger: where nobody waits for the commit, it gathers requests into fuller transactions, but
commits a lone request within the linger, a full batch at once, and everything at once when stopping."""

from __future__ import annotations

import time

import duckdb
import pytest

from sloscope.analytics.store import Store
from sloscope.analytics.writer import RETRY, Writer
from tests.analytics.test_durability import SPANS_PER_REQUEST, _spans


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "w.duckdb") as store:
        yield store


def _committed(store) -> int:
    with store.reading() as reader:
        return reader.scalar("SELECT count(*) FROM requests")


def _settle(pending, within_s: float) -> float:
    started = time.monotonic()
    assert pending.wait(within_s) is not None, f"not committed within {within_s} s"
    return time.monotonic() - started


def test_a_lone_request_is_committed_once_the_linger_is_over(store):
    writer = Writer(store, linger_s=0.6).start()
    try:
        pending = writer.offer(_spans(0), {})
        time.sleep(0.3)
        assert _committed(store) == 0  # still lingering: more may come
        assert 0.1 < _settle(pending, 5) < 2
        assert _committed(store) == SPANS_PER_REQUEST
    finally:
        writer.stop()


def test_requests_offered_while_it_lingers_share_one_commit(store):
    writer = Writer(store, linger_s=0.5).start()
    try:
        pendings = [writer.offer(_spans(seq), {}) for seq in range(5)]
        for pending in pendings:
            _settle(pending, 5)
        assert writer.stats()["commits"] == 1 and _committed(store) == 5 * SPANS_PER_REQUEST
    finally:
        writer.stop()


def test_a_full_batch_is_committed_without_waiting(store):
    writer = Writer(store, batch_rows=2 * SPANS_PER_REQUEST, linger_s=60).start()
    try:
        first, second = writer.offer(_spans(0), {}), writer.offer(_spans(1), {})
        assert _settle(first, 5) < 2 and second.wait(5) is not None
    finally:
        writer.stop()


def test_stopping_commits_what_lingers_at_once(store):
    writer = Writer(store, linger_s=60).start()
    pending = writer.offer(_spans(0), {})
    started = time.monotonic()
    writer.stop()
    assert time.monotonic() - started < 10 and pending.wait(0) is not None
    assert _committed(store) == SPANS_PER_REQUEST


def test_without_a_linger_each_request_is_committed_as_soon_as_it_is_queued(store):
    writer = Writer(store).start()
    try:
        assert _settle(writer.offer(_spans(0), {}), 5) < 1
    finally:
        writer.stop()


class DiskFullOnce(Store):
    """A store whose first write fails as a full disk makes DuckDB's fail."""

    failures = 1

    def write(self, frames, extra_counts=None):
        if self.failures:
            self.failures -= 1
            raise duckdb.IOException("Could not write file: No space left on device")
        return super().write(frames, extra_counts)


def test_while_the_store_is_failing_it_does_not_linger(tmp_path):
    with DiskFullOnce(tmp_path / "f.duckdb") as store:
        writer = Writer(store, linger_s=0.3).start()
        try:
            assert writer.offer(_spans(0), {}).wait(5).outcome == RETRY
            assert writer.failed is not None
            assert _settle(writer.offer(_spans(1), {}), 5) < 0.25  # at once: it tells whether writes work again
            assert writer.failed is None
        finally:
            writer.stop()

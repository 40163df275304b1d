"""When a store write fails, no other request loses its data and the writer is not wedged: a request the store
cannot take is refused alone (with --ack commit a 400; counted); when the store or the intake log itself fails
(a full disk) requests are told to retry (503), /readyz and /metrics say so, and intake recovers by itself once
there is space again."""

import http.client
import logging
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import duckdb
import polars as pl
import pytest

from sloscope.analytics.frames import Frames

from sloscope.analytics.store import Store
from sloscope.analytics.writer import COMMITTED, POISON, RETRY, Writer
from sloscope.receiver.otlp_common import DecodeError
from sloscope.enrich.tiers import TierResolver
from sloscope.enrich.topology import GpuTopology
from sloscope.records import Batch
from sloscope.analytics.intake import Intake
from sloscope.slo_spec import load_spec
from tests.conftest import need
from tests.alerting_stack import free_port, wait_listening
from tests.otlp_builders import TRACE_ID
from tests.analytics.test_durability import SLOSCOPE, Serve, _post, _spans, _traces

T0 = 1_764_410_400_000_000_000


def _histogram(node: str, buckets: list[int]) -> Frames:
    """One delta exponential-histogram point, as a decoder would hand it over."""
    row = {"node": node, "metric": "sloscope.syscall.duration", "attributes": "{}", "cumulative": False,
           "start_ns": T0 - 10**9, "time_ns": T0, "count": sum(buckets), "sum": 0.1, "min": None, "max": None,
           "buckets": buckets}
    frames = Frames.of(Batch())
    frames.histograms = pl.DataFrame([row], schema=frames.histograms.schema)
    return frames


def test_a_request_the_store_cannot_take_is_refused_alone(tmp_path):
    """A negative bucket count (as from an exp-histogram's "zeroCount": "-1" that decoding let through) fails
    the store's write of its whole group; the other requests of the group still commit."""
    with Store(tmp_path / "p.duckdb") as store:
        writer = Writer(store)
        good = [writer.offer(_histogram(f"node-{i}", [1, 2]), {"tier_invalid": 1}) for i in range(3)]
        poison = writer.offer(_histogram("node-bad", [-1, 2]), {"tier_invalid": 1})
        writer.start()  # all four are queued: they are written as one group
        assert [p.wait(10).outcome for p in good] == [COMMITTED] * 3
        assert poison.wait(10).outcome == POISON and "buckets" in poison.verdict.reason.lower()
        assert writer.health() is None and writer.stats()["rejected_requests"] == 1
        after = writer.offer(_histogram("node-after", [4]), {})
        assert after.wait(10).outcome == COMMITTED  # not wedged
        writer.stop()
        assert store.rows("SELECT node FROM histograms ORDER BY node") == [
            ("node-0",), ("node-1",), ("node-2",), ("node-after",)]
        counters = store.counters()
        assert counters["store_rejected_requests"] == 1 and counters["tier_invalid"] == 3


def test_intake_answers_a_poison_request_as_invalid(tmp_path):
    """The receiver answers DecodeError with 400 / INVALID_ARGUMENT: the client must not resend it."""
    with Store(tmp_path / "i.duckdb") as store:
        writer = Writer(store).start()
        intake = Intake(writer, TierResolver.from_spec(load_spec(None)), GpuTopology())
        with pytest.raises(DecodeError, match="cannot take"):
            intake.offer_frames(_histogram("node-bad", [-3, 5]), Counter())
        assert intake.offer_frames(_histogram("node-ok", [3]), Counter()).accepted
        writer.stop()


def test_a_writer_without_a_verdict_in_time_answers_retry(tmp_path):
    with Store(tmp_path / "t.duckdb") as store:
        writer = Writer(store)  # not started: nothing is committed
        intake = Intake(writer, TierResolver.from_spec(load_spec(None)), GpuTopology(), ack_wait_s=0.2)
        assert not intake.offer_frames(_histogram("node-1", [1]), Counter()).accepted
        queued = Intake(writer, intake.enrichment.resolver, intake.enrichment.topology, ack="queued")
        assert queued.offer_frames(_histogram("node-2", [1]), Counter()).accepted
        writer.start()
        writer.stop()
        assert len(store.rows("SELECT * FROM histograms")) == 2  # the retry-answered one landed meanwhile


# --- a real full disk -------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB ext4 filesystem on a loop device, without blocks reserved for root (serve runs as root)."""
    need(os.geteuid() == 0, "mounting a loop filesystem needs root")
    image, mount = tmp_path / "disk.img", tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["truncate", "-s", "48M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    yield mount
    # A store a failed test left open holds the mount busy: detach it lazily then, so the failure is the test's.
    if subprocess.run(["umount", str(mount)]).returncode:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


class Filler(threading.Thread):
    """Keeps a file growing into every block that frees up, so that the disk stays full until stopped (a write
    that failed gives its blocks back)."""

    def __init__(self, directory: Path):
        super().__init__(daemon=True)
        self.path, self.stopped, self.refused = directory / "filler", threading.Event(), threading.Event()

    def run(self) -> None:
        with self.path.open("wb", buffering=0) as f:
            while not self.stopped.is_set():
                try:
                    f.write(b"\0" * 2**16)
                except OSError:
                    self.refused.set()
                    self.stopped.wait(0.02)

    def full(self) -> bool:
        """Whether the file system has refused the filler a write."""
        return self.refused.is_set()

    def free(self) -> None:
        self.stopped.set()
        self.join(10)
        self.path.unlink()


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def _until(what, seconds: float = 30):
    deadline = time.monotonic() + seconds
    while not (result := what()):
        assert time.monotonic() < deadline, f"timed out waiting for {what.__name__}"
        time.sleep(0.2)
    return result


@pytest.mark.privileged
def test_the_writer_reopens_a_database_a_failed_checkpoint_invalidated(small_disk, caplog):
    """A checkpoint that fails on a full disk makes DuckDB invalidate the database (a fatal error); the writer's
    next write finds it so and reopens the connection once there is space, and nothing committed is lost. The
    commits go to the write-ahead log first, so that the checkpoint, not a log write, is what meets the full
    disk (which of the two fails first is otherwise a race)."""
    caplog.set_level(logging.INFO, "sloscope.writer")
    store = Store(small_disk / "c.duckdb")
    store.con.execute("SET checkpoint_threshold = '1GB'")
    writer, committed = Writer(store).start(), 20
    for seq in range(committed):
        assert writer.offer(_spans(seq), {}).wait(10).outcome == COMMITTED
    filler = Filler(small_disk)
    filler.start()
    _until(filler.full)
    with pytest.raises(duckdb.FatalException, match="checkpoint"):
        store.con.cursor().execute("CHECKPOINT")
    verdict = writer.offer(_spans(committed), {}).wait(10)
    assert verdict.outcome == RETRY and writer.health().startswith("store write failing")
    filler.free()
    assert _until(lambda: writer.offer(_spans(committed + 1), {}).wait(10).outcome == COMMITTED)
    writer.stop()
    store.close()
    with Store(store.path, read_only=True) as reopened:
        stored = reopened.scalar("SELECT count(DISTINCT trace_hi) FROM requests")
    assert stored >= committed + 1 and writer.health() == "stopping"
    assert f"reopened {store.path}" in caplog.text


@pytest.mark.privileged
def test_a_full_disk_answers_retry_and_recovers_with_the_collectors_replay(tmp_path, small_disk):
    serve = Serve(small_disk / "s.duckdb", free_port(), tmp_path / "serve.log")
    serve.start()
    spool = tmp_path / "spool"
    collect = subprocess.Popen(
        [SLOSCOPE, "collect", "--protocol", "http/protobuf", "--endpoint", f"http://127.0.0.1:{serve.port}/v1/metrics",
         "--interval", "1", "--probe", "pressure", "--probe", "vmstat", "--probe", "diskstats",
         "--spool-dir", str(spool)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    acked, seq = [], 0
    try:
        assert _post(serve.port, "/v1/traces", _traces(0, seq), "application/x-protobuf") == 200
        acked.append(seq)
        time.sleep(2)
        filler = Filler(small_disk)
        filler.start()
        full_since = time.time_ns()

        def refused_and_shown():
            """A request refused, and the failure on /readyz and /metrics: small writes that still fit in a
            block already allocated may succeed in between and make the writer healthy again."""
            nonlocal seq
            seq += 1
            status = _post(serve.port, "/v1/traces", _traces(0, seq), "application/x-protobuf")
            if status == 200:
                acked.append(seq)
                return False
            ready, why = _get(serve.port, "/readyz")
            failing = "intake log append failing" in why or "store write failing" in why
            return (status, ready) == (503, 503) and failing and (
                "sloscope_writer_healthy 0.0" in _get(serve.port, "/metrics")[1])

        _until(refused_and_shown)
        _until(lambda: list(spool.glob("*.pb")), 20)  # the collector keeps its batches meanwhile
        filler.free()
        free_since = time.time_ns()
        assert _until(lambda: _post(serve.port, "/v1/traces", _traces(0, seq), "application/x-protobuf") == 200)
        acked.append(seq)
        _until(lambda: _get(serve.port, "/readyz")[0] == 200, 10)  # the writer's next try, after its back-off
        _until(lambda: not list(spool.glob("*.pb")))  # replayed
        assert not (spool / "rejected").exists() or not list((spool / "rejected").iterdir())
    finally:
        collect.send_signal(signal.SIGTERM)
        collect.wait(timeout=60)
        assert serve.stop() == 0, serve.log.read_text()[-3000:]
    with Store(serve.db, read_only=True) as store:
        stored = {tid[:16] for (tid,) in store.rows(f"SELECT DISTINCT {TRACE_ID} FROM requests")}
        during_outage = store.scalar("SELECT count(*) FROM samples WHERE epoch_ns(ts) BETWEEN ? AND ?",
                                     [full_since, free_since])
        failures = store.counters()
    assert {f"{0:08x}{s:08x}" for s in acked} <= stored
    assert during_outage > 0, "the collector's batches from while the disk was full did not land"
    assert "store_rejected_requests" not in failures  # nothing was taken for bad data


def test_a_live_reader_outlives_the_writer_reopening_the_store(tmp_path):
    """serve's sampling page reads through one for its whole life; a reader taken at start-up would keep the
    connection that `reopen` closed."""
    with Store(tmp_path / "r.duckdb") as store:
        live, plain = store.live_reader(), store.reader()
        assert live.scalar("SELECT count(*) FROM requests") == 0
        store.reopen()
        with pytest.raises(duckdb.Error):
            plain.scalar("SELECT count(*) FROM requests")
        store.write(_spans(0))
        assert live.scalar("SELECT count(*) FROM requests") == 50


@pytest.mark.privileged
def test_sigterm_with_the_store_disk_full_ends_serve_at_once_and_loses_nothing(tmp_path, small_disk):
    """The store's disk is full and its intake log (on another file system) holds what was acknowledged: SIGTERM
    ends serve within seconds (each queued request used to wait for a failed write and a back-off, past any
    grace period), and the next start, with space again, writes every acknowledged request."""
    db, port = small_disk / "s.duckdb", free_port()
    Store(db).close()
    filler = Filler(small_disk)
    filler.start()
    command = [SLOSCOPE, "serve", "--db", str(db), "--http", f"127.0.0.1:{port}", "--grpc", "off",
               "--decode-workers", "0", "--intake-log", str(tmp_path / "intake")]
    with (tmp_path / "serve.log").open("a") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=out, start_new_session=True)
    try:
        wait_listening(port, proc, "sloscope serve")
        acked = [seq for seq in range(40) if _post(port, "/v1/traces", _traces(3, seq), "application/x-protobuf")
                 == 200]
        assert len(acked) >= 20, (tmp_path / "serve.log").read_text()[-2000:]
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert time.monotonic() - began < 10
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        filler.free()
    with (tmp_path / "serve.log").open("a") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=out, start_new_session=True)
    try:
        wait_listening(port, proc, "sloscope serve")
        _until(lambda: _get(port, "/readyz")[0] == 200, 60)  # the log replayed into the store
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (tmp_path / "serve.log").read_text()[-2000:]
    with Store(db, read_only=True) as store:
        stored = store.scalar(f"SELECT count(DISTINCT substr({TRACE_ID}, 9, 8)) FROM requests")
    assert stored == len(acked)

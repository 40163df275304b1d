"""The intake log: what is appended is fsynced before `offer` returns, replayed when serve starts again, deleted or
kept as a spare once committed; a torn record is cut off, a damaged one kept aside with what follows; a spare's
earlier records are never replayed; the bound counts uncommitted log bytes; a logged request the store refuses
goes to rejected/; a full disk refuses the append and leaves nothing of it."""

import os
import subprocess
import threading
import time

import pytest

from sloscope.analytics.intake_log import IntakeLog
from sloscope.analytics.intake_record import HEADER, HEADER_V5_BYTES, decode, encode, read_record
from sloscope.analytics.store import Store
from sloscope.analytics.writer import Writer
from tests.alerting_stack import free_port
from tests.otlp_builders import TRACE_ID
from tests.analytics.test_durability import SLOSCOPE, Serve, _post, _spans, _traces
from tests.analytics.test_store_failure import Filler, _get, _histogram, small_disk  # noqa: F401 (a fixture)


def _segments(directory):
    return sorted(p.name for p in directory.glob("*.log"))


def _joined(record, segment: int = 1) -> bytes:
    """A record's bytes as the log holds them in a segment (the first of a new log's, by default)."""
    return record.header(segment) + b"".join(record.pieces)


def _logged(directory, count: int, segment_bytes: int = 2**24) -> list[bytes]:
    """`count` span requests appended to a log in `directory` and left uncommitted (as by a crash)."""
    log = IntakeLog(directory, segment_bytes)
    records = [encode(_spans(seq), {"tier_invalid": 1}) for seq in range(count)]
    for record in records:
        log.append(record)
    log.close()  # the segments stay: nothing in them is committed
    return [_joined(record) for record in records]


def _wait_drained(writer: Writer) -> None:
    deadline = time.monotonic() + 30
    while not writer.drained():
        assert time.monotonic() < deadline, "the writer did not commit what it was given"
        time.sleep(0.05)


def test_a_record_reads_back_as_the_frames_and_counters_it_was_made_of():
    frames = _spans(3)
    payload, end = read_record(record := _joined(encode(frames, {"tier_invalid": 2, "zero": 0})), 0)
    again, counts = decode(payload)
    assert end == len(record) and counts == {"tier_invalid": 2}
    assert again.requests.equals(frames.requests) and again.requests.schema == frames.requests.schema
    assert again.histograms.schema == frames.histograms.schema


def test_a_records_frames_are_arrow_ipc_streams_any_arrow_reader_takes():
    """The log outlives the polars that wrote it: its frames must stay in the Arrow IPC stream format."""
    import pyarrow as pa

    from sloscope.analytics.intake_record import PARTS

    frames = _spans(4)
    payload, _ = read_record(_joined(encode(frames, {})), 0)
    spans = payload[PARTS.size:PARTS.size + PARTS.unpack_from(payload)[0]]
    table = pa.ipc.open_stream(spans).read_all()
    assert table.num_rows == frames.spans.height and table.column_names == frames.spans.columns


@pytest.mark.parametrize("version", [1, 2])
def test_a_record_of_an_earlier_version_still_reads_back(version):
    """Segments left by an earlier format are replayed after an upgrade: version 1 wrote Arrow IPC files, and
    both 1 and 2 held the ids as hex text."""
    import io
    import json
    import zlib

    import polars as pl

    from sloscope.analytics.intake_record import MAGIC, PARTS

    frames = _spans(2)
    requests = frames.requests
    as_written = requests.select(
        pl.format("{}{}", *(pl.col(c).map_elements(lambda w: f"{w:016x}", pl.String) for c in ("trace_hi", "trace_lo")))
        .alias("trace_id"), pl.col("span_id").map_elements(lambda w: f"{w:016x}", pl.String),
        pl.exclude("trace_hi", "trace_lo", "span_id"))
    buffer = io.BytesIO()
    as_written.write_ipc(buffer) if version == 1 else as_written.write_ipc_stream(buffer)
    parts = [buffer.getvalue(), b"", b"", json.dumps({"tier_invalid": 1}).encode()]
    payload = PARTS.pack(*map(len, parts)) + b"".join(parts)
    record = HEADER.pack(MAGIC, version, len(payload), zlib.crc32(payload)) + payload
    again, counts = decode(read_record(record, 0)[0])
    assert again.requests.equals(requests) and again.requests.schema == requests.schema
    assert counts == {"tier_invalid": 1}


def test_records_left_in_the_log_are_replayed_once_and_their_segments_deleted(tmp_path):
    _logged(tmp_path / "log", 6, segment_bytes=40_000)  # a few records per segment
    assert len(_segments(tmp_path / "log")) > 1
    with Store(tmp_path / "r.duckdb") as store:
        log = IntakeLog(tmp_path / "log")
        writer = Writer(store, intake_log=log)
        assert writer.replay() == 6 and writer.stats()["queued_requests"] == 6
        writer.start()
        _wait_drained(writer)
        assert _segments(tmp_path / "log") == []  # every record in them is committed
        assert store.scalar(f"SELECT count(DISTINCT substr({TRACE_ID}, 9, 8)) FROM requests") == 6
        assert store.counters()["tier_invalid"] == 6
        writer.stop()


def test_concurrent_appenders_share_fsyncs_and_every_record_is_kept(tmp_path):
    log, entries = IntakeLog(tmp_path / "log", segment_bytes=100_000), []
    record = encode(_spans(0), {})

    def append_many():
        for _ in range(25):
            entries.append(log.append(record))

    threads = [threading.Thread(target=append_many) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    recovered = IntakeLog(tmp_path / "log").recovered
    assert len(recovered) == len(entries) == 200
    assert all(payload == _joined(record)[HEADER_V5_BYTES:] for _, payload in recovered)


def test_an_append_after_close_is_refused_and_nothing_is_written(tmp_path):
    from sloscope.analytics.intake_log import LogAppendError

    log = IntakeLog(tmp_path / "log")
    log.close()
    with pytest.raises(LogAppendError, match="closed"):
        log.append(encode(_spans(0), {}))
    assert _segments(tmp_path / "log") == []


def _appended_and_recovered(directory, records, segment_bytes=2**24) -> list[bytes]:
    """The payloads a new log reads back from `records`, appended one round each and left uncommitted."""
    log = IntakeLog(directory, segment_bytes)
    for record in records:
        log.append(record)
    log.close()
    again = IntakeLog(directory)
    payloads = [payload for _, payload in again.recovered]
    again.close()
    return payloads


def test_records_larger_than_the_direct_write_buffer_go_out_in_several_writes(tmp_path, monkeypatch):
    import sloscope.analytics.intake_log as intake_log

    monkeypatch.setattr(intake_log, "DIRECT_BUFFER_BYTES", 2 * intake_log.BLOCK)
    records = [encode(_spans(seq), {"tier_invalid": seq}) for seq in range(4)]  # of lengths in no block multiple
    payloads = _appended_and_recovered(tmp_path / "log", records, segment_bytes=3 * len(records[0]))
    assert payloads == [_joined(r)[HEADER_V5_BYTES:] for r in records]


@pytest.mark.parametrize("refuses", ["open", "write"])
def test_a_file_system_without_o_direct_gets_the_same_log_through_the_page_cache(tmp_path, monkeypatch, refuses):
    """Some refuse O_DIRECT when the file is opened (tmpfs before Linux 6.6), others only at its writes."""
    import errno

    import sloscope.analytics.intake_log as intake_log

    def invalid(*_):
        raise OSError(errno.EINVAL, "Invalid argument")

    opened = os.open

    def refusing_direct(path, flags, *mode):
        if flags & os.O_DIRECT:  # as Linux does: the file is created before O_DIRECT is refused
            os.close(opened(path, flags & ~os.O_DIRECT, *mode))
            invalid()
        return opened(path, flags, *mode)

    if refuses == "open":
        monkeypatch.setattr(os, "open", refusing_direct)
    else:
        monkeypatch.setattr(intake_log, "_pwrite_all", invalid)
    records = [encode(_spans(seq), {}) for seq in range(3)]
    payloads = _appended_and_recovered(tmp_path / "log", records)
    assert payloads == [_joined(r)[HEADER_V5_BYTES:] for r in records]
    segment = tmp_path / "log" / _segments(tmp_path / "log")[0]
    assert segment.stat().st_size == sum(map(len, records))  # no block's padding after them


def test_a_failed_fsync_takes_its_round_back_and_the_next_records_follow_on(tmp_path, monkeypatch):
    """The failed round's bytes are cut off, and the next round is written where they began: no hole that a
    replay would take for damage (and set aside with the acknowledged records after it)."""
    import errno

    from sloscope.analytics.intake_log import LogAppendError

    log, records = IntakeLog(tmp_path / "log"), [encode(_spans(seq), {}) for seq in range(3)]
    log.append(records[0])
    fdatasync = os.fdatasync

    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(LogAppendError, match="Input/output error"):
        log.append(records[1])
    assert log.failure is not None
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    log.append(records[2])
    assert log.failure is None
    log.close()
    recovered = IntakeLog(tmp_path / "log")
    kept = [_joined(r)[HEADER_V5_BYTES:] for r in (records[0], records[2])]
    assert [payload for _, payload in recovered.recovered] == kept
    assert not (tmp_path / "log" / "rejected").exists()
    recovered.close()


def test_a_torn_last_record_is_cut_off(tmp_path):
    """It was never acknowledged: nothing of it is kept."""
    records = _logged(tmp_path / "log", 3)
    segment = tmp_path / "log" / _segments(tmp_path / "log")[0]
    whole = len(records[0]) + len(records[1])
    with segment.open("r+b") as f:
        f.truncate(whole + len(records[2]) // 2)  # a crash in the middle of the third append
    log = IntakeLog(tmp_path / "log")
    assert [entry.offset for entry, _ in log.recovered] == [0, len(records[0])]
    assert segment.stat().st_size == whole
    assert not (tmp_path / "log" / "rejected").exists()
    log.close()


def _spares(directory):
    return sorted(p.name for p in directory.glob("*.spare"))


@pytest.mark.parametrize("counts", [{}, {"tier_invalid": 123456789}], ids=["at-a-boundary", "mid-record"])
def test_a_spare_is_written_over_and_its_earlier_records_are_not_replayed(tmp_path, counts):
    """A committed segment's file is the next segment; after a crash only the records of its new use replay,
    whether the earlier ones begin exactly where the new ones end or in the middle of one."""
    directory = tmp_path / "log"
    records = [encode(_spans(seq), {}) for seq in range(6)]
    assert len({len(r) for r in records}) == 1
    log = IntakeLog(directory, segment_bytes=3 * len(records[0]))
    first = [log.append(r) for r in records[:3]]
    for r in records[3:]:  # the first segment is full: these go into the second
        log.append(r)
    log.release(first)
    assert _spares(directory) == ["0000000000000001.spare"]
    inode = (directory / "0000000000000001.spare").stat().st_ino
    last = encode(_spans(6), counts)
    log.append(last)  # the second segment is full: the third is the spare, written over from its start
    assert _spares(directory) == [] and (directory / "0000000000000003.log").stat().st_ino == inode
    log.close()  # a stop with records uncommitted: they stay for a replay
    assert _segments(directory) == ["0000000000000002.log", "0000000000000003.log"]
    again = IntakeLog(directory)
    assert [payload for _, payload in again.recovered] == [_joined(r, 2)[HEADER_V5_BYTES:] for r in records[3:]] + [
        _joined(last, 3)[HEADER_V5_BYTES:]]
    assert (directory / "0000000000000003.log").stat().st_size == len(last)  # the earlier use's records cut off
    assert not (directory / "rejected").exists()
    again.close()


def test_spares_are_bounded_and_go_when_an_append_fails_and_at_a_stop(tmp_path, monkeypatch):
    import errno

    from sloscope.analytics.intake_log import LogAppendError

    directory, record = tmp_path / "log", encode(_spans(0), {})
    log = IntakeLog(directory, segment_bytes=len(record), spare_bytes=2 * len(record))  # a record per segment
    log.release([log.append(record) for _ in range(5)])
    assert len(_spares(directory)) == 2 and _segments(directory) == ["0000000000000005.log"]  # the active one
    monkeypatch.setattr(os, "fdatasync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(LogAppendError):
        log.append(record)
    assert _spares(directory) == []
    monkeypatch.undo()
    log.release([log.append(record) for _ in range(3)])
    assert len(_spares(directory)) == 2
    log.close()
    assert os.listdir(directory) == []


def _damaged(tmp_path, count: int, damage) -> tuple[list[bytes], IntakeLog]:
    """`count` records logged, `damage(raw, starts)` done to their segment's bytes, and the log opened again."""
    records = _logged(tmp_path / "log", count)
    segment = tmp_path / "log" / _segments(tmp_path / "log")[0]
    raw = bytearray(segment.read_bytes())
    starts = [sum(map(len, records[:n])) for n in range(count)]
    damage(raw, starts)
    segment.write_bytes(bytes(raw))
    return records, IntakeLog(tmp_path / "log")


def _flip(raw, starts):
    raw[starts[1] + HEADER_V5_BYTES + 100] ^= 0xFF  # a flipped bit pattern in the second record's payload


def _zero_block(raw, starts):
    raw[starts[2] - 1000:starts[2] + 3096] = bytes(4096)  # a zeroed 4 KiB block across records 2 and 3


def _break_first_header(raw, starts):
    raw[0:4] = b"XXXX"


@pytest.mark.parametrize("damage, lost", [(_flip, {1}), (_zero_block, {1, 2}), (_break_first_header, {0})])
def test_a_damaged_record_costs_itself_and_the_records_after_it_are_replayed(tmp_path, damage, lost):
    records, log = _damaged(tmp_path, 6, damage)
    try:
        assert [payload for _, payload in log.recovered] == [r[HEADER_V5_BYTES:] for n, r in enumerate(records)
                                                           if n not in lost]
        kept = sorted((tmp_path / "log" / "rejected").glob("*.damaged"))
        assert len(kept) == 1 and kept[0].stat().st_size > 0  # the damaged bytes, for inspection
    finally:
        log.close()


def _flip_last(raw, starts):
    raw[starts[-1] + HEADER_V5_BYTES + 100] ^= 0xFF


def test_a_record_that_fails_its_checksum_at_the_end_ends_the_segment(tmp_path):
    records, log = _damaged(tmp_path, 3, _flip_last)
    try:
        assert [payload for _, payload in log.recovered] == [r[HEADER_V5_BYTES:] for r in records[:2]]
        segment = tmp_path / "log" / _segments(tmp_path / "log")[0]
        assert segment.stat().st_size == len(records[0]) + len(records[1])  # a torn last record is cut off
        assert not (tmp_path / "log" / "rejected").exists()
    finally:
        log.close()


def test_the_bound_counts_logged_bytes_until_they_are_committed(tmp_path):
    with Store(tmp_path / "b.duckdb") as store:
        record_bytes = len(encode(_spans(0), {}))
        writer = Writer(store, max_queued_bytes=record_bytes + 1, intake_log=IntakeLog(tmp_path / "log"))
        first = writer.offer(_spans(0), {})  # not started: logged, not committed
        assert first is not None and first.entry is not None
        assert writer.offer(_spans(1), {}) is None  # the client gets a 503 with Retry-After
        assert writer.stats()["queued_bytes"] == record_bytes
        writer.start()
        _wait_drained(writer)
        assert writer.stats()["queued_bytes"] == 0 and writer.offer(_spans(1), {}) is not None
        writer.stop()
        assert store.scalar("SELECT count(*) FROM requests") == 100


def test_a_logged_request_the_store_refuses_goes_to_rejected(tmp_path):
    with Store(tmp_path / "p.duckdb") as store:
        writer = Writer(store, intake_log=IntakeLog(tmp_path / "log"))
        good = [writer.offer(_histogram(f"node-{i}", [1, 2]), {}) for i in range(2)]
        poison = writer.offer(_histogram("node-bad", [-1, 2]), {"tier_invalid": 1})
        assert all(p is not None and p.entry is not None for p in good + [poison])  # all acknowledged
        writer.start()
        _wait_drained(writer)
        writer.stop()
        assert store.rows("SELECT node FROM histograms ORDER BY node") == [("node-0",), ("node-1",)]
        assert store.counters()["store_rejected_requests"] == 1
    kept = list((tmp_path / "log" / "rejected").iterdir())
    assert len(kept) == 1 and _segments(tmp_path / "log") == []
    frames, counts = decode(read_record(kept[0].read_bytes(), 0)[0])
    assert frames.histograms["node"].to_list() == ["node-bad"] and counts == {"tier_invalid": 1}


def test_new_requests_wait_until_the_replay_is_written_and_health_says_so(tmp_path):
    _logged(tmp_path / "log", 3)
    with Store(tmp_path / "w.duckdb") as store:
        writer = Writer(store, intake_log=IntakeLog(tmp_path / "log"))
        assert writer.replay() == 3  # not started: as a store that cannot write yet holds it back
        assert writer.offer(_spans(7), {}) is None  # the client gets a 503 and retries
        assert writer.health() == "replaying the intake log: 3 requests left"
        writer.start()
        _wait_drained(writer)
        assert writer.health() is None and writer.offer(_spans(7), {}) is not None
        writer.stop()
        assert store.scalar(f"SELECT count(DISTINCT substr({TRACE_ID}, 9, 8)) FROM requests") == 4


def _posted_until_taken(port: int, body: bytes) -> int:
    """Post as an exporter does: again after a 503, for up to 30 s."""
    deadline = time.monotonic() + 30
    while (status := _post(port, "/v1/traces", body, "application/x-protobuf")) == 503 and time.monotonic() < deadline:
        time.sleep(0.2)
    return status


def test_serve_replays_the_log_before_it_takes_new_requests(tmp_path):
    db = tmp_path / "s.duckdb"
    Store(db).close()
    _logged(tmp_path / "s.duckdb.intake", 4)  # as a serve killed before committing them left it
    serve = Serve(db, free_port())
    serve.start()
    assert _posted_until_taken(serve.port, _traces(1, 2)) == 200  # a client's resend
    assert serve.stop() == 0, serve.log.read_text()[-3000:]
    assert _segments(tmp_path / "s.duckdb.intake") == []  # a clean stop leaves nothing to replay
    with Store(db, read_only=True) as store:
        assert store.scalar("SELECT count(*) FROM requests") == 4 * 50
        assert store.counters()["requests_loaded"] == 200


def test_serve_without_the_log_refuses_to_start_over_requests_left_in_it(tmp_path):
    db = tmp_path / "c.duckdb"
    _logged(tmp_path / "c.duckdb.intake", 1)
    done = subprocess.run([SLOSCOPE, "serve", "--db", str(db), "--http", "off", "--grpc", "off", "--ack", "commit"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "start with --ack log once" in done.stderr


def test_a_second_process_cannot_use_the_same_log(tmp_path):
    log = IntakeLog(tmp_path / "log")
    with pytest.raises(OSError, match="in use"):
        IntakeLog(tmp_path / "log")
    log.close()
    IntakeLog(tmp_path / "log").close()


@pytest.mark.privileged
def test_a_full_disk_refuses_the_append_and_leaves_nothing_of_it(small_disk):  # noqa: F811
    with Store(small_disk / "f.duckdb") as store:
        log = IntakeLog(small_disk / "log")
        writer = Writer(store, intake_log=log)  # not started: the log alone is tested
        logged = writer.offer(_spans(0), {})
        segment = small_disk / "log" / _segments(small_disk / "log")[0]
        filler = Filler(small_disk)
        filler.start()
        try:
            refused = 0
            for seq in range(1, 200):  # blocks already allocated may take a few more
                if (pending := writer.offer(_spans(seq), {})) is None:
                    refused = seq
                    break
                logged = pending
            assert refused, "the disk never filled"
            assert segment.stat().st_size == logged.entry.offset + logged.entry.length  # nothing of the refused one
            assert writer.health().startswith("intake log append failing")
        finally:
            filler.free()
        deadline = time.monotonic() + 10  # ready again with no request: the log tries a block of its own
        while writer.health() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert writer.health() is None
        assert writer.offer(_spans(refused), {}) is not None and writer.health() is None
        writer.start()
        _wait_drained(writer)
        writer.stop()
        stored = store.scalar(f"SELECT count(DISTINCT substr({TRACE_ID}, 9, 8)) FROM requests")
    assert stored == refused + 1 and os.listdir(small_disk / "log") == []


@pytest.mark.privileged
def test_a_replay_a_full_disk_holds_back_leaves_serve_answering_its_health_checks(small_disk):
    """serve killed with requests in its log and started again while the store's disk is full: /healthz answers
    (a kubelet would otherwise restart it over and over), /readyz and new requests say it is not ready, and once
    there is space the replay is written and requests are taken."""
    db = small_disk / "s.duckdb"
    Store(db).close()
    _logged(small_disk / "s.duckdb.intake", 3)
    filler = Filler(small_disk)
    filler.start()
    serve = Serve(db, free_port(), small_disk.parent / "serve.log")
    try:
        serve.start()
        assert _get(serve.port, "/healthz")[0] == 200
        ready, why = _get(serve.port, "/readyz")
        assert ready == 503 and ("replaying the intake log" in why or "store write failing" in why)
        assert _post(serve.port, "/v1/traces", _traces(1, 9), "application/x-protobuf") == 503
        filler.free()
        assert _posted_until_taken(serve.port, _traces(1, 9)) == 200
        assert _get(serve.port, "/readyz")[0] == 200
    finally:
        if filler.is_alive():
            filler.free()
        if serve.proc is not None and serve.proc.poll() is None:
            assert serve.stop() == 0, serve.log.read_text()[-3000:]
    with Store(db, read_only=True) as store:
        assert store.scalar(f"SELECT count(DISTINCT substr({TRACE_ID}, 9, 8)) FROM requests") == 4


def test_files_that_are_not_the_logs_own_are_left_alone_and_never_stop_it(tmp_path, caplog):
    """A stray notes.log, a copy named like a segment but a directory, or a link: the log opens, replays its own
    records, numbers its next segment above them all, and leaves them as they were."""
    _logged(tmp_path / "log", 2)
    stray = tmp_path / "log" / "notanumber.log"
    stray.write_text("not a segment\n")
    taken = tmp_path / "log" / "0000000000000009.log"
    taken.mkdir()
    (tmp_path / "log" / "0000000000000003.spare").symlink_to(stray)
    with caplog.at_level("WARNING", logger="sloscope.intake_log"):
        log = IntakeLog(tmp_path / "log")
    try:
        assert len(log.recovered) == 2
        log.append(encode(_spans(7), {}))
        assert "0000000000000010.log" in _segments(tmp_path / "log")  # above the directory's 9
    finally:
        log.close()
    assert stray.read_text() == "not a segment\n" and taken.is_dir()
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "notanumber.log: not one of the intake log's files" in warned and "0000000000000009.log" in warned
    assert "0000000000000003.spare" in warned

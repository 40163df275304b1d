"""The on-disk spool: order, durability across reopen, bounds with counted drops (in the disk the files take),
the checksummed file format, corrupt files set aside, transient read errors retried, quarantine."""

import errno
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.resources import Resource

from sloscope.collectors.otlp_metrics import MetricsBuilder, count_points, encode
from sloscope.collectors.spool import LOCK_FILE, UNREADABLE_TRIES, Spool
from sloscope.collectors.spool_format import HEADER, MAGIC, VERSION, decode_record
from sloscope.probes.sample import Sample
from tests.conftest import need

REPO = Path(__file__).resolve().parents[2]


def request(n_points: int, tag: int = 0) -> bytes:
    """A serialized export request with n_points gauge points whose values carry `tag`."""
    builder = MetricsBuilder(Resource({"host.name": "h"}))
    samples = [Sample("hw.gpu.temperature", {"hw.id": f"gpu-{i}"}, 2_000 + tag, float(tag), "gauge", 1_000)
               for i in range(n_points)]
    return encode(builder.build(samples)).SerializeToString()


def tag_of(body: bytes) -> int:
    req = ExportMetricsServiceRequest.FromString(body)
    return int(req.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double)


def test_fifo_order_and_files_named_by_sequence(tmp_path):
    spool = Spool(str(tmp_path))
    seqs = [spool.append(request(2, tag)) for tag in range(5)]
    assert seqs == [0, 1, 2, 3, 4]
    assert sorted(os.listdir(tmp_path)) == [LOCK_FILE, *(f"{s:020d}.pb" for s in seqs)]
    seen = []
    while spool:
        seq, body, points = spool.peek()
        assert points == 2 and len(body) + HEADER.size == os.path.getsize(spool.path(seq))
        seen.append(tag_of(body))
        spool.remove(seq)
    assert seen == [0, 1, 2, 3, 4]
    assert spool.peek() is None and spool.bytes == 0 and os.listdir(tmp_path) == [LOCK_FILE]


def test_each_file_is_the_request_as_sent_behind_a_checksummed_header(tmp_path):
    spool = Spool(str(tmp_path))
    data = request(3, 7)
    seq = spool.append(data)
    raw = Path(spool.path(seq)).read_bytes()
    magic, version, length, digest = HEADER.unpack_from(raw)
    assert (magic, version, length, digest) == (MAGIC, VERSION, len(data), hashlib.sha256(data).digest())
    assert raw[HEADER.size:] == data == decode_record(raw)
    assert count_points(ExportMetricsServiceRequest.FromString(data)) == 3
    assert spool.bytes == disk_taken_by(spool.path(seq)) >= len(raw)


def test_files_from_an_earlier_version_still_replay_in_order(tmp_path):
    for seq, tag in ((4, 40), (5, 50)):  # version 0: the bare request
        (tmp_path / f"{seq:020d}.pb").write_bytes(request(2, tag))
    spool = Spool(str(tmp_path))
    assert spool.append(request(1, 60)) == 6
    seen = []
    while spool:
        seq, body, points = spool.peek()
        seen.append((seq, tag_of(body), points))
        spool.remove(seq)
    assert seen == [(4, 40, 2), (5, 50, 2), (6, 60, 1)] and spool.corrupt_batches == 0


def test_reopening_resumes_and_continues_the_sequence(tmp_path, caplog):
    spool = Spool(str(tmp_path))
    for tag in range(3):
        spool.append(request(1, tag))
    spool.remove(spool.peek()[0])
    spool.close()
    (tmp_path / ".00000000000000000009.tmp").write_bytes(b"half a write")  # a crash in the middle of append
    with caplog.at_level("WARNING"):
        again = Spool(str(tmp_path))
    assert "removed 1 unfinished writes" in caplog.text
    assert len(again) == 2 and again.bytes == spool.bytes
    assert not (tmp_path / ".00000000000000000009.tmp").exists()
    assert again.append(request(1, 3)) == 3
    assert tag_of(again.peek()[1]) == 1
    assert again.sequence_numbers() == [1, 2, 3]


def test_bound_in_batches_drops_the_oldest_and_counts_them(tmp_path, caplog):
    spool = Spool(str(tmp_path), max_batches=3)
    for tag in range(5):
        spool.append(request(2, tag))
    assert len(spool) == 3 and spool.sequence_numbers() == [2, 3, 4]
    assert spool.dropped_batches == 2 and spool.dropped_points == 4
    assert "dropped the 1 oldest batches" in caplog.text
    assert tag_of(spool.peek()[1]) == 2


def disk_taken_by(path) -> int:
    """What the file system says the file takes: its allocated blocks."""
    return os.stat(path).st_blocks * 512


def disk_taken_by_a_file_of(size: int, directory: Path) -> int:
    """Skips (fails under SLOSCOPE_REQUIRE_PRIVILEGED=1) where the file system keeps such a file in less than
    twice its size (small files inline, or compressed): the blocks it takes are not what this test is about."""
    sample = directory / "sample"
    sample.write_bytes(os.urandom(size))
    taken = disk_taken_by(sample)
    sample.unlink()
    need(taken >= 2 * size, f"the file system of {directory} keeps {size} bytes in {taken} bytes of disk")
    return taken


def test_bound_in_bytes_counts_the_blocks_the_files_take_on_disk(tmp_path, caplog):
    """Batches far smaller than a block each take a whole block: the bound is on those blocks (what du and a
    sized emptyDir count), so the files kept take at most the bound, and the oldest are dropped and counted."""
    block = disk_taken_by_a_file_of(len(request(1, 0)) + HEADER.size, tmp_path)
    spool = Spool(str(tmp_path / "spool"), max_bytes=3 * block)
    for tag in range(10):
        spool.append(request(1, tag))
    kept = spool.sequence_numbers()
    on_disk = sum(disk_taken_by(spool.path(seq)) for seq in kept)
    assert kept == [7, 8, 9] and on_disk <= spool.max_bytes
    assert spool.bytes == spool.stats().bytes == on_disk  # /metrics' _spool_bytes
    assert spool.dropped_batches == 7 and spool.dropped_points == 7
    assert "dropped the 1 oldest batches" in caplog.text
    spool.close()
    again = Spool(str(tmp_path / "spool"), max_bytes=2 * block)  # the scan at start counts alike
    assert again.sequence_numbers() == [8, 9] and again.dropped_batches == 1 and again.bytes == 2 * block


def test_a_batch_larger_than_the_bound_is_dropped_and_counted(tmp_path):
    spool = Spool(str(tmp_path), max_bytes=50)
    spool.append(request(10, 1))
    assert len(spool) == 0 and spool.dropped_batches == 1 and spool.dropped_points == 10


def test_a_batch_whose_blocks_alone_pass_the_bound_is_dropped_and_counted(tmp_path, caplog):
    """Its bytes fit the bound, the block they take does not: it is not stored, and nothing of it stays."""
    record = len(request(2, 1)) + HEADER.size
    disk_taken_by_a_file_of(record, tmp_path)
    spool = Spool(str(tmp_path / "spool"), max_bytes=record)
    assert spool.append(request(2, 1)) is None
    assert len(spool) == 0 and spool.bytes == 0 and spool.dropped_batches == 1 and spool.dropped_points == 2
    assert os.listdir(spool.directory) == [LOCK_FILE] and "bytes of disk it takes alone exceed" in caplog.text


def test_reopening_with_a_smaller_bound_trims(tmp_path):
    spool = Spool(str(tmp_path))
    for tag in range(4):
        spool.append(request(1, tag))
    spool.close()
    smaller = Spool(str(tmp_path), max_batches=2)
    assert smaller.sequence_numbers() == [2, 3] and smaller.dropped_batches == 2


def flip(path: str, offset: int) -> None:
    raw = bytearray(Path(path).read_bytes())
    raw[offset] ^= 0xFF
    Path(path).write_bytes(bytes(raw))


@pytest.mark.parametrize("damage, reason", [
    (lambda p: flip(p, HEADER.size + 20), "checksum mismatch"),  # one byte of the request
    (lambda p: flip(p, os.path.getsize(p) - 1), "checksum mismatch"),  # its last byte
    (lambda p: flip(p, 13), "header says"),  # the length
    (lambda p: flip(p, 2), "bad magic"),
    (lambda p: flip(p, 4), "format version 65281"),
    (lambda p: os.truncate(p, os.path.getsize(p) - 7), "header says"),  # a torn write
    (lambda p: os.truncate(p, 20), "shorter than the 46-byte header"),
    (lambda p: os.truncate(p, 0), "empty file"),
    (lambda p: Path(p).write_bytes(b"\x0a\xff\xff\xff not protobuf"), "request does not parse"),  # version 0
])
def test_a_corrupt_file_is_set_aside_and_counted(tmp_path, caplog, damage, reason):
    spool = Spool(str(tmp_path))
    spool.append(request(3, 0))
    spool.append(request(1, 1))
    damage(spool.path(0))
    seq, body, _ = spool.peek()
    assert seq == 1 and tag_of(body) == 1
    assert spool.corrupt_batches == 1 and spool.dropped_batches == 1 and spool.read_errors == 0
    assert spool.sequence_numbers() == [1] and spool.bytes == disk_taken_by(spool.path(1))
    assert (tmp_path / "corrupt" / f"{0:020d}.pb").exists()
    assert "batch 0 is corrupt" in caplog.text and reason in caplog.text
    spool.close()
    assert Spool(str(tmp_path)).sequence_numbers() == [1]  # set aside for good, also after a restart


TRANSIENT_READ = textwrap.dedent("""
    import os, resource, sys
    from sloscope.collectors.spool import UNREADABLE_TRIES, Spool
    spool = Spool(sys.argv[1])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no descriptor left to open
    try:
        spool.peek()
        print("no error")
    except OSError as exc:
        print("error", exc.errno)
    print("kept", spool.sequence_numbers(), spool.read_errors, spool.corrupt_batches, spool.dropped_batches)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    seq, body, points = spool.peek()
    print("read", seq, points)
""")


def test_a_transient_read_error_keeps_the_file_for_a_later_read(tmp_path):
    """Out of file descriptors (EMFILE) is not corruption: the batch stays, counted as a read error, and
    is read once descriptors are back."""
    spool = Spool(str(tmp_path))
    spool.append(request(3, 0))
    spool.append(request(1, 1))
    spool.close()
    out = subprocess.run([sys.executable, "-c", TRANSIENT_READ, str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["error 24", "kept [0, 1] 1 0 0", "read 0 3"]  # 24: EMFILE
    assert "could not be read" in out.stderr and "it stays" in out.stderr
    assert sorted(os.listdir(tmp_path)) == [LOCK_FILE, f"{0:020d}.pb", f"{1:020d}.pb"]


def unreadable(monkeypatch, seq: int, code: int) -> None:
    """Reads of batch `seq` fail with `code` (EIO: a bad block under it), others work."""
    read = Spool._read

    def failing(self, n):
        if n == seq:
            raise OSError(code, os.strerror(code))
        return read(self, n)

    monkeypatch.setattr(Spool, "_read", failing)


def test_a_batch_that_fails_every_read_is_set_aside_so_the_rest_goes_on(tmp_path, monkeypatch, caplog):
    """A bad block under one file (EIO on every read) would hold every batch behind it until the bounds
    dropped it, days later: after UNREADABLE_TRIES reads in a row it goes to corrupt/, counted."""
    spool = Spool(str(tmp_path))
    for tag in (0, 1):
        spool.append(request(1, tag))
    unreadable(monkeypatch, 0, errno.EIO)
    for _ in range(UNREADABLE_TRIES - 1):
        with pytest.raises(OSError):
            spool.peek()  # stays for now: an EIO may pass
    assert spool.sequence_numbers() == [0, 1]
    seq, body, _points = spool.peek()
    assert (seq, tag_of(body)) == (1, 1)
    assert os.listdir(tmp_path / "corrupt") == [f"{0:020d}.pb"]
    assert (spool.corrupt_batches, spool.dropped_batches, spool.read_errors) == (1, 1, UNREADABLE_TRIES)
    assert "could not be read 5 times in a row" in caplog.text


def test_a_read_error_of_the_process_never_sets_a_batch_aside(tmp_path, monkeypatch):
    """Out of descriptors (EMFILE) any file fails alike: however often, the batch stays."""
    spool = Spool(str(tmp_path))
    spool.append(request(1, 0))
    unreadable(monkeypatch, 0, errno.EMFILE)
    for _ in range(3 * UNREADABLE_TRIES):
        with pytest.raises(OSError):
            spool.peek()
    assert spool.sequence_numbers() == [0] and spool.corrupt_batches == 0


def test_reject_moves_a_batch_aside(tmp_path):
    spool = Spool(str(tmp_path))
    spool.append(request(3, 0))
    spool.append(request(1, 1))
    spool.reject(0, "the receiver refuses it")
    assert spool.sequence_numbers() == [1]
    assert spool.rejected_batches == 1 and spool.dropped_points == 3
    assert (tmp_path / "rejected" / f"{0:020d}.pb").exists()
    spool.reject(1, "that one too")
    spool.close()
    again = Spool(str(tmp_path))  # a restart, its spool empty: new batches do not take set-aside names
    again.append(request(2, 2))
    again.reject(again.sequence_numbers()[0], "and the next run's")
    assert sorted(os.listdir(tmp_path / "rejected")) == [f"{n:020d}.pb" for n in (0, 1, 2)]


def test_bounds_must_be_positive(tmp_path):
    with pytest.raises(ValueError):
        Spool(str(tmp_path), max_bytes=0)


@pytest.mark.parametrize("failing", ["open", "replace"])
def test_a_failed_write_leaves_nothing_and_says_only_why(tmp_path, monkeypatch, caplog, failing):
    """A write that fails (a read-only directory at open, or a rename refused) is one drop, logged once: nothing
    of it stays on disk, and no removal of a file it never made is reported."""
    spool = Spool(str(tmp_path))
    real = getattr(os, failing)

    def refused(*args, **kwargs):
        if failing == "open" or str(args[0]).endswith(".tmp"):
            raise OSError(30, "Read-only file system")
        return real(*args, **kwargs)

    monkeypatch.setattr(os, failing, refused)
    if failing == "open":  # on a read-only file system every removal is refused too, of files there or not
        monkeypatch.setattr(os, "unlink", lambda path: refused(path))
    assert spool.append(request(3)) is None
    monkeypatch.undo()
    assert spool.dropped_batches == 1 and os.listdir(tmp_path) == [LOCK_FILE]
    assert "could not remove" not in caplog.text and caplog.text.count("Read-only file system") == 1

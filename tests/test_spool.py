"""The on-disk spool: order, durability across reopen, bounds with counted drops, quarantine."""

import os

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.resources import Resource

from collectors.otlp_metrics import MetricsBuilder, count_points, encode
from collectors.spool import Spool
from probes.sample import Sample


def request(n_points: int, tag: int = 0) -> bytes:
    """A serialized export request with n_points gauge points whose values carry `tag`."""
    builder = MetricsBuilder(Resource({"host.name": "h"}))
    samples = [Sample("hw.gpu.temperature", {"hw.id": f"gpu-{i}"}, 2_000 + tag, float(tag), "gauge", 1_000)
               for i in range(n_points)]
    return encode(builder.build(samples)).SerializeToString()


def tag_of(req: ExportMetricsServiceRequest) -> int:
    return int(req.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double)


def test_fifo_order_and_files_named_by_sequence(tmp_path):
    spool = Spool(str(tmp_path))
    seqs = [spool.append(request(2, tag)) for tag in range(5)]
    assert seqs == [0, 1, 2, 3, 4]
    assert sorted(os.listdir(tmp_path)) == [f"{s:020d}.pb" for s in seqs]
    seen = []
    while spool:
        seq, req, size = spool.peek()
        assert size == os.path.getsize(spool.path(seq))
        seen.append(tag_of(req))
        spool.remove(seq)
    assert seen == [0, 1, 2, 3, 4]
    assert spool.peek() is None and spool.bytes == 0 and os.listdir(tmp_path) == []


def test_each_file_is_an_export_request_as_sent(tmp_path):
    spool = Spool(str(tmp_path))
    data = request(3, 7)
    seq = spool.append(data)
    with open(spool.path(seq), "rb") as f:
        assert f.read() == data
    assert count_points(ExportMetricsServiceRequest.FromString(data)) == 3


def test_reopening_resumes_and_continues_the_sequence(tmp_path):
    spool = Spool(str(tmp_path))
    for tag in range(3):
        spool.append(request(1, tag))
    spool.remove(spool.peek()[0])
    (tmp_path / ".00000000000000000009.tmp").write_bytes(b"half a write")  # a crash in the middle of append
    again = Spool(str(tmp_path))
    assert len(again) == 2 and again.bytes == spool.bytes
    assert not (tmp_path / ".00000000000000000009.tmp").exists()
    assert again.append(request(1, 3)) == 3
    assert [tag_of(again.peek()[1])] == [1]
    assert again.sequence_numbers() == [1, 2, 3]


def test_bound_in_batches_drops_the_oldest_and_counts_them(tmp_path, caplog):
    spool = Spool(str(tmp_path), max_batches=3)
    for tag in range(5):
        spool.append(request(2, tag))
    assert len(spool) == 3 and spool.sequence_numbers() == [2, 3, 4]
    assert spool.dropped_batches == 2 and spool.dropped_points == 4
    assert "dropped the 1 oldest batches" in caplog.text
    assert tag_of(spool.peek()[1]) == 2


def test_bound_in_bytes(tmp_path):
    one = len(request(4, 0))
    spool = Spool(str(tmp_path), max_bytes=int(one * 2.5))
    for tag in range(4):
        spool.append(request(4, tag))
    assert len(spool) == 2 and spool.bytes <= one * 2.5
    assert spool.dropped_batches == 2 and spool.dropped_points == 8
    assert [tag_of(spool.peek()[1])] == [2]


def test_a_batch_larger_than_the_bound_is_dropped_and_counted(tmp_path):
    spool = Spool(str(tmp_path), max_bytes=50)
    spool.append(request(10, 1))
    assert len(spool) == 0 and spool.dropped_batches == 1 and spool.dropped_points == 10


def test_reopening_with_a_smaller_bound_trims(tmp_path):
    spool = Spool(str(tmp_path))
    for tag in range(4):
        spool.append(request(1, tag))
    smaller = Spool(str(tmp_path), max_batches=2)
    assert smaller.sequence_numbers() == [2, 3] and smaller.dropped_batches == 2


def test_a_corrupt_file_is_set_aside_and_counted(tmp_path, caplog):
    spool = Spool(str(tmp_path))
    spool.append(request(1, 0))
    spool.append(request(1, 1))
    with open(spool.path(0), "wb") as f:
        f.write(b"\xff\xff\xff not protobuf")
    seq, req, _ = spool.peek()
    assert seq == 1 and tag_of(req) == 1
    assert spool.corrupt_batches == 1 and spool.dropped_batches == 1
    assert (tmp_path / "corrupt" / f"{0:020d}.pb").exists()
    assert "does not parse" in caplog.text


def test_reject_moves_a_batch_aside(tmp_path):
    spool = Spool(str(tmp_path))
    spool.append(request(3, 0))
    spool.append(request(1, 1))
    spool.reject(0, "the receiver refuses it")
    assert spool.sequence_numbers() == [1]
    assert spool.rejected_batches == 1 and spool.dropped_points == 3
    assert (tmp_path / "rejected" / f"{0:020d}.pb").exists()


def test_bounds_must_be_positive(tmp_path):
    with pytest.raises(ValueError):
        Spool(str(tmp_path), max_bytes=0)

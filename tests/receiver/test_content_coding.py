"""OTLP/HTTP bodies in each compression an OpenTelemetry Collector's otlphttp exporter offers: decoded to the
same rows as plain ones, bounded against bombs, and refused with a 400 and a counter when they do not decode."""

import gzip
import zlib

import cramjam
import google_crc32c
import grpc
import lz4.frame
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from sloscope.edge.http_body import BodyError
from sloscope.receiver.content_coding import CODINGS, INFLATE_STEP, decode
from sloscope.receiver.zstd_module import zstd
from tests.in_process import InProcessReceiver
from tests.receiver.test_receiver import _proto_traces

LIMIT = 4 * 2**20
PAYLOAD = b"resourceSpans " * 20_000  # 280 KB, several snappy chunks and zlib steps


class Held:
    """The in-flight reservation, counting what the decoder reserved."""

    def __init__(self):
        self.bytes = 0

    def reserve(self, n: int) -> None:
        self.bytes += n


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def zstd_streamed(data: bytes) -> bytes:
    """As a streaming writer (Go's zstd.NewWriter, the Collector's) writes it: no content size in the header."""
    packer = zstd.ZstdCompressor()
    return packer.compress(data) + packer.flush()


def snappy_framed(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress(data))


ENCODERS = {
    "gzip": [gzip.compress],
    "zstd": [zstd.compress, zstd_streamed],
    "zlib": [zlib.compress],
    "deflate": [zlib.compress, raw_deflate],
    "snappy": [lambda d: bytes(cramjam.snappy.compress_raw(d)), snappy_framed],
    "x-snappy-framed": [snappy_framed],
    "lz4": [lz4.frame.compress],
}
CASES = [(coding, encode) for coding, encoders in ENCODERS.items() for encode in encoders]


def test_every_coding_is_covered():
    assert set(ENCODERS) == set(CODINGS)


@pytest.mark.parametrize("coding,encode", CASES)
def test_a_body_decodes_to_what_was_compressed(coding, encode):
    held = Held()
    assert decode(coding, encode(PAYLOAD), LIMIT, held) == PAYLOAD
    assert held.bytes == len(PAYLOAD)


@pytest.mark.parametrize("coding,encode", CASES)
def test_a_cut_off_body_is_a_400(coding, encode):
    whole = encode(PAYLOAD)
    for cut in (whole[:-3], whole[: len(whole) // 2], b""):
        with pytest.raises(BodyError) as refused:
            decode(coding, cut, LIMIT, Held())
        assert refused.value.status == 400
        assert refused.value.counter == ("requests_bad_gzip" if coding == "gzip" else "requests_bad_compression")


@pytest.mark.parametrize("coding,encode", CASES)
def test_a_bomb_stops_at_the_limit(coding, encode):
    bomb = encode(b"\0" * (6 * LIMIT))
    held = Held()
    with pytest.raises(BodyError) as refused:
        decode(coding, bomb, LIMIT, held)
    assert refused.value.status == 413
    assert held.bytes <= LIMIT + INFLATE_STEP


@pytest.mark.parametrize("coding,encode", [("gzip", gzip.compress), ("zstd", zstd.compress),
                                           ("zstd", zstd_streamed), ("lz4", lz4.frame.compress)])
def test_streams_one_after_another_are_one_body(coding, encode):
    assert decode(coding, encode(b"first ") + encode(b"second"), LIMIT, Held()) == b"first second"


def test_zlib_is_one_stream():
    with pytest.raises(BodyError, match="after the end of the stream"):
        decode("zlib", zlib.compress(b"otlp") + b"more", LIMIT, Held())


def test_a_zstd_window_past_what_is_decoded_with_is_refused():
    packer = zstd.ZstdCompressor(options={zstd.CompressionParameter.window_log: 30})
    with pytest.raises(BodyError) as refused:
        decode("zstd", packer.compress(b"x" * 1000) + packer.flush(), LIMIT, Held())
    assert refused.value.status == 400


def _chunk(kind: int, data: bytes) -> bytes:
    return bytes([kind]) + len(data).to_bytes(3, "little") + data


def _masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF).to_bytes(4, "little")


IDENTIFIER = _chunk(0xFF, b"sNaPpY")


def test_snappy_framing_reads_uncompressed_and_padding_chunks():
    body = (IDENTIFIER + _chunk(0x01, _masked_crc(b"plain ") + b"plain ") + _chunk(0xFE, b"\0" * 7)
            + _chunk(0x00, _masked_crc(b"packed") + bytes(cramjam.snappy.compress_raw(b"packed"))))
    assert decode("x-snappy-framed", body, LIMIT, Held()) == b"plain packed"


@pytest.mark.parametrize("body,problem", [
    (IDENTIFIER + _chunk(0x01, b"\0\0\0\0" + b"data"), "checksum"),
    (IDENTIFIER + _chunk(0x02, b"x"), "unskippable"),
    (_chunk(0x01, _masked_crc(b"data") + b"data"), "stream identifier"),
    (IDENTIFIER + _chunk(0x01, _masked_crc(b"x" * 70_000) + b"x" * 70_000), "past the format"),
    (IDENTIFIER + _chunk(0x01, b"\0\0"), "shorter than its checksum"),
])
def test_snappy_framing_refuses_what_the_format_forbids(body, problem):
    with pytest.raises(BodyError, match=problem) as refused:
        decode("x-snappy-framed", body, LIMIT, Held())
    assert refused.value.status == 400


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CODINGS), st.binary(max_size=300))
def test_any_bytes_are_a_body_or_a_client_error(coding, data):
    try:
        decode(coding, data, LIMIT, Held())
    except BodyError as exc:
        assert exc.status in (400, 413)


@pytest.fixture
def server(tmp_path):
    s = InProcessReceiver(tmp_path / "c.duckdb")
    yield s
    s.close()


def test_serve_takes_each_coding_and_counts_a_bad_body(server):
    body = _proto_traces(3).SerializeToString()
    for coding, encode in CASES:
        status, _, reply = server.post("/v1/traces", encode(body), headers={"Content-Encoding": coding.upper()})
        assert status == 200, (coding, reply)
    assert server.spans() == 3  # the same spans each time: stored once
    status, _, reply = server.post("/v1/traces", b"not zstd", headers={"Content-Encoding": "zstd"})
    assert status == 400 and b"bad zstd body" in reply
    assert server.receiver.counts["requests_bad_compression"] == 1
    status, _, reply = server.post("/v1/traces", body, headers={"Content-Encoding": "br"})
    assert status == 415 and b"zstd" in reply


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_grpc_takes_the_message_compressions_of_grpc_core(server, compression):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", compression=compression) as channel:
        reply = trace_service_pb2_grpc.TraceServiceStub(channel).Export(_proto_traces(4), timeout=10)
    assert not reply.partial_success.rejected_spans and server.spans() == 4


@pytest.mark.parametrize("coding,encode", [("gzip", gzip.compress), ("zstd", zstd.compress),
                                           ("lz4", lz4.frame.compress)])
def test_a_body_of_many_tiny_streams_is_refused_at_once(coding, encode):
    """Each stream after the first starts on a copy of the rest: 2 MiB of empty frames took 15 s."""
    many = encode(b"") * (2 * 2**20 // len(encode(b"")))
    with pytest.raises(BodyError, match="more than 16 streams") as refused:
        decode(coding, many, LIMIT, Held())
    assert refused.value.status == 400
    assert decode(coding, encode(b"x") * 16, LIMIT, Held()) == b"x" * 16

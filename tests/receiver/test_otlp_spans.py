"""The trace fast path (receiver/otlp_spans.c) must give exactly the rows and counters of the general decoder
for every request it takes, take the requests SDKs and the Collector send, and never take one the protobuf
runtime or the receiver would refuse. Spans of every kind are kept, each with its parent and what it called (its
peer), by both paths and by the OTLP/JSON decoder alike."""

import base64
import gc
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from sloscope.analytics.frames import SPAN_COLUMNS, Frames
from sloscope.receiver import otlp_spans
from sloscope.receiver.otlp_common import PEER_ATTRIBUTES, REFUSAL_REASONS, DecodeError
from sloscope.receiver.server import FAST_PATH, GENERAL_PATH, Decoders, fast_decode
from sloscope.enrich.tiers import TierResolver, resolve_tiers
from sloscope.records import SPAN_KIND_CLIENT, SPAN_KIND_INTERNAL, SPAN_KIND_SERVER, Batch
from tests.otlp_builders import span, traces

TIERS = frozenset({"standard", "p99-latency-critical"})
SERVER = Span.SPAN_KIND_SERVER
KEYS = [key.decode() for key in otlp_spans.SLOT_KEYS] + ["http.request.method", "url.full", "x", ""]
PEER_KEYS = list(PEER_ATTRIBUTES)
T0 = 1_764_410_400_000_000_000
TRACE, SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


def fast_rows(body: bytes):
    """(spans frame, counters) by the fast path, or None where it declines."""
    decoded = fast_decode("traces", body, False)
    return None if decoded is None else _rows(*decoded)


def general_rows(body: bytes):
    return _rows(*Decoders().decode("traces", body, False))


def json_rows(body: bytes):
    """(spans frame, counters) of the same request sent as OTLP/JSON."""
    return _rows(*Decoders().decode("traces", as_json(body), True))


def as_json(body: bytes) -> bytes:
    """An export request in OTLP/JSON: protobuf's JSON mapping with ids in hex rather than base64."""
    doc = MessageToDict(ExportTraceServiceRequest.FromString(body), use_integers_for_enums=True)
    for block in doc.get("resourceSpans", []):
        for scope in block.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in {"traceId", "spanId", "parentSpanId"} & span.keys():
                    span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(doc).encode()


def _rows(batch, counts):
    """(spans frame, counters but the one naming the decoder)."""
    resolver = TierResolver(TIERS, "standard")
    resolve_tiers(batch.spans, resolver)
    counts = {k: n for k, n in counts.items() if k not in (FAST_PATH, GENERAL_PATH)}
    return Frames.of(batch).spans, {**counts, **resolver.counts}


def assert_same_as_general(body: bytes) -> bool:
    """Whether the fast path took the request; when it did, the general path must agree row for row."""
    fast = fast_rows(body)
    if fast is None:
        return False
    ExportTraceServiceRequest.FromString(body)  # the protobuf runtime must accept what the fast path took
    general = general_rows(body)
    assert fast[0].equals(general[0]), (fast[0], general[0])
    assert fast[1] == general[1]
    return True


# --- requests as the SDKs write them, with every kind of value --------------------------------------------

# Envoy's node ids (Istio's TYPE~IP~POD.NS~NS.svc.DOMAIN and near misses), its canonical-service naming, and
# its status codes written as text.
node_ids = st.builds(lambda kind, ip, pod, ns, dot, domain: f"{kind}~{ip}~{pod}{dot}~{ns}{domain}",
                     st.sampled_from(["sidecar", "router", "waypoint", ""]), st.sampled_from(["10.4.1.7", "", "~"]),
                     st.sampled_from(["ratings-v1-5f9c", "", "x.y", "é" * 260]),
                     st.sampled_from(["bookinfo", "", "."]),
                     st.sampled_from([".bookinfo", "", ".other", "."]),
                     st.sampled_from([".svc.cluster.local", "", "~x"]))
# Envoy's upstream clusters: Istio's DIRECTION|PORT|SUBSET|HOST, and near misses.
clusters = st.builds(lambda direction, port, subset, host, extra: f"{direction}|{port}|{subset}|{host}{extra}",
                     st.sampled_from(["outbound", "inbound", "Outbound", "", "outbound_"]),
                     st.sampled_from(["7070", "", "|"]), st.sampled_from(["", "v1", "é"]),
                     st.sampled_from(["cartservice.default.svc.cluster.local", "cartservice", "", ".x", "é" * 260,
                                      "a" * 250 + ".b", "api.example.com"]),
                     st.sampled_from(["", "|x", "."]))
texts = st.one_of(st.sampled_from(["standard", "p99-latency-critical", " standard ", "", "gpu-node-1", "/v1/chat",
                                   "200", "503", "0404", "1000", "２００", " 200", "ratings", "ratings.bookinfo",
                                   "istio-proxy", "unknown_service:envoy", "ratings.", "PassthroughCluster",
                                   "outbound_.9080_.v1_.reviews.bookinfo.svc.cluster.local"]),
                  node_ids, clusters, st.text(max_size=300))
scalars = st.one_of(
    st.builds(lambda v: AnyValue(string_value=v), texts),
    st.builds(lambda v: AnyValue(int_value=v), st.one_of(st.sampled_from([200, 404, 500, 503, 999, 1000, -1]),
                                                         st.integers(-2**63, 2**63 - 1))),
    st.builds(lambda v: AnyValue(bool_value=v), st.booleans()),
    st.builds(lambda v: AnyValue(double_value=v), st.floats()),
    st.builds(lambda v: AnyValue(bytes_value=v), st.binary(max_size=20)),
    st.just(AnyValue()),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.builds(lambda vs: AnyValue(array_value=ArrayValue(values=vs)), st.lists(inner, max_size=3)),
    st.builds(lambda kvs: AnyValue(kvlist_value=KeyValueList(values=kvs)),
              st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v), st.sampled_from(KEYS), inner), max_size=3))),
    max_leaves=12)
one_string_arrays = st.builds(lambda v: AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v)])), texts)
attributes = st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v), st.sampled_from(KEYS),
                                st.one_of(scalars, scalars, one_string_arrays, values)), max_size=8)
# What a span says it called, mostly as text: the keys in turn decide, so several are often given at once.
text_values = st.builds(lambda v: AnyValue(string_value=v), st.one_of(texts, clusters))
peer_attributes = st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v), st.sampled_from(PEER_KEYS),
                                     st.one_of(text_values, text_values, scalars)), max_size=4)


def plain_attribute(key: str):
    """An attribute of a value the receiver reads without refusing the span or declining: a status code as an
    integer or digits, a tier header as text, anything else as text, an integer, a boolean or a one-string array."""
    if key in STATUS_KEYS:
        value = st.one_of(st.builds(lambda v: AnyValue(int_value=v), st.sampled_from([200, 404, 503, 999])),
                          st.builds(lambda v: AnyValue(string_value=v), st.sampled_from(["200", "0503", "0"])))
    elif key in TIER_KEYS:
        value = st.one_of(text_values, one_string_arrays)
    else:
        value = st.one_of(text_values, one_string_arrays,
                          st.builds(lambda v: AnyValue(int_value=v), st.integers(-2**63, 2**63 - 1)),
                          st.builds(lambda v: AnyValue(bool_value=v), st.booleans()))
    return st.builds(lambda v: KeyValue(key=key, value=v), value)


plain_attributes = st.lists(st.sampled_from(KEYS + PEER_KEYS).flatmap(plain_attribute), max_size=10)


# Ids, times and kinds: the valid ones, then those the receiver refuses (drawn only for spans not `valid`).
KINDS = ([SERVER, SERVER, SERVER, Span.SPAN_KIND_CLIENT, Span.SPAN_KIND_CLIENT, 0, Span.SPAN_KIND_INTERNAL,
          Span.SPAN_KIND_PRODUCER, Span.SPAN_KIND_CONSUMER], [6, 9])
PARENTS = ([b"", b"", b"", bytes(8), b"\x07" * 8, bytes(7) + b"\x01"], [b"\x07" * 7, b"\x07" * 9, b"\x07" * 16])


@st.composite
def spans(draw, index: int, valid: bool):
    def pick(choices: tuple[list, list]):
        return draw(st.sampled_from(choices[0] if valid else choices[0] + choices[1]))

    start = pick(([T0 + index], [0, 2**63 + 5]))
    span = Span(trace_id=pick(([bytes(15) + bytes([index % 250 + 1])], [b"\x01" * 15])),
                span_id=bytes(7) + bytes([index % 250 + 1]), name=draw(texts), kind=pick(KINDS),
                parent_span_id=pick(PARENTS), start_time_unix_nano=start,
                end_time_unix_nano=start + pick(([10**6, 0], [2**62])) if start else T0,
                attributes=draw(plain_attributes) if valid else draw(attributes) + draw(peer_attributes),
                flags=draw(st.sampled_from([0, 0x100, 0x301])),
                status=Status(code=draw(st.sampled_from([0, 1, 2])), message=draw(st.sampled_from(["", "boom"]))))
    if draw(st.booleans()):
        span.events.add(time_unix_nano=start, name="exception", attributes=draw(attributes))
        span.links.add(trace_id=b"\x02" * 16, span_id=b"\x03" * 8, trace_state="k=v", attributes=draw(attributes))
    return span


@st.composite
def requests(draw):
    """Requests of any spans, or (half of them) of spans with valid ids, times and kinds and plain attributes,
    which the fast path mostly takes."""
    request = ExportTraceServiceRequest()
    valid = draw(st.booleans())
    for _ in range(draw(st.integers(1, 3))):
        block = request.resource_spans.add(
            schema_url=draw(st.sampled_from(["", "https://opentelemetry.io/schemas/1.26.0"])))
        if draw(st.integers(0, 4)):
            block.resource.attributes.extend(draw(plain_attributes if valid else attributes))
            block.resource.attributes.add(key=draw(st.sampled_from(["host.name", "k8s.node.name", "hw.id", "x"])),
                                          value=AnyValue(string_value=draw(texts)))
        for _ in range(draw(st.integers(1, 2))):
            scope = block.scope_spans.add()
            scope.scope.name, scope.scope.version = "opentelemetry.instrumentation.fastapi", "0.48b0"
            scope.spans.extend(draw(spans(i, valid)) for i in range(draw(st.integers(0, 4))))
    return request


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_what_the_fast_path_takes_it_reads_as_the_general_decoder(request):
    body = request.SerializeToString()
    if not assert_same_as_general(body):
        with pytest.raises((DecodeError, LeftToGeneralPath)):
            _refused_in_part(body)
            _left_to_general_path(request)


class LeftToGeneralPath(Exception):
    """A reason the fast path leaves a request to the general decoder: a span it refuses, or a valid request with
    what only it reads."""


def _refused_in_part(body: bytes):
    """Raise LeftToGeneralPath when the general decoder refuses some of the spans (a partial success)."""
    refused = sorted(k for k in general_rows(body)[1] if k in REFUSAL_REASONS)
    if refused:
        raise LeftToGeneralPath(f"the general path refuses {refused}")


RESOURCE_KEYS = {"service.name", "k8s.node.name", "host.name", "hw.id", "k8s.pod.name", "k8s.namespace.name",
                 "k8s.pod.ip"}
SPAN_KEYS = {k.decode() for k in otlp_spans.SLOT_KEYS} - {"service.name"}
STATUS_KEYS = {"http.response.status_code", "http.status_code"}
TIER_KEYS = {"http.request.header.x-slo-tier", "slo.tier"}


def _left_to_general_path(request):
    """Raise LeftToGeneralPath when a valid request has what the fast path leaves to the general decoder (so
    that its declining was right); a request without any is one it should have taken."""
    for block in request.resource_spans:
        for kv in block.resource.attributes:
            _check_value(kv, kv.key in RESOURCE_KEYS)
        for scope in block.scope_spans:
            for span in scope.spans:
                for kv in span.attributes:
                    _check_value(kv, kv.key in SPAN_KEYS)
                    kind = kv.value.WhichOneof("value")
                    if kv.key in STATUS_KEYS and kind not in (None, "int_value") and not _digits(kv.value):
                        raise LeftToGeneralPath("a status code that is neither an integer nor decimal digits")
                    if kv.key in TIER_KEYS and kind not in (None, "string_value") and not _one_string(kv.value):
                        raise LeftToGeneralPath("a tier header that is not one string")
                for kv in [*(a for e in span.events for a in e.attributes),
                           *(a for link in span.links for a in link.attributes)]:
                    _check_value(kv, False)
    raise AssertionError("the fast path declined a request it should take")


def _check_value(kv, kept: bool):
    kind = kv.value.WhichOneof("value")
    if kept and kind in ("array_value", "kvlist_value") and not _one_string(kv.value):
        raise LeftToGeneralPath("a structure where a name belongs")
    if kept and kind in ("bytes_value", "double_value"):
        raise LeftToGeneralPath("a value the general path turns into text")
    if _depth(kv.value) > 16:
        raise LeftToGeneralPath("nested deeper than the fast path reads")


def _digits(value) -> bool:
    text = value.string_value
    return value.WhichOneof("value") == "string_value" and text.isascii() and text.isdigit()


def _one_string(value) -> bool:
    items = value.array_value.values
    return (value.WhichOneof("value") == "array_value" and len(items) == 1
            and items[0].WhichOneof("value") == "string_value")


def _depth(value, depth: int = 0) -> int:
    kind = value.WhichOneof("value")
    children = value.array_value.values if kind == "array_value" else (
        [kv.value for kv in value.kvlist_value.values] if kind == "kvlist_value" else [])
    return max((_depth(child, depth + 1) for child in children), default=depth)


# --- what SDKs send is taken ------------------------------------------------------------------------------


def sdk_like_request(spans: int = 50) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    block = request.resource_spans.add(schema_url="https://opentelemetry.io/schemas/1.26.0")
    for key, value in (("service.name", "llm-gateway"), ("k8s.node.name", "gpu-node-3"), ("k8s.pod.name", "gw-7f9c"),
                       ("k8s.namespace.name", "inference"), ("telemetry.sdk.language", "python")):
        block.resource.attributes.add(key=key, value=AnyValue(string_value=value))
    scope = block.scope_spans.add()
    scope.scope.name = "opentelemetry.instrumentation.fastapi"
    for i in range(spans):
        span = scope.spans.add(trace_id=random.Random(i).randbytes(16), span_id=random.Random(-i).randbytes(8),
                               parent_span_id=b"\x07" * 8, name="POST /v1/chat/completions", kind=SERVER,
                               start_time_unix_nano=T0 + i, end_time_unix_nano=T0 + i + 25 * 10**6, flags=0x100,
                               status=Status(code=2 if i % 7 == 0 else 0))
        span.attributes.add(key="http.route", value=AnyValue(string_value="/v1/chat/completions"))
        span.attributes.add(key="http.response.status_code", value=AnyValue(int_value=503 if i % 5 == 0 else 200))
        header = AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="p99-latency-critical")]))
        span.attributes.add(key="http.request.header.x-slo-tier",
                            value=header if i % 2 else AnyValue(string_value="bogus"))
        span.events.add(time_unix_nano=T0 + i, name="first_token",
                        attributes=[KeyValue(key="n", value=AnyValue(int_value=1))])
    client = scope.spans.add(trace_id=random.Random(0).randbytes(16), span_id=b"\x02" * 8,
                             parent_span_id=random.Random(0).randbytes(8), name="GET", kind=Span.SPAN_KIND_CLIENT,
                             start_time_unix_nano=T0, end_time_unix_nano=T0 + 1)
    for key, value in (("net.peer.name", "old-name"), ("server.address", "model-cache.inference")):
        client.attributes.add(key=key, value=AnyValue(string_value=value))
    return request


def test_the_extension_is_built():
    assert otlp_spans.available(), "collectors/_otlp_spans was not compiled (is gcc installed?)"


def test_an_sdk_request_takes_the_fast_path_with_the_same_rows():
    body = sdk_like_request().SerializeToString()
    assert assert_same_as_general(body)
    rows, counts = fast_rows(body)
    requests = rows.filter(rows["kind"] == SPAN_KIND_SERVER)
    assert len(rows) == 51 and len(requests) == 50 and counts["tier_invalid"] == 25 and counts["tier_missing"] == 1
    assert "spans_not_server" not in counts
    assert requests["failed"].sum() == len([i for i in range(50) if i % 7 == 0 or i % 5 == 0])
    assert set(requests["parent_id"]) == {0x0707070707070707} and requests["peer"].null_count() == 50
    client = rows.filter(rows["kind"] == SPAN_KIND_CLIENT).row(0, named=True)
    assert client["parent_id"] == requests["span_id"][0] and client["peer"] == "model-cache.inference"


def test_a_request_without_spans_gives_an_empty_frame_of_the_spans_shape():
    request = ExportTraceServiceRequest()
    request.resource_spans.add().scope_spans.add()
    body = request.SerializeToString()
    assert assert_same_as_general(body)
    rows, counts = fast_rows(body)
    assert rows.is_empty() and not counts
    assert tuple(rows.columns) == SPAN_COLUMNS
    assert rows.schema == general_rows(sdk_like_request().SerializeToString())[0].schema


def test_the_columns_are_handed_over_once_and_outlive_the_decoder():
    body = sdk_like_request().SerializeToString()
    table, _ = otlp_spans.spans_and_counts(body)
    with pytest.raises(ValueError, match="3 tiers expected"):
        table.batch(["standard"])
    resolve_tiers(table, TierResolver(TIERS, "standard"))
    frame = Frames.of(Batch(spans=table)).spans
    with pytest.raises(ValueError, match="taken already"):
        table.batch(table.tiers)
    del table
    gc.collect()
    expected, _ = general_rows(body)
    assert frame.equals(expected)


def _declines_and_general_says(body: bytes, error: str | None = None, refused: str | None = None):
    """The fast path declines; the general path refuses the request (error), refuses one span of it (refused:
    the reason), or reads it whole."""
    assert fast_rows(body) is None
    if error is not None:
        with pytest.raises(DecodeError, match=error):
            general_rows(body)
        return
    rows, counts = general_rows(body)
    refusals = {k: n for k, n in counts.items() if k in REFUSAL_REASONS}
    assert refusals == ({refused: 1} if refused else {})
    assert len(rows) == 4 - bool(refused)  # of sdk_like_request(3): three SERVER spans and a CLIENT one


def test_what_it_declines_the_general_path_decides():
    good = sdk_like_request(3)
    _declines_and_general_says(good.SerializeToString() + b"\x98\x06\x01")  # an unknown field (99)
    short_id = sdk_like_request(3)
    short_id.resource_spans[0].scope_spans[0].spans[0].trace_id = b"\x01" * 15
    _declines_and_general_says(short_id.SerializeToString(), refused="spans_invalid_id")
    backwards = sdk_like_request(3)
    backwards.resource_spans[0].scope_spans[0].spans[0].end_time_unix_nano = T0 - 1
    _declines_and_general_says(backwards.SerializeToString(), refused="spans_invalid_time")
    text_status = sdk_like_request(3)
    text_status.resource_spans[0].scope_spans[0].spans[0].attributes.add(
        key="http.response.status_code", value=AnyValue(string_value="200 OK"))  # the last one wins
    _declines_and_general_says(text_status.SerializeToString(), refused="spans_invalid_status_code")
    bad_utf8 = good.SerializeToString().replace(b"POST /v1/chat", b"POST /v1/ch\xff\xfe")
    _declines_and_general_says(bad_utf8, error="not a valid")
    alone = sdk_like_request(1)
    del alone.resource_spans[0].scope_spans[0].spans[1]  # the CLIENT span, which is good
    alone.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x01" * 7
    _declines_and_general_says(alone.SerializeToString(), error="spans_invalid_id")  # nothing good: a 400


def test_a_singular_field_written_twice_is_left_to_the_general_path():
    block = sdk_like_request(2).resource_spans[0]
    resource = block.resource.SerializeToString()
    # ResourceSpans.resource again
    block_bytes = block.SerializeToString() + b"\x0a" + _varint(len(resource)) + resource
    body = b"\x0a" + _varint(len(block_bytes)) + block_bytes
    assert fast_rows(body) is None
    assert len(general_rows(body)[0]) == 3  # protobuf merges the two resources; the general path reads that


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


# --- every kind, with its parent and what it called -------------------------------------------------------


def request_of(*spans: dict) -> ExportTraceServiceRequest:
    """One trace's spans, each given by what differs from a plain SERVER span (attributes as a dict of text or
    AnyValue values)."""
    request = ExportTraceServiceRequest()
    block = request.resource_spans.add()
    block.resource.attributes.add(key="service.name", value=AnyValue(string_value="frontend"))
    scope = block.scope_spans.add()
    for i, fields in enumerate(spans):
        attributes = [KeyValue(key=k, value=v if isinstance(v, AnyValue) else AnyValue(string_value=v))
                      for k, v in fields.get("attributes", {}).items()]
        scope.spans.append(Span(**{"trace_id": b"\x01" * 16, "span_id": (i + 1).to_bytes(8, "big"), "name": "GET /",
                                   "kind": SERVER, "start_time_unix_nano": T0 + i, "end_time_unix_nano": T0 + i + 10**6,
                                   **fields, "attributes": attributes}))
    return request


def read_alike(request: ExportTraceServiceRequest, fast: bool = True):
    """(spans frame, counters) of the general decoder, which the fast path (it must take the request when `fast`,
    else decline it) and the same request as OTLP/JSON must give too."""
    body = request.SerializeToString()
    general = general_rows(body)
    assert assert_same_as_general(body) == fast
    as_json = json_rows(body)
    assert as_json[0].equals(general[0]), (as_json[0], general[0])
    assert as_json[1] == general[1]
    return general


def test_every_kind_is_kept_and_an_unspecified_one_as_internal():
    rows, counts = read_alike(request_of(*({"kind": kind} for kind in range(6))))
    assert rows["kind"].to_list() == [SPAN_KIND_INTERNAL, SPAN_KIND_INTERNAL, 2, 3, 4, 5]
    assert not {k: n for k, n in counts.items() if k.startswith("spans_")}


@pytest.mark.parametrize("kind", [6, 9, 2**31 - 1, -1])
def test_a_kind_otlp_does_not_define_refuses_the_span_alone(kind):
    rows, counts = read_alike(request_of({"kind": kind}, {"kind": Span.SPAN_KIND_CLIENT}), fast=False)
    assert rows["kind"].to_list() == [SPAN_KIND_CLIENT] and counts["spans_invalid"] == 1


def test_parent_ids_are_words_and_a_root_has_none():
    parents = [b"", bytes(8), b"\x80" + bytes(6) + b"\x01", b"\x07" * 8]
    rows, _ = read_alike(request_of(*({"parent_span_id": parent} for parent in parents)))
    assert rows["parent_id"].to_list() == [None, None, 0x8000000000000001, 0x0707070707070707]


@pytest.mark.parametrize("parent", [b"\x07" * 7, b"\x07" * 9, b"\x07" * 16, b"\x07"])
def test_a_parent_id_not_8_bytes_refuses_the_span_alone(parent):
    rows, counts = read_alike(request_of({"parent_span_id": parent}, {}), fast=False)
    assert len(rows) == 1 and counts["spans_invalid_id"] == 1


@pytest.mark.parametrize("given, expected", [
    ("A1B2C3D4E5F60718", 0xA1B2C3D4E5F60718), ("", None), (None, None), ("0000000000000000", None)])
def test_json_parent_ids(given, expected):
    doc = traces([{**span(TRACE, SPAN, T0, 5, kind=3), "parentSpanId": given}])
    rows, counts = _rows(*Decoders().decode("traces", json.dumps(doc).encode(), True))
    assert rows["parent_id"].to_list() == [expected] and not counts.get("spans_invalid_id")


@pytest.mark.parametrize("given", ["a1b2c3d4e5f607", "a1b2c3d4e5f6071g", "a1b2c3d4e5f60718a1", 7,
                                   ["a1b2c3d4e5f60718"]])
def test_a_json_parent_id_not_16_hex_digits_refuses_the_span_alone(given):
    doc = traces([{**span(TRACE, SPAN, T0, 5), "parent_span_id": given}, span(TRACE, "b" * 16, T0, 5)])
    rows, counts = _rows(*Decoders().decode("traces", json.dumps(doc).encode(), True))
    assert len(rows) == 1 and counts["spans_invalid_id"] == 1


CART = "outbound|7070||cartservice.default.svc.cluster.local"


@pytest.mark.parametrize("attributes, expected", [
    ({}, None),
    ({"peer.service": "cart", "upstream_cluster": CART, "server.address": "10.0.0.1", "net.peer.name": "old"},
     "cart"),
    ({"upstream_cluster": CART, "server.address": "10.0.0.1", "net.peer.name": "old"}, "cartservice"),
    ({"server.address": "api.example.com", "net.peer.name": "old"}, "api.example.com"),
    ({"net.peer.name": "redis-master"}, "redis-master"),
    ({"upstream_cluster": "inbound|9080||", "server.address": "10.0.0.1"}, "10.0.0.1"),  # inbound names none
    ({"peer.service": "", "upstream_cluster": "", "server.address": "vllm"}, "vllm"),  # empty: nothing named
    ({"peer.service": AnyValue(int_value=5), "net.peer.name": "redis"}, "redis"),  # not text: nothing named
    ({"peer.service": AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="cart")])),
      "server.address": "vllm"}, "vllm"),
    ({"peer.service": "p" * 300}, "p" * 253),
    ({"server.address": "é" * 300}, "é" * 253),
], ids=["none", "peer.service first", "then upstream_cluster", "then server.address", "then net.peer.name",
        "an inbound cluster", "empty", "an integer", "a one-string array", "long", "long in UTF-8"])
def test_the_peer_is_the_first_attribute_that_names_one(attributes, expected):
    rows, _ = read_alike(request_of({"kind": Span.SPAN_KIND_CLIENT, "attributes": attributes}))
    assert rows["peer"].to_list() == [expected]


def test_a_peer_given_on_any_kind_is_kept():
    rows, _ = read_alike(request_of(*({"kind": kind, "attributes": {"peer.service": "cart"}} for kind in range(6))))
    assert rows["peer"].to_list() == ["cart"] * 6


@pytest.mark.parametrize("cluster, expected", [
    (CART, "cartservice"),
    ("outbound|9080|v2|reviews.bookinfo.svc.cluster.local", "reviews"),  # a subset
    ("outbound|80||httpbin", "httpbin"),
    ("outbound|9080||" + "r" * 300 + ".svc.cluster.local", "r" * 253),
    ("inbound|9080||", None),
    ("inbound|9080|http|reviews.bookinfo.svc.cluster.local", None),  # an older Istio's inbound cluster
    ("outbound|9080||", None),
    ("outbound|9080||.svc", None),
    ("PassthroughCluster", "PassthroughCluster"),  # Istio's other clusters, plain Envoy's own names: as they are
    ("backend_service", "backend_service"),
    *((srv, srv) for srv in ["outbound_.9080_.v1_.reviews.bookinfo.svc.cluster.local"]),  # not a cluster's name form
    ("outbound|9080||reviews|x", "outbound|9080||reviews|x"),
    ("Outbound|9080||reviews", "Outbound|9080||reviews"),
    ("a|b|c|d", "a|b|c|d"),
    ("c" * 300, "c" * 253),
])
def test_envoy_upstream_clusters(cluster, expected):
    rows, _ = read_alike(request_of({"kind": Span.SPAN_KIND_CLIENT, "attributes": {"upstream_cluster": cluster}}))
    assert rows["peer"].to_list() == [expected]


# --- mutated bytes: never taken when the runtime refuses them --------------------------------------------


@settings(max_examples=1500, deadline=None)
@given(st.data())
def test_mutated_requests_are_declined_or_read_exactly(data):
    body = bytearray(sdk_like_request(data.draw(st.integers(1, 4))).SerializeToString())
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(body) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        if action == "flip":
            body[at] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "cut":
            del body[at:]
        elif action == "insert":
            body[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif len(body) > 1:
            del body[at]
        if not body:
            break
    body = bytes(body)
    try:
        ExportTraceServiceRequest.FromString(body)
        general_rows(body)
    except Exception:  # the runtime or the receiver refuses it: the fast path must leave it to the general path
        assert fast_rows(body) is None
        return
    assert_same_as_general(body)


# --- the edges of the wire format, where the runtime draws them ---------------------------------------------


def _padded_varint(value: int, width: int) -> bytes:
    """value as a varint of exactly `width` bytes (over-long, as a lax encoder may write it)."""
    return bytes((value >> 7 * k) & 0x7F | (0x80 if k < width - 1 else 0) for k in range(width))


@pytest.mark.parametrize("width", range(1, 8))
def test_over_long_tags_and_lengths_are_taken_exactly_where_the_runtime_takes_them(width):
    body = sdk_like_request(2).SerializeToString()
    length, length_end = 0, 1
    while True:  # the first field: tag 0x0a, then its length
        length |= (body[length_end] & 0x7F) << 7 * (length_end - 1)
        length_end += 1
        if body[length_end - 1] < 0x80:
            break
    for variant in (_padded_varint(0x0A, width) + body[1:],
                    body[:1] + _padded_varint(length, max(width, length_end - 1)) + body[length_end:]):
        try:
            ExportTraceServiceRequest.FromString(variant)
        except Exception:
            assert fast_rows(variant) is None
        else:
            assert assert_same_as_general(variant)


def test_an_absent_value_counts_as_a_level_of_nesting():
    """A list entry without a value reads as an empty value one level down: nine levels is one too many."""
    deep = AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="leaf")]))  # the leaf's value is absent
    for _ in range(8):
        deep = AnyValue(array_value=ArrayValue(values=[deep]))
    request = sdk_like_request(1)
    request.resource_spans[0].resource.attributes.add(key="deep", value=deep)
    _declines_and_general_says(request.SerializeToString(), "nested deeper than 8")


def test_the_store_counts_requests_by_the_decoder_that_read_them(tmp_path):
    from tests.in_process import InProcessReceiver

    server = InProcessReceiver(tmp_path / "r.duckdb")
    try:
        taken = sdk_like_request(3).SerializeToString()
        declined = taken + b"\x98\x06\x01"  # an unknown field: the general decoder reads it
        assert [server.post("/v1/traces", body)[0] for body in (taken, taken, declined)] == [200, 200, 200]
        server.writer.stop()
        counters = server.store.counters()
        assert counters["trace_requests_fast_path"] == 2 and counters["trace_requests_general_path"] == 1
    finally:
        server.close()

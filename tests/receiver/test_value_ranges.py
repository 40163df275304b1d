"""Values outside their metric's range are refused at intake, point by point, counted (points_out_of_range): past
what OTLP's 64-bit integers hold, a ratio or percentage far outside its scale, a counter's negative increase; the
rest of the request is kept. Whatever is stored, every JSON answer stays JSON (no NaN, no Infinity)."""

import json
import math

import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from sloscope import json_answers
from sloscope.receiver.server import Decoders
from tests.otlp_builders import counter, gauge, metrics

T0 = 1_764_410_400_000_000_000
S = 10**9
CPU = [0.3, 1e308, 5.0, -3.0, 0.9, 1.5]  # a ratio: 1e308, 5 and -3 are far outside [0, 1]
TEMPERATURE = [60.0, 1e19, -1e19, 9.2e18]  # degrees: only what no 64-bit integer holds is refused
ERRORS = [3, -5, 0]  # a counter's increases (delta)


def _request() -> dict:
    return metrics([gauge("system.cpu.utilization", [(T0 + i * S, v) for i, v in enumerate(CPU)], {"state": "user"}),
                    gauge("hw.gpu.temperature", [(T0 + i * S, v) for i, v in enumerate(TEMPERATURE)]),
                    counter("system.network.errors", T0, [(T0 + (i + 1) * S, v) for i, v in enumerate(ERRORS)],
                            {"direction": "receive"}, temporality=1)])


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_values_outside_their_range_are_refused_one_by_one(encoding):
    doc = _request()
    body = json.dumps(doc).encode() if encoding == "json" else ParseDict(
        doc, ExportMetricsServiceRequest()).SerializeToString()
    batch, counts = Decoders().decode("metrics", body, encoding == "json")
    kept = {}
    for metric, value in zip(batch.points.metric, batch.points.value):
        kept.setdefault(metric, []).append(value)
    assert kept == {"system.cpu.utilization": [0.3, 0.9, 1.5], "hw.gpu.temperature": [60.0, 9.2e18],
                    "system.network.errors": [3.0, 0.0]}
    assert counts["points_out_of_range"] == 6


def test_every_json_answer_is_json_whatever_it_holds():
    answer = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": ({"d": math.nan},), "e": "NaN"}
    text = json_answers.dumps(answer, indent=1)
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in {text}")) == {
        "a": None, "b": [None, None, 1.5], "c": [{"d": None}], "e": "NaN"}

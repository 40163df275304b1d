"""Metrics an SLO spec declares as evidence: what the spec accepts and refuses (naming the YAML line), what the
decoders then keep, and the causes it adds in the rules."""

import shutil
import subprocess

import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from sloscope.alerts.rules import NOTIFY, alert_names, rules_dict
from sloscope.commands.cli import main
from sloscope.receiver.otlp_json import Decoder
from sloscope.receiver.server import Decoders
from sloscope import catalog, taxonomy
from sloscope.records import HISTOGRAM_OFFSET
from sloscope.slo_spec import SpecError, parse_spec
from tests.conftest import need
from tests.declared_specs import BOUNDS, QUEUE, QUEUE_TIME, TIERS
from tests.otlp_builders import attr
from tests.receiver_otlp import cumulative, explicit_histogram, gauge, prometheus_scrape

DECLARED = TIERS + """\
causes:
  batch_queue:
    layer: runtime
    physical: requests wait in the inference server's queue (its batch is full)
    remediation: add inference replicas beside {node}, or lower their max batch size
    explained_by: [gpu_sm_contention]
  cache_thrash:
    layer: gpu
    physical: the KV cache is full, so the server preempts and recomputes sequences
    remediation: give the model on {node} more KV cache blocks
evidence:
  - metric: "myllm:requests_waiting"
    cause: batch_queue
    harmful: up
    threshold: 16
    noise_floor: 1
  - metric: myllm_queue_duration_us
    cause: batch_queue
    harmful: up
    where: {model: resnet50}
  - metric: "myllm:cache_usage_ratio"
    cause: cache_thrash
    harmful: up
    threshold: 0.95
  - metric: "myllm:cache_usage_ratio"
    cause: gpu_memory_leak
    harmful: up
"""
T0 = 1_764_410_400_000_000_000


def test_a_spec_adds_its_causes_and_evidence_to_the_taxonomy():
    known = parse_spec(DECLARED).taxonomy
    queue = known.by_id["batch_queue"]
    assert [ev.signal for ev in queue.evidence] == ["myllm:requests_waiting", "myllm_queue_duration_us"]
    assert {ev.producer for ev in queue.evidence} == {taxonomy.SPEC_PRODUCER}
    assert queue.evidence[1].where == (("model", "resnet50"),)
    assert queue.seed_threshold == {"myllm:requests_waiting": 16.0} and queue.explained_by == ("gpu_sm_contention",)
    # evidence for a built-in cause is added to its own
    leak = known.by_id["gpu_memory_leak"]
    assert leak.evidence[:-1] == taxonomy.BY_ID["gpu_memory_leak"].evidence
    assert leak.evidence[-1].signal == "myllm:cache_usage_ratio"
    assert known.declared_metrics == {"myllm:requests_waiting", "myllm_queue_duration_us",
                                      "myllm:cache_usage_ratio"}
    assert known.reading("myllm:requests_waiting") == (catalog.Direction.UP, 1.0)
    assert set(known.by_id) == set(taxonomy.CAUSE_IDS) | {"batch_queue", "cache_thrash"}


def test_a_spec_without_declarations_has_the_built_in_taxonomy():
    assert parse_spec(TIERS).taxonomy is taxonomy.BUILT_IN


def _error(text: str) -> str:
    with pytest.raises(SpecError) as exc:
        parse_spec(text, "slo.yaml")
    return str(exc.value)


@pytest.mark.parametrize("evidence, line, complaint", [
    ("  - {metric: 'vllm:x', cause: batch_queue, harmful: up}\n  - {metric: 'vllm:y', cause: nowhere, "
     "harmful: up}\n", 10, "unknown cause 'nowhere'"),
    ("  - metric: 'vllm:x'\n    cause: batch_queue\n    harmful: upward\n", 11, "expected up or down"),
    ("  - {metric: '9lives', cause: batch_queue, harmful: up}\n", 9, "not a valid OTLP or Prometheus"),
    ("  - {metric: 'vllm x', cause: batch_queue, harmful: up}\n", 9, "not a valid OTLP or Prometheus"),
    ("  - {metric: 'vllm:x', cause: batch_queue, harmful: up}\n  - metric: 'vllm:x'\n"
     "    cause: batch_queue\n    harmful: up\n", 10, "declared for batch_queue twice (first on line 9)"),
    ("  - metric: 'vllm:x'\n    cause: batch_queue\n    harmful: up\n    threshold: lots\n", 12,
     "threshold: expected a number"),
    ("  - metric: 'vllm:x'\n    cause: batch_queue\n    harmful: up\n    noise_floor: -1\n", 12,
     "noise_floor: expected a number of at least 0"),
    ("  - {metric: system.cpu.utilization, cause: batch_queue, harmful: up}\n", 9, "is a catalog signal"),
    ("  - {metric: 'vllm:x', cause: batch_queue, harmful: up}\n  - {metric: 'vllm:x', cause: disk_io, "
     "harmful: down}\n", 10, "declared with two readings"),
])
def test_an_invalid_declaration_is_refused_naming_its_line(evidence, line, complaint):
    message = _error(TIERS + QUEUE + "evidence:\n" + evidence)
    assert message.startswith(f"slo.yaml:{line}: ") and complaint in message, message


@pytest.mark.parametrize("causes, line, complaint", [
    ("  disk_io: {layer: storage, physical: disk, remediation: x}\n", 7, "is a built-in cause"),
    ("  Inference-Queue: {layer: runtime, physical: q, remediation: x}\n", 7, "cause ids are lower-case"),
    ("  batch_queue: {layer: runtime, physical: q, remediation: 'scale {pod}'}\n", 7,
     "only {node} may stand in braces"),
    ("  batch_queue: {layer: runtime, physical: q, remediation: x, explained_by: [nowhere]}\n", 7,
     "unknown cause 'nowhere'"),
    ("  batch_queue: {layer: runtime, physical: q, remediation: x}\n"
     "  idle_cause: {layer: runtime, physical: q, remediation: x}\n", 8, "no evidence names it"),
    ("  batch_queue: {layer: runtime, remediation: x}\n", 7, "missing key 'physical'"),
])
def test_an_invalid_cause_is_refused_naming_its_line(causes, line, complaint):
    message = _error(TIERS + "causes:\n" + causes + "evidence:\n  - {metric: 'vllm:x', cause: batch_queue, "
                     "harmful: up}\n")
    assert message.startswith(f"slo.yaml:{line}: ") and complaint in message, message


def test_a_key_given_twice_is_refused_with_its_line_rather_than_the_last_winning():
    message = _error(TIERS + QUEUE + "evidence:\n  - metric: 'vllm:x'\n    cause: batch_queue\n"
                     "    harmful: up\n    harmful: down\n")
    assert message.startswith("slo.yaml:12: not valid YAML: duplicate key 'harmful' (first on line 11)"), message


VLLM = prometheus_scrape("10.4.2.31:8000", [
    gauge("myllm:requests_waiting", "", [(T0, 21.0)], {"model_name": "llama-3.1-8b"}),
    gauge("myllm:requests_running", "", [(T0, 64.0)], {"model_name": "llama-3.1-8b"}),
    cumulative("myllm_queue_duration_us", "", T0 - 10**12, [(T0, 4.2e9)],
               {"model": "resnet50", "version": "1"}),
], job="vllm", times=[T0])


def test_the_decoders_keep_the_declared_metrics_and_only_them():
    declared = parse_spec(DECLARED).taxonomy.declared_metrics
    kept = Decoder(declared=declared).decode(VLLM).points
    assert set(kept.metric) == {"myllm:requests_waiting", "myllm_queue_duration_us"}
    by_name = dict(zip(kept.metric, zip(kept.is_sum, kept.cumulative)))
    assert by_name == {"myllm:requests_waiting": (False, False), "myllm_queue_duration_us": (True, True)}
    body = ParseDict(VLLM, ExportMetricsServiceRequest()).SerializeToString()
    batch, skips = Decoders(declared).decode("metrics", body, False)
    assert sorted(batch.points.metric) == sorted(kept.metric) and skips["points_not_in_catalog"] == 3
    assert not Decoder().decode(VLLM).points.metric  # without the spec, they are not kept


def test_the_rules_alert_on_declared_causes_like_the_built_in_ones():
    spec = parse_spec(DECLARED)
    names = alert_names(spec)
    assert {"SloscopeCauseBatchQueue", "SloscopeCauseCacheThrash"} <= set(names)
    assert set(alert_names(parse_spec(TIERS))) == set(names) - {"SloscopeCauseBatchQueue",
                                                                 "SloscopeCauseCacheThrash"}
    rule = next(r for g in rules_dict(spec)["groups"] for r in g.get("rules", [])
                if r.get("alert") == "SloscopeCauseBatchQueue")
    assert rule["labels"]["cause"] == "batch_queue" and rule["labels"]["action"] == NOTIFY
    assert 'cause="batch_queue"' in rule["expr"]
    assert rule["annotations"]["runbook_url"].endswith("runbooks.md#declared-causes")
    assert rule["annotations"]["remediation"].startswith("Add inference replicas beside {{ $labels.node }}")


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_a_declared_histogram_keeps_its_count_and_sum_with_its_buckets_on_the_stores_scale(encoding):
    request = prometheus_scrape("10.4.2.31:8000", [
        explicit_histogram("myllm:queue_time_seconds", T0 - 10**12,
                           [(T0, 19.5, BOUNDS, [3, 4, 0, 2, 0, 0, 1])], {"model_name": "llama-3.1-8b"}),
        explicit_histogram("myllm:queue_time_seconds", T0 - 10**12,
                           [(T0, None, BOUNDS, [1, 0, 0, 0, 0, 0, 0])], {"model_name": "other"}),
    ], job="vllm")
    declared = parse_spec(QUEUE_TIME).taxonomy.declared_metrics
    if encoding == "json":
        decoder = Decoder(declared=declared)
        batch, skips = decoder.decode(request), decoder.skipped
    else:
        batch, skips = Decoders(declared).decode(
            "metrics", ParseDict(request, ExportMetricsServiceRequest()).SerializeToString(), False)
    h = batch.histograms
    assert h.metric == ["myllm:queue_time_seconds"] and h.count == [10] and h.sum == [19.5]
    assert h.cumulative == [True]
    # (0, 0.3] and (0.3, 0.5] land in (0.25, 0.5]; (0.8, 1] in (0.5, 1]; (5, inf) at 5's (4, 8]
    slot = {2.0**j: j - HISTOGRAM_OFFSET for j in range(-3, 4)}
    expected = [0] * len(h.buckets[0])
    expected[slot[0.25]], expected[slot[0.5]], expected[slot[4.0]] = 7, 2, 1
    assert h.buckets == [expected]
    assert skips["points_no_sum"] == 1  # its mean is unknown


@pytest.mark.parametrize("bounds, counts, total, reason, complaint", [
    (BOUNDS, [3, 4], 7, "points_invalid_buckets", "2 bucket counts for 6 bounds"),
    ([1.0, 0.5], [1, 1, 1], 3, "points_invalid_buckets", "finite and increasing"),
    (BOUNDS, [1, 0, 0, 0, 0, 0, 1], 5, "points_invalid_count", "count 5 is not the sum of its bucket counts"),
])
def test_an_explicit_histogram_point_that_does_not_add_up_is_refused_alone(bounds, counts, total, reason,
                                                                             complaint):
    point = explicit_histogram("myllm:queue_time_seconds", T0 - 10**12, [(T0, 1.0, bounds, counts)], {})
    point["histogram"]["dataPoints"][0]["count"] = str(total)
    decoder = Decoder(declared=parse_spec(QUEUE_TIME).taxonomy.declared_metrics)
    batch = decoder.decode(prometheus_scrape("10.4.2.31:8000", [point], job="vllm", times=[T0]))
    assert decoder.refused == {reason: 1} and complaint in decoder.refusal_report()
    assert len(batch.histograms) == 0


def test_the_rules_of_a_spec_with_declared_causes_pass_promtool(tmp_path):
    need(shutil.which("promtool") is not None, "promtool (Debian package prometheus) is not installed")
    spec = tmp_path / "slo.yaml"
    spec.write_text(DECLARED)
    out = tmp_path / "rules.yml"
    assert main(["rules", "--slo", str(spec), "-o", str(out)]) == 0
    assert "SloscopeCauseCacheThrash" in out.read_text()
    checked = subprocess.run(["promtool", "check", "rules", str(out)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr

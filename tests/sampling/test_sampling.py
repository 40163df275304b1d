"""Adaptive trace sampling: the policy (hot tiers, budget, hysteresis), the head sampler's consistent thresholds,
and GET /sampling of a real `sloscope serve`. The tail_sampling config: tests/sampling/test_tail_sampling.py."""

import json
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from opentelemetry import trace as trace_api
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.span import TraceState

from sloscope.sampling.head_sampler import (MAX_THRESHOLD, AdaptiveSampler, decode_th, encode_th, parse_ot,
                                            probability_of, threshold_for)
from sloscope.sampling.budget import fair_shares
from sloscope.catalog import EVERY_NODE
from sloscope.sampling.observations import Observations, Sli
from sloscope.sampling.config import ConfigError, SamplingConfig, parse_config
from sloscope.sampling.policy import SamplingPolicy, SamplingService
from sloscope.sampling.tail_sampling import render
from sloscope.analytics.frames import Frames
from sloscope.analytics.store import Store
from sloscope.enrich.tiers import TierResolver, resolve_tiers
from sloscope.records import SPAN_KIND_SERVER, Batch
from sloscope.slo_spec import load_spec
from tests.alerting_stack import free_port, wait_listening

SPEC = load_spec(None)
CRIT, STD = "p99-latency-critical", "standard"
HEADER = "http.request.header.x-slo-tier"
T0 = 1_764_410_400  # 2025-11-29T10:00:00Z


# --- helpers ---------------------------------------------------------------------------------------------------

def write_requests(store, rows):
    """rows: (start_s, duration_ms, service, node, raw tier header, route, status); through tier enrichment."""
    batch = Batch()
    s = batch.spans
    for i, (start, ms, service, node, header, route, status) in enumerate(rows):
        s.trace_id.append(f"{random.getrandbits(128):032x}")
        s.span_id.append(f"{i + 1:016x}")
        s.parent_id.append(None)
        s.kind.append(SPAN_KIND_SERVER)
        s.peer.append(None)
        s.service.append(service)
        s.node.append(node)
        s.gpu_id.append(None)
        s.pod.append(None)
        s.namespace.append(None)
        s.pod_ip.append(None)
        s.route.append(route)
        s.tier_header.append(header)
        s.start_ns.append(int(start * 1e9))
        s.end_ns.append(int(start * 1e9 + ms * 1e6))
        s.status_code.append(status)
        s.failed.append(status >= 500)
        for column in (s.model, s.ttft_ms, s.tpot_ms, s.queue_ms, s.prompt_tokens, s.output_tokens):
            column.append(None)
    resolve_tiers(s, TierResolver.from_spec(SPEC))
    store.write(Frames.of(batch))


def steady(start, seconds, rate, service, node, header, route="/v1/chat/completions", ms=50.0, status=200):
    step = 1.0 / rate
    return [(start + k * step, ms, service, node, header, route, status) for k in range(int(seconds * rate))]


def sampler(policy, service="llm-gateway", node="n1", **kw):
    s = AdaptiveSampler("http://127.0.0.1:9/sampling", service=service, node=node, start=False, **kw)
    if policy is not None:
        s.load(policy)
    return s


def kept(s, trace_ids, attributes=None, parent=None):
    return {t for t in trace_ids if s.should_sample(parent, t, "span", SpanKind.SERVER, attributes).decision.is_sampled()}


def remote_parent(trace_id, sampled=True, state=None):
    ctx = SpanContext(trace_id, 0x1234, is_remote=True,
                      trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else 0), trace_state=state)
    return trace_api.set_span_in_context(NonRecordingSpan(ctx))


def _walk(policies):
    for p in policies:
        yield p
        if p["type"] == "and":
            yield from p["and"]["and_sub_policy"]


RNG = random.Random(42)
TRACE_IDS = [RNG.getrandbits(128) for _ in range(20_000)]


# --- threshold math --------------------------------------------------------------------------------------------

def test_thresholds_follow_the_tracestate_probability_sampling_encoding():
    assert threshold_for(1.0) == 0 and encode_th(0) == "0"
    assert encode_th(threshold_for(0.5)) == "8"  # T = 2**55
    assert encode_th(threshold_for(0.25)) == "c"  # T = 0.75 * 2**56
    assert encode_th(threshold_for(1 / 16)) == "f"
    assert threshold_for(0.0) == MAX_THRESHOLD - 1  # the smallest expressible probability, 2**-56
    for p in (0.9, 0.1, 0.001, 1e-9):
        t = threshold_for(p)
        assert decode_th(encode_th(t)) == t and probability_of(t) == pytest.approx(p, rel=1e-6)
    for bad in ("", "G", "000000000000000", "0x1", "C", 12):
        with pytest.raises(ValueError):
            decode_th(bad)
    assert parse_ot("th:c;rv:0123456789abcd") == (threshold_for(0.25), 0x0123456789ABCD)
    assert parse_ot("th:zz;foo:bar") == (None, None)


# --- the policy core ---------------------------------------------------------------------------------------------

def test_fair_shares_split_the_budget_max_min_fairly_with_floors():
    rates = {"a": 1.0, "b": 10.0, "c": 100.0, "d": 1000.0}
    p = fair_shares(rates, 100.0)
    assert p["a"] == 1.0 and p["b"] == 1.0
    assert sum(p[k] * r for k, r in rates.items()) == pytest.approx(100.0)
    assert p["c"] * 100 == pytest.approx(p["d"] * 1000)  # the busy keys get equal kept rates
    floored = fair_shares(rates, 100.0, {"d": 0.05})  # a floor costs 50 spans/s; the others share the rest
    assert floored["d"] == 0.05 and floored["c"] * 100 == pytest.approx(100 - 50 - 11)
    assert fair_shares(rates, 1e6) == {k: 1.0 for k in rates}


def test_the_budget_is_met_on_a_steady_load():
    config = SamplingConfig(budget_spans_per_s=40.0)
    policy = SamplingPolicy(SPEC, config)
    rates = {(STD, "llm-gateway", "/v1/chat/completions"): 120.0, (STD, "llm-gateway", "/v1/completions"): 30.0,
             (STD, "embedder", "/v1/embeddings"): 60.0, (CRIT, "llm-gateway", "/v1/chat/completions"): 50.0,
             (CRIT, "reranker", "/v1/rerank"): 2.0}
    rng = np.random.default_rng(1)
    healthy = {STD: Sli(1000, 1, 60.0), CRIT: Sli(500, 0, 300.0)}
    for step in range(30):  # 5 minutes of evaluations on Poisson counts of a steady load
        traffic = {k: int(rng.poisson(r * 60)) for k, r in rates.items()}
        doc = policy.evaluate(Observations(T0 + 10 * step, 60.0, traffic, healthy))
    assert not any(t["hot"] for t in doc["tiers"].values())
    assert doc["expected_spans_per_s"] == pytest.approx(40.0, rel=0.10)
    # the head samplers of the services, on a minute of that load, keep the budget
    kept_spans = 0
    for (tier, service, route), rate in rates.items():
        s = sampler(doc, service=service)
        n = int(rate * 60)
        ids = [RNG.getrandbits(128) for _ in range(n)]
        kept_spans += len(kept(s, ids, {HEADER: [tier], "http.route": route}))
    assert kept_spans / 60 == pytest.approx(40.0, rel=0.10)


def _bursty_kept(gain, seed):
    """Mean kept spans/s of a bursty load (5 s at 10x, about every 2 minutes per key) under the policy."""
    rng = np.random.default_rng(seed)
    n, keys = 1800, [(STD, "a", "/x"), (STD, "b", "/y"), (CRIT, "a", "/x")]
    per_s = {}
    for key in keys:
        load = rng.poisson(20, size=n).astype(float)
        for b in rng.integers(0, n - 5, size=n // 120):
            load[b:b + 5] *= 10
        per_s[key] = load
    policy = SamplingPolicy(SPEC, SamplingConfig(budget_spans_per_s=10, correction_gain=gain))
    kept = []
    for t in range(60, n - 10, 10):
        doc = policy.evaluate(Observations(T0 + t, 60, {k: v[t - 60:t].sum() for k, v in per_s.items()},
                                           recent={k: v[t - 10:t].sum() for k, v in per_s.items()}, recent_s=10))
        kept.append(sum(doc["tiers"][tier]["services"][svc]["routes"][route]["probability"] * v[t:t + 10].sum()
                        for (tier, svc, route), v in per_s.items()) / 10)
    return float(np.mean(kept[30:]))


def test_the_bias_feedback_keeps_a_bursty_load_on_budget():
    # probabilities from the past minute lag behind bursts: without feedback the kept rate runs high
    assert _bursty_kept(0.0, seed=1) > 10.0 * 1.10
    assert _bursty_kept(0.05, seed=1) == pytest.approx(10.0, rel=0.06)


def test_hysteresis_keeps_a_tier_hot_for_the_dwell_time_and_damps_increases():
    policy = SamplingPolicy(SPEC, SamplingConfig(budget_spans_per_s=10, dwell_s=60, interval_s=10))
    traffic = {(STD, "svc", "/r"): 6000}
    slow = {STD: Sli(100, 0, 500.0)}
    fine = {STD: Sli(100, 0, 50.0)}
    assert policy.evaluate(Observations(T0, 60, traffic, fine))["tiers"][STD]["probability"] == pytest.approx(0.1)
    doc = policy.evaluate(Observations(T0 + 10, 60, traffic, slow))
    assert doc["tiers"][STD]["hot"] and doc["tiers"][STD]["th"] == "0"
    assert doc["tiers"][STD]["hot_state"]["reasons"] == ["latency"]
    for t in range(20, 70, 10):  # recovered at T0+20, but held for the dwell time
        doc = policy.evaluate(Observations(T0 + t, 60, traffic, fine))
        assert doc["tiers"][STD]["hot"] and doc["tiers"][STD]["hot_state"]["reasons"] == ["dwell"]
    doc = policy.evaluate(Observations(T0 + 70, 60, traffic, fine))
    assert not doc["tiers"][STD]["hot"] and doc["tiers"][STD]["probability"] == pytest.approx(0.1)
    # traffic falls to a quarter: the probability doubles at most per evaluation; small changes are left alone
    doc = policy.evaluate(Observations(T0 + 80, 60, {(STD, "svc", "/r"): 1500}, fine))
    assert doc["tiers"][STD]["probability"] == pytest.approx(0.2)
    doc = policy.evaluate(Observations(T0 + 90, 60, {(STD, "svc", "/r"): 1500}, fine))
    assert doc["tiers"][STD]["probability"] == pytest.approx(0.4)
    doc = policy.evaluate(Observations(T0 + 100, 60, {(STD, "svc", "/r"): 1520}, fine))
    assert doc["tiers"][STD]["probability"] == pytest.approx(0.4)  # the target 0.395 is within the tolerance
    doc = policy.evaluate(Observations(T0 + 110, 60, {(STD, "svc", "/r"): 3000}, fine))
    assert doc["tiers"][STD]["probability"] == pytest.approx(0.2)  # lowering is immediate: the budget holds
    # errors above 5 % make a tier hot; a node failing its requests is a hot node
    doc = policy.evaluate(Observations(T0 + 120, 60, traffic, {STD: Sli(100, 6, 50.0)}, {"n7": Sli(50, 5)}))
    assert doc["tiers"][STD]["hot_state"]["reasons"] == ["errors"] and list(doc["hot_nodes"]) == ["n7"]


def test_a_simulated_incident_raises_the_hot_tier_within_one_interval_and_lowers_it_after_recovery_and_dwell(tmp_path):
    interval, dwell = 10.0, 60.0
    onset, recovery, end = T0 + 300, T0 + 420, T0 + 720
    rows = []
    for node in ("n1", "n2"):
        rows += steady(T0, end - T0, 5, "llm-gateway", node, [STD], ms=40)
        rows += [r for r in steady(T0, end - T0, 3, "llm-gateway", node, [CRIT], ms=300)
                 if node == "n1" or not onset <= r[0] < recovery]
    rows += steady(onset, recovery - onset, 3, "llm-gateway", "n2", [CRIT], ms=1500)  # n2 slows down
    store = Store(tmp_path / "s.duckdb")
    write_requests(store, rows)
    now = [T0 + 120.0]
    service = SamplingService(store.reader(), SPEC, SamplingConfig(budget_spans_per_s=2, dwell_s=dwell,
                                                                   interval_s=interval), clock=lambda: now[0])
    seen = {}
    while now[0] <= end:
        doc = service.document()
        seen[now[0]] = doc
        now[0] += interval
    store.close()
    crit = {t: d["tiers"][CRIT] for t, d in seen.items()}
    before = [t for t in crit if t <= onset]
    assert all(not crit[t]["hot"] and crit[t]["probability"] < 0.2 for t in before)
    assert crit[onset + interval]["hot"] and crit[onset + interval]["probability"] == 1.0  # within one interval
    assert {"latency", "incident"} <= set(crit[onset + 3 * interval]["hot_state"]["reasons"])
    assert "n2" in seen[onset + 3 * interval]["hot_nodes"]
    held = [t for t in crit if onset + interval <= t <= recovery + dwell]
    assert held and all(crit[t]["probability"] == 1.0 for t in held)  # not lowered before recovery + dwell
    lowered_by = recovery + SamplingConfig().sli_window_s + dwell + 2 * interval
    assert not crit[lowered_by]["hot"] and crit[lowered_by]["probability"] < 0.2
    assert all(not d["tiers"][STD]["hot"] for d in seen.values())  # the healthy tier never went hot
    assert seen[end]["hot_nodes"] == {}


def test_a_forged_tier_header_does_not_raise_sampling(tmp_path):
    forged = ["P99-Latency-Critical", "p99-latency-critical\u0000", "gold", "x" * 10_000, "",
              [CRIT, CRIT], ["vip"], 7]
    # through ingest: forged values are the default tier, so they never reach the hot tier's statistics
    store = Store(tmp_path / "s.duckdb")
    rows = steady(T0, 60, 5, "llm-gateway", "n1", [CRIT], ms=100)
    for i, value in enumerate(forged):
        rows += steady(T0 + i * 0.01, 60, 2, "llm-gateway", "n1", value, ms=5000)  # slow and "critical"
    write_requests(store, rows)
    assert dict(store.rows("SELECT tier, count(*) FROM requests GROUP BY ALL")) == {CRIT: 300, STD: 960}
    service = SamplingService(store.reader(), SPEC, SamplingConfig(), clock=lambda: T0 + 60)
    doc = service.document()
    assert not doc["tiers"][CRIT]["hot"] and set(doc["tiers"]) == {CRIT, STD}
    store.close()
    # an override of a tier the spec does not have is ignored, not mapped to anything
    policy = SamplingPolicy(SPEC)
    doc = policy.evaluate(Observations(T0, 60, {(STD, "s", "/"): 60_000, ("vip", "s", "/"): 60_000},
                                       overrides={"vip": 1.0}))
    assert set(doc["tiers"]) == {CRIT, STD} and not any(t["hot"] for t in doc["tiers"].values())
    assert policy.counts["overrides_unknown_tier"] == 1 and policy.counts["tier_invalid"] == 1
    # the head sampler: a hot tier at 100 %, the default tier at 10 %; forged values get the default's threshold
    hot_doc = SamplingPolicy(SPEC, SamplingConfig(budget_spans_per_s=100)).evaluate(
        Observations(T0, 60, {(STD, "llm-gateway", "/"): 60_000, (CRIT, "llm-gateway", "/"): 600},
                     {CRIT: Sli(100, 0, 2000.0)}))
    s = sampler(hot_doc)
    standard = kept(s, TRACE_IDS, {HEADER: [STD]})
    assert kept(s, TRACE_IDS, {HEADER: [CRIT]}) == set(TRACE_IDS)
    assert kept(s, TRACE_IDS, {"slo.tier": CRIT}) == set(TRACE_IDS)
    assert len(standard) == pytest.approx(0.1 * len(TRACE_IDS), rel=0.1)
    for value in forged:
        for key in (HEADER, "slo.tier"):
            assert kept(s, TRACE_IDS, {key: value}) == standard, (key, value)
    assert s.tier_counts()["tier_invalid"] > 0
    # and the tail config lists only the spec's tiers
    config = render(hot_doc)["processors"]["tail_sampling"]
    values = {v for p in _walk(config["policies"]) if p["type"] == "string_attribute"
              and p["string_attribute"]["key"] in (HEADER, "slo.tier") for v in p["string_attribute"]["values"]}
    assert values <= set(SPEC.tiers)


# --- the head sampler ------------------------------------------------------------------------------------------

def _doc(probabilities, hot_nodes=()):
    """A GET /sampling document with the given tier -> probability (services inherit)."""
    tiers = {t: {"hot": p == 1.0, "probability": p, "th": encode_th(threshold_for(p)), "observed_spans_per_s": 1.0,
                 "latency_threshold_ms": SPEC.tiers[t].threshold_ms, "services": {}} for t, p in probabilities.items()}
    return {"schema": "sloscope.sampling/v1", "default_tier": STD, "tiers": tiers, "budget_spans_per_s": 10,
            "hot_nodes": {n: {} for n in hot_nodes}, "observed_spans_per_s": 10.0}


def test_two_samplers_with_the_same_threshold_keep_exactly_the_same_trace_ids():
    doc = _doc({STD: 0.25, CRIT: 0.5})
    a, b = sampler(doc, service="llm-gateway"), sampler(doc, service="embedder", node="n9")
    ka, kb = kept(a, TRACE_IDS, {HEADER: [STD]}), kept(b, TRACE_IDS, {"slo.tier": STD})
    assert ka == kb and len(ka) == pytest.approx(0.25 * len(TRACE_IDS), rel=0.05)
    assert all((t & (MAX_THRESHOLD - 1)) >= threshold_for(0.25) for t in ka)
    assert ka <= kept(a, TRACE_IDS, {HEADER: [CRIT]})  # a lower probability keeps a subset
    # the root's decision carries its threshold in the OpenTelemetry tracestate entry
    kept_result = a.should_sample(None, next(iter(ka)), "s", SpanKind.SERVER, {HEADER: [STD]})
    assert kept_result.trace_state.get("ot") == "th:c"


def test_a_downstream_sampler_keeps_the_whole_trace_its_caller_kept():
    """A trace's tier is its entry's: a sampled caller's threshold decides for the trace, so a deeper service
    (which sees no tier header) keeps exactly what its caller kept, neither more nor half of it."""
    parent_state = TraceState([("ot", "th:c"), ("vendor", "x")])  # the caller kept 25 %
    caller_kept = {t for t in TRACE_IDS if (t & (MAX_THRESHOLD - 1)) >= threshold_for(0.25)}
    generous = sampler(_doc({STD: 1.0, CRIT: 1.0}))
    stingy = sampler(_doc({STD: 0.1, CRIT: 0.1}))
    for own in (generous, stingy):
        down = {t for t in caller_kept if own.should_sample(
            remote_parent(t, state=parent_state), t, "s", SpanKind.SERVER, {}).decision.is_sampled()}
        assert down == caller_kept
        result = own.should_sample(remote_parent(next(iter(caller_kept)), state=parent_state),
                                   next(iter(caller_kept)), "s", SpanKind.SERVER, {})
        assert result.trace_state.get("ot") == "th:c" and result.trace_state.get("vendor") == "x"
    only_ot = TraceState([("ot", "th:c;rv:ffffffffffffff")])
    t = next(iter(caller_kept))
    result = stingy.should_sample(remote_parent(t, state=only_ot), t, "s")
    assert result.decision.is_sampled() and result.trace_state.get("ot") == "th:c;rv:ffffffffffffff"
    # a caller that wrote no th: the service's own threshold; an unsampled caller: nothing; rv in the
    # tracestate replaces the trace id's randomness
    no_th = {t for t in caller_kept if stingy.should_sample(
        remote_parent(t, state=TraceState([("vendor", "x")])), t, "s").decision.is_sampled()}
    assert no_th == kept(stingy, TRACE_IDS) & caller_kept
    assert not generous.should_sample(remote_parent(t, sampled=False), t, "s").decision.is_sampled()
    low_rv = TraceState([("ot", "rv:00000000000001")])
    assert not stingy.should_sample(remote_parent(t, state=low_rv), t, "s").decision.is_sampled()


def test_every_service_of_a_trace_agrees_through_w3c_propagation():
    doc = _doc({STD: 0.3, CRIT: 0.3})
    front = TracerProvider(sampler=sampler(doc, service="llm-gateway"))
    back = TracerProvider(sampler=sampler(doc, service="vllm-engine"))
    agreed = 0
    for _ in range(300):
        with front.get_tracer("t").start_as_current_span("POST", kind=SpanKind.SERVER,
                                                         attributes={HEADER: [STD]}) as root:
            carrier = {}
            inject(carrier)
            with front.get_tracer("t").start_as_current_span("child") as child:
                assert child.get_span_context().trace_flags.sampled == root.get_span_context().trace_flags.sampled
        with back.get_tracer("t").start_as_current_span("serve", context=extract(carrier), kind=SpanKind.SERVER,
                                                        attributes={HEADER: [STD]}) as downstream:
            assert downstream.get_span_context().trace_flags.sampled == root.get_span_context().trace_flags.sampled
            agreed += root.get_span_context().trace_flags.sampled
            if root.get_span_context().trace_flags.sampled:
                assert "th:" in carrier.get("tracestate", "")
    assert 40 < agreed < 140


def test_a_hot_node_samples_everything_it_starts():
    doc = _doc({STD: 0.01, CRIT: 0.01}, hot_nodes=["gpu-node-3"])
    assert kept(sampler(doc, node="gpu-node-3"), TRACE_IDS[:2000]) == set(TRACE_IDS[:2000])
    assert len(kept(sampler(doc, node="gpu-node-1"), TRACE_IDS[:2000])) < 100


def test_the_head_sampler_against_a_real_sloscope_serve_and_when_unreachable(tmp_path):
    db, http_port, grpc_port = tmp_path / "serve.duckdb", free_port(), free_port()
    config = tmp_path / "sampling.yaml"
    config.write_text("budget_spans_per_s: 0.5\ninterval: 1s\nmin_probability: 0.01\n")
    serve = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(db), "--http",
                              f"127.0.0.1:{http_port}", "--grpc", "off", "--sampling", str(config)],
                             stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{http_port}/sampling"
    try:
        wait_listening(http_port, serve, "sloscope serve")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": "llm-gateway", "host.name": "n1"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces")))
        tracer = provider.get_tracer("t")
        for tier in ([STD], ["forged"]) * 20:
            with tracer.start_as_current_span("POST", kind=SpanKind.SERVER,
                                              attributes={HEADER: tier, "http.route": "/v1/chat/completions"}):
                pass
        provider.shutdown()
        clock = [0.0]
        s = AdaptiveSampler(url, service="llm-gateway", node="n1", start=False, clock=lambda: clock[0])
        deadline = time.monotonic() + 30
        while True:  # the writer commits asynchronously; the policy is recomputed every second
            assert s.refresh() and s.source == "policy"
            svc = s.policy["tiers"][STD]["services"].get("llm-gateway")
            if svc and svc["observed_spans_per_s"] >= 40 / 60 - 1e-9:
                break
            assert time.monotonic() < deadline, s.policy
            time.sleep(0.3)
        assert s.policy["schema"] == "sloscope.sampling/v1" and set(s.policy["tiers"]) == set(SPEC.tiers)
        assert svc["probability"] == pytest.approx(0.5 / (40 / 60), rel=0.06)  # all 40 spans are the default tier
        in_force = kept(s, TRACE_IDS[:4000], {HEADER: [STD]})
        assert len(in_force) == pytest.approx(0.75 * 4000, rel=0.08)
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0, serve.stderr.read()[-3000:]
    # unreachable: the last policy stays in force until it is stale, then the fixed 10 % fallback
    clock[0] = 100.0
    assert not s.refresh() and s.source == "policy" and kept(s, TRACE_IDS[:4000], {HEADER: [STD]}) == in_force
    clock[0] = 400.0
    assert not s.refresh() and s.source == "fallback" and s.fetch_errors == 2
    assert len(kept(s, TRACE_IDS[:4000], {HEADER: [CRIT]})) == pytest.approx(400, rel=0.2)
    never = AdaptiveSampler(f"http://127.0.0.1:{free_port()}/sampling", service="x", start=False, timeout_s=0.5)
    assert not never.refresh() and never.source == "fallback"
    assert kept(never, TRACE_IDS[:4000]) == kept(sampler(_doc({STD: 0.1, CRIT: 0.1})), TRACE_IDS[:4000])
    assert "SloscopeAdaptiveSampler" in never.get_description()


def test_the_background_refresh_thread_fetches_and_stops(tmp_path):
    from sloscope.receiver.server import Receiver, http_server

    doc = _doc({STD: 0.5, CRIT: 1.0})
    httpd = http_server(Receiver(lambda *a: None), "127.0.0.1", 0,
                        pages={"/sampling": lambda: (json.dumps(doc).encode(), "application/json")})
    import threading

    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        s = AdaptiveSampler(f"http://127.0.0.1:{httpd.server_address[1]}/sampling", service="x", refresh_s=0.05)
        deadline = time.monotonic() + 10
        while s.source != "policy":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        s.close()
        assert kept(s, TRACE_IDS[:1000], {"slo.tier": CRIT}) == set(TRACE_IDS[:1000])
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_sampling_config_is_validated():
    config = parse_config("budget_spans_per_s: 250\ndwell: 5m\ninterval: 15s\nmin_probability: 0.01\n")
    assert (config.budget_spans_per_s, config.dwell_s, config.interval_s, config.min_probability) == (250, 300, 15, 0.01)
    for text, message in (("budget: 5", "unknown key 'budget'"), ("budget_spans_per_s: -1", "budget_spans_per_s"),
                          ("dwell: soon", "dwell: expected a duration"), ("min_probability: 2", "min_probability"),
                          ("- 1", "expected a mapping")):
        with pytest.raises(ConfigError, match=message):
            parse_config(text, "s.yaml")


def test_an_incident_over_every_node_heats_its_tier_and_no_node():
    policy = SamplingPolicy(SPEC, SamplingConfig(budget_spans_per_s=10, interval_s=10))
    traffic = {(STD, "svc", "/r"): 6000}
    doc = policy.evaluate(Observations(T0, 60, traffic, {STD: Sli(100, 0, 50.0)},
                                       incidents=[(STD, "svc", EVERY_NODE)]))
    assert doc["tiers"][STD]["hot"] and doc["tiers"][STD]["hot_state"]["reasons"] == ["incident"]
    assert doc["hot_nodes"] == {}

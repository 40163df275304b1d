"""Request spans of the simulated fleet: SERVER spans per service and node with tier headers (valid, missing
and hostile), lognormal latency per (service, tier), traffic bursts, baseline 4xx/5xx, a few CLIENT spans,
and the latency/error response of the fault node.

Latency is lognormal per request (sigma 0.3, medians near 300 ms for the p99 <= 800 ms tier and 90 ms for the
p95 <= 200 ms tier), drifting slowly per (node, service) and, mildly, across the whole fleet at once, and 12 %
slower in 10x bursts. Single requests and whole small windows do cross the threshold on a healthy fleet, as in
a real one; what stays within the objective is the share of slow requests: below MARGIN of the percentile's
allowance at the worst drift and burst (`check_latency_margin`). Baseline 5xx are kept only where the step's
volume absorbs them without breaking the tier's error budget (see `budget_filter`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sloscope.catalog import TIER_HEADER_ATTRIBUTE, TIER_ISTIO_TAG

from sloscope.simulator.otlp_json import attribute as _kv

# the built-in SLO spec (docs/slo-spec.md)
TIERS = {
    "p99-latency-critical": {"percentile": 99, "threshold_s": 0.8, "availability": 99.9},
    "standard": {"percentile": 95, "threshold_s": 0.2, "availability": 99.5},
}
DEFAULT_TIER = "standard"
CRITICAL = "p99-latency-critical"
TIER_CODES = (CRITICAL, DEFAULT_TIER)  # effective tier code 0 / 1
MARGIN = 0.8  # the healthy fleet's slow share stays below this share of the percentile's allowance

Z_CLIP = 5.0  # a request past this is a timeout (about 1 in 3.5 million)
NODE_FACTOR = 0.05  # per (node, service) latency factor 1 +- this
DRIFT = 0.04  # slow latency drift amplitude per (node, service)
FLEET_DRIFT = 0.04  # ... and of the whole fleet at once (load, model cache warmth)
FLEET_DRIFT_PERIOD_S = 2400.0
BURST_RATE = 10.0  # request-rate multiplier during a burst
BURST_LATENCY = 1.12  # latency multiplier during a burst
BURST_S = 5
BURST_EVERY_S = 180.0  # mean time between bursts per service

SHARE_CRITICAL = 0.30
SHARE_HOSTILE = 0.01
SHARE_MISSING = 0.14  # no tier header at all: default tier
BASE_5XX = 0.001
BASE_4XX = 0.005
CLIENT_SHARE = 0.10


@dataclass(frozen=True)
class ServiceProfile:
    routes: tuple  # ((method, route), ...)
    median_s: dict  # tier -> median latency (s)
    sigma: float
    downstream: str


PROFILES = {
    "llm-gateway": ServiceProfile((("POST", "/v1/chat/completions"), ("POST", "/v1/completions")),
                                  {CRITICAL: 0.300, DEFAULT_TIER: 0.090}, 0.30, "vllm-engine"),
    "embedder": ServiceProfile((("POST", "/v1/embeddings"),), {CRITICAL: 0.260, DEFAULT_TIER: 0.080}, 0.30,
                               "triton-embed"),
    "reranker": ServiceProfile((("POST", "/v1/rerank"),), {CRITICAL: 0.280, DEFAULT_TIER: 0.085}, 0.30,
                               "feature-cache"),
}
DEFAULT_SERVICES = tuple(PROFILES)


def profile_for(service: str) -> ServiceProfile:
    if service in PROFILES:
        return PROFILES[service]
    return ServiceProfile((("POST", f"/v1/{service}"),), {CRITICAL: 0.280, DEFAULT_TIER: 0.085}, 0.30, "model-store")


def slow_allowance(tier: str) -> float:
    return 1.0 - TIERS[tier]["percentile"] / 100.0


def worst_slow_share(service: str, tier: str) -> float:
    """The share of requests slower than the tier's threshold at the healthy model's slowest moment: the
    slowest node, both drifts at their peak, in a burst."""
    prof = profile_for(service)
    median = prof.median_s[tier] * (1 + NODE_FACTOR) * (1 + DRIFT) * (1 + FLEET_DRIFT) * BURST_LATENCY
    z = math.log(TIERS[tier]["threshold_s"] / median) / prof.sigma
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def check_latency_margin(services) -> None:
    for svc in services:
        for tier in TIERS:
            worst, allowed = worst_slow_share(svc, tier), slow_allowance(tier)
            if worst >= MARGIN * allowed:
                raise ValueError(f"latency model of {svc}/{tier} can make {worst:.2%} of requests slower than "
                                 f"the objective, above {MARGIN:.0%} of the {allowed:.0%} the percentile allows")


# ------------------------------------------------------------------------------------------------ encoding


def _valid_fragments(tier: str) -> list[str]:
    # string[] as the semantic conventions say; a plain string as Envoy custom tags send it; the Istio tag
    return ["," + _kv(TIER_HEADER_ATTRIBUTE, [tier]), "," + _kv(TIER_HEADER_ATTRIBUTE, tier),
            "," + _kv(TIER_ISTIO_TAG, tier)]


HOSTILE_VALUES = (
    ("array", ["gold"]),
    ("array", ["P99-Latency-Critical"]),
    ("string", "STANDARD"),
    ("array", [""]),
    ("string", ""),
    ("array", ["x" * 10240]),
    ("istio", "premium"),
    ("array", ["critical"]),
    ("string", "p99-latency-critical'; DROP TABLE requests; --"),
    ("array", []),
    ("int", 1),
    ("array", ["\u6807\u51c6"]),
)


def _hostile_fragment(kind: str, value) -> str:
    if kind == "istio":
        return "," + _kv(TIER_ISTIO_TAG, value)
    if kind == "int":
        return "," + _kv(TIER_HEADER_ATTRIBUTE, int(value))
    return "," + _kv(TIER_HEADER_ATTRIBUTE, value)


# tier fragment table: 0-2 critical (array, string, istio), 3-5 standard, 6 missing, 7.. hostile
TIER_FRAGMENTS = (_valid_fragments(CRITICAL) + _valid_fragments(DEFAULT_TIER) + [""] +
                  [_hostile_fragment(k, v) for k, v in HOSTILE_VALUES])
FRAG_HOSTILE0 = 7

STATUS_CODES_5XX = (500, 502, 503, 504)
STATUS_CODES_4XX = (400, 404, 429)


def _status_object(code: int, client: bool = False) -> str:
    if code >= 500 or (client and code >= 400):
        return '{"code":2,"message":"HTTP %d"}' % code
    return "{}"


# ------------------------------------------------------------------------------------------------ the plan


@dataclass
class LatencyFault:
    """The fault node's request response: from `start` (s after run start) latency ramps to `mult` per
    service over `ramp` s, and back after `end`; `errors` is the 5xx share per service at full effect."""

    node: int
    start: float
    ramp: float
    end: float
    mult: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)

    def effect(self, t: np.ndarray) -> np.ndarray:
        return np.clip((t - self.start) / self.ramp, 0.0, 1.0) * np.clip(1.0 - (t - self.end) / 10.0, 0.0, 1.0)


@dataclass
class TrafficPlan:
    seed: int
    n: int  # run length, s
    start_ns: int
    flush: int
    services: tuple
    nodes: tuple  # node names
    rate: float
    bursts: dict  # service -> array of burst start seconds
    node_factor: np.ndarray  # (nodes, services)
    drift_phase: np.ndarray  # (nodes, services)
    drift_period: np.ndarray  # (nodes, services)
    fleet_drift_phase: float
    fault: LatencyFault | None = None
    cache: dict = field(default_factory=dict, repr=False)

    def burst_mask(self, svc: int, secs: np.ndarray) -> np.ndarray:
        b = self.bursts[self.services[svc]]
        if len(b) == 0:
            return np.zeros(len(secs), dtype=bool)
        idx = np.searchsorted(b, secs, side="right") - 1
        return (idx >= 0) & (secs - b[np.maximum(idx, 0)] < BURST_S)


def make_plan(seed, n, start_ns, flush, services, nodes, rate, fault=None) -> TrafficPlan:
    rng = np.random.default_rng([seed, 4])
    bursts = {}
    for s in services:
        k = rng.poisson(n / BURST_EVERY_S)
        bursts[s] = np.sort(rng.integers(0, max(n - BURST_S, 1), size=k)).astype(np.int64)
    shape = (len(nodes), len(services))
    return TrafficPlan(seed, n, start_ns, flush, tuple(services), tuple(nodes), rate, bursts,
                       node_factor=1.0 + rng.uniform(-NODE_FACTOR, NODE_FACTOR, size=shape),
                       drift_phase=rng.uniform(0, 2 * math.pi, size=shape),
                       drift_period=rng.uniform(900, 3600, size=shape),
                       fleet_drift_phase=float(rng.uniform(0, 2 * math.pi)), fault=fault)


def base_p99_critical(plan: TrafficPlan, node: int, svc: int) -> float:
    prof = profile_for(plan.services[svc])
    return prof.median_s[CRITICAL] * plan.node_factor[node, svc] * math.exp(2.326 * prof.sigma)


# ------------------------------------------------------------------------------------------------ budget


def budget_filter(candidates: np.ndarray, tier: np.ndarray, keys: list[np.ndarray]) -> np.ndarray:
    """Keep a subset of the candidate failures so that, for every bucketing in `keys` (one int64 bucket id
    per request), failures per (tier, bucket) stay strictly below the tier's budget times the requests."""
    keep = candidates.copy()
    budgets = np.array([1 - TIERS[t]["availability"] / 100 for t in TIER_CODES])
    for bucket in keys:
        if not keep.any():
            break
        group = bucket * 2 + tier
        uniq, inv, total = np.unique(group, return_inverse=True, return_counts=True)
        allowed = np.ceil(total * budgets[uniq % 2] - 1e-9).astype(np.int64) - 1
        idx = np.flatnonzero(keep)
        g = inv[idx]
        order = np.argsort(g, kind="stable")
        gs = g[order]
        first = np.searchsorted(gs, gs, side="left")
        rank = np.arange(len(gs)) - first
        ok = np.empty(len(idx), dtype=bool)
        ok[order] = rank < allowed[gs]
        keep[idx[~ok]] = False
    return keep


# ------------------------------------------------------------------------------------------------ spans

SERVER_TMPL = ('{"traceId":"%016x%016x","spanId":"%016x","name":"%s","kind":2,"startTimeUnixNano":"%d",'
               '"endTimeUnixNano":"%d","attributes":[%s,%s%s%s],"status":%s}')
CLIENT_TMPL = ('{"traceId":"%016x%016x","spanId":"%016x","parentSpanId":"%016x","name":"%s","kind":3,'
               '"startTimeUnixNano":"%d","endTimeUnixNano":"%d","attributes":[%s,%s%s],"status":%s}')


@dataclass
class _Static:
    names: list
    routes: list
    client_names: list
    client_attrs: list
    status_frag: dict
    status_obj: dict
    client_status_obj: dict
    node_frag: list


def _static(plan: TrafficPlan, svc: int) -> _Static:
    key = ("static", svc)
    if key not in plan.cache:
        prof = profile_for(plan.services[svc])
        names = [f"{m} {r}" for m, r in prof.routes]
        routes = [_kv("http.request.method", m) + "," + _kv("http.route", r) for m, r in prof.routes]
        codes = (200,) + STATUS_CODES_4XX + STATUS_CODES_5XX
        plan.cache[key] = _Static(
            names=names, routes=routes, client_names=["POST"],
            client_attrs=[",".join([_kv("http.request.method", "POST"), _kv("server.address", prof.downstream),
                                    _kv("server.port", 8000)])],
            status_frag={c: _kv("http.response.status_code", c) for c in codes},
            status_obj={c: _status_object(c) for c in codes},
            client_status_obj={c: _status_object(c, client=True) for c in codes},
            node_frag=["," + _kv("k8s.node.name", nm) for nm in plan.nodes],
        )
    return plan.cache[key]


@dataclass
class SpanBatch:
    """Serialised spans of one (node, service) over one chunk, grouped by flush interval."""

    by_interval: dict  # interval index -> list of span JSON strings
    server: int
    client: int


def draw_tiers(rng: np.random.Generator, total: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each request's tier header: (TIER_FRAGMENTS index, effective tier code, critical mask)."""
    r = rng.random(total)
    hostile = r < SHARE_HOSTILE
    critical = (r >= SHARE_HOSTILE) & (r < SHARE_HOSTILE + SHARE_CRITICAL)
    missing = r >= 1.0 - SHARE_MISSING
    enc = rng.random(total)
    enc_idx = np.where(enc < 0.8, 0, np.where(enc < 0.92, 1, 2))
    frag = np.where(critical, enc_idx, 3 + enc_idx)
    frag = np.where(missing, 6, frag)
    frag = np.where(hostile, FRAG_HOSTILE0 + rng.integers(0, len(HOSTILE_VALUES), size=total), frag)
    tier = np.where(critical, 0, 1).astype(np.int64)
    return frag, tier, critical


def chunk_spans(plan: TrafficPlan, node: int, svc: int, chunk: int, a: int, b: int) -> SpanBatch:
    """Spans of (node, service) whose requests start in seconds [a, b) of the run."""
    rng = np.random.default_rng([plan.seed, 3, node, svc, chunk])
    prof = profile_for(plan.services[svc])
    st = _static(plan, svc)
    secs = np.arange(a, b, dtype=np.int64)
    burst = plan.burst_mask(svc, secs)
    lam = plan.rate * np.where(burst, BURST_RATE, 1.0)
    counts = rng.poisson(lam)
    total = int(counts.sum())
    if total == 0:
        return SpanBatch({}, 0, 0)
    t = np.repeat(secs, counts) + rng.random(total)
    t.sort()
    in_burst = np.repeat(burst, counts)

    frag, tier, critical = draw_tiers(rng, total)

    # latency
    med = np.where(critical, prof.median_s[CRITICAL], prof.median_s[DEFAULT_TIER])
    z = np.clip(rng.standard_normal(total), -Z_CLIP, Z_CLIP)
    drift = 1.0 + DRIFT * np.sin(2 * math.pi * t / plan.drift_period[node, svc] + plan.drift_phase[node, svc])
    drift *= 1.0 + FLEET_DRIFT * np.sin(2 * math.pi * t / FLEET_DRIFT_PERIOD_S + plan.fleet_drift_phase)
    lat = med * plan.node_factor[node, svc] * drift * np.where(in_burst, BURST_LATENCY, 1.0) * np.exp(prof.sigma * z)
    fault_errors = np.zeros(total, dtype=bool)
    f = plan.fault
    if f is not None and f.node == node:
        q = f.effect(t)
        if q.any():
            svc_name = plan.services[svc]
            tail = np.exp(0.15 * q * np.abs(rng.standard_normal(total)))
            lat = lat * (1.0 + (f.mult.get(svc_name, 1.0) - 1.0) * q) * tail
            fault_errors = rng.random(total) < f.errors.get(svc_name, 0.0) * q
    start_ns = plan.start_ns + np.round(t * 1e9).astype(np.int64)
    dur_ns = np.maximum(np.round(lat * 1e9).astype(np.int64), 1000)
    end_ns = start_ns + dur_ns

    # status: baseline 5xx only where the step absorbs them; 4xx (not failures); the fault's 5xx
    cand = rng.random(total) < BASE_5XX
    if cand.any():
        step = 10 * 10**9
        cand = budget_filter(cand, tier, [start_ns // step, end_ns // step])
    code = np.full(total, 200, dtype=np.int64)
    c4 = rng.random(total) < BASE_4XX
    code[c4] = np.asarray(STATUS_CODES_4XX)[rng.integers(0, len(STATUS_CODES_4XX), size=int(c4.sum()))]
    fail = cand | fault_errors
    code[fail] = np.asarray(STATUS_CODES_5XX)[rng.integers(0, len(STATUS_CODES_5XX), size=int(fail.sum()))]

    ids = rng.integers(1, np.iinfo(np.uint64).max, size=(total, 3), dtype=np.uint64, endpoint=True)
    route = rng.integers(0, len(prof.routes), size=total)
    node_attr = rng.random(total) < 0.5
    nf = st.node_frag[node]

    # flush interval of each span: by end time, kept within this chunk's intervals
    first_iv, last_iv = a // plan.flush, (b - 1) // plan.flush
    iv = np.clip((end_ns - plan.start_ns) // (plan.flush * 10**9), first_iv, last_iv)

    names, routes, sfr, sob = st.names, st.routes, st.status_frag, st.status_obj
    tf = TIER_FRAGMENTS
    strings = [SERVER_TMPL % (h, l_, s, names[ro], s0, e0, routes[ro], sfr[c], tf[fr], nf if na else "", sob[c])
               for h, l_, s, ro, s0, e0, c, fr, na in zip(
                   ids[:, 0].tolist(), ids[:, 1].tolist(), ids[:, 2].tolist(), route.tolist(), start_ns.tolist(),
                   end_ns.tolist(), code.tolist(), frag.tolist(), node_attr.tolist())]
    out: dict = {}
    for j in range(first_iv, last_iv + 1):
        out[j] = []
    ivl = iv.tolist()
    for s_, j in zip(strings, ivl):
        out[j].append(s_)

    # CLIENT spans (analytics must ignore them): calls to a downstream, a few long async ones and errors
    sel = np.flatnonzero(rng.random(total) < CLIENT_SHARE)
    n_client = len(sel)
    if n_client:
        cstart = start_ns[sel] + (dur_ns[sel] * rng.uniform(0.05, 0.3, size=n_client)).astype(np.int64)
        cdur = (dur_ns[sel] * rng.uniform(0.1, 0.6, size=n_client)).astype(np.int64)
        long_ = rng.random(n_client) < 0.02
        cdur = np.where(long_, (rng.uniform(2.0, 6.0, size=n_client) * 1e9).astype(np.int64), cdur)
        cend = cstart + np.maximum(cdur, 1000)
        ccode = np.where(rng.random(n_client) < 0.02, 503, 200)
        cids = rng.integers(1, np.iinfo(np.uint64).max, size=n_client, dtype=np.uint64, endpoint=True)
        civ = np.clip((cend - plan.start_ns) // (plan.flush * 10**9), first_iv, last_iv)
        ca, cn, cso = st.client_attrs[0], st.client_names[0], st.client_status_obj
        for h, l_, s, ps, s0, e0, c, fr, j in zip(
                ids[sel, 0].tolist(), ids[sel, 1].tolist(), cids.tolist(), ids[sel, 2].tolist(), cstart.tolist(),
                cend.tolist(), ccode.tolist(), frag[sel].tolist(), civ.tolist()):
            out[j].append(CLIENT_TMPL % (h, l_, s, ps, cn, s0, e0, ca, sfr[c], tf[fr], cso[c]))
    return SpanBatch(out, total, n_client)

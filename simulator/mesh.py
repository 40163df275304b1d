"""A service mesh over the simulated fleet: an entry service calling a tree of services whose pods are spread over
the nodes, every request one OTLP trace.

    gateway -> router -> {tokenizer, retriever -> {vector-db, reranker}, llm -> kv-cache}

A service's SERVER span is its own time (some before its calls, the rest after) around its calls: the callees of
one stage in parallel, the stages one after another. Each call is a CLIENT span in the caller's pod
(`peer.service`, `server.address`) whose child is the callee's SERVER span, a little shorter: the network's
0.3-1 ms both ways. Only the entry's SERVER span carries the tier header, as meshes forward no custom headers. A
failure marks its span and every ancestor up to the entry (status 2, HTTP 500), and the caller skips its later
stages. Own times are lognormal, slower in the entry's traffic bursts and drifting per pod and fleet-wide.

A fault sits on one pod of a service at depth >= 2 (`inject`): a physical cause bends its node's signals as on a
flat fleet and multiplies the pod's own time; `network_latency` delays the calls to the pod (its callers'
CLIENT spans, not its SERVER spans) and raises its node's TCP round-trip time; `slow_handler` multiplies the
pod's own time and `exceptions` fails a share of its requests, with no node signal moving.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sloscope import taxonomy
from sloscope.simulator import faults, planning, traffic
from sloscope.simulator.signals import RTT

NAMESPACE = "inference"
CLUSTER_DOMAIN = "svc.cluster.local"
MESH_FAULTS = ("network_latency", "slow_handler", "exceptions")  # the faults only a mesh has
FAULT_CAUSE = {"network_latency": "network_latency", "slow_handler": "application", "exceptions": "application"}
FAULT_LAYER = {"network_latency": "network", "slow_handler": "application", "exceptions": "application"}
MIN_FAULT_DEPTH = 2
SELF_MULTIPLIER = (3.0, 10.0)  # a slowed pod's own time, times this ...
SELF_ADDED_S = (0.2, 0.45)  # ... or by at least this much, so that the entry's SLO breaks
ADDED_LATENCY_S = (0.05, 0.5)  # network_latency: added to each call to the pod
ERROR_RATIO = (0.1, 0.3)  # exceptions: share of the pod's requests that fail at full effect (a bad canary)
LOSS_ERROR_RATIO = (0.03, 0.08)  # network_loss: requests reset
RTT_SHARE = (0.1, 0.3)  # network_latency: share of the node's segments on the delayed pod's connections
GAP_S = 1.5e-4  # each way's network time, median
GAP_FLOOR_S = 5e-5
GAP_SIGMA = 0.35
LEAD_S = (1e-5, 6e-5)  # a caller's client-side work before a call leaves
TAIL_SIGMA = 0.15  # a slowed pod's extra spread
POD_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the characters Kubernetes uses in generated names
HTTP_PORT, GRPC_PORT = 8080, 50051
GRPC_OK, GRPC_UNKNOWN, GRPC_INTERNAL, GRPC_UNAVAILABLE = 0, 2, 13, 14


@dataclass(frozen=True)
class MeshService:
    name: str
    protocol: str  # "http" or "grpc"
    operation: tuple  # http: (method, route); grpc: (rpc.service, rpc.method)
    self_s: float  # median own time, standard tier
    sigma: float
    pre: float  # share of the own time spent before the first call
    stages: tuple = ()  # ((callee, ...), ...): one stage after another, a stage's callees in parallel
    work: str | None = None  # an INTERNAL span around the own work after the calls
    gpu: bool = False
    replicas: int = 1  # up to 8 nodes
    critical: float = 1.0  # own time multiplier for the critical tier (longer prompts)

    @property
    def address(self) -> str:
        return f"{self.name}.{NAMESPACE}.{CLUSTER_DOMAIN}"

    @property
    def span_name(self) -> str:
        return f"{self.operation[0]} {self.operation[1]}" if self.protocol == "http" else "/".join(self.operation)


# The entry's standard-tier median is about 90 ms end to end (p95 well inside 200 ms even at the worst drift and
# burst), the critical tier's about 115 ms; every inner service stays inside the standard tier's objective as
# well, so that a healthy mesh keeps its SLOs whether or not the inner spans are given their trace's tier.
DEFAULT_SERVICES = (
    MeshService("gateway", "http", ("POST", "/v1/chat/completions"), 0.002, 0.3, 0.5, (("router",),), replicas=2),
    MeshService("router", "http", ("POST", "/route"), 0.003, 0.3, 0.6, (("tokenizer", "retriever"), ("llm",)),
                replicas=2),
    MeshService("tokenizer", "http", ("POST", "/tokenize"), 0.006, 0.3, 0.2),
    MeshService("retriever", "http", ("POST", "/retrieve"), 0.004, 0.3, 0.5, (("vector-db",), ("reranker",)),
                replicas=2),
    MeshService("vector-db", "grpc", ("vectordb.v1.Search", "Query"), 0.014, 0.35, 0.1, work="ann_search",
                gpu=True, replicas=2),
    MeshService("reranker", "http", ("POST", "/v1/rerank"), 0.018, 0.3, 0.1, work="rerank", gpu=True),
    MeshService("llm", "http", ("POST", "/v1/completions"), 0.038, 0.3, 0.15, (("kv-cache",),), work="generate",
                gpu=True, replicas=2, critical=1.6),
    MeshService("kv-cache", "grpc", ("kvcache.v1.Cache", "Lookup"), 0.005, 0.35, 0.1),
)


@dataclass(frozen=True)
class Pod:
    name: str
    service: int
    node: int


@dataclass
class Topology:
    services: tuple  # MeshService, the entry first, every caller before its callees
    nodes: list  # node names
    pods: list  # Pod
    pods_of: list  # service -> [pod index]
    edges: list  # (caller, callee) service indices, in call order
    parent_edge: list  # service -> the edge that calls it (None for the entry)
    depth: list

    @property
    def names(self) -> list:
        return [s.name for s in self.services]

    def index(self, name: str) -> int:
        return self.names.index(name)

    def deep_services(self) -> list:
        return [i for i, d in enumerate(self.depth) if d >= MIN_FAULT_DEPTH]

    def truth(self) -> dict:
        return {
            "entry": self.services[0].name, "namespace": NAMESPACE,
            "services": [{"name": s.name, "depth": self.depth[i], "protocol": s.protocol, "address": s.address,
                          "pods": [self.pods[p].name for p in self.pods_of[i]]} for i, s in enumerate(self.services)],
            "pods": [{"name": p.name, "service": self.services[p.service].name, "node": self.nodes[p.node]}
                     for p in self.pods],
            "nodes": list(self.nodes),
            "edges": [{"caller": self.services[a].name, "callee": self.services[b].name} for a, b in self.edges],
        }


def _generated(rng: np.random.Generator, k: int) -> str:
    return "".join(POD_ALPHABET[i] for i in rng.integers(0, len(POD_ALPHABET), size=k))


def build_topology(seed: int, nodes: list, services: tuple = DEFAULT_SERVICES) -> Topology:
    """Pods per service (its base replicas, more on fleets past 8 nodes, never two on one node), each on the
    least-loaded node that has none of its service yet, nodes taken in an order drawn by seed."""
    rng = np.random.default_rng([seed, 9])
    index = {s.name: i for i, s in enumerate(services)}
    edges, parent_edge, depth = [], [None] * len(services), [0] * len(services)
    for i, s in enumerate(services):
        for stage in s.stages:
            for callee in stage:
                j = index[callee]
                if j <= i or parent_edge[j] is not None:
                    raise ValueError(f"mesh: {callee} must be called once, by a service listed before it")
                parent_edge[j] = len(edges)
                depth[j] = depth[i] + 1
                edges.append((i, j))
    if any(p is None for p in parent_edge[1:]):
        raise ValueError("mesh: every service but the entry must be called")
    order = [int(i) for i in rng.permutation(len(nodes))]
    load = [0] * len(nodes)
    scale = max(1, math.ceil(len(nodes) / 8))
    pods, pods_of = [], []
    for i, s in enumerate(services):
        template = _generated(rng, 10)  # the ReplicaSet's pod-template hash
        mine = []
        for _ in range(min(s.replicas * scale, len(nodes))):
            taken = {pods[p].node for p in mine}
            node = min((k for k in order if k not in taken), key=lambda k: load[k])
            load[node] += 1
            mine.append(len(pods))
            pods.append(Pod(f"{s.name}-{template}-{_generated(rng, 5)}", i, node))
        pods_of.append(mine)
    return Topology(tuple(services), list(nodes), pods, pods_of, edges, parent_edge, depth)


# ------------------------------------------------------------------------------------------------ the fault


@dataclass
class MeshFault:
    """What the fault does to requests through `pod`, scaled by `effect(t)`: its own time times `self_mult`, a
    share `error_ratio` of them failing, `delay_s` added to each call to it."""

    kind: str
    pod: int
    service: int
    start: float
    ramp: float
    end: float
    self_mult: float = 1.0
    error_ratio: float = 0.0
    delay_s: float = 0.0

    def effect(self, t: np.ndarray) -> np.ndarray:
        return np.clip((t - self.start) / self.ramp, 0.0, 1.0) * np.clip(1.0 - (t - self.end) / 10.0, 0.0, 1.0)


@dataclass
class InjectedMeshFault:
    truth: dict
    fault: MeshFault
    node: int
    physical: planning.InjectedFault | None  # for a physical cause: what the effect confounder is calibrated on
    score: float


def fault_kinds() -> tuple:
    return faults.PHYSICAL_CAUSES + MESH_FAULTS


def _choose_pod(topo: Topology, kind: str, service: str | None, node: int | None,
                frng: np.random.Generator) -> int:
    if service is not None:
        if service not in topo.names:
            raise ValueError(f"unknown mesh service {service!r}: expected one of {', '.join(topo.names)}")
        cands = [topo.index(service)]
        if cands[0] == 0:
            raise ValueError(f"the fault cannot be on the entry service {service}: choose a service it calls")
    else:
        cands = topo.deep_services()
        if kind in faults.PHYSICAL_CAUSES and taxonomy.BY_ID[kind].layer == "gpu":
            # a GPU fault slows the services that use the GPU
            cands = [i for i in cands if topo.services[i].gpu] or cands
    pods = [p for s in cands for p in topo.pods_of[s]]
    if node is not None:
        pods = [p for p in pods if topo.pods[p].node == node]
        if not pods:
            raise ValueError(f"no pod of {service or 'a service at depth >= 2'} runs on {topo.nodes[node]}")
        services = sorted({topo.pods[p].service for p in pods})
        s = services[int(frng.integers(0, len(services)))]
        pods = [p for p in pods if topo.pods[p].service == s]
    else:
        s = cands[int(frng.integers(0, len(cands)))]
        pods = topo.pods_of[s]
    return pods[int(frng.integers(0, len(pods)))]


def _slower(svc: MeshService, frng: np.random.Generator) -> float:
    """x3-x10 the pod's own time, or more where that adds too little to break the entry's SLO."""
    mult = frng.uniform(*SELF_MULTIPLIER)
    added = frng.uniform(*SELF_ADDED_S)
    return round(float(max(mult, 1.0 + added / svc.self_s)), 2)


def inject(run: planning.Run, topo: Topology, kind: str, service: str | None, node: int | None, onset: int,
           duration_s: float, frng: np.random.Generator, where_rng: np.random.Generator) -> InjectedMeshFault:
    """Place the fault on one pod (drawn from `where_rng`) and bend what it moves (from `frng`); its ground truth."""
    p = _choose_pod(topo, kind, service, node, where_rng)
    pod = topo.pods[p]
    svc = topo.services[pod.service]
    where = {"service": svc.name, "pod": pod.name, "node": run.names[pod.node]}
    if kind in faults.PHYSICAL_CAUSES:
        nf = planning.node_fault(run, kind, pod.node, onset, duration_s, frng)
        sli_onset, end = onset + nf.lag, onset + nf.duration
        mult = _slower(svc, frng)
        errors = round(float(frng.uniform(*LOSS_ERROR_RATIO)), 4) if kind == "network_loss" else 0.0
        fault = MeshFault(kind, p, pod.service, float(sli_onset), 5.0, float(end + nf.lag), self_mult=mult,
                          error_ratio=errors)
        truth = {"kind": kind, "cause": kind, "layer": taxonomy.BY_ID[kind].layer, **where,
                 "onset": run.at(onset), "end": run.at(end), **nf.target,
                 "evidence": faults.describe_series([s for s, _ in nf.evidence]), "ramp_s": round(nf.ramp, 1),
                 "sli_onset": run.at(sli_onset), "self_time_multiplier": mult, "error_ratio": errors or None,
                 "reference_score": round(nf.score, 2)}
        injected = planning.InjectedFault(truth, None, nf.score, nf.baseline, sli_onset, end)
        return InjectedMeshFault(truth, fault, pod.node, injected, nf.score)
    duration = planning.fault_window(run.n, onset, duration_s)
    end = onset + duration
    truth = {"kind": kind, "cause": FAULT_CAUSE[kind], "layer": FAULT_LAYER[kind], **where,
             "onset": run.at(onset), "end": run.at(end), "sli_onset": run.at(onset)}
    score = 0.0
    if kind == "network_latency":
        delay = round(float(frng.uniform(*ADDED_LATENCY_S)), 4)
        share = float(frng.uniform(*RTT_SHARE))
        ramp = float(frng.uniform(2, 5))
        fault = MeshFault(kind, p, pod.service, float(onset), ramp, float(end), delay_s=delay)
        series = run.nodes[pod.node].find(RTT)
        prof = faults.profile(run.n, onset, ramp, end)
        for s in series:  # the delayed pod's connections pull the node's mean round trip up
            faults.scale_to(s, prof, faults.native_median(s) + share * delay)
        base = faults.baseline_window(onset)
        score = max((faults.robust_score(s, base, (onset + int(math.ceil(ramp)), end)) for s in series), default=0.0)
        truth.update({"callers": [topo.services[topo.edges[topo.parent_edge[pod.service]][0]].name],
                      "added_latency_ms": round(delay * 1e3, 1), "ramp_s": round(ramp, 1),
                      "evidence": faults.describe_series(series), "reference_score": round(score, 2)})
    elif kind == "slow_handler":
        mult = _slower(svc, frng)
        fault = MeshFault(kind, p, pod.service, float(onset), 5.0, float(end), self_mult=mult)
        truth.update({"self_time_multiplier": mult, "evidence": []})
    elif kind == "exceptions":
        errors = round(float(frng.uniform(*ERROR_RATIO)), 4)
        fault = MeshFault(kind, p, pod.service, float(onset), 5.0, float(end), error_ratio=errors)
        truth.update({"error_ratio": errors, "evidence": []})
    else:
        raise ValueError(f"unknown mesh fault {kind!r}: expected one of {', '.join(fault_kinds())}")
    return InjectedMeshFault(truth, fault, pod.node, None, score)


# ------------------------------------------------------------------------------------------------ the plan


@dataclass
class MeshPlan:
    seed: int
    n: int
    start_ns: int
    flush: int
    topology: Topology
    rate: float  # entry requests/s, before bursts
    bursts: dict  # entry service -> burst start seconds
    pod_factor: np.ndarray  # per pod
    drift_phase: np.ndarray
    drift_period: np.ndarray
    fleet_drift_phase: float
    fault: MeshFault | None = None
    cache: dict = field(default_factory=dict, repr=False)

    def burst_mask(self, secs: np.ndarray) -> np.ndarray:
        b = next(iter(self.bursts.values()))
        if len(b) == 0:
            return np.zeros(len(secs), dtype=bool)
        idx = np.searchsorted(b, secs, side="right") - 1
        return (idx >= 0) & (secs - b[np.maximum(idx, 0)] < traffic.BURST_S)


def make_plan(seed: int, n: int, start_ns: int, flush: int, topo: Topology, rate: float,
              fault: MeshFault | None = None) -> MeshPlan:
    rng = np.random.default_rng([seed, 10])
    k = rng.poisson(n / traffic.BURST_EVERY_S)
    bursts = {topo.services[0].name: np.sort(rng.integers(0, max(n - traffic.BURST_S, 1), size=k)).astype(np.int64)}
    npods = len(topo.pods)
    return MeshPlan(seed, n, start_ns, flush, topo, rate, bursts,
                    pod_factor=1.0 + rng.uniform(-traffic.NODE_FACTOR, traffic.NODE_FACTOR, size=npods),
                    drift_phase=rng.uniform(0, 2 * math.pi, size=npods),
                    drift_period=rng.uniform(900, 3600, size=npods),
                    fleet_drift_phase=float(rng.uniform(0, 2 * math.pi)), fault=fault)


# ------------------------------------------------------------------------------------------------ requests


@dataclass
class Requests:
    """One chunk's requests, every array over them: per service (list index) and per edge."""

    t: np.ndarray  # arrival, seconds into the run
    ids: np.ndarray  # (N, 2 + 2 services + edges) uint64: trace id, SERVER and INTERNAL span ids, CLIENT span ids
    frag: np.ndarray  # entry tier header fragment
    tier: np.ndarray  # 0 critical, 1 standard
    entry_code: np.ndarray  # the entry's own answer without calling anyone (4xx), else 0
    pod: list
    self_s: list
    pre: list
    own_fail: list
    own_code: list
    lead: list
    out: list
    back: list
    called: list = field(default_factory=list)
    start: list = field(default_factory=list)
    end: list = field(default_factory=list)
    work_start: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    code: list = field(default_factory=list)
    e_called: list = field(default_factory=list)
    c_start: list = field(default_factory=list)
    c_end: list = field(default_factory=list)


def _drift(plan: MeshPlan, pod: np.ndarray, t: np.ndarray) -> np.ndarray:
    d = 1.0 + traffic.DRIFT * np.sin(2 * math.pi * t / plan.drift_period[pod] + plan.drift_phase[pod])
    return d * (1.0 + traffic.FLEET_DRIFT * np.sin(2 * math.pi * t / traffic.FLEET_DRIFT_PERIOD_S +
                                                   plan.fleet_drift_phase))


def draw_requests(plan: MeshPlan, chunk: int, a: int, b: int) -> Requests | None:
    """The requests arriving in seconds [a, b), with every draw made whether or not a fault uses it, so that
    a faulty run's requests are its healthy twin's but for what the fault changes."""
    topo = plan.topology
    rng = np.random.default_rng([plan.seed, 8, chunk])
    secs = np.arange(a, b, dtype=np.int64)
    burst = plan.burst_mask(secs)
    counts = rng.poisson(plan.rate * np.where(burst, traffic.BURST_RATE, 1.0))
    total = int(counts.sum())
    if total == 0:
        return None
    t = np.repeat(secs, counts) + rng.random(total)
    t.sort()
    in_burst = np.repeat(burst, counts)
    frag, tier, critical = traffic.draw_tiers(rng, total)
    c4 = rng.random(total) < traffic.BASE_4XX
    entry_code = np.where(c4, np.asarray(traffic.STATUS_CODES_4XX)[
        rng.integers(0, len(traffic.STATUS_CODES_4XX), size=total)], 0)
    base_fail = rng.random(total) < traffic.BASE_5XX
    origin = rng.integers(0, len(topo.services), size=total)
    base_code = np.asarray(traffic.STATUS_CODES_5XX)[rng.integers(0, len(traffic.STATUS_CODES_5XX), size=total)]
    f = plan.fault
    q = f.effect(t) if f is not None else np.zeros(total)
    pods, selfs, pres, fault_fail = [], [], [], []
    for i, svc in enumerate(topo.services):
        mine = np.asarray(topo.pods_of[i])
        pod = mine[rng.integers(0, len(mine), size=total)]
        z = np.clip(rng.standard_normal(total), -traffic.Z_CLIP, traffic.Z_CLIP)
        tail = np.exp(TAIL_SIGMA * np.abs(rng.standard_normal(total)))
        u_fail = rng.random(total)
        pre = np.clip(svc.pre + rng.uniform(-0.1, 0.1, size=total), 0.0, 1.0)
        s = svc.self_s * np.where(critical, svc.critical, 1.0) * plan.pod_factor[pod] * _drift(plan, pod, t) * \
            np.where(in_burst, traffic.BURST_LATENCY, 1.0) * np.exp(svc.sigma * z)
        hit = np.zeros(total, dtype=bool)
        if f is not None and f.service == i:
            on = (pod == f.pod) & (q > 0)
            s = np.where(on, s * (1.0 + (f.self_mult - 1.0) * q) * tail ** q, s) if f.self_mult != 1.0 else s
            hit = on & (u_fail < f.error_ratio * q)
        pods.append(pod)
        selfs.append(s)
        pres.append(pre)
        fault_fail.append(hit)
    leads, outs, backs = [], [], []
    for caller, callee in topo.edges:
        lead = rng.uniform(*LEAD_S, size=total)
        out = GAP_FLOOR_S + GAP_S * np.exp(GAP_SIGMA * rng.standard_normal(total))
        back = GAP_FLOOR_S + GAP_S * np.exp(GAP_SIGMA * rng.standard_normal(total))
        jitter = np.exp(0.15 * rng.standard_normal(total))
        if f is not None and f.delay_s and f.service == callee:
            extra = np.where(pods[callee] == f.pod, q * f.delay_s * jitter, 0.0)
            out, back = out + extra / 2, back + extra / 2
        leads.append(lead)
        outs.append(out)
        backs.append(back)
    ids = rng.integers(1, np.iinfo(np.uint64).max, size=(total, 2 + 2 * len(topo.services) + len(topo.edges)),
                       dtype=np.uint64, endpoint=True)
    # baseline 5xx only where every step they land in absorbs them: the entry's, and each pod's on their way
    if base_fail.any():
        step = (t // 10).astype(np.int64)
        npods = len(topo.pods)
        keys = [step, ((t + 1.0) // 10).astype(np.int64)] + [step * npods + p for p in pods]
        base_fail = traffic.budget_filter(base_fail, tier, keys)
    own_fail, own_code = [], []
    thrown = f is not None and f.kind == "exceptions"  # else the fault's failures are reset connections
    for i, svc in enumerate(topo.services):
        own_fail.append((base_fail & (origin == i)) | fault_fail[i])
        if svc.protocol == "grpc":
            own_code.append(np.where(fault_fail[i], GRPC_UNKNOWN if thrown else GRPC_UNAVAILABLE, GRPC_UNAVAILABLE))
        else:
            own_code.append(np.where(fault_fail[i], 500 if thrown else 503, base_code))
    req = Requests(t, ids, frag, tier, entry_code, pods, selfs, pres, own_fail, own_code, leads, outs, backs)
    _serve_all(topo, req)
    return req


def _serve_all(topo: Topology, req: Requests) -> None:
    """Every span's times and outcome: the entry serves every request, each service its callers' live calls."""
    total = len(req.t)
    ns, ne = len(topo.services), len(topo.edges)
    req.called, req.start, req.end = [None] * ns, [None] * ns, [None] * ns
    req.work_start, req.failed, req.code = [None] * ns, [None] * ns, [None] * ns
    req.e_called, req.c_start, req.c_end = [None] * ne, [None] * ne, [None] * ne
    edge_of = {e: k for k, e in enumerate(topo.edges)}

    def serve(i: int, start: np.ndarray, go: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        svc = topo.services[i]
        own = req.self_s[i]
        cursor = start + own * req.pre[i]
        failed = go & req.own_fail[i]
        live = go & ~failed
        if i == 0:
            live = live & (req.entry_code == 0)
        for stage in svc.stages:
            stage_end, stage_failed = cursor.copy(), np.zeros(total, dtype=bool)
            for callee in stage:
                j = topo.index(callee)
                k = edge_of[(i, j)]
                cs = cursor + req.lead[k]
                se, cf = serve(j, cs + req.out[k], live)
                ce = se + req.back[k]
                req.e_called[k], req.c_start[k], req.c_end[k] = live, cs, ce
                stage_end = np.where(live, np.maximum(stage_end, ce), stage_end)
                stage_failed |= live & cf
            cursor = stage_end
            failed = failed | stage_failed
            live = live & ~stage_failed  # a failed call ends the handler's work: its later stages are not called
        end = cursor + own * (1.0 - req.pre[i])
        req.called[i], req.start[i], req.end[i], req.work_start[i], req.failed[i] = go, start, end, cursor, failed
        if svc.protocol == "grpc":
            req.code[i] = np.where(req.own_fail[i], req.own_code[i], np.where(failed, GRPC_INTERNAL, GRPC_OK))
        else:
            code = np.where(req.own_fail[i], req.own_code[i], np.where(failed, 500, 200))
            req.code[i] = np.where(req.entry_code > 0, req.entry_code, code) if i == 0 else code
        return end, failed

    serve(0, req.t.copy(), np.ones(total, dtype=bool))

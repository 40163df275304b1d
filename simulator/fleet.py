"""The fleet simulator: OTLP-JSON metrics and spans of a GPU inference fleet, healthy or with one injected
fault, plus a separate ground-truth file.

Root-cause analysis may only read what a real fleet would show, so everything the simulator knows beyond
the telemetry (the fault, its onset, the confounders) goes to `ground_truth.json` and nowhere else.

    from sloscope.simulator.fleet import SimulationConfig, simulate
    truth = simulate(SimulationConfig(out="/tmp/run", nodes=4, duration_s=1200, fault="cpu_contention"))

Output, in `out`: `metrics.jsonl.gz`, `traces.jsonl.gz` (one Export*ServiceRequest per line, one line per
node per flush interval; several gzip members, which every gzip reader concatenates) and `ground_truth.json`.

With `mesh=True` the services call each other as a tree of pods over the nodes, each request one trace, and the
fault sits on one pod (simulator/mesh.py); the nodes' signals and confounders are made as for a flat fleet.

With `inference=True` every node runs one vLLM-like replica whose engine makes token-level spans and engine metrics
(simulator/inference.py), and the spec of their token objectives goes beside the data as `slo.yaml`.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import zlib
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from sloscope.simulator import blips, faults, inference, mesh, mesh_otlp, otlp_json, planning, signals, traffic
from sloscope.simulator.series_render import materialize
from sloscope.times import parse_rfc3339, rfc3339

METRICS_FILE = "metrics.jsonl"
TRACES_FILE = "traces.jsonl"
TRUTH_FILE = "ground_truth.json"
COLLECTOR_SERVICE = "sloscope-collector"
NODE_PREFIX = "gpu-node-"
NAMESPACE = "inference"
CHUNK_S = 60  # rendering unit (and the span RNG's unit): output does not depend on the worker count
RUN_COUNTS = ("metric_lines", "data_points", "trace_lines", "server_spans", "client_spans", "internal_spans")


@dataclass
class SimulationConfig:
    out: str | Path | None = None
    nodes: int = 4
    duration_s: int = 1200
    start: datetime | str | None = None  # RFC 3339; default: now minus duration, truncated to the second
    seed: int = 0
    rate: float = 10.0  # requests/s per service per node
    services: tuple = traffic.DEFAULT_SERVICES
    fault: str | None = None  # a physical cause of the taxonomy, or with mesh a mesh fault; None or "none": healthy
    fault_node: str | int | None = None  # node name or 1-based number; default drawn by seed
    fault_at_s: int | None = None  # onset, seconds after start; default mid-run, >= 10 min of baseline
    fault_duration_s: int = 300
    flush_interval_s: int = 10
    compress: bool = True
    workers: int | None = None  # processes for rendering; None: automatic
    mesh: bool = False  # an entry service calling a tree of services over the nodes (simulator/mesh.py)
    fault_service: str | None = None  # mesh: the service of the fault's pod; default drawn among the deep ones
    inference: bool = False  # one vLLM-like replica per node, token-level spans (simulator/inference.py)


@dataclass
class GroundTruth:
    seed: int
    start: str
    end: str
    nodes: list
    services: list
    fault: dict | None
    effect: dict | None
    fleet_wide: dict | None
    counter_reset: dict | None
    extra: dict = field(default_factory=dict)  # slo, bursts, files, counts, config

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------------------------------------ the fleet


@dataclass
class Fleet:
    """A planned, generated fleet (all numbers, nothing serialised yet)."""

    config: SimulationConfig
    n: int
    start: datetime
    start_ns: int
    names: list
    nodes: list  # NodeSeries
    plan: traffic.TrafficPlan | mesh.MeshPlan | inference.InferencePlan
    truth: GroundTruth
    reset: tuple | None  # (node index, second of restart, gap)

    def at(self, second: float) -> str:
        return _time_at(self.start, second)


def _time_at(start: datetime, second: float) -> str:
    """`second` seconds into the run, in RFC 3339 to the microsecond: a run may start at any."""
    return rfc3339(start + timedelta(seconds=float(second)), fraction=True)


def _resolve_node(value, names: list, rng: np.random.Generator) -> int:
    if value is None:
        return int(rng.integers(0, len(names)))
    if isinstance(value, str) and value in names:
        return names.index(value)
    try:
        i = int(str(value).removeprefix(NODE_PREFIX))
    except ValueError:
        raise ValueError(f"unknown node {value!r}: expected one of {names[0]}..{names[-1]} or 1..{len(names)}")
    if not 1 <= i <= len(names):
        raise ValueError(f"node {value!r} out of range 1..{len(names)}")
    return i - 1


def default_onset(n: int) -> int:
    """Mid-run, leaving at least 10 min of healthy baseline where the run is long enough."""
    return int(max(n // 2, min(600, int(0.6 * n))))


def _validate(cfg: SimulationConfig) -> None:
    if cfg.nodes < 1:
        raise ValueError("nodes must be >= 1")
    if int(cfg.duration_s) < 120:
        raise ValueError("duration must be at least 2 min")
    if cfg.flush_interval_s < 1 or int(cfg.flush_interval_s) != cfg.flush_interval_s:
        raise ValueError("flush interval must be a whole number of seconds")
    if cfg.rate <= 0:
        raise ValueError("rate must be > 0")
    if not cfg.services or len(set(cfg.services)) != len(cfg.services):
        raise ValueError("services must be non-empty and distinct")
    if cfg.mesh and cfg.inference:
        raise ValueError("a mesh (--mesh) and inference replicas (--inference) are different fleets: choose one")
    kinds = mesh.fault_kinds() if cfg.mesh else inference.FAULT_KINDS if cfg.inference else faults.PHYSICAL_CAUSES
    if cfg.fault not in (None, "none") and cfg.fault not in kinds:
        if cfg.fault in mesh.fault_kinds() and not cfg.inference:
            raise ValueError(f"fault {cfg.fault!r} needs a mesh (--mesh): a flat fleet has no calls between services")
        raise ValueError(f"unknown fault {cfg.fault!r}: expected none or one of {', '.join(kinds)}")
    if cfg.fault_service is not None and not cfg.mesh:
        raise ValueError("a fault service needs a mesh (--mesh): on a flat fleet every node runs every service")
    if cfg.fault_service is not None and cfg.fault in (None, "none"):
        raise ValueError("a fault service needs a fault")
    if not cfg.mesh and not cfg.inference:
        traffic.check_latency_margin(cfg.services)


def _run_start(cfg: SimulationConfig, n: int) -> datetime:
    """The run's first moment as an aware UTC datetime (a naive one is UTC): its epoch seconds place every point."""
    if cfg.start is None:
        return (datetime.now(timezone.utc) - timedelta(seconds=n)).replace(microsecond=0)
    start = cfg.start if isinstance(cfg.start, datetime) else parse_rfc3339(cfg.start, "start")
    return (start if start.tzinfo else start.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def build_fleet(cfg: SimulationConfig) -> Fleet:
    """Plan and generate every series and the traffic plan; deterministic for (seed, start, shape)."""
    _validate(cfg)
    n = int(cfg.duration_s)
    start = _run_start(cfg, n)
    start_ns = int(start.timestamp()) * 10**9 + start.microsecond * 1000
    names = [f"{NODE_PREFIX}{i + 1}" for i in range(cfg.nodes)]
    seed = int(cfg.seed)
    rng = np.random.default_rng([seed, 0])
    if cfg.mesh:
        return _build_mesh_fleet(cfg, n, start, start_ns, names, rng)
    if cfg.inference:
        return _build_inference_fleet(cfg, n, start, start_ns, names, rng)
    run = planning.Run(n, names, [signals.build_node(seed, i, names[i], n) for i in range(cfg.nodes)],
                       tuple(cfg.services), lambda second: _time_at(start, second))
    cause = None if cfg.fault in (None, "none") else cfg.fault
    onset = int(cfg.fault_at_s) if cfg.fault_at_s is not None else default_onset(n)
    fault_node = _resolve_node(cfg.fault_node, names, rng)
    frng = np.random.default_rng([seed, 5])
    fault = effect_truth = None
    effect_signals: set = set()
    if cause is not None:
        probe_plan = traffic.make_plan(seed, n, start_ns, cfg.flush_interval_s, run.services, names, cfg.rate)
        fault = planning.inject_fault(run, cause, fault_node, onset, cfg.fault_duration_s, probe_plan, frng)
        effect_truth, effect_signals = planning.add_effect(run, cause, fault_node, fault, frng)
    fleet_truth = planning.add_fleet_wide_change(run, cause, fault_node, onset, fault.score if fault else 0.0,
                                                 effect_signals, frng)
    reset, reset_truth = planning.plan_restart(run, cause, onset, rng)
    innocent = blips.add_blips(run.nodes, names, fault_node if cause else None, n, seed, run.at)
    plan = traffic.make_plan(seed, n, start_ns, int(cfg.flush_interval_s), run.services, names, cfg.rate,
                             fault.latency if fault else None)
    truth = GroundTruth(
        seed=seed, start=run.at(0), end=run.at(n), nodes=list(names), services=list(run.services),
        fault=fault.truth if fault else None, effect=effect_truth, fleet_wide=fleet_truth, counter_reset=reset_truth,
        extra=_truth_extra(plan, run, innocent))
    return Fleet(cfg, n, start, start_ns, names, run.nodes, plan, truth, reset)


def _build_mesh_fleet(cfg: SimulationConfig, n: int, start: datetime, start_ns: int, names: list,
                      rng: np.random.Generator) -> Fleet:
    """build_fleet for a mesh: the same nodes, fault window and confounders; the fault on one pod."""
    seed = int(cfg.seed)
    topo = mesh.build_topology(seed, names)
    run = planning.Run(n, names, [signals.build_node(seed, i, names[i], n) for i in range(cfg.nodes)],
                       tuple(topo.names), lambda second: _time_at(start, second))
    kind = None if cfg.fault in (None, "none") else cfg.fault
    onset = int(cfg.fault_at_s) if cfg.fault_at_s is not None else default_onset(n)
    ref_node = _resolve_node(cfg.fault_node, names, rng)
    frng = np.random.default_rng([seed, 5])
    injected = effect_truth = None
    effect_signals: set = set()
    if kind is not None:
        chosen = ref_node if cfg.fault_node is not None else None
        # the pod is drawn per fault kind, so that one seed's faults of different kinds land on different services
        where_rng = np.random.default_rng([seed, 12, zlib.crc32(kind.encode())])
        injected = mesh.inject(run, topo, kind, cfg.fault_service, chosen, onset, cfg.fault_duration_s, frng,
                               where_rng)
        ref_node = injected.node
        if injected.physical is not None:
            effect_truth, effect_signals = planning.add_effect(run, kind, ref_node, injected.physical, frng)
    # the fleet-wide change keeps clear of a physical cause's own evidence; the mesh's other faults have none
    physical = kind if kind in faults.PHYSICAL_CAUSES else None
    fleet_truth = planning.add_fleet_wide_change(run, physical, ref_node, onset, injected.score if injected else 0.0,
                                                 effect_signals, frng)
    reset, reset_truth = planning.plan_restart(run, kind, onset, rng)
    innocent = blips.add_blips(run.nodes, names, ref_node if kind else None, n, seed, run.at)
    plan = mesh.make_plan(seed, n, start_ns, int(cfg.flush_interval_s), topo, cfg.rate * cfg.nodes,
                          injected.fault if injected else None)
    extra = _truth_extra(plan, run, innocent)
    extra["topology"] = topo.truth()
    truth = GroundTruth(
        seed=seed, start=run.at(0), end=run.at(n), nodes=list(names), services=list(topo.names),
        fault=injected.truth if injected else None, effect=effect_truth, fleet_wide=fleet_truth,
        counter_reset=reset_truth, extra=extra)
    return Fleet(cfg, n, start, start_ns, names, run.nodes, plan, truth, reset)


def _build_inference_fleet(cfg: SimulationConfig, n: int, start: datetime, start_ns: int, names: list,
                           rng: np.random.Generator) -> Fleet:
    """build_fleet for inference replicas: the nodes' signals, the fault on one node, blips on the others, and
    every node's engine run on its (possibly changed) inputs."""
    seed = int(cfg.seed)
    run = planning.Run(n, names, [signals.build_node(seed, i, names[i], n) for i in range(cfg.nodes)],
                       (inference.SERVICE,), lambda second: _time_at(start, second))
    kind = None if cfg.fault in (None, "none") else cfg.fault
    onset = int(cfg.fault_at_s) if cfg.fault_at_s is not None else default_onset(n)
    fault_node = _resolve_node(cfg.fault_node, names, rng)
    fault_truth, profile = (None, None) if kind is None else \
        inference.inject(run, kind, fault_node, onset, cfg.fault_duration_s, np.random.default_rng([seed, 5]))
    innocent = blips.add_blips(run.nodes, names, fault_node if kind else None, n, seed, run.at)
    requests = [inference.plan_node(seed, node, n, cfg.rate, (kind, profile) if kind and i == fault_node else None)
                for i, node in enumerate(run.nodes)]
    plan = inference.InferencePlan(seed, start_ns, int(cfg.flush_interval_s), requests, {})
    extra = _truth_extra(plan, run, innocent)
    extra["slo"] = {"file": inference.SPEC_FILE, "spec": inference.SPEC}
    truth = GroundTruth(seed=seed, start=run.at(0), end=run.at(n), nodes=list(names), services=[inference.SERVICE],
                        fault=fault_truth, effect=None, fleet_wide=None, counter_reset=None, extra=extra)
    return Fleet(cfg, n, start, start_ns, names, run.nodes, plan, truth, None)


def _truth_extra(plan: traffic.TrafficPlan | mesh.MeshPlan | inference.InferencePlan, run: planning.Run,
                 innocent: list) -> dict:
    """The ground truth beside the fault and its confounders: the spec the traffic was made for, bursts, blips."""
    return {
        "slo": {"default_tier": traffic.DEFAULT_TIER,
                "tiers": {t: {"latency": {"percentile": v["percentile"], "threshold_ms": v["threshold_s"] * 1e3},
                              "availability": v["availability"]} for t, v in traffic.TIERS.items()},
                "resolution": "10s"},
        "bursts": {s: [run.at(b) for b in bursts.tolist()] for s, bursts in plan.bursts.items()},
        "blips": innocent,
        "reference_score": "median over the anomaly of the harmful-direction deviation from the median of "
                           "the 10 min before it (ending 30 s before), in baseline IQRs floored at the "
                           "catalog noise floor; per-second gauge values, counter deltas, histogram means",
    }


# ------------------------------------------------------------------------------------------------ rendering


class _Renderer:
    def __init__(self, fleet: Fleet, release: bool = False):
        self.fleet = fleet
        self.renders = []
        for i, node in enumerate(fleet.nodes):
            self.renders.append(materialize(fleet, i))
            if release:  # the native series are not needed once rendered: halve peak memory on big runs
                node.series = []
        cfg = fleet.config
        self.metric_heads = {name: otlp_json.metric_head(name) for name, _ in self.renders[0]}
        self.line_heads = [otlp_json.metrics_line_head([("host.name", nm), ("k8s.node.name", nm),
                                                        ("service.name", COLLECTOR_SERVICE)]) for nm in fleet.names]
        self.span_heads = [[otlp_json.traces_resource_head([
            ("service.name", svc), ("service.namespace", NAMESPACE), ("host.name", nm), ("k8s.node.name", nm),
            ("k8s.namespace.name", NAMESPACE), ("k8s.pod.name", _pod(fleet.config.seed, svc, i))])
            for svc in cfg.services] for i, nm in enumerate(fleet.names)] if not (cfg.mesh or cfg.inference) else \
            inference.span_heads(fleet.names, [_pod(cfg.seed, inference.SERVICE, i) for i in range(len(fleet.names))])
        self.flush = int(cfg.flush_interval_s)
        self.chunk_s = max(1, CHUNK_S // self.flush) * self.flush
        self.chunks = int(math.ceil(fleet.n / self.chunk_s))

    def render(self, ci: int) -> tuple[str, str, dict]:
        f = self.fleet
        a, b = ci * self.chunk_s, min(f.n, (ci + 1) * self.chunk_s)
        intervals = range(a // self.flush, (b - 1) // self.flush + 1)
        stats = dict.fromkeys(RUN_COUNTS, 0)
        mlines: dict = {j: [] for j in intervals}
        for i, groups in enumerate(self.renders):
            node = f.nodes[i]
            ts = [str(f.start_ns + node.phase_ns + k * 10**9) for k in range(a, b)]
            pts = [(name, [sr.points(ts, a, b) for sr in srs]) for name, srs in groups]
            gap = None
            if f.reset and f.reset[0] == i:
                gap = (f.reset[1], f.reset[1] + f.reset[2])
            for j in intervals:
                lo, hi = max(a, j * self.flush), min(b, (j + 1) * self.flush)
                keep = [k - a for k in range(lo, hi) if gap is None or not gap[0] <= k < gap[1]]
                if not keep:
                    continue
                ka, kb = keep[0], keep[-1] + 1
                contiguous = len(keep) == kb - ka
                parts = []
                for name, lists in pts:
                    if contiguous:
                        dp = [p for lst in lists for p in lst[ka:kb]]
                    else:
                        dp = [lst[k] for lst in lists for k in keep]
                    stats["data_points"] += len(dp)
                    h, t = self.metric_heads[name]
                    parts.append(h + ",".join(dp) + t)
                mlines[j].append(self.line_heads[i] + ",".join(parts) + otlp_json.METRICS_LINE_TAIL)
        if isinstance(f.plan, mesh.MeshPlan):
            tlines = self._mesh_traces(ci, a, b, intervals, stats)
        elif isinstance(f.plan, inference.InferencePlan):
            tlines = inference.chunk_spans(f.plan, self.span_heads, a, b, intervals, stats)
        else:
            tlines = self._flat_traces(ci, a, b, intervals, stats)
        mtext = "".join(["\n".join(mlines[j]) + "\n" for j in intervals if mlines[j]])
        ttext = "".join(["\n".join(tlines[j]) + "\n" for j in intervals if tlines[j]])
        stats["metric_lines"] = sum(len(v) for v in mlines.values())
        stats["trace_lines"] = sum(len(v) for v in tlines.values())
        return mtext, ttext, stats

    def _mesh_traces(self, ci: int, a: int, b: int, intervals: range, stats: dict) -> dict:
        tb = mesh_otlp.render_chunk(self.fleet.plan, ci, a, b)
        stats["server_spans"], stats["client_spans"], stats["internal_spans"] = tb.server, tb.client, tb.internal
        return {j: tb.lines.get(j, []) for j in intervals}

    def _flat_traces(self, ci: int, a: int, b: int, intervals: range, stats: dict) -> dict:
        f = self.fleet
        tlines: dict = {j: [] for j in intervals}
        for i in range(len(f.nodes)):
            batches = [traffic.chunk_spans(f.plan, i, s, ci, a, b) for s in range(len(f.plan.services))]
            for sb in batches:
                stats["server_spans"] += sb.server
                stats["client_spans"] += sb.client
            for j in intervals:
                res = [self.span_heads[i][s] + ",".join(sb.by_interval[j]) + otlp_json.TRACES_RESOURCE_TAIL
                       for s, sb in enumerate(batches) if sb.by_interval.get(j)]
                if res:
                    tlines[j].append('{"resourceSpans":[' + ",".join(res) + "]}")
        return tlines


def _pod(seed: int, service: str, node: int) -> str:
    h = zlib.crc32(f"{seed}/{service}/{node}".encode())
    return f"{service}-{h:08x}"[:63]


_ACTIVE: _Renderer | None = None  # shared with forked workers


def _render_compressed(args: tuple) -> tuple[bytes, bytes, dict]:
    ci, compress = args
    mtext, ttext, stats = _ACTIVE.render(ci)
    return _encode(mtext, compress), _encode(ttext, compress), stats


def _encode(text: str, compress: bool) -> bytes:
    data = text.encode("utf-8")
    if not compress:
        return data
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # one gzip member
    return z.compress(data) + z.flush()


def _workers(cfg: SimulationConfig, fleet: Fleet) -> int:
    if cfg.workers is not None:
        return max(1, int(cfg.workers))
    if len(fleet.nodes) * fleet.n < 20 * 3600:
        return 1
    return max(1, min(os.cpu_count() or 1, 8))


def simulate(cfg: SimulationConfig) -> GroundTruth:
    """Generate the fleet and write metrics, traces and ground truth into `cfg.out`."""
    global _ACTIVE
    if cfg.out is None:
        raise ValueError("SimulationConfig.out is required")
    out = _output_directory(Path(cfg.out))
    fleet = build_fleet(cfg)
    renderer = _Renderer(fleet, release=True)
    suffix = ".gz" if cfg.compress else ""
    mpath, tpath = out / (METRICS_FILE + suffix), out / (TRACES_FILE + suffix)
    for stale in (out / METRICS_FILE, out / TRACES_FILE, out / (METRICS_FILE + ".gz"), out / (TRACES_FILE + ".gz")):
        if stale.exists() and stale not in (mpath, tpath):
            stale.unlink()
    totals = dict.fromkeys(RUN_COUNTS, 0)
    tasks = [(ci, cfg.compress) for ci in range(renderer.chunks)]
    workers = _workers(cfg, fleet)
    _ACTIVE = renderer
    try:
        with open(mpath, "wb") as mf, open(tpath, "wb") as tf:
            if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
                ctx = multiprocessing.get_context("fork")
                with ctx.Pool(workers) as pool:
                    results = pool.imap(_render_compressed, tasks)
                    _drain(results, mf, tf, totals)
            else:
                _drain(map(_render_compressed, tasks), mf, tf, totals)
    finally:
        _ACTIVE = None
    truth = fleet.truth
    truth.extra["files"] = {"metrics": mpath.name, "traces": tpath.name}
    truth.extra["counts"] = totals
    truth.extra["config"] = {
        "nodes": cfg.nodes, "duration_s": fleet.n, "rate": cfg.rate, "flush_interval_s": int(cfg.flush_interval_s),
        "services": list(fleet.truth.services), "fault": cfg.fault or "none",
        "fault_duration_s": cfg.fault_duration_s,
    }
    if cfg.mesh:
        truth.extra["config"].update(mesh=True, entry_rate=cfg.rate * cfg.nodes, fault_service=cfg.fault_service)
    if cfg.inference:
        truth.extra["config"].update(inference=True)
        (out / inference.SPEC_FILE).write_text(inference.SPEC)
    truth.write(out / TRUTH_FILE)
    return truth


def _output_directory(out: Path) -> Path:
    """out, created where it is not yet; ValueError where it cannot be, before any work is done."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"output directory {out}: a file of that name is there; give a directory") from None
    except OSError as exc:
        raise ValueError(f"output directory {out}: cannot create it: {exc.strerror}") from None
    return out


def _drain(results, mf, tf, totals) -> None:
    for mbytes, tbytes, stats in results:
        mf.write(mbytes)
        tf.write(tbytes)
        for k, v in stats.items():
            totals[k] += v

"""What happens in a simulated run, and its ground truth: the injected fault with its request response, an effect
of it on the fault's node, a fleet-wide change near it, and a collector restart.

Every draw comes from the generator it is given, in a fixed order (fault, effect, fleet-wide change from the
fault's generator; the restart from the run's), so the same seed and start give the same fleet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sloscope import taxonomy
from sloscope.simulator import faults, traffic

RESTART_GAP_S = 3
RESTART_CLEARANCE_S = 120  # a restart this close to the fault's onset is moved before it


@dataclass(frozen=True)
class Run:
    """What the planning steps share: the run's length, its nodes, services, and the time of a second."""

    n: int
    names: list
    nodes: list  # NodeSeries
    services: tuple
    at: Callable[[float], str]


@dataclass(frozen=True)
class InjectedFault:
    truth: dict
    latency: traffic.LatencyFault
    score: float  # the cause's reference score, which the confounders are calibrated against
    baseline: tuple  # the fault's baseline window (seconds)
    sli_onset: int
    end: int


def _ratio(rng: np.random.Generator) -> float:
    lo, hi = faults.CONFOUNDER_RATIO
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _affected_services(cause: str, services: tuple, rng: np.random.Generator) -> set:
    affected = {s for s in services if rng.random() < 0.5}
    if taxonomy.BY_ID[cause].layer == "gpu" and "llm-gateway" in services:
        affected.add("llm-gateway")
    if not affected:
        affected.add(services[int(rng.integers(0, len(services)))])
    return affected


@dataclass(frozen=True)
class NodeFault:
    """A cause's evidence bent on its node: what it hit, how strongly, and when requests feel it."""

    cause: str
    node: int
    onset: int
    duration: int
    ramp: float
    target: dict  # the component it hit (hw.id / spdk.bdev.name), if any
    evidence: list  # (series, feature) pairs
    score: float  # the cause's reference score
    baseline: tuple  # the reference score's baseline window (seconds)
    lag: int  # requests slow down this long after onset


def fault_window(n: int, onset: int, duration_s: float) -> int:
    """The fault's length within the run; ValueError where it does not fit."""
    if not 30 <= onset <= n - 30:
        raise ValueError(f"fault onset {onset}s must lie within the run, 30 s from either end (run: {n}s)")
    duration = int(min(duration_s, n - onset))
    if duration < 20:
        raise ValueError("the fault must last at least 20 s")
    return duration


def node_fault(run: Run, cause: str, fault_node: int, onset: int, duration_s: float,
               frng: np.random.Generator) -> NodeFault:
    """Bend the cause's evidence on its node over a 10-20 s ramp; requests feel it 5-15 s after onset."""
    duration = fault_window(run.n, onset, duration_s)
    ramp = float(frng.uniform(10, 20))
    node = run.nodes[fault_node]
    target = faults.apply_cause(node, faults.FaultSpec(cause, fault_node, onset, duration, ramp), run.n, frng)
    evidence = faults.cause_series(node, cause, target)
    base = faults.baseline_window(onset)
    active = (onset + int(math.ceil(ramp)), onset + duration)
    score = max(faults.robust_score(s, base, active, feat) for s, feat in evidence)
    lag = int(frng.integers(5, 16))
    return NodeFault(cause, fault_node, onset, duration, ramp, target, evidence, score, base, lag)


def inject_fault(run: Run, cause: str, fault_node: int, onset: int, duration_s: float,
                 probe_plan: traffic.TrafficPlan, frng: np.random.Generator) -> InjectedFault:
    """The fault's evidence on its node, then the request response 5-15 s later (slower requests on the
    affected services, errors too under packet loss)."""
    nf = node_fault(run, cause, fault_node, onset, duration_s, frng)
    duration, ramp, target, evidence, score = nf.duration, nf.ramp, nf.target, nf.evidence, nf.score
    sli_onset = onset + nf.lag
    affected = _affected_services(cause, run.services, frng)
    mult, errors = {}, {}
    for i, svc in enumerate(run.services):
        p99 = traffic.base_p99_critical(probe_plan, fault_node, i)
        want = (frng.uniform(1.5, 3.0) if svc in affected else frng.uniform(0.35, 0.7)) * \
            traffic.TIERS[traffic.CRITICAL]["threshold_s"]
        mult[svc] = round(max(want / p99, 1.2), 3)
        if cause == "network_loss":
            errors[svc] = round(frng.uniform(0.03, 0.08) / (1 if svc in affected else 3), 4)
    latency = traffic.LatencyFault(fault_node, float(sli_onset), 5.0, float(onset + duration + nf.lag), mult, errors)
    truth = {
        "cause": cause, "layer": taxonomy.BY_ID[cause].layer, "node": run.names[fault_node],
        "onset": run.at(onset), "end": run.at(onset + duration), **target,
        "evidence": faults.describe_series([s for s, _ in evidence]),
        "ramp_s": round(ramp, 1), "sli_onset": run.at(sli_onset),
        "affected_services": [s for s in run.services if s in affected],
        "latency_multiplier": mult, "error_ratio": errors or None,
        "reference_score": round(score, 2),
    }
    return InjectedFault(truth, latency, score, nf.baseline, sli_onset, onset + duration)


def add_effect(run: Run, cause: str, fault_node: int, fault: InjectedFault,
               frng: np.random.Generator) -> tuple[dict, set]:
    """An effect on the fault node, 20-60 s after the SLI breaks: (its truth, the signals it moves)."""
    n, node = run.n, run.nodes[fault_node]
    cands = [c for c in faults.EFFECTS if not faults.overlaps(c, cause, node)]
    conf = cands[int(frng.integers(0, len(cands)))]
    e0 = int(min(fault.sli_onset + 5 + frng.uniform(20, 60), n - 10))
    e1 = int(min(n, fault.end + frng.uniform(0, 30)))
    e1 = max(e1, e0 + 10)
    ratio = _ratio(frng)
    amounts = faults.calibrate(node, conf, max(ratio * fault.score, faults.MIN_CONFOUNDER_SCORE), fault.baseline)
    faults.apply_confounder(node, conf, amounts, faults.profile(n, e0, 8.0, e1))
    series = faults.confounder_series(node, conf)
    truth = {
        "kind": conf.kind, "description": conf.description, "node": run.names[fault_node],
        "onset": run.at(e0), "end": run.at(min(e1, n)), "signals": faults.describe_series(series),
        "reference_score": round(max(faults.robust_score(s, fault.baseline, (e0 + 8, e1)) for s in series), 2),
    }
    return truth, {s.name for s in series}


def add_fleet_wide_change(run: Run, cause: str | None, fault_node: int, onset: int, fault_score: float,
                          effect_signals: set, frng: np.random.Generator) -> dict:
    """A change on every node within 2 min of the fault (or mid-run in a healthy control), of other signals
    than the effect's; its truth."""
    n, ref = run.n, run.nodes[fault_node]
    cands = [c for c in faults.FLEET_WIDE
             if not faults.overlaps(c, cause, ref) and not ({s for s, _ in c.signals} & effect_signals)]
    conf = cands[int(frng.integers(0, len(cands)))]
    f0 = int(np.clip(onset + frng.uniform(-120, 120), min(60, n // 4), max(n - 60, n // 2)))
    framp = float(frng.uniform(5, 15))
    fbase = faults.baseline_window(f0)
    target_score = _ratio(frng) * fault_score if cause else frng.uniform(8, 40)
    target_score = max(target_score, faults.MIN_CONFOUNDER_SCORE)
    prof = faults.profile(n, f0, framp)
    for node in run.nodes:  # calibrated per node, so it is strong on every node whatever its baseline
        faults.apply_confounder(node, conf, faults.calibrate(node, conf, target_score, fbase), prof)
    series = faults.confounder_series(ref, conf)
    return {
        "kind": conf.kind, "description": conf.description, "nodes": list(run.names), "onset": run.at(f0),
        "end": None, "signals": [{"signal": s, "attributes": dict(w)} for s, w in conf.signals],
        "reference_node": run.names[fault_node],
        "reference_score": round(max(faults.robust_score(s, fbase, (f0 + int(framp) + 1, n)) for s in series), 2),
    }


def plan_restart(run: Run, cause: str | None, onset: int, rng: np.random.Generator) -> tuple[tuple, dict]:
    """A collector restart: counters and histograms start over on one node. ((node, second, gap), its truth)"""
    rnode = int(rng.integers(0, len(run.nodes)))
    r = int(rng.integers(int(0.2 * run.n), int(0.45 * run.n)))
    if cause is not None and abs(r - onset) < RESTART_CLEARANCE_S:
        r = max(10, onset - 150)
    truth = {"node": run.names[rnode], "at": run.at(r), "gap_s": RESTART_GAP_S,
             "restarted_at": run.at(r + RESTART_GAP_S - 1)}
    return (rnode, r, RESTART_GAP_S), truth

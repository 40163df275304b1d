"""A node's simulated series as the OTLP/JSON renderer takes them: gauges as measured, counters and exponential
histograms made cumulative from a start before the run (the node's uptime), restarting where the plan resets a
counter."""

from __future__ import annotations

import numpy as np

from sloscope import catalog
from sloscope.simulator import otlp_json
from sloscope.simulator.signals import Counter, Gauge, Histogram, NodeSeries


def _cumulative(inc: np.ndarray, initial, reset_at: int | None) -> np.ndarray:
    cum = np.cumsum(inc, axis=0)
    cum = cum + initial
    if reset_at is not None and reset_at < len(inc):
        cum[reset_at:] = np.cumsum(inc[reset_at:], axis=0)
    return cum


def materialize(fleet, idx: int) -> list:
    """[(metric name, [SeriesRender, ...]), ...] in catalog order for node `idx` of `fleet` (simulator/fleet.py's
    Fleet)."""
    node: NodeSeries = fleet.nodes[idx]
    n = fleet.n
    warm = min(300, n)
    start_before = fleet.start_ns - int(node.uptime_s * 1e9)
    reset_at = start_after = None
    if fleet.reset and fleet.reset[0] == idx:
        _, r, g = fleet.reset
        reset_at = r + g
        start_after = fleet.start_ns + node.phase_ns + (reset_at - 1) * 10**9
    groups = {}
    for s in node.series:
        if isinstance(s, Gauge):
            values = s.realize()
            if s.signal.unit == "By":
                sr = otlp_json.SeriesRender(s.name, s.attrs, "gauge", value_format="%d")
                sr.values = values.astype(np.int64)
            else:
                sr = otlp_json.SeriesRender(s.name, s.attrs, "gauge", value_format="%.6g")
                sr.values = values
        elif isinstance(s, Counter):
            inc = s.increments()
            sr = otlp_json.SeriesRender(s.name, s.attrs, "counter", start_before, start_after, reset_at, s.integer)
            if s.integer:
                inc = inc.astype(np.int64)
                sr.values = _cumulative(inc, int(round(float(inc[:warm].mean()) * node.uptime_s)), reset_at)
            elif s.signal.unit == "By":
                sr = otlp_json.SeriesRender(s.name, s.attrs, "counter", start_before, start_after, reset_at,
                                            value_format="%d")
                inc = np.round(inc).astype(np.int64)
                sr.values = _cumulative(inc, int(round(float(inc[:warm].mean()) * node.uptime_s)), reset_at)
            else:
                cum = _cumulative(inc, float(inc[:warm].mean()) * node.uptime_s, reset_at)
                sr.values = np.round(cum, 6)
        else:
            sr = _histogram_render(s, node, warm, start_before, start_after, reset_at)
        groups.setdefault(s.name, []).append(sr)
    return [(sig.name, groups[sig.name]) for sig in catalog.SIGNALS if sig.name in groups]


def _histogram_render(s: Histogram, node, warm, start_before, start_after, reset_at) -> otlp_json.SeriesRender:
    real = s.realize()
    counts = real["counts"].astype(np.int64)
    init = np.round(counts[:warm].mean(axis=0) * node.uptime_s).astype(np.int64)
    cum = _cumulative(counts, init, reset_at)
    used = np.flatnonzero(cum.any(axis=0))
    lo_col, hi_col = (int(used[0]), int(used[-1])) if len(used) else (0, 0)
    cum = cum[:, lo_col:hi_col + 1]
    offset = real["offset"] + lo_col
    lower = np.exp2(np.arange(offset, offset + cum.shape[1], dtype=np.float64))
    count = cum.sum(axis=1)
    total = _cumulative(real["sum"], float(real["sum"][:warm].mean()) * node.uptime_s, reset_at)
    cf = cum.astype(np.float64)
    total = np.clip(total, cf @ lower * 1.0001, cf @ (2 * lower) * 0.9999)
    nz = cum > 0
    lo_idx = np.argmax(nz, axis=1)
    hi_idx = cum.shape[1] - 1 - np.argmax(nz[:, ::-1], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), 0.0)
    mn = np.where(count > 0, np.minimum(np.exp2(offset + lo_idx) * 1.05, mean), 0.0)
    mx = np.where(count > 0, np.maximum(np.exp2(offset + hi_idx + 1) * 0.95, mean), 0.0)
    sr = otlp_json.SeriesRender(s.name, s.attrs, "histogram", start_before, start_after, reset_at)
    sr.counts, sr.count, sr.offset = cum, count, int(offset)
    sr.sum = np.round(total, 9)
    sr.min, sr.max = _sig(mn), _sig(mx)
    return sr


def _sig(x: np.ndarray, digits: int = 6) -> np.ndarray:
    """Round to `digits` significant digits (shorter JSON for tiny seconds values)."""
    out = np.zeros_like(x)
    nz = x > 0
    mag = np.floor(np.log10(x[nz]))
    q = 10.0 ** (digits - 1 - mag)
    out[nz] = np.round(x[nz] * q) / q
    return out

"""Inline SVG time-series charts for the HTML report: no JavaScript, no fonts or styles from the network.

`time_chart` draws one or more series against a shared time axis, with shaded intervals (an incident),
horizontal reference lines (an objective, a baseline) and vertical markers (a signal's onset, a remediation).
Values are formatted by unit: "s" (seconds, shown as ms or µs when small), "ratio" (percent), "bytes",
"bytes/s", "celsius", or any other string, appended to the number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
MUTED = "#9a9a9a"


@dataclass
class Series:
    name: str
    points: list[tuple[datetime, float]]
    color: str | None = None
    dashed: bool = False
    width: float = 1.6


@dataclass
class Marker:
    """A vertical line at `at` (onset, remediation) or a horizontal one at `value` (objective, baseline)."""

    label: str
    at: datetime | None = None
    value: float | None = None
    color: str = "#d62728"
    dashed: bool = True


@dataclass
class Shade:
    start: datetime
    end: datetime
    label: str = ""
    color: str = "#f4a6a6"


@dataclass
class Chart:
    title: str
    unit: str
    start: datetime
    end: datetime
    series: list[Series] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    shades: list[Shade] = field(default_factory=list)
    width: int = 1100
    height: int = 210
    y_min: float | None = None
    y_max: float | None = None


def format_value(value: float, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if unit == "s":
        a = abs(value)
        if a == 0:
            return "0 s"
        if a < 1e-3:
            return f"{value * 1e6:.3g} µs"
        if a < 1:
            return f"{value * 1e3:.3g} ms"
        return f"{value:.3g} s"
    if unit == "ms":
        return f"{value:.4g} ms"
    if unit == "ratio":
        return f"{value * 100:.3g}%"
    if unit in ("bytes", "bytes/s"):
        suffix = "/s" if unit == "bytes/s" else ""
        for size, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= size:
                return f"{value / size:.3g} {name}{suffix}"
        return f"{value:.3g} B{suffix}"
    if unit == "celsius":
        return f"{value:.3g} °C"
    if unit in ("", "1", "none"):
        return f"{value:.3g}"
    return f"{value:.3g} {unit}"


def _nice_step(span: float, target: int) -> float:
    raw = span / max(target, 1)
    if raw <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * power:
            return m * power
    return 10 * power


def _y_ticks(lo: float, hi: float, target: int = 4) -> list[float]:
    step = _nice_step(hi - lo, target)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, v = [], first
    while v <= hi + step * 1e-9:
        ticks.append(0.0 if abs(v) < step * 1e-9 else v)
        v += step
    return ticks


_TIME_STEPS = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def _time_ticks(start: datetime, end: datetime, target: int = 8) -> list[datetime]:
    span = (end - start).total_seconds()
    step = next((s for s in _TIME_STEPS if span / s <= target), _TIME_STEPS[-1])
    epoch = datetime(1970, 1, 1)
    first = math.ceil((start - epoch).total_seconds() / step) * step
    out, t = [], first
    while epoch + timedelta(seconds=t) <= end:
        out.append(epoch + timedelta(seconds=t))
        t += step
    return out


def _time_label(t: datetime, span_s: float) -> str:
    return t.strftime("%H:%M:%S" if span_s < 600 else "%H:%M")


def _split(points: list[tuple[datetime, float]]) -> list[list[tuple[datetime, float]]]:
    """Break a line where samples are missing (a gap over 3x the usual spacing)."""
    points = [(t, v) for t, v in sorted(points) if v is not None and math.isfinite(v)]
    if len(points) < 2:
        return [points] if points else []
    gaps = sorted((b[0] - a[0]).total_seconds() for a, b in zip(points, points[1:]))
    limit = 3 * gaps[len(gaps) // 2]
    runs, run = [], [points[0]]
    for a, b in zip(points, points[1:]):
        if (b[0] - a[0]).total_seconds() > limit:
            runs.append(run)
            run = []
        run.append(b)
    runs.append(run)
    return runs


def time_chart(chart: Chart) -> str:
    """The chart as an <svg> element (with role="img" and a <title> for screen readers)."""
    w, h = chart.width, chart.height
    left, right, top, bottom = 78, 16, 34, 26
    legend_w = sum(14 + 6.2 * len(s.name) for s in chart.series)
    legend_y = 6
    if 8 + 7.0 * len(chart.title) + legend_w + 24 > w:  # no room beside the title: a line of its own
        legend_y, top = 22, 46
    pw, ph = w - left - right, h - top - bottom
    t0, t1 = chart.start, chart.end
    span = max((t1 - t0).total_seconds(), 1e-9)

    values = [v for s in chart.series for _, v in s.points if v is not None and math.isfinite(v)]
    values += [m.value for m in chart.markers if m.value is not None and math.isfinite(m.value)]
    lo = min(values, default=0.0)
    hi = max(values, default=1.0)
    lo = min(lo, 0.0) if chart.y_min is None else chart.y_min
    hi = hi if chart.y_max is None else chart.y_max
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    hi = hi + (hi - lo) * 0.06 if chart.y_max is None else hi

    def x(t: datetime) -> float:
        return left + pw * min(max((t - t0).total_seconds() / span, 0.0), 1.0)

    def y(v: float) -> float:
        return top + ph * (1 - (min(max(v, lo), hi) - lo) / (hi - lo))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">',
           f"<title>{escape(chart.title)}</title>",
           f'<rect x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>',
           f'<text x="8" y="14" font-size="12.5" font-weight="bold" fill="#222">{escape(chart.title)}</text>']
    for shade in chart.shades:
        xs, xe = x(shade.start), x(shade.end)
        out.append(f'<rect class="shade" x="{xs:.1f}" y="{top}" width="{max(xe - xs, 1):.1f}" height="{ph}" '
                   f'fill="{shade.color}" fill-opacity="0.35"><title>{escape(shade.label)}</title></rect>')
        if shade.label:
            out.append(f'<text x="{xs + 3:.1f}" y="{top + 11}" fill="#a33" font-size="10">{escape(shade.label)}</text>')
    for v in _y_ticks(lo, hi):
        yy = y(v)
        out.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{left + pw}" y2="{yy:.1f}" stroke="#e6e6e6"/>')
        out.append(f'<text x="{left - 6}" y="{yy + 3.5:.1f}" text-anchor="end" fill="#555">'
                   f'{escape(format_value(v, chart.unit))}</text>')
    for t in _time_ticks(t0, t1):
        xx = x(t)
        out.append(f'<line x1="{xx:.1f}" y1="{top + ph}" x2="{xx:.1f}" y2="{top + ph + 4}" stroke="#888"/>')
        out.append(f'<text x="{xx:.1f}" y="{top + ph + 16}" text-anchor="middle" fill="#555">'
                   f'{_time_label(t, span)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>')
    for m in chart.markers:
        dash = ' stroke-dasharray="5,4"' if m.dashed else ""
        if m.value is not None:
            yy = y(m.value)
            out.append(f'<line class="hline" x1="{left}" y1="{yy:.1f}" x2="{left + pw}" y2="{yy:.1f}" '
                       f'stroke="{m.color}" stroke-width="1.3"{dash}><title>{escape(m.label)}</title></line>')
            out.append(f'<text x="{left + pw - 4}" y="{yy - 4:.1f}" text-anchor="end" fill="{m.color}" '
                       f'font-size="10">{escape(m.label)}</text>')
        elif m.at is not None and t0 <= m.at <= t1:
            xx = x(m.at)
            out.append(f'<line class="vline" x1="{xx:.1f}" y1="{top}" x2="{xx:.1f}" y2="{top + ph}" '
                       f'stroke="{m.color}" stroke-width="1.5"{dash}><title>{escape(m.label)}</title></line>')
            out.append(f'<text x="{xx + 3:.1f}" y="{top + ph - 5}" fill="{m.color}" font-size="10">'
                       f'{escape(m.label)}</text>')
    legend_x = left + pw
    for i, s in enumerate(reversed(chart.series)):
        color = s.color or PALETTE[(len(chart.series) - 1 - i) % len(PALETTE)]
        s.color = color
        label = escape(s.name)
        legend_x -= 14 + 6.2 * len(s.name)
        out.append(f'<rect x="{legend_x:.1f}" y="{legend_y}" width="10" height="3" fill="{color}"/>'
                   f'<text x="{legend_x + 13:.1f}" y="{legend_y + 5}" fill="#333">{label}</text>')
    for s in chart.series:
        dash = ' stroke-dasharray="4,3"' if s.dashed else ""
        for run in _split(s.points):
            if len(run) == 1:
                t, v = run[0]
                out.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="1.8" fill="{s.color}"/>')
                continue
            pts = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in run)
            out.append(f'<polyline class="series" points="{pts}" fill="none" stroke="{s.color}" '
                       f'stroke-width="{s.width}" stroke-linejoin="round"{dash}><title>{escape(s.name)}</title>'
                       f'</polyline>')
    out.append("</svg>")
    return "\n".join(out)


def path_diagram(path: list[str], where: str, what: str) -> str:
    """The services of a culprit's path from the entry, left to right, each a box with an arrow to the next; the
    last, the culprit, in red with `where` (its pod and node) and `what` (its change) under it."""
    box_w, box_h, gap, pad = 150, 34, 46, 10
    width = pad * 2 + len(path) * box_w + (len(path) - 1) * gap
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{box_h + 52}' role='img' "
             f"aria-label='{escape(' to '.join(path), quote=True)}'>",
             "<defs><marker id='arrow' markerWidth='8' markerHeight='8' refX='7' refY='4' orient='auto'>"
             "<path d='M0,0 L8,4 L0,8 z' fill='#555'/></marker></defs>"]
    for i, service in enumerate(path):
        x = pad + i * (box_w + gap)
        culprit = i == len(path) - 1
        stroke, fill = ("#d62728", "#fde8e8") if culprit else ("#555", "#f4f4f4")
        parts.append(f"<rect x='{x}' y='{pad}' width='{box_w}' height='{box_h}' rx='6' fill='{fill}' "
                     f"stroke='{stroke}' stroke-width='{2 if culprit else 1}'/>")
        label = service if len(service) <= 20 else service[:19] + "…"
        parts.append(f"<text x='{x + box_w / 2}' y='{pad + box_h / 2 + 4}' text-anchor='middle' "
                     f"font-size='12' font-family='sans-serif'>{escape(label)}</text>")
        if not culprit:
            parts.append(f"<line x1='{x + box_w}' y1='{pad + box_h / 2}' x2='{x + box_w + gap - 2}' "
                         f"y2='{pad + box_h / 2}' stroke='#555' marker-end='url(#arrow)'/>")
    last_x = pad + (len(path) - 1) * (box_w + gap)
    for n, line in enumerate((where, what)):
        parts.append(f"<text x='{last_x}' y='{pad + box_h + 16 + 14 * n}' font-size='11' font-family='sans-serif' "
                     f"fill='#555'>{escape(line)}</text>")
    parts.append("</svg>")
    return "".join(parts)

"""Grafana dashboards as code: pure functions of the SLO spec, built with the grafana-foundation-sdk builders.

Three dashboards, each with stable uids (so a push replaces its own earlier version):

- `sloscope-slo-overview`: per tier of the spec, its latency percentile against the objective, the error ratio
  against the budget, multiwindow burn rates (latency and errors) and the error budget left over the spec's
  window; above them, request rate, error ratio and open incidents for all tiers.
- `sloscope-node`: the physical layer of the nodes that serve a tier: GPU kernel-busy time (NVML, peak in the
  collection window) and SM activity (DCGM) per GPU, utilization, HBM activity, memory, temperature; SPDK bdev wait, queue depth, reactor busy, NVMe
  temperature; and, when exported, NVLink/PCIe throughput, TCP retransmits, pressure stall and the syscall, block
  I/O and run-queue latency heatmaps; with the incident cause scores of the node on top.
- `sloscope-incidents`: incidents with their top causes (one row per incident and cause, with the time range the
  cause was reported), each linking to the node dashboard over that time range; cause scores over time.

Every query names only series of alerts/metric_names.py (what `sloscope serve` exports at /metrics). Panels of
the node dashboard whose series the exporter does not export (yet) are left out; `exporter_gaps()` lists them
with the series they need. Remediation actions appear as annotations from Prometheus's own `ALERTS` series for the
alerts of alerts/rules.py that map to an action, and from the exporter's remediation counter once it exists.

The Prometheus data source is a `datasource` template variable whose default is the uid given (configurable
per build); every panel and query refers to it. Template variables `tier` (the spec's tiers), `service` and
`node` (from the exported request series) filter every dashboard.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass

with warnings.catch_warnings():  # the classic (v1) dashboard model warns at import that v2 exists
    warnings.simplefilter("ignore", DeprecationWarning)
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.builders import heatmap, stat, statetimeline, table, timeseries
    from grafana_foundation_sdk.builders import common as gc
    from grafana_foundation_sdk.builders.prometheus import Dataquery as PromQuery
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models import dashboard as dm
    from grafana_foundation_sdk.models import heatmap as hm
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from sloscope import taxonomy
from sloscope.slo_spec import SloSpec, TierObjective

from alerts import metric_names as x
from alerts.actions import NOTIFY
from alerts.burn import PAGE, burn_windows, promql_duration

DEFAULT_DATASOURCE_UID = "prometheus"
OVERVIEW_UID = "sloscope-slo-overview"
NODE_UID = "sloscope-node"
INCIDENTS_UID = "sloscope-incidents"
TAG = "sloscope"
INCIDENT_LINK_BEFORE_S = 600  # the node dashboard opens 10 min before a cause was first reported (its baseline)
INCIDENT_LINK_AFTER_S = 300

# Prometheus's own series for the alerts of alerts/rules.py: firing alerts that carry an `action` label.
ALERTS_SERIES = "ALERTS"

# Series the node dashboard wants that the exporter may not export yet: the constant expected in
# alerts/metric_names.py, the series name expected, the catalog signal it comes from, its labels and its kind.
WANTED = {
    "GPU_IO": ("sloscope_gpu_io_bytes_total", "hw.gpu.io", ("node", "gpu", "link", "direction"), "counter"),
    "TCP_RETRANSMITS": ("sloscope_tcp_retransmits_total", "sloscope.tcp.retransmits", ("node",), "counter"),
    "PRESSURE_STALL": ("sloscope_pressure_stall_seconds_total", "sloscope.pressure.stall",
                       ("node", "resource", "kind"), "counter"),
    "SYSCALL_DURATION": ("sloscope_syscall_duration_seconds", "sloscope.syscall.duration", ("node", "syscall"),
                         "histogram"),
    "BLOCK_IO_DURATION": ("sloscope_block_io_duration_seconds", "sloscope.block.io.duration", ("node", "device"),
                          "histogram"),
    "RUNQUEUE_DELAY": ("sloscope_cpu_runqueue_delay_seconds", "sloscope.cpu.runqueue.delay", ("node",),
                       "histogram"),
    "REMEDIATION_ACTIONS": ("sloscope_remediation_actions_total", "remediation_audit table (alerts/)",
                            ("alert", "action", "target", "decision"), "counter"),
}


@dataclass(frozen=True)
class Gap:
    """A panel (or annotation) left out because the exporter does not export the series it needs."""

    panel: str
    dashboard: str
    constant: str  # expected in alerts/metric_names.py
    series: str  # expected series name (histograms: the family; _bucket/_count/_sum are queried)
    source: str
    labels: tuple[str, ...]
    kind: str


# --- small helpers -------------------------------------------------------------------------------------------------

def _num(value: float) -> str:
    return format(value, ".12g")


def _pct(value: float) -> str:
    return f"{value * 100:.6g}%"


def _ms(threshold_ms: float) -> str:
    return f"{threshold_ms:g} ms"


def exported_names() -> frozenset[str]:
    return x.exported_series()


def _exported(name: str | None, kind: str) -> bool:
    if not name:
        return False
    names = exported_names()
    return (name + "_bucket" in names) if kind == "histogram" else name in names


def _ds() -> cm.DataSourceRef:
    return cm.DataSourceRef(type_val="prometheus", uid="${datasource}")


def _query(expr: str, legend: str = "__auto", ref: str = "A", *, instant: bool = False,
           fmt: PromQueryFormat | None = None) -> PromQuery:
    q = PromQuery().expr(expr).legend_format(legend).ref_id(ref).datasource(_ds())
    if instant:
        q = q.instant()
    else:
        q = q.range()
    if fmt is not None:
        q = q.format(fmt)
    return q


def _thresholds(*steps: tuple[float | None, str]) -> gd.ThresholdsConfig:
    return gd.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in steps])


def _above(limit: float, warn: float | None = None) -> gd.ThresholdsConfig:
    steps = [(None, "green")]
    if warn is not None:
        steps.append((warn, "orange"))
    steps.append((limit, "red"))
    return _thresholds(*steps)


def _timeseries(title: str, unit: str, description: str, targets: list[PromQuery], *, w: int = 12, h: int = 8,
                thresholds: gd.ThresholdsConfig | None = None, min_val: float | None = None,
                max_val: float | None = None) -> timeseries.Panel:
    p = (timeseries.Panel().title(title).description(description).unit(unit).datasource(_ds())
         .span(w).height(h).line_width(1).fill_opacity(10).show_points(cm.VisibilityMode.NEVER)
         .legend(gc.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                 .placement(cm.LegendPlacement.BOTTOM).show_legend(True))
         .tooltip(gc.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)))
    for t in targets:
        p = p.with_target(t)
    if thresholds is not None:
        p = p.thresholds(thresholds).thresholds_style(
            gc.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    return p


def _heatmap(title: str, unit: str, description: str, expr: str, *, w: int = 8, h: int = 8) -> heatmap.Panel:
    return (heatmap.Panel().title(title).description(description).unit(unit).datasource(_ds()).span(w).height(h)
            .with_target(_query(expr, "{{le}}", fmt=PromQueryFormat.HEATMAP))
            .calculate(False)
            .y_axis(heatmap.YAxisConfig().unit(unit))
            .cell_values(heatmap.CellValues().unit("short"))
            .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Oranges")
                   .steps(64).fill("dark-orange").exponent(0.5).scale(hm.HeatmapColorScale.EXPONENTIAL))
            .rows_frame(heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.LE))
            .show_value(cm.VisibilityMode.NEVER))


def _stat(title: str, unit: str, description: str, targets: list[PromQuery], *, w: int = 8, h: int = 8,
          thresholds: gd.ThresholdsConfig | None = None, decimals: float | None = None) -> stat.Panel:
    p = (stat.Panel().title(title).description(description).unit(unit).datasource(_ds()).span(w).height(h)
         .reduce_options(gc.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
         .color_mode(cm.BigValueColorMode.VALUE).graph_mode(cm.BigValueGraphMode.AREA))
    for t in targets:
        p = p.with_target(t)
    if thresholds is not None:
        p = p.thresholds(thresholds)
    if decimals is not None:
        p = p.decimals(decimals)
    return p


# --- template variables --------------------------------------------------------------------------------------------

def _variables(spec: SloSpec, datasource_uid: str, *, node_multi: bool = True) -> list:
    tiers = list(spec.tiers)
    all_option = dm.VariableOption(selected=True, text=["All"], value=["$__all"])
    datasource = (gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
                  .current(dm.VariableOption(selected=True, text=datasource_uid, value=datasource_uid)))
    tier = (gd.CustomVariable("tier").label("tier").values(",".join(tiers)).multi(True).include_all(True)
            .all_value(".*").current(all_option)
            .options([dm.VariableOption(selected=True, text="All", value="$__all")]
                     + [dm.VariableOption(selected=False, text=t, value=t) for t in tiers]))
    service_q = f'label_values({x.REQUESTS}{{tier=~"$tier"}}, service)'
    node_q = f'label_values({x.REQUESTS}{{tier=~"$tier", service=~"$service"}}, node)'
    service = (gd.QueryVariable("service").label("service").datasource(_ds()).query(service_q).definition(service_q)
               .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
               .multi(True).include_all(True).all_value(".*").current(all_option))
    node = (gd.QueryVariable("node").label("node").datasource(_ds()).query(node_q).definition(node_q)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.NATURAL_ASC)
            .multi(node_multi).include_all(True).all_value(".*").current(all_option))
    return [datasource, tier, service, node]


def _links() -> list:
    return [gd.DashboardLink("sloscope").type(dm.DashboardLinkType.DASHBOARDS).tags([TAG]).as_dropdown(False)
            .keep_time(True).include_vars(True)]


def _remediation_annotations() -> list:
    """Remediation actions as annotations: firing alerts of alerts/rules.py that map to an action other than
    notify_only (Prometheus's ALERTS series carries the rule's labels, `action` among them); and, once the exporter
    exports the remediation audit, every executed action."""
    out = [gd.AnnotationQuery().name("Remediation (alerts with an action)").datasource(_ds()).enable(True)
           .icon_color("orange")
           .expr(f'{ALERTS_SERIES}{{alertstate="firing", action!~"{NOTIFY}|", node=~"$node"}}')
           .step("60s").title_format("{{action}}").text_format("{{alertname}}: {{action}} on {{node}} "
                                                               "(cause {{cause}}, tier {{tier}})")
           .tag_keys("action,cause,node,tier")]
    name = getattr(x, "REMEDIATION_ACTIONS", None)
    if _exported(name, "counter"):
        out.append(gd.AnnotationQuery().name("Remediation executed").datasource(_ds()).enable(True)
                   .icon_color("purple")
                   .expr(f'sum by (alert, action, target) (increase({name}{{decision="executed", '
                         f'target=~".*$node.*"}}[1m])) > 0')
                   .step("60s").title_format("{{action}}").text_format("{{action}} on {{target}} ({{alert}})")
                   .tag_keys("action,target"))
    return out


def _dashboard(uid: str, title: str, description: str, spec: SloSpec, datasource_uid: str, *,
               time_from: str = "now-3h", node_multi: bool = True) -> gd.Dashboard:
    return (gd.Dashboard(title).uid(uid).description(description).tags([TAG, "slo"]).editable()
            .timezone("utc").time(time_from, "now").refresh("1m").tooltip(dm.DashboardCursorSync.CROSSHAIR)
            .variables(_variables(spec, datasource_uid, node_multi=node_multi)).links(_links())
            .annotations(_remediation_annotations()))


def _with_row(board: gd.Dashboard, title: str, panels: list) -> gd.Dashboard:
    """An expanded row: the row, then its panels beside it on the dashboard (a row holds its panels only while
    collapsed)."""
    board = board.with_row(gd.Row(title).collapsed(False))
    for panel in panels:
        board = board.with_panel(panel)
    return board


def _number_ids(board: dict) -> dict:
    n = 0
    for panel in board.get("panels", []):
        n += 1
        panel["id"] = n
        for inner in panel.get("panels", []) or []:
            n += 1
            inner["id"] = n
    return board


def to_json(builder: gd.Dashboard) -> dict:
    """The dashboard as plain JSON (what Grafana stores), panels numbered in order."""
    return _number_ids(dumps(builder.build()))


# --- SLO overview --------------------------------------------------------------------------------------------------

def _sel(tier: str | None = None) -> str:
    tier_m = f'tier="{tier}"' if tier is not None else 'tier=~"$tier"'
    return f'{tier_m}, service=~"$service", node=~"$node"'


def _latency_burn(t: TierObjective, window: str) -> str:
    """Share of requests slower than the objective over `window`, divided by the share the percentile allows."""
    le = x.le_label(x.le_seconds(t.threshold_ms))
    s = _sel(t.name)
    return (f"(1 - sum(rate({x.REQUEST_DURATION}_bucket{{{s}, le=\"{le}\"}}[{window}])) / "
            f"sum(rate({x.REQUEST_DURATION}_count{{{s}}}[{window}]))) / {_num(1 - t.percentile / 100)}")


def _error_ratio(selector: str, window: str, by: str = "") -> str:
    by_clause = f" by ({by})" if by else ""
    return (f"sum{by_clause} (rate({x.REQUEST_ERRORS}{{{selector}}}[{window}])) / "
            f"sum{by_clause} (rate({x.REQUESTS}{{{selector}}}[{window}]))")


def _tier_row(spec: SloSpec, t: TierObjective) -> tuple[str, list]:
    s = _sel(t.name)
    q = t.percentile / 100
    pname = f"p{_num(t.percentile)}"
    threshold_s = x.le_seconds(t.threshold_ms)
    allowance = 1 - q
    window = promql_duration(spec.window_s)
    le = x.le_label(threshold_s)
    bucket, count = f"{x.REQUEST_DURATION}_bucket", f"{x.REQUEST_DURATION}_count"
    latency = _timeseries(
        f"{t.name}: {pname} latency against the {_ms(t.threshold_ms)} objective", "s",
        f"The tier's {pname} request latency (from the exported histogram, whose buckets include the objective "
        f"{_ms(t.threshold_ms)} exactly), overall and per service. Above the dashed line the tier violates its SLO.",
        [_query(f"histogram_quantile({_num(q)}, sum by (le) (rate({bucket}{{{s}}}[$__rate_interval])))", pname, "A"),
         _query(f"histogram_quantile({_num(q)}, sum by (service, le) (rate({bucket}{{{s}}}[$__rate_interval])))",
                "{{service}}", "B")],
        thresholds=_above(threshold_s), min_val=0)
    errors = _timeseries(
        f"{t.name}: error ratio against the {_pct(t.error_budget)} budget", "percentunit",
        f"Failed requests (5xx or span status ERROR) over all requests of the tier; the availability objective "
        f"{_num(t.availability)}% allows {_pct(t.error_budget)}.",
        [_query(_error_ratio(s, "$__rate_interval"), "error ratio", "A"),
         _query(_error_ratio(s, "$__rate_interval", "service"), "{{service}}", "B")],
        thresholds=_above(t.error_budget), min_val=0)
    burns = burn_windows(spec.window_s)  # one query per alert, over its long window, its factor a threshold
    burn_thresholds = _above(min(b.factor for b in burns if b.kind == PAGE), min(b.factor for b in burns))
    alerts_text = " or ".join(f"{b.factor_text} over {b.long} and {b.short} ({b.kind})" for b in burns)
    latency_burn = _timeseries(
        f"{t.name}: latency budget burn rate", "suffix:×",
        f"How fast the latency budget is spent: the share of requests slower than {_ms(t.threshold_ms)} over the "
        f"{_pct(allowance)} the {pname} objective allows. Alerts fire above {alerts_text}.",
        [_query(_latency_burn(t, b.long), b.long, chr(ord("A") + i)) for i, b in enumerate(burns)],
        w=8, thresholds=burn_thresholds, min_val=0)
    error_burn = _timeseries(
        f"{t.name}: error budget burn rate", "suffix:×",
        f"The error ratio over the {_pct(t.error_budget)} budget, per alert window; alerts fire above {alerts_text}.",
        [_query(f"({_error_ratio(s, b.long)}) / {_num(t.error_budget)}", b.long, chr(ord("A") + i))
         for i, b in enumerate(burns)],
        w=8, thresholds=burn_thresholds, min_val=0)
    budget_left = _stat(
        f"{t.name}: error budget left ({window})", "percentunit",
        f"Share of the {window} budget not yet spent: latency (requests slower than {_ms(t.threshold_ms)}) and "
        f"errors. Below zero the objective is missed for the period.",
        [_query(f"1 - (1 - sum(increase({bucket}{{{s}, le=\"{le}\"}}[{window}])) / "
                f"sum(increase({count}{{{s}}}[{window}]))) / {_num(allowance)}", "latency", "A", instant=True),
         _query(f"1 - ({_error_ratio(s, window).replace('rate(', 'increase(')}) / {_num(t.error_budget)}",
                "errors", "B", instant=True)],
        w=8, thresholds=_thresholds((None, "red"), (0, "orange"), (0.25, "green")), decimals=1)
    title = (f"Tier {t.name}: {pname} ≤ {_ms(t.threshold_ms)}, availability {_num(t.availability)}%"
             f"{' (default tier)' if t.name == spec.default_tier else ''}")
    return title, [latency, errors, latency_burn, error_burn, budget_left]


def slo_overview(spec: SloSpec, datasource_uid: str = DEFAULT_DATASOURCE_UID) -> gd.Dashboard:
    board = _dashboard(OVERVIEW_UID, "sloscope / SLO overview",
                       "Per SLO tier: latency percentile against its objective, error ratio, burn rates and the error "
                       f"budget left over {promql_duration(spec.window_s)}. Generated from the SLO spec "
                       f"({spec.source}) by `sloscope dashboards build`; edits in Grafana are overwritten on push.",
                       spec, datasource_uid, time_from="now-6h")
    s = _sel()
    board = board.with_row(gd.Row("All tiers"))
    board = board.with_panel(_timeseries(
        "Request rate by tier", "reqps", "Requests per second ingested by sloscope, per SLO tier.",
        [_query(f"sum by (tier) (rate({x.REQUESTS}{{{s}}}[$__rate_interval]))", "{{tier}}")], w=9, min_val=0))
    board = board.with_panel(_timeseries(
        "Error ratio by tier", "percentunit", "Failed requests over all requests, per SLO tier.",
        [_query(_error_ratio(s, "$__rate_interval", "tier"), "{{tier}}")], w=9, min_val=0))
    board = board.with_panel(_stat(
        "Open incidents", "short",
        "Incidents (tier, service, node) that sloscope's analysis reports open now, with at least one ranked cause.",
        [_query(f"count(max by (tier, service, node) ({x.INCIDENT_CAUSE_SCORE}{{{s}}})) or vector(0)", "incidents",
                instant=True)],
        w=6, thresholds=_thresholds((None, "green"), (1, "red")), decimals=0))
    for t in spec.tiers.values():
        board = _with_row(board, *_tier_row(spec, t))
    return board


# --- node (physical layer) -----------------------------------------------------------------------------------------

def _seed(cause: str, signal: str) -> float | None:
    return taxonomy.BY_ID[cause].seed_threshold.get(signal)


def _gauge_expr(name: str, by: str) -> str:
    return f'max by ({by}) ({name}{{node=~"$node"}})'


def _node_panels(gaps: list[Gap]) -> list[tuple[str, list]]:
    """(row title, panels) of the node dashboard; panels whose series are not exported are recorded in gaps."""

    def wanted(constant: str, panel: str) -> str | None:
        series, source, labels, kind = WANTED[constant]
        name = getattr(x, constant, None)
        if _exported(name, kind):
            return name
        gaps.append(Gap(panel, NODE_UID, constant, name or series, source, labels, kind))
        return None

    gpu = [
        _timeseries("GPU kernel busy (peak in window, NVML), per GPU", "percentunit",
                    "Peak share of time any kernel ran within each collection window (NVML utilization samples; "
                    "0 on an idle GPU). Near 100% while requests slow down: kernels queue behind co-tenants. One "
                    "small kernel reads 100% here, so read it beside SM active.",
                    [_query(_gauge_expr(x.GPU_KERNEL_BUSY_MAX, "node, gpu"), "{{node}} {{gpu}}")],
                    w=8, min_val=0, max_val=1),
        _timeseries("GPU SM active (DCGM), per GPU", "percentunit",
                    "Mean share of SMs with at least one warp resident (DCGM SM_ACTIVE, needs sloscope's "
                    "dcgm-exporter counters file). High while requests slow down: the SMs themselves are full.",
                    [_query(_gauge_expr(x.GPU_SM_ACTIVE, "node, gpu"), "{{node}} {{gpu}}")],
                    w=8, min_val=0, max_val=1),
        _timeseries("GPU utilization", "percentunit", "GPU utilization per GPU (NVML / DCGM GPU_UTIL).",
                    [_query(_gauge_expr(x.GPU_UTILIZATION, "node, gpu"), "{{node}} {{gpu}}")],
                    w=8, min_val=0, max_val=1),
        _timeseries("GPU DRAM (HBM) active", "percentunit",
                    "HBM bandwidth utilization (DCGM DRAM_ACTIVE): saturation slows memory-bound inference.",
                    [_query(_gauge_expr(x.GPU_DRAM_ACTIVE, "node, gpu"), "{{node}} {{gpu}}")],
                    w=8, min_val=0, max_val=1),
        _timeseries("GPU memory used", "bytes",
                    "Framebuffer in use per GPU (without the driver's reserved memory, shown apart), and its size: "
                    f"steady growth is a leak (the rule: {taxonomy.GPU_MEMORY_LEAK.text}).",
                    [_query(_gauge_expr(x.GPU_MEMORY_USED, "node, gpu"), "{{node}} {{gpu}} used", "A"),
                     _query(_gauge_expr(x.GPU_MEMORY_LIMIT, "node, gpu"), "{{node}} {{gpu}} size", "B"),
                     _query(_gauge_expr(x.GPU_MEMORY_RESERVED, "node, gpu"), "{{node}} {{gpu}} reserved", "C")],
                    w=8, min_val=0),
        _timeseries("GPU temperature", "celsius", "GPU temperature; throttling starts near the dashed line.",
                    [_query(_gauge_expr(x.GPU_TEMPERATURE, "node, gpu"), "{{node}} {{gpu}}")],
                    w=8, thresholds=_above(_seed("gpu_thermal", "hw.gpu.temperature") or 85.0)),
    ]
    for link, label in (("nvlink", "NVLink"), ("pcie", "PCIe")):
        name = wanted("GPU_IO", f"{label} throughput")
        if name:
            gpu.append(_timeseries(
                f"{label} throughput", "Bps",
                f"{label} bytes per second per GPU and direction: a drop while requests slow down means the "
                f"interconnect is contended.",
                [_query(f'sum by (node, gpu, direction) (rate({name}{{node=~"$node", link="{link}"}}'
                        f'[$__rate_interval]))', "{{node}} {{gpu}} {{direction}}")], w=8, min_val=0))

    storage = [
        _timeseries("SPDK bdev I/O wait", "s",
                    "Mean wait per I/O of each SPDK bdev and direction; above the dashed line (5 ms) the NVMe queue "
                    "is congested.",
                    [_query(_gauge_expr(x.SPDK_BDEV_IO_WAIT, "node, bdev, direction"),
                            "{{node}} {{bdev}} {{direction}}")],
                    w=8, min_val=0, thresholds=_above(_seed("storage_queue", "spdk.bdev.io.wait") or 0.005)),
        _timeseries("SPDK bdev queue depth", "short", "Mean number of I/Os in flight per bdev.",
                    [_query(_gauge_expr(x.SPDK_BDEV_QUEUE_DEPTH, "node, bdev"), "{{node}} {{bdev}}")],
                    w=8, min_val=0),
        _timeseries("SPDK reactor busy", "percentunit",
                    "Busy share of each SPDK reactor (lcore); a saturated reactor delays every bdev it polls.",
                    [_query(_gauge_expr(x.SPDK_REACTOR_BUSY, "node, lcore"), "{{node}} lcore {{lcore}}")],
                    w=8, min_val=0, max_val=1,
                    thresholds=_above(_seed("storage_queue", "spdk.reactor.busy") or 0.7)),
        _timeseries("NVMe temperature", "celsius", "NVMe composite temperature; above 65 C drives throttle.",
                    [_query(_gauge_expr(x.NVME_TEMPERATURE, "node, bdev, device"), "{{node}} {{bdev}}{{device}}")],
                    w=8, thresholds=_above(_seed("storage_thermal", "sloscope.nvme.temperature") or 65.0)),
    ]
    name = wanted("BLOCK_IO_DURATION", "Block I/O latency")
    if name:
        storage.append(_heatmap("Block I/O latency", "s", "Kernel block request latency (eBPF), per bucket.",
                                f'sum by (le) (increase({name}_bucket{{node=~"$node"}}[$__rate_interval]))'))

    kernel = []
    name = wanted("TCP_RETRANSMITS", "TCP retransmits")
    if name:
        kernel.append(_timeseries("TCP retransmits", "cps", "TCP segments retransmitted per second: packet loss.",
                                  [_query(f'sum by (node) (rate({name}{{node=~"$node"}}[$__rate_interval]))',
                                          "{{node}}")], w=8, min_val=0))
    name = wanted("PRESSURE_STALL", "Pressure stall")
    if name:
        kernel.append(_timeseries(
            "Pressure stall (PSI)", "percentunit",
            "Share of time some task was stalled on CPU, I/O or memory (Linux pressure stall information).",
            [_query(f'sum by (node, resource, kind) (rate({name}{{node=~"$node"}}[$__rate_interval]))',
                    "{{node}} {{resource}} {{kind}}")], w=8, min_val=0))
    for constant, title, what in (
            ("RUNQUEUE_DELAY", "Run-queue delay", "Wake-up to running delay of tasks (eBPF): CPU contention."),
            ("SYSCALL_DURATION", "Syscall latency", "Syscall latency (eBPF): slow runtime paths, lock contention.")):
        name = wanted(constant, title)
        if name:
            kernel.append(_heatmap(title, "s", what,
                                   f'sum by (le) (increase({name}_bucket{{node=~"$node"}}[$__rate_interval]))'))
    probes = []
    probe_up = getattr(x, "PROBE_UP", None)
    if probe_up and probe_up in exported_names():
        probes.append(
            statetimeline.Panel().title("Probe health").unit("none").datasource(_ds()).span(24).height(6)
            .description("Per node and probe: up (the probe runs itself and collects) or down (missing, so a "
                         "fallback runs in its place, or failing). A signal whose probe is down is not evidence.")
            .with_target(_query(f'max by (node, probe, running) ({probe_up}{{node=~"$node"}})',
                                "{{node}} {{probe}} {{running}}"))
            .mappings([dm.ValueMap(options={"0": dm.ValueMappingResult(text="down", color="red", index=0),
                                            "1": dm.ValueMappingResult(text="up", color="green", index=1)})])
            .thresholds(_thresholds((None, "red"), (1, "green"))).show_value(cm.VisibilityMode.NEVER)
            .merge_values(True).row_height(0.9))
        probes.append(
            statetimeline.Panel().title("Signals a running probe cannot produce").unit("none").datasource(_ds())
            .span(24).height(6)
            .description("Per node, probe and signal: down while the source lacks what the signal needs (`needs`: "
                         "DCGM fields the dcgm-exporter does not serve, or SPDK queue-depth sampling that is off).")
            .with_target(_query(f'min by (node, probe, signal, needs) ({x.PROBE_SIGNAL_UP}{{node=~"$node"}})',
                                "{{node}} {{probe}} {{signal}} {{needs}}"))
            .mappings([dm.ValueMap(options={"0": dm.ValueMappingResult(text="missing", color="red", index=0),
                                            "1": dm.ValueMappingResult(text="produced", color="green", index=1)})])
            .thresholds(_thresholds((None, "red"), (1, "green"))).show_value(cm.VisibilityMode.NEVER)
            .merge_values(True).row_height(0.9))
    return [("GPU", gpu), ("Storage (SPDK, NVMe, block)", storage), ("Kernel (network, CPU, syscalls)", kernel),
            ("Probes", probes)]


def node_dashboard(spec: SloSpec, datasource_uid: str = DEFAULT_DATASOURCE_UID) -> gd.Dashboard:
    board = _dashboard(NODE_UID, "sloscope / node physical layer",
                       "The physical layer of the nodes serving the selected tiers: GPU, storage and kernel signals as "
                       "sloscope exports them, with the incident causes ranked for the node on top. Opened from the "
                       "incidents dashboard over an incident's time range.", spec, datasource_uid, time_from="now-1h")
    board = board.with_row(gd.Row("Incidents on the node"))
    board = board.with_panel(_timeseries(
        "Incident cause scores", "none",
        "Score (0..1) of each cause sloscope ranks for the node's open incidents.",
        [_query(f'max by (node, cause) ({x.INCIDENT_CAUSE_SCORE}{{{_sel()}}})', "{{node}} {{cause}}")],
        w=24, h=6, min_val=0, max_val=1))
    for title, panels in _node_panels([]):
        if panels:
            board = _with_row(board, title, panels)
    return board


# --- incidents -----------------------------------------------------------------------------------------------------

def _node_link(title: str, url_range: str) -> dict:
    """A data link (field config `links`) to the node dashboard for the node of a table row."""
    return {"title": title, "targetBlank": False, "url": (
        f"/d/{NODE_UID}/sloscope-node?var-datasource=${{datasource}}&var-node=${{__data.fields.node}}"
        f"&var-tier=${{__data.fields.tier}}&var-service=${{__data.fields.service}}&{url_range}")}


def incidents_dashboard(spec: SloSpec, datasource_uid: str = DEFAULT_DATASOURCE_UID) -> gd.Dashboard:
    board = _dashboard(INCIDENTS_UID, "sloscope / incidents",
                       "Incidents sloscope found (tier, service, node) with their top-ranked physical causes; the node "
                       "opens the node dashboard over the time the cause was reported (from 10 minutes before, its "
                       "baseline). Remediation actions are annotations.", spec, datasource_uid, time_from="now-24h")
    s = _sel()
    score = x.INCIDENT_CAUSE_SCORE
    keys = "tier, service, node, cause"
    seen = f"timestamp({score}{{{s}}})[$__range:$__interval]"
    table_panel = (
        table.Panel().title("Incidents and their top causes").unit("none").datasource(_ds()).span(24).height(10)
        .description("One row per incident (tier, service, node) and ranked cause, best score first, with the time "
                     "range in which sloscope reported it. Click a node for its physical layer over that range.")
        .with_target(_query(f"max by ({keys}) (max_over_time({score}{{{s}}}[$__range]))", "", "A", instant=True,
                            fmt=PromQueryFormat.TABLE))
        .with_target(_query(f"min by ({keys}) (min_over_time({seen})) * 1000", "", "B", instant=True,
                            fmt=PromQueryFormat.TABLE))
        .with_target(_query(f"max by ({keys}) (max_over_time({seen})) * 1000", "", "C", instant=True,
                            fmt=PromQueryFormat.TABLE))
        .with_target(_query(f"(min by ({keys}) (min_over_time({seen})) - {INCIDENT_LINK_BEFORE_S}) * 1000", "", "D",
                            instant=True, fmt=PromQueryFormat.TABLE))
        .with_target(_query(f"(max by ({keys}) (max_over_time({seen})) + {INCIDENT_LINK_AFTER_S}) * 1000", "", "E",
                            instant=True, fmt=PromQueryFormat.TABLE))
        .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True},
            "renameByName": {"Value #A": "score", "Value #B": "first reported", "Value #C": "last reported",
                             "Value #D": "from_ms", "Value #E": "to_ms"},
            "indexByName": {"tier": 0, "service": 1, "node": 2, "cause": 3, "Value #A": 4, "Value #B": 5,
                            "Value #C": 6, "Value #D": 7, "Value #E": 8}}))
        .sort_by([gc.TableSortByFieldState().display_name("score").desc(True)])
        .override_by_name("score", [dm.DynamicConfigValue("unit", "none"), dm.DynamicConfigValue("decimals", 2),
                                    dm.DynamicConfigValue("min", 0), dm.DynamicConfigValue("max", 1)])
        .override_by_name("first reported", [dm.DynamicConfigValue("unit", "dateTimeAsIso")])
        .override_by_name("last reported", [dm.DynamicConfigValue("unit", "dateTimeAsIso")])
        .override_by_name("from_ms", [dm.DynamicConfigValue("custom.hidden", True)])
        .override_by_name("to_ms", [dm.DynamicConfigValue("custom.hidden", True)])
        .override_by_name("node", [dm.DynamicConfigValue("links", [
            _node_link("physical layer of ${__data.fields.node} during the incident",
                       "from=${__data.fields.from_ms}&to=${__data.fields.to_ms}")])]))
    board = board.with_panel(table_panel)
    board = board.with_panel(
        _timeseries("Cause scores over time", "none",
                    "Score (0..1) of each ranked cause of each open incident; a series exists while the incident is "
                    "open. Click a point for the node's physical layer over the time shown.",
                    [_query(f"max by ({keys}) ({score}{{{s}}})", "{{node}} {{cause}} ({{tier}} / {{service}})")],
                    w=16, h=9, min_val=0, max_val=1)
        .data_links([gd.DashboardLink("physical layer of ${__field.labels.node}").url(
            f"/d/{NODE_UID}/sloscope-node?var-datasource=${{datasource}}&var-node=${{__field.labels.node}}"
            f"&var-tier=${{__field.labels.tier}}&var-service=${{__field.labels.service}}&${{__url_time_range}}")]))
    board = board.with_panel(_stat(
        "Open incidents by top cause", "short",
        "Open incidents per cause that sloscope ranks first or among the top causes.",
        [_query(f"count by (cause) ({score}{{{s}}})", "{{cause}}", instant=True)], w=8, h=9, decimals=0))
    return board


# --- all of them ---------------------------------------------------------------------------------------------------

BUILDERS = {OVERVIEW_UID: slo_overview, NODE_UID: node_dashboard, INCIDENTS_UID: incidents_dashboard}


def build_all(spec: SloSpec, datasource_uid: str = DEFAULT_DATASOURCE_UID) -> dict[str, dict]:
    """uid -> dashboard JSON for every sloscope dashboard."""
    return {uid: to_json(build(spec, datasource_uid)) for uid, build in BUILDERS.items()}


def exporter_gaps() -> list[Gap]:
    """Panels and annotations left out because `sloscope serve` does not export the series they need."""
    gaps: list[Gap] = []
    _node_panels(gaps)
    series, source, labels, kind = WANTED["REMEDIATION_ACTIONS"]
    name = getattr(x, "REMEDIATION_ACTIONS", None)
    if not _exported(name, kind):
        gaps.append(Gap("annotation: remediation executed", f"{NODE_UID}, {INCIDENTS_UID}, {OVERVIEW_UID}",
                        "REMEDIATION_ACTIONS", name or series, source, labels, kind))
    return gaps


def parse(board: dict) -> dm.Dashboard:
    """A dashboard JSON as the SDK's typed model (panel options, field config and Prometheus queries typed)."""
    register_default_plugins()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return dm.Dashboard.from_json(board)


def dumps(model) -> dict:
    """An SDK model back to plain JSON."""
    return json.loads(json.dumps(model, cls=JSONEncoder))


def file_name(uid: str) -> str:
    return f"{uid}.json"

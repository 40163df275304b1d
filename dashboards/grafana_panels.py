"""What the dashboards of dashboards/grafana.py share: the grafana-foundation-sdk builders (imported once, under the
warning filter), their uids, the panel and query helpers, the template variables, links and remediation
annotations every dashboard carries, and the JSON round trip."""

from __future__ import annotations

import json
import warnings

with warnings.catch_warnings():  # the classic (v1) dashboard model warns at import that v2 exists
    warnings.simplefilter("ignore", DeprecationWarning)
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.builders import heatmap, stat, timeseries
    from grafana_foundation_sdk.builders import statetimeline, table  # noqa: F401 (the node and incidents boards')
    from grafana_foundation_sdk.builders import common as gc
    from grafana_foundation_sdk.builders.prometheus import Dataquery as PromQuery
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models import dashboard as dm
    from grafana_foundation_sdk.models import heatmap as hm
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from sloscope.slo_spec import SloSpec

from sloscope import metric_names
from sloscope.alerts.actions import NOTIFY

DEFAULT_DATASOURCE_UID = "prometheus"
OVERVIEW_UID = "sloscope-slo-overview"
NODE_UID = "sloscope-node"
INCIDENTS_UID = "sloscope-incidents"
TAG = "sloscope"

# Prometheus's own series for the alerts of alerts/rules.py: firing alerts that carry an `action` label.
ALERTS_SERIES = "ALERTS"


# --- small helpers -------------------------------------------------------------------------------------------------

def fmt_num(value: float) -> str:
    return format(value, ".12g")


def fmt_pct(value: float) -> str:
    return f"{value * 100:.6g}%"


def fmt_ms(threshold_ms: float) -> str:
    return f"{threshold_ms:g} ms"


def exported_names() -> frozenset[str]:
    return metric_names.exported_series()


def exported(name: str | None, kind: str) -> bool:
    if not name:
        return False
    names = exported_names()
    return (name + "_bucket" in names) if kind == "histogram" else name in names


def ds_ref() -> cm.DataSourceRef:
    return cm.DataSourceRef(type_val="prometheus", uid="${datasource}")


def query(expr: str, legend: str = "__auto", ref: str = "A", *, instant: bool = False,
          fmt: PromQueryFormat | None = None) -> PromQuery:
    q = PromQuery().expr(expr).legend_format(legend).ref_id(ref).datasource(ds_ref())
    if instant:
        q = q.instant()
    else:
        q = q.range()
    if fmt is not None:
        q = q.format(fmt)
    return q


def threshold_steps(*steps: tuple[float | None, str]) -> gd.ThresholdsConfig:
    return gd.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in steps])


def above(limit: float, warn: float | None = None) -> gd.ThresholdsConfig:
    steps = [(None, "green")]
    if warn is not None:
        steps.append((warn, "orange"))
    steps.append((limit, "red"))
    return threshold_steps(*steps)


def series_panel(title: str, unit: str, description: str, targets: list[PromQuery], *, w: int = 12, h: int = 8,
                 thresholds: gd.ThresholdsConfig | None = None, min_val: float | None = None,
                 max_val: float | None = None) -> timeseries.Panel:
    p = (timeseries.Panel().title(title).description(description).unit(unit).datasource(ds_ref())
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


def heat_panel(title: str, unit: str, description: str, expr: str, *, w: int = 8, h: int = 8) -> heatmap.Panel:
    return (heatmap.Panel().title(title).description(description).unit(unit).datasource(ds_ref()).span(w).height(h)
            .with_target(query(expr, "{{le}}", fmt=PromQueryFormat.HEATMAP))
            .calculate(False)
            .y_axis(heatmap.YAxisConfig().unit(unit))
            .cell_values(heatmap.CellValues().unit("short"))
            .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Oranges")
                   .steps(64).fill("dark-orange").exponent(0.5).scale(hm.HeatmapColorScale.EXPONENTIAL))
            .rows_frame(heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.LE))
            .show_value(cm.VisibilityMode.NEVER))


def stat_panel(title: str, unit: str, description: str, targets: list[PromQuery], *, w: int = 8, h: int = 8,
               thresholds: gd.ThresholdsConfig | None = None, decimals: float | None = None) -> stat.Panel:
    p = (stat.Panel().title(title).description(description).unit(unit).datasource(ds_ref()).span(w).height(h)
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
    service_q = f'label_values({metric_names.REQUESTS}{{tier=~"$tier"}}, service)'
    node_q = f'label_values({metric_names.REQUESTS}{{tier=~"$tier", service=~"$service"}}, node)'
    service = (gd.QueryVariable("service").label("service").datasource(ds_ref()).query(service_q).definition(service_q)
               .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
               .multi(True).include_all(True).all_value(".*").current(all_option))
    node = (gd.QueryVariable("node").label("node").datasource(ds_ref()).query(node_q).definition(node_q)
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
    out = [gd.AnnotationQuery().name("Remediation (alerts with an action)").datasource(ds_ref()).enable(True)
           .icon_color("orange")
           .expr(f'{ALERTS_SERIES}{{alertstate="firing", action!~"{NOTIFY}|", node=~"$node"}}')
           .step("60s").title_format("{{action}}").text_format("{{alertname}}: {{action}} on {{node}} "
                                                               "(cause {{cause}}, tier {{tier}})")
           .tag_keys("action,cause,node,tier")]
    name = getattr(metric_names, "REMEDIATION_ACTIONS", None)
    if exported(name, "counter"):
        out.append(gd.AnnotationQuery().name("Remediation executed").datasource(ds_ref()).enable(True)
                   .icon_color("purple")
                   .expr(f'sum by (alert, action, target) (increase({name}{{decision="executed", '
                         f'target=~".*$node.*"}}[1m])) > 0')
                   .step("60s").title_format("{{action}}").text_format("{{action}} on {{target}} ({{alert}})")
                   .tag_keys("action,target"))
    return out


def dashboard(uid: str, title: str, description: str, spec: SloSpec, datasource_uid: str, *,
              time_from: str = "now-3h", node_multi: bool = True) -> gd.Dashboard:
    return (gd.Dashboard(title).uid(uid).description(description).tags([TAG, "slo"]).editable()
            .timezone("utc").time(time_from, "now").refresh("1m").tooltip(dm.DashboardCursorSync.CROSSHAIR)
            .variables(_variables(spec, datasource_uid, node_multi=node_multi)).links(_links())
            .annotations(_remediation_annotations()))


def with_row(board: gd.Dashboard, title: str, panels: list) -> gd.Dashboard:
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


def matchers(tier: str | None = None) -> str:
    tier_m = f'tier="{tier}"' if tier is not None else 'tier=~"$tier"'
    return f'{tier_m}, service=~"$service", node=~"$node"'


def parse(board: dict) -> dm.Dashboard:
    """A dashboard JSON as the SDK's typed model (panel options, field config and Prometheus queries typed)."""
    register_default_plugins()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return dm.Dashboard.from_json(board)


def dumps(model) -> dict:
    """An SDK model back to plain JSON."""
    return json.loads(json.dumps(model, cls=JSONEncoder))

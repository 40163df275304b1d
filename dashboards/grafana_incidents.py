"""The incidents dashboard (`sloscope-incidents`): incidents with their top causes, each linking to the node
dashboard over the time the cause was reported; cause scores over time."""

from __future__ import annotations

from sloscope.slo_spec import SloSpec

from sloscope import metric_names
from sloscope.dashboards.grafana_panels import (DEFAULT_DATASOURCE_UID, INCIDENTS_UID, NODE_UID, PromQueryFormat,
                                                dashboard, dm, ds_ref, gc, gd, matchers, query, series_panel,
                                                stat_panel, table)

INCIDENT_LINK_BEFORE_S = 600  # the node dashboard opens 10 min before a cause was first reported (its baseline)
INCIDENT_LINK_AFTER_S = 300



def _node_link(title: str, url_range: str) -> dict:
    """A data link (field config `links`) to the node dashboard for the node of a table row."""
    return {"title": title, "targetBlank": False, "url": (
        f"/d/{NODE_UID}/sloscope-node?var-datasource=${{datasource}}&var-node=${{__data.fields.node}}"
        f"&var-tier=${{__data.fields.tier}}&var-service=${{__data.fields.service}}&{url_range}")}


def incidents_dashboard(spec: SloSpec, datasource_uid: str = DEFAULT_DATASOURCE_UID) -> gd.Dashboard:
    board = dashboard(INCIDENTS_UID, "sloscope / incidents",
                      "Incidents sloscope found (tier, service, node) with their top-ranked physical causes; the node "
                      "opens the node dashboard over the time the cause was reported (from 10 minutes before, its "
                      "baseline). Remediation actions are annotations.", spec, datasource_uid, time_from="now-24h")
    s = matchers()
    score = metric_names.INCIDENT_CAUSE_SCORE
    keys = "tier, service, node, cause"
    seen = f"timestamp({score}{{{s}}})[$__range:$__interval]"
    table_panel = (
        table.Panel().title("Incidents and their top causes").unit("none").datasource(ds_ref()).span(24).height(10)
        .description("One row per incident (tier, service, node) and ranked cause, best score first, with the time "
                     "range in which sloscope reported it. Click a node for its physical layer over that range.")
        .with_target(query(f"max by ({keys}) (max_over_time({score}{{{s}}}[$__range]))", "", "A", instant=True,
                           fmt=PromQueryFormat.TABLE))
        .with_target(query(f"min by ({keys}) (min_over_time({seen})) * 1000", "", "B", instant=True,
                           fmt=PromQueryFormat.TABLE))
        .with_target(query(f"max by ({keys}) (max_over_time({seen})) * 1000", "", "C", instant=True,
                           fmt=PromQueryFormat.TABLE))
        .with_target(query(f"(min by ({keys}) (min_over_time({seen})) - {INCIDENT_LINK_BEFORE_S}) * 1000", "", "D",
                           instant=True, fmt=PromQueryFormat.TABLE))
        .with_target(query(f"(max by ({keys}) (max_over_time({seen})) + {INCIDENT_LINK_AFTER_S}) * 1000", "", "E",
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
        series_panel("Cause scores over time", "none",
                     "Score (0..1) of each ranked cause of each open incident; a series exists while the incident is "
                     "open. Click a point for the node's physical layer over the time shown.",
                     [query(f"max by ({keys}) ({score}{{{s}}})", "{{node}} {{cause}} ({{tier}} / {{service}})")],
                     w=16, h=9, min_val=0, max_val=1)
        .data_links([gd.DashboardLink("physical layer of ${__field.labels.node}").url(
            f"/d/{NODE_UID}/sloscope-node?var-datasource=${{datasource}}&var-node=${{__field.labels.node}}"
            f"&var-tier=${{__field.labels.tier}}&var-service=${{__field.labels.service}}&${{__url_time_range}}")]))
    board = board.with_panel(stat_panel(
        "Open incidents by top cause", "short",
        "Open incidents per cause that sloscope ranks first or among the top causes.",
        [query(f"count by (cause) ({score}{{{s}}})", "{{cause}}", instant=True)], w=8, h=9, decimals=0))
    return board

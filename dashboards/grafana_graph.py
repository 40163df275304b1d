"""The service graph on the overview dashboard: Grafana's node-graph panel, fed by serve's GET /graph
(docs/traces.md) through the Infinity data source, since Prometheus has no graph to give. The `api` template
variable picks that data source (default uid API_DATASOURCE_UID, an Infinity data source whose URL is serve's
HTTP port); the panel asks /graph for the dashboard's time range."""

from __future__ import annotations

from grafana_foundation_sdk.builders import nodegraph
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.runtime import UnknownDataquery
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from sloscope.dashboards.grafana_panels import gd

INFINITY = "yesoreyeram-infinity-datasource"
API_DATASOURCE_UID = "sloscope-api"
# /graph's fields as the node-graph panel names them (its data frames' conventions).
NODE_COLUMNS = (("id", "id", "string"), ("service", "title", "string"), ("requests_per_s", "mainstat", "number"),
                ("mean_ms", "secondarystat", "number"), ("error_ratio", "arc__errors", "number"))
EDGE_COLUMNS = (("id", "id", "string"), ("source", "source", "string"), ("target", "target", "string"),
                ("calls_per_s", "mainstat", "number"), ("network_gap_ms", "secondarystat", "number"))
GRAPH_URL = "/graph?since=${__from:date:iso}&until=${__to:date:iso}"


def api_ref() -> cm.DataSourceRef:
    return cm.DataSourceRef(type_val=INFINITY, uid="${api}")


def api_variable(uid: str) -> gd.DatasourceVariable:
    return (gd.DatasourceVariable("api").label("sloscope API").type(INFINITY)
            .current(dm.VariableOption(selected=True, text=uid, value=uid)))


class _Query(cogbuilder.Builder[cogvariants.Dataquery]):
    """One Infinity query of /graph's `nodes` or `edges`: the SDK has no model of the plugin's queries, and keeps
    them as it reads them (UnknownDataquery)."""

    def __init__(self, root: str, columns: tuple):
        self._query = UnknownDataquery({
            "refId": root, "datasource": api_ref().to_json(), "type": "json", "source": "url", "format": "table",
            "parser": "backend", "url": GRAPH_URL, "url_options": {"method": "GET"}, "root_selector": root,
            "columns": [{"selector": field, "text": name, "type": kind} for field, name, kind in columns]})

    def build(self) -> UnknownDataquery:
        return self._query


def service_graph_panel() -> nodegraph.Panel:
    """Services (requests per second, mean latency, an arc for the error ratio) and the calls between them (calls
    per second, mean network gap) over the dashboard's time range."""
    return (nodegraph.Panel().title("Service graph (from the stored traces)").datasource(api_ref())
            .description("Each service with its requests per second and mean latency, the red arc its error ratio; "
                         "each call with its calls per second and mean network gap (the CLIENT span less the SERVER "
                         "span it reached). From serve's GET /graph (docs/traces.md) through the Infinity data "
                         "source chosen as `api`.")
            .unit("reqps").span(24).height(12)
            .with_target(_Query("nodes", NODE_COLUMNS)).with_target(_Query("edges", EDGE_COLUMNS)))

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

Every query names only series of sloscope/metric_names.py (what `sloscope serve` exports at /metrics). Panels of
the node dashboard whose series the exporter does not export (yet) are left out; `exporter_gaps()` lists them
with the series they need. Remediation actions appear as annotations from Prometheus's own `ALERTS` series for the
alerts of alerts/rules.py that map to an action, and from the exporter's remediation counter once it exists.

The Prometheus data source is a `datasource` template variable whose default is the uid given (configurable
per build); every panel and query refers to it. Template variables `tier` (the spec's tiers), `service` and
`node` (from the exported request series) filter every dashboard.

Each dashboard has its module (grafana_overview.py, grafana_node.py, grafana_incidents.py), on the shared builders
and helpers of grafana_panels.py; this module is what callers import.
"""

from __future__ import annotations

from sloscope.slo_spec import SloSpec

from sloscope.dashboards.grafana_incidents import INCIDENT_LINK_AFTER_S, INCIDENT_LINK_BEFORE_S, incidents_dashboard
from sloscope.dashboards.grafana_node import Gap, exporter_gaps, node_dashboard
from sloscope.dashboards.grafana_overview import slo_overview
from sloscope.dashboards.grafana_panels import (ALERTS_SERIES, DEFAULT_DATASOURCE_UID, INCIDENTS_UID, NODE_UID,
                                                OVERVIEW_UID, dumps, parse, to_json)

__all__ = ["ALERTS_SERIES", "BUILDERS", "DEFAULT_DATASOURCE_UID", "Gap", "INCIDENTS_UID", "INCIDENT_LINK_AFTER_S",
           "INCIDENT_LINK_BEFORE_S", "NODE_UID", "OVERVIEW_UID", "build_all", "dumps", "exporter_gaps", "file_name",
           "incidents_dashboard", "node_dashboard", "parse", "slo_overview"]

BUILDERS = {OVERVIEW_UID: slo_overview, NODE_UID: node_dashboard, INCIDENTS_UID: incidents_dashboard}


def build_all(spec: SloSpec, datasource_uid: str = DEFAULT_DATASOURCE_UID) -> dict[str, dict]:
    """uid -> dashboard JSON for every sloscope dashboard."""
    return {uid: to_json(build(spec, datasource_uid)) for uid, build in BUILDERS.items()}


def file_name(uid: str) -> str:
    return f"{uid}.json"

"""The SLO overview's token panels: per token objective of a tier (TTFT, TPOT, queue time), its percentile against
the threshold and its burn rates over the token histograms of /metrics; a tier without them keeps its panels."""

from __future__ import annotations

import pytest

from sloscope import metric_names
from sloscope.alerts.burn import PAGE, burn_windows
from sloscope.dashboards import grafana
from sloscope.slo_spec import parse_spec
from tests.dashboards.test_dashboards import OTHER_SPEC, panels, queries, series_names

TOKENS = """    ttft: {percentile: 99, threshold_ms: 400}
    tpot: {percentile: 95, threshold_ms: 40}
"""
PLAIN = """\
default_tier: batch
tiers:
  interactive:
    latency: {percentile: 90, threshold_ms: 250}
    availability: 99.95
  batch:
    latency: {percentile: 50, threshold_ms: 5000}
    availability: 99
window: 7d
"""
WITH_TOKENS = PLAIN.replace("    availability: 99.95\n", "    availability: 99.95\n" + TOKENS)


def _overview(spec_text: str) -> dict:
    return grafana.build_all(parse_spec(spec_text))[grafana.OVERVIEW_UID]


def _without_place(panel: dict) -> dict:
    return {k: v for k, v in panel.items() if k not in ("id", "gridPos")}


def test_a_tier_without_token_objectives_keeps_its_panels():
    plain, tokens = _overview(PLAIN), _overview(WITH_TOKENS)
    token_titles = {"interactive: p99 TTFT against the 400 ms objective", "interactive: TTFT budget burn rate",
                    "interactive: p95 TPOT against the 40 ms objective", "interactive: TPOT budget burn rate"}
    assert {p["title"] for p in tokens["panels"]} - {p["title"] for p in plain["panels"]} >= token_titles
    kept = [p for p in tokens["panels"] if p["title"] not in token_titles]
    rows = [p["title"] for p in kept if p["type"] == "row"]
    assert rows[1] == "Tier interactive: p90 ≤ 250 ms, availability 99.95%, TTFT p99 ≤ 400 ms, TPOT p95 ≤ 40 ms"
    assert [_without_place(p) for p in kept if p["title"] != rows[1]] == [
        _without_place(p) for p in plain["panels"] if not p["title"].startswith("Tier interactive:")]
    assert {k: v for k, v in tokens.items() if k != "panels"} == {k: v for k, v in plain.items() if k != "panels"}
    # the dashboards of a spec without any token objective are those of before (no token series anywhere)
    assert not any(f.name in e for b in grafana.build_all(OTHER_SPEC).values() for _, e in queries(b)
                   for f in metric_names.TOKEN_FAMILIES)


@pytest.mark.parametrize("sli, percentile, threshold_s", [("ttft", 99, 0.4), ("tpot", 95, 0.04)])
def test_each_token_objective_has_its_percentile_and_burn_panels(sli, percentile, threshold_s):
    spec = parse_spec(WITH_TOKENS)
    family = metric_names.TOKEN_FAMILY[sli]
    overview = grafana.build_all(spec)[grafana.OVERVIEW_UID]
    by_title = {p["title"]: p for p in panels(overview)}
    quantile = by_title[f"interactive: p{percentile} {family.short} against the {threshold_s * 1000:g} ms objective"]
    assert quantile["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]["value"] == pytest.approx(threshold_s)
    assert [t["expr"].split(",")[0] for t in quantile["targets"]] == [f"histogram_quantile({percentile / 100:g}"] * 2
    assert all(f'{family.name}_bucket{{tier="interactive"' in t["expr"] for t in quantile["targets"])
    burn = by_title[f"interactive: {family.short} budget burn rate"]
    burns = burn_windows(spec.window_s)
    assert [t["legendFormat"] for t in burn["targets"]] == [b.long for b in burns]
    le = metric_names.le_label(threshold_s)
    allowance = format(1 - percentile / 100, ".12g")
    for target, b in zip(burn["targets"], burns):
        assert f'le="{le}"}}[{b.long}]' in target["expr"] and target["expr"].endswith(f") / {allowance}")
    steps = [s["value"] for s in burn["fieldConfig"]["defaults"]["thresholds"]["steps"][1:]]
    assert steps == [min(b.factor for b in burns), min(b.factor for b in burns if b.kind == PAGE)]
    # every series the panels name is one /metrics exports, and the threshold is one of its bucket bounds
    exported = metric_names.exported_series()
    assert all(series_names(t["expr"]) <= exported for t in quantile["targets"] + burn["targets"])
    assert le in {metric_names.le_label(b) for b in metric_names.buckets_for(spec, sli)}
    assert grafana.build_all(spec) == grafana.build_all(parse_spec(WITH_TOKENS))  # a pure function of the spec

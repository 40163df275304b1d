"""The SLO overview dashboard (`sloscope-slo-overview`): per tier, latency and errors against the objective, burn
rates and the error budget left, and for each token objective the tier gives (TTFT, TPOT, queue time) its
percentile against the threshold and its burn rates; request rate, error ratio and open incidents for all tiers
above."""

from __future__ import annotations

from sloscope.slo_spec import SloSpec, TierObjective

from sloscope import metric_names
from sloscope.alerts.burn import PAGE, burn_windows, promql_duration
from sloscope.dashboards.grafana_graph import API_DATASOURCE_UID, api_variable, service_graph_panel
from sloscope.dashboards.grafana_panels import (DEFAULT_DATASOURCE_UID, OVERVIEW_UID, above, dashboard, fmt_ms,
                                                fmt_num, fmt_pct, gd, matchers, query, series_panel, stat_panel,
                                                threshold_steps, with_row)


def _slow_burn(t: TierObjective, histogram: str, percentile: float, threshold_ms: float, window: str) -> str:
    """Share of requests above the threshold in `histogram` over `window`, divided by the share the percentile
    allows."""
    le = metric_names.le_label(metric_names.le_seconds(threshold_ms))
    s = matchers(t.name)
    return (f"(1 - sum(rate({histogram}_bucket{{{s}, le=\"{le}\"}}[{window}])) / "
            f"sum(rate({histogram}_count{{{s}}}[{window}]))) / {fmt_num(1 - percentile / 100)}")


def _percentile_panel(t: TierObjective, histogram: str, percentile: float, threshold_ms: float, title: str,
                      what: str):
    """The tier's percentile of `histogram` (what it times: `title` in the title, `what` in the description),
    overall and per service, with the threshold drawn."""
    q, pname = percentile / 100, f"p{fmt_num(percentile)}"
    bucket, s = f"{histogram}_bucket", matchers(t.name)
    return series_panel(
        f"{t.name}: {pname} {title} against the {fmt_ms(threshold_ms)} objective", "s",
        f"The tier's {pname} {what} (from the exported histogram, whose buckets include the objective "
        f"{fmt_ms(threshold_ms)} exactly), overall and per service. Above the dashed line the tier violates its SLO.",
        [query(f"histogram_quantile({fmt_num(q)}, sum by (le) (rate({bucket}{{{s}}}[$__rate_interval])))", pname, "A"),
         query(f"histogram_quantile({fmt_num(q)}, sum by (service, le) (rate({bucket}{{{s}}}[$__rate_interval])))",
               "{{service}}", "B")],
        thresholds=above(metric_names.le_seconds(threshold_ms)), min_val=0)


def _alerts_text(burns) -> str:
    return " or ".join(f"{b.factor_text} over {b.long} and {b.short} ({b.kind})" for b in burns)


def _burn_panel(title: str, description: str, expr, burns, w: int):
    """Burn rates per alert, `expr(window)` over each one's long window, its factors as thresholds."""
    return series_panel(
        title, "suffix:×", description,
        [query(expr(b.long), b.long, chr(ord("A") + i)) for i, b in enumerate(burns)],
        w=w, thresholds=above(min(b.factor for b in burns if b.kind == PAGE), min(b.factor for b in burns)),
        min_val=0)


def _token_panels(spec: SloSpec, t: TierObjective) -> list:
    """Per token objective of the tier: its percentile against the threshold, and its burn rates."""
    burns = burn_windows(spec.window_s)
    out = []
    for token in t.tokens:
        family = metric_names.TOKEN_FAMILY[token.sli]
        pname = f"p{fmt_num(token.percentile)}"
        out.append(_percentile_panel(t, family.name, token.percentile, token.threshold_ms, family.short,
                                     f"{family.what} of the requests that give it"))
        out.append(_burn_panel(
            f"{t.name}: {family.short} budget burn rate",
            f"How fast the {family.short} budget is spent: the share of requests whose {family.what} is above "
            f"{fmt_ms(token.threshold_ms)} over the {fmt_pct(token.allowance)} the {pname} objective allows. Alerts "
            f"fire above {_alerts_text(burns)}.",
            lambda window: _slow_burn(t, family.name, token.percentile, token.threshold_ms, window),
            burns, 12))
    return out


def _error_ratio(selector: str, window: str, by: str = "") -> str:
    by_clause = f" by ({by})" if by else ""
    return (f"sum{by_clause} (rate({metric_names.REQUEST_ERRORS}{{{selector}}}[{window}])) / "
            f"sum{by_clause} (rate({metric_names.REQUESTS}{{{selector}}}[{window}]))")


def _tier_row(spec: SloSpec, t: TierObjective) -> tuple[str, list]:
    s = matchers(t.name)
    pname = f"p{fmt_num(t.percentile)}"
    allowance = 1 - t.percentile / 100
    window = promql_duration(spec.window_s)
    le = metric_names.le_label(metric_names.le_seconds(t.threshold_ms))
    bucket, count = f"{metric_names.REQUEST_DURATION}_bucket", f"{metric_names.REQUEST_DURATION}_count"
    latency = _percentile_panel(t, metric_names.REQUEST_DURATION, t.percentile, t.threshold_ms, "latency",
                                "request latency")
    errors = series_panel(
        f"{t.name}: error ratio against the {fmt_pct(t.error_budget)} budget", "percentunit",
        f"Failed requests (5xx or span status ERROR) over all requests of the tier; the availability objective "
        f"{fmt_num(t.availability)}% allows {fmt_pct(t.error_budget)}.",
        [query(_error_ratio(s, "$__rate_interval"), "error ratio", "A"),
         query(_error_ratio(s, "$__rate_interval", "service"), "{{service}}", "B")],
        thresholds=above(t.error_budget), min_val=0)
    burns = burn_windows(spec.window_s)  # one query per alert, over its long window, its factor a threshold
    latency_burn = _burn_panel(
        f"{t.name}: latency budget burn rate",
        f"How fast the latency budget is spent: the share of requests slower than {fmt_ms(t.threshold_ms)} over the "
        f"{fmt_pct(allowance)} the {pname} objective allows. Alerts fire above {_alerts_text(burns)}.",
        lambda window: _slow_burn(t, metric_names.REQUEST_DURATION, t.percentile, t.threshold_ms, window), burns, 8)
    error_burn = _burn_panel(
        f"{t.name}: error budget burn rate",
        f"The error ratio over the {fmt_pct(t.error_budget)} budget, per alert window; alerts fire above "
        f"{_alerts_text(burns)}.",
        lambda window: f"({_error_ratio(s, window)}) / {fmt_num(t.error_budget)}", burns, 8)
    budget_left = stat_panel(
        f"{t.name}: error budget left ({window})", "percentunit",
        f"Share of the {window} budget not yet spent: latency (requests slower than {fmt_ms(t.threshold_ms)}) and "
        f"errors. Below zero the objective is missed for the period.",
        [query(f"1 - (1 - sum(increase({bucket}{{{s}, le=\"{le}\"}}[{window}])) / "
               f"sum(increase({count}{{{s}}}[{window}]))) / {fmt_num(allowance)}", "latency", "A", instant=True),
         query(f"1 - ({_error_ratio(s, window).replace('rate(', 'increase(')}) / {fmt_num(t.error_budget)}",
               "errors", "B", instant=True)],
        w=8, thresholds=threshold_steps((None, "red"), (0, "orange"), (0.25, "green")), decimals=1)
    tokens = "".join(f", {metric_names.TOKEN_FAMILY[token.sli].short} p{fmt_num(token.percentile)} ≤ "
                     f"{fmt_ms(token.threshold_ms)}" for token in t.tokens)
    title = (f"Tier {t.name}: {pname} ≤ {fmt_ms(t.threshold_ms)}, availability {fmt_num(t.availability)}%{tokens}"
             f"{' (default tier)' if t.name == spec.default_tier else ''}")
    return title, [latency, errors, latency_burn, error_burn, budget_left, *_token_panels(spec, t)]


def slo_overview(spec: SloSpec, datasource_uid: str = DEFAULT_DATASOURCE_UID,
                 api_uid: str = API_DATASOURCE_UID) -> gd.Dashboard:
    board = dashboard(OVERVIEW_UID, "sloscope / SLO overview",
                      "Per SLO tier: latency percentile against its objective, error ratio, burn rates and the error "
                      f"budget left over {promql_duration(spec.window_s)}. Generated from the SLO spec "
                      f"({spec.source}) by `sloscope dashboards build`; edits in Grafana are overwritten on push.",
                      spec, datasource_uid, time_from="now-6h")
    s = matchers()
    board = board.with_row(gd.Row("All tiers"))
    board = board.with_panel(series_panel(
        "Request rate by tier", "reqps", "Requests per second ingested by sloscope, per SLO tier.",
        [query(f"sum by (tier) (rate({metric_names.REQUESTS}{{{s}}}[$__rate_interval]))", "{{tier}}")], w=9, min_val=0))
    board = board.with_panel(series_panel(
        "Error ratio by tier", "percentunit", "Failed requests over all requests, per SLO tier.",
        [query(_error_ratio(s, "$__rate_interval", "tier"), "{{tier}}")], w=9, min_val=0))
    board = board.with_panel(stat_panel(
        "Open incidents", "short",
        "Incidents (tier, service, node) that sloscope's analysis reports open now, with at least one ranked cause.",
        [query(f"count(max by (tier, service, node) ({metric_names.INCIDENT_CAUSE_SCORE}{{{s}}})) or vector(0)",
               "incidents", instant=True)],
        w=6, thresholds=threshold_steps((None, "green"), (1, "red")), decimals=0))
    board = board.with_variable(api_variable(api_uid)).with_panel(service_graph_panel())
    for t in spec.tiers.values():
        board = with_row(board, *_tier_row(spec, t))
    return board

"""Prometheus recording and alerting rules, generated as a pure function of the SLO spec.

`rules_dict(spec)` builds the rule file as a dict; `render_rules(spec)` turns it into YAML text; writing the
file is the CLI's business. Expressions only name series of sloscope/metric_names.py (what serve's /metrics serves)
or series recorded by the rules themselves.

Per tier (one group each, recording rules before the alerts that read them):
- SLIs over the burn-rate windows (alerts/burn.py; 5m, 30m, 1h, 6h, 3d for a 30-day SLO window): the share of
  requests slower than the tier's threshold (from the histogram bucket whose `le` is exactly that threshold)
  and the error ratio.
- Multiwindow, multi-burn-rate alerts (SRE Workbook, factors scaled to the spec's window by alerts/burn.py):
  for 30 days, page when the burn rate exceeds 14.4 over 1h and 5m, or 6 over 6h and 30m; ticket when it
  exceeds 1 over 3d and 6h. For latency the budget is the percentile's allowance (p99: 1 % of requests may be
  slower than the threshold); for errors, 1 - availability/100. A page also needs its long window's bad requests
  improbable, at PAGE_ALPHA, for a tier that meets its objective exactly (a Poisson tail in closed form).
- For each token objective the tier gives (TTFT, TPOT, queue time: slo_spec.TOKEN_SLIS), the same SLI records
  and burn alerts (SloscopeTokenBudgetBurn and SloscopeTokenBudgetSlowBurn, `slo` naming the objective) over its
  histogram, the share of the requests that give the time above its threshold against its percentile's
  allowance. A tier without them has exactly the rules it had before they existed.
- Per (tier, service, node), more requests slower than the threshold over the last minute than a service at
  exactly the percentile's allowance would produce at ALERT_ALPHA (the analysis' latency test): raise trace
  sampling of the tier to 100 %.

Physical layer (thresholds from the spec's `physical_limits`, whose defaults are the field's, given here):
GPU utilization above 80 % (shift new requests away), GPU memory growing as taxonomy.GPU_MEMORY_LEAK defines it
(more than 5 % over each of 3 consecutive minutes; restart the workload; held 5 minutes, longer than a model
takes to load), NVMe above 65 C and SPDK bdev wait above 5 ms (throttle the bdev), SPDK reactor busy above 70 %,
a node's error ratio above 5 % over 1 minute with more failures than chance gives a node at 5 %.

RCA: one alert per taxonomy cause, firing while that cause is the top-ranked cause (score >= 0.5) of an open
incident, as exported in sloscope_incident_cause_score.

Every alert carries the labels `severity`, `cause` (a taxonomy id, or `unattributed` for symptoms whose cause
is not known to the rule), `action` (the remediation it maps to), and `tier` and/or `node`; and the
annotations `summary`, `description`, `remediation` (what to do, and what the mapped action does) and
`runbook_url` (the alert's section of docs/runbooks.md, under a configurable base URL).

Per tier, a metadata group records the objective, its error budget, the SLO window and the budget left over
that window (as Sloth's `sloth_slo_info` and `slo:*` series do), so dashboards can show the SLO without data.

`prometheus_rule()` wraps the groups in a prometheus-operator `monitoring.coreos.com/v1` PrometheusRule.

This module writes the tier groups and the file; alerts/node_rules.py the physical and cause groups, and
alerts/rule_text.py what they all say the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from sloscope.slo_spec import SloSpec, TierObjective

from sloscope.analytics.slo import FLEET_FDR, slow_allowance

from sloscope import metric_names
from sloscope.alerts.actions import NOTIFY, RAISE_SAMPLING
from sloscope.alerts.burn import (DAY_S, PAGE, TICKET, budget_spent_in, burn_windows, promql_duration, sli_windows,
                                  window_days)
from sloscope.alerts.node_rules import cause_group, physical_group
from sloscope.alerts.rule_text import (ACTION_TEXT, DEFAULT_RUNBOOK_BASE_URL, UNATTRIBUTED, ms, num, pct,
                                       poisson_critical, q)

PROMETHEUS_RULE_API = "monitoring.coreos.com/v1"
# The rules judge each (tier, service, node) minute alone: at the level the analysis applies to the first
# violation among ALERT_FLEET_TESTS tests (about an hour of a 10-node fleet's windows), as they cannot see the
# fleet's other windows.
ALERT_FLEET_TESTS = 10_000
ALERT_ALPHA = FLEET_FDR / ALERT_FLEET_TESTS
# A page also needs its long window's bad requests improbable, at this chance, for a tier that meets its objective
# exactly: on a tier of a request a minute, one failure is a 99.9 % objective's 14.4-fold burn over an hour.
PAGE_ALPHA = 1e-4

# Alert names (the keys of the remediation config).
LATENCY_BURN = "SloscopeLatencyBudgetBurn"
LATENCY_SLOW_BURN = "SloscopeLatencyBudgetSlowBurn"
ERROR_BURN = "SloscopeErrorBudgetBurn"
ERROR_SLOW_BURN = "SloscopeErrorBudgetSlowBurn"
TIER_LATENCY_HIGH = "SloscopeTierLatencyHigh"
TOKEN_BURN = "SloscopeTokenBudgetBurn"  # every token objective's, told apart by `slo`
TOKEN_SLOW_BURN = "SloscopeTokenBudgetSlowBurn"

RECORD_SLOW = "tier:sloscope_request_slow:ratio_rate{window}"
RECORD_ERRORS = "tier:sloscope_request_errors:ratio_rate{window}"
RECORD_TOKEN_SLOW = "tier:sloscope_request_{sli}_slow:ratio_rate{window}"
# The SLO metadata series (Sloth's sloth_slo_info, slo:objective:ratio, slo:error_budget:ratio,
# slo:time_period:days and slo:period_error_budget_remaining:ratio), per tier and slo.
RECORD_INFO = "sloscope_slo_info"
RECORD_OBJECTIVE = "tier:sloscope_slo_objective:ratio"
RECORD_BUDGET = "tier:sloscope_slo_error_budget:ratio"
RECORD_WINDOW_DAYS = "tier:sloscope_slo_window:days"
RECORD_BUDGET_LEFT = "tier:sloscope_slo_error_budget_remaining:ratio"


# --- per tier ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Objective:
    """One of a tier's objectives as its rules judge it."""

    slo: str  # the `slo` label of its alerts and metadata
    record: str  # its SLI's recording rule, {window} to fill
    budget: float  # the share of requests it allows bad
    objective: float  # as sloscope_slo_info's `objective` says it: the percentile, or the availability
    what: str  # what the SLI counts, as the descriptions say it
    alerts: tuple[str, str]  # its page and ticket burn alerts
    histogram: str | None = None  # whose bucket at threshold_ms counts its good requests; None: the error counters
    threshold_ms: float = 0.0


def _objectives(t: TierObjective) -> list[_Objective]:
    """Latency, availability, and the token objectives the tier gives (in TOKEN_SLIS order)."""
    allowance = 1.0 - t.percentile / 100.0
    out = [_Objective("latency", RECORD_SLOW, allowance, t.percentile,
                      f"requests slower than {ms(metric_names.le_seconds(t.threshold_ms))} "
                      f"(p{num(t.percentile)} objective: at most {pct(allowance)} of requests may be slower)",
                      (LATENCY_BURN, LATENCY_SLOW_BURN), metric_names.REQUEST_DURATION, t.threshold_ms),
           _Objective("availability", RECORD_ERRORS, t.error_budget, t.availability,
                      f"failed requests (availability objective {num(t.availability)}%: error budget "
                      f"{pct(t.error_budget)})", (ERROR_BURN, ERROR_SLOW_BURN))]
    for token in t.tokens:
        family = metric_names.TOKEN_FAMILY[token.sli]
        out.append(_Objective(
            token.sli, RECORD_TOKEN_SLOW.format(sli=token.sli, window="{window}"), token.allowance, token.percentile,
            f"requests whose {family.what} is above {ms(metric_names.le_seconds(token.threshold_ms))} "
            f"(p{num(token.percentile)} {family.short} objective: at most {pct(token.allowance)} of the requests "
            f"that give it may be above)", (TOKEN_BURN, TOKEN_SLOW_BURN), family.name, token.threshold_ms))
    return out


def _ratio(t: TierObjective, o: _Objective, window: str) -> str:
    """The objective's SLI over `window`: the share of requests above its threshold (from the histogram bucket
    whose `le` is exactly the threshold), or the error ratio."""
    tier = q(t.name)
    if o.histogram is None:
        return (f"sum by (tier) (rate({metric_names.REQUEST_ERRORS}{{tier={tier}}}[{window}]))\n"
                f"/\n"
                f"sum by (tier) (rate({metric_names.REQUESTS}{{tier={tier}}}[{window}]))\n")
    le = q(metric_names.le_label(metric_names.le_seconds(o.threshold_ms)))
    return (f"1 - (\n"
            f"  sum by (tier) (rate({o.histogram}_bucket{{tier={tier}, le={le}}}[{window}]))\n"
            f"/\n"
            f"  sum by (tier) (rate({o.histogram}_count{{tier={tier}}}[{window}]))\n"
            f")\n")


def _sli_rules(t: TierObjective, window_s: float) -> list[dict]:
    windows = sli_windows(window_s)
    return [{"record": o.record.format(window=w), "labels": {"tier": t.name}, "expr": _ratio(t, o, w)}
            for o in _objectives(t) for w in windows]


def _burn_expr(t: TierObjective, o: _Objective, burns, significant: bool = False) -> str:
    """Sloth's multiwindow burn test for each window pair; `significant`: also, over the long window, more bad
    requests than a tier meeting its objective exactly would serve but with probability PAGE_ALPHA (a Poisson
    tail in closed form), which a burn of a busy tier always has and chance on a quiet one does not."""
    parts = []
    for b in burns:
        limit = f"({num(b.factor)} * {num(o.budget)})"
        guard = ""
        if significant:
            bad, total = _counts(t, o, b.long)
            guard = f"and\n  {bad}\n  >= {poisson_critical(f'{total} * {num(o.budget)}', PAGE_ALPHA)}\n"
        parts.append(
            f"(\n"
            f"  {o.record.format(window=b.long)}{{tier={q(t.name)}}} > {limit}\n"
            f"and\n"
            f"  {o.record.format(window=b.short)}{{tier={q(t.name)}}} > {limit}\n"
            f"{guard})")
    return "\nor\n".join(parts) + "\n"


def _counts(t: TierObjective, o: _Objective, window: str) -> tuple[str, str]:
    """(bad, all) requests of the tier over `window` for the objective (above its threshold, or failed), in
    PromQL."""
    matcher, by = f"{{tier={q(t.name)}}}", "sum by (tier)"
    if o.histogram is None:
        return (f"{by} (increase({metric_names.REQUEST_ERRORS}{matcher}[{window}]))",
                f"{by} (increase({metric_names.REQUESTS}{matcher}[{window}]))")
    total = f"{by} (increase({o.histogram}_count{matcher}[{window}]))"
    le = q(metric_names.le_label(metric_names.le_seconds(o.threshold_ms)))
    fast = f"{by} (increase({o.histogram}_bucket{{tier={q(t.name)}, le={le}}}[{window}]))"
    return f"({total} - {fast})", total


def _windows_text(burns) -> str:
    return " or ".join(f"{b.factor_text} over {b.long} and {b.short}" for b in burns)


def _burn_alerts(t: TierObjective, window_s: float, opts: RuleOptions) -> list[dict]:
    burns = burn_windows(window_s)
    page = [b for b in burns if b.kind == PAGE]
    ticket = [b for b in burns if b.kind == TICKET]
    days = window_days(window_s)
    objectives = _objectives(t)
    out = []
    for o in objectives:
        out.append({
            "alert": o.alerts[0], "expr": _burn_expr(t, o, page, significant=True),
            "labels": {"severity": opts.page_severity, "tier": t.name, "slo": o.slo, "cause": UNATTRIBUTED,
                       "action": RAISE_SAMPLING},
            "annotations": {
                "summary": f"Tier {t.name} is burning its {o.slo} error budget fast",
                "description": f"The share of {o.what} in tier {t.name} is above {_windows_text(page)} the "
                               f"budget's rate; at {page[0].factor_text} a {days} budget is spent in "
                               f"{budget_spent_in(window_s, page[0].factor)}.",
                "remediation": f"Find the node and physical cause: sloscope rca --since 1h, or the SloscopeCause* "
                               f"alerts and sloscope_incident_cause_score{{tier=\"{t.name}\"}}. "
                               + ACTION_TEXT[RAISE_SAMPLING]}})
    for o in objectives:
        out.append({
            "alert": o.alerts[1], "expr": _burn_expr(t, o, ticket),
            "labels": {"severity": opts.ticket_severity, "tier": t.name, "slo": o.slo, "cause": UNATTRIBUTED,
                       "action": NOTIFY},
            "annotations": {
                "summary": f"Tier {t.name} is spending its {o.slo} error budget faster than it accrues",
                "description": f"The share of {o.what} in tier {t.name} is above {_windows_text(ticket)} the "
                               f"budget's rate: {_ticket_outlook(ticket[0], window_s)}",
                "remediation": f"Not urgent: review sloscope rca --since {ticket[0].long} for recurring causes on "
                               "this tier. " + ACTION_TEXT[NOTIFY]}})
    return out


def _ticket_outlook(ticket, window_s: float) -> str:
    days = window_days(window_s)
    if ticket.factor >= 1:
        return f"the {days} budget will run out before the period ends."
    return f"at that rate {pct(ticket.budget_share)} of the {days} budget is spent in {ticket.long}."


def _tier_latency_alert(t: TierObjective) -> dict:
    """The analysis' latency test over the last minute per (tier, service, node): slow requests improbable for
    a service at exactly the percentile's allowance (Poisson tail in closed form, at ALERT_ALPHA)."""
    allowance = slow_allowance(t)
    threshold_s = metric_names.le_seconds(t.threshold_ms)
    matcher = f"{{tier={q(t.name)}}}"
    bucket = f"{{tier={q(t.name)}, le={q(metric_names.le_label(threshold_s))}}}"
    by = "sum by (tier, service, node)"
    total = f"{by} (increase({metric_names.REQUEST_DURATION}_count{matcher}[1m]))"
    fast = f"{by} (increase({metric_names.REQUEST_DURATION}_bucket{bucket}[1m]))"
    return {
        "alert": TIER_LATENCY_HIGH,
        "expr": f"({total}\n-\n{fast})\n>=\n{poisson_critical(f'{total} * {num(allowance)}', ALERT_ALPHA)}\n",
        "labels": {"severity": "warning", "tier": t.name, "slo": "latency", "cause": UNATTRIBUTED,
                   "action": RAISE_SAMPLING},
        "annotations": {
            "summary": f"Tier {t.name}: {{{{ $value | printf \"%.0f\" }}}} requests of {{{{ $labels.service }}}} on "
                       f"{{{{ $labels.node }}}} slower than {ms(threshold_s)} in the last minute",
            "description": f"More requests of tier {t.name} were slower than {ms(threshold_s)} over the last minute "
                           f"than a service meeting its p{num(t.percentile)} objective (at most {pct(allowance)} "
                           f"slower) would produce with probability {num(ALERT_ALPHA)}: the test sloscope rca "
                           f"applies to its SLI windows.",
            "remediation": ACTION_TEXT[RAISE_SAMPLING] + " Then see sloscope rca for the node and physical cause."}}


def tier_group(t: TierObjective, window_s: float, opts: RuleOptions | None = None) -> dict:
    return {"name": f"sloscope-slo-{t.name}",
            "rules": _sli_rules(t, window_s) + _burn_alerts(t, window_s, opts or RuleOptions())
            + [_tier_latency_alert(t)]}


def meta_group(t: TierObjective, window_s: float) -> dict:
    """The tier's SLOs as series (a group of its own: the budget left reads the whole SLO window)."""
    window = promql_duration(window_s)
    rules = []
    for o in _objectives(t):
        labels = {"tier": t.name, "slo": o.slo}
        rules += [
            {"record": RECORD_INFO, "labels": {**labels, "objective": num(o.objective), "window": window},
             "expr": "vector(1)\n"},
            {"record": RECORD_OBJECTIVE, "labels": labels, "expr": f"vector({num(1 - o.budget)})\n"},
            {"record": RECORD_BUDGET, "labels": labels, "expr": f"vector({num(o.budget)})\n"},
            {"record": RECORD_WINDOW_DAYS, "labels": labels, "expr": f"vector({num(window_s / DAY_S)})\n"},
            {"record": RECORD_BUDGET_LEFT, "labels": labels,
             "expr": f"1 - (\n{_ratio(t, o, window)}) / {num(o.budget)}\n"},
        ]
    return {"name": f"sloscope-slo-meta-{t.name}", "rules": rules}


# --- the file ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RuleOptions:
    """What the rules' reader may choose; the defaults are the plain rule file's."""

    hold: str | None = None  # replaces the `for:` of the physical, node and cause alerts (default 1-2 minutes)
    page_severity: str = PAGE
    ticket_severity: str = TICKET
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL


def runbook_url(base_url: str, alert: str) -> str:
    """The alert's section of the runbooks page (its heading is the alert name)."""
    return f"{base_url}#{alert.lower()}"


def _with_runbook_urls(groups: list[dict], base_url: str) -> list[dict]:
    for group in groups:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["annotations"].setdefault("runbook_url", runbook_url(base_url, rule["alert"]))
    return groups


def rules_dict(spec: SloSpec, opts: RuleOptions | None = None) -> dict:
    """The rule file for `spec`, as a dict in Prometheus' rule file format. Raises alerts.burn.UnsupportedWindow
    for an SLO window the burn-rate windows cannot be derived for."""
    opts = opts or RuleOptions()
    groups = [tier_group(t, spec.window_s, opts) for t in spec.tiers.values()]
    groups += [meta_group(t, spec.window_s) for t in spec.tiers.values()]
    groups += [physical_group(spec.physical_limits, opts.hold),
               cause_group(opts.hold, spec.taxonomy.causes, opts.runbook_base_url)]
    return {"groups": _with_runbook_urls(groups, opts.runbook_base_url)}


def prometheus_rule(spec: SloSpec, name: str, namespace: str | None, labels: dict[str, str],
                    opts: RuleOptions | None = None) -> dict:
    """The rules as a prometheus-operator PrometheusRule; `labels` are what the Prometheus' ruleSelector
    matches (kube-prometheus-stack: `release: <its release name>`)."""
    metadata = {"name": name, **({"namespace": namespace} if namespace else {}),
                "labels": {"app.kubernetes.io/name": "sloscope", "app.kubernetes.io/component": "rules", **labels}}
    return {"apiVersion": PROMETHEUS_RULE_API, "kind": "PrometheusRule", "metadata": metadata,
            "spec": rules_dict(spec, opts)}


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_yaml(spec: SloSpec, doc: dict) -> str:
    """A rules document as YAML text (deterministic: the same spec gives the same bytes)."""
    header = ("# Prometheus rules generated by `sloscope rules` from the SLO spec "
              f"{' '.join(spec.source.split())}.\n"
              "# Regenerate instead of editing; names are those of sloscope's /metrics.\n")
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=200, allow_unicode=False)


def render_rules(spec: SloSpec, opts: RuleOptions | None = None) -> str:
    """The plain rule file as YAML text."""
    return render_yaml(spec, rules_dict(spec, opts))


def alert_names(spec: SloSpec) -> list[str]:
    """Every alert name the rules for `spec` define (each once)."""
    names = []
    for group in rules_dict(spec)["groups"]:
        for rule in group["rules"]:
            if "alert" in rule and rule["alert"] not in names:
                names.append(rule["alert"])
    return names

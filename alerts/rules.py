"""Prometheus recording and alerting rules, generated as a pure function of the SLO spec.

`rules_dict(spec)` builds the rule file as a dict; `render_rules(spec)` turns it into YAML text; writing the
file is the CLI's business. Expressions only name series of alerts/exposition.py (what the exporter serves)
or series recorded by the rules themselves.

Per tier (one group each, recording rules before the alerts that read them):
- SLIs over 5m, 30m, 1h, 6h, 3d: the share of requests slower than the tier's threshold (from the histogram
  bucket whose `le` is exactly that threshold) and the error ratio.
- Multiwindow, multi-burn-rate alerts (SRE Workbook): page when the burn rate exceeds 14.4 over 1h and 5m, or
  6 over 6h and 30m; ticket when it exceeds 1 over 3d and 6h. For latency the budget is the percentile's
  allowance (p99: 1 % of requests may be slower than the threshold); for errors, 1 - availability/100.
- Per (tier, service, node), more requests slower than the threshold over the last minute than a service at
  exactly the percentile's allowance would produce at ALERT_ALPHA (the analysis' latency test): raise trace
  sampling of the tier to 100 %.

Physical layer (thresholds from the field): GPU utilization above 80 % (shift new requests away), GPU memory
growing as taxonomy.GPU_MEMORY_LEAK defines it (more than 5 % over each of 3 consecutive minutes; restart the
workload), NVMe above 65 C and SPDK bdev wait
above 5 ms (throttle the bdev), SPDK reactor busy above 70 %, a node's error ratio above 5 % over 1 minute.

RCA: one alert per taxonomy cause, firing while that cause is the top-ranked cause (score >= 0.5) of an open
incident, as exported in sloscope_incident_cause_score.

Every alert carries the labels `severity`, `cause` (a taxonomy id, or `unattributed` for symptoms whose cause
is not known to the rule), `action` (the remediation it maps to), and `tier` and/or `node`; and the
annotations `summary`, `description` and `runbook`.
"""

from __future__ import annotations

import json

import yaml

from sloscope import taxonomy
from sloscope.slo_spec import SloSpec, TierObjective

from analytics.significance import z_for
from analytics.slo import FLEET_FDR, slow_allowance

from alerts import exposition as x
from alerts.actions import (DRAIN, NOTIFY, QOS, RAISE_SAMPLING, RESTART)

UNATTRIBUTED = "unattributed"
SLI_WINDOWS = ("5m", "30m", "1h", "6h", "3d")
# (burn-rate factor, long window, short window), SRE Workbook chapter 5, for a 30-day budget.
PAGE_BURNS = ((14.4, "1h", "5m"), (6, "6h", "30m"))
TICKET_BURNS = ((1, "3d", "6h"),)
MIN_REQUESTS_PER_MINUTE = 10  # below this, a minute's error ratio is noise
# The rules judge each (tier, service, node) minute alone: at the level the analysis applies to the first
# violation among ALERT_FLEET_TESTS tests (about an hour of a 10-node fleet's windows), as they cannot see the
# fleet's other windows.
ALERT_FLEET_TESTS = 10_000
ALERT_ALPHA = FLEET_FDR / ALERT_FLEET_TESTS

# Field thresholds.
GPU_UTILIZATION_MAX = 0.8
NVME_TEMPERATURE_MAX_C = 65
SPDK_BDEV_WAIT_MAX_S = 0.005
SPDK_REACTOR_BUSY_MAX = 0.7
NODE_ERROR_RATIO_MAX = 0.05
CAUSE_SCORE_MIN = 0.5

# Alert names (the keys of the remediation config).
LATENCY_BURN = "SloscopeLatencyBudgetBurn"
LATENCY_SLOW_BURN = "SloscopeLatencyBudgetSlowBurn"
ERROR_BURN = "SloscopeErrorBudgetBurn"
ERROR_SLOW_BURN = "SloscopeErrorBudgetSlowBurn"
TIER_LATENCY_HIGH = "SloscopeTierLatencyHigh"
NODE_ERROR_RATIO_HIGH = "SloscopeNodeErrorRatioHigh"
GPU_SATURATED = "SloscopeGpuSaturated"
GPU_MEMORY_LEAK = "SloscopeGpuMemoryLeak"
NVME_HOT = "SloscopeNvmeHot"
SPDK_BDEV_WAIT_HIGH = "SloscopeSpdkBdevWaitHigh"
SPDK_REACTOR_BUSY = "SloscopeSpdkReactorBusy"

# What each taxonomy cause maps to when it is the top cause of an open incident.
CAUSE_ACTIONS = {
    "gpu_sm_contention": DRAIN,
    "gpu_memory_bandwidth": DRAIN,
    "gpu_memory_leak": RESTART,
    "gpu_interconnect": NOTIFY,
    "gpu_thermal": DRAIN,
    "storage_queue": QOS,
    "storage_thermal": QOS,
    "disk_io": NOTIFY,
    "network_loss": DRAIN,
    "connection_churn": NOTIFY,
    "cpu_contention": NOTIFY,
    "memory_pressure": NOTIFY,
    "syscall_overhead": NOTIFY,
}
assert set(CAUSE_ACTIONS) == set(taxonomy.CAUSE_IDS), "every taxonomy cause needs a remediation action"

ACTION_TEXT = {
    DRAIN: "Remediation nft_drain_backend removes the node's address from the load balancer's backend set "
           "(new requests go elsewhere); it is put back when the alert resolves.",
    QOS: "Remediation spdk_qos_limit sets an SPDK bdev_set_qos_limit rate limit on the bdev; the configured "
         "limits are restored when the alert resolves.",
    RESTART: "Remediation restart_workload restarts the inference workload on the node (kubectl, crictl or "
             "docker, as configured).",
    RAISE_SAMPLING: "Remediation raise_sampling keeps 100% of the tier's traces until the alert resolves (or "
                    "the override expires), so the analysis sees every slow or failed request.",
    NOTIFY: "Remediation notify_only: no automatic action; a person decides.",
}

RECORD_SLOW = "tier:sloscope_request_slow:ratio_rate{window}"
RECORD_ERRORS = "tier:sloscope_request_errors:ratio_rate{window}"
LEAK = taxonomy.GPU_MEMORY_LEAK  # the one definition of the GPU memory-leak rule


def camel(cause_id: str) -> str:
    return "".join(part.capitalize() for part in cause_id.split("_"))


def cause_alert_name(cause_id: str) -> str:
    return "SloscopeCause" + camel(cause_id)


def _q(value: str) -> str:
    """A PromQL string literal (PromQL strings use Go's escapes, which JSON's are a subset of)."""
    return json.dumps(value)


def _num(value: float) -> str:
    return format(value, ".12g")


def _pct(value: float) -> str:
    return format(value * 100, ".6g") + "%"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _ms(seconds: float) -> str:
    return format(seconds * 1000, ".6g") + " ms"


# --- per tier ------------------------------------------------------------------------------------------------------

def _sli_rules(t: TierObjective) -> list[dict]:
    tier = _q(t.name)
    le = _q(x.le_label(x.le_seconds(t.threshold_ms)))
    rules = []
    for w in SLI_WINDOWS:
        rules.append({"record": RECORD_SLOW.format(window=w), "labels": {"tier": t.name}, "expr": (
            f"1 - (\n"
            f"  sum by (tier) (rate({x.REQUEST_DURATION}_bucket{{tier={tier}, le={le}}}[{w}]))\n"
            f"/\n"
            f"  sum by (tier) (rate({x.REQUEST_DURATION}_count{{tier={tier}}}[{w}]))\n"
            f")\n")})
    for w in SLI_WINDOWS:
        rules.append({"record": RECORD_ERRORS.format(window=w), "labels": {"tier": t.name}, "expr": (
            f"sum by (tier) (rate({x.REQUEST_ERRORS}{{tier={tier}}}[{w}]))\n"
            f"/\n"
            f"sum by (tier) (rate({x.REQUESTS}{{tier={tier}}}[{w}]))\n")})
    return rules


def _burn_expr(record: str, tier: str, budget: float, burns) -> str:
    parts = []
    for factor, long_w, short_w in burns:
        limit = f"({_num(factor)} * {_num(budget)})"
        parts.append(
            f"(\n"
            f"  {record.format(window=long_w)}{{tier={_q(tier)}}} > {limit}\n"
            f"and\n"
            f"  {record.format(window=short_w)}{{tier={_q(tier)}}} > {limit}\n"
            f")")
    return "\nor\n".join(parts) + "\n"


def _windows_text(burns) -> str:
    return " or ".join(f"{_num(f)}x over {lw} and {sw}" for f, lw, sw in burns)


def _burn_alerts(t: TierObjective) -> list[dict]:
    allowance = 1.0 - t.percentile / 100.0
    threshold_s = x.le_seconds(t.threshold_ms)
    latency_what = (f"requests slower than {_ms(threshold_s)} (p{_num(t.percentile)} objective: at most "
                    f"{_pct(allowance)} of requests may be slower)")
    error_what = f"failed requests (availability objective {_num(t.availability)}%: error budget {_pct(t.error_budget)})"
    out = []
    for name, slo, record, budget, what in (
            (LATENCY_BURN, "latency", RECORD_SLOW, allowance, latency_what),
            (ERROR_BURN, "availability", RECORD_ERRORS, t.error_budget, error_what)):
        out.append({
            "alert": name, "expr": _burn_expr(record, t.name, budget, PAGE_BURNS),
            "labels": {"severity": "page", "tier": t.name, "slo": slo, "cause": UNATTRIBUTED,
                       "action": RAISE_SAMPLING},
            "annotations": {
                "summary": f"Tier {t.name} is burning its {slo} error budget fast",
                "description": f"The share of {what} in tier {t.name} is above {_windows_text(PAGE_BURNS)} the "
                               f"budget's rate; at 14.4x a 30-day budget is spent in about 2 days.",
                "runbook": f"Find the node and physical cause: sloscope rca --since 1h, or the SloscopeCause* "
                           f"alerts and sloscope_incident_cause_score{{tier=\"{t.name}\"}}. "
                           + ACTION_TEXT[RAISE_SAMPLING]}})
    for name, slo, record, budget, what in (
            (LATENCY_SLOW_BURN, "latency", RECORD_SLOW, allowance, latency_what),
            (ERROR_SLOW_BURN, "availability", RECORD_ERRORS, t.error_budget, error_what)):
        out.append({
            "alert": name, "expr": _burn_expr(record, t.name, budget, TICKET_BURNS),
            "labels": {"severity": "ticket", "tier": t.name, "slo": slo, "cause": UNATTRIBUTED,
                       "action": NOTIFY},
            "annotations": {
                "summary": f"Tier {t.name} is spending its {slo} error budget faster than it accrues",
                "description": f"The share of {what} in tier {t.name} is above {_windows_text(TICKET_BURNS)} the "
                               f"budget's rate: the 30-day budget will run out before the period ends.",
                "runbook": "Not urgent: review sloscope rca --since 3d for recurring causes on this tier. "
                           + ACTION_TEXT[NOTIFY]}})
    return out


def _tier_latency_alert(t: TierObjective) -> dict:
    """The analysis' latency test over the last minute per (tier, service, node): slow requests improbable for
    a service at exactly the percentile's allowance (Poisson tail in closed form, at ALERT_ALPHA)."""
    allowance = slow_allowance(t)
    threshold_s = x.le_seconds(t.threshold_ms)
    matcher = f"{{tier={_q(t.name)}}}"
    bucket = f"{{tier={_q(t.name)}, le={_q(x.le_label(threshold_s))}}}"
    by = "sum by (tier, service, node)"
    total = f"{by} (increase({x.REQUEST_DURATION}_count{matcher}[1m]))"
    fast = f"{by} (increase({x.REQUEST_DURATION}_bucket{bucket}[1m]))"
    expected = f"{total} * {_num(allowance)}"
    z = z_for(ALERT_ALPHA)
    return {
        "alert": TIER_LATENCY_HIGH,
        "expr": (f"({total}\n-\n{fast})\n>=\n{expected}\n+ {_num(round(z, 4))} * sqrt({expected})\n"
                 f"+ {_num(round((z * z + 2) / 6, 4))}\n"),
        "labels": {"severity": "warning", "tier": t.name, "slo": "latency", "cause": UNATTRIBUTED,
                   "action": RAISE_SAMPLING},
        "annotations": {
            "summary": f"Tier {t.name}: {{{{ $value | printf \"%.0f\" }}}} requests of {{{{ $labels.service }}}} on "
                       f"{{{{ $labels.node }}}} slower than {_ms(threshold_s)} in the last minute",
            "description": f"More requests of tier {t.name} were slower than {_ms(threshold_s)} over the last minute "
                           f"than a service meeting its p{_num(t.percentile)} objective (at most {_pct(allowance)} "
                           f"slower) would produce with probability {_num(ALERT_ALPHA)}: the test sloscope rca "
                           f"applies to its SLI windows.",
            "runbook": ACTION_TEXT[RAISE_SAMPLING] + " Then see sloscope rca for the node and physical cause."}}


def tier_group(t: TierObjective) -> dict:
    return {"name": f"sloscope-slo-{t.name}",
            "rules": _sli_rules(t) + _burn_alerts(t) + [_tier_latency_alert(t)]}


# --- physical layer ------------------------------------------------------------------------------------------------

def _duration(seconds: int) -> str:
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def gpu_memory_growth_record() -> str:
    return f"node_gpu:{x.GPU_MEMORY_USED}:growth_ratio_{_duration(LEAK.step_s)}"


def _leak_expr(growth: str) -> str:
    limit = _num(LEAK.per_step)
    steps = [growth + (f" offset {_duration(i * LEAK.step_s)}" if i else "") + f" > {limit}\n"
             for i in range(LEAK.in_a_row)]
    return "and\n".join(steps)


def physical_group(hold: str | None = None) -> dict:
    growth = gpu_memory_growth_record()
    mem = x.GPU_MEMORY_USED
    step = _duration(LEAK.step_s)
    requests_1m = f"sum by (node) (rate({x.REQUESTS}[1m]))"
    rules = [
        {"record": growth,
         "expr": f"({mem} - {mem} offset {step})\n/\n({mem} offset {step} > 0)\n"},
        {"alert": GPU_SATURATED, "expr": f"{x.GPU_UTILIZATION} > {_num(GPU_UTILIZATION_MAX)}\n", "for": hold or "2m",
         "labels": {"severity": "warning", "cause": "gpu_sm_contention", "action": DRAIN},
         "annotations": {
             "summary": "GPU {{ $labels.gpu }} on {{ $labels.node }} is {{ $value | humanizePercentage }} busy",
             "description": f"GPU utilization has been above {_pct(GPU_UTILIZATION_MAX)} for 2 minutes on node "
                            "{{ $labels.node }}: new requests queue behind running kernels (SM contention).",
             "runbook": "Shift new requests away from {{ $labels.node }}. " + ACTION_TEXT[DRAIN]}},
        {"alert": GPU_MEMORY_LEAK,
         "expr": _leak_expr(growth),
         "labels": {"severity": "warning", "cause": "gpu_memory_leak", "action": RESTART},
         "annotations": {
             "summary": "GPU {{ $labels.gpu }} memory on {{ $labels.node }} grows "
                        f"{{{{ $value | humanizePercentage }}}} per {step}",
             "description": f"GPU framebuffer use on node {{{{ $labels.node }}}} grew more than "
                            f"{_pct(LEAK.per_step)} over each of {LEAK.in_a_row} consecutive {step} steps: a leak "
                            "that ends in out-of-memory failures.",
             "runbook": "Restart the leaking inference workload on {{ $labels.node }}. " + ACTION_TEXT[RESTART]}},
        {"alert": NVME_HOT, "expr": f"{x.NVME_TEMPERATURE} > {_num(NVME_TEMPERATURE_MAX_C)}\n", "for": hold or "1m",
         "labels": {"severity": "warning", "cause": "storage_thermal", "action": QOS},
         "annotations": {
             "summary": "NVMe {{ $labels.bdev }}{{ $labels.device }} on {{ $labels.node }} is at "
                        "{{ $value | humanize }} C",
             "description": f"The NVMe drive has been above {_num(NVME_TEMPERATURE_MAX_C)} C for a minute on node "
                            "{{ $labels.node }}; it throttles itself and I/O latency rises.",
             "runbook": "Throttle the bdev until the drive cools. " + ACTION_TEXT[QOS]}},
        {"alert": SPDK_BDEV_WAIT_HIGH,
         "expr": f"max by (node, bdev) ({x.SPDK_BDEV_IO_WAIT}) > {_num(SPDK_BDEV_WAIT_MAX_S)}\n", "for": hold or "1m",
         "labels": {"severity": "warning", "cause": "storage_queue", "action": QOS},
         "annotations": {
             "summary": "SPDK bdev {{ $labels.bdev }} on {{ $labels.node }} waits "
                        "{{ $value | humanizeDuration }} per I/O",
             "description": f"Mean SPDK bdev I/O wait has been above {_ms(SPDK_BDEV_WAIT_MAX_S)} for a minute on "
                            "node {{ $labels.node }}: the NVMe queues are congested.",
             "runbook": "Throttle background I/O on the bdev. " + ACTION_TEXT[QOS]}},
        {"alert": SPDK_REACTOR_BUSY,
         "expr": f"{x.SPDK_REACTOR_BUSY} > {_num(SPDK_REACTOR_BUSY_MAX)}\n", "for": hold or "2m",
         "labels": {"severity": "warning", "cause": "storage_queue", "action": NOTIFY},
         "annotations": {
             "summary": "SPDK reactor {{ $labels.lcore }} on {{ $labels.node }} is "
                        "{{ $value | humanizePercentage }} busy",
             "description": f"An SPDK reactor has been busier than {_pct(SPDK_REACTOR_BUSY_MAX)} for 2 minutes on "
                            "node {{ $labels.node }}: storage requests wait for CPU in spdk_tgt.",
             "runbook": "Give spdk_tgt more cores (its -m mask) or move I/O-heavy work. " + ACTION_TEXT[NOTIFY]}},
        {"alert": NODE_ERROR_RATIO_HIGH,
         "expr": (f"sum by (node) (rate({x.REQUEST_ERRORS}[1m]))\n/\n{requests_1m}\n"
                  f"> {_num(NODE_ERROR_RATIO_MAX)}\n"
                  f"and on (node)\n{requests_1m} * 60 >= {MIN_REQUESTS_PER_MINUTE}\n"),
         "for": hold or "1m",
         "labels": {"severity": "warning", "cause": UNATTRIBUTED, "action": DRAIN},
         "annotations": {
             "summary": "{{ $value | humanizePercentage }} of requests on {{ $labels.node }} fail",
             "description": f"More than {_pct(NODE_ERROR_RATIO_MAX)} of the requests served by node "
                            "{{ $labels.node }} failed over the last minute, for a minute (at least "
                            f"{MIN_REQUESTS_PER_MINUTE} requests a minute).",
             "runbook": "Take the node out of rotation and look at sloscope rca for its cause. "
                        + ACTION_TEXT[DRAIN]}},
    ]
    return {"name": "sloscope-physical", "rules": rules}


# --- RCA causes ----------------------------------------------------------------------------------------------------

def cause_group(hold: str | None = None) -> dict:
    score = x.INCIDENT_CAUSE_SCORE
    rules = []
    for cause in taxonomy.CAUSES:
        action = CAUSE_ACTIONS[cause.id]
        rules.append({
            "alert": cause_alert_name(cause.id),
            "expr": (f"(\n  {score}{{cause={_q(cause.id)}}}\n"
                     f"  == on (tier, service, node) group_left ()\n"
                     f"  max by (tier, service, node) ({score})\n"
                     f") >= {_num(CAUSE_SCORE_MIN)}\n"),
            "for": hold or "1m",
            "labels": {"severity": "warning", "cause": cause.id, "action": action},
            "annotations": {
                "summary": f"{cause.id} is the top cause of the {{{{ $labels.tier }}}} incident on "
                           "{{ $labels.node }} (score {{ $value | printf \"%.2f\" }})",
                "description": f"sloscope's analysis ranks {cause.id} ({cause.layer}: {cause.physical}) first for "
                               "the open SLO incident of tier {{ $labels.tier }}, service {{ $labels.service }} "
                               "on node {{ $labels.node }}.",
                "runbook": _sentence(cause.remediation.format(node="{{ $labels.node }}")) + " " + ACTION_TEXT[action]}})
    return {"name": "sloscope-causes", "rules": rules}


# --- the file ------------------------------------------------------------------------------------------------------

def rules_dict(spec: SloSpec, hold: str | None = None) -> dict:
    """The rule file for `spec`, as a dict in Prometheus' rule file format. `hold` replaces the `for:` of the
    physical, node and cause alerts (default: 1-2 minutes, against flapping)."""
    groups = [tier_group(t) for t in spec.tiers.values()]
    groups += [physical_group(hold), cause_group(hold)]
    return {"groups": groups}


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_rules(spec: SloSpec, hold: str | None = None) -> str:
    """The rule file as YAML text (deterministic: the same spec gives the same bytes)."""
    header = ("# Prometheus rules generated by `sloscope rules` from the SLO spec "
              f"{' '.join(spec.source.split())}.\n# Regenerate instead of editing; names are those of sloscope's /metrics.\n")
    body = yaml.dump(rules_dict(spec, hold), Dumper=_Dumper, sort_keys=False, width=200, allow_unicode=False)
    return header + body


def alert_names(spec: SloSpec) -> list[str]:
    """Every alert name the rules for `spec` define (each once)."""
    names = []
    for group in rules_dict(spec)["groups"]:
        for rule in group["rules"]:
            if "alert" in rule and rule["alert"] not in names:
                names.append(rule["alert"])
    return names

"""The node-level groups of alerts/rules.py: the physical layer's alerts (thresholds from the SLO spec's
`physical_limits`, the field's by default) and one alert per cause of the analysis, each firing while its cause
ranks first for an open incident."""

from __future__ import annotations

import re

from sloscope import taxonomy
from sloscope.slo_spec import PhysicalLimits

from sloscope import metric_names
from sloscope.alerts.actions import DRAIN, NOTIFY, QOS, RESTART
from sloscope.alerts.rule_text import (ACTION_TEXT, DEFAULT_RUNBOOK_BASE_URL, UNATTRIBUTED, ms, num, pct,
                                       poisson_critical, q, sentence)

MIN_REQUESTS_PER_MINUTE = 10  # below this, a minute's error ratio is noise
# A drain also needs more failures in the minute than a node at exactly the allowed ratio would have but with
# this chance: one failure of a quiet node is not a failing node (it takes 3 at 10 to 15 requests a minute, 5 at 30).
NODE_FAILURES_ALPHA = 0.05
LEAK_HOLD = "5m"  # a model loading grows its GPU's memory as fast as a leak, for a few minutes

CAUSE_SCORE_MIN = 0.5

# Alert names (the keys of the remediation config).
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
    "network_latency": NOTIFY,
    "connection_churn": NOTIFY,
    "cpu_contention": NOTIFY,
    "memory_pressure": NOTIFY,
    "syscall_overhead": NOTIFY,
    # The engine's own causes call for capacity or its settings, which a person decides.
    "inference_queue": NOTIFY,
    "kv_cache_pressure": NOTIFY,
    "prefill_interference": NOTIFY,
}
assert set(CAUSE_ACTIONS) == set(taxonomy.CAUSE_IDS), "every taxonomy cause needs a remediation action"
LEAK = taxonomy.GPU_MEMORY_LEAK  # the one definition of the GPU memory-leak rule
DECLARED_CAUSES = "declared-causes"  # docs/runbooks.md's section on the causes an SLO spec declares


def camel(cause_id: str) -> str:
    return "".join(part.capitalize() for part in cause_id.split("_"))


def cause_alert_name(cause_id: str) -> str:
    return "SloscopeCause" + camel(cause_id)


# --- physical layer ------------------------------------------------------------------------------------------------

def _duration(seconds: int) -> str:
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def gpu_memory_growth_record() -> str:
    return f"node_gpu:{metric_names.GPU_MEMORY_USED}:growth_ratio_{_duration(LEAK.step_s)}"


def _leak_expr(growth: str) -> str:
    limit = num(LEAK.per_step)
    steps = [growth + (f" offset {_duration(i * LEAK.step_s)}" if i else "") + f" > {limit}\n"
             for i in range(LEAK.in_a_row)]
    return "and\n".join(steps)


def _spoken(duration: str) -> str:
    """A Prometheus duration as --hold takes it (15s, 2m) in words, as the descriptions say how long."""
    number, unit = re.fullmatch(r"(\d+)(ms|s|m|h)", duration).groups()
    one, many = {"ms": ("a millisecond", "milliseconds"), "s": ("a second", "seconds"), "m": ("a minute", "minutes"),
                 "h": ("an hour", "hours")}[unit]
    return one if number == "1" else f"{number} {many}"


def physical_group(limits: PhysicalLimits, hold: str | None = None) -> dict:
    long_hold, short_hold = hold or "2m", hold or "1m"
    leak_hold = hold or LEAK_HOLD
    growth = gpu_memory_growth_record()
    mem = metric_names.GPU_MEMORY_USED
    step = _duration(LEAK.step_s)
    requests_1m = f"sum by (node) (rate({metric_names.REQUESTS}[1m]))"
    errors_1m = f"sum by (node) (increase({metric_names.REQUEST_ERRORS}[1m]))"
    requests_in_1m = f"sum by (node) (increase({metric_names.REQUESTS}[1m]))"
    error_ratio = num(limits.node_error_ratio)
    rules = [
        {"record": growth,
         "expr": f"({mem} - {mem} offset {step})\n/\n({mem} offset {step} > 0)\n"},
        {"alert": GPU_SATURATED, "expr": f"{metric_names.GPU_UTILIZATION} > {num(limits.gpu_utilization)}\n",
         "for": long_hold,
         "labels": {"severity": "warning", "cause": "gpu_sm_contention", "action": DRAIN},
         "annotations": {
             "summary": "GPU {{ $labels.gpu }} on {{ $labels.node }} is {{ $value | humanizePercentage }} busy",
             "description": f"GPU utilization has been above {pct(limits.gpu_utilization)} for "
                            f"{_spoken(long_hold)} on node {{{{ $labels.node }}}}: new requests queue behind running "
                            "kernels (SM contention).",
             "remediation": "Shift new requests away from {{ $labels.node }}. " + ACTION_TEXT[DRAIN]}},
        {"alert": GPU_MEMORY_LEAK,
         "expr": _leak_expr(growth), "for": leak_hold,
         "labels": {"severity": "warning", "cause": "gpu_memory_leak", "action": RESTART},
         "annotations": {
             "summary": "GPU {{ $labels.gpu }} memory on {{ $labels.node }} grows "
                        f"{{{{ $value | humanizePercentage }}}} per {step}",
             "description": f"GPU framebuffer use on node {{{{ $labels.node }}}} grew more than "
                            f"{pct(LEAK.per_step)} over each of {LEAK.in_a_row} consecutive {step} steps, for "
                            f"{_spoken(leak_hold)} (longer than a model takes to load): a leak that ends in "
                            "out-of-memory failures.",
             "remediation": "Restart the leaking inference workload on {{ $labels.node }}. " + ACTION_TEXT[RESTART]}},
        {"alert": NVME_HOT, "expr": f"{metric_names.NVME_TEMPERATURE} > {num(limits.nvme_temperature_c)}\n",
         "for": short_hold,
         "labels": {"severity": "warning", "cause": "storage_thermal", "action": QOS},
         "annotations": {
             "summary": "NVMe {{ $labels.bdev }}{{ $labels.device }} on {{ $labels.node }} is at "
                        "{{ $value | humanize }} C",
             "description": f"The NVMe drive has been above {num(limits.nvme_temperature_c)} C for "
                            f"{_spoken(short_hold)} on node {{{{ $labels.node }}}}; it throttles itself and I/O "
                            "latency rises.",
             "remediation": "Throttle the bdev until the drive cools. " + ACTION_TEXT[QOS]}},
        {"alert": SPDK_BDEV_WAIT_HIGH,
         "expr": f"max by (node, bdev) ({metric_names.SPDK_BDEV_IO_WAIT}) > {num(limits.spdk_bdev_wait_s)}\n",
         "for": short_hold,
         "labels": {"severity": "warning", "cause": "storage_queue", "action": QOS},
         "annotations": {
             "summary": "SPDK bdev {{ $labels.bdev }} on {{ $labels.node }} waits "
                        "{{ $value | humanizeDuration }} per I/O",
             "description": f"Mean SPDK bdev I/O wait has been above {ms(limits.spdk_bdev_wait_s)} for "
                            f"{_spoken(short_hold)} on node {{{{ $labels.node }}}}: the NVMe queues are congested.",
             "remediation": "Throttle background I/O on the bdev. " + ACTION_TEXT[QOS]}},
        {"alert": SPDK_REACTOR_BUSY,
         "expr": f"{metric_names.SPDK_REACTOR_BUSY} > {num(limits.spdk_reactor_busy)}\n", "for": long_hold,
         "labels": {"severity": "warning", "cause": "storage_queue", "action": NOTIFY},
         "annotations": {
             "summary": "SPDK reactor {{ $labels.lcore }} on {{ $labels.node }} is "
                        "{{ $value | humanizePercentage }} busy",
             "description": f"An SPDK reactor has been busier than {pct(limits.spdk_reactor_busy)} for "
                            f"{_spoken(long_hold)} on node {{{{ $labels.node }}}}: storage requests wait for CPU in "
                            "spdk_tgt.",
             "remediation": "Give spdk_tgt more cores (its -m mask) or move I/O-heavy work. " + ACTION_TEXT[NOTIFY]}},
        {"alert": NODE_ERROR_RATIO_HIGH,
         "expr": (f"sum by (node) (rate({metric_names.REQUEST_ERRORS}[1m]))\n/\n{requests_1m}\n"
                  f"> {error_ratio}\n"
                  f"and on (node)\n{requests_1m} * 60 >= {MIN_REQUESTS_PER_MINUTE}\n"
                  f"and on (node)\n{errors_1m}\n"
                  f">= {poisson_critical(f'{requests_in_1m} * {error_ratio}', NODE_FAILURES_ALPHA)}\n"),
         "for": short_hold,
         "labels": {"severity": "warning", "cause": UNATTRIBUTED, "action": DRAIN},
         "annotations": {
             "summary": "{{ $value | humanizePercentage }} of requests on {{ $labels.node }} fail",
             "description": f"More than {pct(limits.node_error_ratio)} of the requests served by node "
                            "{{ $labels.node }} failed over the last minute, for "
                            f"{_spoken(short_hold)} (at least "
                            f"{MIN_REQUESTS_PER_MINUTE} requests a minute, and more failures than a node at "
                            f"{pct(limits.node_error_ratio)} would have but with probability "
                            f"{num(NODE_FAILURES_ALPHA)}).",
             "remediation": "Take the node out of rotation and look at sloscope rca for its cause. "
                        + ACTION_TEXT[DRAIN]}},
    ]
    return {"name": "sloscope-physical", "rules": rules}


# --- RCA causes ----------------------------------------------------------------------------------------------------

def cause_group(hold: str | None = None, causes: tuple[taxonomy.Cause, ...] = taxonomy.CAUSES,
                runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL) -> dict:
    """One alert per cause: the taxonomy's, and those the SLO spec declares (which map to notify_only and link to
    the runbooks' section on declared causes)."""
    score = metric_names.INCIDENT_CAUSE_SCORE
    rules = []
    for cause in causes:
        action = CAUSE_ACTIONS.get(cause.id, NOTIFY)
        declared = {} if cause.id in CAUSE_ACTIONS else {"runbook_url": f"{runbook_base_url}#{DECLARED_CAUSES}"}
        rules.append({
            "alert": cause_alert_name(cause.id),
            "expr": (f"(\n  {score}{{cause={q(cause.id)}}}\n"
                     f"  == on (tier, service, node) group_left ()\n"
                     f"  max by (tier, service, node) ({score})\n"
                     f") >= {num(CAUSE_SCORE_MIN)}\n"),
            "for": hold or "1m",
            "labels": {"severity": "warning", "cause": cause.id, "action": action},
            "annotations": {
                "summary": f"{cause.id} is the top cause of the {{{{ $labels.tier }}}} incident on "
                           "{{ $labels.node }} (score {{ $value | printf \"%.2f\" }})",
                "description": f"sloscope's analysis ranks {cause.id} ({cause.layer}: {cause.physical}) first for "
                               "the open SLO incident of tier {{ $labels.tier }}, service {{ $labels.service }} "
                               "on node {{ $labels.node }}.",
                "remediation": sentence(cause.remediation.format(node="{{ $labels.node }}")) + " "
                               + ACTION_TEXT[action], **declared}})
    return {"name": "sloscope-causes", "rules": rules}

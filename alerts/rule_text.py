"""What every group of alerts/rules.py says the same way: PromQL literals, numbers as the descriptions write them,
the `cause` label of a symptom without a known cause, and what each remediation action does."""

from __future__ import annotations

import json

from sloscope.analytics.significance import z_for

from sloscope.alerts.actions import DRAIN, NOTIFY, QOS, RAISE_SAMPLING, RESTART

UNATTRIBUTED = "unattributed"
DEFAULT_RUNBOOK_BASE_URL = "https://github.com/sloscope/sloscope/blob/main/docs/runbooks.md"

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


def q(value: str) -> str:
    """A PromQL string literal (PromQL strings use Go's escapes, which JSON's are a subset of)."""
    return json.dumps(value)


def num(value: float) -> str:
    return format(value, ".12g")


def pct(value: float) -> str:
    return format(value * 100, ".6g") + "%"


def sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def ms(seconds: float) -> str:
    return format(seconds * 1000, ".6g") + " ms"


def poisson_critical(expected: str, alpha: float) -> str:
    """analytics.significance.poisson_critical_approx in PromQL: the count that a Poisson variable of mean
    `expected` (a PromQL expression) reaches with probability below `alpha`."""
    z = z_for(alpha)
    return f"{expected} + {num(round(z, 4))} * sqrt({expected}) + {num(round((z * z + 2) / 6, 4))}"

"""The closed loop with the real servers: spans that breach an SLO and GPU signals that cross a physical rule go
into `sloscope serve`; Debian's Prometheus scrapes its /metrics and evaluates the generated rules; Debian's
Alertmanager posts to sloscope's webhook; remediation drains the node from an nftables set in a network
namespace. Unauthenticated and label-injecting webhooks are refused, change nothing, and are audited."""

import json
import os
import random
import shutil
import threading
import time

import pytest

from sloscope.analytics.store import Store
from tests.alerting_stack import ALERTMANAGER, BACKENDS, PROMETHEUS, TOKEN, AlertingStack
from tests.conftest import need
from tests.otlp_builders import gauge, metrics, span, traces


def _traffic(stack: AlertingStack, stop: threading.Event) -> None:
    """Every second: gpu-node-3 fails half its requests slowly with its GPU saturated; gpu-node-1 is healthy."""
    rng, n = random.Random(5), 0
    while not stop.is_set():
        now = time.time_ns()
        for node, bad in (("gpu-node-3", True), ("gpu-node-1", False)):
            spans = []
            for _ in range(20):
                n += 1
                fail = bad and rng.random() < 0.5
                spans.append(span(f"{n:032x}", f"{n:016x}", now - 2_000_000_000, 1500 if bad else 80,
                                  status=500 if fail else 200, tier=["p99-latency-critical"]))
            stack.send_json("/v1/traces", traces(spans, node=node))
            stack.send_json("/v1/metrics", metrics([gauge("hw.gpu.utilization", [(now, 0.97 if bad else 0.4)],
                                                          {"hw.id": f"GPU-{node}", "hw.gpu.task": "general"})],
                                                   node=node))
        stop.wait(1.0)


def _alert(name, node, fingerprint):
    return {"status": "firing", "labels": {"alertname": name, "node": node, "severity": "warning"},
            "annotations": {}, "startsAt": "2026-11-29T10:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "", "fingerprint": fingerprint}


def _payload(*alerts):
    return json.dumps({"version": "4", "groupKey": "{}:{}", "status": "firing", "receiver": "sloscope",
                       "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "",
                       "truncatedAlerts": 0, "alerts": list(alerts)}).encode()


@pytest.mark.slow
def test_breach_fires_alerts_and_remediation_drains_the_node(tmp_path):
    need(os.geteuid() == 0 and shutil.which("nft") and shutil.which("ip"), "nftables in a netns needs root")
    need(bool(PROMETHEUS and ALERTMANAGER), "Debian's prometheus and prometheus-alertmanager")
    stack = AlertingStack(tmp_path).start()
    stop = threading.Event()
    feeder = threading.Thread(target=_traffic, args=(stack, stop), daemon=True)
    try:
        assert stack.backends() == set(BACKENDS.values())
        feeder.start()
        deadline = time.monotonic() + 150
        while BACKENDS["gpu-node-3"] in stack.backends():
            assert time.monotonic() < deadline, f"node never drained; firing: {stack.firing()}"
            time.sleep(1)
        assert stack.backends() == {BACKENDS["gpu-node-1"]}  # only the failing node left the set
        while not {"SloscopeNodeErrorRatioHigh", "SloscopeGpuSaturated", "SloscopeTierLatencyHigh"} <= stack.firing():
            assert time.monotonic() < deadline, f"firing: {stack.firing()}"
            time.sleep(1)

        # Nothing is read or done without the token; labels that try to inject are refused.
        status, _ = stack.webhook(_payload(_alert("SloscopeNodeErrorRatioHigh", "gpu-node-1", "aa01")), None)
        assert status == 401
        status, reply = stack.webhook(_payload(
            _alert("SloscopeNodeErrorRatioHigh", "a; rm -rf /", "aa02"),
            _alert("SloscopeNodeErrorRatioHigh", "gpu-node-1 } ; flush ruleset ; {", "aa03")), TOKEN)
        assert status == 200 and [r["decision"] for r in reply["results"]] == ["refused", "refused"]
        assert stack.backends() == {BACKENDS["gpu-node-1"]}
    finally:
        stop.set()
        feeder.join(timeout=10)
        try:
            assert stack.stop_serve() == 0
        finally:
            stack.close()

    with Store(stack.db, read_only=True) as store:
        rows = store.rows("SELECT alert, action, target, decision, reason FROM remediation_audit ORDER BY ts")
    assert ("SloscopeNodeErrorRatioHigh", "nft_drain_backend", "backend:gpu-node-3", "executed", "done") in rows
    refused = {(a, r) for a, _, _, d, r in rows if d == "refused"}
    assert ("SloscopeNodeErrorRatioHigh", "node name 'a; rm -rf /' is not valid") in refused
    assert ("SloscopeNodeErrorRatioHigh", "node name 'gpu-node-1 } ; flush ruleset ; {' is not valid") in refused
    assert ("(unauthenticated)", "1 webhook request(s) without a valid bearer token") in refused
    assert not [r for r in rows if r[3] == "executed" and "gpu-node-1" in (r[2] or "")]

"""Real producers end to end, through one real fault: Envoy sidecar and ingress-gateway spans that name their pod
but no node, pods on two nodes listed and watched from a Kubernetes API stand-in, node signals from a real
`sloscope collect` (eBPF and procfs probes), and a real CPU noisy neighbour (`stress-ng --cpu` pinned to one
CPU). During the fault only the requests of the pods on the faulty node are slow; `sloscope rca` must name that
node, which the spans never did, and CPU contention as the cause.

The same run feeds a second `sloscope serve` the same spans, with the node signals the OpenTelemetry Collector's
hostmetrics and kubeletstats receivers would send in place of sloscope's probes (tests/collector_receivers.py):
generated, a steady baseline on both nodes and, while the hog runs, its rise on the faulty node (its CPU busy,
the run queue and load averages up, the hog's pod using a CPU). One fault, two stores, two verdicts, in 65 to 100
seconds."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from sloscope.analytics.store import Store
from sloscope.live import faults
from tests.alerting_stack import free_port, wait_listening
from tests.collector_receivers import HogCpu, ModelHost, Pod, ReceiverMetrics, SteadyCpu
from tests.conftest import need
from tests.envoy_load import EnvoyLoad
from tests.envoy_spans import GATEWAY, SIDECAR
from tests.fakes.kube_api import FakeKubeApi
from tests.enrich.test_node_from_pod import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

SLOSCOPE = [sys.executable, "-m", "sloscope.commands.cli"]
FAULTY, HEALTHY = "gpu-node-a", "gpu-node-b"
PROXIES = {
    FAULTY: [{**SIDECAR, "pod": "ratings-v1-5f9c8d6b4-x7k2p", "ip": "10.4.1.7"},
             {**GATEWAY, "pod": "istio-ingressgateway-6d8f7c9b5-q2w4z", "ip": "10.4.0.12"}],
    HEALTHY: [{**SIDECAR, "pod": "ratings-v1-5f9c8d6b4-m3n8d", "ip": "10.4.2.9"},
              {**GATEWAY, "pod": "istio-ingressgateway-6d8f7c9b5-t6v1r", "ip": "10.4.0.13"}],
}
SERVICES = {"ratings", "istio-ingressgateway"}  # istio.canonical_service of the sidecars and the gateways
NEIGHBOUR = ("embedding-backfill-29391840-k8x2c", "batch", "10.4.1.23")  # the CPU hog's pod on the faulty node
# A 4 s SLI step (signals in 2 s steps, a 12 s minimum baseline) so that a short run has a baseline and a fault
# of several steps each; objectives far above the healthy requests' 15 ms, far below the slow ones' 240 ms.
SLO_YAML = """\
default_tier: standard
tiers:
  p99-latency-critical:
    latency: {percentile: 99, threshold_ms: 100}
    availability: 99.0
  standard:
    latency: {percentile: 95, threshold_ms: 150}
    availability: 98.0
window: 30d
resolution: 4s
"""
RESOLUTION = timedelta(seconds=4)
WARMUP_S, FAULT_S = 30, 15  # the baseline the node signals get, and the fault
BASELINE, LOOKBACK = "30s", "8s"  # the lookback: two SLI steps, so the fault's first window is not baseline
FAULT_WORKERS_PER_CPU = 16  # as the live demo: the hog takes the CPU from everything else scheduled there


@dataclass
class FaultRun:
    slo: Path
    probes_db: Path  # node signals from sloscope collect
    receivers_db: Path  # node signals as hostmetrics and kubeletstats send them
    fault_start: datetime
    fault_end: datetime
    sent: dict[str, int]  # SERVER spans per node, to each store
    receiver_metrics: set[str]


def _cpus() -> tuple[str, str]:
    """(the CPU the noisy neighbour takes, the CPUs serve, collect and the producers keep)."""
    cpus = sorted(os.sched_getaffinity(0))
    return str(cpus[-1]), ",".join(map(str, cpus[:-1] or cpus))


def _probes_up(port: int, node: str) -> bool:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return f'sloscope_probe_up{{node="{node}",probe="runqueue",running="runqueue"}} 1.0' in text


def _utc_now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0)


def _add_pods(kube: FakeKubeApi, hog, rng: random.Random) -> dict[str, list[Pod]]:
    """The proxies' pods on their nodes and the hog's pod on the faulty one, with what their CPU time will be."""
    pods = {node: [Pod(kube.add_pod(p["pod"], p["namespace"], node, p["ip"]), SteadyCpu(0.15, rng))
                   for p in proxies] for node, proxies in PROXIES.items()}
    pods[FAULTY].append(Pod(kube.add_pod(*NEIGHBOUR[:2], FAULTY, NEIGHBOUR[2]), HogCpu(hog)))
    return pods


def _start_pipelines(procs: faults.Processes, work: Path, slo: Path, kube_url: str, cpus: str) -> dict[str, int]:
    """Two serves (their OTLP/HTTP ports by store), and the collector exporting to the first over gRPC."""
    pinned = ["taskset", "-c", cpus] + SLOSCOPE
    ports, grpc_port = {"probes": free_port(), "receivers": free_port()}, free_port()
    for name, grpc in (("probes", f"127.0.0.1:{grpc_port}"), ("receivers", "off")):
        serve = procs.start(f"serve-{name}", pinned + [
            "serve", "--db", str(work / f"{name}.duckdb"), "--slo", str(slo), "--http", f"127.0.0.1:{ports[name]}",
            "--grpc", grpc, "--decode-workers", "0", "--kube-api", kube_url])
        wait_listening(ports[name], serve, f"sloscope serve ({name})")
    procs.start("collect", pinned + [
        "collect", "--endpoint", f"http://127.0.0.1:{grpc_port}", "--protocol", "grpc", "--interval", "1",
        "--probe", "node", "--node-name", FAULTY, "--spool-dir", str(work / "spool"), "--listen", "off"])
    return ports


def _inject(fault: faults.CpuFault, procs: faults.Processes, load: EnvoyLoad) -> tuple[datetime, datetime]:
    """The fault, with the faulty node's requests slow while it lasts; its (start, end)."""
    fault.start(procs, FAULT_S)
    start = _utc_now()
    time.sleep(1)  # the requests slow down once the hog holds the CPU
    load.slow_down(FAULTY)
    time.sleep(FAULT_S - 1)
    load.slow_down()
    fault.stop(procs)
    return start, _utc_now()


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory):
    need(os.geteuid() == 0, "the collector's eBPF probes and the CPU fault need root")
    missing = faults.missing_tools(["stress-ng", "taskset"])
    need(not missing, f"missing: {', '.join(missing)}")
    work = tmp_path_factory.mktemp("real-producers")
    slo = work / "slo.yaml"
    slo.write_text(SLO_YAML)
    fault_cpu, system_cpus = _cpus()
    cpus = len(os.sched_getaffinity(0))
    procs = faults.Processes(work)
    fault = faults.CpuFault(fault_cpu, FAULT_WORKERS_PER_CPU)
    hog = lambda: procs.running("fault-cpu")  # noqa: E731
    rng = random.Random(11)
    with ExitStack() as running:
        running.callback(procs.stop_all)  # also when anything below fails
        # The producers' threads (started from here, so they inherit it) keep off the hog's CPU, as serve does.
        running.callback(os.sched_setaffinity, 0, os.sched_getaffinity(0))
        os.sched_setaffinity(0, faults.parse_cpus(system_cpus))
        kube = running.enter_context(FakeKubeApi())
        pods = _add_pods(kube, hog, rng)
        ports = _start_pipelines(procs, work, slo, kube.url, system_cpus)
        hosts = {FAULTY: ModelHost(cpus, rng, hog=hog, hog_threads=fault.workers), HEALTHY: ModelHost(cpus, rng)}
        metrics = ReceiverMetrics(f"http://127.0.0.1:{ports['receivers']}/v1/metrics", hosts, pods).start()
        running.callback(metrics.stop)
        load = EnvoyLoad(PROXIES, [f"http://127.0.0.1:{port}/v1/traces" for port in ports.values()]).start()
        running.callback(load.stop)
        wait_for(lambda: _probes_up(ports["probes"], FAULTY), 90, "the collector's probes")
        time.sleep(WARMUP_S)
        fault_start, fault_end = _inject(fault, procs, load)
        load.stop()
        metrics.stop()
        assert not load.failures and not metrics.failures, (load.failures + metrics.failures)[:5]
        for name in ("collect", "serve-probes", "serve-receivers"):  # SIGTERM: each writes what it accepted
            assert procs.stop(name, grace_s=60) == 0, (work / f"{name}.log").read_text()[-3000:]
    yield FaultRun(slo, work / "probes.duckdb", work / "receivers.duckdb", fault_start, fault_end, dict(load.sent),
                   set(metrics.sent_metrics))


def _rca(run: FaultRun, db: Path) -> dict:
    done = subprocess.run(SLOSCOPE + ["rca", "--db", str(db), "--slo", str(run.slo), "--format", "json",
                                      "--baseline", BASELINE, "--lookback", LOOKBACK],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _assert_spans_placed_by_their_pods(run: FaultRun, db: Path) -> None:
    with Store(db, read_only=True) as store:
        per_node = dict(store.rows("SELECT node, count(*) FROM requests GROUP BY node"))
        calls = store.scalar("SELECT count(*) FROM spans WHERE node = 'unknown'")
        counters = store.counters()
    assert per_node == run.sent, per_node  # every span on its pod's node, none on `unknown`
    assert calls == 0  # nor the sidecars' CLIENT spans
    assert counters["spans_node_from_pod_name"] == sum(run.sent.values()) + counters["spans_loaded"], counters


def _assert_found_on_the_faulty_node(run: FaultRun, result: dict) -> list[dict]:
    """The incidents (all on the faulty node, for the sidecars and the gateway, during the fault) and their top
    cause, CPU contention; returns the top cause's evidence."""
    incidents = result["incidents"]
    summary = [(i["node"], i["tier"], i["service"], i["start"], [c["cause"] for c in i["causes"]],
                i["diagnosis"].get("reason")) for i in incidents]
    assert incidents, "no incident during the fault"
    assert {i["node"] for i in incidents} == {FAULTY}, summary
    assert {i["service"] for i in incidents} == SERVICES, summary
    evidence = []
    for incident in incidents:
        start, end = (datetime.fromisoformat(incident[k].rstrip("Z")) for k in ("start", "end"))
        assert run.fault_start - RESOLUTION <= start <= run.fault_end and end >= run.fault_start, summary
        assert incident["causes"] and incident["causes"][0]["cause"] == "cpu_contention", summary
        evidence += incident["causes"][0]["evidence"]
    return evidence


def test_sloscope_probes_find_the_cpu_hog_on_the_node_of_the_slow_pods(fault_run):
    _assert_spans_placed_by_their_pods(fault_run, fault_run.probes_db)
    evidence = _assert_found_on_the_faulty_node(fault_run, _rca(fault_run, fault_run.probes_db))
    assert {e["signal"] for e in evidence} <= {"sloscope.cpu.runqueue.delay", "sloscope.pressure.stall"}


def test_hostmetrics_and_kubeletstats_alone_find_the_cpu_hog_on_the_node_of_the_slow_pods(fault_run):
    _assert_spans_placed_by_their_pods(fault_run, fault_run.receivers_db)
    with Store(fault_run.receivers_db, read_only=True) as store:
        stored = {m for (m,) in store.rows("SELECT DISTINCT metric FROM samples")}
        not_in_catalog = store.counters().get("points_not_in_catalog", 0)
    assert stored, (f"none of the receivers' metrics was stored ({not_in_catalog} points not in the catalog): "
                    f"{sorted(fault_run.receiver_metrics)}")
    assert stored <= fault_run.receiver_metrics  # no probe of sloscope's fed this store
    evidence = _assert_found_on_the_faulty_node(fault_run, _rca(fault_run, fault_run.receivers_db))
    assert {e["signal"] for e in evidence} <= fault_run.receiver_metrics

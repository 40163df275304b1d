"""The live demo: real processes, real kernel probes, real faults, scored against what was injected.

    sloscope serve   (a fresh DuckDB under the demo's directory; GET /rca analyses in-process)
    sloscope collect (the node's eBPF and procfs probes, every second, OTLP/gRPC to serve)
    backend          (a TCP service in its own network namespace, behind a veth pair)
    service          (inference-like, OpenTelemetry SDK SERVER spans with the x-slo-tier header, pinned to
                      its own CPU and in its own memory cgroup; per request: a model step over mapped weights,
                      a cache read (O_DIRECT) and write (fsync), a call to the backend)
    load             (open loop over keep-alive connections, two tiers, a steady rate plus 10x bursts of 5 s
                      between faults)

The rest (serve, collect, backend, load, fio) runs on the other CPUs, as a node's system-reserved CPUs would.

After a warm-up, one fault at a time (faults.py) for a fixed time, then a recovery long enough that the next
fault's baseline is quiet again. A poller asks serve's /rca every few seconds, as a dashboard would, and
notes when an incident on the node was first reported; after each fault, /rca over the fault's time says
which incident was found, its tier, node and ranked causes, and where the injected cause ranks.

Everything started is stopped on the way out (normal end, failure, Ctrl-C, SIGTERM): the fault, the load,
the service, the backend, the collector, then serve (SIGTERM: it writes what it accepted), the namespace
with its nftables rules, the memory cgroup, and the fault's files.

rca's baseline here is 60 s ending 20 s before each incident (attribution's default is 10 minutes ending 1
minute before): each recovery is long enough that the next fault's baseline is clean of the previous fault.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from . import faults as F
from .workload import READY

log = logging.getLogger("sloscope.live")

TOOLS = ("stress-ng", "fio", "nft", "ip", "taskset")
FAULT_NAMES = ("cpu", "disk", "network", "memory")
SLO_YAML = """\
# The live demo's SLO spec: objectives for the small inference service it runs (tens of ms per request),
# and a 5 s SLI step so that an incident (two violating steps) is visible within seconds.
default_tier: standard
tiers:
  p99-latency-critical:
    latency: {{percentile: 99, threshold_ms: {critical_ms}}}
    availability: 99.0
  standard:
    latency: {{percentile: 95, threshold_ms: {standard_ms}}}
    availability: 98.0
window: 30d
resolution: 5s
"""


@dataclass
class LiveConfig:
    dir: Path = Path("var/demo-live")
    node: str = "live-node-1"
    faults: tuple[str, ...] = FAULT_NAMES
    warmup_s: float = 100.0
    fault_s: float = 40.0
    recovery_s: float = 90.0
    baseline_s: float = 60.0
    lookback_s: float = 20.0
    rate: float = 10.0
    critical_share: float = 0.5
    model_kib: int = 6144  # hashed per request: ~4.5 ms of CPU, longer than a scheduler time slice
    burst_factor: float = 10.0
    burst_s: float = 5.0
    interval_s: float = 1.0
    poll_s: float = 5.0
    critical_ms: float = 75.0
    standard_ms: float = 50.0
    loss_percent: int = 25
    cpu_workers_per_cpu: int = 16
    memory_limit_mib: int = 1024  # the service's memory cgroup; its weights and caches take about half
    disk_jobs: int = 4
    service_cpus: str = ""  # default: the last CPU (of several), else all
    system_cpus: str = ""  # serve, collect, load, backend, fio: default the other CPUs (or all)
    python: str = sys.executable

    def slo_yaml(self) -> str:
        return SLO_YAML.format(critical_ms=self.critical_ms, standard_ms=self.standard_ms)


@dataclass
class FaultResult:
    fault: str
    cause: str
    action: str
    start: str
    end: str
    found: bool = False
    tier: str | None = None
    node: str | None = None
    top_cause: str | None = None
    true_rank: int | None = None  # 1-based rank of the injected cause, None when not ranked
    detection_s: float | None = None  # incident start - fault start
    reported_s: float | None = None  # first /rca poll that showed it - fault start
    p99_before_ms: float | None = None
    p99_during_ms: float | None = None
    p99_by_tier: dict = field(default_factory=dict)  # tier -> [before, during] (ms)
    requests_during: int = 0
    failed_during: int = 0
    causes: list = field(default_factory=list)  # ranked (cause, score) of the incident
    evidence: list = field(default_factory=list)  # the top cause's evidence
    error: str | None = None

    @property
    def right(self) -> bool:
        return self.found and self.top_cause == self.cause


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def rfc3339(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).replace(tzinfo=None)


def unavailable() -> list[str]:
    """Why the live demo cannot run here (empty: it can)."""
    why = []
    if os.geteuid() != 0:
        why.append("it needs root (eBPF probes, network namespaces, nftables)")
        return why
    try:
        from probes.ebpf.runqueue import RunqueueProbe

        availability = RunqueueProbe().check()
        if not availability.ok:
            why.append("eBPF is unavailable: " + "; ".join(availability.missing))
    except Exception as exc:  # bcc missing or broken
        why.append(f"eBPF is unavailable: {type(exc).__name__}: {exc}")
    missing = F.missing_tools(TOOLS)
    if missing:
        why.append("missing tools: " + ", ".join(missing))
    return why


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(ready, proc, what: str, seconds: float = 60, interval_s: float = 0.2) -> None:
    """Until ready() is true; fails early when proc has exited, and after `seconds`."""
    deadline = time.monotonic() + seconds
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early (status {proc.returncode}); see its log")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready within {seconds:g}s; see its log")
        time.sleep(interval_s)


def listening(host: str, port: int):
    def ready() -> bool:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return True
        except OSError:
            return False

    return ready


def logged(path: Path, marker: str):
    return lambda: path.exists() and marker in path.read_text(errors="replace")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its waited-for children."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _default_cpus() -> str:
    cpus = sorted(os.sched_getaffinity(0))
    return str(cpus[-1]) if len(cpus) > 1 else ",".join(map(str, cpus))


def _other_cpus(service_cpus: str) -> str:
    cpus = sorted(os.sched_getaffinity(0))
    others = [c for c in cpus if c not in F.parse_cpus(service_cpus)]
    return ",".join(map(str, others or cpus))


class LiveDemo:
    def __init__(self, cfg: LiveConfig, out=sys.stdout):
        self.cfg = cfg
        self.out = out
        self.cfg.service_cpus = cfg.service_cpus or _default_cpus()
        self.cfg.system_cpus = cfg.system_cpus or _other_cpus(self.cfg.service_cpus)
        self.procs = F.Processes(cfg.dir)
        self.network: F.BackendNetwork | None = None
        self.cgroup = F.MemoryCgroup(str(os.getpid()), cfg.memory_limit_mib * 2**20)
        self._cgroup_made = False
        self.http_port = self.grpc_port = 0
        self.results: list[FaultResult] = []
        self.sightings: list[tuple[datetime, dict]] = []  # (when a poll first showed it, incident)
        self._seen: set[tuple] = set()
        self._stop_poll = threading.Event()
        self._active_fault: F.Fault | None = None
        self.bursts: list[datetime] = []
        self.cpu: dict[str, dict] = {}  # process -> {"start"|"warm"|"end": (monotonic time, CPU seconds)}
        self.started_at = time.monotonic()

    # --- output ----------------------------------------------------------------------------------------

    def say(self, message: str) -> None:
        print(message, file=self.out, flush=True)

    # --- the run ---------------------------------------------------------------------------------------

    def run(self) -> dict:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            self._prepare()
            self._start_pipeline()
            self._warm_up()
            for name in self.cfg.faults:
                self._one_fault(self._fault(name))
            self._stop_poll.set()
        finally:
            self._teardown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self._measure()
        return self.report()

    def _on_signal(self, signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def _prepare(self) -> None:
        cfg = self.cfg
        removed = F.remove_leftovers()
        if removed:
            self.say(f"removed leftovers of an earlier run: {', '.join(removed)}")
        import shutil

        shutil.rmtree(cfg.dir, ignore_errors=True)
        cfg.dir.mkdir(parents=True)
        (cfg.dir / "slo.yaml").write_text(cfg.slo_yaml())

    def _start_pipeline(self) -> None:
        cfg, py = self.cfg, self.cfg.python
        system = ["taskset", "-c", cfg.system_cpus]
        sloscope = system + [py, "-m", "commands.cli"]
        self.http_port, self.grpc_port = free_port(), free_port()
        self.say(f"==> sloscope serve: {cfg.dir / 'sloscope.duckdb'}, OTLP/HTTP :{self.http_port}, "
                 f"OTLP/gRPC :{self.grpc_port}")
        serve = self.procs.start("serve", sloscope + [
            "serve", "--db", str(cfg.dir / "sloscope.duckdb"), "--slo", str(cfg.dir / "slo.yaml"),
            "--http", f"127.0.0.1:{self.http_port}", "--grpc", f"127.0.0.1:{self.grpc_port}"])
        self.cpu["serve"] = {"start": (time.monotonic(), 0.0)}
        wait_until(listening("127.0.0.1", self.http_port), serve, "sloscope serve")

        self.say(f"==> sloscope collect: the node's probes every {cfg.interval_s:g}s as node {cfg.node}")
        collect = self.procs.start("collect", sloscope + [
            "collect", "--endpoint", f"http://127.0.0.1:{self.grpc_port}", "--protocol", "grpc",
            "--interval", f"{cfg.interval_s:g}", "--probe", "node", "--node-name", cfg.node,
            "--spool-dir", str(cfg.dir / "spool")])
        self.cpu["collect"] = {"start": (time.monotonic(), 0.0)}
        self._wait_probes(collect)

        self.network = F.BackendNetwork()  # known before it exists, so that a failure half-way is cleaned up
        self.network.up()
        self.say(f"==> backend in network namespace {self.network.netns} at {self.network.backend_ip}:8081 "
                 f"(veth {self.network.host_if} {self.network.host_ip}/24)")
        backend = self.procs.start("backend", self.network.exec_argv(
            system + [py, "-m", "commands.live.workload", "backend", "--listen", f"{self.network.backend_ip}:8081"]))
        wait_until(listening(self.network.backend_ip, 8081), backend, "backend")

        service_port = free_port()
        wrap = lambda argv: argv  # noqa: E731
        if self.cgroup.available:
            self.cgroup.create()
            self._cgroup_made = True
            wrap = self.cgroup.wrap
        memory = (f", memory cgroup {self.cgroup.path} ({cfg.memory_limit_mib} MiB)" if self._cgroup_made else "")
        self.say(f"==> service llm-inference on 127.0.0.1:{service_port}, pinned to CPU {cfg.service_cpus}{memory} "
                 f"(serve, collect, backend and load on CPU {cfg.system_cpus})")
        service = self.procs.start("service", wrap([
            "taskset", "-c", cfg.service_cpus, py, "-m", "commands.live.workload", "service",
            "--listen", f"127.0.0.1:{service_port}", "--backend", f"{self.network.backend_ip}:8081",
            "--cache-dir", str(cfg.dir / "cache"), "--otlp", f"http://127.0.0.1:{self.http_port}",
            "--node", cfg.node, "--model-kib", str(cfg.model_kib)]))
        self.cpu["service"] = {"start": (time.monotonic(), 0.0)}
        wait_until(listening("127.0.0.1", service_port), service, "service")

        self.say(f"==> load: {cfg.rate:g} req/s ({cfg.critical_share:.0%} p99-latency-critical, the rest standard), "
                 f"bursts of {cfg.burst_factor:g}x for {cfg.burst_s:g}s between faults")
        self.procs.start("load", system + [
            py, "-m", "commands.live.workload", "load", "--target", f"127.0.0.1:{service_port}",
            "--rate", str(cfg.rate), "--critical-share", str(cfg.critical_share),
            "--burst-factor", str(cfg.burst_factor), "--burst-seconds", str(cfg.burst_s)],
            stdout_path=cfg.dir / "load.json")
        wait_until(logged(cfg.dir / "load.log", READY), self.procs.procs["load"], "load")
        threading.Thread(target=self._poll, name="rca-poll", daemon=True).start()

    def _wait_probes(self, collect) -> None:
        """Until the collector has started its probes (compiling the eBPF programs takes a while)."""
        from probes.registry import NODE_PROBES

        log_path = self.cfg.dir / "collect.log"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if collect.poll() is not None:
                raise RuntimeError(f"sloscope collect exited (status {collect.returncode}): "
                                   f"{log_path.read_text()[-2000:]}")
            text = log_path.read_text(errors="replace")
            decisions = [line for line in text.splitlines() if " probe " in line]
            if len(decisions) >= len(NODE_PROBES):
                for line in decisions:
                    self.say("    " + line.split(": ", 1)[-1])
                return
            time.sleep(0.5)
        raise RuntimeError("sloscope collect did not start its probes within 180s")

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            for name in ("serve", "collect", "backend", "service", "load"):
                if not self.procs.running(name):
                    raise RuntimeError(f"{name} exited unexpectedly; see {self.cfg.dir / (name + '.log')}")
            time.sleep(min(left, 1.0))

    def _burst(self) -> None:
        proc = self.procs.procs.get("load")
        if proc and proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)
            self.bursts.append(utcnow())
            self.say(f"    burst: {self.cfg.burst_factor:g}x for {self.cfg.burst_s:g}s")

    def _quiet(self, seconds: float, burst_at: float = 0.5) -> None:
        """A quiet phase with one burst (at `burst_at` of it), so that baselines know what a burst looks like."""
        before = max(0.0, (seconds - self.cfg.burst_s) * burst_at)
        self._sleep(before)
        self._burst()
        self._sleep(seconds - before)

    def _warm_up(self) -> None:
        cfg = self.cfg
        self._cpu_mark("warm")
        self.say(f"==> warm-up {cfg.warmup_s:.0f}s (the first fault's baseline: {cfg.baseline_s:.0f}s ending "
                 f"{cfg.lookback_s:.0f}s before its incident)")
        self._quiet(cfg.warmup_s)

    def _fault(self, name: str) -> F.Fault:
        cfg = self.cfg
        if name == "cpu":
            return F.CpuFault(cfg.service_cpus, cfg.cpu_workers_per_cpu)
        if name == "disk":
            return F.DiskFault(cfg.dir / "fio", cfg.system_cpus, cfg.disk_jobs)
        if name == "network":
            return F.LossFault(self.network, cfg.loss_percent)
        if name == "memory":
            if not self.cgroup.available:
                raise RuntimeError("the memory fault needs a memory cgroup (cgroup v2 memory or v1 memory)")
            return F.MemoryFault(self.cgroup, cfg.system_cpus)
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULT_NAMES)}")

    def _one_fault(self, fault: F.Fault) -> None:
        cfg = self.cfg
        self.say(f"==> fault {fault.name} for {cfg.fault_s:.0f}s: {fault.describe()}")
        start = utcnow()
        self._active_fault = fault
        try:
            fault.start(self.procs, cfg.fault_s)
            self._sleep(cfg.fault_s)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            if not all(self.procs.running(n) for n in ("serve", "collect", "backend", "service", "load")):
                raise
            result = FaultResult(fault.name, fault.cause, fault.describe(), rfc3339(start), rfc3339(utcnow()),
                                 error=f"the fault could not run: {exc}")
            self.results.append(result)
            self.say("    " + self._line(result))
            return
        finally:
            fault.stop(self.procs)
            self._active_fault = None
        end = utcnow()
        result = FaultResult(fault.name, fault.cause, fault.describe(), rfc3339(start), rfc3339(end))
        self.results.append(result)
        settle = min(15.0, cfg.recovery_s / 2)
        self._sleep(settle)  # the last spans and samples arrive
        try:
            self._judge(result, start, end)
        except Exception as exc:  # report it, go on with the next fault
            result.error = f"{type(exc).__name__}: {exc}"
        self.say("    " + self._line(result))
        # The burst early, so that whatever it does to the SLI is long over when the next fault starts.
        self._quiet(cfg.recovery_s - settle, burst_at=0.2)

    # --- analysis --------------------------------------------------------------------------------------

    def rca(self, since: datetime, until: datetime | None = None) -> dict:
        query = {"since": rfc3339(since), "baseline": f"{self.cfg.baseline_s:g}s",
                 "lookback": f"{self.cfg.lookback_s:g}s", "top": "13"}
        if until:
            query["until"] = rfc3339(until)
        url = f"http://127.0.0.1:{self.http_port}/rca?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=60) as response:
            return json.load(response)

    def _poll(self) -> None:
        """What a dashboard polling serve would have seen, and when."""
        while not self._stop_poll.wait(self.cfg.poll_s):
            try:
                now = utcnow()
                for incident in self.rca(now - timedelta(seconds=90))["incidents"]:
                    key = (incident["tier"], incident["node"], incident["start"])
                    if key not in self._seen:
                        self._seen.add(key)
                        self.sightings.append((now, incident))
            except Exception as exc:
                log.debug("rca poll failed: %s", exc)

    def _judge(self, result: FaultResult, start: datetime, end: datetime) -> None:
        resolution = timedelta(seconds=5)
        incidents = [i for i in self.rca(start - resolution, end + timedelta(seconds=10))["incidents"]
                     if i["node"] == self.cfg.node and parse_rfc3339(i["start"]) <= end]
        if not incidents:
            return
        first = min(incidents, key=lambda i: i["start"])
        ranked = [c["cause"] for c in first["causes"]]
        result.found = True
        result.tier, result.node = first["tier"], first["node"]
        result.top_cause = ranked[0] if ranked else None
        result.true_rank = ranked.index(result.cause) + 1 if result.cause in ranked else None
        result.detection_s = round((parse_rfc3339(first["start"]) - start).total_seconds(), 1)
        result.causes = [(c["cause"], c["score"]) for c in first["causes"][:5]]
        result.evidence = first["causes"][0]["evidence"] if first["causes"] else []
        seen = [t for t, i in self.sightings if i["node"] == self.cfg.node
                and start - resolution <= parse_rfc3339(i["start"]) <= end]
        if seen:
            result.reported_s = round((min(seen) - start).total_seconds(), 1)

    @staticmethod
    def _line(r: FaultResult) -> str:
        if r.error:
            return f"{r.fault}: analysis failed: {r.error}"
        if not r.found:
            return f"{r.fault}: MISSED (no incident on the node during the fault)"
        rank = f"#{r.true_rank}" if r.true_rank else "not ranked"
        verdict = "right" if r.right else "WRONG"
        reported = f", reported by /rca {r.reported_s:.0f}s after it began" if r.reported_s is not None else ""
        return (f"{r.fault}: incident on {r.node}, tier {r.tier}, its first SLI window began "
                f"{r.detection_s:+.0f}s from the fault's start{reported}; top cause {r.top_cause} ({verdict}); {r.cause} ranks {rank}; "
                f"causes: {', '.join(f'{c} {s:.2f}' for c, s in r.causes[:3])}")

    # --- the end ---------------------------------------------------------------------------------------

    def _teardown(self) -> None:
        # A second Ctrl-C (or SIGTERM) must not cut the clean-up short.
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            self._stop_everything()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop_everything(self) -> None:
        self._stop_poll.set()
        if self._active_fault is not None:
            try:
                self._active_fault.stop(self.procs)
            except Exception:
                log.exception("stopping the fault")
        self._cpu_mark("end")
        for name in ("load", "service", "backend", "collect", "serve"):
            try:
                self.procs.stop(name, grace_s=30 if name in ("serve", "collect") else 10)
            except Exception:
                log.exception("stopping %s", name)
        self.procs.stop_all()
        if self.network is not None:
            self.network.down()
        if self._cgroup_made:
            self.cgroup.remove()
        import shutil

        shutil.rmtree(self.cfg.dir / "fio", ignore_errors=True)

    def _measure(self) -> None:
        """p99 before and during each fault, from the requests table (serve has stopped: the file is free)."""
        from analytics.store import Store

        with Store(self.cfg.dir / "sloscope.duckdb", read_only=True) as store:
            for r in self.results:
                start, end = parse_rfc3339(r.start), parse_rfc3339(r.end)
                before = start - timedelta(seconds=60)
                r.p99_before_ms = self._p99(store, before, start)[0]
                r.p99_during_ms, r.requests_during, r.failed_during = self._p99(store, start, end)
                for tier in ("p99-latency-critical", "standard"):
                    r.p99_by_tier[tier] = [self._p99(store, before, start, tier)[0],
                                           self._p99(store, start, end, tier)[0]]

    def _p99(self, store, since: datetime, until: datetime, tier: str | None = None) -> tuple[float | None, int, int]:
        """p99 (ms), requests and failures of the node's requests in [since, until), bursts left out: "before"
        is the steady state the fault is compared with."""
        import numpy

        rows = store.rows("SELECT start_time, duration_ms, failed FROM requests WHERE node = ? AND start_time >= ? "
                          "AND start_time < ? AND (? IS NULL OR tier = ?)", [self.cfg.node, since, until, tier, tier])
        burst = timedelta(seconds=self.cfg.burst_s + 2)
        kept = [(d, f) for t, d, f in rows if not any(b <= t < b + burst for b in self.bursts)]
        if not kept:
            return None, 0, 0
        p99 = float(numpy.quantile([d for d, _ in kept], 0.99))
        return round(p99, 1), len(kept), sum(f for _, f in kept)

    def _cpu_mark(self, label: str) -> None:
        for name in ("collect", "serve", "service"):
            proc = self.procs.procs.get(name)
            if proc is not None and proc.poll() is None:
                try:
                    self.cpu.setdefault(name, {})[label] = (time.monotonic(), cpu_seconds(proc.pid))
                except OSError:
                    pass

    def cpu_shares(self) -> dict:
        """Per process: CPU time / wall time over the whole run (from its start) and after start-up (from the
        end of the warm-up's first second: the collector compiles its eBPF programs at start)."""
        out = {}
        for name, marks in self.cpu.items():
            if "end" not in marks:
                continue
            t1, c1 = marks["end"]
            share = {}
            if "start" in marks:
                share["whole_run"] = round(c1 / (t1 - marks["start"][0]), 4)
            if "warm" in marks:
                t0, c0 = marks["warm"]
                share["after_start"] = round((c1 - c0) / (t1 - t0), 4)
            out[name] = share
        return out

    def report(self) -> dict:
        return {"node": self.cfg.node, "db": str(self.cfg.dir / "sloscope.duckdb"),
                "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.cfg).items()},
                "faults": [asdict(r) | {"right": r.right} for r in self.results],
                "collector_cpu_share": self.cpu_shares().get("collect", {}),
                "cpu_share": self.cpu_shares(),
                "ok": bool(self.results) and all(r.right for r in self.results)
                and len(self.results) == len(self.cfg.faults)}


def summary_table(report: dict) -> str:
    rows = [("fault", "found", "tier", "top cause", "true rank", "first window", "reported", "p99 before",
             "p99 during")]
    for r in report["faults"]:
        ms = lambda v: f"{v:.0f} ms" if v is not None else "-"  # noqa: E731
        rows.append((r["fault"], "yes" if r["found"] else "NO", r["tier"] or "-",
                     (r["top_cause"] or "-") + ("" if r["right"] else " (wrong)" if r["found"] else ""),
                     str(r["true_rank"] or "-"),
                     f"{r['detection_s']:+.0f} s" if r["detection_s"] is not None else "-",
                     f"{r['reported_s']:.0f} s" if r["reported_s"] is not None else "-",
                     ms(r["p99_before_ms"]), ms(r["p99_during_ms"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    share = report["collector_cpu_share"]
    if share:
        lines.append(f"probes' CPU share (sloscope collect CPU time / wall time): "
                     f"{share.get('after_start', share.get('whole_run', 0)):.1%} after start-up, "
                     f"{share.get('whole_run', 0):.1%} including the eBPF compile")
    return "\n".join(lines)

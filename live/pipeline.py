"""The live demo's processes: `sloscope serve` and `sloscope collect`, the backend in its network namespace, the
service pinned to its CPU in its memory cgroup, and the load; their bursts and their CPU time.

serve, collect, backend and load run on the other CPUs, as a node's system-reserved CPUs would.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from sloscope.probes.registry import NODE_PROBES

from . import faults
from .config import LiveConfig, utcnow
from .workload import READY

log = logging.getLogger("sloscope.live")

PROCESSES = ("serve", "collect", "backend", "service", "load")
PROBE_START_S = 180  # compiling the collector's eBPF programs takes a while


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
    others = [c for c in cpus if c not in faults.parse_cpus(service_cpus)]
    return ",".join(map(str, others or cpus))


class Pipeline:
    """Starts the processes in order, each once the previous one is ready; `stop()` stops whatever was started."""

    def __init__(self, cfg: LiveConfig, say: Callable[[str], None]):
        self.cfg = cfg
        self.say = say
        cfg.service_cpus = cfg.service_cpus or _default_cpus()
        cfg.system_cpus = cfg.system_cpus or _other_cpus(cfg.service_cpus)
        self.procs = faults.Processes(cfg.dir)
        self.network: faults.BackendNetwork | None = None
        self.cgroup = faults.MemoryCgroup(str(os.getpid()), cfg.memory_limit_mib * 2**20)
        self._cgroup_made = False
        self.http_port = self.grpc_port = 0
        self.bursts: list[datetime] = []
        self.cpu: dict[str, dict] = {}  # process -> {"start"|"warm"|"end": (monotonic time, CPU seconds)}

    def start(self) -> None:
        sloscope = ["taskset", "-c", self.cfg.system_cpus, self.cfg.python, "-m", "sloscope.commands.cli"]
        self._start_serve(sloscope)
        self._start_collect(sloscope)
        self._start_backend()
        service_port = self._start_service()
        self._start_load(service_port)

    def _workload_argv(self, *argv: str) -> list[str]:
        return ["taskset", "-c", self.cfg.system_cpus, self.cfg.python, "-m", "sloscope.live.workload", *argv]

    def _start_serve(self, sloscope: list[str]) -> None:
        cfg = self.cfg
        self.http_port, self.grpc_port = free_port(), free_port()
        self.say(f"==> sloscope serve: {cfg.dir / 'sloscope.duckdb'}, OTLP/HTTP :{self.http_port}, "
                 f"OTLP/gRPC :{self.grpc_port}")
        serve = self.procs.start("serve", sloscope + [
            "serve", "--db", str(cfg.dir / "sloscope.duckdb"), "--slo", str(cfg.dir / "slo.yaml"),
            "--http", f"127.0.0.1:{self.http_port}", "--grpc", f"127.0.0.1:{self.grpc_port}"])
        self.cpu["serve"] = {"start": (time.monotonic(), 0.0)}
        wait_until(listening("127.0.0.1", self.http_port), serve, "sloscope serve")

    def _start_collect(self, sloscope: list[str]) -> None:
        cfg = self.cfg
        self.say(f"==> sloscope collect: the node's probes every {cfg.interval_s:g}s as node {cfg.node}")
        collect = self.procs.start("collect", sloscope + [
            "collect", "--endpoint", f"http://127.0.0.1:{self.grpc_port}", "--protocol", "grpc",
            "--interval", f"{cfg.interval_s:g}", "--probe", "node", "--node-name", cfg.node,
            "--spool-dir", str(cfg.dir / "spool")])
        self.cpu["collect"] = {"start": (time.monotonic(), 0.0)}
        self._wait_probes(collect)

    def _wait_probes(self, collect) -> None:
        """Until the collector has started its probes."""
        log_path = self.cfg.dir / "collect.log"
        deadline = time.monotonic() + PROBE_START_S
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
        raise RuntimeError(f"sloscope collect did not start its probes within {PROBE_START_S}s")

    def _start_backend(self) -> None:
        self.network = faults.BackendNetwork()  # known before it exists, so that a failure half-way is cleaned up
        self.network.up()
        self.say(f"==> backend in network namespace {self.network.netns} at {self.network.backend_ip}:8081 "
                 f"(veth {self.network.host_if} {self.network.host_ip}/24)")
        backend = self.procs.start("backend", self.network.exec_argv(
            self._workload_argv("backend", "--listen", f"{self.network.backend_ip}:8081")))
        wait_until(listening(self.network.backend_ip, 8081), backend, "backend")

    def _start_service(self) -> int:
        cfg = self.cfg
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
            "taskset", "-c", cfg.service_cpus, cfg.python, "-m", "sloscope.live.workload", "service",
            "--listen", f"127.0.0.1:{service_port}", "--backend", f"{self.network.backend_ip}:8081",
            "--cache-dir", str(cfg.dir / "cache"), "--otlp", f"http://127.0.0.1:{self.http_port}",
            "--node", cfg.node, "--model-kib", str(cfg.model_kib)]))
        self.cpu["service"] = {"start": (time.monotonic(), 0.0)}
        wait_until(listening("127.0.0.1", service_port), service, "service")
        return service_port

    def _start_load(self, service_port: int) -> None:
        cfg = self.cfg
        self.say(f"==> load: {cfg.rate:g} req/s ({cfg.critical_share:.0%} p99-latency-critical, the rest standard), "
                 f"bursts of {cfg.burst_factor:g}x for {cfg.burst_s:g}s between faults")
        self.procs.start("load", self._workload_argv(
            "load", "--target", f"127.0.0.1:{service_port}", "--rate", str(cfg.rate),
            "--critical-share", str(cfg.critical_share), "--burst-factor", str(cfg.burst_factor),
            "--burst-seconds", str(cfg.burst_s)), stdout_path=cfg.dir / "load.json")
        wait_until(logged(cfg.dir / "load.log", READY), self.procs.procs["load"], "load")

    # --- while it runs ---------------------------------------------------------------------------------

    def all_running(self) -> bool:
        return all(self.procs.running(name) for name in PROCESSES)

    def check_running(self) -> None:
        for name in PROCESSES:
            if not self.procs.running(name):
                raise RuntimeError(f"{name} exited unexpectedly; see {self.cfg.dir / (name + '.log')}")

    def burst(self) -> None:
        proc = self.procs.procs.get("load")
        if proc and proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)
            self.bursts.append(utcnow())
            self.say(f"    burst: {self.cfg.burst_factor:g}x for {self.cfg.burst_s:g}s")

    def cpu_mark(self, label: str) -> None:
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

    # --- the end ---------------------------------------------------------------------------------------

    def stop(self) -> None:
        """The load first, serve last (SIGTERM: it writes what it accepted); then the namespace and the cgroup."""
        for name in reversed(PROCESSES):
            try:
                self.procs.stop(name, grace_s=30 if name in ("serve", "collect") else 10)
            except Exception:
                log.exception("stopping %s", name)
        self.procs.stop_all()
        if self.network is not None:
            self.network.down()
        if self._cgroup_made:
            self.cgroup.remove()


"""The live demo: real processes, real kernel probes, real faults, scored against what was injected.

    sloscope serve   (a fresh DuckDB under the demo's directory; GET /rca analyses in-process)
    sloscope collect (the node's eBPF and procfs probes, every second, OTLP/gRPC to serve)
    backend          (a TCP service in its own network namespace, behind a veth pair)
    service          (inference-like, OpenTelemetry SDK SERVER spans with the x-slo-tier header, pinned to
                      its own CPU and in its own memory cgroup; per request: a model step over mapped weights,
                      a cache read (O_DIRECT) and write (fsync), a call to the backend)
    load             (open loop over keep-alive connections, two tiers, a steady rate plus 10x bursts of 5 s
                      between faults)

pipeline.py starts and stops those; this module is the fault loop: after a warm-up, one fault at a time
(faults.py) for a fixed time, then a recovery long enough that the next fault's baseline is quiet again;
judging.py scores each fault from serve's /rca (polled every few seconds, as a dashboard would, and asked over
the fault's time after it).

Everything started is stopped on the way out (normal end, failure, Ctrl-C, SIGTERM): the fault, the load,
the service, the backend, the collector, then serve (SIGTERM: it writes what it accepted), the namespace
with its nftables rules, the memory cgroup, and the fault's files.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from sloscope.probes.ebpf.runqueue import RunqueueProbe
from sloscope.times import rfc3339

from . import faults
from .config import FAULT_NAMES, LiveConfig, utcnow
from .judging import FaultResult, Judge, verdict_line
from .pipeline import Pipeline

log = logging.getLogger("sloscope.live")

TOOLS = ("stress-ng", "fio", "nft", "ip", "taskset")
SETTLE_S = 15.0  # after a fault, at most this long (half the recovery) for its last spans and samples


def unavailable() -> list[str]:
    """Why the live demo cannot run here (empty: it can)."""
    why = []
    if os.geteuid() != 0:
        why.append("it needs root (eBPF probes, network namespaces, nftables)")
        return why
    try:
        availability = RunqueueProbe().check()
        if not availability.ok:
            why.append("eBPF is unavailable: " + "; ".join(availability.missing))
    except Exception as exc:  # bcc missing or broken
        why.append(f"eBPF is unavailable: {type(exc).__name__}: {exc}")
    missing = faults.missing_tools(TOOLS)
    if missing:
        why.append("missing tools: " + ", ".join(missing))
    return why


class LiveDemo:
    def __init__(self, cfg: LiveConfig, out=sys.stdout):
        self.cfg = cfg
        self.out = out
        self.pipeline = Pipeline(cfg, self.say)
        self.judge = Judge(cfg, self.pipeline)
        self.results: list[FaultResult] = []
        self._active_fault: faults.Fault | None = None

    @property
    def network(self) -> faults.BackendNetwork | None:
        return self.pipeline.network

    def say(self, message: str) -> None:
        print(message, file=self.out, flush=True)

    # --- the run ---------------------------------------------------------------------------------------

    def run(self) -> dict:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            self._prepare()
            self.pipeline.start()
            self.judge.start_polling()
            self._warm_up()
            for name in self.cfg.faults:
                self._one_fault(self._fault(name))
            self.judge.stop_polling()
        finally:
            self._teardown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self.judge.measure(self.results)
        return self.report()

    def _on_signal(self, signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def _prepare(self) -> None:
        cfg = self.cfg
        removed = faults.remove_leftovers()
        if removed:
            self.say(f"removed leftovers of an earlier run: {', '.join(removed)}")
        shutil.rmtree(cfg.dir, ignore_errors=True)
        cfg.dir.mkdir(parents=True)
        (cfg.dir / "slo.yaml").write_text(cfg.slo_yaml())

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            self.pipeline.check_running()
            time.sleep(min(left, 1.0))

    def _quiet(self, seconds: float, burst_at: float = 0.5) -> None:
        """A quiet phase with one burst (at `burst_at` of it), so that baselines know what a burst looks like."""
        before = max(0.0, (seconds - self.cfg.burst_s) * burst_at)
        self._sleep(before)
        self.pipeline.burst()
        self._sleep(seconds - before)

    def _warm_up(self) -> None:
        cfg = self.cfg
        self.pipeline.cpu_mark("warm")
        self.say(f"==> warm-up {cfg.warmup_s:.0f}s (the first fault's baseline: {cfg.baseline_s:.0f}s ending "
                 f"{cfg.lookback_s:.0f}s before its incident)")
        self._quiet(cfg.warmup_s)

    def _fault(self, name: str) -> faults.Fault:
        cfg = self.cfg
        if name == "cpu":
            return faults.CpuFault(cfg.service_cpus, cfg.cpu_workers_per_cpu)
        if name == "disk":
            return faults.DiskFault(cfg.dir / "fio", cfg.system_cpus, cfg.disk_jobs)
        if name == "network":
            return faults.LossFault(self.network, cfg.loss_percent)
        if name == "memory":
            if not self.pipeline.cgroup.available:
                raise RuntimeError("the memory fault needs a memory cgroup (cgroup v2 memory or v1 memory)")
            return faults.MemoryFault(self.pipeline.cgroup, cfg.system_cpus)
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULT_NAMES)}")

    def _one_fault(self, fault: faults.Fault) -> None:
        cfg = self.cfg
        self.say(f"==> fault {fault.name} for {cfg.fault_s:.0f}s: {fault.describe()}")
        start = utcnow()
        self._active_fault = fault
        try:
            fault.start(self.pipeline.procs, cfg.fault_s)
            self._sleep(cfg.fault_s)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            if not self.pipeline.all_running():
                raise
            result = FaultResult(fault.name, fault.cause, fault.describe(), rfc3339(start, fraction=True),
                                 rfc3339(utcnow(), fraction=True), error=f"the fault could not run: {exc}")
            self.results.append(result)
            self.say("    " + verdict_line(result))
            return
        finally:
            fault.stop(self.pipeline.procs)
            self._active_fault = None
        end = utcnow()
        result = FaultResult(fault.name, fault.cause, fault.describe(), rfc3339(start, fraction=True),
                             rfc3339(end, fraction=True))
        self.results.append(result)
        settle = min(SETTLE_S, cfg.recovery_s / 2)
        self._sleep(settle)  # the last spans and samples arrive
        try:
            self.judge.judge(result, start, end)
        except Exception as exc:  # report it, go on with the next fault
            result.error = f"{type(exc).__name__}: {exc}"
        self.say("    " + verdict_line(result))
        # The burst early, so that whatever it does to the SLI is long over when the next fault starts.
        self._quiet(cfg.recovery_s - settle, burst_at=0.2)

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
        self.judge.stop_polling()
        if self._active_fault is not None:
            try:
                self._active_fault.stop(self.pipeline.procs)
            except Exception:
                log.exception("stopping the fault")
        self.pipeline.cpu_mark("end")
        self.pipeline.stop()
        shutil.rmtree(self.cfg.dir / "fio", ignore_errors=True)

    def report(self) -> dict:
        shares = self.pipeline.cpu_shares()
        return {"node": self.cfg.node, "db": str(self.cfg.dir / "sloscope.duckdb"),
                "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.cfg).items()},
                "faults": [asdict(r) | {"right": r.right} for r in self.results],
                "collector_cpu_share": shares.get("collect", {}),
                "cpu_share": shares,
                "ok": bool(self.results) and all(r.right for r in self.results)
                and len(self.results) == len(self.cfg.faults)}

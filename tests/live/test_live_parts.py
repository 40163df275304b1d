"""The live demo's own parts: the choice between live and simulated, and the removal of a killed run's
leftovers. (The live run itself: tests/live/test_live_faults.py.)"""

import argparse
import os
import subprocess
import sys

from sloscope.commands import demo
from tests.conftest import need


def _demo_args(**kw):
    args = argparse.Namespace(mode="auto", dir=None, fault="gpu_sm_contention", nodes=4, seed=1,
                              faults="cpu,disk", fault_seconds=30.0, recovery_seconds=60.0, warmup_seconds=60.0,
                              baseline_seconds=45.0, rate=10.0, json=False)
    vars(args).update(kw)
    return args


def test_demo_runs_live_when_it_can_and_says_why_not_otherwise(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(demo, "run_simulated", lambda args: calls.append("simulated") or 0)
    monkeypatch.setattr(demo, "run_live", lambda args: calls.append("live") or 0)
    import sloscope.live.run as live

    monkeypatch.setattr(live, "unavailable", lambda: ["it needs root"])
    assert demo.run(_demo_args()) == 0 and calls == ["simulated"]
    assert "it needs root" in capsys.readouterr().err
    assert demo.run(_demo_args(mode="live")) == 2 and calls == ["simulated"]
    monkeypatch.setattr(live, "unavailable", lambda: [])
    assert demo.run(_demo_args()) == 0 and calls == ["simulated", "live"]
    assert demo.run(_demo_args(mode="simulated")) == 0 and calls == ["simulated", "live", "simulated"]


def test_unknown_live_faults_are_a_usage_error(capsys):
    assert demo.run_live(_demo_args(faults="cpu,volcano")) == 2
    assert "volcano" in capsys.readouterr().err


def test_leftovers_of_a_killed_run_are_removed():
    need(os.geteuid() == 0, "network namespaces need root")
    from sloscope.live import faults

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    name = f"{faults.PREFIX}{dead.pid}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in faults.remove_leftovers()
        assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    alive = f"{faults.PREFIX}{os.getpid()}"  # a running demo's namespace is left alone
    subprocess.run(["ip", "netns", "add", alive], check=True)
    try:
        assert alive not in faults.remove_leftovers()
    finally:
        subprocess.run(["ip", "netns", "delete", alive], check=True)

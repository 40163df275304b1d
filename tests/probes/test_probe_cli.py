"""`sloscope probe`: formats, exit status, and a clean stop on Ctrl-C / SIGTERM."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sloscope.probes.cli import main
from sloscope.probes.procfs.pressure import PressureProbe

REPO = Path(__file__).resolve().parents[2]


def test_table_output_for_people(capsys):
    # Two intervals; a first collect slower than the interval would leave time for only one.
    assert main(["probe", "pressure", "tcp_connections", "--duration", "1.0", "--interval", "0.5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# pressure: running" and out[1].startswith("# tcp_connections: running; counting through ")
    assert sum(line.startswith("-- interval ") for line in out) == 2
    rows = [line.split() for line in out if line.startswith("  ")]
    assert ["sloscope.pressure.stall", "pressure.resource=cpu", "pressure.kind=full", "delta"] == rows[0][:4]
    assert any(r[:4] == ["sloscope.pressure.stall", "pressure.resource=cpu", "pressure.kind=some", "delta"]
               for r in rows)
    listen = [r for r in rows if "network.connection.state=listen" in r]
    assert listen and listen[0][-1] == "{connection}"


def test_json_lines_for_machines(capsys):
    assert main(["probe", "netstat", "--duration", "0.2", "--interval", "0.2", "--format", "json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert records[0] == {"record": "status", "requested": "netstat", "running": ["netstat"], "missing": [],
                          "lost_signals": [], "notes": []}
    (sample,) = records[1:]
    assert sample["name"] == "sloscope.tcp.retransmits" and sample["kind"] == "counter_delta"
    assert sample["unit"] == "{segment}" and sample["instrument"] == "counter"
    assert sample["start_time_unix_nano"] < sample["time_unix_nano"] and sample["value"] >= 0


def test_unknown_probe_is_a_usage_error(capsys):
    assert main(["probe", "nosuch", "--duration", "0.1"]) == 2
    assert "unknown probe 'nosuch'" in capsys.readouterr().err


def test_a_probe_with_nothing_to_run_exits_1(capsys, monkeypatch):
    monkeypatch.setattr(PressureProbe, "files", ("pressure/not-there",))
    assert main(["probe", "pressure", "--duration", "0.1", "--format", "json"]) == 1
    (status,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert status["running"] == [] and "not-there: not found" in status["missing"][0]


def test_help_lists_probes_and_fallbacks(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["probe", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for name in ("syscall", "tcp", "block", "runqueue", "tcp_rtt", "pressure", "diskstats", "netstat", "schedstat",
                 "tcp_connections", "tcp_info"):
        assert f"\n  {name} " in text
    assert "(fallback: netstat)" in text and "(fallback: tcp_info)" in text and "JSON Lines" in text
    assert "signals: sloscope.tcp.rtt" in text


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_cleanly(signum):
    names = ["pressure"] + (["tcp"] if os.geteuid() == 0 else [])  # with root, through the eBPF stop path too
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.probes.cli", "probe", *names, "--duration", "60",
                             "--interval", "0.2", "--format", "json"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(200):  # bounded: until the first sample arrives
            line = proc.stdout.readline()
            if not line or json.loads(line)["record"] == "sample":
                break
        assert line, proc.stderr.read()
        proc.send_signal(signum)
        assert proc.wait(timeout=15) == 130
    finally:
        proc.kill()
        proc.wait()

"""One collector per spool directory: a Spool locks its directory while open; a second one, in this process or
another, is refused at once with a line that says why, and the lock goes with the process, however it ends."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sloscope.collectors.agent import Agent
from sloscope.collectors.spool import LOCK_FILE, Spool, SpoolInUse
from tests.fakes.otlp_sink import free_port
from tests.collectors.test_collector import collect_cmd, make_config, read_spool, wait_for
from tests.collectors.test_collector_config import write_config
from tests.collectors.test_spool import request

REPO = Path(__file__).resolve().parents[2]


def test_a_second_spool_on_the_directory_is_refused_until_the_first_closes(tmp_path):
    first = Spool(str(tmp_path))
    first.append(request(1, 0))
    started = time.monotonic()
    with pytest.raises(SpoolInUse) as refused:
        Spool(str(tmp_path))
    assert time.monotonic() - started < 1  # refused, not waited for
    assert str(refused.value).startswith(f"spool directory {tmp_path} is in use: another collector holds its lock")
    assert first.sequence_numbers() == [0] and os.path.exists(first.path(0))  # the refused one touched nothing
    first.close()
    second = Spool(str(tmp_path))
    assert second.sequence_numbers() == [0]
    second.close()


def test_the_lock_file_survives_a_restart_scan_untouched(tmp_path):
    spool = Spool(str(tmp_path))
    for tag in range(3):
        spool.append(request(1, tag))
    spool.close()
    lock = tmp_path / LOCK_FILE
    before = os.stat(lock)
    again = Spool(str(tmp_path))
    after = os.stat(lock)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, 0, before.st_mtime_ns)
    assert again.sequence_numbers() == [0, 1, 2] and again.corrupt_batches == again.dropped_batches == 0
    while again:  # every batch replays; the lock file is none of them
        again.remove(again.peek()[0])
    assert again.corrupt_batches == 0 and not (tmp_path / "corrupt").exists()
    assert os.listdir(tmp_path) == [LOCK_FILE]
    again.close()


HOLD_AND_WAIT = """
import sys, time
from sloscope.collectors.spool import Spool
spool = Spool(sys.argv[1])
print("holding", flush=True)
time.sleep(60)
"""


def test_the_lock_goes_with_a_killed_process(tmp_path):
    """No stale lock: the kernel lets go of it when its holder dies, even by SIGKILL."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT, str(tmp_path)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "holding\n"
        with pytest.raises(SpoolInUse):
            Spool(str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    Spool(str(tmp_path)).close()


def test_a_stopped_agent_lets_go_of_its_spool(tmp_path):
    """In one process too (tests, an embedding): the next agent on the directory opens it."""
    cfg = make_config(tmp_path, probes=("pressure",), once=True, listen=None)
    agent = Agent(cfg)
    assert agent.run() == 0
    Spool(cfg.spool_dir).close()  # while the agent, and its spool, are still about
    assert agent.shipper.spool.stats().batches == 1  # the batch it collected, spooled: the endpoint is down


def test_a_second_collector_on_the_spool_directory_stops_at_once_with_status_2(tmp_path):
    """A `sloscope collect --once` run by kubectl exec in the collector's pod, on the pod's spool: it says so
    and stops, and the running collector's batches stay its own."""
    spool = tmp_path / "spool"
    down = f"http://127.0.0.1:{free_port()}"  # refuses connections: everything stays in the spool
    first = subprocess.Popen(collect_cmd("--endpoint", down, "--protocol", "http/protobuf", "--probe", "pressure",
                                         "--interval", "0.2", "--timeout", "0.5", "--duration", "30",
                                         "--listen", "off", "--spool-dir", str(spool)),
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: spool.exists() and len(read_spool(spool)) >= 1, timeout=30)
        config = write_config(tmp_path, f"endpoint: {down}\nprotocol: http/protobuf\nprobes: [pressure]\n"
                                        f"listen: 'off'\nspool:\n  dir: {spool}\n")
        second = subprocess.run(collect_cmd("--config", config, "--once"), cwd=REPO, capture_output=True,
                                text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        refused = [line for line in second.stderr.splitlines() if "in use" in line]
        assert refused == [f"sloscope collect: spool directory {spool} is in use: another collector holds its lock "
                           f"({spool / LOCK_FILE}); give each collector its own spool directory"]
        assert first.poll() is None
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=20)
        assert first.returncode == 0, err
        stopped = [line for line in err.splitlines() if "stopped:" in line][0]
        batches = int(stopped.split(" points in ")[1].split(" batches")[0])
        assert len(read_spool(spool)) == batches  # every batch the first made, none taken or replaced
    finally:
        first.kill()
        first.wait()

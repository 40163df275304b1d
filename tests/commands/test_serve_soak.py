"""A minute of good, malformed and slow clients against a real `sloscope serve`: every good request is
answered and kept, the hostile ones cost nothing lasting, and serve's resident memory stays flat."""

import signal
import subprocess
import sys
import time

import pytest

from sloscope.analytics.store import Store
from tests.alerting_stack import free_port, wait_listening
from tests.hostile_clients import ClientMix, rss_bytes

SOAK_S = 60


@pytest.mark.slow
def test_a_minute_of_mixed_clients_keeps_every_good_request_and_memory_flat(tmp_path):
    db, port = tmp_path / "soak.duckdb", free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(db), "--grpc", "off",
                             "--http", f"127.0.0.1:{port}", "--decode-workers", "0", "--read-header-timeout", "2",
                             "--read-timeout", "2", "--max-request-body-size", "256KiB", "--max-connections", "32",
                             "--log-level", "warning"], stderr=subprocess.PIPE, text=True)
    soak = ClientMix(port)
    try:
        wait_listening(port, proc, "sloscope serve")
        clients = soak.start(good=2, malformed=1, slow=6)
        rss, started = [], time.monotonic()
        while time.monotonic() - started < SOAK_S:
            rss.append(rss_bytes(proc.pid))
            time.sleep(1)
        soak.stop.set()
        for c in clients:
            c.join(30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        stderr = proc.stderr.read()
    assert not soak.unanswered, soak.unanswered[:5]
    assert not soak.misanswered, soak.misanswered[:5]
    assert soak.kept_spans > 1000 and soak.hostile > 100
    with Store(db, read_only=True) as store:
        assert store.rows("SELECT count(*) FROM requests") == [(soak.kept_spans,)]
    third = len(rss) // 3
    warm, late = max(rss[:third]), max(rss[-third:])
    assert late < warm + 64 * 2**20, f"RSS grew from {warm >> 20} MiB to {late >> 20} MiB"
    assert "Traceback" not in stderr, stderr[-2000:]

"""A real alerting loop on loopback for tests and the time-to-remediate benchmark: `sloscope serve` (OTLP in,
/metrics out, webhook), Debian's Prometheus with the generated rules, Debian's Alertmanager posting to the
webhook, and an nftables load-balancer set inside a network namespace made for the purpose."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TOKEN = "e2e-token-0123456789abcdef"
BACKENDS = {"gpu-node-1": "10.0.0.1", "gpu-node-3": "10.0.0.3"}
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
PROMETHEUS = shutil.which("prometheus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start listening on {port}")
            time.sleep(0.1)


def nft(netns: str, *args: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, "nft", *args], check=True, capture_output=True,
                          text=True).stdout


class AlertingStack:
    def __init__(self, workdir: Path, interval_s: int = 1, hold: str = "5s", nodes_to_drain=("gpu-node-3",)):
        self.workdir = workdir
        self.netns = f"sloscope-lb-{os.getpid()}"
        self.db = workdir / "sloscope.duckdb"
        self.ports = {k: free_port() for k in ("otlp", "webhook", "prometheus", "alertmanager")}
        self.procs: dict[str, subprocess.Popen] = {}
        self.interval_s = interval_s
        self.hold = hold

    # --- set-up -------------------------------------------------------------------------------------------

    def start(self) -> "AlertingStack":
        subprocess.run(["ip", "netns", "add", self.netns], check=True)
        nft(self.netns, "add", "table", "inet", "lb")
        nft(self.netns, "add", "set", "inet", "lb", "backends", "{ type ipv4_addr; }")
        nft(self.netns, "add", "element", "inet", "lb", "backends", "{ " + ", ".join(BACKENDS.values()) + " }")
        (self.workdir / "token").write_text(TOKEN + "\n")
        self._write_remediation()
        subprocess.run([sys.executable, "-m", "sloscope.commands.cli", "rules", "--hold", self.hold,
                        "-o", str(self.workdir / "rules.yml")], check=True, capture_output=True)
        self._start("serve", [sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(self.db),
                              "--http", f"127.0.0.1:{self.ports['otlp']}", "--grpc", "off",
                              "--webhook", f"127.0.0.1:{self.ports['webhook']}",
                              "--remediation", str(self.workdir / "remediation.yaml"),
                              "--webhook-token-file", str(self.workdir / "token")], self.ports["otlp"])
        self._start("alertmanager", [ALERTMANAGER, f"--config.file={self._alertmanager_config()}",
                                     f"--storage.path={self.workdir / 'am'}",
                                     f"--web.listen-address=127.0.0.1:{self.ports['alertmanager']}",
                                     "--cluster.listen-address="], self.ports["alertmanager"])
        self._start("prometheus", [PROMETHEUS, f"--config.file={self._prometheus_config()}",
                                   f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{self.ports['prometheus']}"],
                    self.ports["prometheus"])
        return self

    def _start(self, name: str, argv: list[str], port: int) -> None:
        log = open(self.workdir / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        wait_listening(port, self.procs[name], name)

    def _write_remediation(self) -> None:
        drain = {"action": "nft_drain_backend",
                 "params": {"family": "inet", "table": "lb", "set": "backends", "netns": self.netns,
                            "addresses": BACKENDS}}
        config = {"execute": True, "cooldown": "10m", "max_actions_per_hour": 20, "command_timeout": "10s",
                  "actions": {"SloscopeNodeErrorRatioHigh": drain,
                              "SloscopeTierLatencyHigh": {"action": "raise_sampling",
                                                          "params": {"ratio": 1.0, "duration": "15m"}},
                              "SloscopeLatencyBudgetBurn": {"action": "raise_sampling",
                                                            "params": {"ratio": 1.0, "duration": "15m"}}}}
        (self.workdir / "remediation.yaml").write_text(json.dumps(config))  # JSON is YAML

    def _alertmanager_config(self) -> Path:
        path = self.workdir / "alertmanager.yml"
        path.write_text(json.dumps({
            "route": {"receiver": "sloscope", "group_by": ["alertname", "node", "tier"], "group_wait": "0s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "sloscope", "webhook_configs": [{
                "url": f"http://127.0.0.1:{self.ports['webhook']}/alerts", "send_resolved": True,
                "http_config": {"authorization": {"type": "Bearer",
                                                  "credentials_file": str(self.workdir / "token")}}}]}],
        }))
        return path

    def _prometheus_config(self) -> Path:
        path = self.workdir / "prometheus.yml"
        interval = f"{self.interval_s}s"
        path.write_text(json.dumps({
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(self.workdir / "rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [
                {"targets": [f"127.0.0.1:{self.ports['alertmanager']}"]}]}]},
            "scrape_configs": [{"job_name": "sloscope", "metrics_path": "/metrics",
                                "static_configs": [{"targets": [f"127.0.0.1:{self.ports['otlp']}"]}]}],
        }))
        return path

    # --- traffic and state --------------------------------------------------------------------------------

    def send_json(self, path: str, doc: dict) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.ports["otlp"], timeout=10)
        conn.request("POST", path, json.dumps(doc).encode(), {"Content-Type": "application/json"})
        status = conn.getresponse().status
        conn.close()
        return status

    def webhook(self, body: bytes, token: str | None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.ports["webhook"], timeout=10)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request("POST", "/alerts", body, headers)
        response = conn.getresponse()
        text = response.read()
        conn.close()
        return response.status, (json.loads(text) if text.startswith(b"{") else {})

    def backends(self) -> set[str]:
        out = nft(self.netns, "-j", "list", "set", "inet", "lb", "backends")
        for item in json.loads(out)["nftables"]:
            if "set" in item:
                return set(item["set"].get("elem", []))
        return set()

    def firing(self) -> set[str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['prometheus']}/api/v1/alerts", timeout=10) as r:
            alerts = json.load(r)["data"]["alerts"]
        return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}

    # --- tear-down ----------------------------------------------------------------------------------------

    def stop_serve(self) -> int:
        proc = self.procs.pop("serve")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        if code != 0:  # shown by pytest beside the failure
            print((self.workdir / "serve.log").read_text()[-6000:])
        return code

    def close(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        subprocess.run(["ip", "netns", "delete", self.netns], capture_output=True)

"""The Alertmanager webhook: authentication before anything is read, size limit, schema, idempotency, undo on
resolve, 5xx only when the audit store is busy."""

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest

from sloscope.alerts.audit import AuditStore
from sloscope.alerts.remediation import Engine
from sloscope.alerts.remediation_config import parse_config
from sloscope.alerts.webhook import (MAX_ALERTS, TOKEN_ENV, TokenError, WebhookApp, WebhookServer, load_token,
                                     validate_payload)
from sloscope.commands.cli import main
from sloscope.slo_spec import load_spec
from tests.alerting_stack import free_port, wait_listening
from tests.alerts.test_remediation import FakeRunner

TOKEN = b"s3cret-token-0123456789"
CONFIG = """
execute: true
actions:
  SloscopeGpuSaturated:
    action: nft_drain_backend
    params: {table: lb, set: backends, addresses: {gpu-node-3: 10.0.0.3}}
"""


def payload(status="firing", fp="0a1b2c3d4e5f6789", **labels):
    labels = {"alertname": "SloscopeGpuSaturated", "node": "gpu-node-3", "gpu": "GPU-1", **labels}
    return {
        "version": "4", "groupKey": '{}:{alertname="SloscopeGpuSaturated"}', "truncatedAlerts": 0, "status": status,
        "receiver": "sloscope", "groupLabels": {"alertname": "SloscopeGpuSaturated"}, "commonLabels": labels,
        "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
        "alerts": [{"status": status, "labels": labels, "annotations": {"summary": "GPU GPU-1 on gpu-node-3 busy"},
                    "startsAt": "2026-01-01T11:59:00.123456789Z",
                    "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-01-01T12:30:00Z",
                    "generatorURL": "http://prometheus:9090/graph", "fingerprint": fp}]}


@pytest.fixture
def server(tmp_path):
    runner = FakeRunner()
    engine = Engine(parse_config(CONFIG), AuditStore.at(tmp_path / "audit.duckdb"), load_spec(None).tiers,
                    runner=runner)
    srv = WebhookServer(("127.0.0.1", 0), WebhookApp(engine, TOKEN, max_body=8192))
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    srv.runner = runner
    srv.db = tmp_path / "audit.duckdb"
    yield srv
    srv.shutdown()
    srv.server_close()


def post(server, body, token=TOKEN, path="/alerts", headers=None, method="POST"):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        h["Authorization"] = "Bearer " + token.decode()
    conn.request(method, path, body=data, headers=h)
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read() or b"null"), dict(resp.getheaders())
    conn.close()
    return out


def raw(server, head: bytes, timeout=3.0) -> bytes:
    """Send only the request head (no body) and return what the server answers before we send more."""
    with socket.create_connection(server.server_address[:2], timeout=timeout) as s:
        s.sendall(head)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return data


def test_health_needs_no_token(server):
    status, body, _ = post(server, b"", token=None, path="/-/healthy", method="GET")
    assert status == 200 and body == {"status": "ok"}


@pytest.mark.parametrize("auth", [None, "Bearer wrong-token-0123456789", "Basic " + TOKEN.decode(),
                                  "Bearer " + TOKEN.decode()[:-1], "Bearer", "Bearer " + TOKEN.decode() + "x"])
def test_without_the_right_token_401(server, auth):
    headers = {} if auth is None else {"Authorization": auth}
    status, body, resp_headers = post(server, payload(), token=None, headers=headers)
    assert status == 401 and body == {"error": "unauthorized"}
    # as the OTLP receiver answers (edge/auth.py, RFC 6750): a wrong token is said to be invalid, a missing one not
    invalid = 'error="invalid_token"' in resp_headers["WWW-Authenticate"]
    assert resp_headers["WWW-Authenticate"].startswith('Bearer realm="sloscope"') and invalid == (auth is not None)
    assert server.runner.calls == []


def test_401_comes_before_the_body_is_read(server):
    # announce a large body and send none: the answer must come without the server waiting for it
    head = (b"POST /alerts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000\r\n\r\n")
    started = time.monotonic()
    answer = raw(server, head)
    assert answer.startswith(b"HTTP/1.1 401") and time.monotonic() - started < 2.5
    assert b"Connection: close" in answer
    # and at the protocol level: read_body is never called
    class Audit:  # the only thing a refused request may touch: one audit line for a burst of them
        counts = []

        def record_unauthenticated(self, count, clients):
            self.counts.append(count)

    app = WebhookApp(engine=Audit(), token=TOKEN)
    never = lambda n: pytest.fail("body read before authentication")  # noqa: E731
    assert app.respond("POST", "/alerts", {"Content-Length": "10"}, never)[0] == 401
    assert app.respond("POST", "/alerts", {"Authorization": "Bearer nope", "Content-Length": "10"}, never)[0] == 401
    assert Audit.counts == [1]  # the second falls in the same audit period, counted for the next line


def test_too_large_413_without_reading(server):
    head = (b"POST /alerts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
            + TOKEN + b"\r\nContent-Length: 10000\r\n\r\n")
    assert raw(server, head).startswith(b"HTTP/1.1 413")
    big = payload()
    big["alerts"][0]["annotations"]["description"] = "x" * 10000
    assert post(server, big)[0] == 413


def test_length_required_method_path_and_content_type(server):
    head = b"POST /alerts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN + b"\r\n\r\n"
    assert raw(server, head).startswith(b"HTTP/1.1 411")
    assert post(server, payload(), path="/other")[0] == 404
    assert post(server, b"", method="GET")[0] == 405
    assert post(server, payload(), headers={"Content-Type": "text/plain"})[0] == 415


@pytest.mark.parametrize("length", ["+{n}", "{n0}_{rest}", "{n}.0", "0x{n:x}"])
def test_a_content_length_that_is_not_plain_digits_is_400(server, length):
    # A proxy in front may read such a length otherwise, and the two would part ways on a kept-alive connection.
    body = json.dumps(payload()).encode()
    n = len(body)
    length = length.format(n=n, n0=str(n)[0], rest=str(n)[1:]).encode()
    head = (b"POST /alerts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
            + TOKEN + b"\r\nContent-Length: " + length + b"\r\n\r\n" + body)
    assert raw(server, head).startswith(b"HTTP/1.1 400")
    assert server.runner.calls == []


def _broken(mutate):
    doc = payload()
    mutate(doc)
    return doc


BAD = [
    (b"{not json", "body is not JSON"),
    (b"\xff\xfe", "body is not JSON"),
    (b"[" * 3000 + b"]" * 3000, "body is not JSON"),  # deeper than Python's recursion limit
    (b'{"version": ' + b"9" * 5000 + b"}", "body is not JSON"),  # more digits than Python converts
    (payload(alertname="Bad\ud800"), "body is not JSON"),  # a lone surrogate: it decodes, but encodes nowhere
    ([], "expected a JSON object"),
    (_broken(lambda d: d.update(version="3")), 'version: expected "4"'),
    (_broken(lambda d: d.update(version=4)), 'version: expected "4"'),
    (_broken(lambda d: d.update(status="pending")), "status: expected firing or resolved"),
    (_broken(lambda d: d.update(alerts=[])), "alerts: expected a non-empty array"),
    (_broken(lambda d: d["alerts"][0].pop("fingerprint")), "alerts[0]: missing fingerprint"),
    (_broken(lambda d: d["alerts"][0].pop("endsAt")), "alerts[0]: missing endsAt"),
    (_broken(lambda d: d["alerts"][0].update(status="unknown")), "alerts[0].status"),
    (_broken(lambda d: d["alerts"][0].update(startsAt="yesterday")), "alerts[0].startsAt: expected an RFC 3339 time"),
    (_broken(lambda d: d["alerts"][0].update(startsAt=11)), "alerts[0].startsAt: expected an RFC 3339 time string"),
    # Alertmanager writes every time with its zone: a date alone or a clock without one is not read as UTC
    (_broken(lambda d: d["alerts"][0].update(startsAt="2026-01-01")), "alerts[0].startsAt: '2026-01-01' has no zone"),
    (_broken(lambda d: d["alerts"][0].update(endsAt="2026-01-01T12:30:00")),
     "alerts[0].endsAt: '2026-01-01T12:30:00' has no zone"),
    (_broken(lambda d: d["alerts"][0].update(startsAt="0001-01-01T00:00:00+01:00")),
     "alerts[0].startsAt: '0001-01-01T00:00:00+01:00' is outside the years 1 to 9999 in UTC"),
    (_broken(lambda d: d["alerts"][0].update(fingerprint="../../x")), "alerts[0].fingerprint"),
    (_broken(lambda d: d["alerts"][0]["labels"].update(node=3)), "alerts[0].labels.node: expected a string"),
    (_broken(lambda d: d["alerts"][0]["labels"].pop("alertname")), "alerts[0].labels: missing alertname"),
    (_broken(lambda d: d["alerts"][0]["labels"].update({"bad name": "x"})), "alerts[0].labels: invalid name"),
    (_broken(lambda d: d["alerts"][0].update(annotations=[])), "alerts[0].annotations: expected an object"),
]


@pytest.mark.parametrize("body, reason", BAD, ids=[r for _, r in BAD])
def test_invalid_payloads_400_with_the_reason(server, body, reason):
    status, answer, _ = post(server, body if isinstance(body, bytes) else json.dumps(body).encode())
    assert status == 400 and reason in answer["error"], answer
    assert server.runner.calls == []


def test_acts_once_per_alert_and_resolved_closes_it(server, tmp_path):
    status, body, _ = post(server, payload())
    assert status == 200 and body["results"][0]["decision"] == "executed"
    status, body, _ = post(server, payload())  # Alertmanager re-sends the group: nothing more happens
    assert status == 200 and body["results"][0]["decision"] == "duplicate"
    status, body, _ = post(server, payload(status="resolved"))
    assert status == 200 and body["results"][0]["decision"] == "executed"
    assert body["results"][0]["action"] == "nft_drain_backend.undo"
    assert [c[0][1] for c in server.runner.calls] == ["delete", "add"]
    # an injection in a label is refused with 200: Alertmanager must not retry it
    status, body, _ = post(server, payload(fp="0123", node="gpu-node-3; reboot"))
    assert status == 200 and body["results"][0]["decision"] == "refused" and len(server.runner.calls) == 2


def test_503_only_while_the_audit_store_is_busy(server, tmp_path):
    db = tmp_path / "audit.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('held', flush=True); sys.stdin.read()"),
        str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        status, body, headers = post(server, payload())
        assert status == 503 and "retry" in body["error"] and headers.get("Retry-After") == "5"
        assert server.runner.calls == []  # nothing acted on
    finally:
        holder.stdin.close()
        holder.wait(10)
    status, body, _ = post(server, payload())  # Alertmanager's retry goes through, once
    assert status == 200 and body["results"][0]["decision"] == "executed" and len(server.runner.calls) == 1


def test_validate_payload_accepts_alertmanager_v4():
    assert validate_payload(payload())[0]["fingerprint"] == "0a1b2c3d4e5f6789"


def test_token_from_file_or_environment_never_short(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN.decode() + "\n")
    path.chmod(0o600)
    assert load_token(path) == TOKEN
    assert load_token(None, env={TOKEN_ENV: TOKEN.decode()}) == TOKEN
    with pytest.raises(TokenError, match="no token"):
        load_token(None, env={})
    path.write_text("short\n")
    with pytest.raises(TokenError, match="at least 16"):
        load_token(path)
    path.write_text("jeton-secret-très-long\n")
    with pytest.raises(TokenError, match="must be ASCII"):
        load_token(path)


def test_webhook_command_serves_and_refuses_to_start_without_a_token(tmp_path, capsys):
    cfg = tmp_path / "remediation.yaml"
    cfg.write_text(CONFIG.replace("execute: true", "execute: false"))
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    args = ["webhook", "--config", str(cfg), "--db", str(tmp_path / "a.duckdb"), "--listen", "127.0.0.1:0"]
    os.environ.pop(TOKEN_ENV, None)
    assert main(args) == 2 and "no token" in capsys.readouterr().err
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN.decode())
    token_file.chmod(0o600)
    root = Path(__file__).parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", *args, "--token-file", str(token_file)],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), proc.stderr.read() if not line else line
        host, port = line.split("//")[1].split("/")[0].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.request("POST", "/alerts", body=json.dumps(payload()),
                     headers={"Authorization": "Bearer " + TOKEN.decode(), "Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["results"][0]["decision"] == "dry_run"
        assert TOKEN.decode() not in " ".join(proc.args)  # the token never is a command-line value
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_webhook_command_listens_on_ipv6_loopback(tmp_path, ipv6_loopback):
    """The URL it prints is one a client can use: the IPv6 host in brackets."""
    cfg, token, db = tmp_path / "remediation.yaml", tmp_path / "token", tmp_path / "a.duckdb"
    cfg.write_text(CONFIG.replace("execute: true", "execute: false"))
    token.write_text(TOKEN.decode())
    token.chmod(0o600)
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "webhook", "--config", str(cfg), "--db",
                             str(db), "--token-file", str(token), "--listen", f"[{ipv6_loopback}]:0"],
                            cwd=Path(__file__).parents[2], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        listening = re.fullmatch(r"listening on http://\[::1\]:(\d+)/alerts\n", line)
        assert listening, proc.stderr.read() if not line else line
        conn = http.client.HTTPConnection(ipv6_loopback, int(listening[1]), timeout=5)
        conn.request("POST", "/alerts", body=json.dumps(payload()),
                     headers={"Authorization": "Bearer " + TOKEN.decode(), "Content-Type": "application/json"})
        assert json.loads(conn.getresponse().read())["results"][0]["decision"] == "dry_run"
        conn.close()
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
    assert audit(db, "decision, client") == [("dry_run", "::1")]


def test_slow_senders_are_cut_off_and_cannot_take_every_connection(server, monkeypatch):
    """Headers a byte at a time are cut off at one deadline for all of them, and the connections such clients
    hold are capped: Alertmanager's next notification is still answered."""
    import sloscope.alerts.webhook as webhook

    monkeypatch.setattr(webhook, "HEADER_TIMEOUT_S", 1.0)
    slow = [socket.create_connection(server.server_address[:2], timeout=5) for _ in range(webhook.MAX_CONNECTIONS)]
    try:
        for s in slow:
            s.sendall(b"POST /alerts HTTP/1.1\r\n")
        started = time.monotonic()
        for _ in range(4):  # still sending: a byte every half second, each within the old per-read timeout
            time.sleep(0.5)
            for s in slow:
                try:
                    s.sendall(b"X")
                except OSError:
                    pass
        status, body, _ = post(server, payload())
        assert status == 200 and body["results"][0]["decision"] == "executed"
        assert time.monotonic() - started < 8
        for s in slow:  # every slow client was closed at its header deadline
            s.settimeout(2)
            try:
                assert s.recv(4096) == b""
            except ConnectionResetError:
                pass
    finally:
        for s in slow:
            s.close()


def audit(db, columns="alert, fingerprint, decision, reason, client, dry_run"):
    with duckdb.connect(str(db)) as con:
        return con.execute(f"SELECT {columns} FROM remediation_audit ORDER BY ts, rowid").fetchall()


def unauthenticated_count(rows) -> int:
    return sum(int(reason.split()[0]) for alert, _, _, reason, *_ in rows if alert == "(unauthenticated)")


def test_a_decision_is_audited_with_the_client_address_and_dry_run(server):
    assert post(server, payload())[1]["results"][0]["decision"] == "executed"
    [row] = audit(server.db, "alert, decision, client, dry_run")
    assert row == ("SloscopeGpuSaturated", "executed", "127.0.0.1", False)


def test_unauthenticated_requests_of_the_last_period_are_audited_when_the_server_stops(server):
    for _ in range(5):  # well within one audit period: the first is written at once, the others wait
        assert post(server, payload(), token=None)[0] == 401
    assert unauthenticated_count(audit(server.db)) == 1
    server.drain()
    rows = audit(server.db)
    assert unauthenticated_count(rows) == 5
    assert {(decision, client, fingerprint) for _, fingerprint, decision, _, client, _ in rows} == {
        ("refused", "127.0.0.1", "")}


@pytest.mark.parametrize("command", ["webhook", "serve"])
def test_both_webhook_commands_audit_every_unauthenticated_request_before_they_exit(tmp_path, command):
    cfg, token, db, port = tmp_path / "remediation.yaml", tmp_path / "token", tmp_path / "a.duckdb", free_port()
    cfg.write_text(CONFIG.replace("execute: true", "execute: false"))
    token.write_text(TOKEN.decode())
    token.chmod(0o600)
    argv = {"webhook": ["webhook", "--config", str(cfg), "--token-file", str(token), "--listen", f"127.0.0.1:{port}"],
            "serve": ["serve", "--http", "off", "--grpc", "off", "--decode-workers", "0", "--webhook",
                      f"127.0.0.1:{port}", "--remediation", str(cfg), "--webhook-token-file", str(token)]}[command]
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", *argv, "--db", str(db)],
                            cwd=Path(__file__).parents[2], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_listening(port, proc, f"sloscope {command}")
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("POST", "/alerts", body=b"{}", headers={"Content-Type": "application/json"})
            assert conn.getresponse().status == 401
            conn.close()
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    rows = audit(db)
    assert unauthenticated_count(rows) == 3 and {row[4] for row in rows} == {"127.0.0.1"}
    assert {row[5] for row in rows} == {True}  # execute: false


def oversized(**common):
    doc = payload()
    doc["alerts"] = [{}] * (MAX_ALERTS + 1)  # refused on the count, before any alert is looked at
    doc["commonLabels"] = common
    return doc


def test_a_group_over_max_alerts_is_refused_whole_and_audited_once(server):
    status, body, _ = post(server, oversized(alertname="SloscopeGpuSaturated"))
    assert status == 400 and body == {"error": f"alerts: more than {MAX_ALERTS}"}
    [(alert, fingerprint, decision, reason, client, dry_run)] = audit(server.db)
    assert (alert, fingerprint, decision, client, dry_run) == ("SloscopeGpuSaturated", "", "refused", "127.0.0.1",
                                                               False)
    assert reason.startswith(f"{MAX_ALERTS + 1} alerts in one notification, more than {MAX_ALERTS}: refused whole")
    assert server.runner.calls == []


def test_what_an_oversized_group_says_of_itself_reaches_the_audit_checked(server):
    doc = oversized(alertname="Gpu\nSaturated\u001b[2J")
    doc["groupKey"] = "{}:{node=\"x\"}\nremediation executed: alert=Forged " + "y" * 500
    assert post(server, doc)[0] == 400
    [(alert, _, decision, reason, _, _)] = audit(server.db)
    assert (alert, decision) == ("(group)", "refused")  # not a name an allow-list could hold
    assert "\n" not in reason and "\x1b" not in reason and "y" * 100 not in reason
    assert "\\nremediation executed" in reason  # quoted, escaped and cut short


def test_an_oversized_group_is_503_while_its_refusal_cannot_be_audited(server):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('held', flush=True); sys.stdin.read()"),
        str(server.db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert post(server, oversized())[0] == 503
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert post(server, oversized())[0] == 400  # Alertmanager's retry: refused, and now audited
    assert [row[:3] for row in audit(server.db)] == [("(group)", "", "refused")]

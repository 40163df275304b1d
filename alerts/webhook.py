"""Alertmanager webhook receiver (payload version 4) feeding the remediation engine.

`WebhookApp.respond(method, path, headers, read_body)` is the whole protocol, independent of an HTTP server, so
that it can be mounted in another server; `WebhookServer` serves it with the edge's connection limits, as the OTLP
receiver does (edge/http_conn.py: a deadline per request phase, a cap on connections), on 127.0.0.1 by default.

Per request, in this order:
1. `GET /-/healthy`: 200, no authentication (for liveness probes); nothing else is served without a token.
2. `Authorization: Bearer <token>`, checked as the OTLP receiver checks it (edge/auth.py: in constant time; the
   challenge says whether the token was missing or wrong, RFC 6750). Missing or wrong: 401, and
   the body is never read (the connection is closed; the server only discards up to 64 KiB of what is still
   in flight, for at most a second, so that the client sees the 401 instead of a connection reset).
3. Only `POST` on the configured path (405 / 404); `Content-Length` required (411), at most `max_body`
   bytes (413, body not read); `Content-Type: application/json` when given (415).
4. The payload is checked against Alertmanager's version 4 schema: 400 with the reason when it does not match.
   A group of more than MAX_ALERTS alerts is refused whole (400: Alertmanager does not retry a 4xx, and the group
   would never fit) and audited as a refused decision.
5. The alerts go to the engine: 200 with one result per alert. 503 only when the audit store is busy (a
   transient failure, so Alertmanager retries; what was already handled is not redone, as the engine acts
   once per (fingerprint, startsAt)). 500 for an unexpected error.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import stat
import threading
import time
from io import BufferedReader
from pathlib import Path
from typing import Callable

from sloscope.alerts.actions import shown
from sloscope.alerts.audit import Transient
from sloscope.alerts.remediation import Engine
from sloscope.alerts.remediation_config import ALERT_NAME
from sloscope.edge.auth import BearerAuth
from sloscope.edge.draining import DRAIN_GRACE_S, KeepAliveHandler
from sloscope.edge.http_body import plain_length
from sloscope.edge.http_conn import ConnectionCaps, DeadlineReader, LimitedHTTPServer
from sloscope.times import parse_rfc3339

log = logging.getLogger("sloscope.webhook")

TOKEN_ENV = "SLOSCOPE_WEBHOOK_TOKEN"
MIN_TOKEN_LENGTH = 16
DEFAULT_PATH = "/alerts"
DEFAULT_MAX_BODY = 1 << 20
MAX_ALERTS = 1000
MAX_LABELS = 64
MAX_LABEL_VALUE = 1024
MAX_ANNOTATION_VALUE = 16384
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,127}", re.ASCII)
FINGERPRINT = re.compile(r"[0-9a-f]{1,64}", re.ASCII)
STATUSES = ("firing", "resolved")
LINGER_BYTES = 65536
PEER_BUSY = "as many requests from this address in progress as the webhook takes; retry later"
LINGER_S = 1.0
# Each phase of a request has one deadline for all its reads (a client sending a byte every few seconds would
# otherwise hold its connection for ever), and connections are capped as the OTLP receiver's are
# (edge/http_conn.py): Alertmanager sends a group at a time, a few at once, from an address or three (its cluster),
# so half the connections and a quarter in requests per address leave room for it beside any one other address.
HEADER_TIMEOUT_S, BODY_TIMEOUT_S, IDLE_TIMEOUT_S = 10.0, 10.0, 60.0
MAX_HEADER_BYTES = 65536
MAX_CONNECTIONS = 64
CAPS = ConnectionCaps(connections=MAX_CONNECTIONS, per_peer=MAX_CONNECTIONS // 2,
                      inflight_per_peer=MAX_CONNECTIONS // 4)


class PayloadError(ValueError):
    pass


class GroupTooLarge(PayloadError):
    def __init__(self, count: int):
        super().__init__(f"alerts: more than {MAX_ALERTS}")
        self.count = count


class TokenError(ValueError):
    pass


def load_token(token_file: str | Path | None = None, env: dict | None = None, env_name: str = TOKEN_ENV) -> bytes:
    """The bearer token: the first line of `token_file`, else the variable `env_name` (by default
    $SLOSCOPE_WEBHOOK_TOKEN). Never a
    command-line value (which `ps` would show)."""
    env = os.environ if env is None else env
    if token_file is not None:
        path = Path(token_file)
        try:
            text = path.read_text()
            mode = path.stat().st_mode
        except OSError as exc:
            raise TokenError(f"{path}: cannot read the token file: {exc.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("%s: token file is readable by group or others; chmod 600 it", path)
        token, where = (text.splitlines() or [""])[0].strip(), str(path)
    else:
        token, where = env.get(env_name, "").strip(), f"${env_name}"
        if not token:
            raise TokenError(f"no token: give --token-file or set {env_name}")
    if len(token) < MIN_TOKEN_LENGTH:
        raise TokenError(f"{where}: the token must have at least {MIN_TOKEN_LENGTH} characters")
    if not token.isascii():  # an HTTP header carries it, and compare_digest takes ASCII only
        raise TokenError(f"{where}: the token must be ASCII text")
    return token.encode()


# --- schema ----------------------------------------------------------------------------------------------------------

def _string_map(value, where: str, max_value: int, limit: int | None) -> dict:
    if not isinstance(value, dict):
        raise PayloadError(f"{where}: expected an object of strings")
    if limit is not None and len(value) > limit:
        raise PayloadError(f"{where}: more than {limit} entries")
    for k, v in value.items():
        if not LABEL_NAME.fullmatch(k):
            raise PayloadError(f"{where}: invalid name {k[:40]!r}")
        if not isinstance(v, str):
            raise PayloadError(f"{where}.{k}: expected a string")
        if len(v) > max_value:
            raise PayloadError(f"{where}.{k}: longer than {max_value} characters")
    return value


def _time(value, where: str) -> None:
    """Alertmanager writes every time with its zone (Go's RFC 3339, nanoseconds included; a firing alert's endsAt
    is 0001-01-01T00:00:00Z): a time without one is refused, not read as UTC."""
    if not isinstance(value, str):
        raise PayloadError(f"{where}: expected an RFC 3339 time string")
    try:
        parse_rfc3339(value, where, zone_required=True)
    except ValueError as exc:
        raise PayloadError(str(exc)) from None


def validate_payload(doc) -> list[dict]:
    """The alerts of an Alertmanager webhook payload (version 4), or PayloadError saying what is wrong."""
    if not isinstance(doc, dict):
        raise PayloadError("payload: expected a JSON object")
    if doc.get("version") != "4":
        raise PayloadError(f"version: expected \"4\"; got {json.dumps(doc.get('version'))[:20]}")
    if doc.get("status") not in STATUSES:
        raise PayloadError(f"status: expected firing or resolved; got {json.dumps(doc.get('status'))[:40]}")
    alerts = doc.get("alerts")
    if not isinstance(alerts, list) or not alerts:
        raise PayloadError("alerts: expected a non-empty array")
    if len(alerts) > MAX_ALERTS:
        raise GroupTooLarge(len(alerts))
    for i, alert in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(alert, dict):
            raise PayloadError(f"{where}: expected an object")
        for key in ("status", "labels", "annotations", "startsAt", "endsAt", "fingerprint"):
            if key not in alert:
                raise PayloadError(f"{where}: missing {key}")
        if alert["status"] not in STATUSES:
            raise PayloadError(f"{where}.status: expected firing or resolved")
        labels = _string_map(alert["labels"], f"{where}.labels", MAX_LABEL_VALUE, MAX_LABELS)
        if not labels.get("alertname"):
            raise PayloadError(f"{where}.labels: missing alertname")
        _string_map(alert["annotations"], f"{where}.annotations", MAX_ANNOTATION_VALUE, MAX_LABELS)
        _time(alert["startsAt"], f"{where}.startsAt")
        _time(alert["endsAt"], f"{where}.endsAt")
        if not isinstance(alert["fingerprint"], str) or not FINGERPRINT.fullmatch(alert["fingerprint"]):
            raise PayloadError(f"{where}.fingerprint: expected lower-case hex")
    return alerts


# --- the protocol ----------------------------------------------------------------------------------------------------

UNAUTHENTICATED_AUDIT_EVERY_S = 5.0
CLIENTS_PER_AUDIT_LINE = 8


class _UnauthenticatedBatch:
    """Requests refused for their token and not yet audited: how many, and from which addresses (the first few
    only, so that a flood from many addresses cannot grow it)."""

    def __init__(self):
        self.count = 0
        self.clients: dict[str, None] = {}  # an ordered set
        self.more_clients = False

    def add(self, client: str | None) -> None:
        self.count += 1
        if client is None or client in self.clients:
            return
        if len(self.clients) < CLIENTS_PER_AUDIT_LINE:
            self.clients[client] = None
        else:
            self.more_clients = True

    def client_text(self) -> str | None:
        if not self.clients:
            return None
        return ", ".join(self.clients) + (", ..." if self.more_clients else "")


def _group_alert_name(doc: dict) -> str:
    """The name an oversized group is audited under: the alert name its alerts share, where it is one that an
    allow-list could hold; '(group)' otherwise, since none of its alerts was validated."""
    common = doc.get("commonLabels")
    name = common.get("alertname") if isinstance(common, dict) else None
    return name if isinstance(name, str) and ALERT_NAME.fullmatch(name) else "(group)"


class WebhookApp:
    def __init__(self, engine: Engine, token: bytes, path: str = DEFAULT_PATH, max_body: int = DEFAULT_MAX_BODY):
        if len(token) < MIN_TOKEN_LENGTH:
            raise TokenError(f"the token must have at least {MIN_TOKEN_LENGTH} characters")
        self.engine = engine
        self._auth = BearerAuth(token)
        self.path = path
        self.max_body = max_body
        self._unaudited = _UnauthenticatedBatch()  # written at most every few s, and when the server stops
        self._last_audit = float("-inf")
        self._unaudited_lock = threading.Lock()  # connection threads refuse requests at once

    def _refused_unauthenticated(self, client: str | None) -> None:
        """Count, and audit in batches so that a flood of bad requests cannot flood the audit table."""
        with self._unaudited_lock:
            self._unaudited.add(client)
            now = time.monotonic()
            if now - self._last_audit < UNAUTHENTICATED_AUDIT_EVERY_S:
                return
            batch, self._unaudited, self._last_audit = self._unaudited, _UnauthenticatedBatch(), now
        self.engine.record_unauthenticated(batch.count, batch.client_text())

    def flush_unauthenticated(self) -> None:
        """Audit the refused requests still counted: for when the server has stopped, which would lose them."""
        with self._unaudited_lock:
            batch, self._unaudited = self._unaudited, _UnauthenticatedBatch()
        if batch.count:
            self.engine.record_unauthenticated(batch.count, batch.client_text())

    def respond(self, method: str, path: str, headers, read_body: Callable[[int], bytes],
                client: str | None = None) -> tuple[int, dict, dict]:
        """(status, extra headers, JSON body). `headers` is a case-insensitive mapping (get); `read_body(n)`
        reads n bytes of the body and is called only for an authenticated request of acceptable size; `client`
        is the address the request came from, for the audit. A response carrying `Connection: close` left the
        body unread."""
        route = path.split("?", 1)[0]
        if method == "GET" and route == "/-/healthy":
            return 200, {}, {"status": "ok"}
        challenge = self._auth.check(headers.get("Authorization"))
        if challenge is not None:
            self._refused_unauthenticated(client)
            return 401, {"WWW-Authenticate": challenge, "Connection": "close"}, {"error": "unauthorized"}
        close = {"Connection": "close"}
        if route != self.path:
            return 404, close, {"error": f"not found; alerts are posted to {self.path}"}
        if method != "POST":
            return 405, {"Allow": "POST", **close}, {"error": "method not allowed; use POST"}
        if headers.get("Transfer-Encoding"):
            return 411, close, {"error": "send a Content-Length (chunked bodies are not accepted)"}
        length_text = headers.get("Content-Length")
        if length_text is None:
            return 411, close, {"error": "Content-Length required"}
        length = plain_length(length_text)
        if length is None:
            return 400, close, {"error": "invalid Content-Length"}
        if length > self.max_body:
            return 413, close, {"error": f"body larger than {self.max_body} bytes"}
        ctype = (headers.get("Content-Type") or "application/json").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            return 415, close, {"error": "Content-Type must be application/json"}
        body = read_body(length)
        if len(body) != length:
            return 400, close, {"error": "body shorter than Content-Length"}
        try:
            doc = json.loads(body)
            # A lone surrogate (\ud800) decodes, but neither the audit store nor a log line can encode it.
            json.dumps(doc, ensure_ascii=False).encode()
        except (ValueError, RecursionError) as exc:  # ValueError: bad UTF-8 or JSON, an integer of 4,300+ digits
            return 400, {}, {"error": f"body is not JSON that can be read: {str(exc)[:200]}"}
        try:
            alerts = validate_payload(doc)
        except GroupTooLarge as exc:
            return self._refuse_group(doc, exc, client)
        except PayloadError as exc:
            return 400, {}, {"error": str(exc)}
        try:
            results = self.engine.handle(alerts, client)
        except Transient as exc:
            return _retry_later(exc)
        except Exception:
            log.exception("webhook: unexpected error handling %d alert(s)", len(alerts))
            return 500, {}, {"error": "internal error (logged)"}
        return 200, {}, {"results": results}

    def _refuse_group(self, doc: dict, exc: GroupTooLarge, client: str | None) -> tuple[int, dict, dict]:
        reason = (f"{exc.count} alerts in one notification, more than {MAX_ALERTS}: refused whole (set max_alerts: "
                  f"{MAX_ALERTS} in Alertmanager's webhook_config); group {shown(doc.get('groupKey'))}")
        try:
            self.engine.record_refused_request(_group_alert_name(doc), reason, client)
        except Transient as why:  # the refusal is a decision too: not answered before it is audited
            return _retry_later(why)
        return 400, {}, {"error": str(exc)}


def _retry_later(exc: Transient) -> tuple[int, dict, dict]:
    log.warning("webhook: %s; answering 503 so that Alertmanager retries", exc)
    return 503, {"Retry-After": "5"}, {"error": f"temporarily unavailable, retry: {exc}"}


class _Handler(KeepAliveHandler):
    server: "WebhookServer"
    server_version = "sloscope-webhook"
    sys_version = ""

    def setup(self):
        super().setup()
        self.rfile.close()  # reads go through the phase deadlines instead
        self.reader = DeadlineReader(self.connection, self.server.cut_off)
        self.rfile = BufferedReader(self.reader)

    def start_request(self) -> None:
        self.reader.expect("header", HEADER_TIMEOUT_S, MAX_HEADER_BYTES)

    def start_idle(self) -> None:
        self.reader.expect("idle", IDLE_TIMEOUT_S)

    def _read(self, n: int) -> bytes:
        self.reader.expect("body", BODY_TIMEOUT_S)
        try:
            return self.rfile.read(n)
        except OSError:  # includes the deadline: a short body, answered with 400
            return b""

    def _handle(self):
        if self.peer_busy:  # the body is left unread: the connection closes, and the client holds one fewer
            status, headers, body = 503, {"Retry-After": "5", "Connection": "close"}, {"error": PEER_BUSY}
        else:
            status, headers, body = self.server.app.respond(self.command, self.path, self.headers, self._read,
                                                            self.client_address[0])
        data = json.dumps(body).encode() + b"\n"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        if headers.get("Connection") == "close":
            self.close_connection = True
            self._linger()

    def _linger(self):
        """After answering without reading the body: stop sending, then discard (never parse) what the client
        still sends, at most LINGER_BYTES for LINGER_S, so that closing does not reset the connection before
        the client has read the answer (a reset would hide the 401 or 413 from it)."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + LINGER_S
            left = LINGER_BYTES
            while left > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.connection.settimeout(remaining)
                chunk = self.connection.recv(min(left, 16384))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

    def log_message(self, fmt, *args):  # requests go to the module logger, not stderr
        log.debug("%s %s", self.address_string(), fmt % args)


class WebhookServer(LimitedHTTPServer):

    def __init__(self, address: tuple[str, int], app: WebhookApp, caps: ConnectionCaps = CAPS):
        self.app = app
        super().__init__(address, _Handler, caps, self.cut_off)

    def drain(self, grace_s: float = DRAIN_GRACE_S) -> None:
        """Stops serving (edge/draining.py), then audits the unauthenticated requests of the last period, which
        no later request would write: both `sloscope webhook` and serve's webhook stop here."""
        super().drain(grace_s)
        self.app.flush_unauthenticated()

    def cut_off(self, why: str) -> None:
        """A connection closed for a deadline or a size passed, closed or refused at the connection caps
        (edge/http_conn.py), or held back at the cap in all."""
        if why not in ("idle_timeout", "http_connections_shed"):  # idle connections close as a matter of course
            log.info("webhook: %s", why.replace("_", " "))

    def handle_error(self, request, client_address):  # a client that went away is not worth a traceback
        log.debug("webhook: connection from %s failed", client_address, exc_info=True)


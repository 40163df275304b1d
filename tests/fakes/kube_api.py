"""A Kubernetes API server stand-in for pods, on 127.0.0.1, speaking the documented list/watch protocol
(kubernetes.io/docs/reference/using-api/api-concepts: efficient detection of changes, retrieving large results in
chunks, watch bookmarks):

- GET /api/v1/pods?limit=N[&continue=TOKEN]: a PodList {"kind", "apiVersion", "metadata": {"resourceVersion",
  "continue"}, "items"}, paginated; the list's resourceVersion is the cluster's current one.
- GET /api/v1/pods?watch=1&resourceVersion=RV[&allowWatchBookmarks=true][&timeoutSeconds=S]: a chunked stream
  of JSON lines {"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object"} for every change after RV, for S
  seconds. Where RV is older than the history kept (`compact()`), the answer is 410 Gone: as an HTTP status
  (`gone_as="status"`) or as the watch cache sends it, 200 and an ERROR event with a Status object of code 410
  (`gone_as="event"`).
- every pod object carries metadata.uid, name, namespace, resourceVersion, creationTimestamp, spec.nodeName,
  spec.hostNetwork and status.podIP / phase, as the API writes them.

Test controls: add_pod, update_pod, delete_pod, bookmark, compact (forget history), end_watches (the server closes
every open watch, as on an API server restart), `requests` (the paths and queries asked for) and `open_watches`.
Misbehaviours of real servers and the proxies in front of them: `empty_watches` (a watch ends at once with nothing
in it), `continue_expires` (a continue token is always too old: 410, as the API answers one past its etcd
compaction), `throttle(n, retry_after)` (the next n requests are 429 with Retry-After, as API Priority and Fairness
answers)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


def pod_object(name: str, namespace: str, node: str | None, ip: str | None, created: datetime | None = None,
               host_network: bool = False, phase: str = "Running") -> dict:
    created = created or datetime.now(timezone.utc)
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                         "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                         "labels": {"app": name.rsplit("-", 1)[0]}},
            "spec": {"nodeName": node, "hostNetwork": host_network, "containers": [{"name": "main", "image": "x"}]},
            "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}] if ip else []}}


class FakeKubeApi:
    def __init__(self, page_size_limit: int = 1000, gone_as: str = "event"):
        self.page_size_limit, self.gone_as = page_size_limit, gone_as
        self.version = 100
        self.pods: dict[str, dict] = {}  # by uid
        self.history: list[tuple[int, int, str, dict]] = []  # (sequence, resourceVersion, type, object)
        self._sequence = 0
        self.oldest = self.version  # a watch from before this version is Gone
        self.requests: list[str] = []
        self._changed = threading.Condition()
        self._epoch = 0  # end_watches() bumps it; open watches see it and end
        self.open_watches = 0
        self.empty_watches = self.continue_expires = False
        self._throttled, self._retry_after = 0, 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.end_watches()
        self.server.shutdown()
        self.server.server_close()

    # --- cluster changes ----------------------------------------------------------------------------------

    def _record(self, kind: str, pod: dict) -> None:
        with self._changed:
            self.version += 1
            pod["metadata"]["resourceVersion"] = str(self.version)
            self._append(self.version, kind, json.loads(json.dumps(pod)))

    def _append(self, version: int, kind: str, obj: dict) -> None:
        self._sequence += 1
        self.history.append((self._sequence, version, kind, obj))
        self._changed.notify_all()

    def add_pod(self, name: str, namespace: str, node: str | None, ip: str | None, **kw) -> dict:
        pod = pod_object(name, namespace, node, ip, **kw)
        self.pods[pod["metadata"]["uid"]] = pod
        self._record("ADDED", pod)
        return pod

    def update_pod(self, pod: dict, **status) -> None:
        pod["status"].update(status)
        self._record("MODIFIED", pod)

    def delete_pod(self, pod: dict) -> None:
        del self.pods[pod["metadata"]["uid"]]
        self._record("DELETED", pod)

    def bookmark(self) -> None:
        with self._changed:
            self._append(self.version, "BOOKMARK", {"kind": "Pod", "apiVersion": "v1",
                                                    "metadata": {"resourceVersion": str(self.version)}})

    def compact(self) -> None:
        """Forget the history, as etcd compaction does: a watch from any version seen so far is now Gone (open
        watches end, as the API server drops them)."""
        with self._changed:
            self.history.clear()
            self.version += 1  # resource versions are the cluster's: other objects changed meanwhile
            self.oldest = self.version
            self._epoch += 1
            self._changed.notify_all()

    def throttle(self, requests: int, retry_after: int) -> None:
        self._throttled, self._retry_after = requests, retry_after

    def end_watches(self) -> None:
        with self._changed:
            self._epoch += 1
            self._changed.notify_all()

    # --- HTTP ---------------------------------------------------------------------------------------------

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802 - http.server's naming
                parts = urlsplit(self.path)
                api.requests.append(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                if parts.path != "/api/v1/pods":
                    return self._json(404, _status(404, "NotFound", f"{parts.path} not found"))
                if api._throttled:
                    api._throttled -= 1
                    return self._json(429, _status(429, "TooManyRequests", "too many requests, retry later"),
                                      {"Retry-After": str(api._retry_after)})
                if query.get("watch") in ("1", "true"):
                    return self._watch(query)
                return self._list(query)

            def _json(self, code: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _list(self, query: dict) -> None:
                with api._changed:
                    items = sorted(api.pods.values(), key=lambda p: p["metadata"]["uid"])
                    version = api.version
                if "continue" in query and api.continue_expires:
                    return self._json(410, _status(410, "Expired", "The provided continue parameter is too old"))
                # Without a limit the API answers every item at once; with one, at most the server's page size.
                limit = min(int(query["limit"]), api.page_size_limit) if "limit" in query else len(items)
                start = int(query.get("continue") or 0)
                page, more = items[start:start + limit], start + limit < len(items)
                self._json(200, {"kind": "PodList", "apiVersion": "v1",
                                 "metadata": {"resourceVersion": str(version),
                                              **({"continue": str(start + limit)} if more else {})},
                                 "items": page})

            def _watch(self, query: dict) -> None:
                since = int(query.get("resourceVersion") or api.version)
                bookmarks = query.get("allowWatchBookmarks") == "true"
                timeout = float(query.get("timeoutSeconds", 1800))
                if since < api.oldest and api.gone_as == "status":
                    return self._json(410, _status(410, "Expired", f"too old resource version: {since}"))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if since < api.oldest:
                    self._chunk({"type": "ERROR", "object": _status(410, "Expired",
                                                                  f"too old resource version: {since}")})
                    return self._chunk(None)
                if api.empty_watches:
                    return self._chunk(None)
                self._stream(since, bookmarks, timeout)

            def _stream(self, since: int, bookmarks: bool, timeout: float) -> None:
                """Every change after `since`, then whatever happens until the timeout or end_watches()."""
                with api._changed:
                    epoch, started, sent = api._epoch, api._sequence, 0
                    api.open_watches += 1
                deadline = time.monotonic() + timeout
                try:
                    while time.monotonic() < deadline:
                        with api._changed:
                            if api._epoch != epoch or since < api.oldest:
                                break
                            news = [e for e in api.history if e[0] > sent and (e[0] > started or e[1] > since)
                                    and (bookmarks or e[2] != "BOOKMARK")]
                            if not news:
                                api._changed.wait(min(0.5, max(deadline - time.monotonic(), 0)))
                                continue
                        for sequence, _version, kind, obj in news:
                            self._chunk({"type": kind, "object": obj})
                            sent = sequence
                    self._chunk(None)
                except OSError:
                    pass
                finally:
                    with api._changed:
                        api.open_watches -= 1

            def _chunk(self, event: dict | None) -> None:
                data = b"" if event is None else json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        return Handler


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}

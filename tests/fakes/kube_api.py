"""A Kubernetes API server stand-in for pods, on 127.0.0.1, speaking the documented list/watch protocol
(kubernetes.io/docs/reference/using-api/api-concepts: efficient detection of changes, retrieving large results in
chunks, watch bookmarks, streaming lists):

- GET /api/v1/pods?limit=N[&continue=TOKEN]: a PodList {"kind", "apiVersion", "metadata": {"resourceVersion",
  "continue"}, "items"}, paginated; the list's resourceVersion is the cluster's current one.
- GET /api/v1/pods?watch=1&resourceVersion=RV[&allowWatchBookmarks=true][&timeoutSeconds=S]: a chunked stream
  of JSON lines {"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object"} for every change after RV, for S
  seconds. Where RV is older than the history kept (`compact()`), the answer is 410 Gone: as an HTTP status
  (`gone_as="status"`) or as the watch cache sends it, 200 and an ERROR event with a Status object of code 410
  (`gone_as="event"`). Without a resourceVersion (or with "0") the watch begins with an ADDED event for every pod.
- GET /api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true: a
  streaming list (`watch_list="on"`, the WatchList feature gate on): an ADDED event for every pod, changes made
  meanwhile, then a BOOKMARK at the current version annotated {"k8s.io/initial-events-end": "true"}, then the
  watch goes on. The options are validated as the API server does (apimachinery's validateWatchOptions):
  sendInitialEvents without resourceVersionMatch=NotOlderThan, or resourceVersionMatch without sendInitialEvents,
  is a 422 Invalid Status; with the gate off (`watch_list="off"`) sendInitialEvents is too (servers 1.19 to 1.26
  refuse resourceVersionMatch on any watch alike). `watch_list="ignored"`: a server or proxy that drops both
  parameters (an ordinary watch: with no resourceVersion, ADDED events and never the end bookmark).
- every pod object carries metadata.uid, name, namespace, resourceVersion, creationTimestamp, spec.nodeName,
  spec.hostNetwork and status.podIP / phase, as the API writes them.

Test controls: add_pod, update_pod, delete_pod, bookmark, compact (forget history; open watches end, or with
`in_stream` first get an ERROR event of code 410), end_watches (the server closes every open watch, as on an API
server restart), `initial_events_end_held` and release_initial_events_end (a streaming list's end bookmark waits,
as while the watch cache catches up with the version asked for), `requests` (the paths and queries asked for) and
`open_watches` (counted once a watch has taken the pods of its initial events).
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
    def __init__(self, page_size_limit: int = 1000, gone_as: str = "event", watch_list: str = "on"):
        assert watch_list in ("on", "off", "ignored")
        self.page_size_limit, self.gone_as, self.watch_list = page_size_limit, gone_as, watch_list
        self.version = 100
        self.pods: dict[str, dict] = {}  # by uid
        self.history: list[tuple[int, int, str, dict]] = []  # (sequence, resourceVersion, type, object)
        self._sequence = 0
        self.oldest = self.version  # a watch from before this version is Gone
        self.requests: list[str] = []
        self._changed = threading.Condition()
        self._epoch = 0  # end_watches() bumps it; open watches see it and end
        self._gone_in_stream = False  # compact(in_stream=True): open watches end with an ERROR event of code 410
        self.initial_events_end_held = False  # release_initial_events_end() lets streaming lists end
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

    def update_pod(self, pod: dict, node: str | None = None, **status) -> None:
        """A change of the pod's status, and of its node where one is given (a pending pod bound to one)."""
        if node is not None:
            pod["spec"]["nodeName"] = node
        pod["status"].update(status)
        self._record("MODIFIED", pod)

    def delete_pod(self, pod: dict) -> None:
        del self.pods[pod["metadata"]["uid"]]
        self._record("DELETED", pod)

    def bookmark(self) -> None:
        with self._changed:
            self._append(self.version, "BOOKMARK", {"kind": "Pod", "apiVersion": "v1",
                                                    "metadata": {"resourceVersion": str(self.version)}})

    def compact(self, in_stream: bool = False) -> None:
        """Forget the history, as etcd compaction does: a watch from any version seen so far is now Gone. Open
        watches end, as the API server drops them; with `in_stream`, each first sends an ERROR event of code 410,
        as a watch served from etcd does when its revision is compacted under it."""
        with self._changed:
            self.history.clear()
            self.version += 1  # resource versions are the cluster's: other objects changed meanwhile
            self.oldest = self.version
            self._epoch += 1
            self._gone_in_stream = in_stream
            self._changed.notify_all()

    def release_initial_events_end(self) -> None:
        with self._changed:
            self.initial_events_end_held = False
            self._changed.notify_all()

    def throttle(self, requests: int, retry_after: int) -> None:
        self._throttled, self._retry_after = requests, retry_after

    def end_watches(self) -> None:
        with self._changed:
            self._epoch += 1
            self._changed.notify_all()

    def _refusal(self, query: dict) -> dict | None:
        """The 422 Invalid Status a watch's streaming-list options are refused with, as the API server validates
        them; None where they pass or are dropped."""
        if self.watch_list == "ignored":
            return None
        causes, send, match = [], query.get("sendInitialEvents"), query.get("resourceVersionMatch")
        if send is not None and match != "NotOlderThan":
            causes.append(("resourceVersionMatch", "sendInitialEvents requires setting resourceVersionMatch to "
                                                   "NotOlderThan"))
        if send is not None and self.watch_list == "off":
            causes.append(("sendInitialEvents", "sendInitialEvents is forbidden for watch unless the WatchList "
                                                "feature gate is enabled"))
        if send is None and match is not None:
            causes.append(("resourceVersionMatch", "resourceVersionMatch is forbidden for watch unless "
                                                   "sendInitialEvents is provided"))
        return _invalid_list_options(causes) if causes else None

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
                refusal = api._refusal(query)
                if refusal:
                    return self._json(422, refusal)
                streams_list = api.watch_list == "on" and query.get("sendInitialEvents") == "true"
                # Without a version, or "0", a watch begins with the state (a streaming list: at least this new).
                initial = streams_list or query.get("resourceVersion", "0") == "0"
                since = None if initial else int(query["resourceVersion"])
                bookmarks = query.get("allowWatchBookmarks") == "true"
                timeout = float(query.get("timeoutSeconds", 1800))
                if since is not None and since < api.oldest and api.gone_as == "status":
                    return self._json(410, _status(410, "Expired", f"too old resource version: {since}"))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if since is not None and since < api.oldest:
                    self._chunk({"type": "ERROR", "object": _status(410, "Expired",
                                                                  f"too old resource version: {since}")})
                    return self._chunk(None)
                if api.empty_watches:
                    return self._chunk(None)
                self._stream(since, bookmarks, timeout, streams_list and bookmarks)

            def _stream(self, since: int | None, bookmarks: bool, timeout: float, ends_initial: bool) -> None:
                """Every pod as an ADDED event where `since` is None (then the version now), every change after
                `since`, the end of the initial events where `ends_initial` (once not held), then whatever happens
                until the timeout, end_watches() or compact()."""
                with api._changed:
                    epoch, started, sent, gone = api._epoch, api._sequence, 0, False
                    pods = [] if since is not None else [json.loads(json.dumps(p)) for p in sorted(
                        api.pods.values(), key=lambda p: p["metadata"]["uid"])]
                    since = api.version if since is None else since
                    api.open_watches += 1
                deadline = time.monotonic() + timeout
                try:
                    for pod in pods:
                        self._chunk({"type": "ADDED", "object": pod})
                    while time.monotonic() < deadline:
                        with api._changed:
                            if api._epoch != epoch or since < api.oldest:
                                gone = since < api.oldest and api._gone_in_stream
                                break
                            news = [e for e in api.history if e[0] > sent and (e[0] > started or e[1] > since)
                                    and (bookmarks or e[2] != "BOOKMARK")]
                            if ends_initial and not api.initial_events_end_held:
                                news.append((api._sequence, api.version, "BOOKMARK", _initial_events_end(api.version)))
                                ends_initial = False
                            if not news:
                                api._changed.wait(min(0.5, max(deadline - time.monotonic(), 0)))
                                continue
                        for sequence, _version, kind, obj in news:
                            self._chunk({"type": kind, "object": obj})
                            sent = sequence
                    if gone:
                        self._chunk({"type": "ERROR", "object": _status(410, "Expired", "The resourceVersion for "
                                                                        "the provided watch is too old.")})
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


def _invalid_list_options(causes: list[tuple[str, str]]) -> dict:
    """The Status of an Invalid error for ListOptions, as apimachinery's errors.NewInvalid writes it."""
    errors = [f"{field}: Forbidden: {text}" for field, text in causes]
    listed = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
    status = _status(422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: {listed}')
    status["details"] = {"group": "meta.k8s.io", "kind": "ListOptions",
                         "causes": [{"reason": "FieldValueForbidden", "message": f"Forbidden: {text}", "field": field}
                                    for field, text in causes]}
    return status


def _initial_events_end(version: int) -> dict:
    """The bookmark that ends a streaming list's initial events."""
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"resourceVersion": str(version), "annotations": {"k8s.io/initial-events-end": "true"}}}

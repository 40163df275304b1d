"""The pods of a Kubernetes cluster, listed and then watched through the API server (the protocol of client-go's
reflector, which the OpenTelemetry Collector's k8sattributes processor uses). Where the server streams lists
(KEP-3157 WatchList, kubernetes.io/docs/reference/using-api/api-concepts "Streaming lists"), one watch with
sendInitialEvents=true gives the pods as ADDED events, a BOOKMARK annotated `k8s.io/initial-events-end` says they
are all in, and it goes on as an ordinary watch. Where it does not (the WatchList feature gate off, a server
before 1.27: a 422 Invalid, or 400 or 403, or an ERROR event, or a stream without that bookmark within
WATCH_LIST_WAIT_S), the pods are listed and then watched, and the streaming list is not asked for again before
WATCH_LIST_RETRY_S: a paginated list gives the pods and a resourceVersion; a watch from it streams ADDED,
MODIFIED, DELETED and BOOKMARK events as JSON lines; when that version has expired (410 Gone, as an HTTP status or
an ERROR event) the pods are listed again, and a list whose continue token expired is made again in one request.
The version of the last event or bookmark is kept, so a broken watch resumes from there. Connection errors, a
watch that ends at once with nothing in it, and 410s in a row are retried with backoff (a 429's Retry-After at
least); nothing of it ever stops serve.

Credentials: in a pod, the service account's token and CA (`in-cluster`); with a URL, that server as given
(tests, `kubectl proxy`)."""

from __future__ import annotations

import http.client
import json
import logging
import os
import ssl
import threading
import time
from collections import Counter
from urllib.parse import urlencode, urlsplit

from sloscope.enrich.pods import PodDirectory, incarnation_of

log = logging.getLogger("sloscope.kube")
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
IN_CLUSTER = "in-cluster"
PODS = "/api/v1/pods"
PAGE_SIZE = 500
WATCH_TIMEOUT_S = 300  # the server ends a watch after this; it is then resumed from the last version seen
MAX_EVENT_BYTES = 16 * 2**20  # a Pod object is kilobytes; a longer line is a broken stream
MIN_BACKOFF_S, MAX_BACKOFF_S = 0.5, 30.0
MIN_WATCH_S = 1.0  # a watch that ends sooner with no event is a broken one (client-go's reflector says the same)
INITIAL_EVENTS_END = "k8s.io/initial-events-end"  # the annotation of the bookmark that ends a streaming list
WATCH_LIST_WAIT_S = 60.0  # a streaming list must end within this; a server that ignored the request never ends it
WATCH_LIST_RETRY_S = 3600.0  # a server that would not stream lists is asked again after this (upgraded meanwhile?)
WATCH_LIST_REFUSALS = (400, 403, 422)  # how servers without WatchList, and proxies, answer sendInitialEvents


class Gone(Exception):
    """The resourceVersion to watch from has expired: list again."""


class ExpiredContinue(Exception):
    """A paginated list's continue token expired before its last page."""


class NoWatchList(Exception):
    """The server does not stream lists: list and watch instead."""


class ApiError(Exception):
    def __init__(self, message: str, retry_after_s: float = 0.0, status: int = 0):
        super().__init__(message)
        self.retry_after_s, self.status = retry_after_s, status


class KubeApi:
    """Requests to the API server at `url` (http or https), with a bearer token re-read at each connection
    (projected service account tokens rotate)."""

    def __init__(self, url: str, token_file: str | None = None, ca_file: str | None = None):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--kube-api: expected http(s)://HOST[:PORT] or {IN_CLUSTER}, got {url!r}")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.token_file = token_file
        self.tls = ssl.create_default_context(cafile=ca_file) if parts.scheme == "https" else None

    @classmethod
    def of(cls, where: str) -> "KubeApi":
        if where != IN_CLUSTER:
            return cls(where)
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ValueError("--kube-api in-cluster: KUBERNETES_SERVICE_HOST is not set (not in a pod?)")
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", f"{SERVICE_ACCOUNT}/token", f"{SERVICE_ACCOUNT}/ca.crt")

    def get(self, path: str, query: dict, timeout_s: float) -> http.client.HTTPResponse:
        """The response to GET path?query, status 200, with its `socket` (whose timeout a streaming list shortens
        until its initial events end); Gone for 410; ApiError for any other status."""
        con = (http.client.HTTPSConnection(self.host, self.port, timeout=timeout_s, context=self.tls) if self.tls
               else http.client.HTTPConnection(self.host, self.port, timeout=timeout_s))
        headers = {"Accept": "application/json"}
        if self.token_file:
            with open(self.token_file) as f:
                headers["Authorization"] = f"Bearer {f.read().strip()}"
        con.request("GET", f"{path}?{urlencode(query)}", headers=headers)
        sock = con.sock  # taken now: the connection lets go of it where the server says it will close
        response = con.getresponse()
        if response.status == 200:
            response.socket = sock
            return response
        body = response.read(4096)
        con.close()
        if response.status == 410:
            raise Gone()
        raise ApiError(f"GET {path}: HTTP {response.status}: {body[:200]!r}", _retry_after_s(response),
                       response.status)


def _retry_after_s(response) -> float:
    """A 429's or 503's Retry-After in seconds (API Priority and Fairness sends one); 0 where there is none."""
    try:
        return min(max(float(response.getheader("Retry-After") or 0), 0.0), MAX_BACKOFF_S)
    except ValueError:
        return 0.0


class PodWatch:
    """Keeps a PodDirectory up to date from the API server, in a thread of its own."""

    def __init__(self, api: KubeApi, directory: PodDirectory, watch_timeout_s: int = WATCH_TIMEOUT_S,
                 watch_list_wait_s: float = WATCH_LIST_WAIT_S):
        self.api, self.directory, self.watch_timeout_s = api, directory, watch_timeout_s
        self.watch_list_wait_s = watch_list_wait_s
        self.counts: Counter = Counter()
        self.synced = threading.Event()  # set once the first list is in
        self.version: str | None = None  # of the last list, event or bookmark; None: list again
        self.watch_list_refused_at: float | None = None  # when the server would not stream lists (monotonic)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-pod-watch", daemon=True)

    def start(self) -> "PodWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff, gone_before = MIN_BACKOFF_S, False
        while not self._stop.is_set():
            try:
                if self.version is None and self._streams_lists():
                    self._watch_list()
                else:
                    if self.version is None:
                        self.version = self._list()
                        self.synced.set()
                    self._watch()
                backoff, gone_before = MIN_BACKOFF_S, False
                continue
            except NoWatchList as why:  # not an error of the API: list instead, at once
                log.info("pod watch: the API server does not stream lists (%s); listing the pods instead", why)
                self.watch_list_refused_at = time.monotonic()
                continue
            except Gone:
                self.counts["kube_relists_gone"] += 1
                self.version = None
                if not gone_before:  # the version expired: list again at once, and only then back off
                    log.info("pod watch: resourceVersion expired; listing the pods again")
                    gone_before = True
                    continue
                wait, why = backoff, "resourceVersion expired again"
            except Exception as exc:  # noqa: BLE001 - a broken answer of any kind is the API being away: retry
                if self._stop.is_set():  # the watch was cut off because serve is stopping
                    return
                wait, why = max(backoff, getattr(exc, "retry_after_s", 0.0)), str(exc)
            self.counts["kube_watch_errors"] += 1
            log.warning("pod watch: %s; retrying in %.1f s", why, wait)
            self._stop.wait(wait)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _streams_lists(self) -> bool:
        """Whether to ask for a streaming list: yes, unless the server would not give one in the last
        WATCH_LIST_RETRY_S (asking at every relist would cost every relist a refusal or a WATCH_LIST_WAIT_S)."""
        refused = self.watch_list_refused_at
        return refused is None or time.monotonic() - refused >= WATCH_LIST_RETRY_S

    def _list(self) -> str:
        """All pods, page by page (in one request where a continue token expired before the last page, as the
        API's documentation says); the list's resourceVersion."""
        try:
            pods, meta = self._pages(PAGE_SIZE)
        except ExpiredContinue:
            log.info("pod watch: the list's continue token expired; listing the pods in one request")
            pods, meta = self._pages(None)
        self.directory.replace_all(pods)
        self.counts["kube_lists"] += 1
        return str(meta["resourceVersion"])

    def _pages(self, limit: int | None) -> tuple[list, dict]:
        pods, query = [], {"limit": limit} if limit else {}
        while True:
            try:
                response = self.api.get(PODS, query, timeout_s=60)
            except Gone:
                if "continue" in query:
                    raise ExpiredContinue() from None
                raise
            page = json.loads(response.read())
            pods.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                return pods, meta
            query = {"limit": limit, "continue": meta["continue"]}

    def _watch_list(self) -> None:
        """A streaming list: the pods as the initial events of a watch, then that watch's events as _watch's. It
        is asked for only where there is no version or it expired, so with none: a consistent read (the
        documentation's `resourceVersion=`), as client-go's reflector asks after a 410."""
        query = {"watch": 1, "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
                 "resourceVersion": "", "allowWatchBookmarks": "true", "timeoutSeconds": self.watch_timeout_s}
        try:
            response = self.api.get(PODS, query, timeout_s=self.watch_list_wait_s)
        except ApiError as exc:
            if exc.status in WATCH_LIST_REFUSALS:
                raise NoWatchList(str(exc)) from None
            raise  # 429, 5xx: the API being away, not refusing
        try:
            self._initial_events(response)
            response.socket.settimeout(self.watch_timeout_s + 30)
            self._follow(response)
        finally:
            response.close()

    def _initial_events(self, response) -> None:
        """The pods of a streaming list, each applied as it comes, as are changes and deletions sent before the
        end (the server sends what changed while it caught up), until the bookmark that ends them: then the pods
        held but not among them ended while no watch was open, and self.version is the bookmark's. Their own
        versions are older than the bookmark's and in no order: none is resumed from."""
        deadline, seen = time.monotonic() + self.watch_list_wait_s, set()
        while not self._stop.is_set():
            event = self._initial_event(response, deadline)
            kind, pod = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if pod.get("code") == 410:
                    raise Gone()
                raise NoWatchList(f"watch error: {str(pod.get('message'))[:200]}")
            if kind == "BOOKMARK" and _ends_initial_events(pod):
                version = (pod.get("metadata") or {}).get("resourceVersion")
                if not version:
                    raise NoWatchList("the end of the initial events has no resourceVersion")
                self.directory.end_unlisted(seen)
                self.version = str(version)
                self.counts["kube_lists"] += 1
                self.synced.set()
                return
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.directory.apply(kind, pod)
                seen.add(incarnation_of(pod)[0])

    def _initial_event(self, response, deadline: float) -> dict:
        """The next event of a streaming list; NoWatchList where the stream ends or stalls before its initial
        events end, or they take past `deadline`: a server that ignored sendInitialEvents sends no such end."""
        too_long = NoWatchList(f"its initial events did not end within {self.watch_list_wait_s:g} s")
        left = deadline - time.monotonic()
        if left <= 0:
            raise too_long
        response.socket.settimeout(left)
        try:
            event = self._next_event(response)
        except TimeoutError:
            raise too_long from None
        if event is None:
            raise NoWatchList("the watch ended before its initial events did")
        return event

    def _watch(self) -> None:
        """Events from self.version until the server ends the watch. A watch that ends within MIN_WATCH_S with no
        event is an error (reopened at once, it would loop)."""
        started = time.monotonic()
        response = self.api.get(PODS, {"watch": 1, "resourceVersion": self.version,
                                       "allowWatchBookmarks": "true", "timeoutSeconds": self.watch_timeout_s},
                                timeout_s=self.watch_timeout_s + 30)
        try:
            events = self._follow(response)
        finally:
            response.close()
        if not events and time.monotonic() - started < MIN_WATCH_S and not self._stop.is_set():
            raise ApiError("the watch ended at once with no event")

    def _follow(self, response) -> int:
        """The events of a watch until the server ends it, each moving self.version on; how many there were."""
        events = 0
        while not self._stop.is_set():
            event = self._next_event(response)
            if event is None:
                break
            self.version = self._event(event) or self.version
            events += 1
        return events

    @staticmethod
    def _next_event(response) -> dict | None:
        """The next JSON line of a watch; None where the server ended it."""
        line = response.readline(MAX_EVENT_BYTES + 1)
        if not line:
            return None
        if len(line) > MAX_EVENT_BYTES:
            raise ValueError("a watch event over 16 MiB")
        event = json.loads(line)
        if not isinstance(event, dict):
            raise ValueError(f"a watch event that is not an object: {line[:200]!r}")
        return event

    def _event(self, event: dict) -> str | None:
        kind, pod = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if pod.get("code") == 410:
                raise Gone()
            raise ApiError(f"watch error: {str(pod.get('message'))[:200]}")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.directory.apply(kind, pod)
        if kind in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
            self.counts[f"kube_events_{kind.lower()}"] += 1
        version = (pod.get("metadata") or {}).get("resourceVersion")
        return str(version) if version else None


def _ends_initial_events(bookmark: dict) -> bool:
    annotations = (bookmark.get("metadata") or {}).get("annotations") or {}
    return isinstance(annotations, dict) and annotations.get(INITIAL_EVENTS_END) == "true"

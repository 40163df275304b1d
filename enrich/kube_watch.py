"""The pods of a Kubernetes cluster, listed and then watched through the API server (the protocol of client-go's
reflector, which the OpenTelemetry Collector's k8sattributes processor uses): a paginated list gives the pods and a
resourceVersion; a watch from it streams ADDED, MODIFIED, DELETED and BOOKMARK events as JSON lines; when that
version has expired (410 Gone, as an HTTP status or an ERROR event) the pods are listed again, and a list whose
continue token expired is made again in one request. The version of the last event or bookmark is kept, so a
broken watch resumes from there. Connection errors, a watch that ends at once with nothing in it, and 410s in a row
are retried with backoff (a 429's Retry-After at least); nothing of it ever stops serve.

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

from enrich.pods import PodDirectory

log = logging.getLogger("sloscope.kube")
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
IN_CLUSTER = "in-cluster"
PAGE_SIZE = 500
WATCH_TIMEOUT_S = 300  # the server ends a watch after this; it is then resumed from the last version seen
MAX_EVENT_BYTES = 16 * 2**20  # a Pod object is kilobytes; a longer line is a broken stream
MIN_BACKOFF_S, MAX_BACKOFF_S = 0.5, 30.0
MIN_WATCH_S = 1.0  # a watch that ends sooner with no event is a broken one (client-go's reflector says the same)


class Gone(Exception):
    """The resourceVersion to watch from has expired: list again."""


class ExpiredContinue(Exception):
    """A paginated list's continue token expired before its last page."""


class ApiError(Exception):
    def __init__(self, message: str, retry_after_s: float = 0.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


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
        """The response to GET path?query, status 200; Gone for 410; ApiError for any other status."""
        con = (http.client.HTTPSConnection(self.host, self.port, timeout=timeout_s, context=self.tls) if self.tls
               else http.client.HTTPConnection(self.host, self.port, timeout=timeout_s))
        headers = {"Accept": "application/json"}
        if self.token_file:
            with open(self.token_file) as f:
                headers["Authorization"] = f"Bearer {f.read().strip()}"
        con.request("GET", f"{path}?{urlencode(query)}", headers=headers)
        response = con.getresponse()
        if response.status == 200:
            return response
        body = response.read(4096)
        con.close()
        if response.status == 410:
            raise Gone()
        raise ApiError(f"GET {path}: HTTP {response.status}: {body[:200]!r}", _retry_after_s(response))


def _retry_after_s(response) -> float:
    """A 429's or 503's Retry-After in seconds (API Priority and Fairness sends one); 0 where there is none."""
    try:
        return min(max(float(response.getheader("Retry-After") or 0), 0.0), MAX_BACKOFF_S)
    except ValueError:
        return 0.0


class PodWatch:
    """Keeps a PodDirectory up to date from the API server, in a thread of its own."""

    def __init__(self, api: KubeApi, directory: PodDirectory, watch_timeout_s: int = WATCH_TIMEOUT_S):
        self.api, self.directory, self.watch_timeout_s = api, directory, watch_timeout_s
        self.counts: Counter = Counter()
        self.synced = threading.Event()  # set once the first list is in
        self.version: str | None = None  # of the last list, event or bookmark; None: list again
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
                if self.version is None:
                    self.version = self._list()
                    self.synced.set()
                self._watch()
                backoff, gone_before = MIN_BACKOFF_S, False
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
                response = self.api.get("/api/v1/pods", query, timeout_s=60)
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

    def _watch(self) -> None:
        """Events from self.version until the server ends the watch, each moving self.version on. A watch that
        ends within MIN_WATCH_S with no event is an error (reopened at once, it would loop)."""
        started, events = time.monotonic(), 0
        response = self.api.get("/api/v1/pods", {"watch": 1, "resourceVersion": self.version,
                                                 "allowWatchBookmarks": "true", "timeoutSeconds": self.watch_timeout_s},
                                timeout_s=self.watch_timeout_s + 30)
        try:
            while not self._stop.is_set():
                line = response.readline(MAX_EVENT_BYTES + 1)
                if not line:
                    break
                if len(line) > MAX_EVENT_BYTES:
                    raise ValueError("a watch event over 16 MiB")
                self.version = self._event(json.loads(line)) or self.version
                events += 1
        finally:
            response.close()
        if not events and time.monotonic() - started < MIN_WATCH_S and not self._stop.is_set():
            raise ApiError("the watch ended at once with no event")

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

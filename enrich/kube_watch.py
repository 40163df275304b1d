"""The pods of a Kubernetes cluster, listed and then watched through the API server (the protocol of client-go's
reflector, which the OpenTelemetry Collector's k8sattributes processor uses): a paginated list gives the pods and a
resourceVersion; a watch from it streams ADDED, MODIFIED, DELETED and BOOKMARK events as JSON lines; when that
version has expired (410 Gone, as an HTTP status or an ERROR event) the pods are listed again. Connection errors
are retried with backoff; nothing of it ever stops serve.

Credentials: in a pod, the service account's token and CA (`in-cluster`); with a URL, that server as given
(tests, `kubectl proxy`)."""

from __future__ import annotations

import http.client
import json
import logging
import os
import ssl
import threading
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


class Gone(Exception):
    """The resourceVersion to watch from has expired: list again."""


class ApiError(Exception):
    pass


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
        raise ApiError(f"GET {path}: HTTP {response.status}: {body[:200]!r}")


class PodWatch:
    """Keeps a PodDirectory up to date from the API server, in a thread of its own."""

    def __init__(self, api: KubeApi, directory: PodDirectory, watch_timeout_s: int = WATCH_TIMEOUT_S):
        self.api, self.directory, self.watch_timeout_s = api, directory, watch_timeout_s
        self.counts: Counter = Counter()
        self.synced = threading.Event()  # set once the first list is in
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-pod-watch", daemon=True)

    def start(self) -> "PodWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff, version = MIN_BACKOFF_S, None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list()
                    self.synced.set()
                version = self._watch(version)
                backoff = MIN_BACKOFF_S
            except Gone:
                self.counts["kube_relists_gone"] += 1
                version = None
            except Exception as exc:  # noqa: BLE001 - a broken answer of any kind is the API being away: retry
                self.counts["kube_watch_errors"] += 1
                log.warning("pod watch: %s; retrying in %.1f s", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _list(self) -> str:
        """All pods, page by page; the list's resourceVersion."""
        pods, query = [], {"limit": PAGE_SIZE}
        while True:
            response = self.api.get("/api/v1/pods", query, timeout_s=60)
            page = json.loads(response.read())
            pods.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                break
            query = {"limit": PAGE_SIZE, "continue": meta["continue"]}
        self.directory.replace_all(pods)
        self.counts["kube_lists"] += 1
        return str(meta["resourceVersion"])

    def _watch(self, version: str) -> str:
        """Events from `version` until the server ends the watch; the last version seen."""
        response = self.api.get("/api/v1/pods", {"watch": 1, "resourceVersion": version, "allowWatchBookmarks": "true",
                                                 "timeoutSeconds": self.watch_timeout_s},
                                timeout_s=self.watch_timeout_s + 30)
        try:
            while not self._stop.is_set():
                line = response.readline(MAX_EVENT_BYTES + 1)
                if not line:
                    return version
                if len(line) > MAX_EVENT_BYTES:
                    raise ValueError("a watch event over 16 MiB")
                version = self._event(json.loads(line)) or version
        finally:
            response.close()
        return version

    def _event(self, event: dict) -> str | None:
        kind, pod = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if pod.get("code") == 410:
                raise Gone()
            raise ApiError(f"watch error: {str(pod.get('message'))[:200]}")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.directory.apply(kind, pod)
            self.counts[f"kube_events_{kind.lower()}"] += 1
        version = (pod.get("metadata") or {}).get("resourceVersion")
        return str(version) if version else None

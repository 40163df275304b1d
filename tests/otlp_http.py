"""Posting an OTLP/HTTP protobuf export request, as the Collector's otlphttp exporter and the SDKs do."""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit


def post(url: str, body: bytes) -> str | None:
    """None once the receiver answered 200; else what went wrong, for the test to report."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("POST", parts.path, body, {"Content-Type": "application/x-protobuf"})
        response = conn.getresponse()
        answer = response.read()
        return None if response.status == 200 else f"{url}: HTTP {response.status} {answer[:200]!r}"
    except OSError as exc:
        return f"{url}: {exc}"
    finally:
        conn.close()

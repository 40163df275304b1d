"""The OTLP/HTTP protobuf exporter (otlp_answers.py says how its answers are classified)."""

from __future__ import annotations

import gzip

import requests
from google.rpc.status_pb2 import Status

from .http_deadline import DeadlineAdapter, attempt_deadline
from .otlp_answers import (ANSWER_MAX, DELIVERED, DETAIL_MAX, GZIP_LEVEL, REFUSED, RETRY, RETRYABLE_HTTP, USER_AGENT,
                           Answer, Transport, delivered, parse_retry_after, printable)


class HttpExporter:
    """OTLP/HTTP protobuf, with one keep-alive session (the specification asks clients to keep the connection).
    An attempt takes at most `timeout_s` in all, however slowly the answer comes (http_deadline.py)."""

    def __init__(self, endpoint: str, headers: dict[str, str], timeout_s: float, transport: Transport = Transport()):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._gzip = transport.compression == "gzip"
        self._session = requests.Session()
        for prefix in ("https://", "http://"):
            self._session.mount(prefix, DeadlineAdapter())
        self._session.headers.update({**headers, "Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT})
        if self._gzip:
            self._session.headers["Content-Encoding"] = "gzip"
        # Per request, not on the session: requests lets REQUESTS_CA_BUNDLE override a session's verify.
        self._tls = {"verify": transport.certificate or True}
        if transport.client_certificate:
            self._tls["cert"] = (transport.client_certificate, transport.client_key)

    def send(self, body: bytes) -> Answer:
        if self._gzip:
            body = gzip.compress(body, GZIP_LEVEL, mtime=0)
        with attempt_deadline(self.timeout_s) as deadline:
            try:
                with self._session.post(self.endpoint, data=body, timeout=self.timeout_s, allow_redirects=False,
                                        stream=True, **self._tls) as response:
                    if deadline.passed:  # perhaps cut short in its headers: http.client takes the cut for their end
                        return self._no_answer_in_time()
                    content = self._answer_body(response, deadline)
            except requests.RequestException as exc:  # no answer: refused, reset, timed out, closed
                if deadline.passed:
                    return self._no_answer_in_time()
                return Answer(RETRY, printable(f"no answer: {type(exc).__name__}: {exc}"))
        code = response.status_code
        if content is None:  # the status says what happened; the body is left unread
            what = f"HTTP {code}, its body longer than {ANSWER_MAX} bytes or not in by {self.timeout_s:g} s, not read"
            return (Answer(DELIVERED, what) if 200 <= code < 300 else
                    Answer(RETRY if code in RETRYABLE_HTTP else REFUSED, what))
        if 200 <= code < 300:
            return delivered(content, f"HTTP {code}")
        detail = printable(f"HTTP {code}: {self._message(response, content)}")
        if code in RETRYABLE_HTTP:
            return Answer(RETRY, detail, parse_retry_after(response.headers.get("Retry-After")))
        return Answer(REFUSED, detail)

    def _answer_body(self, response, deadline) -> bytes | None:
        """The answer's body, read as it comes; None past ANSWER_MAX bytes or when the attempt's deadline cut it
        short (the status came in time, and decides)."""
        content = b""
        try:
            for chunk in response.iter_content(4096):
                content += chunk
                if len(content) > ANSWER_MAX:
                    return None
        except requests.RequestException:
            if not deadline.passed:
                raise
        return None if deadline.passed else content  # a body without a length would seem to end where it was cut

    def _no_answer_in_time(self) -> Answer:
        return Answer(RETRY, f"no answer: Timeout: none within the attempt's {self.timeout_s:g} s")

    @staticmethod
    def _message(response, content: bytes) -> str:
        """The google.rpc.Status message the specification puts in a failure's body, else the body as text."""
        if (response.headers.get("Content-Type") or "").startswith("application/x-protobuf"):
            try:
                return Status.FromString(content).message
            except Exception:
                pass
        return content[:DETAIL_MAX].decode("utf-8", "replace")

    def shutdown(self) -> None:
        self._session.close()

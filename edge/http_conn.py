"""Connections of an HTTP server (the OTLP receiver's, the Alertmanager webhook's), bounded in time and number.

A socket timeout alone bounds the wait for each byte, so a client sending a header byte a second would hold its
connection forever; here each phase of a request (waiting for it, its headers, its body) has one deadline for
all its reads. The server holds at most `max_connections` connections; past that, new ones wait in the listen
backlog until one closes, as Prometheus's connection limit does. With TLS, the handshake is made in the
connection's own thread, holding one of those slots, within the header deadline.
"""

from __future__ import annotations

import io
import logging
import socket
import ssl
import sys
import threading
import time
from typing import Callable

from sloscope.edge.draining import DrainingServer
from sloscope.edge.tls import NotTls, TlsFiles, accept_tls

log = logging.getLogger(__name__)
ACCEPT_WAIT_S = 0.5  # how long one accept waits for a free slot before the server loop looks at shutdown again


class HeadersTooLarge(OSError):
    """More header bytes than the limit: the connection is closed."""


class DeadlineReader(io.RawIOBase):
    """The socket's reads under the current phase's deadline, and at most `max_bytes` of them in the phase when
    it has such a bound (the headers). A read past the deadline raises TimeoutError (which http.server answers
    by closing the connection), one past the bytes HeadersTooLarge; either reports the phase it cut off."""

    def __init__(self, sock: socket.socket, on_limit: Callable[[str], None]):
        self.sock = sock
        self.on_limit = on_limit
        self.phase, self.deadline, self.bytes_left = "idle", time.monotonic(), None
        self.on_arrival: Callable[[int], None] | None = None  # told the size of each read while set

    def expect(self, phase: str, within_s: float, max_bytes: int | None = None) -> None:
        self.phase, self.deadline, self.bytes_left = phase, time.monotonic() + within_s, max_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.bytes_left is not None:
            if self.bytes_left <= 0:
                self.on_limit(f"{self.phase}s_too_large")
                raise HeadersTooLarge(f"more than the limit of {self.phase} bytes")
            buffer = memoryview(buffer)[: self.bytes_left]
        left = self.deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError(f"{self.phase} deadline passed")
            self.sock.settimeout(left)
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            self.on_limit(f"{self.phase}_timeout")
            raise
        if self.bytes_left is not None:
            self.bytes_left -= n
        if self.on_arrival is not None:
            self.on_arrival(n)
        return n


class LimitedHTTPServer(DrainingServer):
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, handler, max_connections: int, count: Callable[[str], None],
                 tls: TlsFiles | None = None, handshake_timeout_s: float = 10.0):
        self._slots = threading.BoundedSemaphore(max_connections)
        self._open_lock = threading.Lock()
        self.open_connections = 0
        self._waiting = False
        self._count = count
        self.tls = tls
        self.handshake_timeout_s = handshake_timeout_s
        super().__init__(address, handler)

    def process_request_thread(self, request, client_address):
        if self.tls is not None:
            request = self._handshake(request, client_address)
            if request is None:
                return
        super().process_request_thread(request, client_address)

    def _handshake(self, request: socket.socket, client_address) -> ssl.SSLSocket | None:
        """The TLS connection, or None once a failed handshake is counted and its slot given back."""
        try:
            return accept_tls(request, self.tls.context, self.handshake_timeout_s)
        except TimeoutError:
            self._count("tls_handshake_timeout")
        except NotTls:
            self._count("tls_handshake_not_tls")
        except ssl.SSLError as exc:
            self._count("tls_handshake_failed")
            log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
        except OSError as exc:  # the client went away: ordinary, not counted
            log.debug("connection from %s ended before TLS: %s", client_address[0], exc)
        self.shutdown_request(request)
        return None

    def get_request(self):
        if not self._slots.acquire(blocking=False):
            if not self._waiting:  # once per stretch at the limit, not per retry
                self._waiting = True
                self._count("http_connection_limit_waits")
            if not self._slots.acquire(timeout=ACCEPT_WAIT_S):
                raise OSError("connection limit reached")  # the server loop skips this round and retries
        self._waiting = False
        try:
            request = super().get_request()
        except BaseException:
            self._slots.release()
            raise
        with self._open_lock:
            self.open_connections += 1
        return request

    def close_request(self, request):
        try:
            super().close_request(request)
        finally:
            with self._open_lock:
                self.open_connections -= 1
            self._slots.release()

    def handle_error(self, request, client_address):
        # A client that resets or vanishes is ordinary on the internet; anything else is this server's bug.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.debug("connection from %s ended: %s", client_address[0], exc)
        else:
            log.error("request from %s failed", client_address[0], exc_info=True)

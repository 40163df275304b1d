"""HTTP servers that stop the way a load balancer expects: no new connections, the requests in flight answered,
kept-alive connections that wait idle closed at once.

Connection threads are daemon threads, so that a client cannot keep the process alive. Left running at exit,
one could be inside the store (DuckDB, Arrow) while the main thread closes it and the interpreter finalizes,
which aborts the process. `drain()` therefore waits until every connection thread has ended, as Go's
`http.Server.Shutdown` does, before the caller closes what those threads use.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

from sloscope.edge.listening import AnyFamilyHTTPServer
from sloscope.edge.peers import peer_ip

if TYPE_CHECKING:  # the server KeepAliveHandler runs under; that module imports this one
    from sloscope.edge.http_conn import LimitedHTTPServer

DRAIN_GRACE_S = 10.0  # how long a request in flight may take to finish once serve stops
CUT_OFF_WAIT_S = 1.0  # after the grace: how long a connection cut off mid-request may take to end its thread


@dataclass
class Held:
    """One connection, as its thread last recorded it: idle (awaiting a request's first byte) or in a request."""
    connection: socket.socket
    peer: str
    busy: bool = False
    since: float = 0.0  # when it became idle or busy
    shed: bool = False  # closed to make room: no request may start on it


class DrainingServer(AnyFamilyHTTPServer):
    daemon_threads = True

    def __init__(self, *args, **kwargs):
        self._connections: dict[int, Held] = {}  # by connection thread
        self._changed = threading.Condition()
        self.draining = False
        super().__init__(*args, **kwargs)

    def process_request_thread(self, request, client_address):
        with self._changed:  # idle until its first byte: a client that sends nothing holds nothing of worth
            self._connections[threading.get_ident()] = Held(request, peer_key(client_address),
                                                            since=time.monotonic())
            self._changed.notify_all()
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._changed:
                self._connections.pop(threading.get_ident(), None)
                self._changed.notify_all()

    def track(self, busy: bool) -> bool:
        """Records this thread's connection as in a request or idle; False (nothing recorded) for a request
        that would start while draining, or on a connection closed to make room."""
        with self._changed:
            held = self._connections[threading.get_ident()]
            if busy and (self.draining or held.shed):
                return False
            held.busy, held.since = busy, time.monotonic()
            self._changed.notify_all()
            return True

    def drain(self, grace_s: float = DRAIN_GRACE_S) -> None:
        """Stops accepting, closes idle connections, waits up to `grace_s` for those in a request to answer
        (then cuts them off), and closes the listening socket. Call while serve_forever runs."""
        with self._changed:
            self.draining = True  # first: answers already being written say Connection: close
        deadline = time.monotonic() + grace_s
        self.shutdown()
        with self._changed:
            while self._connections and time.monotonic() < deadline:
                for held in self._connections.values():
                    if not held.busy:
                        wake(held.connection)
                self._changed.wait(max(0.0, deadline - time.monotonic()))
            for held in self._connections.values():
                wake(held.connection)
            self._changed.wait_for(lambda: not self._connections, CUT_OFF_WAIT_S)
        self.server_close()


def peer_key(client_address) -> str:
    """The client address that per-client limits count under (an IPv4-mapped IPv6 address as IPv4)."""
    return peer_ip(client_address[0]) or str(client_address[0])


def wake(connection: socket.socket) -> None:
    """Ends the connection's blocking reads and writes, so that its thread finishes."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed by the client or its thread
        pass


class KeepAliveHandler(BaseHTTPRequestHandler):
    """A handler whose connection is idle until each request's first byte: the server's drain closes it there,
    never in the middle of a request, and a server at its connection limit may close it to make room. Subclasses
    set the header deadline in `start_request` and the idle one in `start_idle`, and answer a request with
    `peer_busy` set (its client has more requests in progress than it may) with a retryable refusal."""

    server: LimitedHTTPServer
    protocol_version = "HTTP/1.1"
    # What an answer to a request line it refuses speaks: http.server's own default (HTTP/0.9) sends the refusal
    # of an HTTP/2 client (a gRPC exporter pointed at the HTTP port) without a status line.
    default_request_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.answered = False
        self.peer_busy = False

    def handle_one_request(self):
        if not self._request_begins():
            self.close_connection = True
            return
        super().handle_one_request()
        self.answered = True

    def _request_begins(self) -> bool:
        """Waits, idle, for the next request's first byte, then records the connection as in a request; False
        where the client closes, the wait ends, the server drains or the connection was closed to make room."""
        if self.answered:
            self.server.track(busy=False)
            self.start_idle()
        else:
            self.start_request()  # a new connection owes its first request's headers at once
        try:
            arrived = bool(self.rfile.peek(1))
        except OSError:  # a timeout, a reset, or the drain's shutdown
            return False
        if not arrived or not self.server.track(busy=True):
            return False
        self.peer_busy = self.server.peer_busy(peer_key(self.client_address))
        if self.answered:
            self.start_request()
        return True

    def end_headers(self):
        if self.server.draining:
            self.send_header("Connection", "close")  # the client sends its next request elsewhere
        super().end_headers()

    def start_request(self) -> None:
        """Called as each request's first bytes are due (the header deadline starts here)."""

    def start_idle(self) -> None:
        """Called as a kept-alive connection begins to wait for its next request (the idle deadline starts)."""

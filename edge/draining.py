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
from http.server import BaseHTTPRequestHandler

from sloscope.edge.listening import AnyFamilyHTTPServer

DRAIN_GRACE_S = 10.0  # how long a request in flight may take to finish once serve stops
CUT_OFF_WAIT_S = 1.0  # after the grace: how long a connection cut off mid-request may take to end its thread


class DrainingServer(AnyFamilyHTTPServer):
    daemon_threads = True

    def __init__(self, *args, **kwargs):
        self._connections: dict[int, tuple[socket.socket, bool]] = {}  # thread -> (connection, in a request)
        self._changed = threading.Condition()
        self.draining = False
        super().__init__(*args, **kwargs)

    def process_request_thread(self, request, client_address):
        if not self.track(request, busy=True):  # a new connection owes its first request at once
            self.shutdown_request(request)
            return
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._changed:
                self._connections.pop(threading.get_ident(), None)
                self._changed.notify_all()

    def track(self, connection: socket.socket, busy: bool) -> bool:
        """Records this thread's connection as in a request or idle; False (nothing recorded) for a request
        that would start while draining."""
        with self._changed:
            if busy and self.draining:
                return False
            self._connections[threading.get_ident()] = (connection, busy)
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
                for connection, busy in self._connections.values():
                    if not busy:
                        _wake(connection)
                self._changed.wait(max(0.0, deadline - time.monotonic()))
            for connection, _ in self._connections.values():
                _wake(connection)
            self._changed.wait_for(lambda: not self._connections, CUT_OFF_WAIT_S)
        self.server_close()


def _wake(connection: socket.socket) -> None:
    """Ends the connection's blocking reads and writes, so that its thread finishes."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed by the client or its thread
        pass


class KeepAliveHandler(BaseHTTPRequestHandler):
    """A handler whose connection is idle between requests: the server's drain closes it there, never in the
    middle of a request. Subclasses may bound the idle wait in `next_request_arrives`."""

    server: DrainingServer
    protocol_version = "HTTP/1.1"
    # What an answer to a request line it refuses speaks: http.server's own default (HTTP/0.9) sends the refusal
    # of an HTTP/2 client (a gRPC exporter pointed at the HTTP port) without a status line.
    default_request_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.answered = False

    def handle_one_request(self):
        if self.answered:
            self.server.track(self.connection, busy=False)
            if not self.next_request_arrives() or not self.server.track(self.connection, busy=True):
                self.close_connection = True
                return
        self.start_request()
        super().handle_one_request()
        self.answered = True

    def end_headers(self):
        if self.server.draining:
            self.send_header("Connection", "close")  # the client sends its next request elsewhere
        super().end_headers()

    def start_request(self) -> None:
        """Called as each request's first bytes are due (the header deadline starts here)."""

    def next_request_arrives(self) -> bool:
        """True once the next request's first byte is here; False when the client closes or the wait ends."""
        try:
            return bool(self.rfile.peek(1))
        except OSError:  # a timeout, a reset, or the drain's shutdown
            return False

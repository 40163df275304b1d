"""Connections of an HTTP server (the OTLP receiver's, the Alertmanager webhook's), bounded in time and number.

A socket timeout alone bounds the wait for each byte, so a client sending a header byte a second would hold its
connection forever; here each phase of a request (waiting for it, its headers, its body) has one deadline for
all its reads. With TLS, the handshake is made in the connection's own thread, within the header deadline.

Connections are admitted fairly (`ConnectionCaps`): at most so many in all, and so many from one client address.
A connection is idle while it awaits a request's first byte (a new one too, as nginx counts it), and an idle one
is what makes room: at the cap in all, the oldest idle connection of the address holding the most is closed for
the new one (as nginx and Envoy do under overload); at an address's own cap, its own oldest idle one, and where it
has none idle the new connection is closed at once. Where none is idle anywhere, new connections wait in the
listen backlog until one closes, as Prometheus's connection limit does. An address with more requests in
progress than it may is answered a retryable refusal by the handler (503 with Retry-After), so that a client
holding its connections in slow requests cannot take the others' threads either.
"""

from __future__ import annotations

import io
import logging
import socket
import ssl
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from sloscope.arguments import above_zero, zero_or_more

from sloscope.edge.draining import DrainingServer, Held, peer_key, wake
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


@dataclass(frozen=True)
class ConnectionCaps:
    connections: int  # open at once, all clients together
    per_peer: int  # open at once from one client address (0: no cap per address)
    inflight_per_peer: int  # requests in progress at once from one client address (0: no cap per address)


# A cap per client address is no use where all clients come through one address: 0 turns it off.
PER_PEER_OFF = "0: none, as behind a proxy or a sidecar, where all clients share its address"


def add_caps_arguments(parser, caps: ConnectionCaps, what: str, retried_by: str) -> None:
    """The flags of ConnectionCaps, their defaults `caps`: `what` the listener's connections are (OTLP/HTTP),
    `retried_by` who retries a busy address's 503."""
    parser.add_argument("--max-connections", type=above_zero(int), default=caps.connections, metavar="N",
                        help=f"{what} connections open at once; past it, the idle connection of the address "
                        "holding the most is closed for the new one, else new ones wait in the listen backlog "
                        "(default: %(default)s)")
    parser.add_argument("--max-connections-per-peer", type=zero_or_more, default=caps.per_peer, metavar="N",
                        help=f"{what} connections open at once from one client address; past it, its oldest idle "
                        f"one is closed for the new one, else the new one is closed; {PER_PEER_OFF} "
                        "(default: %(default)s)")
    parser.add_argument("--max-inflight-requests-per-peer", type=zero_or_more, default=caps.inflight_per_peer,
                        metavar="N", help=f"{what} requests in progress at once from one client address; more are "
                        f"a 503 with Retry-After, which {retried_by} retry; {PER_PEER_OFF} (default: %(default)s)")


def caps_of(args) -> ConnectionCaps:
    """The ConnectionCaps add_caps_arguments's flags gave."""
    return ConnectionCaps(args.max_connections, args.max_connections_per_peer, args.max_inflight_requests_per_peer)


class LimitedHTTPServer(DrainingServer):
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, handler, caps: ConnectionCaps, count: Callable[[str], None],
                 tls: TlsFiles | None = None, handshake_timeout_s: float = 10.0):
        self.caps = caps
        self._slots = threading.BoundedSemaphore(caps.connections)
        self._peers: Counter = Counter()  # open connections by client address
        self.open_connections = 0
        self._waiting = False
        self._count = count
        self.tls = tls
        self.handshake_timeout_s = handshake_timeout_s
        super().__init__(address, handler)

    def process_request_thread(self, request, client_address):
        try:
            if self.tls is not None:
                request = self._handshake(request, client_address)
                if request is None:
                    return
            super().process_request_thread(request, client_address)
        finally:
            self._release(peer_key(client_address))

    def process_request(self, request, client_address):
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started to give the slot back
            self._release(peer_key(client_address))
            raise

    def _handshake(self, request: socket.socket, client_address) -> ssl.SSLSocket | None:
        """The TLS connection, or None once a failed handshake is counted and the connection closed."""
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
        self._take_slot()
        try:
            request, client_address = super().get_request()
        except BaseException:
            self._slots.release()
            raise
        if not self._admit(peer_key(client_address)):
            self._slots.release()
            self.shutdown_request(request)
            self._count("http_connections_refused_peer")
            raise OSError("the client's address holds as many connections as it may")  # the loop goes on
        return request, client_address

    def _take_slot(self) -> None:
        """A place for the connection the listening socket has ready: a free one, or one an idle connection
        closed to make; OSError where none came within ACCEPT_WAIT_S (the server loop retries)."""
        if self._slots.acquire(blocking=False):
            return
        with self._changed:
            victim = self._idle_victim(None)
            if victim is not None:
                self._shed(victim)
            elif not self._waiting:  # once per stretch at the limit, not per retry
                self._waiting = True
                self._count("http_connection_limit_waits")
        if not self._slots.acquire(timeout=ACCEPT_WAIT_S):
            raise OSError("connection limit reached")
        self._waiting = False

    def _admit(self, peer: str) -> bool:
        """Counts a new connection of `peer`'s, closing its oldest idle one where it holds its cap; False (not
        counted) where it holds its cap with none idle."""
        with self._changed:
            if self.caps.per_peer and self._peers[peer] >= self.caps.per_peer:
                victim = self._idle_victim(peer)
                if victim is None:
                    return False
                self._shed(victim)
            self._peers[peer] += 1
            self.open_connections += 1
            return True

    def _release(self, peer: str) -> None:
        with self._changed:
            self._peers[peer] -= 1
            if not self._peers[peer]:
                del self._peers[peer]
            self.open_connections -= 1
        self._slots.release()

    def _idle_victim(self, peer: str | None) -> Held | None:
        """The idle connection to close first (of `peer`'s where given): of the address holding the most
        connections, the one idle longest. Call holding the lock."""
        idle = [held for held in self._connections.values()
                if not held.busy and not held.shed and peer in (None, held.peer)]
        return max(idle, key=lambda held: (self._peers[held.peer], -held.since), default=None)

    def _shed(self, held: Held) -> None:
        held.shed = True
        wake(held.connection)
        self._count("http_connections_shed")

    def peer_busy(self, peer: str) -> bool:
        """True where `peer` has more requests in progress than it may (the caller's counted among them)."""
        if not self.caps.inflight_per_peer:
            return False
        with self._changed:
            busy = sum(1 for held in self._connections.values() if held.busy and held.peer == peer)
        return busy > self.caps.inflight_per_peer

    def handle_error(self, request, client_address):
        # A client that resets or vanishes is ordinary on the internet; anything else is this server's bug.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.debug("connection from %s ended: %s", client_address[0], exc)
        else:
            log.error("request from %s failed", client_address[0], exc_info=True)

"""A total deadline for one HTTP attempt made with requests.

A socket timeout bounds each read and starts again with every byte, so an endpoint that sends its answer (status
line, headers or body) a byte every few seconds would hold an attempt for ever. An `AttemptDeadline` bounds the
whole attempt: when it passes, the sockets the attempt uses are shut down, which ends whatever read or write waits
on them, and the attempt fails as one that got no answer.

`DeadlineAdapter` is a requests transport adapter whose connections report their sockets to the deadline of the
attempt in flight on their thread: a new connection as soon as it is connected (before TLS, so a handshake sent
a byte at a time is bounded too), a kept-alive one when a request is sent on it. Each socket is watched through
a duplicate of its descriptor, closed when the attempt ends: shutting a duplicate down ends the connection itself,
and a descriptor of the deadline's own can never have been reused for another file by the time it fires.
"""

from __future__ import annotations

import os
import socket
import threading
from contextlib import contextmanager
from typing import Iterator

from requests.adapters import HTTPAdapter

_in_flight = threading.local()  # .deadline: the AttemptDeadline of the attempt this thread makes, if any


class AttemptDeadline:
    def __init__(self, seconds: float):
        self.passed = False
        self._lock = threading.Lock()  # the timer's thread and the attempt's
        self._watched: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def watch(self, sock) -> None:
        """Shut `sock` down when the deadline passes (at once if it has)."""
        if not isinstance(sock, socket.socket):  # not connected yet, or a proxy's TLS-in-TLS transport
            return
        try:
            handle = socket.socket(fileno=os.dup(sock.fileno()))
        except OSError:  # closed meanwhile: nothing left to end
            return
        with self._lock:
            self._watched.append(handle)
            if self.passed:
                _shut(handle)

    def _expire(self) -> None:
        with self._lock:
            self.passed = True
            for handle in self._watched:
                _shut(handle)

    def start(self) -> None:
        self._timer.start()

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            for handle in self._watched:
                handle.close()
            self._watched.clear()


def _shut(handle: socket.socket) -> None:
    try:
        handle.shutdown(socket.SHUT_RDWR)
    except OSError:  # the peer closed it already
        pass


@contextmanager
def attempt_deadline(seconds: float) -> Iterator[AttemptDeadline]:
    """The deadline of the attempt made in the block, on this thread, through a DeadlineAdapter."""
    deadline = AttemptDeadline(seconds)
    _in_flight.deadline = deadline
    deadline.start()
    try:
        yield deadline
    finally:
        _in_flight.deadline = None
        deadline.close()


def _watch(sock) -> None:
    deadline = getattr(_in_flight, "deadline", None)
    if deadline is not None:
        deadline.watch(sock)


class _WatchedConnection:
    """Mixed into a urllib3 connection class: reports the connection's socket to the deadline in flight."""

    def _new_conn(self):
        sock = super()._new_conn()
        _watch(sock)
        return sock

    def request(self, *args, **kwargs):
        _watch(self.sock)  # a kept-alive connection; a new one is watched from _new_conn
        return super().request(*args, **kwargs)


_WATCHED_POOLS: dict[type, type] = {}


def _watched_pool(pool_cls: type) -> type:
    """`pool_cls` with connections that report their sockets (one subclass per class, made once)."""
    if issubclass(pool_cls.ConnectionCls, _WatchedConnection):
        return pool_cls
    if pool_cls not in _WATCHED_POOLS:
        connection = pool_cls.ConnectionCls
        watched = type(connection.__name__, (_WatchedConnection, connection), {})
        _WATCHED_POOLS[pool_cls] = type(pool_cls.__name__, (pool_cls,), {"ConnectionCls": watched})
    return _WATCHED_POOLS[pool_cls]


def _watch_pools_of(manager) -> None:
    manager.pool_classes_by_scheme = {scheme: _watched_pool(cls)
                                      for scheme, cls in manager.pool_classes_by_scheme.items()}


class DeadlineAdapter(HTTPAdapter):
    """An HTTPAdapter whose connections, direct or through a proxy, are bounded by `attempt_deadline`."""

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        _watch_pools_of(self.poolmanager)

    def proxy_manager_for(self, proxy, **proxy_kwargs):
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        _watch_pools_of(manager)
        return manager

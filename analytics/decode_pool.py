"""Decoding of large OTLP requests in worker processes, for `sloscope serve`.

Decoding a request into rows by the general decoders is Python work per span or data point, so in one process
it is bound to one core whatever the number of request threads. Large requests (an OTel Collector's batches)
that the trace fast path (receiver/otlp_spans.py) does not take are parsed, decoded, given their tiers and
turned into frames in worker processes; the server process only places GPU-only spans on their
nodes and queues the frames for the writer. Small requests are decoded in the request thread, where a round
trip to a worker would cost more than it saves.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from sloscope.analytics.intake import Enrichment
from sloscope.enrich.tiers import TierResolver
from sloscope.receiver import freed_memory
from sloscope.receiver.server import Decoders

log = logging.getLogger("sloscope.decode")

OFFLOAD_ABOVE_BYTES = 64 * 2**10

_worker: dict = {}


def decode_request(signal: str, body: bytes, is_json: bool, allowed: frozenset, default_tier: str,
                   declared: frozenset = frozenset()):
    """(frames, enrich counts, decoding counts) of one request body; raises DecodeError. Runs in a worker, which
    keeps its decoders (and their caches) and its tier resolver between requests."""
    key = (allowed, default_tier, declared)
    if _worker.get("key") != key:
        _worker.update(key=key, decoders=Decoders(declared),
                       enrichment=Enrichment(TierResolver(allowed, default_tier)))
    try:
        return _decoded(signal, body, is_json)
    finally:  # a worker decodes only large requests, and would otherwise stay the size of the largest
        freed_memory.release()


def _decoded(signal: str, body: bytes, is_json: bool):
    batch, skips = _worker["decoders"].decode(signal, body, is_json)
    frames, counts = _worker["enrichment"].frames(batch)
    return frames, counts, skips


def _warm() -> None:
    """Nothing: one per worker at start, so that the workers have started, and imported this module with the
    decoders, before the first request."""


def _end_with_the_server(server_pid: int) -> None:
    """A worker's initializer: a thread that ends the worker once serve has gone. A worker holds its own end of
    the request queue, so a serve that is killed (SIGKILL, the OOM killer) would otherwise leave it waiting
    for requests for good."""

    def watch():
        while os.getppid() == server_pid:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=watch, name="server-watch", daemon=True).start()


class DecodePool:
    """Worker processes that decode request bodies. A pool that breaks (a worker killed) is replaced; the
    requests it held are answered as retryable."""

    def __init__(self, workers: int, allowed: frozenset, default_tier: str, declared: frozenset = frozenset()):
        self.workers = workers
        self.tier_args = (allowed, default_tier, declared)  # and the SLO spec's declared metrics
        self.restarts = 0
        self._lock = threading.Lock()
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        # spawn: the server has threads (gRPC, HTTP, the writer), which fork would copy in whatever state.
        pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_end_with_the_server, initargs=(os.getpid(),))
        for future in [pool.submit(_warm) for _ in range(self.workers)]:
            future.result()
        return pool

    def decode(self, signal: str, body: bytes, is_json: bool):
        """(frames, counts, skips), or None when the pool broke under this request or is closed (the client
        should retry later)."""
        pool = self._pool
        try:
            future = pool.submit(decode_request, signal, body, is_json, *self.tier_args)
        except BrokenProcessPool:
            self._replace(pool)
            return None
        except RuntimeError:  # shut down: serve is stopping
            return None
        try:
            return future.result()
        except BrokenProcessPool:
            self._replace(pool)
            return None

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is not broken:  # another request thread replaced it already
                return
            log.error("a decode worker died; starting a new pool")
            self.restarts += 1
            self._pool = self._start()
        broken.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

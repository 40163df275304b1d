"""File ingest: the Collector file exporter's OTLP-JSON lines or length-prefixed requests (JSON or protobuf,
receiver/otlp_files.py) -> decode -> tier enrichment -> store, in large transactions.

A malformed line or request is reported as `file:line: reason` (the request's number for length-prefixed ones),
counted, and skipped; every other one still loads. One with some invalid spans or data points loads the rest; what
it refused is reported the same way and counted by reason.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sloscope.receiver.otlp_files import FileReadError, ProtobufRequest, read_lines
from sloscope.receiver.otlp_json import DecodeError, Decoder, decode_line
from sloscope.receiver.otlp_proto import ProtoDecoder
from sloscope.receiver.otlp_proto_signal import decode_request
from sloscope.enrich.tiers import TierResolver
from sloscope.enrich.topology import GpuTopology
from sloscope.records import Batch

from sloscope.analytics.intake import Enrichment
from sloscope.analytics.frames import Frames
from sloscope.analytics.store_api import StoreApi

log = logging.getLogger("sloscope.ingest")
MAX_REPORTED_ERRORS = 20


@dataclass
class IngestReport:
    lines: int = 0
    rejected: list[str] = field(default_factory=list)  # "file:line: reason", the first MAX_REPORTED_ERRORS
    rejected_count: int = 0  # lines refused whole
    partly_refused_count: int = 0  # lines that loaded, but for some items they refused
    counts: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def reject(self, message: str, whole: bool = True) -> None:
        """Count a refusal; `message` says where and why, as "file:line: reason"."""
        if whole:
            self.rejected_count += 1
        else:
            self.partly_refused_count += 1
        if len(self.rejected) < MAX_REPORTED_ERRORS:
            self.rejected.append(message)

    @property
    def lines_with_refusals(self) -> int:
        """Lines refused whole or in part: what is reported, and what makes ingest's exit status 1."""
        return self.rejected_count + self.partly_refused_count

    @property
    def rows_loaded(self) -> int:
        return sum(v for k, v in self.counts.items() if k.endswith("_loaded"))


_worker_state: dict = {}


def decode_chunk(chunk: list[tuple[str, bytes]], allowed: frozenset, default_tier: str,
                 declared: frozenset = frozenset()):
    """Decode and enrich a chunk of lines and requests: (batch, [(where, reason, whole line?)], counts). Runs in
    worker processes, which keep their decoders (and their attribute caches) between chunks. `declared`: the
    metrics the SLO spec declares as evidence, kept beside the catalog's."""
    key = (allowed, default_tier, declared)
    if _worker_state.get("key") != key:
        _worker_state.update(key=key, decoder=Decoder(declared=declared), proto=ProtoDecoder(declared=declared),
                             enrichment=Enrichment(TierResolver(allowed, default_tier)))
    json_decoder, proto_decoder, batch, rejects = _worker_state["decoder"], _worker_state["proto"], Batch(), []
    for where, line in chunk:
        protobuf = isinstance(line, ProtobufRequest)
        decoder = proto_decoder if protobuf else json_decoder
        try:
            decoded = decode_request(decoder, line) if protobuf else decode_line(decoder, line)
        except DecodeError as exc:
            rejects.append((where, str(exc), True))
            continue
        if decoder.refused:
            rejects.append((where, decoder.refusal_report(), False))
        batch.extend(decoded)
    frames, counts = _worker_state["enrichment"].frames(batch)
    for decoder in (json_decoder, proto_decoder):
        counts += Counter(decoder.skipped)
        decoder.skipped.clear()
    return frames, rejects, counts


def _chunks(paths: list[Path], report: IngestReport, lines_per_chunk: int):
    """Lines of all files in chunks; an unreadable file is reported and the next one read."""
    chunk = []
    for path in paths:
        try:
            for lineno, line in read_lines(path):
                chunk.append((f"{path}:{lineno}", line))
                if len(chunk) >= lines_per_chunk:
                    yield chunk
                    chunk = []
        except FileReadError as exc:  # its message names the file (and line) already
            report.reject(str(exc))
    if chunk:
        yield chunk


class Ingestor:
    """Decodes lines (in worker processes when there is enough input to pay for them) and feeds the store in
    transactions of about `batch_rows` rows, in the order the lines were read."""

    LINES_PER_CHUNK = 64
    PARALLEL_ABOVE_BYTES = 8 * 2**20

    def __init__(self, store: StoreApi, resolver: TierResolver, batch_rows: int = 250_000, jobs: int | None = None,
                 declared: frozenset = frozenset()):
        self.store = store
        self.resolver = resolver
        self.declared = declared  # metrics kept beside the catalog's (the SLO spec's declared evidence)
        self.batch_rows = batch_rows
        self.jobs = jobs
        self.pending: list[Frames] = []
        self.pending_rows = 0
        self.pending_counts: Counter = Counter()
        self.enrichment = Enrichment(resolver, GpuTopology(store.gpu_nodes()))
        self.report = IngestReport()
        self._lines_flushed = self._rejected_flushed = 0

    def _take(self, result, lines: int) -> None:
        frames, rejects, counts = result
        self.report.lines += lines
        for where, reason, whole in rejects:
            self.report.reject(f"{where}: {reason}", whole)
        self.pending.append(frames)
        self.pending_rows += len(frames)
        self.pending_counts.update(counts + self.enrichment.place(frames))
        if self.pending_rows >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        """Write what is pending, with the counters gathered since the last flush, in one transaction."""
        extra = Counter(self.pending_counts)
        extra["lines_read"] = self.report.lines - self._lines_flushed
        extra["lines_rejected"] = self.report.rejected_count - self._rejected_flushed
        self._lines_flushed, self._rejected_flushed = self.report.lines, self.report.rejected_count
        self.report.counts.update(self.store.write(Frames.concat(self.pending), extra))
        self.pending, self.pending_rows, self.pending_counts = [], 0, Counter()

    def _workers(self, paths: list[Path]) -> int:
        if self.jobs is not None:
            return self.jobs
        size = sum(p.stat().st_size for p in paths if p.is_file())
        return min(os.cpu_count() or 1, 4) if size > self.PARALLEL_ABOVE_BYTES else 1

    def ingest_files(self, paths: list[Path], progress_every_s: float = 5.0) -> IngestReport:
        started = last_progress = time.monotonic()
        args = (self.resolver.allowed, self.resolver.default_tier, self.declared)
        chunks = _chunks(paths, self.report, self.LINES_PER_CHUNK)
        workers = self._workers(paths)
        if workers <= 1:
            results = ((decode_chunk(c, *args), len(c)) for c in chunks)
        else:
            pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
            results = _ordered(pool, chunks, args, in_flight=workers * 4)
        try:
            for result, lines in results:
                self._take(result, lines)
                now = time.monotonic()
                if now - last_progress >= progress_every_s:
                    last_progress = now
                    log.info("%d lines read, %d rows loaded so far", self.report.lines,
                             self.report.rows_loaded + self.pending_rows)
        finally:
            if workers > 1:
                pool.shutdown(cancel_futures=True)
        self.flush()
        self.report.seconds = time.monotonic() - started
        return self.report


def _ordered(pool, chunks, args, in_flight: int):
    """Results of decode_chunk over chunks, in order, with at most in_flight chunks submitted at once."""
    queue = deque()
    for chunk in chunks:
        queue.append((pool.submit(decode_chunk, chunk, *args), len(chunk)))
        if len(queue) >= in_flight:
            future, lines = queue.popleft()
            yield future.result(), lines
    while queue:
        future, lines = queue.popleft()
        yield future.result(), lines

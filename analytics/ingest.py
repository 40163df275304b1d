"""File ingest: OTLP-JSON lines -> decode -> tier enrichment -> store, in large transactions.

A malformed line is reported as `file:line: reason`, counted, and skipped; every other line still loads.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from collectors.otlp_files import FileReadError, read_lines
from collectors.otlp_json import DecodeError, Decoder, decode_line
from enrich.tiers import TierResolver, resolve_tiers
from sloscope.records import Batch

from analytics.store import Store

log = logging.getLogger("sloscope.ingest")
MAX_REPORTED_ERRORS = 20


@dataclass
class IngestReport:
    lines: int = 0
    rejected: list[str] = field(default_factory=list)  # "file:line: reason", the first MAX_REPORTED_ERRORS
    rejected_count: int = 0
    counts: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def reject(self, where: str, reason: str) -> None:
        self.rejected_count += 1
        if len(self.rejected) < MAX_REPORTED_ERRORS:
            self.rejected.append(f"{where}: {reason}")

    @property
    def rows_loaded(self) -> int:
        return sum(v for k, v in self.counts.items() if k.endswith("_loaded"))


class Ingestor:
    """Feeds decoded export requests to the store in batches of about `batch_rows` rows."""

    def __init__(self, store: Store, resolver: TierResolver, batch_rows: int = 250_000):
        self.store = store
        self.resolver = resolver
        self.batch_rows = batch_rows
        self.decoder = Decoder()
        self.pending = Batch()
        self.report = IngestReport()
        self._lines_flushed = self._rejected_flushed = 0

    def add_line(self, where: str, line: bytes) -> None:
        self.report.lines += 1
        try:
            batch = decode_line(self.decoder, line)
        except DecodeError as exc:
            self.report.reject(where, str(exc))
            return
        resolve_tiers(batch.spans, self.resolver)
        self.pending.extend(batch)
        if len(self.pending) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        """Write what is pending, with the counters gathered since the last flush, in one transaction."""
        extra = Counter(self.resolver.counts)
        extra.update(self.decoder.skipped)
        extra["lines_read"] = self.report.lines - self._lines_flushed
        extra["lines_rejected"] = self.report.rejected_count - self._rejected_flushed
        self.resolver.counts.clear()
        self.decoder.skipped.clear()
        self._lines_flushed, self._rejected_flushed = self.report.lines, self.report.rejected_count
        self.report.counts.update(self.store.write(self.pending, extra))
        self.pending = Batch()

    def ingest_files(self, paths: list[Path], progress_every_s: float = 5.0) -> IngestReport:
        started = last_progress = time.monotonic()
        for path in paths:
            try:
                for lineno, line in read_lines(path):
                    self.add_line(f"{path}:{lineno}", line)
                    now = time.monotonic()
                    if now - last_progress >= progress_every_s:
                        last_progress = now
                        log.info("%s: line %d, %d rows loaded so far", path, lineno,
                                 self.report.rows_loaded + len(self.pending))
            except FileReadError as exc:
                self.report.reject(str(path), str(exc))
        self.flush()
        self.report.seconds = time.monotonic() - started
        return self.report

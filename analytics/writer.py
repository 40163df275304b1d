"""The store's single writer for live intake: a bounded queue of decoded frames, written in batches.

Request threads offer frames and get an immediate yes or no: no means the queue is full and the client must
retry later. Everything accepted is written, including on shutdown.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter

from analytics.store import Frames, Store

log = logging.getLogger("sloscope.writer")


class Writer:
    def __init__(self, store: Store, max_queued_rows: int = 1_000_000, batch_rows: int = 200_000,
                 max_delay_s: float = 0.5):
        self.store = store
        self.max_queued_rows = max_queued_rows
        self.batch_rows = batch_rows
        self.max_delay_s = max_delay_s
        self.counts: Counter = Counter()  # what has been written, for /metrics and logs
        self._queue: queue.Queue = queue.Queue()
        self._queued_rows = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sloscope-writer", daemon=True)
        self.failed: BaseException | None = None

    def start(self) -> "Writer":
        self._thread.start()
        return self

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def offer(self, frames: Frames, counts: dict) -> bool:
        """Queue frames (and the counters that go with them) unless that would pass the bound."""
        rows = len(frames)
        with self._lock:
            full = self._queued_rows and self._queued_rows + rows > self.max_queued_rows
            if self._stopping.is_set() or self.failed or full:
                return False
            self._queued_rows += rows
            self._queue.put((frames, counts, rows))
        return True

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new frames, write everything queued, and return when it is committed."""
        with self._lock:
            self._stopping.set()
            self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        done = False
        while not done:
            parts, counts, rows = [], Counter(), 0
            deadline = time.monotonic() + self.max_delay_s
            while rows < self.batch_rows:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    done = True
                    continue  # keep draining what was queued before the stop
                frames, item_counts, item_rows = item
                parts.append(frames)
                counts.update(item_counts)
                rows += item_rows
                if done and self._queue.empty():
                    break
            if parts or counts:
                self._write(parts, counts, rows)

    def _write(self, parts: list[Frames], counts: Counter, rows: int) -> None:
        try:
            written = self.store.write(Frames.concat(parts), counts)
        except Exception as exc:  # a store that cannot write must not look like a busy one
            self.failed = exc
            log.exception("writing %d rows failed; refusing new data", rows)
            return
        finally:
            with self._lock:
                self._queued_rows -= rows
        self.counts.update(written)

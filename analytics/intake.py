"""The step between a decoded batch and the store, shared by `sloscope ingest`, `sloscope serve` and its decode
workers: tiers resolved against the SLO spec (`Enrichment.frames`), then requests placed on their node by pod
and by GPU (`Enrichment.place`), everything counted. `Intake` is serve's use of it, with the writer and the
acknowledgement modes of ACKS.
"""

from __future__ import annotations

import threading
from collections import Counter

from sloscope.records import Batch, Outcome

from sloscope.enrich.pods import PodDirectory, place_points, place_requests
from sloscope.enrich.tiers import TierResolver, resolve_tiers
from sloscope.enrich.topology import GpuTopology
from sloscope.receiver.otlp_common import DecodeError

from sloscope.analytics.frames import Frames
from sloscope.analytics.writer import COMMITTED, POISON

ACK_WAIT_S = 5.0  # longest a request waits for its commit before it is told to retry (exporters wait 10 s)
LINGER_S = 1.0  # with acks before the commit, how long the writer may wait for a fuller one (analytics/writer.py)
ACKS = {"log": "once its rows are fsynced in the intake log, which serve replays at start (durable; default)",
        "commit": "once its rows are committed to the database (durable; waits for DuckDB's commits and "
                  "checkpoints; a request the store refuses is a 400)",
        "queued": "once its rows are queued in memory (not durable: a crash or a failing disk loses what was "
                  "acknowledged)"}


class Enrichment:
    """Tier resolution and node placement. Safe to share between threads: the resolver's counts and what the
    topology has learned are shared state; the frames are each caller's own."""

    def __init__(self, resolver: TierResolver, topology: GpuTopology | None = None,
                 pods: PodDirectory | None = None):
        self.resolver = resolver
        self.topology = topology if topology is not None else GpuTopology()
        self.pods = pods if pods is not None else PodDirectory()  # empty unless serve watches the pods
        self._lock = threading.Lock()

    def frames(self, batch: Batch) -> tuple[Frames, Counter]:
        """The batch as frames, its spans' tiers resolved; the resolution's counts."""
        with self._lock:
            resolve_tiers(batch.spans, self.resolver)
            counts = Counter(self.resolver.counts)
            self.resolver.counts.clear()
        return Frames.of(batch), counts

    def place(self, frames: Frames, peer: str | None = None) -> Counter:
        """Place the requests that name no node: by their pod (its name, else its IP; peer: the client's IP, a
        pod IP for spans naming no pod), then by their GPU as the metrics seen so far place it; and the data
        points that name no node by the pod their series names. The counts of each."""
        frames.spans, counts = place_requests(frames.spans, self.pods, peer)
        frames.points, by_pod = place_points(frames.points, self.pods)
        with self._lock:
            self.topology.learn(frames.points, frames.histograms)
            frames.spans = self.topology.place(frames.spans)
            counts += self.topology.counts
            self.topology.counts.clear()
        if by_pod:  # counted as unknown when decoded: the caller adds these to the decoding counts
            counts.update(points_node_from_pod_name=by_pod, points_node_unknown=-by_pod)
        return counts


class Intake:
    """Enrich a decoded batch and hand it to the writer; accepted means in the writer's fsynced intake log
    (ack="log"), committed (ack="commit"), or only queued (ack="queued": a crash loses what was acknowledged and
    not yet written). See ACKS."""

    def __init__(self, writer, resolver: TierResolver, topology: GpuTopology, ack: str = "commit",
                 ack_wait_s: float = ACK_WAIT_S, pods: PodDirectory | None = None):
        self.writer = writer
        self.enrichment = Enrichment(resolver, topology, pods)
        self.ack = ack
        self.ack_wait_s = ack_wait_s

    def __call__(self, signal_name: str, batch: Batch, skips: dict, peer: str | None = None):
        frames, counts = self.enrichment.frames(batch)
        return self.offer_frames(frames, counts + Counter(skips), peer)

    def offer_frames(self, frames: Frames, counts: Counter, peer: str | None = None):
        """Place the frames' requests and queue them for the writer; with ack="commit", wait for the commit."""
        counts += self.enrichment.place(frames, peer)
        pending = self.writer.offer(frames, counts)
        if pending is None or self.ack != "commit":  # with "log", offer returns once the log is fsynced
            return Outcome(accepted=pending is not None)
        return self._settled(pending.wait(self.ack_wait_s))

    @staticmethod
    def _settled(verdict):
        """The commit's verdict as an outcome: a request the store refuses (poison) is invalid, a timeout or a
        failing store retryable (and the retry then adds nothing: the store's writes are idempotent)."""
        if verdict is not None and verdict.outcome == POISON:
            raise DecodeError(verdict.reason)
        return Outcome(accepted=verdict is not None and verdict.outcome == COMMITTED)

    def offload(self, pool):
        """The receiver's offload: decode in the pool's workers, then place and queue here."""

        def decode_elsewhere(signal_name, body, is_json, peer=None):
            decoded = pool.decode(signal_name, body, is_json)
            if decoded is None:
                return Outcome(accepted=False), {}
            frames, counts, skips = decoded
            return self.offer_frames(frames, counts + Counter(skips), peer), skips

        return decode_elsewhere

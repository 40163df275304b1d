"""GPU topology: which node each GPU (by UUID, `hw.id`) sits on, learned from the GPU metrics every node's
collector sends, so that a request span that names only its GPU is placed on the right node."""

from __future__ import annotations

import json
from collections import Counter

import polars as pl

from sloscope.catalog import UNKNOWN_NODE

GPU_KEY = '"hw.id"'


class GpuTopology:
    def __init__(self, known: dict[str, str] | None = None):
        self.node_of: dict[str, str] = {gpu: node for gpu, node in (known or {}).items() if node != UNKNOWN_NODE}
        self.counts: Counter = Counter()

    def learn(self, *frames: pl.DataFrame) -> None:
        """Learn from sample frames with `node` and `attributes` (canonical JSON text) columns."""
        for frame in frames:
            if frame.is_empty():
                continue
            pairs = frame.filter(pl.col("attributes").str.contains(GPU_KEY, literal=True)
                                 & (pl.col("node") != UNKNOWN_NODE)).select("node", "attributes").unique()
            for node, attributes in pairs.iter_rows():
                gpu = json.loads(attributes).get("hw.id")
                if isinstance(gpu, str):
                    self.node_of[gpu] = node

    def place(self, requests: pl.DataFrame) -> pl.DataFrame:
        """Fill the node of requests that name none from their GPU UUID; the others (no GPU, or one not seen on
        any node) get UNKNOWN_NODE, counted, and keep their pod and namespace for a later resolution."""
        missing = requests["node"].null_count()
        if not missing:
            return requests
        mapping = pl.DataFrame({"gpu_id": list(self.node_of), "_gpu_node": list(self.node_of.values())},
                               schema={"gpu_id": pl.String, "_gpu_node": pl.String})
        placed = requests.join(mapping, on="gpu_id", how="left").with_columns(
            node=pl.coalesce("node", "_gpu_node", pl.lit(UNKNOWN_NODE))).drop("_gpu_node")
        unknown = int((placed["node"] == UNKNOWN_NODE).sum()) - int((requests["node"] == UNKNOWN_NODE).sum())
        self.counts["spans_node_from_gpu"] += missing - unknown
        self.counts["spans_node_unknown"] += unknown
        return placed.select(requests.columns)

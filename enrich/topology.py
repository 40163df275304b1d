"""GPU topology: which node each GPU (by UUID, `hw.id`) sits on, learned from the GPU metrics every node's
collector sends, so that a request span that names only its GPU is placed on the right node.

The map is bounded: it remembers the MAX_GPUS GPUs seen last (a GPU seen again moves to the end), and forgets the
one seen longest ago past that (counted, `gpus_forgotten`), so that clients inventing `hw.id` values cost a bounded
memory. Placing a batch looks up only the GPUs its spans name: its cost follows the batch, not the map."""

from __future__ import annotations

import json
from collections import Counter, OrderedDict

import polars as pl

from sloscope.catalog import UNKNOWN_NODE

GPU_KEY = '"hw.id"'
MAX_GPUS = 100_000  # 12,500 nodes of 8 GPUs each


class GpuTopology:
    def __init__(self, known: dict[str, str] | None = None, max_gpus: int = MAX_GPUS):
        """`known`: the GPUs' nodes, the one seen last last (as the stores' gpu_topology.sql orders them)."""
        self.max_gpus = max_gpus
        self.node_of: OrderedDict[str, str] = OrderedDict()
        self.counts: Counter = Counter()
        for gpu, node in (known or {}).items():
            if node != UNKNOWN_NODE:
                self._remember(gpu, node)

    def _remember(self, gpu: str, node: str) -> None:
        self.node_of[gpu] = node
        self.node_of.move_to_end(gpu)
        if len(self.node_of) > self.max_gpus:
            self.node_of.popitem(last=False)
            self.counts["gpus_forgotten"] += 1

    def learn(self, *frames: pl.DataFrame) -> None:
        """Learn from sample frames with `node` and `attributes` (canonical JSON text) columns."""
        for frame in frames:
            if frame.is_empty():
                continue
            pairs = frame.filter(pl.col("attributes").str.contains(GPU_KEY, literal=True)
                                 & (pl.col("node") != UNKNOWN_NODE)).select("node", "attributes").unique(
                maintain_order=True)
            for node, attributes in pairs.iter_rows():
                gpu = json.loads(attributes).get("hw.id")
                if isinstance(gpu, str):
                    self._remember(gpu, node)

    def place(self, requests: pl.DataFrame) -> pl.DataFrame:
        """Fill the node of requests that name none from their GPU UUID; the others (no GPU, or one not seen on
        any node) get UNKNOWN_NODE, counted, and keep their pod and namespace for a later resolution."""
        missing = requests["node"].null_count()
        if not missing:
            return requests
        named = requests.filter(pl.col("node").is_null())["gpu_id"].drop_nulls().unique().to_list()
        found = {gpu: self.node_of[gpu] for gpu in named if gpu in self.node_of}
        mapping = pl.DataFrame({"gpu_id": list(found), "_gpu_node": list(found.values())},
                               schema={"gpu_id": pl.String, "_gpu_node": pl.String})
        placed = requests.join(mapping, on="gpu_id", how="left").with_columns(
            node=pl.coalesce("node", "_gpu_node", pl.lit(UNKNOWN_NODE))).drop("_gpu_node")
        unknown = int((placed["node"] == UNKNOWN_NODE).sum()) - int((requests["node"] == UNKNOWN_NODE).sum())
        self.counts["spans_node_from_gpu"] += missing - unknown
        self.counts["spans_node_unknown"] += unknown
        return placed.select(requests.columns)

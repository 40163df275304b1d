"""What clients inventing GPU ids cost the GPU-to-node map (enrich/topology.py): GPU metrics naming `--ids`
distinct `hw.id` values are learned, then batches of request spans that name no node (half of them a known GPU)
are placed. Prints the map's size, the memory the learning added, and the median time to place a batch, against
the same batches placed by a map of 8 GPUs measured in the same run.

    .venv/bin/python benchmarks/gpu_map.py [--ids 1000000] [--batch 2000] [--rounds 50]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl  # noqa: E402

from sloscope.enrich.topology import GpuTopology  # noqa: E402


def learned(ids: int, chunk: int = 100_000) -> GpuTopology:
    """A map that saw `ids` GPUs, each on one of 1000 nodes, in batches of `chunk` points."""
    topology = GpuTopology()
    for first in range(0, ids, chunk):
        n = min(chunk, ids - first)
        topology.learn(pl.DataFrame({"node": [f"node-{(first + k) % 1000}" for k in range(n)],
                                     "attributes": [f'{{"hw.id":"GPU-{first + k}"}}' for k in range(n)]}))
    return topology


def median_place_s(topology: GpuTopology, batch: int, rounds: int) -> float:
    known = list(topology.node_of)[-4:]
    requests = pl.DataFrame({"node": [None] * batch,
                             "gpu_id": [known[k % 4] if k % 2 else f"GPU-none-{k}" for k in range(batch)]},
                            schema={"node": pl.String, "gpu_id": pl.String})
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        topology.place(requests)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    small = learned(8)
    base_s = median_place_s(small, args.batch, args.rounds)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    big = learned(args.ids)
    added = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    big_s = median_place_s(big, args.batch, args.rounds)
    print(f"{args.ids:,} GPU ids learned: the map holds {len(big.node_of):,} ({big.counts['gpus_forgotten']:,} "
          f"forgotten); peak RSS grew {added:,.0f} MiB")
    print(f"placing {args.batch:,} spans: {big_s * 1e3:.2f} ms with that map, {base_s * 1e3:.2f} ms with 8 GPUs "
          f"-> ratio {big_s / base_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Innocent blips: short, strong moves of one physical signal on nodes without the fault (a retry storm in a
neighbour's process, a burst of TIME_WAIT, a memory stall) that touch no request. A real fleet has them all
the time; an analysis that opens incidents or blames nodes on signal moves alone is caught by them.
"""

from __future__ import annotations

import numpy as np

from sloscope.simulator import faults

BLIPS_PER_NODE_HOUR = 3.0
LENGTH_S = (15.0, 40.0)
SCORE = (6.0, 20.0)  # how far the signal moves, in baseline IQRs
EDGE_S = 60  # blips keep clear of the run's ends, where baselines are short


def add_blips(nodes: list, names: list, spared: int | None, n: int, seed: int, at) -> list[dict]:
    """Bend the signals of every node but `spared` with blips; returns their ground truth."""
    rng = np.random.default_rng([seed, 6])
    truth = []
    for i, node in enumerate(nodes):
        if i == spared or n <= 3 * EDGE_S:
            continue
        for _ in range(int(rng.poisson(n / 3600.0 * BLIPS_PER_NODE_HOUR))):
            conf = faults.EFFECTS[int(rng.integers(0, len(faults.EFFECTS)))]
            series = faults.confounder_series(node, conf)
            if not series:
                continue
            start = float(rng.uniform(EDGE_S, n - EDGE_S))
            end = start + float(rng.uniform(*LENGTH_S))
            amounts = faults.calibrate(node, conf, float(rng.uniform(*SCORE)), faults.baseline_window(int(start)))
            faults.apply_confounder(node, conf, amounts, faults.profile(n, start, 3.0, end))
            truth.append({"kind": conf.kind, "node": names[i], "onset": at(start), "end": at(end),
                          "signals": faults.describe_series(series)})
    return truth

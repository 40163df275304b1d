"""Extreme values that are still in range (spans of days, gauges near 2**63, ratios at the edge of theirs) go
through `sloscope ingest` into every answer: `rca` and `graph` are JSON with no NaN or Infinity, the report is
written, and /metrics has no infinite value; what is out of range never reaches the store."""

import json
import math
import random
import re

import pytest

from sloscope.alerts.store_metrics import render
from sloscope.analytics.store import Store
from sloscope.commands.cli import main
from sloscope.slo_spec import load_spec
from tests.otlp_builders import counter, gauge, metrics, span, traces, write_lines

T0 = 1_764_410_400_000_000_000
S = 10**9
EXTREMES = [0.0, 1e-300, 9.2e18, -9.2e18, 4.5e18]


def _strict(text: str):
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in a JSON answer"))


def _requests(rng: random.Random) -> list[dict]:
    spans = [span(f"{i:032x}", f"{i:016x}", T0 + i * S // 5, rng.choice([0.001, 20.0, 3.6e6, 8.6e10]))
             for i in range(1, 1200)]
    gauges = [gauge("hw.gpu.temperature", [(T0 + k * S, rng.choice(EXTREMES)) for k in range(240)]),
              gauge("system.cpu.utilization", [(T0 + k * S, rng.choice([1.99, -0.99, 0.5])) for k in range(240)],
                    {"state": "user"}),
              counter("system.network.errors", T0, [(T0 + (k + 1) * S, rng.choice([0, 4.6e18]))
                                                    for k in range(240)], {"direction": "receive"}, temporality=1)]
    return [traces(spans), metrics(gauges)]


@pytest.mark.parametrize("seed", [1, 2])
def test_extreme_values_in_range_give_valid_answers_everywhere(tmp_path, capsys, seed):
    db = tmp_path / "x.duckdb"
    assert main(["ingest", "--db", str(db), str(write_lines(tmp_path / "in.jsonl",
                                                            _requests(random.Random(seed))))]) == 0
    capsys.readouterr()
    assert main(["rca", "--db", str(db), "--format", "json"]) in (0, 1)
    _strict(capsys.readouterr().out)
    assert main(["rca", "--db", str(db), "--format", "json", "--at", "2025-11-29T10:01:00Z"]) == 0
    _strict(capsys.readouterr().out)
    assert main(["graph", "--db", str(db), "--since", "2025-11-29T10:00:00Z", "--until", "2025-11-29T10:10:00Z"]) == 0
    _strict(capsys.readouterr().out)
    assert main(["report", "--db", str(db), "-o", str(tmp_path / "r.html")]) == 0
    assert "</html>" in (tmp_path / "r.html").read_text()
    with Store(db, read_only=True) as store:
        body, _ = render(store, load_spec(None))
    values = [float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines() if line and line[0] != "#"]
    assert values and all(math.isfinite(v) for v in values), re.findall(r".*[+-]Inf.*", body.decode())[:3]

"""The rca stage timings: each stage's seconds leave out the stages timed inside it, and an analysis asked for
them reports its stages without changing its answer."""

import time

from sloscope.analytics.rca import StageTimer, analyse
from sloscope.analytics.store import Store
from sloscope.commands.cli import main
from sloscope.slo_spec import load_spec
from tests.otlp_builders import span, traces, write_lines

T0 = 1_764_410_400_000_000_000
S = 1_000_000_000


def test_a_stage_leaves_out_the_stages_timed_inside_it():
    seconds = {}
    timed = StageTimer(seconds)
    with timed("outer"):
        time.sleep(0.02)
        with timed("inner"):
            time.sleep(0.15)
        with timed("outer"):  # the same stage again inside: added, not counted twice
            time.sleep(0.02)
    assert seconds["inner"] >= 0.15
    assert 0.04 <= seconds["outer"] < 0.15


def test_without_a_dict_nothing_is_timed():
    timed = StageTimer()
    with timed("stage"):
        pass
    assert timed.into is None


def test_an_analysis_reports_its_stages_and_the_same_answer(tmp_path):
    spans = [span(f"{i:032x}", f"{i:016x}", T0 + i * S // 10, 30 + (i % 5) * 900, tier="standard")
             for i in range(3000)]
    path = write_lines(tmp_path / "in.jsonl", [traces(spans, node="n1")])
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"), str(path)]) == 0
    spec = load_spec(None)
    seconds = {}
    with Store(tmp_path / "x.duckdb", read_only=True) as store:
        started = time.perf_counter()
        timed = analyse(store, spec, timings=seconds)
        wall = time.perf_counter() - started
        assert timed == analyse(store, spec)
    assert timed["incidents"]  # slow requests throughout: the stages after the SLI windows run too
    assert {"sli_windows", "incident_merge", "signal_steps", "attribution"} <= set(seconds)
    assert all(s >= 0 for s in seconds.values()) and sum(seconds.values()) <= wall

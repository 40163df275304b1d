"""rca's options for short runs and in-process use: a baseline and lookback other than the defaults, serve's
GET /rca (and query parameters of GET pages), and signals explained away by the more physical cause they wait
for."""

import http.client
import json
import threading
from datetime import datetime, timedelta

import polars as pl
import pytest

from sloscope.analytics.attribution import BASELINE, LOOKBACK, Window, rank_causes
from sloscope.analytics.rca import analyse
from sloscope.receiver.server import http_server
from sloscope.commands.serve_common import rca_page
from sloscope.slo_spec import load_spec
from tests.analytics.test_attribution import store  # noqa: F401 - the hand-built fleet (cpu_contention on n1 at 12 min)

T0 = datetime(2025, 11, 29, 10, 0, 0)
SPEC = load_spec(None)


def test_window_takes_a_baseline_and_lookback_and_keeps_its_defaults():
    start, end = T0 + timedelta(minutes=12), T0 + timedelta(minutes=13)
    default = Window.around(start, end, 10)
    assert (default.analysis_start, default.baseline_start) == (start - LOOKBACK, start - LOOKBACK - BASELINE)
    short = Window.around(start, end, 10, baseline=timedelta(minutes=2), lookback=timedelta(seconds=20))
    assert short.analysis_start == start - timedelta(seconds=20)
    assert short.baseline_start == start - timedelta(minutes=2, seconds=20)


def test_a_short_baseline_finds_the_same_cause(store):  # noqa: F811
    default = analyse(store, SPEC)["incidents"]
    short = analyse(store, SPEC, baseline=timedelta(minutes=2), lookback=timedelta(seconds=30))["incidents"]
    assert short and [i["node"] for i in short] == [i["node"] for i in default]
    assert short[0]["causes"][0]["cause"] == default[0]["causes"][0]["cause"] == "cpu_contention"


def test_rca_page_analyses_in_process_with_its_query_parameters(store):  # noqa: F811
    page = rca_page(store, SPEC)
    body, content_type = page(since="6m", baseline="2m", lookback="30s", top="2")
    result = json.loads(body)
    assert content_type == "application/json"
    assert result["incidents"] and all(len(i["causes"]) <= 2 for i in result["incidents"])
    assert result["incidents"][0]["causes"][0]["cause"] == "cpu_contention"
    assert json.loads(page(since="2025-11-29T09:00:00Z", until="2025-11-29T09:30:00Z")[0]) == {"incidents": []}
    with pytest.raises(ValueError):
        page(baseline="ten minutes")
    with pytest.raises(ValueError):
        page(top="-1")
    with pytest.raises(ValueError, match="top: expected 1 or more"):
        page(top="0")


@pytest.mark.parametrize("query", [{"baseline": "1e300s"}, {"lookback": "99999999999d"}, {"since": "99999999999h"},
                                   {"at": "0001-01-01T00:00:00Z"}, {"since": "0001-01-01T00:00:00+01:00"},
                                   {"at": "9999-12-31T23:59:59Z", "lookback": "1s"}])
def test_rca_page_refuses_times_and_durations_outside_the_calendar(store, query):  # noqa: F811
    with pytest.raises(ValueError, match="outside the years 1 to 9999"):
        rca_page(store, SPEC)(**query)


def test_rca_page_explains_a_moment_as_the_command_does(store):  # noqa: F811
    moment = json.loads(rca_page(store, SPEC)(at="2025-11-29T10:12:00Z", node="n1")[0])
    assert moment["incidents"] == [] and moment["moment"]["causes"][0]["cause"] == "cpu_contention"
    assert all(c["node"] == "n1" for c in moment["moment"]["causes"])
    with pytest.raises(ValueError, match="query parameter node goes with query parameter at"):
        rca_page(store, SPEC)(node="n1")
    with pytest.raises(ValueError, match="^query parameter since: 'yesterday' is neither"):
        rca_page(store, SPEC)(since="yesterday")


def _get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def test_get_pages_take_query_parameters_when_they_declare_them():
    def echo(word: str = "none"):
        if word == "bad":
            raise ValueError("word must not be bad")
        return word.encode(), "text/plain"

    server = http_server(None, "127.0.0.1", 0, pages={"/echo": echo, "/plain": lambda: (b"plain", "text/plain")})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        assert _get(port, "/echo?word=hello") == (200, b"hello")
        assert _get(port, "/echo") == (200, b"none")
        status, body = _get(port, "/echo?colour=red")
        assert status == 400 and body == b"/echo: unknown parameter colour; it takes word\n"
        status, body = _get(port, "/echo?word=bad")
        assert status == 400 and b"must not be bad" in body
        assert _get(port, "/plain?anything=1") == (200, b"plain")  # a page without parameters ignores the query
    finally:
        server.shutdown()
        server.server_close()


def _scores(rows):
    """series_scores' frame for one node, from (metric, attributes, z) rows that all moved at the break."""
    onset = T0 + timedelta(minutes=12)
    return pl.DataFrame([{"node": "n1", "metric": m, "attributes": json.dumps(a), "baseline": 1.0, "observed": 1.0 + z,
                          "z_at_break": z, "onset": onset, "consistency": 1.0, "scale": 1.0, "direction": 1.0,
                          "z_observed": z} for m, a, z in rows])


def test_slow_syscalls_are_explained_away_by_the_resource_they_wait_for():
    window = Window.around(T0 + timedelta(minutes=12), T0 + timedelta(minutes=13), 10)
    fsync = ("sloscope.syscall.duration", {"syscall.name": "fsync"}, 1800.0)
    disk = ("sloscope.pressure.stall", {"pressure.kind": "some", "pressure.resource": "io"}, 200.0)
    ranked = [c["cause"] for c in rank_causes(_scores([fsync, disk]), "n1", window)]
    assert ranked[0] == "disk_io" and "syscall_overhead" not in ranked
    alone = rank_causes(_scores([fsync]), "n1", window)
    assert alone[0]["cause"] == "syscall_overhead" and alone[0]["score"] > 0.9


def test_rca_at_explains_a_moment_without_an_slo_breach(store, tmp_path, capsys):  # noqa: F811
    """The cause on n1 began at 12 min: asked about that moment, rca ranks (n1, cpu_contention) first; asked
    about a quiet moment, it finds no clear cause and says why."""
    from sloscope.analytics.rca import explain_moment
    moment = explain_moment(store, SPEC, T0 + timedelta(minutes=12))["moment"]
    assert moment["causes"][0]["node"] == "n1" and moment["causes"][0]["cause"] == "cpu_contention"
    assert moment["diagnosis"]["verdict"] == "ranked"
    quiet = explain_moment(store, SPEC, T0 + timedelta(minutes=11), node="n2")["moment"]
    assert quiet["causes"] == [] and quiet["diagnosis"]["verdict"] == "no_clear_cause"
    assert quiet["diagnosis"]["candidates"] and all(c["node"] == "n2" for c in quiet["diagnosis"]["candidates"])
    nowhere = explain_moment(store, SPEC, T0 + timedelta(minutes=12), node="gpu-node-9")["moment"]
    assert nowhere["causes"] == [] and nowhere["diagnosis"]["verdict"] == "no_evidence"
    assert "no signal of this node" in nowhere["diagnosis"]["reason"] and "gpu-node-9" in nowhere["diagnosis"]["baselines"]


def test_rca_at_on_the_command_line(store, capsys):  # noqa: F811
    from sloscope.commands.cli import main
    db = store.con.execute("PRAGMA database_list").fetchall()[0][2]
    assert main(["rca", "--db", db, "--at", "2025-11-29T10:12:00Z", "--node", "n1", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["incidents"] == [] and doc["moment"]["causes"][0]["cause"] == "cpu_contention"
    assert main(["rca", "--db", db, "--node", "n1"]) == 2
    assert "--node goes with --at" in capsys.readouterr().err

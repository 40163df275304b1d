"""`clickhouse://` stores over real HTTP: the production path (HttpBackend, clickhouse-connect) against a stand-in
ClickHouse server (tests/clickhouse_http.py, ClickHouse's HTTP interface answered by chDB) gives what `chdb://` gives
for the same OTLP files, and a wrong password or database is a clear error."""

import base64
import gzip
import http.client
import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import datetime

import polars as pl
import pytest

pytest.importorskip("chdb")
pytest.importorskip("clickhouse_connect")

from sloscope.analytics.clickhouse_store import COUNTERS_TABLE, META_TABLE  # noqa: E402
from sloscope.analytics.exporter_tables import READ_TABLES, TRACES  # noqa: E402
from sloscope.analytics.stores import PASSWORD_ENV, open_store  # noqa: E402
from sloscope.commands.cli import main  # noqa: E402
from sloscope.simulator.fleet import SimulationConfig, simulate  # noqa: E402
from sloscope.slo_spec import load_spec  # noqa: E402
from tests import clickhouse_http  # noqa: E402
from tests.otlp_builders import counter, exp_histogram, gauge, metrics, span, traces, write_lines  # noqa: E402
from tests.store_parity import incident_summary  # noqa: E402
from tests.analytics.test_clickhouse_parity import _differences  # noqa: E402

USER, PASSWORD = "sloscope", "pw-" + secrets.token_hex(8)
T0 = 1_764_410_400_000_000_000  # 2025-11-29T10:00:00Z
S = 1_000_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The stand-in server, its databases otel (the simulated fleet), units (the hand-built files) and renamed
    (the same, the exporter's tables under other names)."""
    with clickhouse_http.running(tmp_path_factory.mktemp("server"), USER, PASSWORD,
                                 ("otel", "units", "renamed")) as port:
        yield port


@pytest.fixture
def password(monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def _url(port: int, database: str, user: str = USER) -> str:
    return f"clickhouse://{user}@127.0.0.1:{port}/{database}"


def _rca(url: str, capsys) -> dict:
    capsys.readouterr()
    assert main(["rca", "--store", url, "--format", "json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


# --- the production path over HTTP gives chDB's answers ------------------------------------------------------

def test_rca_over_http_finds_what_chdb_finds_in_the_same_files(server, password, tmp_path, capsys):
    truth = simulate(SimulationConfig(out=tmp_path / "otlp", nodes=3, seed=1, fault="storage_queue", rate=4.0,
                                      duration_s=780))
    files = [str(f) for f in sorted((tmp_path / "otlp").glob("*.jsonl*"))]
    http, local = _url(server, "otel"), f"chdb:///{tmp_path}/ch"
    for url in (http, local):
        assert main(["ingest", "--store", url, *files]) == 0
    assert PASSWORD not in capsys.readouterr().err
    over_http, in_process = _rca(http, capsys), _rca(local, capsys)
    on_node = [i for i in over_http["incidents"] if i["node"] == truth.fault["node"]]
    # the known answer, so that agreeing means something
    assert on_node and on_node[0]["causes"][0]["cause"] == "storage_queue"
    assert incident_summary(over_http) == incident_summary(in_process)
    assert not _differences(over_http, in_process)  # the whole document: SLIs, scores, evidence, diagnoses


def _unit_lines():
    """Every kind of row: spans with good, hostile and missing tiers; a cumulative counter with a reset, a delta
    counter, a gauge and an exponential histogram, on two nodes."""
    spans = [span(f"{i:032x}", f"{i:016x}", T0 + i * S // 4, 40 + (i % 9) * 30, status=500 if i % 13 == 0 else 200,
                  tier=[None, "standard", "p99-latency-critical", "platinum", "x'); DROP TABLE otel_traces; --",
                        "\u200bstandard\t"][i % 6], extra={"net.peer.port": 443, "retry": i % 2 == 0})
             for i in range(120)]
    series = [
        counter("sloscope.tcp.retransmits", T0, [(T0 + k * 10 * S, 10 * k) for k in range(1, 5)]
                + [(T0 + 50 * S, 3, T0 + 49 * S), (T0 + 60 * S, 9, T0 + 49 * S)],
                attrs={"network.io.direction": "transmit"}),
        counter("system.disk.io_time", T0, [(T0 + k * 10 * S, k * 1.5) for k in range(1, 8)], temporality=1),
        gauge("hw.gpu.utilization", [(T0 + k * 5 * S + 123_456_789, 0.1 * k) for k in range(1, 15)],
              attrs={"hw.id": "GPU-1"}),
        exp_histogram("sloscope.syscall.duration", T0, [(T0 + k * 10 * S, 4 * k, 0.5 * k, -20, [k, 3 * k])
                                                       for k in range(1, 5)]),
    ]
    return [traces(spans, node="n1"), traces(spans[:7], service="embedder", node="n2"),
            metrics(series, node="n1"), metrics(series[1:], node="n2", k8s_node="node-b")]


@pytest.fixture(scope="module")
def units(server, tmp_path_factory):
    """The hand-built files ingested with a spec of their own into units over HTTP and into a chDB directory."""
    tmp = tmp_path_factory.mktemp("units")
    path = write_lines(tmp / "in.jsonl", _unit_lines())
    (tmp / "slo.yaml").write_text(
        "default_tier: standard\ntiers:\n  standard:\n    latency: {percentile: 90, threshold_ms: 200}\n"
        "    availability: 99\n  p99-latency-critical:\n    latency: {percentile: 99, threshold_ms: 150}\n"
        "    availability: 99.9\n")
    urls = {"http": _url(server, "units"), "chdb": f"chdb:///{tmp}/ch",
            "http, other names": _url(server, "renamed") + "?traces_table_name=spans&metrics_table_name=fleet"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(PASSWORD_ENV, PASSWORD)
        for url in urls.values():
            assert main(["ingest", "--store", url, "--slo", str(tmp / "slo.yaml"), str(path)]) == 0
    return urls


def _utc(dtype):
    """The type with its UTC named one way: the engine names the zone of a nested DateTime64 UTC or Etc/UTC after
    how session_timezone came to it (the store reads only top-level times, which it makes naive)."""
    if isinstance(dtype, pl.List):
        return pl.List(_utc(dtype.inner))
    return pl.Datetime(dtype.time_unit, "UTC") if isinstance(dtype, pl.Datetime) and dtype.time_zone else dtype


def _everything_in(url: str) -> dict:
    """Each table as rows sorted whole, the counters and the recorded spec's tiers."""
    with open_store(url, read_only=True) as store:
        tables = {t: store.frame(f"SELECT * FROM {t}") for t in (*READ_TABLES, COUNTERS_TABLE)}
        tables = {t: f.cast({c: _utc(d) for c, d in f.schema.items()}) for t, f in tables.items()}
        tables = {t: f.sort(f.columns) if f.height else f for t, f in tables.items()}
        keys = store.rows(f"SELECT key FROM {META_TABLE} ORDER BY key")
        return {"tables": tables, "counters": store.counters(), "meta": keys, "tiers": list(store.slo_spec().tiers)}


@pytest.mark.parametrize("where", ["http", "http, other names"])
def test_ingest_over_http_writes_the_rows_chdb_writes(units, password, where):
    over_http, in_process = _everything_in(units[where]), _everything_in(units["chdb"])
    with open_store(units[where], read_only=True) as store:
        made = set(store.frame("SELECT name FROM system.tables WHERE database = currentDatabase()")["name"])
    assert (TRACES in made) == (where == "http") and ("spans" in made) == (where != "http")
    assert over_http["counters"] == in_process["counters"]
    assert over_http["counters"]["requests_loaded"] == 127 and over_http["counters"]["tier_invalid"] > 0
    assert over_http["tiers"] == in_process["tiers"] == ["standard", "p99-latency-critical"]  # the recorded spec
    assert over_http["meta"] == in_process["meta"]
    for table, frame in in_process["tables"].items():
        assert frame.height > 0, table
        assert over_http["tables"][table].schema == frame.schema, table
        assert over_http["tables"][table].equals(frame), table  # maps, nested arrays, DateTime64(9) and all


@pytest.mark.parametrize("name", ["requests", "samples", "histograms"])
def test_bounds_with_fractions_of_a_second_select_the_same_rows_over_http(units, password, name):
    """The relations' {since:DateTime64(6)} bounds: spans come every 250 ms, the gauge at .123456789 s and the
    histogram on whole ten seconds, so bounds that lost their fractions on the way (05.6 -> 05, 20.2 -> 20) would
    select other rows than chDB does in each relation."""
    bounds = {"since": datetime(2025, 11, 29, 10, 0, 5, 600_000), "until": datetime(2025, 11, 29, 10, 0, 20, 200_000)}
    found = {}
    for where, url in units.items():
        with open_store(url, read_only=True) as store:
            params = {**store.tier_params(load_spec(None)), **bounds} if name == "requests" else bounds
            frame = store.frame(f"SELECT * FROM ({store.sql(name)})", params)
            found[where] = frame.sort(frame.columns)
    assert found["chdb"].height > 0
    assert found["http"].equals(found["chdb"]) and found["http, other names"].equals(found["chdb"])


# --- what goes wrong is said plainly --------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["ingest", "rca"])
def test_a_wrong_password_is_a_clear_error_naming_the_store(server, tmp_path, monkeypatch, capsys, command):
    monkeypatch.setenv(PASSWORD_ENV, "not-" + PASSWORD)
    path = write_lines(tmp_path / "in.jsonl", _unit_lines()[:1])
    url = _url(server, "otel")
    assert main([command, "--store", url, *([str(path)] if command == "ingest" else [])]) == 2
    err = capsys.readouterr().err
    assert f"sloscope {command}: {url}: cannot connect" in err
    assert "Authentication failed" in err and "516" in err
    assert "Traceback" not in err and PASSWORD not in err


def test_an_unknown_user_or_a_missing_database_is_a_clear_error(server, password, capsys):
    assert main(["rca", "--store", _url(server, "otel", user="intruder")]) == 2
    assert "Authentication failed" in capsys.readouterr().err
    assert main(["rca", "--store", _url(server, "nowhere")]) == 2
    err = capsys.readouterr().err
    assert f"{_url(server, 'nowhere')}: cannot connect" in err and "nowhere does not exist" in err


def test_a_server_that_is_not_there_is_one_line():
    from tests.alerting_stack import free_port

    url = f"clickhouse://{USER}@127.0.0.1:{free_port()}/otel"  # nothing listens there
    proc = subprocess.run([sys.executable, "-m", "sloscope.commands.cli", "rca", "--store", url], capture_output=True,
                          text=True, timeout=120, env={**os.environ, PASSWORD_ENV: PASSWORD})
    assert proc.returncode == 2
    assert proc.stderr == f"sloscope rca: {url}: cannot connect: Connection refused\n"  # not the driver's wrapping


# --- the stand-in keeps the interface's contract --------------------------------------------------------------

def _post(port: int, body: bytes, query: str = "", headers: dict | None = None):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/?{query}", data=body, headers={
        "Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode(), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_the_stand_in_answers_as_the_documentation_says(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/ping", timeout=30) as response:
        assert response.read() == b"Ok.\n"
    assert _post(server, b"1", "query=SELECT")[2] == b"1\n"  # URL part, a line feed, then the body
    status, headers, body = _post(server, b"SELECT 1", headers={"X-ClickHouse-User": USER, "X-ClickHouse-Key": "no",
                                                                 "Authorization": ""})
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (401, "516") and b"AUTHENTICATION_FAILED" in body
    status, headers, body = _post(server, b"SELECT 1; SELECT 2")
    assert status == 400 and headers["X-ClickHouse-Exception-Code"] == "62" and b"Multi-statements" in body
    status, headers, body = _post(server, b"SELECT {n:UInt8} + 1 AS x FORMAT JSONEachRow", "param_n=41&database=units")
    assert status == 200 and json.loads(body) == {"x": 42} and headers["X-ClickHouse-Format"] == "JSONEachRow"
    status, headers, body = _post(server, b"SELECT 'abc'", "enable_http_compression=1",
                                  {"Accept-Encoding": "gzip"})
    assert headers.get("Content-Encoding") == "gzip" and gzip.decompress(body) == b"abc\n"
    assert _post(server, b"SELECT count() FROM otel_traces", "database=nowhere")[0] == 404
    # a setting in the URL holds for that query only
    assert _post(server, b"SELECT getSetting('max_result_rows')", "max_result_rows=7")[2] == b"7\n"
    assert _post(server, b"SELECT getSetting('max_result_rows')")[2] == b"0\n"
    with pytest.raises(urllib.error.HTTPError, match="403"):  # GET is read-only
        urllib.request.urlopen(f"http://127.0.0.1:{server}/?query=DROP%20DATABASE%20units&user={USER}"
                               f"&password={PASSWORD}", timeout=30)
    connection = http.client.HTTPConnection("127.0.0.1", server, timeout=30)  # a body sent in chunks
    connection.request("POST", "/", body=iter([b"SELECT ", b"7"]), encode_chunked=True, headers={
        "X-ClickHouse-User": USER, "X-ClickHouse-Key": PASSWORD})
    assert connection.getresponse().read() == b"7\n"
    connection.close()
